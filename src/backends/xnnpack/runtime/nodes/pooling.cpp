// 2-D pooling (max, average, global average): XNNPACK's, for both engines; they get XNNPACK's
// thread pool with the kiln engine too.
#include "node_kind.h"

#include <algorithm>

namespace kiln::backends::xnnpack::detail {

static Status define_pooling(const DefineContext& c, xnn_status* s) {
  const auto* p = static_cast<const fbx::_XNNPooling2D*>(c.node.xnode_union());
  if (c.type() == NodeType::XNNMaxPooling2d)
    *s = xnn_define_max_pooling_2d(c.sg, p->padding_top(), p->padding_right(), p->padding_bottom(), p->padding_left(),
                                   p->pooling_height(), p->pooling_width(), p->stride_height(), p->stride_width(),
                                   std::max<uint32_t>(1, p->dilation_height()),
                                   std::max<uint32_t>(1, p->dilation_width()), c.lo, c.hi, c.a, c.o, p->flags());
  else
    *s = xnn_define_average_pooling_2d(c.sg, p->padding_top(), p->padding_right(), p->padding_bottom(),
                                       p->padding_left(), p->pooling_height(), p->pooling_width(),
                                       p->stride_height(), p->stride_width(), c.lo, c.hi, c.a, c.o, p->flags());
  return Status::Ok;
}

static Status define_global_average(const DefineContext& c, xnn_status* s) {
  *s = xnn_define_global_average_pooling_2d(c.sg, c.lo, c.hi, c.a, c.o,
                                            c.node.xnode_union_as_XNNGlobalAvgPooling2d()->flags());
  return Status::Ok;
}

static bool io_pooling(const fbx::XNode& n, NodeIO& io) {
  return io_1x1(static_cast<const fbx::_XNNPooling2D*>(n.xnode_union()), io);
}

KILN_XNNPACK_NODE_KINDS(pooling_nodes,
  {.type = NodeType::XNNMaxPooling2d, .io = io_pooling, .define = define_pooling, .heavy = true},
  {.type = NodeType::XNNAvgPooling2d, .io = io_pooling, .define = define_pooling, .heavy = true},
  {.type = NodeType::XNNGlobalAvgPooling2d, .io = KILN_XNNPACK_IO(XNNGlobalAvgPooling2d),
   .define = define_global_average, .heavy = true})

}  // namespace kiln::backends::xnnpack::detail
