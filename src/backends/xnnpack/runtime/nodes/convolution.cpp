// 2-D convolutions (regular, depthwise, transposed): XNNPACK's, for both engines, with constant
// filters and bias; they get XNNPACK's thread pool with the kiln engine too.
#include "node_kind.h"

#include <algorithm>

namespace kiln::backends::xnnpack::detail {

static bool io(const fbx::XNode& node, NodeIO& io) {
  auto* n = static_cast<const fbx::_XNNNodeConv*>(node.xnode_union());
  if (!n) return false;
  io.in[0] = n->input1_id(); io.in[1] = n->filter_id(); io.in[2] = n->bias_id(); io.num_in = 3;
  io.out = n->output_id();
  return true;
}

static Status define(const DefineContext& c, xnn_status* s) {
  const auto* p = static_cast<const fbx::_XNNNodeConv*>(c.node.xnode_union());
  if (!c.st.values[c.io.in[1]].constant || (c.io.in[2] != kInvalidId && !c.st.values[c.io.in[2]].constant))
    return fail(c.error, Status::NotSupported, "node %zu: convolution with non-constant weights", c.index);
  const NodeType ct = c.type();
  if (ct == NodeType::XNNConv2d)
    *s = xnn_define_convolution_2d(c.sg, p->padding_top(), p->padding_right(), p->padding_bottom(), p->padding_left(),
                                   p->kernel_height(), p->kernel_width(), p->subsampling_height(),
                                   p->subsampling_width(), p->dilation_height(), p->dilation_width(), p->groups(),
                                   p->group_input_channels(), p->group_output_channels(), c.lo, c.hi, c.a, c.b, c.bias,
                                   c.o, p->flags());
  else if (ct == NodeType::XNNDepthwiseConv2d)
    *s = xnn_define_depthwise_convolution_2d(
        c.sg, p->padding_top(), p->padding_right(), p->padding_bottom(), p->padding_left(), p->kernel_height(),
        p->kernel_width(), p->subsampling_height(), p->subsampling_width(), p->dilation_height(),
        p->dilation_width(), p->group_output_channels() / std::max<uint32_t>(1, p->group_input_channels()),
        p->groups() * p->group_input_channels(), c.lo, c.hi, c.a, c.b, c.bias, c.o, p->flags());
  else
    *s = xnn_define_deconvolution_2d(c.sg, p->padding_top(), p->padding_right(), p->padding_bottom(),
                                     p->padding_left(), p->adjustment_height(), p->adjustment_width(),
                                     p->kernel_height(), p->kernel_width(), p->subsampling_height(),
                                     p->subsampling_width(), p->dilation_height(), p->dilation_width(), p->groups(),
                                     p->group_input_channels(), p->group_output_channels(), c.lo, c.hi, c.a, c.b, c.bias,
                                     c.o, p->flags());
  return Status::Ok;
}

static constexpr NodeKind conv(NodeType t) {
  return {.type = t, .io = io, .optional_bias = true, .define = define, .heavy = true};
}

KILN_XNNPACK_NODE_KINDS(convolution_nodes, conv(NodeType::XNNConv2d), conv(NodeType::XNNDepthwiseConv2d),
                        conv(NodeType::XNNConvTranspose2d))

}  // namespace kiln::backends::xnnpack::detail
