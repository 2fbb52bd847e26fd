// The graph `kiln view` draws: a program (.pte) or an exported program (.pt2)
// read into one small model -- nodes, the tensors between them, delegate
// regions with the backend's own nodes inside -- and the writers that turn it
// into a self-contained HTML page, Model Explorer's graph JSON, or a side-by-side
// comparison of two programs.
//
//   kiln::view::ViewGraph g = kiln::view::read_graph("gpt2_xnnpack.pte");   // throws kiln::Error
//   kiln::view::attach_profile(g, "profile.json");
//   std::string html = kiln::view::render_html(g);
//
// Ahead-of-time code: failures throw kiln::Error with one line naming the file.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace kiln::view {

// One tensor an edge carries (or a node reads or writes).
struct TensorInfo {
  int64_t value = -1;         // the .pte value index / XNNPACK value id; -1 if none
  std::string name;           // a .pt2 tensor name; empty for .pte values
  std::string dtype;          // "Float", "Long", "fp32" ...
  std::vector<int64_t> shape;
  std::string role;           // "constant", "input", "output", "" for a computed tensor
};

struct Attr {
  std::string key, value;
};

struct Node {
  enum class Kind : uint8_t { Input, Output, Kernel, Delegate, BackendNode, Other, Pt2Op };
  Kind kind = Kind::Kernel;
  std::string id;         // unique in the graph: "i12", "d3", "d3/x45", "in0", "n_view_3" ...
  std::string label;      // the operator ("aten::add.out", "XNNFullyConnected", "XnnpackBackend #3")
  int parent = -1;        // index of the delegate region node holding it, -1 at top level
  int instruction = -1;   // .pte instruction index (kernel and delegate calls)
  int64_t debug_handle = -1;
  bool fallback = false;  // an operator left outside every delegate of a delegated program
  std::string reason;     // why it was not delegated, when known
  std::string source;     // "file.py:123" (user source line), when known
  std::string stack_trace;
  std::string module;     // nn.Module path, "transformer.h.3.attn", when known
  std::vector<TensorInfo> inputs, outputs;
  std::vector<Attr> attrs;
  double profile_ms = -1; // per run, when a profile was attached
};

struct Edge {
  int from = -1, to = -1;  // node indices
  int tensor = 0;          // index into from's outputs
};

struct ViewGraph {
  std::string path;
  std::string format;      // "pte" or "pt2"
  std::string title;       // file name
  std::vector<std::string> notes;  // what extra files were read (report, debug map, profile)
  std::vector<Node> nodes;
  std::vector<Edge> edges;
  // Summary numbers the page and --compare print.
  int64_t delegate_regions = 0, backend_nodes = 0, kernel_calls = 0, fallback_ops = 0;
  std::map<std::string, int64_t> operator_counts;  // kernel/.pt2 operators (not backend nodes)
  std::map<std::string, int64_t> backend_operator_counts;  // nodes inside delegates
  std::string profile_note;  // what the attached profile was
};

std::string_view kind_name(Node::Kind kind);

// Reads a .pte (by its identifier "ET12" at byte 4) or a .pt2 (a zip); anything
// else is an error. For a .pte, also reads when present beside it: kiln lower's
// metadata JSON (<stem>.json: fallback reasons) and the debug map (<stem>.debug.json:
// source lines and module paths by instruction / debug handle).
ViewGraph read_graph(const std::string& path);

// Adds per-node times from a profile JSON: `kiln bench --profile --json` (time by
// operator label, spread over the nodes of that label) or `kiln profile --json`
// (per instruction / delegate node). Throws kiln::Error if the file is not such a profile.
void attach_profile(ViewGraph& graph, const std::string& profile_path);

// The graph as the JSON object the page's script draws.
std::string graph_json(const ViewGraph& graph);

// One self-contained HTML page (inline script and style, no network access).
std::string render_html(const ViewGraph& graph);
// Two programs side by side, with their region and operator counts.
std::string render_compare_html(const ViewGraph& a, const ViewGraph& b);

// The graph in Model Explorer's graph JSON (a GraphCollection with one graph).
std::string model_explorer_json(const ViewGraph& graph);

// Writes `text` to `path` through a temporary file renamed into place (never a
// partial file); throws kiln::Error if it cannot.
void write_file_atomically(const std::string& path, const std::string& text);

}  // namespace kiln::view
