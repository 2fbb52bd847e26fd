// Test-only: builds a program of XNNPACK delegate calls from a JSON
// description of an edge graph and its regions, with kiln's payload builder
// and .pte writer, for tests/python/test_xnnpack_payload.py to run in
// ExecuTorch's runtime.
//
//   kiln_xnnpack_smoke SPEC.json OUT.pte [--payloads DIR]   build; prints per-region stats (JSON)
//   kiln_xnnpack_smoke --check SPEC.json                    xnnpack_supports per node (JSON)
//   kiln_xnnpack_smoke --table                              the support table (JSON)
//
// SPEC.json:
//   "values":    [{"name", "shape": [..], "dtype": "float32"}]     every tensor of the graph
//   "constants": [{"value", "npy": PATH, "key": KEY}]               data of constant values ("" key: by content)
//   "nodes":     [{"name", "target", "args": {NAME: ARG}, "outputs": [OUT]}]
//                ARG: {"t": value} | {"ts": [values]} | int | float | bool | string | [ints] | [floats] | null
//                OUT: value | [values] (a tensor list) | null
//   "inputs", "outputs": [values]                                   the program's inputs and outputs
//   "regions":   [{"nodes": [names], "inputs": [values], "outputs": [values], "constants": [values]}]
// Each region becomes one delegate call, in order; values between calls and
// the program outputs get planned memory. --payloads writes region i's
// payload to DIR/payload_i.bin.
#include "kiln/backends/xnnpack/payload.h"
#include "kiln/backends/xnnpack/support.h"
#include "kiln/core/error.h"
#include "kiln/io/npy.h"
#include "kiln/pte/pte_writer.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <string>

namespace xnn = kiln::backends::xnnpack;
using json = nlohmann::json;
using kiln::check;
using kiln::fail;
using kiln::graph::Argument;
using kiln::graph::ValueId;

namespace {

std::optional<kiln::ScalarType> dtype_from_name(const std::string& name) {
  for (auto t : {kiln::ScalarType::Float, kiln::ScalarType::Long, kiln::ScalarType::Int, kiln::ScalarType::Half,
                 kiln::ScalarType::Bool, kiln::ScalarType::Double})
    if (kiln::dtype_name(t) == name) return t;
  return std::nullopt;
}

struct Spec {
  kiln::graph::Graph graph;
  std::map<std::string, int32_t> node_index;
  std::map<ValueId, std::pair<std::string, kiln::pte::DataBlob>> constants;  // value -> (key, bytes)
};

ValueId value_named(const kiln::graph::Graph& g, const std::string& name) {
  auto v = g.find_value(name);
  check(v.has_value(), "spec: unknown value '{}'", name);
  return *v;
}

Argument argument(const kiln::graph::Graph& g, const json& j) {
  using K = Argument::Kind;
  if (j.is_null()) return Argument::none();
  if (j.is_object() && j.contains("t")) return Argument::tensor(value_named(g, j["t"]));
  if (j.is_object() && j.contains("ts")) {
    std::vector<ValueId> ids;
    for (const auto& n : j["ts"]) ids.push_back(value_named(g, n));
    return {K::Tensors, ids};
  }
  if (j.is_boolean()) return {K::Bool, j.get<bool>()};
  if (j.is_number_integer()) return {K::Int, j.get<int64_t>()};
  if (j.is_number_float()) return {K::Float, j.get<double>()};
  if (j.is_string()) return {K::String, j.get<std::string>()};
  if (j.is_array()) {
    bool ints = std::all_of(j.begin(), j.end(), [](const json& e) { return e.is_number_integer(); });
    if (ints) return {K::Ints, j.get<std::vector<int64_t>>()};
    return {K::Floats, j.get<std::vector<double>>()};
  }
  fail("spec: cannot read argument {}", j.dump());
}

Spec read_spec(const std::string& path) {
  std::ifstream in(path);
  check(in.good(), "cannot open {}", path);
  json j = json::parse(in);
  Spec s;
  auto& g = s.graph;
  for (const auto& v : j.at("values")) {
    kiln::graph::TensorMeta m;
    m.dtype = *dtype_from_name(v.value("dtype", "float32"));
    m.sizes = v.at("shape").get<std::vector<int64_t>>();
    m.strides.assign(m.sizes.size(), 1);
    for (size_t d = m.sizes.size(); d-- > 1;) m.strides[d - 1] = m.strides[d] * m.sizes[d];
    g.add_value(v.at("name").get<std::string>(), m);
  }
  for (const auto& c : j.value("constants", json::array())) {
    ValueId v = value_named(g, c.at("value"));
    kiln::io::NpyArray a = kiln::io::read_npy(c.at("npy").get<std::string>());
    const auto& m = g.value(v).meta;
    check(a.dtype == m.dtype && a.shape == m.sizes, "constant '{}': the .npy does not match its value",
          g.value(v).name);
    s.constants[v] = {c.value("key", ""), kiln::pte::DataBlob::from_bytes(std::move(a.data))};
  }
  for (const auto& n : j.at("nodes")) {
    kiln::graph::Node node;
    node.name = n.at("name");
    node.target = n.at("target");
    for (const auto& [name, arg] : n.at("args").items()) node.inputs.push_back({name, argument(g, arg), false});
    for (const auto& o : n.at("outputs")) {
      if (o.is_null()) node.outputs.push_back(Argument::none());
      else if (o.is_array()) node.outputs.push_back(argument(g, json{{"ts", o}}));
      else node.outputs.push_back(Argument::tensor(value_named(g, o)));
    }
    auto index = static_cast<int32_t>(g.nodes.size());
    for (ValueId v : node.output_ids()) g.values[static_cast<size_t>(v)].producer = index;
    s.node_index[node.name] = index;
    g.nodes.push_back(std::move(node));
  }
  for (const auto& name : j.at("inputs")) g.inputs.push_back(value_named(g, name));
  for (const auto& name : j.at("outputs")) g.outputs.push_back(Argument::tensor(value_named(g, name)));
  return s;
}

std::string leaves(size_t n) {
  std::string s;
  for (size_t i = 0; i < n; ++i)
    s += std::string(i ? ", " : "") + R"({"type": null, "context": null, "children_spec": []})";
  return s;
}

int build(const std::string& spec_path, const std::string& out_path, const std::string& payload_dir) {
  json j;
  {
    std::ifstream in(spec_path);
    j = json::parse(in);
  }
  Spec s = read_spec(spec_path);
  const auto& g = s.graph;

  kiln::pte::Program program;
  program.plans.emplace_back();
  std::map<ValueId, int32_t> value_index;
  uint64_t planned = 0;
  auto tensor_value = [&](ValueId v, bool planned_memory) {
    if (auto it = value_index.find(v); it != value_index.end()) return it->second;
    const auto& m = g.value(v).meta;
    kiln::pte::TensorValue t;
    t.dtype = m.dtype;
    for (int64_t x : m.sizes) t.sizes.push_back(static_cast<int32_t>(x));
    for (size_t d = 0; d < m.sizes.size(); ++d) t.dim_order.push_back(static_cast<uint8_t>(d));
    if (planned_memory) {
      t.allocation = kiln::pte::Allocation{1, planned};
      planned += (static_cast<uint64_t>(m.nbytes()) + 15) / 16 * 16;
    }
    auto& plan = program.plans[0];
    plan.values.emplace_back(std::move(t));
    auto index = static_cast<int32_t>(plan.values.size() - 1);
    value_index[v] = index;
    return index;
  };
  for (ValueId v : g.inputs) program.plans[0].inputs.push_back(tensor_value(v, false));

  json stats = json::array();
  size_t region_number = 0;
  for (const auto& r : j.at("regions")) {
    xnn::Region region;
    for (const auto& n : r.at("nodes")) {
      auto it = s.node_index.find(n.get<std::string>());
      check(it != s.node_index.end(), "spec: region names unknown node '{}'", n.get<std::string>());
      region.nodes.push_back(it->second);
    }
    for (const auto& n : r.at("inputs")) region.inputs.push_back(value_named(g, n));
    for (const auto& n : r.at("outputs")) region.outputs.push_back(value_named(g, n));
    for (const auto& n : r.value("constants", json::array())) {
      ValueId v = value_named(g, n);
      auto c = s.constants.find(v);
      check(c != s.constants.end(), "spec: region constant '{}' has no data", n.get<std::string>());
      region.constants.push_back({v, c->second.first, c->second.second});
    }
    xnn::Payload payload = xnn::build_payload(g, region);
    if (!payload_dir.empty()) {
      std::string path = payload_dir + "/payload_" + std::to_string(region_number) + ".bin";
      std::ofstream out(path, std::ios::binary);
      out.write(reinterpret_cast<const char*>(payload.bytes.data()),
                static_cast<std::streamsize>(payload.bytes.size()));
      check(out.good(), "cannot write {}", path);
    }
    json keys = json::array();
    for (const auto& n : payload.named_data) keys.push_back(n.key);
    stats.push_back({{"xnodes", payload.stats.xnodes},
                     {"xvalues", payload.stats.xvalues},
                     {"absorbed_nodes", payload.stats.absorbed_nodes},
                     {"named_constants", payload.stats.named_constants},
                     {"made_constants", payload.stats.made_constants},
                     {"named_keys", keys},
                     {"payload_bytes", payload.bytes.size()}});
    kiln::pte::DelegateCall call;
    call.delegate_index = xnn::add_delegate(program, 0, std::move(payload));
    std::set<ValueId> program_inputs(g.inputs.begin(), g.inputs.end());
    for (ValueId v : region.inputs) call.args.push_back(tensor_value(v, !program_inputs.contains(v)));
    for (ValueId v : region.outputs) call.args.push_back(tensor_value(v, true));
    program.plans[0].instructions.push_back(std::move(call));
    ++region_number;
  }
  auto& plan = program.plans[0];
  for (const auto& o : g.outputs) {
    ValueId v = o.tensor_ids().at(0);
    auto it = value_index.find(v);
    check(it != value_index.end(), "spec: program output '{}' is not computed by any region", g.value(v).name);
    plan.outputs.push_back(it->second);
  }
  plan.non_const_buffer_sizes = {0, static_cast<int64_t>(std::max<uint64_t>(planned, 16))};
  // Pytree specs as torch.export writes them: ((x0, x1, ...), {}) in, one leaf or a tuple out.
  const std::string tuple = R"({"type": "builtins.tuple", "context": "null", "children_spec": [)";
  plan.encoded_inputs_spec = "[1, " + tuple + tuple + leaves(g.inputs.size()) +
                             R"(]}, {"type": "builtins.dict", "context": "[]", "children_spec": []}]}])";
  plan.encoded_outputs_spec =
      g.outputs.size() == 1 ? "[1, " + leaves(1) + "]" : "[1, " + tuple + leaves(g.outputs.size()) + "]}]";
  kiln::pte::write_pte(program, out_path);
  std::printf("%s\n", json{{"regions", stats}, {"named_data", program.named_data.size()}}.dump().c_str());
  return 0;
}

int check_nodes(const std::string& spec_path) {
  Spec s = read_spec(spec_path);
  json out = json::array();
  for (const auto& n : s.graph.nodes) {
    std::string reason;
    bool ok = xnn::xnnpack_supports(s.graph, n, &reason);
    out.push_back({{"name", n.name}, {"target", n.target}, {"supported", ok}, {"reason", reason}});
  }
  std::printf("%s\n", out.dump().c_str());
  return 0;
}

int table() {
  json out = json::array();
  for (const auto& r : xnn::xnnpack_support_table())
    out.push_back({{"target", r.target}, {"lowering", r.lowering}, {"constraints", r.constraints}});
  std::printf("%s\n", out.dump().c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    if (argc == 2 && std::strcmp(argv[1], "--table") == 0) return table();
    if (argc == 3 && std::strcmp(argv[1], "--check") == 0) return check_nodes(argv[2]);
    if (argc == 3) return build(argv[1], argv[2], "");
    if (argc == 5 && std::strcmp(argv[3], "--payloads") == 0) return build(argv[1], argv[2], argv[4]);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kiln_xnnpack_smoke: %s\n", e.what());
    return 1;
  }
  std::fprintf(stderr, "usage: kiln_xnnpack_smoke SPEC.json OUT.pte [--payloads DIR] | --check SPEC.json | --table\n");
  return 2;
}
