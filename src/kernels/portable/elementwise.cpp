// Elementwise kernels: arithmetic, comparison, logical and bitwise ops, unary
// math and activations, where/masked_fill. Each follows torch's dtype rules
// (type promotion with wrapped numbers and 0-dim tensors, integer-to-float
// promotion for true division and transcendental functions, out= casting) and
// broadcasting; reduced-precision floats compute in float and round on store.
#include "util/register.h"
#include "kiln/cpu/math.h"

#include <cmath>
#include <limits>
#include <string_view>
#include <type_traits>

namespace kiln::rt::kernels {

using namespace ::kiln::cpu;  // exp_f, tanh_f, sums: the compute layer's float math
namespace {

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

template <typename C>
inline C min_nan(C a, C b) {
  if constexpr (std::is_floating_point_v<C>) {
    if (a != a) return a;
    if (b != b) return b;
  }
  return b < a ? b : a;
}
template <typename C>
inline C max_nan(C a, C b) {
  if constexpr (std::is_floating_point_v<C>) {
    if (a != a) return a;
    if (b != b) return b;
  }
  return a < b ? b : a;
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

inline bool check_out(KernelContext& ctx, const OpSpec& spec, ScalarType result, const Tensor& out) {
  if (spec.out_rule == OutRule::Exact) return check_out_dtype(ctx, out, result, spec.name);
  return check_can_cast_out(ctx, result, out, spec.name);
}

inline ScalarType common_of(ScalarType rt, const OpSpec& spec) {
  return spec.int_to_float && is_integral(rt, true) ? ScalarType::Float : rt;
}

// Tensor (op) Tensor: args[0], args[1] the operands (either may be a wrapped
// number), args.back() the out. make_op(TypeTag<C>{}) returns the per-element
// op C(C, C) (or bool(C, C)).
template <unsigned Types, typename MakeOp>
void binary_tensor(KernelContext& ctx, std::span<EValue*> args, const OpSpec& spec, MakeOp&& make_op) {
  TensorOrScalar a, b;
  if (!tensor_or_scalar_arg(ctx, args, 0, spec.name, &a) || !tensor_or_scalar_arg(ctx, args, 1, spec.name, &b))
    return;
  Tensor* out = tensor_arg(ctx, args, args.size() - 1, spec.name);
  if (out == nullptr) return;
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

// Tensor (op) Scalar: args[0] the tensor, `s` the scalar (promoted as a wrapped
// number), args.back() the out. make_op(TypeTag<C>{}) returns C(C) (or bool(C)).
template <unsigned Types, typename MakeOp>
void binary_scalar(KernelContext& ctx, std::span<EValue*> args, const OpSpec& spec, const Scalar& s,
                   MakeOp&& make_op) {
  Tensor* a = tensor_arg(ctx, args, 0, spec.name);
  Tensor* out = a ? tensor_arg(ctx, args, args.size() - 1, spec.name) : nullptr;
  if (out == nullptr) return;
  ResultType rt;
  rt.add(*a);
  rt.add(s);
  const ScalarType common = common_of(rt.result(), spec);
  if (!check_common(ctx, common, Types, spec.name)) return;
  if (!check_out(ctx, spec, spec.compare ? ScalarType::Bool : common, *out)) return;
  if (!resize_out(ctx, *out, a->shape(), spec.name)) return;
  const ElementwisePlan plan = make_plan(*out, {a});
  dispatch<Types>(common, [&](auto tag) {
    using C = compute_t<typename decltype(tag)::type>;
    auto op = make_op(TypeTag<C>{});
    using R = decltype(op(C{}));
    map_elements<R, C>(plan, op, common);
  });
}

// op(Tensor): args[0] the input, args.back() the out.
template <unsigned Types, typename MakeOp>
void unary(KernelContext& ctx, std::span<EValue*> args, const OpSpec& spec, MakeOp&& make_op) {
  Tensor* a = tensor_arg(ctx, args, 0, spec.name);
  Tensor* out = a ? tensor_arg(ctx, args, args.size() - 1, spec.name) : nullptr;
  if (out == nullptr) return;
  if (!check_common(ctx, a->dtype, Types | (spec.int_to_float ? kIntegralTypes : 0u), spec.name)) return;
  const ScalarType common = common_of(a->dtype, spec);
  if (!check_out(ctx, spec, spec.compare ? ScalarType::Bool : common, *out)) return;
  if (!resize_out(ctx, *out, a->shape(), spec.name)) return;
  const ElementwisePlan plan = make_plan(*out, {a});
  dispatch<Types>(common, [&](auto tag) {
    using C = compute_t<typename decltype(tag)::type>;
    auto op = make_op(TypeTag<C>{});
    using R = decltype(op(C{}));
    if constexpr (std::is_same_v<C, float> && std::is_same_v<R, float>) {
      if (spec.vector_clones && a->dtype == ScalarType::Float && out->dtype == ScalarType::Float) {
        map_f32(a->data_as<const float>(), out->data_as<float>(), out->numel, op);  // both contiguous
        return;
      }
    }
    map_elements<R, C>(plan, op, common);
  });
}

#define KILN_NARGS(n, name) \
  if (!check_nargs(ctx, args, n, name)) return

// ---------------------------------------------------------------------------
// add / sub / rsub / mul / div

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
void add_sub_tensor(KernelContext& ctx, std::span<EValue*> args) {
  const char* name = kSub ? "aten::sub.out" : "aten::add.out";
  KILN_NARGS(4, name);
  Scalar alpha;
  if (!scalar_arg(ctx, args, 2, name, &alpha)) return;
  TensorOrScalar a, b;
  if (!tensor_or_scalar_arg(ctx, args, 0, name, &a) || !tensor_or_scalar_arg(ctx, args, 1, name, &b)) return;
  if (kSub && (a.t().dtype == ScalarType::Bool || b.t().dtype == ScalarType::Bool)) {
    ctx.fail(Status::InvalidArgument, "%s: subtraction with a bool tensor is not supported", name);
    return;
  }
  ResultType rt;
  a.add_to(rt);
  b.add_to(rt);
  if (!check_alpha(ctx, alpha, rt.result(), name)) return;
  binary_tensor<kAllTypes>(ctx, args, {name}, [&](auto tag) {
    using C = typename decltype(tag)::type;
    const C k = alpha.as<C>();
    return [k](C x, C y) { return kSub ? sub_w(x, mul_w(k, y)) : add_w(x, mul_w(k, y)); };
  });
}

// add.Scalar_out / sub.Scalar_out / rsub.Scalar_out with (self, other, alpha, out).
enum class ScalarArith { Add, Sub, RSub };
template <ScalarArith kOp>
void add_sub_scalar(KernelContext& ctx, std::span<EValue*> args) {
  const char* name = kOp == ScalarArith::Add   ? "aten::add.Scalar_out"
                     : kOp == ScalarArith::Sub ? "aten::sub.Scalar_out"
                                               : "aten::rsub.Scalar_out";
  KILN_NARGS(4, name);
  Scalar other, alpha;
  if (!scalar_arg(ctx, args, 1, name, &other) || !scalar_arg(ctx, args, 2, name, &alpha)) return;
  Tensor* a = tensor_arg(ctx, args, 0, name);
  if (a == nullptr) return;
  if (kOp != ScalarArith::Add && (a->dtype == ScalarType::Bool || other.kind == Scalar::Kind::Bool)) {
    ctx.fail(Status::InvalidArgument, "%s: subtraction with a bool tensor is not supported", name);
    return;
  }
  if (!check_alpha(ctx, alpha, promoted(a, nullptr, &other), name)) return;
  binary_scalar<kAllTypes>(ctx, args, {name}, other, [&](auto tag) {
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

void mul_tensor(KernelContext& ctx, std::span<EValue*> args) {
  KILN_NARGS(3, "aten::mul.out");
  binary_tensor<kAllTypes>(ctx, args, {"aten::mul.out"}, [](auto tag) {
    using C = typename decltype(tag)::type;
    return [](C x, C y) { return mul_w(x, y); };
  });
}

void mul_scalar(KernelContext& ctx, std::span<EValue*> args) {
  const char* name = "aten::mul.Scalar_out";
  KILN_NARGS(3, name);
  Scalar s;
  if (!scalar_arg(ctx, args, 1, name, &s)) return;
  binary_scalar<kAllTypes>(ctx, args, {name}, s, [&](auto tag) {
    using C = typename decltype(tag)::type;
    const C v = s.as<C>();
    return [v](C x) { return mul_w(x, v); };
  });
}

enum class DivMode { True, Trunc, Floor };

bool parse_div_mode(KernelContext& ctx, const EValue* v, const char* name, DivMode* mode) {
  if (v != nullptr && v->is_none()) {
    *mode = DivMode::True;
    return true;
  }
  if (v != nullptr && v->tag == EValue::Tag::String) {
    if (v->str == "trunc") { *mode = DivMode::Trunc; return true; }
    if (v->str == "floor") { *mode = DivMode::Floor; return true; }
  }
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

// div.out (mode from the overload) / div.out_mode (mode argument).
void div_impl(KernelContext& ctx, std::span<EValue*> args, const char* name, DivMode mode) {
  bool zero = false;
  OpSpec spec{name, mode == DivMode::True};
  binary_tensor<kRealTypes>(ctx, args, spec, [&](auto tag) {
    using C = typename decltype(tag)::type;
    bool* z = &zero;
    return [mode, z](C x, C y) { return div_op(x, y, mode, z); };
  });
  if (zero) ctx.fail(Status::InvalidArgument, "%s: integer division by zero", name);
}

void div_tensor(KernelContext& ctx, std::span<EValue*> args) {
  KILN_NARGS(3, "aten::div.out");
  div_impl(ctx, args, "aten::div.out", DivMode::True);
}

void div_tensor_mode(KernelContext& ctx, std::span<EValue*> args) {
  KILN_NARGS(4, "aten::div.out_mode");
  DivMode mode;
  if (!parse_div_mode(ctx, args[2], "aten::div.out_mode", &mode)) return;
  div_impl(ctx, args, "aten::div.out_mode", mode);
}

void floor_divide(KernelContext& ctx, std::span<EValue*> args) {
  KILN_NARGS(3, "aten::floor_divide.out");
  div_impl(ctx, args, "aten::floor_divide.out", DivMode::Floor);
}

void div_scalar_impl(KernelContext& ctx, std::span<EValue*> args, const char* name, DivMode mode) {
  Scalar s;
  if (!scalar_arg(ctx, args, 1, name, &s)) return;
  bool zero = false;
  OpSpec spec{name, mode == DivMode::True};
  binary_scalar<kRealTypes>(ctx, args, spec, s, [&](auto tag) {
    using C = typename decltype(tag)::type;
    const C v = s.as<C>();
    bool* z = &zero;
    return [v, mode, z](C x) { return div_op(x, v, mode, z); };
  });
  if (zero) ctx.fail(Status::InvalidArgument, "%s: integer division by zero", name);
}

void div_scalar(KernelContext& ctx, std::span<EValue*> args) {
  KILN_NARGS(3, "aten::div.Scalar_out");
  div_scalar_impl(ctx, args, "aten::div.Scalar_out", DivMode::True);
}

void div_scalar_mode(KernelContext& ctx, std::span<EValue*> args) {
  KILN_NARGS(4, "aten::div.Scalar_mode_out");
  DivMode mode;
  if (!parse_div_mode(ctx, args[2], "aten::div.Scalar_mode_out", &mode)) return;
  div_scalar_impl(ctx, args, "aten::div.Scalar_mode_out", mode);
}

// ---------------------------------------------------------------------------
// pow

template <typename C>
inline C pow_op(C x, C y) {
  if constexpr (std::is_floating_point_v<C>) return std::pow(x, y);
  else return pow_int(x, y);
}

void pow_tensor_tensor(KernelContext& ctx, std::span<EValue*> args) {
  KILN_NARGS(3, "aten::pow.Tensor_Tensor_out");
  binary_tensor<kRealTypes>(ctx, args, {"aten::pow.Tensor_Tensor_out"}, [](auto tag) {
    using C = typename decltype(tag)::type;
    return [](C x, C y) { return pow_op(x, y); };
  });
}

enum class PowCase { Square, Cube, Sqrt, Rsqrt, Reciprocal, ReciprocalSquare, General };

template <PowCase kCase>
void pow_scalar_case(KernelContext& ctx, std::span<EValue*> args, const char* name, const Scalar& e) {
  binary_scalar<kAllTypes>(ctx, args, {name}, e, [&](auto tag) {
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

void pow_tensor_scalar(KernelContext& ctx, std::span<EValue*> args) {
  const char* name = "aten::pow.Tensor_Scalar_out";
  KILN_NARGS(3, name);
  Scalar e;
  if (!scalar_arg(ctx, args, 1, name, &e)) return;
  Tensor* a = tensor_arg(ctx, args, 0, name);
  if (a == nullptr) return;
  if (is_integral(promoted(a, nullptr, &e), true) && e.kind == Scalar::Kind::Int && e.i < 0) {
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
    case PowCase::Square: return pow_scalar_case<PowCase::Square>(ctx, args, name, e);
    case PowCase::Cube: return pow_scalar_case<PowCase::Cube>(ctx, args, name, e);
    case PowCase::Sqrt: return pow_scalar_case<PowCase::Sqrt>(ctx, args, name, e);
    case PowCase::Rsqrt: return pow_scalar_case<PowCase::Rsqrt>(ctx, args, name, e);
    case PowCase::Reciprocal: return pow_scalar_case<PowCase::Reciprocal>(ctx, args, name, e);
    case PowCase::ReciprocalSquare: return pow_scalar_case<PowCase::ReciprocalSquare>(ctx, args, name, e);
    case PowCase::General: return pow_scalar_case<PowCase::General>(ctx, args, name, e);
  }
}

// pow.Scalar_out(Scalar self, Tensor exponent, out)
void pow_scalar_tensor(KernelContext& ctx, std::span<EValue*> args) {
  const char* name = "aten::pow.Scalar_out";
  KILN_NARGS(3, name);
  Scalar base;
  if (!scalar_arg(ctx, args, 0, name, &base)) return;
  Tensor* e = tensor_arg(ctx, args, 1, name);
  Tensor* out = e ? tensor_arg(ctx, args, 2, name) : nullptr;
  if (out == nullptr) return;
  const ScalarType common = promoted(e, nullptr, &base);
  if (!check_common(ctx, common, kRealTypes, name) || !check_can_cast_out(ctx, common, *out, name)) return;
  if (!resize_out(ctx, *out, e->shape(), name)) return;
  const ElementwisePlan plan = make_plan(*out, {e});
  dispatch<kRealTypes>(common, [&](auto tag) {
    using C = compute_t<typename decltype(tag)::type>;
    const C b = base.as<C>();
    map_elements<C, C>(plan, [b](C y) { return pow_op(b, y); }, common);
  });
}

// ---------------------------------------------------------------------------
// minimum / maximum / clamp

template <bool kMax>
void min_max(KernelContext& ctx, std::span<EValue*> args) {
  const char* name = kMax ? "aten::maximum.out" : "aten::minimum.out";
  KILN_NARGS(3, name);
  binary_tensor<kAllTypes>(ctx, args, {name}, [](auto tag) {
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

// clamp.out(self, Scalar? min, Scalar? max, out); also clamp_min.out / clamp_max.out.
void clamp_impl(KernelContext& ctx, std::span<EValue*> args, const char* name, const Scalar* lo, const Scalar* hi) {
  if (lo == nullptr && hi == nullptr) {
    ctx.fail(Status::InvalidArgument, "%s: at least one of min and max must not be None", name);
    return;
  }
  Tensor* a = tensor_arg(ctx, args, 0, name);
  Tensor* out = a ? tensor_arg(ctx, args, args.size() - 1, name) : nullptr;
  if (out == nullptr) return;
  ResultType rt;
  rt.add(*a);
  if (lo) rt.add(*lo);
  if (hi) rt.add(*hi);
  const ScalarType common = rt.result();
  if (!check_common(ctx, common, kRealTypes, name) || !check_out_dtype(ctx, *out, common, name)) return;
  if (!resize_out(ctx, *out, a->shape(), name)) return;
  const ElementwisePlan plan = make_plan(*out, {a});
  dispatch<kRealTypes>(common, [&](auto tag) {
    using C = compute_t<typename decltype(tag)::type>;
    const C l = lo ? lo->as<C>() : lowest_of<C>();
    const C h = hi ? hi->as<C>() : highest_of<C>();
    map_elements<C, C>(plan, [l, h](C x) { return clamp_op(x, l, h); }, common);
  });
}

void clamp(KernelContext& ctx, std::span<EValue*> args) {
  const char* name = "aten::clamp.out";
  KILN_NARGS(4, name);
  Scalar lo, hi;
  bool has_lo, has_hi;
  if (!opt_scalar_arg(ctx, args, 1, name, &lo, &has_lo) || !opt_scalar_arg(ctx, args, 2, name, &hi, &has_hi)) return;
  clamp_impl(ctx, args, name, has_lo ? &lo : nullptr, has_hi ? &hi : nullptr);
}

template <bool kMax>
void clamp_one(KernelContext& ctx, std::span<EValue*> args) {
  const char* name = kMax ? "aten::clamp_max.out" : "aten::clamp_min.out";
  KILN_NARGS(3, name);
  Scalar v;
  if (!scalar_arg(ctx, args, 1, name, &v)) return;
  clamp_impl(ctx, args, name, kMax ? nullptr : &v, kMax ? &v : nullptr);
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
void compare_tensor(KernelContext& ctx, std::span<EValue*> args) {
  const char* name = cmp_name<kCmp>(false);
  KILN_NARGS(3, name);
  OpSpec spec{name, false, true};
  binary_tensor<kAllTypes>(ctx, args, spec, [](auto tag) {
    using C = typename decltype(tag)::type;
    return [](C x, C y) { return compare<kCmp>(x, y); };
  });
}

template <Cmp kCmp>
void compare_scalar(KernelContext& ctx, std::span<EValue*> args) {
  const char* name = cmp_name<kCmp>(true);
  KILN_NARGS(3, name);
  Scalar s;
  if (!scalar_arg(ctx, args, 1, name, &s)) return;
  OpSpec spec{name, false, true};
  binary_scalar<kAllTypes>(ctx, args, spec, s, [&](auto tag) {
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
void bitwise_tensor(KernelContext& ctx, std::span<EValue*> args) {
  KILN_NARGS(3, bit_name<kOp>(0));
  binary_tensor<kIntegralTypes>(ctx, args, {bit_name<kOp>(0)}, [](auto tag) {
    using C = typename decltype(tag)::type;
    return [](C x, C y) { return bit_op<kOp>(x, y); };
  });
}

template <Bit kOp>
void bitwise_scalar(KernelContext& ctx, std::span<EValue*> args) {
  const char* name = bit_name<kOp>(1);
  KILN_NARGS(3, name);
  Scalar s;
  if (!scalar_arg(ctx, args, 1, name, &s)) return;
  binary_scalar<kIntegralTypes>(ctx, args, {name}, s, [&](auto tag) {
    using C = typename decltype(tag)::type;
    const C v = s.as<C>();
    return [v](C x) { return bit_op<kOp>(x, v); };
  });
}

// logical_and/or/xor: any input dtypes, truth values; out of any dtype.
template <Bit kOp>
void logical_binary(KernelContext& ctx, std::span<EValue*> args) {
  const char* name = bit_name<kOp>(2);
  KILN_NARGS(3, name);
  TensorOrScalar a, b;
  if (!tensor_or_scalar_arg(ctx, args, 0, name, &a) || !tensor_or_scalar_arg(ctx, args, 1, name, &b)) return;
  Tensor* out = tensor_arg(ctx, args, 2, name);
  if (out == nullptr) return;
  int64_t shape[kMaxDims];
  int32_t nd;
  if (!broadcast_tensors_shape(ctx, {a.tensor, b.tensor}, shape, &nd, name)) return;
  if (!resize_out(ctx, *out, {shape, static_cast<size_t>(nd)}, name)) return;
  map_elements<bool, bool, bool>(make_plan(*out, {a.tensor, b.tensor}),
                                 [](bool x, bool y) { return bit_op<kOp>(x, y); });
}

void logical_not(KernelContext& ctx, std::span<EValue*> args) {
  const char* name = "aten::logical_not.out";
  KILN_NARGS(2, name);
  Tensor* a = tensor_arg(ctx, args, 0, name);
  Tensor* out = a ? tensor_arg(ctx, args, 1, name) : nullptr;
  if (out == nullptr || !resize_out(ctx, *out, a->shape(), name)) return;
  map_elements<bool, bool>(make_plan(*out, {a}), [](bool x) { return !x; });
}

void bitwise_not(KernelContext& ctx, std::span<EValue*> args) {
  KILN_NARGS(2, "aten::bitwise_not.out");
  unary<kIntegralTypes>(ctx, args, {"aten::bitwise_not.out", false, false, OutRule::Exact}, [](auto tag) {
    using C = typename decltype(tag)::type;
    return [](C x) -> C {
      if constexpr (std::is_same_v<C, bool>) return !x;
      else return static_cast<C>(~x);
    };
  });
}

// ---------------------------------------------------------------------------
// where / masked_fill

void where(KernelContext& ctx, std::span<EValue*> args) {
  const char* name = "aten::where.self_out";
  KILN_NARGS(4, name);
  Tensor* cond = tensor_arg(ctx, args, 0, name);
  if (cond == nullptr) return;
  TensorOrScalar a, b;  // self and other may be wrapped numbers
  if (!tensor_or_scalar_arg(ctx, args, 1, name, &a) || !tensor_or_scalar_arg(ctx, args, 2, name, &b)) return;
  Tensor* out = tensor_arg(ctx, args, 3, name);
  if (out == nullptr) return;
  if (cond->dtype != ScalarType::Bool && cond->dtype != ScalarType::Byte) {
    ctx.fail(Status::InvalidArgument, "%s: condition must be a bool tensor, got %s", name, dtype_str(cond->dtype));
    return;
  }
  ResultType rt;
  a.add_to(rt);
  b.add_to(rt);
  const ScalarType common = rt.result();
  if (!check_out_dtype(ctx, *out, common, name)) return;
  int64_t shape[kMaxDims];
  int32_t nd;
  if (!broadcast_tensors_shape(ctx, {cond, a.tensor, b.tensor}, shape, &nd, name)) return;
  if (!resize_out(ctx, *out, {shape, static_cast<size_t>(nd)}, name)) return;
  const ElementwisePlan plan = make_plan(*out, {cond, a.tensor, b.tensor});
  dispatch(common, [&](auto tag) {
    using C = compute_t<typename decltype(tag)::type>;
    map_elements<C, bool, C, C>(plan, [](bool c, C x, C y) { return c ? x : y; }, common);
  });
}

// Whether a Scalar converts to dtype dt without overflow (torch's checked_convert
// for fill values): integral dtypes must hold it; floating ones its finite magnitude.
bool value_fits(const Scalar& s, ScalarType dt) {
  if (dt == ScalarType::Bool || s.kind == Scalar::Kind::Bool) return true;
  bool fits = true;
  dispatch<kRealTypes>(dt, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (is_int_v<T>) {
      if (s.kind == Scalar::Kind::Int) {
        fits = s.i >= static_cast<int64_t>(std::numeric_limits<T>::lowest()) &&
               (std::is_same_v<T, int64_t> || s.i <= static_cast<int64_t>(std::numeric_limits<T>::max()));
      } else {
        fits = s.d >= static_cast<double>(std::numeric_limits<T>::lowest()) &&
               s.d <= static_cast<double>(std::numeric_limits<T>::max());
      }
    } else {
      const double v = s.as_double();
      const double max = std::is_same_v<T, Half>     ? 65504.0
                         : std::is_same_v<T, double> ? std::numeric_limits<double>::max()
                                                     : static_cast<double>(std::numeric_limits<float>::max());
      fits = !std::isfinite(v) || (v >= -max && v <= max);
    }
  });
  return fits;
}

void masked_fill(KernelContext& ctx, std::span<EValue*> args) {
  const char* name = "aten::masked_fill.Scalar_out";
  KILN_NARGS(4, name);
  Scalar value;
  if (!scalar_arg(ctx, args, 2, name, &value)) return;
  Tensor* a = tensor_arg(ctx, args, 0, name);
  Tensor* mask = a ? tensor_arg(ctx, args, 1, name) : nullptr;
  Tensor* out = mask ? tensor_arg(ctx, args, 3, name) : nullptr;
  if (out == nullptr) return;
  if (mask->dtype != ScalarType::Bool) {
    ctx.fail(Status::InvalidArgument, "%s: mask must be a bool tensor, got %s", name, dtype_str(mask->dtype));
    return;
  }
  if (!check_out_dtype(ctx, *out, a->dtype, name)) return;
  if (!value_fits(value, a->dtype)) {
    ctx.fail(Status::InvalidArgument, "%s: value cannot be converted to %s without overflow", name,
             dtype_str(a->dtype));
    return;
  }
  int64_t shape[kMaxDims];
  int32_t nd;
  if (!broadcast_tensors_shape(ctx, {a, mask}, shape, &nd, name)) return;
  if (!resize_out(ctx, *out, {shape, static_cast<size_t>(nd)}, name)) return;
  const ElementwisePlan plan = make_plan(*out, {a, mask});
  dispatch(a->dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using C = compute_t<T>;
    const C v = convert<C>(value.as<T>());  // the value as the tensor's dtype stores it
    map_elements<C, C, bool>(plan, [v](C x, bool m) { return m ? v : x; });
  });
}

// ---------------------------------------------------------------------------
// unary ops keeping the dtype

void neg(KernelContext& ctx, std::span<EValue*> args) {
  KILN_NARGS(2, "aten::neg.out");
  unary<kRealTypes>(ctx, args, {"aten::neg.out", false, false, OutRule::Exact}, [](auto tag) {
    using C = typename decltype(tag)::type;
    return [](C x) { return neg_w(x); };
  });
}

void abs_(KernelContext& ctx, std::span<EValue*> args) {
  KILN_NARGS(2, "aten::abs.out");
  unary<kRealTypes>(ctx, args, {"aten::abs.out", false, false, OutRule::Exact}, [](auto tag) {
    using C = typename decltype(tag)::type;
    return [](C x) -> C {
      if constexpr (std::is_floating_point_v<C>) return std::fabs(x);
      else if constexpr (std::is_signed_v<C>) return x < 0 ? neg_w(x) : x;
      else return x;
    };
  });
}

void relu(KernelContext& ctx, std::span<EValue*> args) {
  KILN_NARGS(2, "aten::relu.out");
  unary<kRealTypes>(ctx, args, {"aten::relu.out", false, false, OutRule::Exact}, [](auto tag) {
    using C = typename decltype(tag)::type;
    return [](C x) { return x < C(0) ? C(0) : x; };  // NaN stays NaN
  });
}

void sign(KernelContext& ctx, std::span<EValue*> args) {
  KILN_NARGS(2, "aten::sign.out");
  unary<kAllTypes>(ctx, args, {"aten::sign.out", false, false, OutRule::Exact}, [](auto tag) {
    using C = typename decltype(tag)::type;
    return [](C x) -> C {
      if constexpr (std::is_same_v<C, bool>) return x;
      else return static_cast<C>((C(0) < x) - (x < C(0)));
    };
  });
}

enum class Rounding { Floor, Ceil, Round, Trunc };

template <Rounding kR>
void rounding(KernelContext& ctx, std::span<EValue*> args) {
  constexpr const char* names[] = {"aten::floor.out", "aten::ceil.out", "aten::round.out", "aten::trunc.out"};
  const char* name = names[static_cast<int>(kR)];
  KILN_NARGS(2, name);
  unary<kRealTypes>(ctx, args, {name, false, false, OutRule::Exact}, [](auto tag) {
    using C = typename decltype(tag)::type;
    return [](C x) -> C {
      if constexpr (!std::is_floating_point_v<C>) return x;
      else if constexpr (kR == Rounding::Floor) return std::floor(x);
      else if constexpr (kR == Rounding::Ceil) return std::ceil(x);
      else if constexpr (kR == Rounding::Round) return std::nearbyint(x);  // half to even
      else return std::trunc(x);
    };
  });
}

// ---------------------------------------------------------------------------
// unary float ops: integral inputs compute in float32; out any dtype the result casts to.

template <typename F>
void float_unary(KernelContext& ctx, std::span<EValue*> args, const char* name, F f) {
  if (!check_nargs(ctx, args, 2, name)) return;
  unary<kFloatingTypes>(ctx, args, {name, true, false, OutRule::Castable, true}, [&](auto tag) {
    using C = typename decltype(tag)::type;
    return [f](C x) { return static_cast<C>(f(x)); };
  });
}

// float: the vectorizable versions of math_util.h; double: libm.
inline float exp_any(float x) { return exp_f(x); }
inline double exp_any(double x) { return std::exp(x); }
inline float tanh_any(float x) { return tanh_f(x); }
inline double tanh_any(double x) { return std::tanh(x); }

#define KILN_FLOAT_UNARY(fn_name, op_name, expr)                                   \
  void fn_name(KernelContext& ctx, std::span<EValue*> args) {                      \
    float_unary(ctx, args, op_name, [](auto x) {                                   \
      using C [[maybe_unused]] = decltype(x);                                      \
      return expr;                                                                 \
    });                                                                            \
  }

KILN_FLOAT_UNARY(exp_, "aten::exp.out", exp_any(x))
KILN_FLOAT_UNARY(exp2_, "aten::exp2.out", std::exp2(x))
KILN_FLOAT_UNARY(expm1_, "aten::expm1.out", std::expm1(x))
KILN_FLOAT_UNARY(log_, "aten::log.out", std::log(x))
KILN_FLOAT_UNARY(log2_, "aten::log2.out", std::log2(x))
KILN_FLOAT_UNARY(log10_, "aten::log10.out", std::log10(x))
KILN_FLOAT_UNARY(log1p_, "aten::log1p.out", std::log1p(x))
KILN_FLOAT_UNARY(sqrt_, "aten::sqrt.out", std::sqrt(x))
KILN_FLOAT_UNARY(rsqrt_, "aten::rsqrt.out", C(1) / std::sqrt(x))
KILN_FLOAT_UNARY(reciprocal_, "aten::reciprocal.out", C(1) / x)
KILN_FLOAT_UNARY(sin_, "aten::sin.out", std::sin(x))
KILN_FLOAT_UNARY(cos_, "aten::cos.out", std::cos(x))
KILN_FLOAT_UNARY(tan_, "aten::tan.out", std::tan(x))
KILN_FLOAT_UNARY(asin_, "aten::asin.out", std::asin(x))
KILN_FLOAT_UNARY(acos_, "aten::acos.out", std::acos(x))
KILN_FLOAT_UNARY(atan_, "aten::atan.out", std::atan(x))
KILN_FLOAT_UNARY(sinh_, "aten::sinh.out", std::sinh(x))
KILN_FLOAT_UNARY(cosh_, "aten::cosh.out", std::cosh(x))
KILN_FLOAT_UNARY(tanh_, "aten::tanh.out", tanh_any(x))
KILN_FLOAT_UNARY(erf_, "aten::erf.out", std::erf(x))
KILN_FLOAT_UNARY(sigmoid_, "aten::sigmoid.out", C(1) / (C(1) + exp_any(-x)))

#undef KILN_FLOAT_UNARY

// Activations defined on floating dtypes only; out dtype must match.
template <typename MakeOp>
void float_activation(KernelContext& ctx, std::span<EValue*> args, const char* name, MakeOp&& make_op) {
  unary<kFloatingTypes>(ctx, args, {name, false, false, OutRule::Exact, true}, make_op);
}

void gelu(KernelContext& ctx, std::span<EValue*> args) {
  const char* name = "aten::gelu.out";
  KILN_NARGS(3, name);
  const EValue* ap = args[1];
  if (ap == nullptr || ap->tag != EValue::Tag::String || (ap->str != "none" && ap->str != "tanh")) {
    ctx.fail(Status::InvalidArgument, "%s: approximate must be 'none' or 'tanh'", name);
    return;
  }
  // separate loops for the two forms (the tanh one vectorizes)
  if (ap->str == "tanh") {
    float_activation(ctx, args, name, [](auto tag) {
      using C = typename decltype(tag)::type;
      return [](C x) -> C {
        const C beta = C(0.7978845608028654);  // sqrt(2 / pi)
        const C kappa = C(0.044715);
        return C(0.5) * x * (C(1) + tanh_any(beta * (x + kappa * x * x * x)));
      };
    });
  } else {
    float_activation(ctx, args, name, [](auto tag) {
      using C = typename decltype(tag)::type;
      return [](C x) -> C { return x * C(0.5) * (C(1) + std::erf(x * C(0.7071067811865476))); };
    });
  }
}

void silu(KernelContext& ctx, std::span<EValue*> args) {
  KILN_NARGS(2, "aten::silu.out");
  float_activation(ctx, args, "aten::silu.out", [](auto tag) {
    using C = typename decltype(tag)::type;
    return [](C x) { return x / (C(1) + exp_any(-x)); };
  });
}

#undef KILN_NARGS


}  // namespace

KILN_BOXED_KERNEL(add_out, add_sub_tensor<false>);
KILN_BOXED_KERNEL(add_Scalar_out, add_sub_scalar<ScalarArith::Add>);
KILN_BOXED_KERNEL(sub_out, add_sub_tensor<true>);
KILN_BOXED_KERNEL(sub_Scalar_out, add_sub_scalar<ScalarArith::Sub>);
KILN_BOXED_KERNEL(rsub_Scalar_out, add_sub_scalar<ScalarArith::RSub>);
KILN_BOXED_KERNEL(mul_out, mul_tensor);
KILN_BOXED_KERNEL(mul_Scalar_out, mul_scalar);
KILN_BOXED_KERNEL(div_out, div_tensor);
KILN_BOXED_KERNEL(div_out_mode, div_tensor_mode);
KILN_BOXED_KERNEL(div_Scalar_out, div_scalar);
KILN_BOXED_KERNEL(div_Scalar_mode_out, div_scalar_mode);
KILN_BOXED_KERNEL(floor_divide_out, floor_divide);
KILN_BOXED_KERNEL(pow_Tensor_Tensor_out, pow_tensor_tensor);
KILN_BOXED_KERNEL(pow_Tensor_Scalar_out, pow_tensor_scalar);
KILN_BOXED_KERNEL(pow_Scalar_out, pow_scalar_tensor);
KILN_BOXED_KERNEL(minimum_out, min_max<false>);
KILN_BOXED_KERNEL(maximum_out, min_max<true>);
KILN_BOXED_KERNEL(clamp_out, clamp);
KILN_BOXED_KERNEL(clamp_min_out, clamp_one<false>);
KILN_BOXED_KERNEL(clamp_max_out, clamp_one<true>);
KILN_BOXED_KERNEL(eq_Tensor_out, compare_tensor<Cmp::Eq>);
KILN_BOXED_KERNEL(ne_Tensor_out, compare_tensor<Cmp::Ne>);
KILN_BOXED_KERNEL(lt_Tensor_out, compare_tensor<Cmp::Lt>);
KILN_BOXED_KERNEL(le_Tensor_out, compare_tensor<Cmp::Le>);
KILN_BOXED_KERNEL(gt_Tensor_out, compare_tensor<Cmp::Gt>);
KILN_BOXED_KERNEL(ge_Tensor_out, compare_tensor<Cmp::Ge>);
KILN_BOXED_KERNEL(eq_Scalar_out, compare_scalar<Cmp::Eq>);
KILN_BOXED_KERNEL(ne_Scalar_out, compare_scalar<Cmp::Ne>);
KILN_BOXED_KERNEL(lt_Scalar_out, compare_scalar<Cmp::Lt>);
KILN_BOXED_KERNEL(le_Scalar_out, compare_scalar<Cmp::Le>);
KILN_BOXED_KERNEL(gt_Scalar_out, compare_scalar<Cmp::Gt>);
KILN_BOXED_KERNEL(ge_Scalar_out, compare_scalar<Cmp::Ge>);
KILN_BOXED_KERNEL(bitwise_and_Tensor_out, bitwise_tensor<Bit::And>);
KILN_BOXED_KERNEL(bitwise_or_Tensor_out, bitwise_tensor<Bit::Or>);
KILN_BOXED_KERNEL(bitwise_xor_Tensor_out, bitwise_tensor<Bit::Xor>);
KILN_BOXED_KERNEL(bitwise_and_Scalar_out, bitwise_scalar<Bit::And>);
KILN_BOXED_KERNEL(bitwise_or_Scalar_out, bitwise_scalar<Bit::Or>);
KILN_BOXED_KERNEL(bitwise_xor_Scalar_out, bitwise_scalar<Bit::Xor>);
KILN_BOXED_KERNEL(bitwise_not_out, bitwise_not);
KILN_BOXED_KERNEL(logical_and_out, logical_binary<Bit::And>);
KILN_BOXED_KERNEL(logical_or_out, logical_binary<Bit::Or>);
KILN_BOXED_KERNEL(logical_xor_out, logical_binary<Bit::Xor>);
KILN_BOXED_KERNEL(logical_not_out, logical_not);
KILN_BOXED_KERNEL(where_self_out, where);
KILN_BOXED_KERNEL(masked_fill_Scalar_out, masked_fill);
KILN_BOXED_KERNEL(neg_out, neg);
KILN_BOXED_KERNEL(abs_out, abs_);
KILN_BOXED_KERNEL(relu_out, relu);
KILN_BOXED_KERNEL(sign_out, sign);
KILN_BOXED_KERNEL(floor_out, rounding<Rounding::Floor>);
KILN_BOXED_KERNEL(ceil_out, rounding<Rounding::Ceil>);
KILN_BOXED_KERNEL(round_out, rounding<Rounding::Round>);
KILN_BOXED_KERNEL(trunc_out, rounding<Rounding::Trunc>);
KILN_BOXED_KERNEL(exp_out, exp_);
KILN_BOXED_KERNEL(exp2_out, exp2_);
KILN_BOXED_KERNEL(expm1_out, expm1_);
KILN_BOXED_KERNEL(log_out, log_);
KILN_BOXED_KERNEL(log2_out, log2_);
KILN_BOXED_KERNEL(log10_out, log10_);
KILN_BOXED_KERNEL(log1p_out, log1p_);
KILN_BOXED_KERNEL(sqrt_out, sqrt_);
KILN_BOXED_KERNEL(rsqrt_out, rsqrt_);
KILN_BOXED_KERNEL(reciprocal_out, reciprocal_);
KILN_BOXED_KERNEL(sin_out, sin_);
KILN_BOXED_KERNEL(cos_out, cos_);
KILN_BOXED_KERNEL(tan_out, tan_);
KILN_BOXED_KERNEL(asin_out, asin_);
KILN_BOXED_KERNEL(acos_out, acos_);
KILN_BOXED_KERNEL(atan_out, atan_);
KILN_BOXED_KERNEL(sinh_out, sinh_);
KILN_BOXED_KERNEL(cosh_out, cosh_);
KILN_BOXED_KERNEL(tanh_out, tanh_);
KILN_BOXED_KERNEL(erf_out, erf_);
KILN_BOXED_KERNEL(sigmoid_out, sigmoid_);
KILN_BOXED_KERNEL(gelu_out, gelu);
KILN_BOXED_KERNEL(silu_out, silu);

}  // namespace kiln::rt::kernels
