// where and masked_fill: elementwise selection (typed kernels, util/elementwise_ops.h).
#include "util/elementwise_ops.h"

#include <cmath>
#include <limits>
#include <type_traits>

namespace kiln::rt::kernels {
namespace {

// where.self_out(condition, self, other, out): self and other may be wrapped numbers.
void where_out(KernelContext& ctx, const Tensor& cond, const TensorOrScalar& a, const TensorOrScalar& b, Tensor& out) {
  const char* name = "aten::where.self_out";
  if (cond.dtype != ScalarType::Bool && cond.dtype != ScalarType::Byte) {
    ctx.fail(Status::InvalidArgument, "%s: condition must be a bool tensor, got %s", name, dtype_str(cond.dtype));
    return;
  }
  ResultType rt;
  a.add_to(rt);
  b.add_to(rt);
  const ScalarType common = rt.result();
  if (!check_out_dtype(ctx, out, common, name)) return;
  int64_t shape[kMaxDims];
  int32_t nd;
  if (!broadcast_tensors_shape(ctx, {&cond, a.tensor, b.tensor}, shape, &nd, name)) return;
  if (!resize_out(ctx, out, {shape, static_cast<size_t>(nd)}, name)) return;
  const ElementwisePlan plan = make_plan(out, {&cond, a.tensor, b.tensor});
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

void masked_fill_out(KernelContext& ctx, const Tensor& a, const Tensor& mask, Scalar value, Tensor& out) {
  const char* name = "aten::masked_fill.Scalar_out";
  if (mask.dtype != ScalarType::Bool) {
    ctx.fail(Status::InvalidArgument, "%s: mask must be a bool tensor, got %s", name, dtype_str(mask.dtype));
    return;
  }
  if (!check_out_dtype(ctx, out, a.dtype, name)) return;
  if (!value_fits(value, a.dtype)) {
    ctx.fail(Status::InvalidArgument, "%s: value cannot be converted to %s without overflow", name,
             dtype_str(a.dtype));
    return;
  }
  int64_t shape[kMaxDims];
  int32_t nd;
  if (!broadcast_tensors_shape(ctx, {&a, &mask}, shape, &nd, name)) return;
  if (!resize_out(ctx, out, {shape, static_cast<size_t>(nd)}, name)) return;
  const ElementwisePlan plan = make_plan(out, {&a, &mask});
  dispatch(a.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using C = compute_t<T>;
    const C v = convert<C>(value.as<T>());  // the value as the tensor's dtype stores it
    map_elements<C, C, bool>(plan, [v](C x, bool m) { return m ? v : x; });
  });
}

}  // namespace

KILN_KERNEL(where_self_out, where_out);
KILN_KERNEL(masked_fill_Scalar_out, masked_fill_out);

}  // namespace kiln::rt::kernels
