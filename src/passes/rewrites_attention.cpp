// to_edge rewrites: SDPA, normalisations, activations.
#include "lowerer.h"

namespace kiln::passes::detail {

bool Lowerer::lower_attention(const Node& n) {
  (void)n;
  return false;  // no rewrite of this family yet
}

}  // namespace kiln::passes::detail
