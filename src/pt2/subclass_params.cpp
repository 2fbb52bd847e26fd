// Tensor-subclass parameters for the .pt2 reader (json_reader.h).
#include "json_reader.h"
#include "pickle.h"

#include <algorithm>

namespace kiln::pt2::detail {

namespace {

// ---- tensor subclass parameters -------------------------------------------------------------------
// torchao's quantize_ before torch.export leaves weights as tensor subclasses (IntxUnpackedToInt8Tensor:
// qdata, scale, zero_point). The archive stores each pickled (torch.save's zip inside the entry) and the
// graph reads their parts with export.access_subclass_inner_tensor(p, attr). Each part becomes a
// parameter of its own, "<fqn>.<attr>", read in place from the pickle's storage; the access nodes and
// the subclass placeholder leave the graph. Done on the JSON, before the graph is built, so everything
// after sees plain dense parameters and checks them as usual.
struct InnerTensor {
  std::string storage;     // storage key: the nested member "<dir>/data/<key>"
  int64_t storage_offset;  // elements
  int64_t element_bytes;
  int64_t storage_numel;
};

int64_t storage_element_bytes(std::string_view cls) {
  static const std::map<std::string_view, int64_t> sizes = {
      {"torch.CharStorage", 1},     {"torch.ByteStorage", 1},   {"torch.BoolStorage", 1},
      {"torch.ShortStorage", 2},    {"torch.HalfStorage", 2},   {"torch.BFloat16Storage", 2},
      {"torch.IntStorage", 4},      {"torch.FloatStorage", 4},  {"torch.LongStorage", 8},
      {"torch.DoubleStorage", 8}};
  auto it = sizes.find(cls);
  return it == sizes.end() ? 0 : it->second;
}

// attr -> inner tensor, from the pickle torch.save wrote for one subclass tensor.
std::map<std::string, InnerTensor> read_subclass_pickle(const Reader& r, const std::string& where,
                                                        const pickle::Value& top, std::string* cls) {
  using K = pickle::Value::Kind;
  auto call_of = [](const pickle::Value* v, std::string_view fn) -> const pickle::Value* {
    if (!v || !v->is(K::Call) || v->items.size() != 2 || !v->items[0]->is_global(fn) || !v->items[1]->is(K::Tuple))
      return nullptr;
    return v->items[1].get();
  };
  const pickle::Value* args = call_of(&top, "torch._tensor._rebuild_from_type_v2");
  if (!args || args->items.size() < 4 || !args->items[1]->is(K::Global) || !args->items[3]->is(K::Dict))
    r.bad(where, "is pickled, but not as a tensor subclass kiln knows (torch._tensor._rebuild_from_type_v2 of a class "
                 "and its attributes)");
  *cls = args->items[1]->s;
  std::map<std::string, InnerTensor> out;
  for (const auto& [key, value] : args->items[3]->entries) {
    const pickle::Value* t = call_of(value.get(), "torch._utils._rebuild_tensor_v2");
    if (!t || !key->is(K::String)) continue;  // a plain attribute (block_size, dtypes, ...)
    const std::string what = fmt::format("{} attribute '{}'", where, key->s);
    if (t->items.size() < 4 || !t->items[0]->is(K::PersistentId) || !t->items[1]->is(K::Int))
      r.bad(what, "is not a tensor torch.save wrote (a storage and an offset)");
    const pickle::Value& pid = *t->items[0]->items[0];
    if (!pid.is(K::Tuple) || pid.items.size() < 5 || !pid.items[0]->is(K::String) || pid.items[0]->s != "storage" ||
        !pid.items[1]->is(K::Global) || !pid.items[2]->is(K::String) || !pid.items[4]->is(K::Int))
      r.bad(what, "has a storage record kiln does not read");
    InnerTensor it;
    it.storage = pid.items[2]->s;
    it.storage_offset = t->items[1]->i;
    it.element_bytes = storage_element_bytes(pid.items[1]->s);
    it.storage_numel = pid.items[4]->i;
    if (it.element_bytes == 0) r.bad(what, fmt::format("has storage of type {}, which kiln does not read", pid.items[1]->s));
    out.emplace(key->s, std::move(it));
  }
  return out;
}

}  // namespace

void unwrap_subclass_parameters(const Reader& r, const Pt2Archive& archive, json& graph_json, json& signature,
                                std::map<std::string, std::pair<std::string, json>>& payloads) {
  std::vector<std::string> pickled;
  for (const auto& [fqn, p] : payloads)
    if (const auto u = p.second.is_object() ? p.second.find("use_pickle") : p.second.end();
        p.second.is_object() && u != p.second.end() && u->is_boolean() && u->get<bool>())  // (not a boolean: refused later)
      pickled.push_back(fqn);
  if (pickled.empty()) return;
  json& specs = signature["input_specs"];
  json& inputs = graph_json["inputs"];
  json& nodes = graph_json["nodes"];
  const json& tvs = graph_json["tensor_values"];
  if (!specs.is_array() || !inputs.is_array() || !nodes.is_array() || !tvs.is_object()) return;  // reported later
  for (const std::string& fqn : pickled) {
    const std::string where = fmt::format("parameter '{}'", fqn);
    auto& [dir, meta] = payloads.at(fqn);
    const std::string entry = dir + r.as_string(r.field(meta, "path_name", where), where);
    if (!archive.contains(entry)) r.bad(where, fmt::format("storage entry '{}' is missing", entry));
    const auto members = archive.nested_members(entry);
    auto pkl = std::find_if(members.begin(), members.end(), [](const auto& m) {
      return m.first.size() >= 8 && m.first.compare(m.first.size() - 8, 8, "data.pkl") == 0;
    });
    if (pkl == members.end()) r.bad(where, "is stored pickled, but its entry holds no data.pkl");
    const std::string prefix = pkl->first.substr(0, pkl->first.size() - 8);  // "archive/"
    std::vector<std::byte> bytes(static_cast<size_t>(pkl->second.size));
    archive.read(entry, pkl->second.offset, bytes);
    std::string cls;
    pickle::ValuePtr top;
    try {
      top = pickle::load(bytes);
    } catch (const Error& e) {
      r.bad(where, fmt::format("its pickle ({}) cannot be read: {}", pkl->first, e.what()));
    }
    const auto inner = read_subclass_pickle(r, where, *top, &cls);

    // The placeholder, its input spec and the nodes reading it.
    size_t spec_index = specs.size();
    std::string kind, placeholder;
    for (size_t i = 0; i < specs.size() && spec_index == specs.size(); ++i)
      for (const char* k : {"parameter", "buffer", "tensor_constant"}) {
        const char* name_field = std::string_view(k) == "parameter" ? "parameter_name"
                                 : std::string_view(k) == "buffer"  ? "buffer_name"
                                                                    : "tensor_constant_name";
        auto it = specs[i].find(k);
        if (it != specs[i].end() && it->is_object() && it->value(name_field, std::string()) == fqn) {
          spec_index = i, kind = k;
          placeholder = r.as_string(r.field(r.field(*it, "arg", where), "name", where), where);
          break;
        }
      }
    if (spec_index == specs.size()) continue;  // not a graph input: nothing reads it
    json new_specs = json::array(), new_inputs = json::array();
    json kept_nodes = json::array();
    for (auto& n : nodes) {
      const bool access = n.value("target", std::string()) == "torch.ops.export.access_subclass_inner_tensor.default";
      bool reads = false;
      std::string attr;
      for (const auto& in : n.value("inputs", json::array())) {
        const json& a = in.value("arg", json::object());
        if (a.is_object() && a.contains("as_tensor") && a["as_tensor"].value("name", std::string()) == placeholder) reads = true;
        if (a.is_object() && a.contains("as_string")) attr = a["as_string"].get<std::string>();
        if (a.is_object() && a.contains("as_tensors"))
          for (const auto& t : a["as_tensors"])
            if (t.value("name", std::string()) == placeholder) reads = true;
      }
      if (!reads) {
        kept_nodes.push_back(std::move(n));
        continue;
      }
      if (!access)
        r.bad(where, fmt::format("is a tensor subclass ({}) that node '{}' ({}) reads whole; kiln reads a subclass's "
                                 "inner tensors only (export.access_subclass_inner_tensor)",
                                 cls, n.value("name", std::string("?")), n.value("target", std::string("?"))));
      auto t = inner.find(attr);
      if (t == inner.end())
        r.bad(where, fmt::format("the graph reads attribute '{}' of its {}, which the pickle does not hold", attr, cls));
      const json& outs = n["outputs"];
      if (!outs.is_array() || outs.size() != 1 || !outs[0].contains("as_tensor"))
        r.bad(where, "an access_subclass_inner_tensor node without one tensor output");
      const std::string value = outs[0]["as_tensor"].value("name", std::string());
      auto vm = tvs.find(value);
      if (vm == tvs.end()) r.bad(where, fmt::format("inner tensor '{}' has no metadata", value));
      auto member = members.find(prefix + "data/" + t->second.storage);
      if (member == members.end())
        r.bad(where, fmt::format("attribute '{}' names storage '{}', which its entry does not hold", attr, t->second.storage));
      if (static_cast<uint64_t>(t->second.storage_numel * t->second.element_bytes) > member->second.size)
        r.bad(where, fmt::format("attribute '{}': storage '{}' is shorter than its record", attr, t->second.storage));
      json m = *vm;  // the inner tensor's metadata, as the graph has it; the offset from the pickle
      m["storage_offset"] = {{"as_int", t->second.storage_offset}};
      const std::string inner_fqn = fqn + "." + attr;
      payloads[inner_fqn] = {dir, json{{"path_name", meta["path_name"]}, {"tensor_meta", m},
                                       {"kiln_member_offset", member->second.offset},
                                       {"kiln_member_bytes", member->second.size},
                                       {"kiln_element_bytes", t->second.element_bytes}}};
      const char* name_field = kind == "parameter" ? "parameter_name" : kind == "buffer" ? "buffer_name" : "tensor_constant_name";
      json spec = specs[spec_index];
      spec[kind]["arg"]["name"] = value;
      spec[kind][name_field] = inner_fqn;
      new_specs.push_back(std::move(spec));
      new_inputs.push_back(json{{"as_tensor", {{"name", value}}}});
    }
    nodes = std::move(kept_nodes);
    // The subclass placeholder's spec and graph input are replaced by its inner tensors'.
    json specs_out = json::array(), inputs_out = json::array();
    for (size_t i = 0; i < specs.size(); ++i) {
      if (i == spec_index) {
        for (auto& x : new_specs) specs_out.push_back(x);
        continue;
      }
      specs_out.push_back(specs[i]);
    }
    for (auto& in : inputs) {
      if (in.is_object() && in.contains("as_tensor") && in["as_tensor"].value("name", std::string()) == placeholder) {
        for (auto& x : new_inputs) inputs_out.push_back(x);
        continue;
      }
      inputs_out.push_back(in);
    }
    specs = std::move(specs_out);
    inputs = std::move(inputs_out);
    payloads.erase(fqn);
  }
}

}  // namespace kiln::pt2::detail
