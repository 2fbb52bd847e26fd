// kiln lower's debug map (kiln/compiler/debug_map.h; format: docs/PROFILING.md).
#include "kiln/compiler/debug_map.h"

#include "kiln/passes/op_table.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cstdlib>

namespace kiln {

std::vector<SourceFrame> parse_stack_trace(const std::string& st) {
  // torch's format: frames outermost first, each
  //   File "path", line N, in function\n    code
  std::vector<SourceFrame> frames;
  size_t pos = 0;
  while ((pos = st.find("File \"", pos)) != std::string::npos) {
    size_t name_end = st.find('"', pos + 6);
    if (name_end == std::string::npos) break;
    SourceFrame f;
    f.file = st.substr(pos + 6, name_end - pos - 6);
    size_t line_at = st.find("line ", name_end);
    size_t eol = st.find('\n', name_end);
    if (line_at == std::string::npos || (eol != std::string::npos && line_at > eol)) {
      pos = name_end;
      continue;
    }
    f.line = std::strtoll(st.c_str() + line_at + 5, nullptr, 10);
    if (size_t in = st.find(", in ", line_at); in != std::string::npos && (eol == std::string::npos || in < eol))
      f.function = st.substr(in + 5, (eol == std::string::npos ? st.size() : eol) - in - 5);
    if (eol != std::string::npos) {
      size_t next = st.find('\n', eol + 1);
      std::string code = st.substr(eol + 1, (next == std::string::npos ? st.size() : next) - eol - 1);
      if (code.find("File \"") == std::string::npos) {
        size_t b = code.find_first_not_of(' ');
        f.code = b == std::string::npos ? std::string() : code.substr(b);
      }
    }
    frames.push_back(std::move(f));
    pos = name_end;
  }
  return frames;
}

std::string debug_map_json(const DebugMapInput& in) {
  using nlohmann::json;
  const graph::Graph& g = in.edge->graph;
  const size_t n = g.nodes.size();
  std::vector<int32_t> region_of(n, -1), instruction_of(n, -1);
  const std::vector<std::string>* reasons = nullptr;
  if (in.delegation) {
    for (size_t r = 0; r < in.delegation->regions.size(); ++r)
      for (int32_t i : in.delegation->regions[r].nodes) region_of[static_cast<size_t>(i)] = static_cast<int32_t>(r);
    reasons = &in.delegation->partition.reason;
  }
  const auto& inode = in.report->instruction_node;
  const auto& iregion = in.report->instruction_region;
  std::vector<int32_t> region_instruction, region_delegate;
  if (in.delegation) {
    region_instruction.assign(in.delegation->regions.size(), -1);
    region_delegate.assign(in.delegation->regions.size(), -1);
  }
  json instructions = json::array();
  int32_t delegates = 0;
  for (size_t k = 0; k < inode.size(); ++k) {
    if (inode[k] >= 0) {
      const graph::Node& node = g.nodes[static_cast<size_t>(inode[k])];
      instruction_of[static_cast<size_t>(inode[k])] = static_cast<int32_t>(k);
      const passes::OpSchema* s = passes::find_op_schema(node.target);
      std::string op = s == nullptr ? node.target
                                    : (s->overload.empty() ? std::string(s->kernel) : fmt::format("{}.{}", s->kernel, s->overload));
      instructions.push_back({{"index", k}, {"kind", "kernel"}, {"debug_handle", inode[k]}, {"op", op}});
    } else if (iregion[k] < 0) {  // a dynamic program's shape arithmetic (sym_size, executorch_prim)
      instructions.push_back({{"index", k}, {"kind", "scalar"}});
    } else {
      const auto r = static_cast<size_t>(iregion[k]);
      region_instruction[r] = static_cast<int32_t>(k);
      region_delegate[r] = delegates;
      instructions.push_back({{"index", k},
                              {"kind", "delegate"},
                              {"delegate", delegates++},
                              {"region", r},
                              {"backend", in.delegation->regions[r].backend_id}});
    }
  }
  json regions = json::array();
  if (in.delegation)
    for (size_t r = 0; r < in.delegation->regions.size(); ++r) {
      const auto& reg = in.delegation->regions[r];
      regions.push_back({{"index", r},
                         {"backend", reg.backend_id},
                         {"instruction", region_instruction[r]},
                         {"delegate", region_delegate[r]},
                         {"debug_handles", reg.nodes}});
    }
  json nodes = json::array();
  for (size_t i = 0; i < n; ++i) {
    const graph::Node& node = g.nodes[i];
    json frames = json::array();
    for (const SourceFrame& f : parse_stack_trace(node.stack_trace))
      frames.push_back({{"file", f.file}, {"line", f.line}, {"function", f.function}, {"code", f.code}});
    json source = nullptr;
    if (!frames.empty()) {
      // The innermost frame outside torch itself: the model's line that made the node
      // (the innermost frame is often torch.nn's forward, e.g. F.linear in linear.py).
      size_t pick = frames.size() - 1;
      for (size_t k = frames.size(); k-- > 0;) {
        const std::string file = frames[k]["file"].get<std::string>();
        if (file.find("/torch/") == std::string::npos) {
          pick = k;
          break;
        }
      }
      const json& last = frames[pick];
      std::string file = last["file"].get<std::string>();
      if (auto slash = file.rfind('/'); slash != std::string::npos) file = file.substr(slash + 1);
      source = {{"file", last["file"]},
                {"line", last["line"]},
                {"function", last["function"]},
                {"location", fmt::format("{}:{}", file, last["line"].get<int64_t>())}};
    }
    json e = {{"debug_handle", i},
              {"name", node.name},
              {"target", node.target},
              {"source_nodes", node.source_nodes},
              {"module_path", node.module_path},
              {"module_type", node.module_type},
              {"source", source},
              {"frames", frames},
              {"stack_trace", node.stack_trace},
              {"region", region_of[i] >= 0 ? json(region_of[i]) : json(nullptr)},
              {"instruction", instruction_of[i] >= 0 ? json(instruction_of[i])
                              : region_of[i] >= 0   ? json(region_instruction[static_cast<size_t>(region_of[i])])
                                                    : json(nullptr)}};
    if (region_of[i] < 0 && instruction_of[i] < 0) e["aliased"] = true;  // a view sharing its input's storage
    if (reasons && region_of[i] < 0 && i < reasons->size() && !(*reasons)[i].empty()) e["fallback_reason"] = (*reasons)[i];
    nodes.push_back(std::move(e));
  }
  json j = {{"format", "kiln-debug-map"},
            {"version", 1},
            {"pte", in.pte_name},
            {"exported_program", in.exported_program},
            {"backend", in.backend},
            {"method", "forward"},
            {"instructions", std::move(instructions)},
            {"regions", std::move(regions)},
            {"nodes", std::move(nodes)}};
  if (!in.pte_sha256.empty()) j["pte_sha256"] = in.pte_sha256;
  return j.dump(1) + "\n";
}

}  // namespace kiln
