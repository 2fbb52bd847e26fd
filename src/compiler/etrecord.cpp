// kiln lower's ETRecord (kiln/compiler/etrecord.h): ExecuTorch 1.5's devtools
// format, learned from executorch/devtools/etrecord/_etrecord.py (the zip's
// entries), executorch/exir/serde (the program JSON, schema 5.4) and the files
// ExecuTorch writes; kiln's own code.
#include "kiln/compiler/etrecord.h"

#include "kiln/core/error.h"
#include "kiln/io/npy.h"
#include "torch_archive.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <map>
#include <set>

namespace kiln {
namespace {

using nlohmann::json;
using etrecord::PyValue;
using etrecord::Storage;
using etrecord::ZipWriter;

// The graph id edge nodes' from_node names for the .pt2's graph (any integer; stored in export_graph_id).
constexpr int64_t kExportGraphId = 1;
// The prefix ExecuTorch's serde gives edge-dialect operators.
constexpr const char* kEdgeOps = "executorch.exir.dialects.edge.ops.";

int64_t export_code(ScalarType t) {
  for (int64_t code = 1; code < 64; ++code)
    if (auto s = scalar_type_from_export_code(code); s && *s == t) return code;
  fail("etrecord: dtype {} has no torch.export code", dtype_name(t));
}

json sym_ints(const std::vector<int64_t>& v) {
  json a = json::array();
  for (int64_t x : v) a.push_back({{"as_int", x}});
  return a;
}

json tensor_meta(const graph::TensorMeta& m) {
  std::vector<int64_t> strides(m.sizes.size(), 1);  // edge tensors are contiguous
  for (size_t k = m.sizes.size(); k-- > 1;) strides[k - 1] = strides[k] * std::max<int64_t>(m.sizes[k], 1);
  return {{"dtype", export_code(m.dtype)},
          {"sizes", sym_ints(m.sizes)},
          {"requires_grad", false},
          {"device", {{"type", "cpu"}}},
          {"strides", sym_ints(strides)},
          {"storage_offset", {{"as_int", 0}}},
          {"layout", 7}};
}

// A Python identifier for a lifted constant's name.
std::string identifier(const std::string& s) {
  std::string out;
  for (char c : s) out += (std::isalnum(static_cast<unsigned char>(c)) || c == '_') ? c : '_';
  if (out.empty() || std::isdigit(static_cast<unsigned char>(out[0]))) out = "_" + out;
  return out;
}

// The .pt2's graph JSON in the form ExecuTorch's serde (schema 5.4) reads: the fields newer
// torch writes and that schema lacks are dropped; nothing else changes.
json aten_program(const pt2::ExportedProgram& ep, std::string* root) {
  std::string entry;
  for (const std::string& e : ep.archive->entries())
    if (e.ends_with("models/" + ep.model_name + ".json")) entry = e;
  check(!entry.empty(), "{}: no graph entry for model '{}'", ep.path, ep.model_name);
  *root = entry.substr(0, entry.size() - ("models/" + ep.model_name + ".json").size());
  json j = json::parse(ep.archive->read_text(entry));
  j.erase("torch_version");
  j.erase("guards_code");
  j["schema_version"] = {{"major", 5}, {"minor", 4}};
  json& gm = j.at("graph_module");
  gm.erase("metadata");
  gm.erase("treespec_namedtuple_fields");
  gm.at("graph").erase("sym_float_values");
  for (json& n : gm.at("graph").at("nodes")) {
    n.erase("is_hop_single_tensor_return");
    for (json& i : n.at("inputs")) i.erase("kind");
  }
  for (json& e : gm.at("module_call_graph"))
    if (e.contains("signature") && e["signature"].is_object()) e["signature"].erase("forward_arg_names");
  return j;
}

struct Blobs {  // a program's torch.save'd state dict and constants
  PyValue state_dict = PyValue::dict_of({}), constants = PyValue::dict_of({});
  std::vector<Storage> state_storages, constant_storages;
};

PyValue tensor_value(size_t storage, const std::vector<int64_t>& sizes, bool parameter) {
  PyValue t;
  t.kind = PyValue::Kind::Tensor;
  t.storage = storage;
  t.sizes = sizes;
  t.parameter = parameter;
  return t;
}

// The ATen program's parameters and buffers (state dict) and tensor constants, from its signature.
Blobs aten_blobs(const pt2::ExportedProgram& ep, const json& program) {
  Blobs b;
  auto add = [&](bool state, const std::string& name, bool parameter) {
    const pt2::ConstantTensor* c = ep.find_constant(name);
    check(c != nullptr, "{}: the signature names '{}', which the archive does not hold", ep.path, name);
    auto& storages = state ? b.state_storages : b.constant_storages;
    storages.push_back({c->meta.dtype, c->meta.numel(), [&ep, c](const etrecord::Sink& s) {
                          ep.stream_constant(*c, [&](std::span<const std::byte> chunk) { s(chunk.data(), chunk.size()); });
                        }});
    (state ? b.state_dict : b.constants).dict.emplace_back(name, tensor_value(storages.size() - 1, c->meta.sizes, parameter));
  };
  for (const json& spec : program.at("graph_module").at("signature").at("input_specs")) {
    if (spec.contains("parameter")) add(true, spec["parameter"].at("parameter_name"), true);
    if (spec.contains("buffer")) add(spec["buffer"].value("persistent", true), spec["buffer"].at("buffer_name"), false);
    if (spec.contains("tensor_constant")) add(false, spec["tensor_constant"].at("tensor_constant_name"), false);
  }
  return b;
}

json argument(const graph::Graph& g, const graph::Argument& a) {
  using K = graph::Argument::Kind;
  auto tensor = [&](graph::ValueId v) { return json{{"name", g.value(v).name}}; };
  switch (a.kind) {
    case K::None: return {{"as_none", json::array()}};
    case K::Tensor: return {{"as_tensor", tensor(std::get<graph::ValueId>(a.payload))}};
    case K::Tensors: {
      json l = json::array();
      for (graph::ValueId v : std::get<std::vector<graph::ValueId>>(a.payload)) l.push_back(tensor(v));
      return {{"as_tensors", l}};
    }
    case K::OptionalTensors: {
      json l = json::array();
      for (const auto& v : std::get<std::vector<std::optional<graph::ValueId>>>(a.payload))
        l.push_back(v ? json{{"as_tensor", tensor(*v)}} : json{{"as_none", json::array()}});
      return {{"as_optional_tensors", l}};
    }
    case K::Int: return {{"as_int", std::get<int64_t>(a.payload)}};
    case K::Ints: return {{"as_ints", std::get<std::vector<int64_t>>(a.payload)}};
    case K::Float: return {{"as_float", std::get<double>(a.payload)}};
    case K::Floats: return {{"as_floats", std::get<std::vector<double>>(a.payload)}};
    case K::Bool: return {{"as_bool", std::get<bool>(a.payload)}};
    case K::Bools: return {{"as_bools", std::get<std::vector<bool>>(a.payload)}};
    case K::String: return {{"as_string", std::get<std::string>(a.payload)}};
    case K::Strings: return {{"as_strings", std::get<std::vector<std::string>>(a.payload)}};
    case K::ScalarType: return {{"as_scalar_type", export_code(std::get<ScalarType>(a.payload))}};
    case K::MemoryFormat: return {{"as_memory_format", static_cast<int>(std::get<graph::MemoryFormat>(a.payload))}};
    case K::Layout: {
      const auto l = std::get<graph::Layout>(a.payload);
      return {{"as_layout", l == graph::Layout::Strided ? 7 : 0}};
    }
    case K::Device: {
      const auto& d = std::get<graph::Device>(a.payload);
      json dev = {{"type", d.type}};
      if (d.index) dev["index"] = *d.index;
      return {{"as_device", dev}};
    }
  }
  return {{"as_none", json::array()}};
}

// The ATen node each edge node came from: its debug handle (the ATen node's position + 1) and name.
struct Origins {
  std::vector<int64_t> handle;                  // per edge node
  std::vector<std::string> source;              // per edge node: the ATen node's name ("" if none)
  std::map<std::string, const json*> aten_node;  // name -> the .pt2's node JSON
  const json* tensor_values = nullptr;          // the .pt2's tensor metadata, by name

  // Whether `sizes` (an output of edge node k) is its ATen node's single output's shape, size-1 dims
  // aside; true when that is unknown (no source, several outputs, symbolic sizes).
  bool shape_matches(const std::vector<int64_t>& sizes, size_t k) const {
    auto it = aten_node.find(source[k]);
    if (it == aten_node.end()) return true;
    const json& outs = it->second->value("outputs", json::array());
    if (outs.size() != 1 || !outs[0].contains("as_tensor")) return true;
    const std::string name = outs[0]["as_tensor"].value("name", "");
    if (!tensor_values->contains(name)) return true;
    std::vector<int64_t> a, b;
    for (const json& d : (*tensor_values)[name].at("sizes")) {
      if (!d.contains("as_int")) return true;
      if (d["as_int"].get<int64_t>() != 1) a.push_back(d["as_int"].get<int64_t>());
    }
    for (int64_t d : sizes)
      if (d != 1) b.push_back(d);
    return a == b;
  }
};

Origins origins(const passes::EdgeProgram& edge, const json& program) {
  Origins o;
  std::map<std::string, int64_t> handle_of;
  const json& nodes = program.at("graph_module").at("graph").at("nodes");
  o.tensor_values = &program.at("graph_module").at("graph").at("tensor_values");
  for (size_t k = 0; k < nodes.size(); ++k) {
    const std::string name = nodes[k].at("name");
    handle_of[name] = static_cast<int64_t>(k) + 1;
    o.aten_node[name] = &nodes[k];
  }
  int64_t fresh = static_cast<int64_t>(nodes.size()) + 1;  // a node with no ATen origin: a handle of its own
  for (const graph::Node& n : edge.graph.nodes) {
    int64_t best = 0;
    std::string name;
    for (const std::string& s : n.source_nodes)  // the latest of its sources: the one whose value it computes
      if (auto it = handle_of.find(s); it != handle_of.end() && it->second > best) {
        best = it->second;
        name = s;
      }
    if (best == 0)  // a node kiln made (a buffer's write-back): the origin of the value it stores
      for (const graph::NamedArgument& a : n.inputs)
        for (graph::ValueId v : a.arg.tensor_ids())
          if (const int32_t p = edge.graph.value(v).producer; p >= 0 && o.handle[static_cast<size_t>(p)] > best &&
                                                              !o.source[static_cast<size_t>(p)].empty()) {
            best = o.handle[static_cast<size_t>(p)];
            name = o.source[static_cast<size_t>(p)];
          }
    o.handle.push_back(best > 0 ? best : fresh++);
    o.source.push_back(name);
  }
  return o;
}

// kiln's edge graph as an edge-dialect ExportedProgram, constants lifted to placeholders.
json edge_program(const passes::EdgeProgram& edge, const json& aten, const Origins& o, Blobs* blobs) {
  const graph::Graph& g = edge.graph;
  json tensor_values = json::object();
  for (const graph::Value& v : g.values) tensor_values[v.name] = tensor_meta(v.meta);
  json inputs = json::array(), input_specs = json::array();
  for (const auto& [v, data] : edge.constants) {
    const std::string& name = g.value(v).name;
    const std::string fqn = identifier(name);
    inputs.push_back({{"as_tensor", {{"name", name}}}});
    input_specs.push_back({{"tensor_constant", {{"arg", {{"name", name}}}, {"tensor_constant_name", fqn}}}});
    const graph::TensorMeta& m = g.value(v).meta;
    blobs->constant_storages.push_back({m.dtype, m.numel(), [&edge, v](const etrecord::Sink& s) {
                                          const std::vector<std::byte> bytes = edge.constant_bytes(v);
                                          s(bytes.data(), bytes.size());
                                        }});
    blobs->constants.dict.emplace_back(fqn, tensor_value(blobs->constant_storages.size() - 1, m.sizes, false));
  }
  for (const passes::MutableBuffer& b : edge.mutable_buffers) {
    const std::string& name = g.value(b.value).name;
    inputs.push_back({{"as_tensor", {{"name", name}}}});
    input_specs.push_back({{"buffer", {{"arg", {{"name", name}}}, {"buffer_name", b.name}, {"persistent", true}}}});
    const graph::TensorMeta& m = g.value(b.value).meta;
    const passes::ConstantData* init = &b.initial;
    blobs->state_storages.push_back({m.dtype, m.numel(), [&edge, init, m](const etrecord::Sink& s) {
                                       if (init->bytes) {
                                         s(init->bytes->data(), init->bytes->size());
                                       } else if (init->source) {
                                         edge.exported->stream_constant(*init->source, [&](std::span<const std::byte> c) {
                                           s(c.data(), c.size());
                                         });
                                       } else {
                                         const std::vector<std::byte> zeros(static_cast<size_t>(m.nbytes()));
                                         s(zeros.data(), zeros.size());
                                       }
                                     }});
    blobs->state_dict.dict.emplace_back(b.name, tensor_value(blobs->state_storages.size() - 1, m.sizes, false));
  }
  for (graph::ValueId v : g.inputs) {
    inputs.push_back({{"as_tensor", {{"name", g.value(v).name}}}});
    input_specs.push_back({{"user_input", {{"arg", {{"as_tensor", {{"name", g.value(v).name}}}}}}}});
  }
  json outputs = json::array(), output_specs = json::array();
  for (graph::ValueId v : edge.outputs) {
    outputs.push_back({{"as_tensor", {{"name", g.value(v).name}}}});
    output_specs.push_back({{"user_output", {{"arg", {{"as_tensor", {{"name", g.value(v).name}}}}}}}});
  }
  json nodes = json::array();
  for (size_t k = 0; k < g.nodes.size(); ++k) {
    const graph::Node& n = g.nodes[k];
    json in = json::array();
    for (const graph::NamedArgument& a : n.inputs) in.push_back({{"name", a.name}, {"arg", argument(g, a.arg)}});
    json out = json::array();
    for (const graph::Argument& a : n.outputs) out.push_back(argument(g, a));
    json meta = json::object();
    if (auto it = o.aten_node.find(o.source[k]); it != o.aten_node.end() && it->second->contains("metadata"))
      for (const char* key : {"stack_trace", "nn_module_stack", "torch_fn"})
        if (it->second->at("metadata").contains(key)) meta[key] = it->second->at("metadata")[key];
    if (!meta.contains("stack_trace") && !n.stack_trace.empty()) meta["stack_trace"] = n.stack_trace;
    meta["debug_handle"] = std::to_string(o.handle[k]);
    if (!o.source[k].empty()) {
      const json* src = o.aten_node.at(o.source[k]);
      std::string target = src->value("target", "");
      if (target.starts_with("torch.ops.")) target = target.substr(10);
      json from = json::array({{{"name", o.source[k]},
                                {"target", target},
                                {"graph_id", kExportGraphId},
                                {"pass_name", "kiln lower"},
                                {"action", "create"},
                                {"from_node", json::array()}}});
      meta["from_node"] = from.dump();
    }
    nodes.push_back({{"name", n.name}, {"target", kEdgeOps + n.target}, {"inputs", in}, {"outputs", out},
                     {"metadata", meta}});
  }
  json graph = {{"inputs", inputs},
                {"outputs", outputs},
                {"nodes", nodes},
                {"tensor_values", tensor_values},
                {"sym_int_values", json::object()},
                {"sym_bool_values", json::object()},
                {"is_single_tensor_return", false},
                {"custom_obj_values", json::object()}};
  const json& agm = aten.at("graph_module");
  return {{"graph_module",
           {{"graph", graph},
            {"signature", {{"input_specs", input_specs}, {"output_specs", output_specs}}},
            {"module_call_graph", agm.at("module_call_graph")}}},
          {"opset_version", aten.value("opset_version", json::object())},
          {"range_constraints", json::object()},
          {"schema_version", {{"major", 5}, {"minor", 4}}},
          {"dialect", ""},
          {"verifiers", json::array({"EDGE"})}};
}

// The spec's reference tensors (npy) as torch.save'd values; empty when it names none.
std::vector<io::NpyArray> references(const std::vector<pt2::SpecTensor>& tensors) {
  std::vector<io::NpyArray> out;
  for (const auto& t : tensors) {
    if (t.reference.empty()) return {};
    out.push_back(io::read_npy(t.reference));
  }
  return out;
}

PyValue tensors_of(const std::vector<io::NpyArray>& arrays, std::vector<Storage>* storages) {
  std::vector<PyValue> items;
  for (const io::NpyArray& a : arrays) {
    int64_t numel = 1;
    for (int64_t d : a.shape) numel *= d;
    const io::NpyArray* p = &a;
    storages->push_back({a.dtype, numel, [p](const etrecord::Sink& s) { s(p->data.data(), p->data.size()); }});
    items.push_back(tensor_value(storages->size() - 1, a.shape, false));
  }
  return PyValue::list(std::move(items));
}

}  // namespace

void write_etrecord(const EtrecordInput& in, StagedFile& out) {
  const passes::EdgeProgram& edge = *in.edge;
  const graph::Graph& g = edge.graph;
  std::string root;
  const json aten = aten_program(*in.exported, &root);
  const Origins o = origins(edge, aten);

  // instruction -> debug handle(s); delegate calls: their nodes' handles, the outputs' last and in
  // output order (Inspector pairs a call's k-th output from the end with its k-th handle from the end)
  json handle_map = json::object(), num_outs = json::object();
  nlohmann::ordered_json delegate_map = nlohmann::ordered_json::object();
  const auto& inode = in.report->instruction_node;
  const auto& iregion = in.report->instruction_region;
  // Inspector compares an instruction's output with its ATen node's: an output of another shape (kiln's
  // grouped-query products, [kv heads, group, ...] for [heads, ...]) would stop its comparison, so such an
  // instruction is left out of the map (its row then names no operator).
  auto comparable = [&](int32_t node) {  // one output of its ATen node's shape (native_layer_norm: the first)
    const auto outs = g.nodes[static_cast<size_t>(node)].output_ids();
    for (graph::ValueId v : outs)
      if (o.shape_matches(g.value(v).meta.sizes, static_cast<size_t>(node))) return true;
    return outs.empty();
  };
  for (size_t k = 0; k < inode.size(); ++k) {
    const std::string key = std::to_string(k);
    if (inode[k] >= 0) {
      if (comparable(inode[k])) handle_map[key] = o.handle[static_cast<size_t>(inode[k])];
    } else if (iregion[k] >= 0 && in.delegation) {
      const partition::DelegatedRegion& r = in.delegation->regions[static_cast<size_t>(iregion[k])];
      bool outputs_comparable = true;
      for (graph::ValueId v : r.outputs)
        if (g.value(v).producer >= 0 && !comparable(g.value(v).producer)) outputs_comparable = false;
      if (!outputs_comparable) continue;
      std::vector<int64_t> out_handles;
      for (graph::ValueId v : r.outputs)
        if (g.value(v).producer >= 0) out_handles.push_back(o.handle[static_cast<size_t>(g.value(v).producer)]);
      std::vector<int64_t> handles;
      std::set<int64_t> seen(out_handles.begin(), out_handles.end());
      for (int32_t n : r.nodes)
        if (seen.insert(o.handle[static_cast<size_t>(n)]).second) handles.push_back(o.handle[static_cast<size_t>(n)]);
      handles.insert(handles.end(), out_handles.begin(), out_handles.end());
      handle_map[key] = handles;
      num_outs[key] = r.outputs.size();
      // inside the delegate: payload node n (XNode.debug_handle = n) -> its ATen node's handle, for the
      // last node of each ATen node in the region (the one that computes its value)
      // (in node order: Inspector takes the last key a step's identifier contains, its last node's)
      std::map<int64_t, int32_t> last;
      for (int32_t n : r.nodes) last[o.handle[static_cast<size_t>(n)]] = n;
      nlohmann::ordered_json inner = nlohmann::ordered_json::object();
      for (int32_t n : r.nodes)
        if (last.at(o.handle[static_cast<size_t>(n)]) == n)
          inner[fmt::format("<{}>", n)] = nlohmann::ordered_json::array({o.handle[static_cast<size_t>(n)]});
      delegate_map[key] = nlohmann::ordered_json{{"name", r.backend_id}, {"delegate_map", inner}};
    }
  }

  Blobs aten_b = aten_blobs(*in.exported, aten);
  Blobs edge_b;
  const json edge_json = edge_program(edge, aten, o, &edge_b);
  const std::string sample_entry = root + "data/sample_inputs/" + in.exported->model_name + ".pt";
  const std::string sample = in.exported->archive->contains(sample_entry) ? in.exported->archive->read_text(sample_entry) : "";
  const std::vector<io::NpyArray> ref_in = in.spec ? references(in.spec->inputs) : std::vector<io::NpyArray>{};
  const std::vector<io::NpyArray> ref_out = in.spec ? references(in.spec->outputs) : std::vector<io::NpyArray>{};

  ZipWriter z([&out](const void* d, size_t n) { out.write(d, n); });
  auto save = [&](const std::string& name, const PyValue& v, const std::vector<Storage>& s) {
    z.begin(name);
    etrecord::torch_save([&z](const void* d, size_t n) { z.write(d, n); }, "archive", v, s);
    z.end();
  };
  auto program = [&](const std::string& base, const json& j, const Blobs& b) {
    z.add(base, j.dump());
    save(base + "_state_dict", b.state_dict, b.state_storages);
    save(base + "_constants", b.constants, b.constant_storages);
    z.add(base + "_example_inputs", sample);
  };
  z.add("ETRECORD_V0", "");
  program("exported_program", aten, aten_b);
  program("edge_dialect_exported_program/forward", edge_json, edge_b);
  z.add("export_graph_id", std::to_string(kExportGraphId));
  z.add("debug_handle_map", json{{"forward", handle_map}}.dump());
  z.add("delegate_map", nlohmann::ordered_json{{"forward", delegate_map}}.dump());
  z.add("instruction_id_to_num_outs_map", json{{"forward", num_outs}}.dump());
  if (!ref_in.empty()) {
    std::vector<Storage> s;
    const PyValue v = tensors_of(ref_in, &s);
    save("representative_inputs", v, s);
  }
  if (!ref_out.empty()) {
    std::vector<Storage> s;
    PyValue outs = tensors_of(ref_out, &s);
    save("reference_outputs", PyValue::dict_of({{"forward", PyValue::list({outs})}}), s);
  }
  z.finish();
}

}  // namespace kiln
