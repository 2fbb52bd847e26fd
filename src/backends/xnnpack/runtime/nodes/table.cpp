// The node kinds kiln's XNNPACK backend runs (node_kind.h): one line per file of kinds.
// A new kind: its file in this directory, which defines `std::span<const NodeKind> NAME()`,
// and NAME's line below.
#include "node_kind.h"

#include <array>

#define KILN_XNNPACK_NODE_FILES(X)                                                         \
  X(binary_nodes)           /* binary.cpp: add, subtract, multiply, divide, min, max */     \
  X(library_unary_nodes)    /* library_unary.cpp: XNNPACK's maps, softmax, clamp */          \
  X(kiln_unary_nodes)       /* kiln_unary.cpp: tanh, rsqrt, gelu, exp, log, sin, cos, copy */ \
  X(convert_nodes)          /* convert.cpp: fp32 -> int8 rows */                             \
  X(fully_connected_nodes)  /* fully_connected.cpp */                                        \
  X(batch_matmul_nodes)     /* batch_matmul.cpp */                                           \
  X(transpose_nodes)        /* transpose.cpp */                                              \
  X(reshape_nodes)          /* reshape.cpp */                                                \
  X(slice_nodes)            /* slice.cpp */                                                  \
  X(concatenate_nodes)      /* concatenate.cpp: 2 to 5 inputs */                             \
  X(pad_nodes)              /* pad.cpp: constant padding */                                  \
  X(convolution_nodes)      /* convolution.cpp: conv, depthwise conv, transposed conv */     \
  X(pooling_nodes)          /* pooling.cpp: max, average, global average */                 \
  X(resize_nodes)           /* resize.cpp: bilinear */                                       \
  X(prelu_nodes)            /* prelu.cpp */

namespace kiln::backends::xnnpack::detail {

#define KILN_DECLARE_NODE_FILE(f) std::span<const NodeKind> f();
KILN_XNNPACK_NODE_FILES(KILN_DECLARE_NODE_FILE)
#undef KILN_DECLARE_NODE_FILE

const NodeKind* node_kind(NodeType t) {
  constexpr size_t kTypes = static_cast<size_t>(NodeType::MAX) + 1;
  static const std::array<const NodeKind*, kTypes> by_type = [] {
    std::array<const NodeKind*, kTypes> a{};
#define KILN_INDEX_NODE_FILE(f) \
    for (const NodeKind& k : f()) a[static_cast<size_t>(k.type)] = &k;
    KILN_XNNPACK_NODE_FILES(KILN_INDEX_NODE_FILE)
#undef KILN_INDEX_NODE_FILE
    return a;
  }();
  const auto i = static_cast<size_t>(t);
  return i < kTypes ? by_type[i] : nullptr;
}

Status NodeContext::bad(const char* what) const {
  return fail(error, Status::InvalidProgram, "node %zu (%s): %s", index, node_name(type()), what);
}

bool io_node1x1(const fbx::XNode& node, NodeIO& io) {
  return io_1x1(static_cast<const fbx::_XNNNode1x1*>(node.xnode_union()), io);
}

bool io_node2x1(const fbx::XNode& node, NodeIO& io) {
  return io_2x1(static_cast<const fbx::_XNNNode2x1*>(node.xnode_union()), io);
}

ShapeResult infer_same(const ShapeContext& c, std::array<int64_t, kMaxRank>& d) {
  if (c.n != c.x.ndims) return shape_unsupported();
  std::copy_n(c.x.dims.begin(), c.n, d.begin());
  return shape_ok();
}

}  // namespace kiln::backends::xnnpack::detail
