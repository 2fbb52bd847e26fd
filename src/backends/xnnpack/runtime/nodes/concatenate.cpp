// Concatenate 2 to 5 inputs along an axis. On kiln's code (run_concat).
#include "node_kind.h"

#include <algorithm>

namespace kiln::backends::xnnpack::detail {

static bool io(const fbx::XNode& node, NodeIO& io) {
  auto* n = static_cast<const fbx::_XNNCat*>(node.xnode_union());
  if (!n) return false;
  io.num_in = static_cast<size_t>(node.xnode_union_type()) - static_cast<size_t>(NodeType::XNNConcatenate2) + 2;
  if (node.xnode_union_type() == NodeType::XNNConcatenate5) io.num_in = 5;
  io.in = {n->input1_id(), n->input2_id(), n->input3_id(), n->input4_id(), n->input5_id()};
  io.out = n->output_id();
  return true;
}

static ShapeResult infer(const ShapeContext& c, std::array<int64_t, kMaxRank>& d) {
  const Value& x = c.x;
  const size_t n = c.n;
  const uint32_t axis = static_cast<const fbx::_XNNCat*>(c.node.xnode_union())->axis();
  if (axis >= n || x.ndims != n) return shape_unsupported();
  std::copy_n(x.dims.begin(), n, d.begin());
  d[axis] = 0;
  for (size_t j = 0; j < c.io.num_in; ++j) {
    const Value& e = c.in(j);
    if (e.ndims != n) return shape_unsupported();
    for (size_t k = 0; k < n; ++k)
      if (k != axis && e.dims[k] != x.dims[k]) return shape_bad("the inputs' sizes differ off the axis");
    d[axis] += e.dims[axis];
  }
  return shape_ok();
}

static Status step(const StepContext& c, Step& step) {
  const Value& out = c.out();
  uint32_t axis = static_cast<const fbx::_XNNCat*>(c.node.xnode_union())->axis();
  if (axis >= out.ndims) return c.bad("axis is out of range");
  step.kind = StepKind::Concat;
  step.label = "kiln concatenate";
  step.outer = 1;
  for (uint32_t d = 0; d < axis; ++d) step.outer *= out.dims[d];
  int64_t total = 0;
  for (size_t j = 0; j < c.io.num_in; ++j) {
    const Value& x = c.in(j);
    if (x.ndims != out.ndims) return c.bad("inputs and output differ in rank");
    step.widths[j] = x.numel / std::max<int64_t>(1, step.outer);
    total += step.widths[j];
  }
  if (total * step.outer != out.numel) return c.bad("input sizes do not add up to the output");
  return Status::Ok;
}

KILN_XNNPACK_NODE_KINDS(concatenate_nodes,
  {.type = NodeType::XNNConcatenate2, .io = io, .infer = infer, .kiln_step = step},
  {.type = NodeType::XNNConcatenate3, .io = io, .infer = infer, .kiln_step = step},
  {.type = NodeType::XNNConcatenate4, .io = io, .infer = infer, .kiln_step = step},
  {.type = NodeType::XNNConcatenate5, .io = io, .infer = infer, .kiln_step = step})

}  // namespace kiln::backends::xnnpack::detail
