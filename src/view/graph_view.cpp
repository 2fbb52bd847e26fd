// read_graph (format by content), profiles, the page's graph JSON, and the
// writers (HTML page, comparison page, Model Explorer JSON, atomic file write).
#include "view_internal.h"

#include "kiln/core/error.h"
#include "kiln/core/output_file.h"
#include <view_assets.h>  // generated from viewer.js/viewer.css (CMakeLists.txt)

#include <fmt/format.h>

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

namespace kiln::view {

namespace fs = std::filesystem;
using nlohmann::json;

std::string_view kind_name(Node::Kind kind) {
  switch (kind) {
    case Node::Kind::Input: return "input";
    case Node::Kind::Output: return "output";
    case Node::Kind::Kernel: return "kernel";
    case Node::Kind::Delegate: return "delegate";
    case Node::Kind::BackendNode: return "backend_node";
    case Node::Kind::Other: return "other";
    case Node::Kind::Pt2Op: return "op";
  }
  return "other";
}

ViewGraph read_graph(const std::string& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) fail("{}: no such file", path);
  if (!fs::is_regular_file(path, ec)) fail("{}: not a regular file", path);
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("{}: cannot open", path);
  char head[8] = {};
  in.read(head, sizeof head);
  std::streamsize got = in.gcount();
  if (got >= 8 && head[4] == 'E' && head[5] == 'T') return read_pte(path);
  if (got >= 4 && head[0] == 'P' && head[1] == 'K' && head[2] == 3 && head[3] == 4) return read_pt2_graph(path);
  fail("{}: not a .pte program (no ExecuTorch identifier at byte 4) or a .pt2 archive (not a zip file)", path);
}

// ---- profiles ----

void attach_profile(ViewGraph& g, const std::string& profile_path) {
  std::ifstream in(profile_path);
  if (!in) fail("{}: cannot open the profile", profile_path);
  json p = json::parse(in, nullptr, false);
  if (p.is_discarded() || !p.is_object()) fail("{}: not a JSON profile", profile_path);
  for (Node& n : g.nodes) n.profile_ms = -1;
  auto add = [](Node& n, double ms) { n.profile_ms = (n.profile_ms < 0 ? 0 : n.profile_ms) + ms; };
  std::map<int, int> node_of_instruction;
  for (size_t i = 0; i < g.nodes.size(); ++i)
    if (g.nodes[i].instruction >= 0) node_of_instruction[g.nodes[i].instruction] = static_cast<int>(i);

  if (p.contains("rows") && p["rows"].is_array()) {
    // kiln profile --json: rows per instruction, per delegate step (with the
    // debug handles of the payload nodes it ran) and per delegate's call overhead
    size_t used = 0;
    for (const json& r : p["rows"]) {
      if (!r.is_object() || !r.contains("ms_per_run") || !r["ms_per_run"].is_number()) continue;
      double ms = r["ms_per_run"].get<double>();
      int ins = r.contains("instruction") && r["instruction"].is_number_integer() ? r["instruction"].get<int>() : -1;
      auto it = node_of_instruction.find(ins);
      if (it == node_of_instruction.end()) continue;
      int node = it->second;
      ++used;
      add(g.nodes[static_cast<size_t>(node)], ms);
      if (r.value("kind", "") != "step" || !r.contains("debug_handles") || !r["debug_handles"].is_array()) continue;
      std::set<int64_t> handles;
      for (const json& h : r["debug_handles"])
        if (h.is_number_integer()) handles.insert(h.get<int64_t>());
      std::vector<size_t> inner;
      for (size_t i = 0; i < g.nodes.size(); ++i)
        if (g.nodes[i].parent == node && handles.count(g.nodes[i].debug_handle)) inner.push_back(i);
      for (size_t i : inner) add(g.nodes[i], ms / static_cast<double>(inner.size()));
    }
    if (used == 0) fail("{}: the profile's rows name no instruction of {}", profile_path, g.title);
    g.profile_note = fmt::format("kiln profile: {} (ms per run; measured {:.3f} ms)", profile_path,
                                 p.value("measured_ms_per_run", 0.0));
    return;
  }
  if (p.contains("profile") && p["profile"].is_object()) {
    // kiln bench --profile --json: ms per run by label; a label's time is
    // spread evenly over the nodes that carry it; "Backend: step" labels go to
    // the delegate calls of that backend
    std::map<std::string, std::vector<size_t>> by_label, by_backend;
    for (size_t i = 0; i < g.nodes.size(); ++i) {
      const Node& n = g.nodes[i];
      if (n.kind == Node::Kind::Kernel || n.kind == Node::Kind::Other) by_label[n.label].push_back(i);
      if (n.kind == Node::Kind::Delegate)
        for (const Attr& a : n.attrs)
          if (a.key == "backend") by_backend[a.value].push_back(i);
    }
    size_t used = 0;
    for (const auto& [label, e] : p["profile"].items()) {
      if (!e.is_object() || !e.contains("ms_per_run") || !e["ms_per_run"].is_number()) continue;
      double ms = e["ms_per_run"].get<double>();
      const std::vector<size_t>* nodes = nullptr;
      if (auto it = by_label.find(label); it != by_label.end()) nodes = &it->second;
      if (!nodes)
        if (auto it = by_backend.find(label); it != by_backend.end()) nodes = &it->second;
      auto colon = label.find(": ");
      if (!nodes && colon != std::string::npos)
        if (auto it = by_backend.find(label.substr(0, colon)); it != by_backend.end()) nodes = &it->second;
      if (!nodes || nodes->empty()) continue;
      ++used;
      for (size_t i : *nodes) add(g.nodes[i], ms / static_cast<double>(nodes->size()));
    }
    if (used == 0) fail("{}: no label of the profile names an operator of {}", profile_path, g.title);
    g.profile_note = fmt::format("kiln bench --profile: {} (ms per run by operator, spread evenly over its calls)",
                                 profile_path);
    return;
  }
  fail("{}: not a profile of kiln bench --profile --json or kiln profile --json (no 'profile' or 'rows')", profile_path);
}

// ---- the page's data ----

namespace {

json tensor_json(const TensorInfo& t) {
  json j = {{"dtype", t.dtype}, {"shape", t.shape}};
  if (t.value >= 0) j["value"] = t.value;
  if (!t.name.empty()) j["name"] = t.name;
  if (!t.role.empty()) j["role"] = t.role;
  return j;
}

json graph_object(const ViewGraph& g) {
  json nodes = json::array();
  for (const Node& n : g.nodes) {
    json j = {{"id", n.id}, {"label", n.label}, {"kind", kind_name(n.kind)}, {"parent", n.parent}};
    if (n.instruction >= 0) j["instruction"] = n.instruction;
    if (n.debug_handle >= 0) j["debug_handle"] = n.debug_handle;
    if (n.fallback) j["fallback"] = true;
    if (!n.reason.empty()) j["reason"] = n.reason;
    if (!n.source.empty()) j["source"] = n.source;
    if (!n.stack_trace.empty()) j["stack_trace"] = n.stack_trace;
    if (!n.module.empty()) j["module"] = n.module;
    if (n.profile_ms >= 0) j["ms"] = n.profile_ms;
    j["inputs"] = json::array();
    for (const TensorInfo& t : n.inputs) j["inputs"].push_back(tensor_json(t));
    j["outputs"] = json::array();
    for (const TensorInfo& t : n.outputs) j["outputs"].push_back(tensor_json(t));
    j["attrs"] = json::array();
    for (const Attr& a : n.attrs) j["attrs"].push_back({a.key, a.value});
    nodes.push_back(std::move(j));
  }
  json edges = json::array();
  for (const Edge& e : g.edges) edges.push_back({e.from, e.to, e.tensor});
  return {{"title", g.title},
          {"path", g.path},
          {"format", g.format},
          {"notes", g.notes},
          {"profile", g.profile_note},
          {"summary",
           {{"delegate_regions", g.delegate_regions},
            {"backend_nodes", g.backend_nodes},
            {"kernel_calls", g.kernel_calls},
            {"fallback_ops", g.fallback_ops},
            {"operators", g.operator_counts},
            {"backend_operators", g.backend_operator_counts}}},
          {"nodes", nodes},
          {"edges", edges}};
}

// JSON inside <script>: "</" must not close the element.
std::string script_safe(std::string s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '<' && i + 1 < s.size() && (s[i + 1] == '/' || s[i + 1] == '!')) {
      out += "\\u003c";
      continue;
    }
    out += s[i];
  }
  return out;
}

std::string html_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '&': out += "&amp;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

std::string page(const std::string& title, const json& data) {
  std::string html;
  html += "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n";
  html += "<title>" + html_escape(title) + "</title>\n<style>\n";
  html += kViewerCss;
  html += "</style></head>\n<body>\n<script id=\"kiln-data\" type=\"application/json\">";
  html += script_safe(dump(data));
  html += "</script>\n<script>\n";
  html += kViewerJs;
  html += "</script>\n</body></html>\n";
  return html;
}

}  // namespace

std::string graph_json(const ViewGraph& g) { return dump(graph_object(g)); }

std::string render_html(const ViewGraph& g) {
  return page("kiln view: " + g.title, {{"mode", "single"}, {"graphs", json::array({graph_object(g)})}});
}

std::string render_compare_html(const ViewGraph& a, const ViewGraph& b) {
  return page("kiln view --compare: " + a.title + " vs " + b.title,
              {{"mode", "compare"}, {"graphs", json::array({graph_object(a), graph_object(b)})}});
}

// ---- Model Explorer ----
// Model Explorer's graph JSON (its graph_builder's dataclasses): one
// GraphCollection {label, graphs: [Graph {id, nodes: [GraphNode {id, label,
// namespace, subgraphIds, attrs: [{key, value}], incomingEdges: [{sourceNodeId,
// sourceNodeOutputId, targetNodeInputId}], inputsMetadata, outputsMetadata:
// [{id, attrs}]}]}]} -- the object its web app's JSON loader takes as a
// collection (an array there must be of graphs, or of {label, subgraphs}). A node's namespace ("XnnpackBackend_3") puts the
// backend's nodes of one delegate region into one collapsible group.
std::string model_explorer_json(const ViewGraph& g) {
  auto shape_text = [](const TensorInfo& t) {
    return fmt::format("{}[{}]", t.dtype, fmt::join(t.shape, ","));
  };
  // Namespace of each node: delegate regions become groups; the delegate call itself
  // is drawn as the group (Model Explorer draws a namespace as a collapsible layer).
  std::vector<std::string> ns(g.nodes.size());
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    if (n.kind == Node::Kind::Delegate) {
      std::string s = n.label;
      for (char& c : s)
        if (c == ' ' || c == '#' || c == '/') c = '_';
      ns[i] = s;
    }
  }
  for (size_t i = 0; i < g.nodes.size(); ++i)
    if (g.nodes[i].parent >= 0) ns[i] = ns[static_cast<size_t>(g.nodes[i].parent)];
    else if (!g.nodes[i].module.empty()) {
      std::string m = g.nodes[i].module;
      for (char& c : m)
        if (c == '.') c = '/';
      ns[i] = m;
    }
  // delegate nodes with inner nodes are represented by their inner nodes only
  std::vector<bool> has_inner(g.nodes.size(), false);
  for (const Node& n : g.nodes)
    if (n.parent >= 0) has_inner[static_cast<size_t>(n.parent)] = true;
  std::vector<json> incoming(g.nodes.size(), json::array());
  std::vector<std::set<std::pair<int, int>>> seen(g.nodes.size());
  for (const Edge& e : g.edges) {
    if (has_inner[static_cast<size_t>(e.from)] || has_inner[static_cast<size_t>(e.to)]) continue;
    if (!seen[static_cast<size_t>(e.to)].insert({e.from, e.tensor}).second) continue;
    incoming[static_cast<size_t>(e.to)].push_back(
        {{"sourceNodeId", g.nodes[static_cast<size_t>(e.from)].id},
         {"sourceNodeOutputId", std::to_string(e.tensor)},
         {"targetNodeInputId", std::to_string(incoming[static_cast<size_t>(e.to)].size())}});
  }
  json nodes = json::array();
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    if (has_inner[i]) continue;
    json attrs = json::array();
    auto attr = [&](const std::string& k, const std::string& v) { attrs.push_back({{"key", k}, {"value", v}}); };
    attr("kind", std::string(kind_name(n.kind)));
    if (n.fallback) attr("fallback", "true");
    if (!n.reason.empty()) attr("fallback_reason", n.reason);
    if (!n.source.empty()) attr("source", n.source);
    if (!n.module.empty()) attr("module", n.module);
    if (n.instruction >= 0) attr("instruction", std::to_string(n.instruction));
    if (n.debug_handle >= 0) attr("debug_handle", std::to_string(n.debug_handle));
    if (n.profile_ms >= 0) attr("ms_per_run", fmt::format("{:.4f}", n.profile_ms));
    for (const Attr& a : n.attrs) attr(a.key, a.value);
    json outs = json::array();
    for (size_t k = 0; k < n.outputs.size(); ++k)
      outs.push_back({{"id", std::to_string(k)},
                      {"attrs", json::array({{{"key", "tensor_shape"}, {"value", shape_text(n.outputs[k])}}})}});
    json ins = json::array();
    for (size_t k = 0; k < n.inputs.size(); ++k)
      ins.push_back({{"id", std::to_string(k)},
                     {"attrs", json::array({{{"key", "tensor_shape"}, {"value", shape_text(n.inputs[k])}}})}});
    nodes.push_back({{"id", n.id},
                     {"label", n.label},
                     {"namespace", ns[i]},
                     {"subgraphIds", json::array()},
                     {"attrs", attrs},
                     {"incomingEdges", incoming[i]},
                     {"inputsMetadata", ins},
                     {"outputsMetadata", outs}});
  }
  json graph = {{"id", g.title}, {"nodes", nodes}};
  json collection = {{"label", g.title}, {"graphs", json::array({graph})}};
  return dump(collection) + "\n";
}

// ---- files ----

void write_file_atomically(const std::string& path, const std::string& text) {
  kiln::write_file_atomically(path, text);  // kiln/core/output_file.h
}

}  // namespace kiln::view
