// to_edge rewrites: mutable buffers, dynamic shapes.
#include "lowerer.h"

namespace kiln::passes::detail {

bool Lowerer::lower_state(const Node& n) {
  (void)n;
  return false;  // no rewrite of this family yet
}

}  // namespace kiln::passes::detail
