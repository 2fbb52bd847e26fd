// Static reshape: a view of its input where the storage plan can join their bytes
// (storage_plan.cpp), else a copy on kiln's code.
#include "node_kind.h"

namespace kiln::backends::xnnpack::detail {

// a reshape's 0 entry is the one size it infers
static ShapeResult infer(const ShapeContext& c, std::array<int64_t, kMaxRank>& d) {
  const Value& x = c.x;
  const size_t n = c.n;
  const auto* p = c.node.xnode_union_as_XNNStaticReshape();
  if (!p->new_shape() || p->new_shape()->size() != n) return shape_unsupported();
  int64_t known = 1;
  size_t inferred = SIZE_MAX;
  for (size_t k = 0; k < n; ++k) {
    d[k] = p->new_shape()->Get(static_cast<flatbuffers::uoffset_t>(k));
    if (d[k] != 0) { known *= d[k]; continue; }
    if (inferred != SIZE_MAX) return shape_unsupported();  // XNNPACK infers one size at most
    inferred = k;
  }
  if (inferred != SIZE_MAX) {
    if (known == 0 || x.numel % known != 0) return shape_bad("the input's elements do not fill the new shape");
    d[inferred] = x.numel / known;
  } else if (known != x.numel) {
    return shape_unsupported();  // a fixed shape over an input whose size changed
  }
  return shape_ok();
}

static Status copy_step(const StepContext& c, Step& step) { return unary_step(c, step, UnaryOp::Copy, "kiln copy"); }

KILN_XNNPACK_NODE_KINDS(reshape_nodes, {.type = NodeType::XNNStaticReshape, .io = KILN_XNNPACK_IO(XNNStaticReshape),
                                        .infer = infer, .kiln_step = copy_step})

}  // namespace kiln::backends::xnnpack::detail
