// Static bilinear resize: XNNPACK's, for both engines; it gets XNNPACK's thread pool with the kiln
// engine too.
#include "node_kind.h"

namespace kiln::backends::xnnpack::detail {

static Status define(const DefineContext& c, xnn_status* s) {
  const auto* r = c.node.xnode_union_as_XNNStaticResizeBilinear2D();
  *s = xnn_define_static_resize_bilinear_2d(c.sg, r->new_height(), r->new_width(), c.a, c.o, r->flags());
  return Status::Ok;
}

KILN_XNNPACK_NODE_KINDS(resize_nodes, {.type = NodeType::XNNStaticResizeBilinear2D,
                                       .io = KILN_XNNPACK_IO(XNNStaticResizeBilinear2D), .define = define, .heavy = true})

}  // namespace kiln::backends::xnnpack::detail
