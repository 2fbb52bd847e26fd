// to_edge rewrites: RNNs, einsum, sort/topk, scatter/gather, index ops.
#include "lowerer.h"

namespace kiln::passes::detail {

bool Lowerer::lower_sequence(const Node& n) {
  (void)n;
  return false;  // no rewrite of this family yet
}

}  // namespace kiln::passes::detail
