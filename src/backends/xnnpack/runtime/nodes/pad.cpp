// Static constant padding: XNNPACK's.
#include "node_kind.h"

namespace kiln::backends::xnnpack::detail {

static ShapeResult infer(const ShapeContext& c, std::array<int64_t, kMaxRank>& d) {
  const Value& x = c.x;
  const size_t n = c.n;
  const auto* p = c.node.xnode_union_as_XNNStaticConstantPad();
  if (!p->pre_paddings() || !p->post_paddings() || p->pre_paddings()->size() != x.ndims ||
      p->post_paddings()->size() != x.ndims || n != x.ndims)
    return shape_unsupported();
  for (size_t k = 0; k < n; ++k)
    d[k] = x.dims[k] + p->pre_paddings()->Get(static_cast<flatbuffers::uoffset_t>(k)) +
           p->post_paddings()->Get(static_cast<flatbuffers::uoffset_t>(k));
  return shape_ok();
}

static Status define(const DefineContext& c, xnn_status* s) {
  const auto* p = c.node.xnode_union_as_XNNStaticConstantPad();
  const Value& in = c.st.values[c.io.in[0]];
  std::array<size_t, kMaxRank> pre{}, post{};
  if (!p->pre_paddings() || !p->post_paddings() || p->pre_paddings()->size() != in.ndims ||
      p->post_paddings()->size() != in.ndims)
    return fail(c.error, Status::InvalidProgram, "node %zu: padding does not match the input's rank", c.index);
  for (uint32_t d = 0; d < in.ndims; ++d) { pre[d] = p->pre_paddings()->Get(d); post[d] = p->post_paddings()->Get(d); }
  *s = xnn_define_static_constant_pad(c.sg, pre.data(), post.data(), p->padding_value(), c.a, c.o, 0);
  return Status::Ok;
}

KILN_XNNPACK_NODE_KINDS(pad_nodes, {.type = NodeType::XNNStaticConstantPad, .io = KILN_XNNPACK_IO(XNNStaticConstantPad),
                                    .infer = infer, .define = define})

}  // namespace kiln::backends::xnnpack::detail
