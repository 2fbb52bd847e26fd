// Test-only: prints a compiled flatbuffers schema (.bfbs, from `flatc -b
// --schema`) as canonical text — everything that decides the binary layout
// (file identifier, root table, every table's fields by id with their types,
// defaults and alignment attributes, every enum/union's values) and nothing
// that does not (namespaces, comments, declaration order). Two schemas with
// equal dumps read and write the same bytes; tests/python/test_pte_format.py
// compares kiln's schema with ExecuTorch's this way.
//
//   kiln_schema_dump SCHEMA.bfbs
#include <flatbuffers/reflection_generated.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace {

std::string base_name(const flatbuffers::String* s) {
  std::string n = s ? s->str() : "";
  size_t dot = n.rfind('.');
  return dot == std::string::npos ? n : n.substr(dot + 1);
}

std::string attributes(const flatbuffers::Vector<flatbuffers::Offset<reflection::KeyValue>>* attrs) {
  std::vector<std::string> out;
  if (attrs)
    for (const auto* kv : *attrs) out.push_back(kv->key()->str() + "=" + (kv->value() ? kv->value()->str() : ""));
  std::sort(out.begin(), out.end());
  std::string s;
  for (const auto& a : out) s += " " + a;
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: kiln_schema_dump SCHEMA.bfbs\n");
    return 2;
  }
  std::ifstream in(argv[1], std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  flatbuffers::Verifier verifier(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  if (bytes.empty() || !reflection::VerifySchemaBuffer(verifier)) {
    std::fprintf(stderr, "kiln_schema_dump: %s is not a compiled schema\n", argv[1]);
    return 1;
  }
  const reflection::Schema* schema = reflection::GetSchema(bytes.data());
  auto type_name = [&](const reflection::Type* t) {
    std::string s = std::string(reflection::EnumNameBaseType(t->base_type()));
    if (t->element() != reflection::None) s += "<" + std::string(reflection::EnumNameBaseType(t->element())) + ">";
    if (t->index() >= 0) {
      bool object = t->base_type() == reflection::Obj ||
                    (t->base_type() == reflection::Vector && t->element() == reflection::Obj);
      s += "(" + (object ? base_name(schema->objects()->Get(static_cast<uint32_t>(t->index()))->name())
                         : base_name(schema->enums()->Get(static_cast<uint32_t>(t->index()))->name())) + ")";
    }
    return s;
  };

  std::vector<std::string> lines;
  lines.push_back("file_identifier " + (schema->file_ident() ? schema->file_ident()->str() : ""));
  lines.push_back("root_type " + (schema->root_table() ? base_name(schema->root_table()->name()) : ""));
  for (const reflection::Object* o : *schema->objects()) {
    std::string head = (o->is_struct() ? "struct " : "table ") + base_name(o->name()) +
                       " minalign=" + std::to_string(o->minalign()) + " bytesize=" + std::to_string(o->bytesize()) +
                       attributes(o->attributes());
    std::vector<const reflection::Field*> fields(o->fields()->begin(), o->fields()->end());
    std::sort(fields.begin(), fields.end(), [](auto* a, auto* b) { return a->id() < b->id(); });
    for (const reflection::Field* f : fields) {
      head += "\n  " + std::to_string(f->id()) + " " + f->name()->str() + ": " + type_name(f->type()) +
              " offset=" + std::to_string(f->offset()) + " default=" + std::to_string(f->default_integer()) + "/" +
              std::to_string(f->default_real()) + (f->deprecated() ? " deprecated" : "") +
              (f->required() ? " required" : "") + (f->optional() ? " optional" : "") + attributes(f->attributes());
    }
    lines.push_back(head);
  }
  for (const reflection::Enum* e : *schema->enums()) {
    std::string head = (e->is_union() ? "union " : "enum ") + base_name(e->name()) + ": " +
                       type_name(e->underlying_type());
    for (const reflection::EnumVal* v : *e->values()) {
      head += "\n  " + std::to_string(v->value()) + " " + v->name()->str();
      if (e->is_union() && v->union_type()) head += " -> " + type_name(v->union_type());
    }
    lines.push_back(head);
  }
  std::sort(lines.begin() + 2, lines.end());
  for (const auto& l : lines) std::printf("%s\n", l.c_str());
  return 0;
}
