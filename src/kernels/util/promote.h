// torch's type promotion for kiln's portable kernels (c10::promoteTypes,
// canCast, result_type with wrapped numbers and 0-dim tensors).
#pragma once

#include "dtype.h"
#include "scalar.h"

namespace kiln::rt::kernels {

// Promotion of two supported dtypes (torch.promote_types).
inline ScalarType promote_types(ScalarType a, ScalarType b) {
  if (a == b) return a;
  auto float_rank = [](ScalarType t) { return t == ScalarType::Double ? 2 : t == ScalarType::Float ? 1 : 0; };
  if (is_floating(a) || is_floating(b)) {
    if (!is_floating(b)) return a;
    if (!is_floating(a)) return b;
    int ra = float_rank(a), rb = float_rank(b);
    if (ra == 0 && rb == 0) return ScalarType::Float;  // float16 with bfloat16
    return ra >= rb ? a : b;
  }
  if (a == ScalarType::Bool) return b;
  if (b == ScalarType::Bool) return a;
  if (a == ScalarType::Byte || b == ScalarType::Byte) {
    ScalarType other = a == ScalarType::Byte ? b : a;
    return other == ScalarType::Char ? ScalarType::Short : other;
  }
  auto int_rank = [](ScalarType t) {
    switch (t) {
      case ScalarType::Char: return 0;
      case ScalarType::Short: return 1;
      case ScalarType::Int: return 2;
      default: return 3;
    }
  };
  return int_rank(a) >= int_rank(b) ? a : b;
}

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
