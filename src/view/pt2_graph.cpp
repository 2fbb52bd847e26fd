// A .pt2 exported program as a ViewGraph: its user inputs, its call_function
// nodes with their tensors' dtypes and shapes, source lines (stack_trace) and
// module paths (nn_module_stack, read from the graph JSON's node metadata),
// and its user outputs. Parameters and buffers are shown as the constant
// inputs of the nodes that read them, not as nodes.
#include "view_internal.h"

#include "kiln/core/dtype.h"
#include "kiln/core/error.h"
#include "kiln/pt2/pt2_reader.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <filesystem>
#include <map>

namespace kiln::view {

namespace fs = std::filesystem;
using nlohmann::json;

std::string module_path_of(const std::string& stack) {
  if (stack.empty()) return {};
  // innermost entry: after the last ';' -- "key,path,type"
  std::string last = stack.substr(stack.rfind(';') == std::string::npos ? 0 : stack.rfind(';') + 1);
  auto c1 = last.find(',');
  if (c1 == std::string::npos) return {};
  auto c2 = last.rfind(',');
  std::string path = c2 > c1 ? last.substr(c1 + 1, c2 - c1 - 1) : last.substr(c1 + 1);
  // torch spells attribute access of the root as L['self'].a.b[0] in some versions
  for (const char* prefix : {"L['self'].", "L__self__."})
    if (path.rfind(prefix, 0) == 0) path = path.substr(std::string(prefix).size());
  std::string out;
  for (size_t i = 0; i < path.size(); ++i) {
    char ch = path[i];
    if (ch == '[') {
      out += '.';
      continue;
    }
    if (ch == ']' || ch == '\'' || ch == '"') continue;
    out += ch;
  }
  return out;
}

std::string source_line_of(const std::string& trace) {
  // frames: File "path", line N, in fn -- the last one outside torch itself
  std::string best;
  size_t pos = 0;
  while ((pos = trace.find("File \"", pos)) != std::string::npos) {
    size_t end = trace.find('"', pos + 6);
    if (end == std::string::npos) break;
    std::string file = trace.substr(pos + 6, end - pos - 6);
    size_t line = trace.find("line ", end);
    if (line == std::string::npos) break;
    size_t line_end = trace.find_first_not_of("0123456789", line + 5);
    std::string number = trace.substr(line + 5, line_end - line - 5);
    bool torch_internal = file.find("/torch/") != std::string::npos;
    if (!torch_internal || best.empty()) best = fs::path(file).filename().string() + ":" + number;
    pos = end;
  }
  return best;
}

namespace {

std::string meta_dtype(const graph::TensorMeta& m) { return std::string(dtype_name(m.dtype)); }

}  // namespace

ViewGraph read_pt2_graph(const std::string& path) {
  pt2::ExportedProgram ep = pt2::read_pt2(path);
  ViewGraph g;
  g.path = path;
  g.format = "pt2";
  g.title = fs::path(path).filename().string();
  g.notes.push_back(fmt::format("exported program: torch {}, dialect {}", ep.torch_version, ep.dialect));

  // nn_module_stack per node, from the graph JSON (the reader keeps only stack_trace)
  std::vector<std::string> module_stacks;
  for (const std::string& e : ep.archive->entries()) {
    if (!e.ends_with("models/" + ep.model_name + ".json")) continue;
    json j = json::parse(ep.archive->read_text(e), nullptr, false);
    if (j.is_discarded()) break;
    const json* nodes = nullptr;
    if (j.contains("graph_module") && j["graph_module"].contains("graph") && j["graph_module"]["graph"].contains("nodes"))
      nodes = &j["graph_module"]["graph"]["nodes"];
    if (nodes && nodes->is_array())
      for (const json& n : *nodes) {
        std::string s;
        if (n.contains("metadata") && n["metadata"].is_object() && n["metadata"].contains("nn_module_stack") &&
            n["metadata"]["nn_module_stack"].is_string())
          s = n["metadata"]["nn_module_stack"].get<std::string>();
        module_stacks.push_back(std::move(s));
      }
    break;
  }
  const bool modules_aligned = module_stacks.size() == ep.graph.nodes.size();

  std::map<std::string, const graph::InputSpec*> spec_of;
  for (const graph::InputSpec& s : ep.signature.inputs) spec_of[s.arg_name] = &s;
  std::map<graph::ValueId, std::pair<int, int>> writer;
  auto tensor = [&](graph::ValueId v) {
    TensorInfo ti;
    ti.value = v;
    const auto& value = ep.graph.values[static_cast<size_t>(v)];
    ti.name = value.name;
    ti.dtype = meta_dtype(value.meta);
    ti.shape = value.meta.sizes;
    if (auto it = spec_of.find(value.name); it != spec_of.end() && it->second->kind != graph::InputSpec::Kind::UserInput)
      ti.role = "constant", ti.name = it->second->target.empty() ? value.name : it->second->target;
    return ti;
  };
  auto add = [&](Node n) {
    g.nodes.push_back(std::move(n));
    return static_cast<int>(g.nodes.size()) - 1;
  };
  auto write = [&](graph::ValueId v, int node) {
    Node& n = g.nodes[static_cast<size_t>(node)];
    writer[v] = {node, static_cast<int>(n.outputs.size())};
    n.outputs.push_back(tensor(v));
  };
  auto read = [&](graph::ValueId v, int node) {
    g.nodes[static_cast<size_t>(node)].inputs.push_back(tensor(v));
    if (auto it = writer.find(v); it != writer.end()) g.edges.push_back({it->second.first, node, it->second.second});
  };

  for (size_t i = 0; i < ep.graph.inputs.size(); ++i) {
    graph::ValueId v = ep.graph.inputs[i];
    const auto& value = ep.graph.values[static_cast<size_t>(v)];
    auto it = spec_of.find(value.name);
    if (it != spec_of.end() && it->second->kind != graph::InputSpec::Kind::UserInput) continue;
    Node n;
    n.kind = Node::Kind::Input;
    n.id = fmt::format("in{}", i);
    n.label = value.name;
    int node = add(std::move(n));
    write(v, node);
    g.nodes[static_cast<size_t>(node)].outputs.back().role = "input";
  }
  for (size_t k = 0; k < ep.graph.nodes.size(); ++k) {
    const graph::Node& gn = ep.graph.nodes[k];
    Node n;
    n.kind = Node::Kind::Pt2Op;
    n.id = "n_" + gn.name;
    n.label = gn.target;
    n.stack_trace = gn.stack_trace;
    n.source = source_line_of(gn.stack_trace);
    if (modules_aligned) n.module = module_path_of(module_stacks[k]);
    n.attrs.push_back({"name", gn.name});
    int node = add(std::move(n));
    for (const graph::NamedArgument& na : gn.inputs) {
      std::vector<graph::ValueId> ids = na.arg.tensor_ids();
      if (ids.empty()) {
        std::string text;
        switch (na.arg.kind) {
          case graph::Argument::Kind::None: text = "None"; break;
          case graph::Argument::Kind::Int: text = std::to_string(std::get<int64_t>(na.arg.payload)); break;
          case graph::Argument::Kind::Ints: text = fmt::format("[{}]", fmt::join(std::get<std::vector<int64_t>>(na.arg.payload), ", ")); break;
          case graph::Argument::Kind::Float: text = fmt::format("{}", std::get<double>(na.arg.payload)); break;
          case graph::Argument::Kind::Bool: text = std::get<bool>(na.arg.payload) ? "True" : "False"; break;
          case graph::Argument::Kind::String: text = std::get<std::string>(na.arg.payload); break;
          default: text = std::string(graph::argument_kind_name(na.arg.kind)); break;
        }
        g.nodes[static_cast<size_t>(node)].attrs.push_back({na.name, text});
        continue;
      }
      for (graph::ValueId v : ids) read(v, node);
    }
    for (graph::ValueId v : gn.output_ids()) write(v, node);
    g.operator_counts[gn.target]++;
  }
  size_t k = 0;
  for (size_t i = 0; i < ep.graph.outputs.size(); ++i) {
    if (i < ep.signature.outputs.size() && ep.signature.outputs[i].kind != graph::OutputSpec::Kind::UserOutput) continue;
    Node n;
    n.kind = Node::Kind::Output;
    n.id = fmt::format("out{}", k);
    n.label = fmt::format("output {}", k++);
    int node = add(std::move(n));
    for (graph::ValueId v : ep.graph.outputs[i].tensor_ids()) read(v, node);
  }
  return g;
}

void apply_debug_map(ViewGraph& g, const json& map, const std::string& map_path) {
  if (map.value("format", "") != "kiln-debug-map") return;
  // only for the program it was written with
  if (map.contains("pte") && map["pte"].is_string() && map["pte"].get<std::string>() != fs::path(g.path).filename().string())
    return;
  std::map<int64_t, const json*> by_handle;
  if (map.contains("nodes") && map["nodes"].is_array())
    for (const json& n : map["nodes"])
      if (n.is_object() && n.contains("debug_handle") && n["debug_handle"].is_number_integer())
        by_handle[n["debug_handle"].get<int64_t>()] = &n;
  std::map<int64_t, int64_t> handle_of_instruction;
  if (map.contains("instructions") && map["instructions"].is_array())
    for (const json& i : map["instructions"])
      if (i.is_object() && i.contains("index") && i.contains("debug_handle") && i["debug_handle"].is_number_integer())
        handle_of_instruction[i.value("index", int64_t{-1})] = i["debug_handle"].get<int64_t>();
  auto fill = [&](Node& n, const json& d) {
    if (d.contains("module_path") && d["module_path"].is_string()) n.module = d["module_path"].get<std::string>();
    if (d.contains("source") && d["source"].is_object() && d["source"].contains("location") &&
        d["source"]["location"].is_string())
      n.source = d["source"]["location"].get<std::string>();
    if (d.contains("stack_trace") && d["stack_trace"].is_string()) n.stack_trace = d["stack_trace"].get<std::string>();
    if (d.contains("fallback_reason") && d["fallback_reason"].is_string() && n.fallback)
      n.reason = d["fallback_reason"].get<std::string>();
    if (d.contains("name") && d["name"].is_string()) n.attrs.push_back({"edge_node", d["name"].get<std::string>()});
  };
  int matched = 0;
  for (Node& n : g.nodes) {
    int64_t handle = -1;
    if (n.kind == Node::Kind::Kernel) {
      auto it = handle_of_instruction.find(n.instruction);
      if (it != handle_of_instruction.end()) handle = it->second;
      if (handle >= 0) n.debug_handle = handle;
    } else if (n.kind == Node::Kind::BackendNode) {
      handle = n.debug_handle;
    }
    auto it = by_handle.find(handle);
    if (handle < 0 || it == by_handle.end()) continue;
    fill(n, *it->second);
    ++matched;
  }
  g.notes.push_back(fmt::format("debug map: {} ({} nodes matched)", map_path, matched));
}

}  // namespace kiln::view
