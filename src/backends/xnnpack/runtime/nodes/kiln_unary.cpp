// One-input nodes Debian's XNNPACK lacks, on kiln's code (run_unary): tanh, reciprocal square root,
// GELU, exp, log, sin, cos, copy. With the kiln engine those with a row op join fused row chains.
#include "node_kind.h"

namespace kiln::backends::xnnpack::detail {

Status unary_step(const StepContext& c, Step& step, UnaryOp op, const char* label) {
  if (c.in(0).numel != c.out().numel) return c.bad("input and output sizes differ");
  step.kind = StepKind::Unary;
  step.unary = op;
  step.count = c.out().numel;
  step.label = label;
  return Status::Ok;
}

// run_unary's `Op` as a step
template <UnaryOp Op>
static Status step(const StepContext& c, Step& s) {
  static constexpr const char* kLabels[] = {"kiln tanh", "kiln rsqrt", "kiln gelu", "kiln exp",
                                            "kiln log",  "kiln sin",   "kiln cos",  "kiln copy"};  // by UnaryOp
  return unary_step(c, s, Op, kLabels[static_cast<size_t>(Op)]);
}

static constexpr NodeKind unary(NodeType t, Status (*kiln_step)(const StepContext&, Step&),
                                RowOpKind op = RowOpKind::None) {
  return {.type = t, .io = io_node1x1, .infer = infer_same, .kiln_step = kiln_step, .row_op = op};
}

KILN_XNNPACK_NODE_KINDS(kiln_unary_nodes,
  unary(NodeType::XNNTanh, step<UnaryOp::Tanh>, RowOpKind::Tanh),
  unary(NodeType::XNNReciprocalSquareRoot, step<UnaryOp::Rsqrt>, RowOpKind::Rsqrt),
  unary(NodeType::XNNGelu, step<UnaryOp::Gelu>, RowOpKind::Gelu),
  unary(NodeType::XNNExp, step<UnaryOp::Exp>, RowOpKind::Exp),
  unary(NodeType::XNNLog, step<UnaryOp::Log>),
  unary(NodeType::XNNSin, step<UnaryOp::Sin>),
  unary(NodeType::XNNCos, step<UnaryOp::Cos>),
  unary(NodeType::XNNCopy, step<UnaryOp::Copy>, RowOpKind::Copy))

}  // namespace kiln::backends::xnnpack::detail
