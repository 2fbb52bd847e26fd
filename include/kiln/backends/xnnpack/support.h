// What kiln's XNNPACK payload builder can express: for each edge-graph
// operator, the XNNPACK graph nodes it becomes and the conditions under
// which it does. The partitioner asks `xnnpack_supports` node by node; the
// payload builder (payload.h) asks again and refuses what is not supported.
//
// Conditions every supported node meets (besides its row of the table):
//  - every tensor it reads or writes is float32, contiguous, has static
//    sizes, at most 6 dimensions (XNN_MAX_TENSOR_DIMS) and no zero-size
//    dimension;
//  - every tensor it writes has at least one dimension; rank-0 tensors are
//    accepted only as an operand of an elementwise binary operator.
#pragma once

#include "kiln/graph/graph.h"

#include <span>
#include <string>
#include <string_view>

namespace kiln::backends::xnnpack {

struct SupportRule {
  std::string_view target;       // edge-graph operator, "aten.addmm.default"
  std::string_view lowering;     // the XNNPACK nodes it becomes
  std::string_view constraints;  // what the node's arguments must satisfy beyond the common conditions
};

// The table, one row per supported operator.
std::span<const SupportRule> xnnpack_support_table();

// True when the payload builder can express `node` (a node of `graph`);
// otherwise false, and `*reason` (when given) says why in one line.
bool xnnpack_supports(const graph::Graph& graph, const graph::Node& node, std::string* reason = nullptr);

}  // namespace kiln::backends::xnnpack
