// torch's type promotion for kiln's portable kernels (c10::promoteTypes,
// canCast, result_type with wrapped numbers and 0-dim tensors).
#pragma once

#include "dtype.h"
#include "scalar.h"

namespace kiln::rt::kernels {

// Promotion of two supported dtypes (torch.promote_types): the rule in kiln/core/dtype.h.
using kiln::promote_types;

// torch.can_cast: no floating -> integral, no non-bool -> bool.
inline bool can_cast(ScalarType from, ScalarType to) {
  if (is_floating(from) && is_integral(to, true)) return false;
  if (from != ScalarType::Bool && to == ScalarType::Bool) return false;
  return true;
}


// torch's result_type over operands of three priorities: tensors with dims,
// zero-dim tensors, and wrapped numbers (Scalars). A lower-priority operand only
// matters when it is of a higher category (bool < integral < floating).
struct ResultType {
  ScalarType dim = kNoDtype;
  ScalarType zero = kNoDtype;
  ScalarType wrapped = kNoDtype;

  void add(const Tensor& t) { add_to(t.dim == 0 ? zero : dim, t.dtype); }
  void add(const Scalar& s) { add_to(wrapped, s.wrapped_dtype()); }
  ScalarType result() const { return combine(dim, combine(zero, wrapped)); }

 private:
  static void add_to(ScalarType& slot, ScalarType t) { slot = slot == kNoDtype ? t : promote_types(slot, t); }
  static ScalarType combine(ScalarType higher, ScalarType lower) {
    if (higher == kNoDtype) return lower;
    if (lower == kNoDtype) return higher;
    if (is_floating(higher)) return higher;
    if (higher == ScalarType::Bool || is_floating(lower)) return promote_types(higher, lower);
    return higher;
  }
};

}  // namespace kiln::rt::kernels
