// The emitter: an edge program into an ExecuTorch program model (pte::Program):
// out-variant kernel calls in graph order, values for every tensor and
// argument, planned memory for every non-constant tensor, and each distinct
// constant stored once (identical bytes are shared, however many values use them).
#pragma once

#include "kiln/passes/edge_program.h"
#include "kiln/pte/program_model.h"

#include <cstdint>
#include <map>
#include <string>

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
};

pte::Program emit_program(const passes::EdgeProgram& program, EmitReport* report = nullptr);

}  // namespace kiln::emit
