// PReLU with a constant slope: XNNPACK's.
#include "node_kind.h"

namespace kiln::backends::xnnpack::detail {

static Status define(const DefineContext& c, xnn_status* s) {
  if (!c.st.values[c.io.in[1]].constant)
    return fail(c.error, Status::NotSupported, "node %zu: PReLU with a non-constant slope", c.index);
  *s = xnn_define_prelu(c.sg, c.a, c.b, c.o, 0);
  return Status::Ok;
}

KILN_XNNPACK_NODE_KINDS(prelu_nodes, {.type = NodeType::XNNPReLU, .io = io_node2x1, .define = define})

}  // namespace kiln::backends::xnnpack::detail
