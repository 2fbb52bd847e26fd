// Reductions over a list of dims: sum, mean, amax, amin, argmax, any.
// Sums accumulate in double for floating dtypes (int64 for integers), values are
// converted chunk by chunk into stack buffers (no heap), and the dtype rules
// follow torch's out= variants.
#include "kiln/cpu/math.h"
#include "util/reduce.h"
#include "util/register.h"

#include <limits>
#include <optional>
#include <type_traits>

namespace kiln::rt::kernels {

using namespace ::kiln::cpu;  // sum_as_double: the compute layer's float math
namespace {

// Shapes `out` for plan p; with `nonempty`, a reduced dim of size 0 fails (a max
// has no identity). false (reported through ctx) when it cannot.
bool shape_reduction_out(KernelContext& ctx, const ReducePlan& p, bool nonempty, Tensor& out, const char* name) {
  if (nonempty && p.any_reduced_dim_empty) {
    ctx.fail(Status::InvalidArgument, "%s: cannot reduce over a dim of size 0", name);
    return false;
  }
  return resize_out(ctx, out, p.out_sizes(), name);
}

// Plans the reduction of `in` over `dims` (see parse_dims) and shapes `out` (see shape_reduction_out).
bool plan_reduction(KernelContext& ctx, const Tensor& in, std::span<const int64_t> dims, bool empty_is_all,
                    bool keepdim, bool nonempty, Tensor& out, const char* name, ReducePlan* p) {
  bool mask[kMaxDims];
  if (!parse_dims(ctx, dims, in.dim, name, mask, empty_is_all)) return false;
  *p = make_reduce_plan(in, mask, keepdim);
  return shape_reduction_out(ctx, *p, nonempty, out, name);
}

// Sum of the reduced elements of one out element, in compute dtype T.
template <typename T>
sum_acc_t<T> reduce_sum(const Tensor& in, const ReducePlan& p, int64_t base, ScalarType compute) {
  using L = sum_load_t<T>;
  sum_acc_t<T> acc = 0;
  alignas(64) L buf[kChunk];
  for_each_reduced_row(p, base, [&](int64_t off, int64_t stride, int64_t n) {
    for_each_chunk(n, [&](int64_t s, int64_t m) {
      load_chunk<L>(in, off + s * stride, stride, m, compute, buf);
      if constexpr (is_float_v<T>) {
        acc += sum_as_double(buf, m);
      } else {
        for (int64_t i = 0; i < m; ++i) acc = add_as<T>(acc, buf[i]);
      }
    });
  });
  return acc;
}

// The extreme (the max with kMax, else the min) of each out element's reduced
// values, compared as compute_t<T>, and the first index holding it: put(k, best,
// index). A NaN is the extreme (the first one).
template <bool kMax, typename T, typename Put>
void scan_extremes(const Tensor& in, const ReducePlan& p, Put&& put) {
  using C = compute_t<T>;
  const T* x = in.data_as<const T>();
  for_each_out(p, [&](int64_t k, int64_t base) {
    C best = convert<C>(x[base]);
    int64_t best_i = 0, i = 0;
    bool done = false;
    for_each_reduced_row(p, base, [&](int64_t off, int64_t stride, int64_t n) {
      for (int64_t j = 0; j < n && !done; ++j, ++i) {
        const C v = convert<C>(x[off + j * stride]);
        if constexpr (std::is_floating_point_v<C>) {
          if (v != v) {
            best = v;
            best_i = i;
            done = true;
            break;
          }
        }
        if (kMax ? v > best : v < best) {
          best = v;
          best_i = i;
        }
      }
    });
    put(k, best, best_i);
  });
}

// sum.IntList_out / mean.out: (self, int[1]? dim, bool keepdim, ScalarType? dtype, out)
template <bool kMean>
void sum_mean_impl(KernelContext& ctx, const char* name, const Tensor& in, std::optional<IntArrayRef> dim,
                   bool keepdim, std::optional<ScalarType> dtype, Tensor& out) {
  if (dtype && !check_out_dtype(ctx, out, *dtype, name)) return;
  const ScalarType compute = dtype ? *dtype : out.dtype;
  if (kMean) {
    if (!dtype && !is_floating(in.dtype)) {
      ctx.fail(Status::InvalidArgument, "%s: could not infer output dtype: input dtype must be floating, got %s",
               name, dtype_str(in.dtype));
      return;
    }
    if (!is_floating(compute)) {
      ctx.fail(Status::InvalidArgument, "%s: can only compute the mean of floating types, got %s", name,
               dtype_str(compute));
      return;
    }
  }
  ReducePlan p;
  if (!plan_reduction(ctx, in, dim.value_or(IntArrayRef{}), true, keepdim, false, out, name, &p)) return;
  if (out.numel == 0) return;
  dispatch(compute, [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* o = out.data_as<T>();
    for_each_out(p, [&](int64_t k, int64_t base) {
      auto acc = p.red_numel == 0 ? sum_acc_t<T>(0) : reduce_sum<T>(in, p, base, compute);
      if constexpr (kMean && is_float_v<T>) {
        o[k] = convert<T>(acc / static_cast<double>(p.red_numel));  // empty: 0 / 0 = NaN, as torch
      } else {
        o[k] = convert<T>(acc);
      }
    });
  });
}

template <bool kMean>
void sum_mean(KernelContext& ctx, const Tensor& in, std::optional<IntArrayRef> dim, bool keepdim,
              std::optional<ScalarType> dtype, Tensor& out) {
  sum_mean_impl<kMean>(ctx, kMean ? "aten::mean.out" : "aten::sum.IntList_out", in, dim, keepdim, dtype, out);
}

// mean.dtype_out: (self, ScalarType? dtype, out), the mean of every element (a 0-dim out)
void mean_dtype(KernelContext& ctx, const Tensor& in, std::optional<ScalarType> dtype, Tensor& out) {
  sum_mean_impl<true>(ctx, "aten::mean.dtype_out", in, std::nullopt, false, dtype, out);
}

// prod.out / prod.int_out: the product of the reduced elements in compute dtype `dtype`
// (else out's): double accumulation for floating dtypes, wrapping int64 for integers
// (the same bits as wrapping in the narrower type), nonzero-ness for bool.
void prod_impl(KernelContext& ctx, const char* name, const Tensor& in, std::span<const int64_t> dims, bool keepdim,
               std::optional<ScalarType> dtype, Tensor& out) {
  if (dtype && !check_out_dtype(ctx, out, *dtype, name)) return;
  const ScalarType compute = dtype ? *dtype : out.dtype;
  ReducePlan p;
  if (!plan_reduction(ctx, in, dims, true, keepdim, false, out, name, &p)) return;
  if (out.numel == 0) return;
  dispatch(compute, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using L = sum_load_t<T>;
    using A = sum_acc_t<T>;
    T* o = out.data_as<T>();
    alignas(64) L buf[kChunk];
    for_each_out(p, [&](int64_t k, int64_t base) {
      A acc = 1;
      if (p.red_numel != 0) {
        for_each_reduced_row(p, base, [&](int64_t off, int64_t stride, int64_t n) {
          for_each_chunk(n, [&](int64_t s, int64_t m) {
            load_chunk<L>(in, off + s * stride, stride, m, compute, buf);
            for (int64_t i = 0; i < m; ++i) {
              if constexpr (std::is_same_v<T, bool>) {
                acc = acc != 0 && buf[i] != 0 ? 1 : 0;
              } else if constexpr (is_int_v<T>) {
                const auto v = static_cast<uint64_t>(static_cast<int64_t>(static_cast<T>(buf[i])));
                acc = static_cast<int64_t>(static_cast<uint64_t>(acc) * v);
              } else {
                acc *= buf[i];
              }
            }
          });
        });
      }
      o[k] = convert<T>(acc);
    });
  });
}

void prod_all(KernelContext& ctx, const Tensor& in, std::optional<ScalarType> dtype, Tensor& out) {
  prod_impl(ctx, "aten::prod.out", in, {}, false, dtype, out);
}

void prod_dim(KernelContext& ctx, const Tensor& in, int64_t dim, bool keepdim, std::optional<ScalarType> dtype,
              Tensor& out) {
  prod_impl(ctx, "aten::prod.int_out", in, IntArrayRef(&dim, 1), keepdim, dtype, out);
}

// var.correction_out: (self, int[1]? dim, Scalar? correction, bool keepdim, out); floating
// dtypes, out the input's. Two passes in double per out element: the mean, then the sum
// of squared deviations, divided by max(N - correction, 0) (0 gives inf or NaN, as torch).
void var_correction(KernelContext& ctx, const Tensor& in, std::optional<IntArrayRef> dim,
                    std::optional<Scalar> correction, bool keepdim, Tensor& out) {
  const char* name = "aten::var.correction_out";
  if (!is_floating(in.dtype)) {
    ctx.fail(Status::InvalidArgument, "%s: only floating dtypes are supported, got %s", name, dtype_str(in.dtype));
    return;
  }
  if (!check_out_dtype(ctx, out, in.dtype, name)) return;
  const double c = correction ? correction->as<double>() : 1.0;
  ReducePlan p;
  if (!plan_reduction(ctx, in, dim.value_or(IntArrayRef{}), true, keepdim, false, out, name, &p)) return;
  if (out.numel == 0) return;
  const double n_all = static_cast<double>(p.red_numel);
  const double divisor = n_all - c > 0 ? n_all - c : 0.0;
  dispatch<kFloatingTypes>(in.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* o = out.data_as<T>();
    alignas(64) double buf[kChunk];
    for_each_out(p, [&](int64_t k, int64_t base) {
      double sum = 0, m2 = 0;
      if (p.red_numel != 0) {
        for_each_reduced_row(p, base, [&](int64_t off, int64_t stride, int64_t n) {
          for_each_chunk(n, [&](int64_t s, int64_t m) {
            load_chunk<double>(in, off + s * stride, stride, m, in.dtype, buf);
            sum += sum_as_double(buf, m);
          });
        });
        const double mean = sum / n_all;
        for_each_reduced_row(p, base, [&](int64_t off, int64_t stride, int64_t n) {
          for_each_chunk(n, [&](int64_t s, int64_t m) {
            load_chunk<double>(in, off + s * stride, stride, m, in.dtype, buf);
            m2 += sum_sq_dev(buf, m, mean);
          });
        });
      } else {
        m2 = std::numeric_limits<double>::quiet_NaN();  // the variance of nothing
      }
      o[k] = convert<T>(m2 / divisor);
    });
  });
}

// The max (kMax) or min over `dim` (all dims when empty) into out of in's dtype; NaN propagates.
template <bool kMax>
void extreme_values(KernelContext& ctx, const Tensor& in, IntArrayRef dim, bool keepdim, Tensor& out,
                    const char* name) {
  if (!check_out_dtype(ctx, out, in.dtype, name)) return;
  ReducePlan p;
  if (!plan_reduction(ctx, in, dim, true, keepdim, true, out, name, &p)) return;
  if (out.numel == 0) return;
  dispatch(in.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* o = out.data_as<T>();
    scan_extremes<kMax, T>(in, p, [&](int64_t k, compute_t<T> best, int64_t) { o[k] = convert<T>(best); });
  });
}

// amax.out / amin.out: (self, int[1] dim, bool keepdim, out); NaN propagates.
template <bool kMax>
void amax_amin(KernelContext& ctx, const Tensor& in, IntArrayRef dim, bool keepdim, Tensor& out) {
  extreme_values<kMax>(ctx, in, dim, keepdim, out, kMax ? "aten::amax.out" : "aten::amin.out");
}

// argmax.out / argmin.out: (self, int? dim, bool keepdim, out int64); first index of the max (min);
// NaN is the max (min).
template <bool kMax>
void arg_extreme(KernelContext& ctx, const Tensor& in, std::optional<int64_t> dim, bool keepdim, Tensor& out) {
  const char* name = kMax ? "aten::argmax.out" : "aten::argmin.out";
  if (!check_out_dtype(ctx, out, ScalarType::Long, name)) return;
  if (in.dtype == ScalarType::Bool) {
    ctx.fail(Status::InvalidArgument, "%s: does not support bool input", name);
    return;
  }
  ReducePlan p;
  if (!dim) {  // over all dims: a 0-dim out, or all ones with keepdim
    bool mask[kMaxDims];
    for (int32_t d = 0; d < kMaxDims; ++d) mask[d] = true;
    p = make_reduce_plan(in, mask, keepdim);
    if (!keepdim) p.out_dim = 0;
    if (!shape_reduction_out(ctx, p, true, out, name)) return;
  } else if (!plan_reduction(ctx, in, IntArrayRef(&*dim, 1), true, keepdim, true, out, name, &p)) {
    return;
  }
  if (out.numel == 0) return;
  dispatch<kRealTypes>(in.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    int64_t* o = out.data_as<int64_t>();
    scan_extremes<kMax, T>(in, p, [&](int64_t k, compute_t<T>, int64_t index) { o[k] = index; });
  });
}

// any.out (int dim) / any.dims_out (int[]? dim) / any.all_out: out bool or uint8.
// `dims` empty: all dims when `all`, else none (any.dims with an explicit [] reduces nothing).
void any_impl(KernelContext& ctx, const Tensor& in, Tensor& out, std::span<const int64_t> dims, bool all,
              bool keepdim, const char* name) {
  if (out.dtype != ScalarType::Bool && out.dtype != ScalarType::Byte) {
    ctx.fail(Status::InvalidArgument, "%s: out must be bool or uint8, got %s", name, dtype_str(out.dtype));
    return;
  }
  ReducePlan p;
  if (!plan_reduction(ctx, in, dims, all, keepdim, false, out, name, &p)) return;
  if (out.numel == 0) return;
  alignas(64) bool buf[kChunk];
  for_each_out(p, [&](int64_t k, int64_t base) {
    bool r = false;
    if (p.red_numel != 0) {
      for_each_reduced_row(p, base, [&](int64_t off, int64_t stride, int64_t n) {
        for_each_chunk(n, [&](int64_t s, int64_t m) {
          if (r) return false;
          load_as<bool>(elem_ptr(in, off + s * stride), in.dtype, stride, m, buf);
          for (int64_t i = 0; i < m; ++i) r = r || buf[i];
          return true;
        });
      });
    }
    if (out.dtype == ScalarType::Bool) out.data_as<bool>()[k] = r;
    else out.data_as<uint8_t>()[k] = r ? 1 : 0;
  });
}

void any_dim(KernelContext& ctx, const Tensor& in, int64_t dim, bool keepdim, Tensor& out) {
  any_impl(ctx, in, out, IntArrayRef(&dim, 1), false, keepdim, "aten::any.out");
}

void any_dims(KernelContext& ctx, const Tensor& in, std::optional<IntArrayRef> dim, bool keepdim, Tensor& out) {
  any_impl(ctx, in, out, dim.value_or(IntArrayRef{}), !dim, keepdim, "aten::any.dims_out");
}

void any_all(KernelContext& ctx, const Tensor& in, Tensor& out) {
  any_impl(ctx, in, out, {}, true, false, "aten::any.all_out");
}

// ---------------------------------------------------------------------------
// max.dim_max / min.dim_min (values and the first index of the extreme),
// max/min.unary_out (over everything), argmin.out. NaN is the extreme, as torch.

template <bool kMax>
void extreme_dim(KernelContext& ctx, const Tensor& in, int64_t dim, bool keepdim, Tensor& values, Tensor& indices) {
  const char* name = kMax ? "aten::max.dim_max" : "aten::min.dim_min";
  if (!check_out_dtype(ctx, values, in.dtype, name) || !check_out_dtype(ctx, indices, ScalarType::Long, name)) return;
  ReducePlan p;
  if (!plan_reduction(ctx, in, IntArrayRef(&dim, 1), true, keepdim, true, values, name, &p)) return;
  if (!resize_out(ctx, indices, p.out_sizes(), name) || values.numel == 0) return;
  dispatch<kRealTypes | kBoolTypes>(in.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* v = values.data_as<T>();
    int64_t* ix = indices.data_as<int64_t>();
    scan_extremes<kMax, T>(in, p, [&](int64_t k, compute_t<T> best, int64_t index) {
      v[k] = convert<T>(best);
      ix[k] = index;
    });
  });
}

template <bool kMax>
void extreme_all(KernelContext& ctx, const Tensor& in, Tensor& out) {
  extreme_values<kMax>(ctx, in, {}, false, out, kMax ? "aten::max.unary_out" : "aten::min.unary_out");
}

}  // namespace

KILN_KERNEL(sum_IntList_out, sum_mean<false>);
KILN_KERNEL(mean_out, sum_mean<true>);
KILN_KERNEL(mean_dtype_out, mean_dtype);
KILN_KERNEL(prod_out, prod_all);
KILN_KERNEL(prod_int_out, prod_dim);
KILN_KERNEL(var_correction_out, var_correction);
KILN_KERNEL(amax_out, amax_amin<true>);
KILN_KERNEL(amin_out, amax_amin<false>);
KILN_KERNEL(argmax_out, arg_extreme<true>);
KILN_KERNEL(any_out, any_dim);
KILN_KERNEL(any_dims_out, any_dims);
KILN_KERNEL(any_all_out, any_all);
KILN_KERNEL(max_dim_max, extreme_dim<true>);
KILN_KERNEL(min_dim_min, extreme_dim<false>);
KILN_KERNEL(max_unary_out, extreme_all<true>);
KILN_KERNEL(min_unary_out, extreme_all<false>);
KILN_KERNEL(argmin_out, arg_extreme<false>);

}  // namespace kiln::rt::kernels
