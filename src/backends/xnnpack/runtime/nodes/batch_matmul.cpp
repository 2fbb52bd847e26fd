// Batch matrix multiply: C = A · B over broadcast batch dims. On kiln's code (run_bmm); the
// fusions fold a transpose of B into it (fuse_transposed_bmm.cpp), make the tied LM head of it
// (fuse_lm_head.cpp) and run attention over the live positions (fuse_live_attention.cpp).
#include "node_kind.h"

#include <algorithm>

namespace kiln::backends::xnnpack::detail {

static ShapeResult infer(const ShapeContext& c, std::array<int64_t, kMaxRank>& d) {
  const Value& x = c.x;
  const Value& b = c.in(1);
  const size_t n = c.n;
  const bool tb = static_cast<const fbx::_XNNNode2x1*>(c.node.xnode_union())->flags() != 0;
  if (x.ndims < 2 || b.ndims < 2 || n != std::max(x.ndims, b.ndims)) return shape_unsupported();
  const int64_t m = x.dims[x.ndims - 2], ka = x.dims[x.ndims - 1];
  const int64_t kb = tb ? b.dims[b.ndims - 1] : b.dims[b.ndims - 2], nn = tb ? b.dims[b.ndims - 2] : b.dims[b.ndims - 1];
  if (ka != kb) return shape_bad("the operands' inner sizes differ");
  for (size_t k = 0; k + 2 < n; ++k) {
    const int64_t da = k + x.ndims >= n ? x.dims[k + x.ndims - n] : 1;
    const int64_t db = k + b.ndims >= n ? b.dims[k + b.ndims - n] : 1;
    if (da != db && da != 1 && db != 1) return shape_bad("batch sizes do not broadcast");
    d[k] = da == 1 ? db : da;
  }
  d[n - 2] = m;
  d[n - 1] = nn;
  return shape_ok();
}

static Status step(const StepContext& c, Step& step) {
  const Value& in = c.in(0);
  const Value& b = c.in(1);
  const Value& out = c.out();
  if (static_cast<const fbx::_XNNNode2x1*>(c.node.xnode_union())->flags() != 0)
    return fail(c.error, Status::NotSupported, "node %zu: batch matmul with a transposed operand", c.index);
  if (in.ndims < 2 || b.ndims < 2 || out.ndims < 2) return c.bad("operands need rank >= 2");
  step.kind = StepKind::Bmm;
  step.label = "kiln batch matmul";
  step.m = in.dims[in.ndims - 2];
  step.k = in.dims[in.ndims - 1];
  step.n = b.dims[b.ndims - 1];
  if (b.dims[b.ndims - 2] != step.k || out.dims[out.ndims - 2] != step.m || out.dims[out.ndims - 1] != step.n)
    return c.bad("operand shapes do not agree");
  step.batch = out.numel / std::max<int64_t>(1, step.m * step.n);
  int64_t ab = in.numel / std::max<int64_t>(1, step.m * step.k), bb = b.numel / std::max<int64_t>(1, step.k * step.n);
  if ((ab != step.batch && ab != 1) || (bb != step.batch && bb != 1))
    return c.bad("batch dims broadcast in a way kiln does not run");
  step.a_batch_stride = ab == 1 ? 0 : step.m * step.k;
  step.b_batch_stride = bb == 1 ? 0 : step.k * step.n;
  return Status::Ok;
}

KILN_XNNPACK_NODE_KINDS(batch_matmul_nodes,
  {.type = NodeType::XNNBatchMatrixMultiply, .io = io_node2x1, .infer = infer, .kiln_step = step})

}  // namespace kiln::backends::xnnpack::detail
