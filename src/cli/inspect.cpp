// `kiln inspect`: what a .pt2 (or the model spec naming one) holds.
#include "commands.h"
#include "kiln/core/error.h"
#include "kiln/pt2/model_spec.h"
#include "kiln/pt2/pt2_reader.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <set>
#include <tuple>

namespace kiln::cli {
namespace {

using nlohmann::json;

struct InspectOptions {
  std::string file;
  bool as_json = false;
  bool checksums = false;
  bool list_constants = false;
};

// 124439808 -> "124,439,808"
std::string grouped(int64_t n) {
  std::string digits = std::to_string(n);
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0 && digits[i - 1] != '-') out += ',';
    out += digits[i];
  }
  return out;
}

std::string shape_str(const std::vector<int64_t>& sizes) { return fmt::format("[{}]", fmt::join(sizes, ", ")); }

json tensor_json(const std::string& name, const graph::TensorMeta& m) {
  json j = {{"name", name}, {"dtype", dtype_name(m.dtype)}, {"shape", m.sizes}};
  if (!m.sym_sizes.empty()) {  // a dynamic tensor: "shape" is at the upper bounds, "sym_shape" its expressions
    std::vector<std::string> dims;
    for (const auto& e : m.sym_sizes) dims.push_back(e.str());
    j["sym_shape"] = dims;
  }
  return j;
}

// Parameters share storage when tied (GPT-2's wte and lm_head): count each tensor once.
struct ParameterTotals {
  int64_t tensors = 0, unique_tensors = 0, elements = 0, bytes = 0;
};

ParameterTotals parameter_totals(const pt2::ExportedProgram& ep) {
  ParameterTotals t;
  std::set<std::tuple<std::string, int64_t, std::vector<int64_t>, std::vector<int64_t>>> seen;
  for (const auto& c : ep.constants) {
    if (c.kind != pt2::ConstantTensor::Kind::Parameter) continue;
    ++t.tensors;
    if (!seen.emplace(fmt::format("{}@{}", c.entry, c.entry_offset), c.meta.storage_offset, c.meta.sizes, c.meta.strides).second)
      continue;
    ++t.unique_tensors;
    t.elements += c.meta.numel();
    t.bytes += c.meta.nbytes();
  }
  return t;
}

int run_inspect(const InspectOptions& o) {
  namespace fs = std::filesystem;
  std::string pt2_path = o.file;
  if (fs::path(o.file).extension() == ".json") pt2_path = pt2::read_model_spec(o.file).exported_program;
  else check(fs::exists(o.file), "{}: file not found", o.file);
  if (fs::path(pt2_path).extension() == ".pte") return inspect_pte(pt2_path, o.as_json);

  pt2::ExportedProgram ep = pt2::read_pt2(pt2_path);
  const auto& g = ep.graph;
  auto histogram = g.operator_histogram();
  ParameterTotals params = parameter_totals(ep);

  std::vector<std::pair<std::string, graph::TensorMeta>> user_inputs, user_outputs;
  for (size_t i = 0; i < ep.signature.inputs.size(); ++i)
    if (ep.signature.inputs[i].kind == graph::InputSpec::Kind::UserInput)
      user_inputs.emplace_back(g.value(g.inputs[i]).name, g.value(g.inputs[i]).meta);
  for (size_t i = 0; i < ep.signature.outputs.size(); ++i) {
    if (ep.signature.outputs[i].kind != graph::OutputSpec::Kind::UserOutput) continue;
    const auto& out = g.outputs[i];
    if (out.kind == graph::Argument::Kind::Tensor) {
      const auto& v = g.value(std::get<graph::ValueId>(out.payload));
      user_outputs.emplace_back(v.name, v.meta);
    }
  }

  if (o.as_json) {
    json j;
    j["file"] = pt2_path;
    j["format"] = "pt2";
    j["torch_version"] = ep.torch_version;
    j["schema_version"] = ep.schema_version;
    j["dialect"] = ep.dialect;
    j["node_count"] = g.nodes.size();
    j["operators"] = histogram;
    if (!g.symbols.empty()) {
      j["symbols"] = json::array();
      for (const auto& s : g.symbols) j["symbols"].push_back({{"name", s.name}, {"min", s.min}, {"max", s.max}});
    }
    j["inputs"] = json::array();
    for (const auto& [n, m] : user_inputs) j["inputs"].push_back(tensor_json(n, m));
    j["outputs"] = json::array();
    for (const auto& [n, m] : user_outputs) j["outputs"].push_back(tensor_json(n, m));
    j["parameters"] = {{"tensors", params.tensors},
                       {"unique_tensors", params.unique_tensors},
                       {"elements", params.elements},
                       {"bytes", params.bytes}};
    j["constants"] = json::array();
    for (const auto& c : ep.constants) {
      json cj = tensor_json(c.name, c.meta);
      cj["kind"] = constant_kind_name(c.kind);
      cj["strides"] = c.meta.strides;
      cj["storage_offset"] = c.meta.storage_offset;
      cj["bytes"] = c.meta.nbytes();
      cj["entry"] = c.entry;
      if (o.checksums) cj["crc32"] = ep.content_crc32(c);
      j["constants"].push_back(std::move(cj));
    }
    fmt::print("{}\n", j.dump(2));
    return 0;
  }

  int64_t n_user = static_cast<int64_t>(user_inputs.size());
  fmt::print("{}\n", pt2_path);
  fmt::print("  exported by torch {}, schema {}, dialect {}\n", ep.torch_version, ep.schema_version, ep.dialect);
  fmt::print("  graph: {} nodes, {} inputs ({} user, {} constant), {} output{}\n", g.nodes.size(), g.inputs.size(),
             n_user, static_cast<int64_t>(g.inputs.size()) - n_user, g.outputs.size(), g.outputs.size() == 1 ? "" : "s");
  for (const auto& s : g.symbols) fmt::print("  symbol {} in [{}, {}] (read at {})\n", s.name, s.min, s.max, s.max);
  fmt::print("inputs:\n");
  for (const auto& [n, m] : user_inputs) fmt::print("  {:<24} {}{}\n", n, dtype_name(m.dtype), shape_str(m.sizes));
  fmt::print("outputs:\n");
  for (const auto& [n, m] : user_outputs) fmt::print("  {:<24} {}{}\n", n, dtype_name(m.dtype), shape_str(m.sizes));
  fmt::print("parameters: {} tensors ({} unique), {} elements, {:.1f} MB\n", params.tensors, params.unique_tensors,
             grouped(params.elements), static_cast<double>(params.bytes) / 1e6);
  if (o.list_constants) {
    for (const auto& c : ep.constants) {
      fmt::print("  {:<48} {:<15} {}{}", c.name, constant_kind_name(c.kind), dtype_name(c.meta.dtype),
                 shape_str(c.meta.sizes));
      if (o.checksums) fmt::print("  crc32={:08x}", ep.content_crc32(c));
      fmt::print("\n");
    }
  }
  std::vector<std::pair<std::string, int64_t>> ops(histogram.begin(), histogram.end());
  std::stable_sort(ops.begin(), ops.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
  fmt::print("operators ({} distinct):\n", ops.size());
  for (const auto& [op, count] : ops) fmt::print("  {:>5}  {}\n", count, op);
  return 0;
}

}  // namespace

void add_inspect_options(CLI::App* cmd, std::function<int()>& run) {
  auto opts = bind_action(cmd, run, run_inspect);
  cmd->add_option("file", opts->file, "a .pt2 archive, or a model_spec.json naming one")->required();
  cmd->add_flag("--json", opts->as_json, "print machine-readable JSON (includes every constant tensor)");
  cmd->add_flag("--constants", opts->list_constants, "list every parameter, buffer and tensor constant");
  cmd->add_flag("--checksums", opts->checksums, "add a CRC-32 of each constant's contents (reads all weights)");
}

}  // namespace kiln::cli
