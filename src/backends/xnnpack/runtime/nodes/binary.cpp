// Binary elementwise nodes: add, subtract, multiply, divide, minimum, maximum (numpy broadcasting).
// XNNPACK defines them all; with the kiln engine they join fused row chains.
#include "node_kind.h"

#include <algorithm>

namespace kiln::backends::xnnpack::detail {

// numpy broadcasting, aligned on the last dim
static ShapeResult infer_broadcast(const ShapeContext& c, std::array<int64_t, kMaxRank>& d) {
  const Value& x = c.x;
  const Value& b = c.in(1);
  const size_t n = c.n;
  if (n != std::max(x.ndims, b.ndims)) return shape_unsupported();
  for (size_t k = 0; k < n; ++k) {
    const int64_t da = k + x.ndims >= n ? x.dims[k + x.ndims - n] : 1;
    const int64_t db = k + b.ndims >= n ? b.dims[k + b.ndims - n] : 1;
    if (da != db && da != 1 && db != 1) return shape_bad("operand sizes do not broadcast");
    d[k] = da == 1 ? db : da;
  }
  return shape_ok();
}

// XNNPACK's binary nodes with an output clamp, and without one (minimum, maximum)
template <xnn_status (*F)(xnn_subgraph_t, float, float, uint32_t, uint32_t, uint32_t, uint32_t)>
static Status define_clamped(const DefineContext& c, xnn_status* s) {
  *s = F(c.sg, c.lo, c.hi, c.a, c.b, c.o, 0);
  return Status::Ok;
}
template <xnn_status (*F)(xnn_subgraph_t, uint32_t, uint32_t, uint32_t, uint32_t)>
static Status define_plain(const DefineContext& c, xnn_status* s) {
  *s = F(c.sg, c.a, c.b, c.o, 0);
  return Status::Ok;
}

static constexpr NodeKind binary(NodeType t, Status (*define)(const DefineContext&, xnn_status*), RowOpKind op) {
  return {.type = t, .io = io_node2x1, .infer = infer_broadcast, .define = define, .row_op = op};
}

KILN_XNNPACK_NODE_KINDS(binary_nodes,
  binary(NodeType::XNNAdd, define_clamped<xnn_define_add2>, RowOpKind::Add),
  binary(NodeType::XNNSubtract, define_clamped<xnn_define_subtract>, RowOpKind::Sub),
  binary(NodeType::XNNMultiply, define_clamped<xnn_define_multiply2>, RowOpKind::Mul),
  binary(NodeType::XNNDiv, define_clamped<xnn_define_divide>, RowOpKind::Div),
  binary(NodeType::XNNMinimum, define_plain<xnn_define_minimum2>, RowOpKind::Min),
  binary(NodeType::XNNMaximum, define_plain<xnn_define_maximum2>, RowOpKind::Max))

}  // namespace kiln::backends::xnnpack::detail
