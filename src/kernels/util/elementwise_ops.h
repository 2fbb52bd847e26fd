// The elementwise drivers the portable kernels share: torch's scalar arithmetic
// (integers wrap; no UB), and binary_tensor / binary_scalar / unary, which check
// dtypes, promote (wrapped numbers and 0-dim tensors included), broadcast, shape
// the out and run a per-element op in the compute type of the common dtype.
// A new elementwise op is a lambda handed to one of them (see unary.cpp).
#pragma once

#include "util/register.h"
#include "kiln/cpu/math.h"

#include <cmath>
#include <limits>
#include <type_traits>

namespace kiln::rt::kernels {

// ---------------------------------------------------------------------------
// Scalar arithmetic with torch's semantics (integers wrap; no UB, no traps).

template <typename T>
inline T add_w(T a, T b) {
  if constexpr (is_int_v<T>) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
  } else {
    return static_cast<T>(a + b);
  }
}
template <typename T>
inline T sub_w(T a, T b) {
  if constexpr (is_int_v<T>) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(static_cast<U>(a) - static_cast<U>(b)));
  } else {
    return static_cast<T>(a - b);
  }
}
template <typename T>
inline T mul_w(T a, T b) {
  if constexpr (std::is_same_v<T, bool>) {
    return a && b;
  } else if constexpr (is_int_v<T>) {
    using U = std::make_unsigned_t<T>;
    using W = std::conditional_t<(sizeof(U) < sizeof(unsigned)), unsigned, U>;  // avoid int promotion overflow
    return static_cast<T>(static_cast<U>(static_cast<W>(static_cast<U>(a)) * static_cast<W>(static_cast<U>(b))));
  } else {
    return a * b;
  }
}
template <typename T>
inline T neg_w(T a) {
  return sub_w<T>(T(0), a);
}

// Integer power by squaring; negative exponents as torch defines them for integers.
template <typename T>
inline T pow_int(T base, T exp) {
  if constexpr (std::is_signed_v<T>) {
    if (exp < 0) {
      if (base == 1) return 1;
      if (base == -1) return (exp & 1) ? T(-1) : T(1);
      return 0;
    }
  }
  T result = 1;
  while (exp != 0) {
    if (exp & 1) result = mul_w(result, base);
    exp = static_cast<T>(exp >> 1);
    base = mul_w(base, base);
  }
  return result;
}

template <typename C>
inline C floor_div_float(C a, C b) {
  if (b == 0) return a / b;
  C mod = std::fmod(a, b);
  C div = (a - mod) / b;
  if (mod != 0 && ((b < 0) != (mod < 0))) div -= 1;
  if (div == 0) return std::copysign(C(0), a / b);
  C fl = std::floor(div);
  if (div - fl > C(0.5)) fl += 1;
  return fl;
}

// Integer division; *zero is set on division by zero (the result is then 0).
template <typename C>
inline C trunc_div_int(C a, C b, bool* zero) {
  if (b == 0) {
    *zero = true;
    return 0;
  }
  if constexpr (std::is_signed_v<C>) {
    if (b == -1) return neg_w(a);  // INT_MIN / -1 would trap
  }
  return static_cast<C>(a / b);
}
template <typename C>
inline C floor_div_int(C a, C b, bool* zero) {
  C q = trunc_div_int(a, b, zero);
  if constexpr (std::is_signed_v<C>) {
    if (b != 0 && b != -1 && (a < 0) != (b < 0) && static_cast<C>(a % b) != 0) q = static_cast<C>(q - 1);
  }
  return q;
}

// min/max where a NaN operand wins (a's first); ties give a.
template <bool kMax, typename C>
inline C extremum_nan(C a, C b) {
  if constexpr (std::is_floating_point_v<C>) {
    if (a != a) return a;
    if (b != b) return b;
  }
  return (kMax ? a < b : b < a) ? b : a;
}
template <typename C>
inline C min_nan(C a, C b) {
  return extremum_nan<false>(a, b);
}
template <typename C>
inline C max_nan(C a, C b) {
  return extremum_nan<true>(a, b);
}

// ---------------------------------------------------------------------------
// Drivers. Each validates the arguments, computes the result dtype and shape,
// shapes the out tensor, and runs the op in the compute type of the common dtype.

enum class OutRule : uint8_t {
  Castable,  // out dtype: any the result dtype can be cast to (binary ops)
  Exact,     // out dtype must equal the result dtype
};

struct OpSpec {
  const char* name;
  bool int_to_float = false;  // integral (and bool) inputs compute in float32
  bool compare = false;       // result is bool whatever the common dtype
  OutRule out_rule = OutRule::Castable;
  bool vector_clones = false;  // float32 -> float32: run the op in map_f32 (compute-heavy unary ops)
};

// out[i] = op(in[i]) over contiguous float32, in the widest vector ISA the CPU has.
template <typename Op>
KILN_VECTOR_CLONES void map_f32(const float* __restrict in, float* __restrict out, int64_t n, Op op) {
  const int64_t nv = n & ~int64_t{15};
  for (int64_t i = 0; i < nv; ++i) out[i] = op(in[i]);
  for (int64_t i = nv; i < n; ++i) out[i] = op(in[i]);
}

inline bool check_common(KernelContext& ctx, ScalarType common, unsigned types, const char* name) {
  if (in_set(common, types)) return true;
  ctx.fail(Status::InvalidArgument, "%s: not implemented for dtype %s", name, dtype_str(common));
  return false;
}

// clamp's bounds (Scalars or Tensors, either may be null, not both) with `a`: their common dtype, one of `types`
// (real types: bool only for tensor bounds, as torch); false (ctx failed) otherwise.
template <typename Bound>
bool clamp_common(KernelContext& ctx, const char* name, const Tensor& a, const Bound* lo, const Bound* hi,
                  ScalarType* common, unsigned types = kRealTypes) {
  if (lo == nullptr && hi == nullptr) {
    ctx.fail(Status::InvalidArgument, "%s: at least one of min and max must not be None", name);
    return false;
  }
  ResultType rt;
  rt.add(a);
  if (lo) rt.add(*lo);
  if (hi) rt.add(*hi);
  *common = rt.result();
  return check_common(ctx, *common, types, name);
}

inline bool check_out(KernelContext& ctx, const OpSpec& spec, ScalarType result, const Tensor& out) {
  if (spec.out_rule == OutRule::Exact) return check_out_dtype(ctx, out, result, spec.name);
  return check_can_cast_out(ctx, result, out, spec.name);
}

inline ScalarType common_of(ScalarType rt, const OpSpec& spec) {
  return spec.int_to_float && is_integral(rt, true) ? ScalarType::Float : rt;
}

// Tensor (op) Tensor: a and b the operands (either may be a wrapped number). make_op(TypeTag<C>{}) returns the per-element
// op C(C, C) (or bool(C, C)).
template <unsigned Types, typename MakeOp>
void binary_tensor(KernelContext& ctx, const OpSpec& spec, const TensorOrScalar& a, const TensorOrScalar& b,
                   Tensor& out_t, MakeOp&& make_op) {
  Tensor* out = &out_t;
  ResultType rt;
  a.add_to(rt);
  b.add_to(rt);
  const ScalarType common = common_of(rt.result(), spec);
  if (!check_common(ctx, common, Types, spec.name)) return;
  if (!check_out(ctx, spec, spec.compare ? ScalarType::Bool : common, *out)) return;
  int64_t shape[kMaxDims];
  int32_t nd;
  if (!broadcast_tensors_shape(ctx, {a.tensor, b.tensor}, shape, &nd, spec.name)) return;
  if (!resize_out(ctx, *out, {shape, static_cast<size_t>(nd)}, spec.name)) return;
  const ElementwisePlan plan = make_plan(*out, {a.tensor, b.tensor});
  dispatch<Types>(common, [&](auto tag) {
    using C = compute_t<typename decltype(tag)::type>;
    auto op = make_op(TypeTag<C>{});
    using R = decltype(op(C{}, C{}));
    map_elements<R, C, C>(plan, op, common);
  });
}

// out[i] = op(a[i]) with out shaped like a, in the compute type C of `common`
// (a TypeTag of Types); make_op(TypeTag<C>{}) returns C(C) (or bool(C)). With
// kClones and spec.vector_clones, float32 -> float32 runs in map_f32.
template <unsigned Types, bool kClones, typename MakeOp>
void map_like(KernelContext& ctx, const OpSpec& spec, ScalarType common, const Tensor& a, Tensor& out,
              MakeOp& make_op) {
  if (!check_out(ctx, spec, spec.compare ? ScalarType::Bool : common, out)) return;
  if (!resize_out(ctx, out, a.shape(), spec.name)) return;
  const ElementwisePlan plan = make_plan(out, {&a});
  dispatch<Types>(common, [&](auto tag) {
    using C = compute_t<typename decltype(tag)::type>;
    auto op = make_op(TypeTag<C>{});
    using R = decltype(op(C{}));
    if constexpr (kClones && std::is_same_v<C, float> && std::is_same_v<R, float>) {
      if (spec.vector_clones && a.dtype == ScalarType::Float && out.dtype == ScalarType::Float) {
        map_f32(a.data_as<const float>(), out.data_as<float>(), out.numel, op);  // both contiguous
        return;
      }
    }
    map_elements<R, C>(plan, op, common);
  });
}

// Tensor (op) Scalar: `s` promoted as a wrapped number. make_op(TypeTag<C>{}) returns C(C) (or bool(C)).
template <unsigned Types, typename MakeOp>
void binary_scalar(KernelContext& ctx, const OpSpec& spec, const Tensor& a, const Scalar& s, Tensor& out,
                   MakeOp&& make_op) {
  ResultType rt;
  rt.add(a);
  rt.add(s);
  const ScalarType common = common_of(rt.result(), spec);
  if (!check_common(ctx, common, Types, spec.name)) return;
  map_like<Types, false>(ctx, spec, common, a, out, make_op);
}

// op(Tensor).
template <unsigned Types, typename MakeOp>
void unary(KernelContext& ctx, const OpSpec& spec, const Tensor& a, Tensor& out, MakeOp&& make_op) {
  if (!check_common(ctx, a.dtype, Types | (spec.int_to_float ? kIntegralTypes : 0u), spec.name)) return;
  map_like<Types, true>(ctx, spec, common_of(a.dtype, spec), a, out, make_op);
}


// float: the compute layer's vectorizable versions; double: libm.
inline float exp_any(float x) { return ::kiln::cpu::exp_f(x); }
inline double exp_any(double x) { return std::exp(x); }
inline float tanh_any(float x) { return ::kiln::cpu::tanh_f(x); }
inline double tanh_any(double x) { return std::tanh(x); }

}  // namespace kiln::rt::kernels
