// Static slice: a box of the input (a size of 0: to the end). On kiln's code (run_slice).
#include "node_kind.h"

namespace kiln::backends::xnnpack::detail {

static ShapeResult infer(const ShapeContext& c, std::array<int64_t, kMaxRank>& d) {
  const Value& x = c.x;
  const size_t n = c.n;
  const auto* p = c.node.xnode_union_as_XNNStaticSlice();
  if (!p->offsets() || !p->sizes() || p->offsets()->size() != x.ndims || p->sizes()->size() != x.ndims ||
      n != x.ndims)
    return shape_unsupported();
  for (size_t k = 0; k < n; ++k) {
    const int64_t off = p->offsets()->Get(static_cast<flatbuffers::uoffset_t>(k));
    const int64_t size = p->sizes()->Get(static_cast<flatbuffers::uoffset_t>(k));
    d[k] = size == 0 ? x.dims[k] - off : size;  // 0: to the end
    if (off < 0 || d[k] < 0 || off + d[k] > x.dims[k]) return shape_bad("the slice lies outside the input");
  }
  return shape_ok();
}

static Status step(const StepContext& c, Step& step) {
  const Value& in = c.in(0);
  const Value& out = c.out();
  const auto* p = c.node.xnode_union_as_XNNStaticSlice();
  if (!p->offsets() || !p->sizes() || p->offsets()->size() != in.ndims || p->sizes()->size() != in.ndims ||
      out.ndims != in.ndims || in.ndims == 0)
    return c.bad("offsets and sizes do not match the rank");
  step.kind = StepKind::Slice;
  step.label = "kiln slice";
  step.rank = in.ndims;
  for (uint32_t d = 0; d < in.ndims; ++d) {
    int64_t off = p->offsets()->Get(d), size = p->sizes()->Get(d);
    if (size == 0) size = in.dims[d] - off;  // XNNPACK: 0 means "to the end"
    if (off < 0 || size != out.dims[d] || off + size > in.dims[d]) return c.bad("slice lies outside the input");
    step.offsets[d] = off;
    step.in_dims[d] = in.dims[d];
    step.out_dims[d] = out.dims[d];
  }
  return Status::Ok;
}

KILN_XNNPACK_NODE_KINDS(slice_nodes,
  {.type = NodeType::XNNStaticSlice, .io = KILN_XNNPACK_IO(XNNStaticSlice), .infer = infer, .kiln_step = step})

}  // namespace kiln::backends::xnnpack::detail
