// Activation kernels: hardswish, hardsigmoid, mish (float dtypes), hardtanh (and integers); out
// dtype equals the input's. NaN propagates through every one of them.
#include "util/elementwise_ops.h"

#include <cmath>

namespace kiln::rt::kernels {
namespace {

template <typename MakeOp>
void activation(KernelContext& ctx, const char* name, const Tensor& self, Tensor& out, MakeOp&& make_op) {
  unary<kFloatingTypes>(ctx, {name, false, false, OutRule::Exact, true}, self, out, make_op);
}

// min(max(x, lo), hi) that keeps NaN
template <typename C>
C clamp_nan(C x, C lo, C hi) {
  return x < lo ? lo : (x > hi ? hi : x);
}

// x * relu6(x + 3) / 6
void hardswish_out(KernelContext& ctx, const Tensor& self, Tensor& out) {
  activation(ctx, "aten::hardswish.out", self, out, [](auto tag) {
    using C = typename decltype(tag)::type;
    return [](C x) -> C { return x * clamp_nan(x + C(3), C(0), C(6)) / C(6); };
  });
}

// relu6(x + 3) / 6
void hardsigmoid_out(KernelContext& ctx, const Tensor& self, Tensor& out) {
  activation(ctx, "aten::hardsigmoid.out", self, out, [](auto tag) {
    using C = typename decltype(tag)::type;
    return [](C x) -> C { return clamp_nan(x + C(3), C(0), C(6)) / C(6); };
  });
}

// x * tanh(softplus(x)), softplus(x) = log1p(e^x) (x itself above 20, as torch's threshold)
void mish_out(KernelContext& ctx, const Tensor& self, Tensor& out) {
  activation(ctx, "aten::mish.out", self, out, [](auto tag) {
    using C = typename decltype(tag)::type;
    return [](C x) -> C {
      C sp = x > C(20) ? x : std::log1p(std::exp(x));
      return x * std::tanh(sp);
    };
  });
}

// integer tensors too (ExecuTorch writes relu6 / hardtanh of one as this operator): the bounds converted to the
// tensor's type, as torch does (hardtanh(x, -0.5, 0.5) of int64 is 0)
void hardtanh_out(KernelContext& ctx, const Tensor& self, Scalar min_val, Scalar max_val, Tensor& out) {
  unary<kRealTypes>(ctx, {"aten::hardtanh.out", false, false, OutRule::Exact, true}, self, out, [&](auto tag) {
    using C = typename decltype(tag)::type;
    const C lo = min_val.as<C>(), hi = max_val.as<C>();
    return [lo, hi](C x) -> C { return clamp_nan(x, lo, hi); };
  });
}

}  // namespace

KILN_KERNEL(hardswish_out, hardswish_out);
KILN_KERNEL(hardsigmoid_out, hardsigmoid_out);
KILN_KERNEL(mish_out, mish_out);
KILN_KERNEL(hardtanh_out, hardtanh_out);

}  // namespace kiln::rt::kernels
