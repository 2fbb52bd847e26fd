// Binary elementwise kernels: add/sub/rsub/mul/div, pow, minimum/maximum/clamp,
// comparisons, bitwise and logical ops. Typed kernels over the shared drivers
// (util/elementwise_ops.h), each registered by one KILN_KERNEL line.
#include "util/elementwise_ops.h"

#include <cmath>
#include <limits>
#include <optional>
#include <string_view>
#include <type_traits>

namespace kiln::rt::kernels {
namespace {

// ---------------------------------------------------------------------------
// add / sub / rsub / mul

// torch's alpha rules: no float alpha for integral results, bool alpha only for bool results.
bool check_alpha(KernelContext& ctx, const Scalar& alpha, ScalarType common, const char* name) {
  if (is_integral(common, true) && alpha.kind == Scalar::Kind::Double) {
    ctx.fail(Status::InvalidArgument, "%s: for integral inputs, alpha must not be a floating point number", name);
    return false;
  }
  if (alpha.kind == Scalar::Kind::Bool && common != ScalarType::Bool) {
    ctx.fail(Status::InvalidArgument, "%s: boolean alpha only supported for boolean results", name);
    return false;
  }
  return true;
}

ScalarType promoted(const Tensor* a, const Tensor* b, const Scalar* s) {
  ResultType rt;
  if (a != nullptr) rt.add(*a);
  if (b != nullptr) rt.add(*b);
  if (s != nullptr) rt.add(*s);
  return rt.result();
}

// add.out / sub.out: self (+|-) alpha * other.
template <bool kSub>
void add_sub_out(KernelContext& ctx, const TensorOrScalar& a, const TensorOrScalar& b, Scalar alpha, Tensor& out) {
  const char* name = kSub ? "aten::sub.out" : "aten::add.out";
  if (kSub && (a.t().dtype == ScalarType::Bool || b.t().dtype == ScalarType::Bool)) {
    ctx.fail(Status::InvalidArgument, "%s: subtraction with a bool tensor is not supported", name);
    return;
  }
  ResultType rt;
  a.add_to(rt);
  b.add_to(rt);
  if (!check_alpha(ctx, alpha, rt.result(), name)) return;
  binary_tensor<kAllTypes>(ctx, {name}, a, b, out, [&](auto tag) {
    using C = typename decltype(tag)::type;
    const C k = alpha.as<C>();
    return [k](C x, C y) { return kSub ? sub_w(x, mul_w(k, y)) : add_w(x, mul_w(k, y)); };
  });
}

// add.Scalar_out / sub.Scalar_out / rsub.Scalar_out
enum class ScalarArith { Add, Sub, RSub };
template <ScalarArith kOp>
void add_sub_scalar_out(KernelContext& ctx, const Tensor& a, Scalar other, Scalar alpha, Tensor& out) {
  const char* name = kOp == ScalarArith::Add   ? "aten::add.Scalar_out"
                     : kOp == ScalarArith::Sub ? "aten::sub.Scalar_out"
                                               : "aten::rsub.Scalar_out";
  if (kOp != ScalarArith::Add && (a.dtype == ScalarType::Bool || other.kind == Scalar::Kind::Bool)) {
    ctx.fail(Status::InvalidArgument, "%s: subtraction with a bool tensor is not supported", name);
    return;
  }
  if (!check_alpha(ctx, alpha, promoted(&a, nullptr, &other), name)) return;
  binary_scalar<kAllTypes>(ctx, {name}, a, other, out, [&](auto tag) {
    using C = typename decltype(tag)::type;
    const C k = alpha.as<C>(), v = other.as<C>();
    const C kv = mul_w(k, v);
    return [k, v, kv](C x) {
      if constexpr (kOp == ScalarArith::Add) return add_w(x, kv);
      else if constexpr (kOp == ScalarArith::Sub) return sub_w(x, kv);
      else return sub_w(v, mul_w(k, x));
    };
  });
}

void mul_out(KernelContext& ctx, const TensorOrScalar& a, const TensorOrScalar& b, Tensor& out) {
  binary_tensor<kAllTypes>(ctx, {"aten::mul.out"}, a, b, out, [](auto tag) {
    using C = typename decltype(tag)::type;
    return [](C x, C y) { return mul_w(x, y); };
  });
}

void mul_scalar_out(KernelContext& ctx, const Tensor& a, Scalar s, Tensor& out) {
  binary_scalar<kAllTypes>(ctx, {"aten::mul.Scalar_out"}, a, s, out, [&](auto tag) {
    using C = typename decltype(tag)::type;
    const C v = s.as<C>();
    return [v](C x) { return mul_w(x, v); };
  });
}

// ---------------------------------------------------------------------------
// div / floor_divide

enum class DivMode { True, Trunc, Floor };

bool parse_div_mode(KernelContext& ctx, std::optional<std::string_view> mode, const char* name, DivMode* out) {
  if (!mode) {
    *out = DivMode::True;
    return true;
  }
  if (*mode == "trunc") { *out = DivMode::Trunc; return true; }
  if (*mode == "floor") { *out = DivMode::Floor; return true; }
  ctx.fail(Status::InvalidArgument, "%s: rounding_mode must be None, 'trunc' or 'floor'", name);
  return false;
}

template <typename C>
inline C div_op(C x, C y, DivMode mode, bool* zero) {
  if constexpr (std::is_floating_point_v<C>) {
    if (mode == DivMode::Trunc) return std::trunc(x / y);
    if (mode == DivMode::Floor) return floor_div_float(x, y);
    return x / y;
  } else if constexpr (std::is_same_v<C, bool>) {
    return static_cast<C>(x);  // unreachable: bool true division promotes, modes reject bool
  } else {
    return mode == DivMode::Floor ? floor_div_int(x, y, zero) : trunc_div_int(x, y, zero);
  }
}

void div_tensor(KernelContext& ctx, const char* name, DivMode mode, const TensorOrScalar& a,
                const TensorOrScalar& b, Tensor& out) {
  bool zero = false;
  binary_tensor<kRealTypes>(ctx, {name, mode == DivMode::True}, a, b, out, [&](auto tag) {
    using C = typename decltype(tag)::type;
    bool* z = &zero;
    return [mode, z](C x, C y) { return div_op(x, y, mode, z); };
  });
  if (zero) ctx.fail(Status::InvalidArgument, "%s: integer division by zero", name);
}

void div_scalar(KernelContext& ctx, const char* name, DivMode mode, const Tensor& a, const Scalar& s, Tensor& out) {
  bool zero = false;
  binary_scalar<kRealTypes>(ctx, {name, mode == DivMode::True}, a, s, out, [&](auto tag) {
    using C = typename decltype(tag)::type;
    const C v = s.as<C>();
    bool* z = &zero;
    return [v, mode, z](C x) { return div_op(x, v, mode, z); };
  });
  if (zero) ctx.fail(Status::InvalidArgument, "%s: integer division by zero", name);
}

void div_out(KernelContext& ctx, const TensorOrScalar& a, const TensorOrScalar& b, Tensor& out) {
  div_tensor(ctx, "aten::div.out", DivMode::True, a, b, out);
}
void div_out_mode(KernelContext& ctx, const TensorOrScalar& a, const TensorOrScalar& b,
                  std::optional<std::string_view> rounding_mode, Tensor& out) {
  DivMode mode;
  if (parse_div_mode(ctx, rounding_mode, "aten::div.out_mode", &mode))
    div_tensor(ctx, "aten::div.out_mode", mode, a, b, out);
}
void floor_divide_out(KernelContext& ctx, const TensorOrScalar& a, const TensorOrScalar& b, Tensor& out) {
  div_tensor(ctx, "aten::floor_divide.out", DivMode::Floor, a, b, out);
}
void div_scalar_out(KernelContext& ctx, const Tensor& a, Scalar s, Tensor& out) {
  div_scalar(ctx, "aten::div.Scalar_out", DivMode::True, a, s, out);
}
void div_scalar_mode_out(KernelContext& ctx, const Tensor& a, Scalar s, std::optional<std::string_view> rounding_mode,
                         Tensor& out) {
  DivMode mode;
  if (parse_div_mode(ctx, rounding_mode, "aten::div.Scalar_mode_out", &mode))
    div_scalar(ctx, "aten::div.Scalar_mode_out", mode, a, s, out);
}

// ---------------------------------------------------------------------------
// pow

template <typename C>
inline C pow_op(C x, C y) {
  if constexpr (std::is_floating_point_v<C>) return std::pow(x, y);
  else return pow_int(x, y);
}

void pow_tensor_tensor_out(KernelContext& ctx, const TensorOrScalar& a, const TensorOrScalar& b, Tensor& out) {
  binary_tensor<kRealTypes>(ctx, {"aten::pow.Tensor_Tensor_out"}, a, b, out, [](auto tag) {
    using C = typename decltype(tag)::type;
    return [](C x, C y) { return pow_op(x, y); };
  });
}

enum class PowCase { Square, Cube, Sqrt, Rsqrt, Reciprocal, ReciprocalSquare, General };

template <PowCase kCase>
void pow_scalar_case(KernelContext& ctx, const char* name, const Tensor& a, const Scalar& e, Tensor& out) {
  binary_scalar<kAllTypes>(ctx, {name}, a, e, out, [&](auto tag) {
    using C = typename decltype(tag)::type;
    const C v = e.as<C>();
    return [v](C x) -> C {
      if constexpr (std::is_same_v<C, bool>) {  // bool tensor ** bool scalar
        return v ? x : true;
      } else if constexpr (!std::is_floating_point_v<C>) {
        return pow_int(x, v);
      } else if constexpr (kCase == PowCase::Square) {
        return x * x;
      } else if constexpr (kCase == PowCase::Cube) {
        return x * x * x;
      } else if constexpr (kCase == PowCase::Sqrt) {
        return std::sqrt(x);
      } else if constexpr (kCase == PowCase::Rsqrt) {
        return C(1) / std::sqrt(x);
      } else if constexpr (kCase == PowCase::Reciprocal) {
        return C(1) / x;
      } else if constexpr (kCase == PowCase::ReciprocalSquare) {
        return C(1) / (x * x);
      } else {
        return std::pow(x, v);
      }
    };
  });
}

void pow_tensor_scalar_out(KernelContext& ctx, const Tensor& a, Scalar e, Tensor& out) {
  const char* name = "aten::pow.Tensor_Scalar_out";
  if (is_integral(promoted(&a, nullptr, &e), true) && e.kind == Scalar::Kind::Int && e.i < 0) {
    ctx.fail(Status::InvalidArgument, "%s: integers to negative integer powers are not allowed", name);
    return;
  }
  // the exponents torch evaluates without pow() (each its own loop, so they vectorize)
  const double ev = e.as_double();
  const PowCase pc = ev == 2    ? PowCase::Square
                     : ev == 3    ? PowCase::Cube
                     : ev == 0.5  ? PowCase::Sqrt
                     : ev == -0.5 ? PowCase::Rsqrt
                     : ev == -1   ? PowCase::Reciprocal
                     : ev == -2   ? PowCase::ReciprocalSquare
                                  : PowCase::General;
  switch (pc) {
    case PowCase::Square: return pow_scalar_case<PowCase::Square>(ctx, name, a, e, out);
    case PowCase::Cube: return pow_scalar_case<PowCase::Cube>(ctx, name, a, e, out);
    case PowCase::Sqrt: return pow_scalar_case<PowCase::Sqrt>(ctx, name, a, e, out);
    case PowCase::Rsqrt: return pow_scalar_case<PowCase::Rsqrt>(ctx, name, a, e, out);
    case PowCase::Reciprocal: return pow_scalar_case<PowCase::Reciprocal>(ctx, name, a, e, out);
    case PowCase::ReciprocalSquare: return pow_scalar_case<PowCase::ReciprocalSquare>(ctx, name, a, e, out);
    case PowCase::General: return pow_scalar_case<PowCase::General>(ctx, name, a, e, out);
  }
}

// pow.Scalar_out(Scalar self, Tensor exponent, out)
void pow_scalar_out(KernelContext& ctx, Scalar base, const Tensor& e, Tensor& out) {
  const char* name = "aten::pow.Scalar_out";
  const ScalarType common = promoted(&e, nullptr, &base);
  if (!check_common(ctx, common, kRealTypes, name) || !check_can_cast_out(ctx, common, out, name)) return;
  if (!resize_out(ctx, out, e.shape(), name)) return;
  const ElementwisePlan plan = make_plan(out, {&e});
  dispatch<kRealTypes>(common, [&](auto tag) {
    using C = compute_t<typename decltype(tag)::type>;
    const C b = base.as<C>();
    map_elements<C, C>(plan, [b](C y) { return pow_op(b, y); }, common);
  });
}

// atan2(self, other): integral (and bool) inputs compute in float32
void atan2_out(KernelContext& ctx, const TensorOrScalar& a, const TensorOrScalar& b, Tensor& out) {
  binary_tensor<kFloatingTypes>(ctx, {"aten::atan2.out", true}, a, b, out, [](auto tag) {
    using C = typename decltype(tag)::type;
    return [](C y, C x) { return static_cast<C>(std::atan2(y, x)); };
  });
}

// ---------------------------------------------------------------------------
// minimum / maximum / clamp

template <bool kMax>
void min_max_out(KernelContext& ctx, const TensorOrScalar& a, const TensorOrScalar& b, Tensor& out) {
  binary_tensor<kAllTypes>(ctx, {kMax ? "aten::maximum.out" : "aten::minimum.out"}, a, b, out, [](auto tag) {
    using C = typename decltype(tag)::type;
    return [](C x, C y) { return kMax ? max_nan(x, y) : min_nan(x, y); };
  });
}

template <typename C>
inline C clamp_op(C x, C lo, C hi) {
  if constexpr (std::is_floating_point_v<C>) {
    if (x != x) return x;
    if (lo != lo) return lo;
    if (hi != hi) return hi;
  }
  C r = x < lo ? lo : x;
  return r > hi ? hi : r;
}

template <typename C>
inline C lowest_of() {
  if constexpr (std::is_floating_point_v<C>) return -std::numeric_limits<C>::infinity();
  else return std::numeric_limits<C>::lowest();
}
template <typename C>
inline C highest_of() {
  if constexpr (std::is_floating_point_v<C>) return std::numeric_limits<C>::infinity();
  else return std::numeric_limits<C>::max();
}

void clamp_impl(KernelContext& ctx, const char* name, const Tensor& a, const Scalar* lo, const Scalar* hi,
                Tensor& out) {
  ScalarType common;
  if (!clamp_common(ctx, name, a, lo, hi, &common) || !check_out_dtype(ctx, out, common, name)) return;
  if (!resize_out(ctx, out, a.shape(), name)) return;
  const ElementwisePlan plan = make_plan(out, {&a});
  dispatch<kRealTypes>(common, [&](auto tag) {
    using C = compute_t<typename decltype(tag)::type>;
    const C l = lo ? lo->as<C>() : lowest_of<C>();
    const C h = hi ? hi->as<C>() : highest_of<C>();
    map_elements<C, C>(plan, [l, h](C x) { return clamp_op(x, l, h); }, common);
  });
}

void clamp_out(KernelContext& ctx, const Tensor& a, std::optional<Scalar> lo, std::optional<Scalar> hi, Tensor& out) {
  clamp_impl(ctx, "aten::clamp.out", a, lo ? &*lo : nullptr, hi ? &*hi : nullptr, out);
}

template <bool kMax>
void clamp_one_out(KernelContext& ctx, const Tensor& a, Scalar v, Tensor& out) {
  clamp_impl(ctx, kMax ? "aten::clamp_max.out" : "aten::clamp_min.out", a, kMax ? nullptr : &v, kMax ? &v : nullptr,
             out);
}

// ---------------------------------------------------------------------------
// comparisons

enum class Cmp { Eq, Ne, Lt, Le, Gt, Ge };

template <Cmp kCmp, typename C>
inline bool compare(C x, C y) {
  if constexpr (kCmp == Cmp::Eq) return x == y;
  else if constexpr (kCmp == Cmp::Ne) return x != y;
  else if constexpr (kCmp == Cmp::Lt) return x < y;
  else if constexpr (kCmp == Cmp::Le) return x <= y;
  else if constexpr (kCmp == Cmp::Gt) return x > y;
  else return x >= y;
}

template <Cmp kCmp>
constexpr const char* cmp_name(bool scalar) {
  constexpr const char* t[6][2] = {{"aten::eq.Tensor_out", "aten::eq.Scalar_out"},
                                   {"aten::ne.Tensor_out", "aten::ne.Scalar_out"},
                                   {"aten::lt.Tensor_out", "aten::lt.Scalar_out"},
                                   {"aten::le.Tensor_out", "aten::le.Scalar_out"},
                                   {"aten::gt.Tensor_out", "aten::gt.Scalar_out"},
                                   {"aten::ge.Tensor_out", "aten::ge.Scalar_out"}};
  return t[static_cast<int>(kCmp)][scalar ? 1 : 0];
}

template <Cmp kCmp>
void compare_tensor_out(KernelContext& ctx, const TensorOrScalar& a, const TensorOrScalar& b, Tensor& out) {
  binary_tensor<kAllTypes>(ctx, {cmp_name<kCmp>(false), false, true}, a, b, out, [](auto tag) {
    using C = typename decltype(tag)::type;
    return [](C x, C y) { return compare<kCmp>(x, y); };
  });
}

template <Cmp kCmp>
void compare_scalar_out(KernelContext& ctx, const Tensor& a, Scalar s, Tensor& out) {
  binary_scalar<kAllTypes>(ctx, {cmp_name<kCmp>(true), false, true}, a, s, out, [&](auto tag) {
    using C = typename decltype(tag)::type;
    const C v = s.as<C>();
    return [v](C x) { return compare<kCmp>(x, v); };
  });
}

// ---------------------------------------------------------------------------
// bitwise and logical ops

enum class Bit { And, Or, Xor };

template <Bit kOp, typename C>
inline C bit_op(C x, C y) {
  if constexpr (std::is_same_v<C, bool>) {
    if constexpr (kOp == Bit::And) return x && y;
    else if constexpr (kOp == Bit::Or) return x || y;
    else return x != y;
  } else {
    if constexpr (kOp == Bit::And) return static_cast<C>(x & y);
    else if constexpr (kOp == Bit::Or) return static_cast<C>(x | y);
    else return static_cast<C>(x ^ y);
  }
}

template <Bit kOp>
constexpr const char* bit_name(int variant) {  // 0 bitwise Tensor, 1 bitwise Scalar, 2 logical
  constexpr const char* t[3][3] = {
      {"aten::bitwise_and.Tensor_out", "aten::bitwise_and.Scalar_out", "aten::logical_and.out"},
      {"aten::bitwise_or.Tensor_out", "aten::bitwise_or.Scalar_out", "aten::logical_or.out"},
      {"aten::bitwise_xor.Tensor_out", "aten::bitwise_xor.Scalar_out", "aten::logical_xor.out"}};
  return t[static_cast<int>(kOp)][variant];
}

template <Bit kOp>
void bitwise_tensor_out(KernelContext& ctx, const TensorOrScalar& a, const TensorOrScalar& b, Tensor& out) {
  binary_tensor<kIntegralTypes>(ctx, {bit_name<kOp>(0)}, a, b, out, [](auto tag) {
    using C = typename decltype(tag)::type;
    return [](C x, C y) { return bit_op<kOp>(x, y); };
  });
}

template <Bit kOp>
void bitwise_scalar_out(KernelContext& ctx, const Tensor& a, Scalar s, Tensor& out) {
  binary_scalar<kIntegralTypes>(ctx, {bit_name<kOp>(1)}, a, s, out, [&](auto tag) {
    using C = typename decltype(tag)::type;
    const C v = s.as<C>();
    return [v](C x) { return bit_op<kOp>(x, v); };
  });
}

// logical_and/or/xor: any input dtypes, truth values; out of any dtype.
template <Bit kOp>
void logical_binary_out(KernelContext& ctx, const TensorOrScalar& a, const TensorOrScalar& b, Tensor& out) {
  const char* name = bit_name<kOp>(2);
  int64_t shape[kMaxDims];
  int32_t nd;
  if (!broadcast_tensors_shape(ctx, {a.tensor, b.tensor}, shape, &nd, name)) return;
  if (!resize_out(ctx, out, {shape, static_cast<size_t>(nd)}, name)) return;
  map_elements<bool, bool, bool>(make_plan(out, {a.tensor, b.tensor}),
                                 [](bool x, bool y) { return bit_op<kOp>(x, y); });
}

}  // namespace

KILN_KERNEL(add_out, add_sub_out<false>);
KILN_KERNEL(add_Scalar_out, add_sub_scalar_out<ScalarArith::Add>);
KILN_KERNEL(sub_out, add_sub_out<true>);
KILN_KERNEL(sub_Scalar_out, add_sub_scalar_out<ScalarArith::Sub>);
KILN_KERNEL(rsub_Scalar_out, add_sub_scalar_out<ScalarArith::RSub>);
KILN_KERNEL(mul_out, mul_out);
KILN_KERNEL(mul_Scalar_out, mul_scalar_out);
KILN_KERNEL(div_out, div_out);
KILN_KERNEL(div_out_mode, div_out_mode);
KILN_KERNEL(div_Scalar_out, div_scalar_out);
KILN_KERNEL(div_Scalar_mode_out, div_scalar_mode_out);
KILN_KERNEL(floor_divide_out, floor_divide_out);
KILN_KERNEL(pow_Tensor_Tensor_out, pow_tensor_tensor_out);
KILN_KERNEL(pow_Tensor_Scalar_out, pow_tensor_scalar_out);
KILN_KERNEL(pow_Scalar_out, pow_scalar_out);
KILN_KERNEL(atan2_out, atan2_out);
KILN_KERNEL(minimum_out, min_max_out<false>);
KILN_KERNEL(maximum_out, min_max_out<true>);
KILN_KERNEL(clamp_out, clamp_out);
KILN_KERNEL(clamp_min_out, clamp_one_out<false>);
KILN_KERNEL(clamp_max_out, clamp_one_out<true>);
KILN_KERNEL(eq_Tensor_out, compare_tensor_out<Cmp::Eq>);
KILN_KERNEL(ne_Tensor_out, compare_tensor_out<Cmp::Ne>);
KILN_KERNEL(lt_Tensor_out, compare_tensor_out<Cmp::Lt>);
KILN_KERNEL(le_Tensor_out, compare_tensor_out<Cmp::Le>);
KILN_KERNEL(gt_Tensor_out, compare_tensor_out<Cmp::Gt>);
KILN_KERNEL(ge_Tensor_out, compare_tensor_out<Cmp::Ge>);
KILN_KERNEL(eq_Scalar_out, compare_scalar_out<Cmp::Eq>);
KILN_KERNEL(ne_Scalar_out, compare_scalar_out<Cmp::Ne>);
KILN_KERNEL(lt_Scalar_out, compare_scalar_out<Cmp::Lt>);
KILN_KERNEL(le_Scalar_out, compare_scalar_out<Cmp::Le>);
KILN_KERNEL(gt_Scalar_out, compare_scalar_out<Cmp::Gt>);
KILN_KERNEL(ge_Scalar_out, compare_scalar_out<Cmp::Ge>);
KILN_KERNEL(bitwise_and_Tensor_out, bitwise_tensor_out<Bit::And>);
KILN_KERNEL(bitwise_or_Tensor_out, bitwise_tensor_out<Bit::Or>);
KILN_KERNEL(bitwise_xor_Tensor_out, bitwise_tensor_out<Bit::Xor>);
KILN_KERNEL(bitwise_and_Scalar_out, bitwise_scalar_out<Bit::And>);
KILN_KERNEL(bitwise_or_Scalar_out, bitwise_scalar_out<Bit::Or>);
KILN_KERNEL(bitwise_xor_Scalar_out, bitwise_scalar_out<Bit::Xor>);
KILN_KERNEL(logical_and_out, logical_binary_out<Bit::And>);
KILN_KERNEL(logical_or_out, logical_binary_out<Bit::Or>);
KILN_KERNEL(logical_xor_out, logical_binary_out<Bit::Xor>);

}  // namespace kiln::rt::kernels
