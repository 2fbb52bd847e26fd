// to_edge rewrites: convolutions, pooling, resizing, batch norm.
#include "lowerer.h"

namespace kiln::passes::detail {

bool Lowerer::lower_conv(const Node& n) {
  (void)n;
  return false;  // no rewrite of this family yet
}

}  // namespace kiln::passes::detail
