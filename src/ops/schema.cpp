#include "kiln/ops/schema.h"

#include <cstdlib>

namespace kiln::ops {
namespace {

struct Cursor {
  std::string_view text;
  size_t pos = 0;
  ParseError* err;

  void skip_ws() {
    while (pos < text.size() && (text[pos] == ' ' || text[pos] == '\t' || text[pos] == '\n')) ++pos;
  }
  bool at_end() { skip_ws(); return pos >= text.size(); }
  char peek() { skip_ws(); return pos < text.size() ? text[pos] : '\0'; }
  bool eat(char c) {
    if (peek() != c) return false;
    ++pos;
    return true;
  }
  bool eat(std::string_view s) {
    skip_ws();
    if (text.substr(pos, s.size()) != s) return false;
    pos += s.size();
    return true;
  }
  bool fail(const char* what) {
    err->offset = pos;
    err->what = what;
    return false;
  }
  bool expect(char c, const char* what) { return eat(c) || fail(what); }
  static bool ident_char(char c, bool first) {
    return c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (!first && c >= '0' && c <= '9');
  }
  std::string_view ident() {
    skip_ws();
    size_t start = pos;
    while (pos < text.size() && ident_char(text[pos], pos == start)) ++pos;
    return text.substr(start, pos - start);
  }
};

struct BaseType {
  std::string_view spelling;
  Type plain, optional, list, optional_list;  // Count: not allowed
};

constexpr Type kNo = Type::Count;
constexpr BaseType kBaseTypes[] = {
    {"Tensor", Type::Tensor, Type::OptionalTensor, Type::TensorList, kNo},
    {"int", Type::Int, Type::OptionalInt, Type::IntList, Type::OptionalIntList},
    {"SymInt", Type::Int, Type::OptionalInt, Type::IntList, Type::OptionalIntList},
    {"float", Type::Float, Type::OptionalFloat, Type::FloatList, Type::OptionalFloatList},
    {"bool", Type::Bool, Type::OptionalBool, kNo, kNo},
    {"Scalar", Type::Scalar, Type::OptionalScalar, kNo, kNo},
    {"ScalarType", Type::ScalarType, Type::OptionalScalarType, kNo, kNo},
    {"str", Type::String, Type::OptionalString, kNo, kNo},
    {"MemoryFormat", Type::MemoryFormat, Type::OptionalMemoryFormat, kNo, kNo},
    {"Layout", kNo, Type::OptionalLayout, kNo, kNo},
    {"Device", kNo, Type::OptionalDevice, kNo, kNo},
};

// type [alias annotation] ['?'] ['[' N ']'] ['?']
bool parse_type(Cursor& c, Arg* a) {
  std::string_view base = c.ident();
  const BaseType* bt = nullptr;
  for (const auto& b : kBaseTypes)
    if (b.spelling == base) bt = &b;
  if (bt == nullptr) return c.fail("unknown argument type");
  if (c.eat('(')) {  // alias annotation: (a) or (a!)
    c.ident();
    if (c.eat('!')) a->is_out = true;
    if (!c.expect(')', "expected ')' closing the alias annotation")) return false;
  }
  bool elem_optional = c.eat('?');
  bool list = false;
  if (c.eat('[')) {
    list = true;
    while (c.peek() >= '0' && c.peek() <= '9') ++c.pos;
    if (!c.expect(']', "expected ']' in a list type")) return false;
  }
  bool optional = c.eat('?');
  Type t = kNo;
  if (list && elem_optional) t = base == "Tensor" && !optional ? Type::OptionalTensorList : kNo;
  else if (list) t = optional ? bt->optional_list : bt->list;
  else t = (optional || elem_optional) ? bt->optional : bt->plain;
  if (t == kNo) return c.fail("unsupported type form");
  a->type = t;
  return true;
}

bool parse_number(Cursor& c, Default* d) {
  c.skip_ws();
  const char* begin = c.text.data() + c.pos;
  size_t n = 0;
  bool is_float = false;
  while (c.pos + n < c.text.size()) {
    char ch = c.text[c.pos + n];
    if ((ch >= '0' && ch <= '9') || ch == '-' || ch == '+') {
    } else if (ch == '.' || ch == 'e' || ch == 'E') {
      is_float = true;
    } else {
      break;
    }
    ++n;
  }
  if (n == 0) return c.fail("expected a default value");
  // the text is not NUL-terminated where the number ends: copy it
  char buf[40];
  if (n >= sizeof(buf)) return c.fail("number too long");
  for (size_t k = 0; k < n; ++k) buf[k] = begin[k];
  buf[n] = '\0';
  char* end = nullptr;
  if (is_float) {
    d->kind = Default::Kind::Float;
    d->d = std::strtod(buf, &end);
  } else {
    d->kind = Default::Kind::Int;
    d->i = std::strtoll(buf, &end, 10);
  }
  if (end != buf + n) return c.fail("malformed number");
  c.pos += n;
  return true;
}

bool parse_default(Cursor& c, Default* d) {
  char ch = c.peek();
  if (ch == '\'' || ch == '"') {
    ++c.pos;
    size_t start = c.pos;
    while (c.pos < c.text.size() && c.text[c.pos] != ch) ++c.pos;
    if (c.pos >= c.text.size()) return c.fail("unterminated string default");
    d->kind = Default::Kind::String;
    d->s = c.text.substr(start, c.pos - start);
    ++c.pos;
    return true;
  }
  if (ch == '[') {
    ++c.pos;
    d->kind = Default::Kind::IntList;
    while (!c.eat(']')) {
      if (d->list_size > 0 && !c.expect(',', "expected ',' in a list default")) return false;
      Default item;
      if (!parse_number(c, &item)) return false;
      if (item.kind != Default::Kind::Int) return c.fail("list defaults hold ints only");
      if (d->list_size == Default::kMaxList) return c.fail("list default too long");
      d->list[d->list_size++] = item.i;
    }
    return true;
  }
  if (Cursor::ident_char(ch, true)) {
    std::string_view word = c.ident();
    if (word == "None") { d->kind = Default::Kind::None; return true; }
    if (word == "True" || word == "False") {
      d->kind = Default::Kind::Bool;
      d->b = word == "True";
      return true;
    }
    return c.fail("unsupported default value");
  }
  return parse_number(c, d);
}

}  // namespace

std::string_view type_name(Type t) {
  switch (t) {
    case Type::Tensor: return "Tensor";
    case Type::OptionalTensor: return "Tensor?";
    case Type::TensorList: return "Tensor[]";
    case Type::OptionalTensorList: return "Tensor?[]";
    case Type::Int: return "int";
    case Type::OptionalInt: return "int?";
    case Type::IntList: return "int[]";
    case Type::OptionalIntList: return "int[]?";
    case Type::Float: return "float";
    case Type::OptionalFloat: return "float?";
    case Type::Bool: return "bool";
    case Type::OptionalBool: return "bool?";
    case Type::Scalar: return "Scalar";
    case Type::OptionalScalar: return "Scalar?";
    case Type::ScalarType: return "ScalarType";
    case Type::OptionalScalarType: return "ScalarType?";
    case Type::String: return "str";
    case Type::OptionalString: return "str?";
    case Type::MemoryFormat: return "MemoryFormat";
    case Type::OptionalMemoryFormat: return "MemoryFormat?";
    case Type::OptionalLayout: return "Layout?";
    case Type::OptionalDevice: return "Device?";
    case Type::FloatList: return "float[]";
    case Type::OptionalFloatList: return "float[]?";
    case Type::Count: break;
  }
  return "?";
}

bool is_optional(Type t) {
  switch (t) {
    case Type::OptionalTensor: case Type::OptionalInt: case Type::OptionalIntList: case Type::OptionalFloat:
    case Type::OptionalBool: case Type::OptionalScalar: case Type::OptionalScalarType: case Type::OptionalString:
    case Type::OptionalMemoryFormat: case Type::OptionalLayout: case Type::OptionalDevice: case Type::OptionalFloatList:
      return true;
    default:
      return false;
  }
}

bool parse_schema(std::string_view text, Schema* out, ParseError* err) {
  ParseError scratch;
  Cursor c{text, 0, err != nullptr ? err : &scratch};
  *out = Schema{};
  out->ns = c.ident();
  if (out->ns.empty() || !c.eat("::")) return c.fail("expected 'namespace::'");
  out->name = c.ident();
  if (out->name.empty()) return c.fail("expected an operator name");
  if (c.eat('.')) {
    out->overload = c.ident();
    if (out->overload.empty()) return c.fail("expected an overload name after '.'");
  }
  if (!c.expect('(', "expected '(' opening the arguments")) return false;
  bool kwarg_only = false;
  while (!c.eat(')')) {
    if ((out->num_args > 0 || kwarg_only) && !c.expect(',', "expected ',' between arguments")) return false;
    if (c.eat('*')) {
      if (kwarg_only) return c.fail("second '*'");
      kwarg_only = true;
      continue;
    }
    if (out->num_args == kMaxArgs) return c.fail("too many arguments");
    Arg& a = out->args[out->num_args];
    if (!parse_type(c, &a)) return false;
    a.kwarg_only = kwarg_only;
    a.name = c.ident();
    if (a.name.empty()) return c.fail("expected an argument name");
    if (c.eat('=')) {
      a.has_default = true;
      if (!parse_default(c, &a.default_value)) return false;
    }
    if (a.is_out && out->num_args == 0 && out->name.ends_with('_') && a.type == Type::Tensor) {
      out->inplace = true;  // an in-place form, "aten::index_put_(Tensor(a!) self, ...)": self is read and written
    } else if (a.is_out) {
      ++out->num_outs;
      if (a.type == Type::TensorList) out->out_is_list = true;
      else if (a.type != Type::Tensor) return c.fail("an out argument must be Tensor(a!) or Tensor(a!)[]");
    } else if (out->num_outs > 0) {
      return c.fail("an input argument after an out argument");
    }
    ++out->num_args;
  }
  if (out->out_is_list && out->num_outs != 1) return c.fail("a list out must be the only out");
  // the returns: checked for shape only ("-> Tensor(a!)", "-> (Tensor(a!), ...)", "-> ()")
  if (!c.eat("->")) return c.fail("expected '->' before the returns");
  if (c.at_end()) return c.fail("expected the returns");
  c.pos = text.size();
  return true;
}

}  // namespace kiln::ops
