// Static transpose: the output's dims are the input's, permuted. On kiln's code (run_transpose);
// fuse_transposed_bmm.cpp folds one of the last two dims into the batch matmul that reads it.
#include "node_kind.h"

namespace kiln::backends::xnnpack::detail {

static ShapeResult infer(const ShapeContext& c, std::array<int64_t, kMaxRank>& d) {
  const Value& x = c.x;
  const auto* p = c.node.xnode_union_as_XNNStaticTranspose();
  if (!p->perm() || p->perm()->size() != x.ndims || c.n != x.ndims) return shape_unsupported();
  for (size_t k = 0; k < c.n; ++k) {
    const uint32_t pk = p->perm()->Get(static_cast<flatbuffers::uoffset_t>(k));
    if (pk >= x.ndims) return shape_unsupported();
    d[k] = x.dims[pk];
  }
  return shape_ok();
}

static Status step(const StepContext& c, Step& step) {
  const Value& in = c.in(0);
  const Value& out = c.out();
  const auto* p = c.node.xnode_union_as_XNNStaticTranspose();
  if (!p->perm() || p->perm()->size() != in.ndims || out.ndims != in.ndims) return c.bad("perm does not match the rank");
  step.kind = StepKind::Transpose;
  step.label = "kiln transpose";
  step.rank = in.ndims;
  uint32_t seen = 0;
  for (uint32_t d = 0; d < in.ndims; ++d) {
    uint32_t pd = p->perm()->Get(d);
    if (pd >= in.ndims || (seen & (1u << pd))) return c.bad("perm is not a permutation");
    seen |= 1u << pd;
    step.perm[d] = pd;
    step.in_dims[d] = in.dims[d];
    step.out_dims[d] = out.dims[d];
    if (in.dims[pd] != out.dims[d]) return c.bad("output shape is not the permuted input shape");
  }
  if (in.ndims == 0) { step.kind = StepKind::Unary; step.unary = UnaryOp::Copy; step.count = out.numel; }
  return Status::Ok;
}

KILN_XNNPACK_NODE_KINDS(transpose_nodes,
  {.type = NodeType::XNNStaticTranspose, .io = KILN_XNNPACK_IO(XNNStaticTranspose), .infer = infer, .kiln_step = step})

}  // namespace kiln::backends::xnnpack::detail
