// One-input nodes XNNPACK defines: softmax, sigmoid, clamp, square, square root, negate, abs, floor,
// ceiling, hardswish, ELU, leaky ReLU. With the kiln engine those with a row op join fused row chains.
#include "node_kind.h"

namespace kiln::backends::xnnpack::detail {

template <xnn_status (*F)(xnn_subgraph_t, uint32_t, uint32_t, uint32_t)>
static Status define_1x1(const DefineContext& c, xnn_status* s) {
  *s = F(c.sg, c.a, c.o, 0);
  return Status::Ok;
}

static Status define_clamp(const DefineContext& c, xnn_status* s) {
  *s = xnn_define_clamp(c.sg, c.lo, c.hi, c.a, c.o, 0);
  return Status::Ok;
}

static Status define_elu(const DefineContext& c, xnn_status* s) {
  *s = xnn_define_elu(c.sg, c.node.xnode_union_as_XNNELU()->alpha(), c.a, c.o, 0);
  return Status::Ok;
}

static Status define_leaky_relu(const DefineContext& c, xnn_status* s) {
  *s = xnn_define_leaky_relu(c.sg, c.node.xnode_union_as_XNNLeakyReLU()->negative_slope(), c.a, c.o, 0);
  return Status::Ok;
}

static constexpr NodeKind unary(NodeType t, Status (*define)(const DefineContext&, xnn_status*),
                         RowOpKind op = RowOpKind::None) {
  return {.type = t, .io = io_node1x1, .infer = infer_same, .define = define, .row_op = op};
}

KILN_XNNPACK_NODE_KINDS(library_unary_nodes,
  unary(NodeType::XNNSoftmax, define_1x1<xnn_define_softmax>, RowOpKind::Softmax),
  unary(NodeType::XNNSigmoid, define_1x1<xnn_define_sigmoid>, RowOpKind::Sigmoid),
  unary(NodeType::XNNClamp, define_clamp, RowOpKind::Copy),  // the row op's clamp
  unary(NodeType::XNNSquare, define_1x1<xnn_define_square>, RowOpKind::Square),
  unary(NodeType::XNNSquareRoot, define_1x1<xnn_define_square_root>, RowOpKind::Sqrt),
  unary(NodeType::XNNNegate, define_1x1<xnn_define_negate>, RowOpKind::Neg),
  unary(NodeType::XNNAbs, define_1x1<xnn_define_abs>, RowOpKind::Abs),
  unary(NodeType::XNNFloor, define_1x1<xnn_define_floor>),
  unary(NodeType::XNNCeiling, define_1x1<xnn_define_ceiling>),
  unary(NodeType::XNNHardswish, define_1x1<xnn_define_hardswish>),
  {.type = NodeType::XNNELU, .io = KILN_XNNPACK_IO(XNNELU), .infer = infer_same, .define = define_elu},
  {.type = NodeType::XNNLeakyReLU, .io = KILN_XNNPACK_IO(XNNLeakyReLU), .infer = infer_same, .define = define_leaky_relu})

}  // namespace kiln::backends::xnnpack::detail
