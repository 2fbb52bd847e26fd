// The emitter: an edge program into an ExecuTorch program model (pte::Program):
// out-variant kernel calls for the nodes on the portable path and one
// delegate call per delegated region, in a topological order of the graph
// with each region contracted to one node; values for every tensor and
// argument; planned memory for every non-constant tensor the instructions
// see (a region's internal values are the backend's business); and each
// distinct constant a kernel or delegate call reads stored once in the
// constant segment (identical bytes are shared, however many values use them).
// Constants that only delegates read travel as the delegates' named data.
#pragma once

#include "kiln/partition/delegated_region.h"
#include "kiln/passes/edge_program.h"
#include "kiln/pte/program_model.h"

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

namespace kiln::emit {

struct EmitReport {
  int64_t kernel_calls = 0;
  int64_t delegate_calls = 0;
  int64_t aliased_views = 0;                 // view-like nodes that became shared storage, not copies
  std::map<std::string, int64_t> operators;  // "aten::add.out" -> kernel calls
  int64_t values = 0;
  uint64_t planned_bytes = 0;                // arena size after reuse
  uint64_t naive_bytes = 0;                  // sum of all planned tensors without reuse
  int64_t constants = 0;                     // distinct constant buffers stored
  uint64_t constant_bytes = 0;
  int64_t deduplicated_constants = 0;        // constant values that reuse another's bytes
  int64_t delegated_nodes = 0;               // edge nodes inside delegate calls
  int64_t named_data = 0;                    // distinct named-data entries (by key)
  uint64_t named_data_bytes = 0;
  uint64_t delegate_payload_bytes = 0;
  int64_t mutable_buffers = 0;               // buffers kept across calls (planned, in place)
  uint64_t mutable_buffer_bytes = 0;
  // of those, the ones whose initial contents are all zeros: no mutable data in the file (the
  // planned memory they live in starts zeroed, in kiln's runtime and ExecuTorch's, whose own
  // LLM programs store no initial cache either)
  int64_t zero_initialized_buffers = 0;
  uint64_t mutable_data_bytes = 0;           // initial contents stored (the other buffers)
  // Debug information, per instruction of the "forward" plan: the edge node a
  // kernel call runs (its debug handle, see docs/PROFILING.md) or -1, and the
  // delegated region a delegate call runs or -1.
  std::vector<int32_t> instruction_node;
  std::vector<int32_t> instruction_region;
};

pte::Program emit_program(const passes::EdgeProgram& program, EmitReport* report = nullptr);

// As above, with `regions` (disjoint, each convex in the graph; made by the partitioner) as delegate calls.
pte::Program emit_program(const passes::EdgeProgram& program, std::span<const partition::DelegatedRegion> regions,
                          EmitReport* report = nullptr);

}  // namespace kiln::emit
