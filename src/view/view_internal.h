// Private to kiln_view: the readers behind read_graph().
#pragma once

#include "kiln/view/graph_view.h"

#include <nlohmann/json.hpp>

#include <string>

namespace kiln::view {

ViewGraph read_pte(const std::string& path);
ViewGraph read_pt2_graph(const std::string& path);

// Source lines, module paths and fallback reasons from kiln lower's debug map
// (X.debug.json, format "kiln-debug-map"; docs/PROFILING.md), matched by
// instruction index and by XNNPACK debug handle.
void apply_debug_map(ViewGraph& g, const nlohmann::json& map, const std::string& map_path);

// "transformer.h.0.attn" from torch's serialized nn_module_stack
// ("key,path,type;key,path,type"): the innermost entry's path, normalized.
std::string module_path_of(const std::string& nn_module_stack);
// "file.py:123" from a stack trace: the innermost frame outside torch's own files.
std::string source_line_of(const std::string& stack_trace);

}  // namespace kiln::view
