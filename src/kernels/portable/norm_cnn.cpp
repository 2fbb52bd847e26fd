// Channel normalizations of CNNs, float32 and float64 (float16/bfloat16 widened to float32):
// _native_batch_norm_legit_no_training.out (running statistics),
// _native_batch_norm_legit.no_stats_out (batch statistics: instance norm's lowering),
// native_group_norm.out.
// Layout: [N, C, *] contiguous; statistics accumulate in double.
#include "util/register.h"

#include <algorithm>
#include <cmath>
#include <utility>

namespace kiln::rt::kernels {
namespace {

// Every given tensor float32, or every one float64 (the input's type).
bool all_float(KernelContext& ctx, const char* name, std::initializer_list<const Tensor*> ts) {
  const ScalarType dt = (*ts.begin())->dtype;
  for (const Tensor* t : ts) {
    if (t != nullptr && (t->dtype != dt || !in_set(t->dtype, kFloatTypes))) {
      ctx.fail(Status::NotSupported, "%s: float32 or float64 tensors are supported (all of one), got %s", name,
               dtype_str(t->dtype));
      return false;
    }
  }
  return true;
}

bool per_channel(KernelContext& ctx, const char* name, std::initializer_list<const Tensor*> ts, int64_t c) {
  for (const Tensor* t : ts) {
    if (t != nullptr && t->numel != c) {
      ctx.fail(Status::InvalidArgument, "%s: per-channel tensors must have %lld elements, got %lld", name,
               static_cast<long long>(c), static_cast<long long>(t->numel));
      return false;
    }
  }
  return true;
}

template <typename T>
const T* data_or_null(const Tensor* t) {
  return t != nullptr ? t->data_as<const T>() : nullptr;
}

// y[n, c, :] = (x[n, c, :] - mean(c)) * invstd(c) * w[c] + b[c]; stats(c) gives (mean, invstd)
template <typename T, typename Stats>
void normalize_channels(const Tensor& in, Stats stats, const T* w, const T* b, Tensor& out) {
  const int64_t n = in.sizes[0], c = in.dim > 1 ? in.sizes[1] : 1;
  const int64_t inner = in.numel / std::max<int64_t>(1, n * c);
  const T* x = in.data_as<const T>();
  T* y = out.data_as<T>();
  for (int64_t ch = 0; ch < c; ++ch) {
    const auto [mean, invstd] = stats(ch);
    const T scale = static_cast<T>(invstd) * (w ? w[ch] : T(1));
    const T shift = (b ? b[ch] : T(0)) - static_cast<T>(mean) * scale;
    for (int64_t i = 0; i < n; ++i) {
      const T* xr = x + (i * c + ch) * inner;
      T* yr = y + (i * c + ch) * inner;
      for (int64_t j = 0; j < inner; ++j) yr[j] = xr[j] * scale + shift;
    }
  }
}

void batch_norm_no_training_out(KernelContext& ctx, const Tensor& input, const Tensor* weight, const Tensor* bias,
                                const Tensor& running_mean, const Tensor& running_var, double /*momentum*/, double eps,
                                Tensor& out0, Tensor& out1, Tensor& out2) {
  const char* name = "aten::_native_batch_norm_legit_no_training.out";
  if (!all_float(ctx, name, {&input, weight, bias, &running_mean, &running_var, &out0})) return;
  if (input.dim < 2) {
    ctx.fail(Status::InvalidArgument, "%s: input must have rank >= 2", name);
    return;
  }
  const int64_t c = input.sizes[1];
  if (!per_channel(ctx, name, {weight, bias, &running_mean, &running_var}, c)) return;
  const int64_t empty[1] = {0};
  if (!resize_out(ctx, out0, input.shape(), name) || !resize_out(ctx, out1, {empty, 1}, name) ||
      !resize_out(ctx, out2, {empty, 1}, name))
    return;
  dispatch<kFloatTypes>(input.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* rm = running_mean.data_as<const T>();
    const T* rv = running_var.data_as<const T>();
    normalize_channels<T>(
        input, [&](int64_t ch) { return std::make_pair(double{rm[ch]}, 1.0 / std::sqrt(double{rv[ch]} + eps)); },
        data_or_null<T>(weight), data_or_null<T>(bias), out0);
  });
}

void batch_norm_no_stats_out(KernelContext& ctx, const Tensor& input, const Tensor* weight, const Tensor* bias,
                             bool /*training*/, double /*momentum*/, double eps, Tensor& out, Tensor& save_mean,
                             Tensor& save_invstd) {
  const char* name = "aten::_native_batch_norm_legit.no_stats_out";
  if (!all_float(ctx, name, {&input, weight, bias, &out, &save_mean, &save_invstd})) return;
  if (input.dim < 2) {
    ctx.fail(Status::InvalidArgument, "%s: input must have rank >= 2", name);
    return;
  }
  const int64_t n = input.sizes[0], c = input.sizes[1];
  if (!per_channel(ctx, name, {weight, bias}, c)) return;
  const int64_t stat[1] = {c};
  if (!resize_out(ctx, out, input.shape(), name) || !resize_out(ctx, save_mean, {stat, 1}, name) ||
      !resize_out(ctx, save_invstd, {stat, 1}, name))
    return;
  const int64_t inner = input.numel / std::max<int64_t>(1, n * c);
  dispatch<kFloatTypes>(input.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* x = input.data_as<const T>();
    const double count = static_cast<double>(n * inner);
    for (int64_t ch = 0; ch < c; ++ch) {
      double s = 0;
      for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < inner; ++j) s += x[(i * c + ch) * inner + j];
      const double m = count > 0 ? s / count : 0.0;
      double sq = 0;
      for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < inner; ++j) {
          const double d = x[(i * c + ch) * inner + j] - m;
          sq += d * d;
        }
      save_mean.data_as<T>()[ch] = static_cast<T>(m);
      save_invstd.data_as<T>()[ch] = static_cast<T>(1.0 / std::sqrt((count > 0 ? sq / count : 0.0) + eps));
    }
    const T* sm = save_mean.data_as<const T>();
    const T* si = save_invstd.data_as<const T>();
    normalize_channels<T>(
        input, [&](int64_t ch) { return std::make_pair(double{sm[ch]}, double{si[ch]}); }, data_or_null<T>(weight),
        data_or_null<T>(bias), out);
  });
}

void native_group_norm_out(KernelContext& ctx, const Tensor& input, const Tensor* weight, const Tensor* bias,
                           int64_t N, int64_t C, int64_t HxW, int64_t group, double eps, Tensor& out0, Tensor& out1,
                           Tensor& out2) {
  const char* name = "aten::native_group_norm.out";
  if (!all_float(ctx, name, {&input, weight, bias, &out0, &out1, &out2})) return;
  if (group < 1 || C % group != 0 || N * C * HxW != input.numel) {
    ctx.fail(Status::InvalidArgument, "%s: N=%lld, C=%lld, HxW=%lld, group=%lld do not describe the input", name,
             static_cast<long long>(N), static_cast<long long>(C), static_cast<long long>(HxW),
             static_cast<long long>(group));
    return;
  }
  if (!per_channel(ctx, name, {weight, bias}, C)) return;
  const int64_t stat[2] = {N, group};
  if (!resize_out(ctx, out0, input.shape(), name) || !resize_out(ctx, out1, {stat, 2}, name) ||
      !resize_out(ctx, out2, {stat, 2}, name))
    return;
  const int64_t cpg = C / group, span = cpg * HxW;
  dispatch<kFloatTypes>(input.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* x = input.data_as<const T>();
    T* y = out0.data_as<T>();
    const T* w = data_or_null<T>(weight);
    const T* b = data_or_null<T>(bias);
    for (int64_t i = 0; i < N; ++i)
      for (int64_t g = 0; g < group; ++g) {
        const T* xs = x + (i * C + g * cpg) * HxW;
        double s = 0;
        for (int64_t j = 0; j < span; ++j) s += xs[j];
        const double m = span > 0 ? s / static_cast<double>(span) : 0.0;
        double sq = 0;
        for (int64_t j = 0; j < span; ++j) {
          const double d = xs[j] - m;
          sq += d * d;
        }
        const double rstd = 1.0 / std::sqrt((span > 0 ? sq / static_cast<double>(span) : 0.0) + eps);
        out1.data_as<T>()[i * group + g] = static_cast<T>(m);
        out2.data_as<T>()[i * group + g] = static_cast<T>(rstd);
        for (int64_t cc = 0; cc < cpg; ++cc) {
          const int64_t ch = g * cpg + cc;
          const T scale = static_cast<T>(rstd) * (w ? w[ch] : T(1));
          const T shift = (b ? b[ch] : T(0)) - static_cast<T>(m) * scale;
          const T* xr = xs + cc * HxW;
          T* yr = y + (i * C + ch) * HxW;
          for (int64_t j = 0; j < HxW; ++j) yr[j] = xr[j] * scale + shift;
        }
      }
  });
}

}  // namespace

KILN_KERNEL_WIDENS_16_BIT(_native_batch_norm_legit_no_training_out, batch_norm_no_training_out);
KILN_KERNEL_WIDENS_16_BIT(_native_batch_norm_legit_no_stats_out, batch_norm_no_stats_out);
KILN_KERNEL_WIDENS_16_BIT(native_group_norm_out, native_group_norm_out);

}  // namespace kiln::rt::kernels
