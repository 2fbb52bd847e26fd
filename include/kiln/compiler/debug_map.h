// The debug map `kiln lower` writes beside a .pte (X.pte -> X.debug.json):
// for every edge node (its index is its debug handle, the value kiln's
// XNNPACK payloads put in XNode.debug_handle), the .pt2 node(s) it came from,
// its source location and nn.Module path, and the instruction or delegated
// region that runs it. The format is described in docs/PROFILING.md.
#pragma once

#include "kiln/emit/emitter.h"
#include "kiln/backends/xnnpack/partitioner.h"
#include "kiln/passes/edge_program.h"

#include <cstdint>
#include <string>
#include <vector>

namespace kiln {

struct DebugMapInput {
  const passes::EdgeProgram* edge = nullptr;
  const backends::xnnpack::XnnpackDelegation* delegation = nullptr;  // null for a portable lowering
  const emit::EmitReport* report = nullptr;                    // instruction_node / instruction_region
  std::string pte_name;           // the .pte's file name
  std::string exported_program;   // the .pt2's path
  std::string backend;            // "portable" / "xnnpack"
  std::string pte_sha256;         // the .pte's digest, when known: the map names the very file it describes
};

// The debug map as JSON text (ends in a newline).
std::string debug_map_json(const DebugMapInput& in);

// One frame of a node's stack_trace ("File \"x.py\", line 12, in f\n    code").
struct SourceFrame {
  std::string file;
  int64_t line = 0;
  std::string function;
  std::string code;
};
std::vector<SourceFrame> parse_stack_trace(const std::string& stack_trace);

}  // namespace kiln
