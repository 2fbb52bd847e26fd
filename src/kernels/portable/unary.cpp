// Unary elementwise kernels: sign/magnitude, rounding, float math, activations,
// logical/bitwise not. Each is a typed kernel over the shared `unary` driver
// (util/elementwise_ops.h) and one KILN_KERNEL line.
//
// A new float function (integral inputs compute in float32, out any dtype the
// result casts to) is one line here: KILN_FLOAT_UNARY(<aten_ops.def id>, expr of x).
#include "util/elementwise_ops.h"

#include <cmath>
#include <string_view>
#include <type_traits>

namespace kiln::rt::kernels {
namespace {

// unary ops keeping the dtype (out dtype must equal it)
template <unsigned Types, typename MakeOp>
void same_dtype_unary(KernelContext& ctx, const char* name, const Tensor& self, Tensor& out, MakeOp&& make_op) {
  unary<Types>(ctx, {name, false, false, OutRule::Exact}, self, out, make_op);
}

void neg_out(KernelContext& ctx, const Tensor& self, Tensor& out) {
  same_dtype_unary<kRealTypes>(ctx, "aten::neg.out", self, out, [](auto tag) {
    using C = typename decltype(tag)::type;
    return [](C x) { return neg_w(x); };
  });
}

void abs_out(KernelContext& ctx, const Tensor& self, Tensor& out) {
  same_dtype_unary<kRealTypes>(ctx, "aten::abs.out", self, out, [](auto tag) {
    using C = typename decltype(tag)::type;
    return [](C x) -> C {
      if constexpr (std::is_floating_point_v<C>) return std::fabs(x);
      else if constexpr (std::is_signed_v<C>) return x < 0 ? neg_w(x) : x;
      else return x;
    };
  });
}

void relu_out(KernelContext& ctx, const Tensor& self, Tensor& out) {
  same_dtype_unary<kRealTypes>(ctx, "aten::relu.out", self, out, [](auto tag) {
    using C = typename decltype(tag)::type;
    return [](C x) { return x < C(0) ? C(0) : x; };  // NaN stays NaN
  });
}

void sign_out(KernelContext& ctx, const Tensor& self, Tensor& out) {
  same_dtype_unary<kAllTypes>(ctx, "aten::sign.out", self, out, [](auto tag) {
    using C = typename decltype(tag)::type;
    return [](C x) -> C {
      if constexpr (std::is_same_v<C, bool>) return x;
      else return static_cast<C>((C(0) < x) - (x < C(0)));
    };
  });
}

enum class Rounding { Floor, Ceil, Round, Trunc };

template <Rounding kR>
void rounding_out(KernelContext& ctx, const Tensor& self, Tensor& out) {
  constexpr const char* names[] = {"aten::floor.out", "aten::ceil.out", "aten::round.out", "aten::trunc.out"};
  same_dtype_unary<kRealTypes>(ctx, names[static_cast<int>(kR)], self, out, [](auto tag) {
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

void bitwise_not_out(KernelContext& ctx, const Tensor& self, Tensor& out) {
  same_dtype_unary<kIntegralTypes>(ctx, "aten::bitwise_not.out", self, out, [](auto tag) {
    using C = typename decltype(tag)::type;
    return [](C x) -> C {
      if constexpr (std::is_same_v<C, bool>) return !x;
      else return static_cast<C>(~x);
    };
  });
}

// isinf / isnan: a bool per element (integral inputs are never either); out any dtype bool casts to.
template <bool kInf>
void float_class_out(KernelContext& ctx, const Tensor& self, Tensor& out) {
  unary<kAllTypes>(ctx, {kInf ? "aten::isinf.out" : "aten::isnan.out", false, true}, self, out, [](auto tag) {
    using C = typename decltype(tag)::type;
    return [](C x) -> bool {
      bool r = false;
      if constexpr (std::is_floating_point_v<C>) r = kInf ? std::isinf(x) : x != x;
      else (void)x;
      return r;
    };
  });
}

void logical_not_out(KernelContext& ctx, const Tensor& self, Tensor& out) {
  if (!resize_out(ctx, out, self.shape(), "aten::logical_not.out")) return;
  map_elements<bool, bool>(make_plan(out, {&self}), [](bool x) { return !x; });
}

// float functions: integral inputs compute in float32; out any dtype the result casts to
template <typename F>
void float_unary(KernelContext& ctx, const char* name, const Tensor& self, Tensor& out, F f) {
  unary<kFloatingTypes>(ctx, {name, true, false, OutRule::Castable, true}, self, out, [&](auto tag) {
    using C = typename decltype(tag)::type;
    return [f](C x) { return static_cast<C>(f(x)); };
  });
}

// Activations defined on floating dtypes only; out dtype must match.
template <typename MakeOp>
void float_activation(KernelContext& ctx, const char* name, const Tensor& self, Tensor& out, MakeOp&& make_op) {
  unary<kFloatingTypes>(ctx, {name, false, false, OutRule::Exact, true}, self, out, make_op);
}

void gelu_out(KernelContext& ctx, const Tensor& self, std::string_view approximate, Tensor& out) {
  const char* name = "aten::gelu.out";
  if (approximate != "none" && approximate != "tanh") {
    ctx.fail(Status::InvalidArgument, "%s: approximate must be 'none' or 'tanh'", name);
    return;
  }
  // separate loops for the two forms (the tanh one vectorizes)
  if (approximate == "tanh") {
    float_activation(ctx, name, self, out, [](auto tag) {
      using C = typename decltype(tag)::type;
      return [](C x) -> C {
        const C beta = C(0.7978845608028654);  // sqrt(2 / pi)
        const C kappa = C(0.044715);
        return C(0.5) * x * (C(1) + tanh_any(beta * (x + kappa * x * x * x)));
      };
    });
  } else {
    float_activation(ctx, name, self, out, [](auto tag) {
      using C = typename decltype(tag)::type;
      return [](C x) -> C { return x * C(0.5) * (C(1) + std::erf(x * C(0.7071067811865476))); };
    });
  }
}

void silu_out(KernelContext& ctx, const Tensor& self, Tensor& out) {
  float_activation(ctx, "aten::silu.out", self, out, [](auto tag) {
    using C = typename decltype(tag)::type;
    return [](C x) { return x / (C(1) + exp_any(-x)); };
  });
}

// x if x > 0, else negative_slope * x (NaN stays NaN)
void leaky_relu_out(KernelContext& ctx, const Tensor& self, Scalar negative_slope, Tensor& out) {
  float_activation(ctx, "aten::leaky_relu.out", self, out, [&](auto tag) {
    using C = typename decltype(tag)::type;
    const C slope = negative_slope.as<C>();
    return [slope](C x) -> C { return x > C(0) ? x : x * slope; };
  });
}

// scale * x if x > 0, else scale * alpha * (e^(input_scale * x) - 1)
void elu_out(KernelContext& ctx, const Tensor& self, Scalar alpha, Scalar scale, Scalar input_scale, Tensor& out) {
  float_activation(ctx, "aten::elu.out", self, out, [&](auto tag) {
    using C = typename decltype(tag)::type;
    const C a = alpha.as<C>(), s = scale.as<C>(), is = input_scale.as<C>();
    return [a, s, is](C x) -> C { return x > C(0) ? s * x : s * a * std::expm1(is * x); };
  });
}

}  // namespace

KILN_KERNEL(leaky_relu_out, leaky_relu_out);
KILN_KERNEL(elu_out, elu_out);
KILN_KERNEL(neg_out, neg_out);
KILN_KERNEL(abs_out, abs_out);
KILN_KERNEL(relu_out, relu_out);
KILN_KERNEL(sign_out, sign_out);
KILN_KERNEL(floor_out, rounding_out<Rounding::Floor>);
KILN_KERNEL(ceil_out, rounding_out<Rounding::Ceil>);
KILN_KERNEL(round_out, rounding_out<Rounding::Round>);
KILN_KERNEL(trunc_out, rounding_out<Rounding::Trunc>);
KILN_KERNEL(bitwise_not_out, bitwise_not_out);
KILN_KERNEL(logical_not_out, logical_not_out);
KILN_KERNEL(isinf_out, float_class_out<true>);
KILN_KERNEL(isnan_out, float_class_out<false>);
KILN_KERNEL(gelu_out, gelu_out);
KILN_KERNEL(silu_out, silu_out);

// One float function: the kernel and its registration. `x` is the input in the
// compute type (float or double), C that type.
#define KILN_FLOAT_UNARY(id, expr)                                                        \
  namespace {                                                                             \
  void id##_kernel(KernelContext& ctx, const Tensor& self, Tensor& out) {                 \
    float_unary(ctx, ::kiln::ops::op_name(::kiln::ops::OpId::id).data(), self, out,       \
                [](auto x) {                                                              \
                  using C [[maybe_unused]] = decltype(x);                                 \
                  return expr;                                                            \
                });                                                                       \
  }                                                                                       \
  }                                                                                       \
  KILN_KERNEL(id, id##_kernel)

KILN_FLOAT_UNARY(exp_out, exp_any(x));
KILN_FLOAT_UNARY(exp2_out, std::exp2(x));
KILN_FLOAT_UNARY(expm1_out, std::expm1(x));
KILN_FLOAT_UNARY(log_out, std::log(x));
KILN_FLOAT_UNARY(log2_out, std::log2(x));
KILN_FLOAT_UNARY(log10_out, std::log10(x));
KILN_FLOAT_UNARY(log1p_out, std::log1p(x));
KILN_FLOAT_UNARY(sqrt_out, std::sqrt(x));
KILN_FLOAT_UNARY(rsqrt_out, C(1) / std::sqrt(x));
KILN_FLOAT_UNARY(reciprocal_out, C(1) / x);
KILN_FLOAT_UNARY(sin_out, std::sin(x));
KILN_FLOAT_UNARY(cos_out, std::cos(x));
KILN_FLOAT_UNARY(tan_out, std::tan(x));
KILN_FLOAT_UNARY(asin_out, std::asin(x));
KILN_FLOAT_UNARY(acos_out, std::acos(x));
KILN_FLOAT_UNARY(atan_out, std::atan(x));
KILN_FLOAT_UNARY(acosh_out, std::acosh(x));
KILN_FLOAT_UNARY(asinh_out, std::asinh(x));
KILN_FLOAT_UNARY(atanh_out, std::atanh(x));
KILN_FLOAT_UNARY(sinh_out, std::sinh(x));
KILN_FLOAT_UNARY(cosh_out, std::cosh(x));
KILN_FLOAT_UNARY(tanh_out, tanh_any(x));
KILN_FLOAT_UNARY(erf_out, std::erf(x));
KILN_FLOAT_UNARY(sigmoid_out, C(1) / (C(1) + exp_any(-x)));

}  // namespace kiln::rt::kernels
