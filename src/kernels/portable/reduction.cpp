// Reduction kernels: softmax and log-softmax, layer norm, sum, mean, amax, amin,
// argmax, any, cumsum. Accumulation happens in double for floating dtypes
// (int64 for integers), values are converted chunk by chunk into stack buffers
// (no heap), and the dtype rules follow torch's out= variants.
#include "util/register.h"
#include "kiln/cpu/math.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

namespace kiln::rt::kernels {

using namespace ::kiln::cpu;  // exp_f, tanh_f, sums: the compute layer's float math
namespace {

#define KILN_NARGS(n, name) \
  if (!check_nargs(ctx, args, n, name)) return

// ---------------------------------------------------------------------------
// Reduction geometry: which dims are reduced, the out shape, and iteration over
// the input offsets that make up each out element.

struct ReducePlan {
  int32_t n_kept = 0;
  int64_t kept_sizes[kMaxDims] = {};
  int64_t kept_strides[kMaxDims] = {};
  int32_t n_red = 0;  // reduced dims, size-1 dropped, neighbours merged
  int64_t red_sizes[kMaxDims] = {};
  int64_t red_strides[kMaxDims] = {};
  int64_t red_numel = 1;
  bool any_reduced_dim_empty = false;
  int32_t out_dim = 0;
  int64_t out_shape[kMaxDims] = {};
};

// Marks the dims in `dims` in mask (an empty list: all dims, or none if !empty_is_all);
// duplicates and out-of-range dims fail.
bool parse_dims(KernelContext& ctx, std::span<const int64_t> dims, int32_t ndim, const char* name, bool* mask,
                bool empty_is_all = true) {
  for (int32_t d = 0; d < kMaxDims; ++d) mask[d] = dims.empty() && empty_is_all;
  bool seen[kMaxDims + 1] = {};
  for (int64_t raw : dims) {
    int32_t d;
    if (!wrap_dim(ctx, raw, ndim, name, &d)) return false;
    if (seen[d]) {
      ctx.fail(Status::InvalidArgument, "%s: dim %d appears multiple times in the list of dims", name, d);
      return false;
    }
    seen[d] = true;
    mask[d] = true;
  }
  return true;
}

ReducePlan make_reduce_plan(const Tensor& in, const bool* mask, bool keepdim) {
  ReducePlan p;
  bool prev_reduced = false;
  for (int32_t d = 0; d < in.dim; ++d) {
    const int64_t sz = in.sizes[d];
    if (mask[d]) {
      if (keepdim) p.out_shape[p.out_dim++] = 1;
      if (sz == 0) p.any_reduced_dim_empty = true;
      p.red_numel *= sz;
      if (sz != 1) {
        if (prev_reduced && p.n_red > 0) {  // contiguous input: merge with the previous reduced dim
          p.red_sizes[p.n_red - 1] *= sz;
          p.red_strides[p.n_red - 1] = in.strides[d];
        } else {
          p.red_sizes[p.n_red] = sz;
          p.red_strides[p.n_red++] = in.strides[d];
        }
        prev_reduced = true;
      }
    } else {
      p.out_shape[p.out_dim++] = sz;
      if (sz != 1) {
        p.kept_sizes[p.n_kept] = sz;
        p.kept_strides[p.n_kept++] = in.strides[d];
        prev_reduced = false;
      }
    }
  }
  return p;
}

// Calls f(k, base) for each out element k (row-major), base = its first input offset.
template <typename F>
void for_each_out(const ReducePlan& p, F&& f) {
  int64_t idx[kMaxDims] = {};
  int64_t base = 0;
  for (int64_t k = 0;; ++k) {
    f(k, base);
    int32_t d = p.n_kept - 1;
    for (; d >= 0; --d) {
      base += p.kept_strides[d];
      if (++idx[d] < p.kept_sizes[d]) break;
      base -= p.kept_strides[d] * p.kept_sizes[d];
      idx[d] = 0;
    }
    if (d < 0) return;
  }
}

// Calls f(offset, stride, n) for each innermost row of the reduced elements from base, in row-major order.
template <typename F>
void for_each_reduced_row(const ReducePlan& p, int64_t base, F&& f) {
  if (p.n_red == 0) {
    f(base, int64_t{1}, int64_t{1});
    return;
  }
  const int32_t inner = p.n_red - 1;
  int64_t idx[kMaxDims] = {};
  int64_t off = base;
  for (;;) {
    f(off, p.red_strides[inner], p.red_sizes[inner]);
    int32_t d = inner - 1;
    for (; d >= 0; --d) {
      off += p.red_strides[d];
      if (++idx[d] < p.red_sizes[d]) break;
      off -= p.red_strides[d] * p.red_sizes[d];
      idx[d] = 0;
    }
    if (d < 0) return;
  }
}

inline const char* elem_ptr(const Tensor& t, int64_t offset) {
  return static_cast<const char*>(t.data) + offset * element_size(t.dtype);
}
inline char* elem_ptr(Tensor& t, int64_t offset) { return static_cast<char*>(t.data) + offset * element_size(t.dtype); }

// Loads m elements of `in` at offset (stride) as C, rounded to dtype `as` first
// when the input has another dtype (torch converts the input to the compute dtype).
template <typename C>
void load_chunk(const Tensor& in, int64_t offset, int64_t stride, int64_t m, ScalarType as, C* buf) {
  load_as<C>(elem_ptr(in, offset), in.dtype, stride, m, buf);
  if constexpr (std::is_same_v<C, float> || std::is_same_v<C, double>) {
    if (in.dtype != as && (as == ScalarType::Half || as == ScalarType::BFloat16 || as == ScalarType::Float)) {
      for (int64_t i = 0; i < m; ++i) {
        float f = static_cast<float>(buf[i]);
        if (as == ScalarType::Half) f = half_bits_to_float(float_to_half_bits(f));
        else if (as == ScalarType::BFloat16) f = bf16_bits_to_float(float_to_bf16_bits(f));
        buf[i] = static_cast<C>(f);
      }
    }
  }
}

// Accumulator of a sum in compute dtype T: double for floating, wrapping int64 for integral.
template <typename T>
using sum_acc_t = std::conditional_t<is_float_v<T>, double, int64_t>;

template <typename A>
inline A acc_add(A a, A b) {
  if constexpr (std::is_same_v<A, int64_t>) {
    return static_cast<int64_t>(static_cast<uint64_t>(a) + static_cast<uint64_t>(b));
  } else {
    return a + b;
  }
}

// Sum of the reduced elements of one out element, in compute dtype T.
template <typename T>
sum_acc_t<T> reduce_sum(const Tensor& in, const ReducePlan& p, int64_t base, ScalarType compute) {
  using A = sum_acc_t<T>;
  using L = std::conditional_t<is_float_v<T> || std::is_same_v<T, bool>, double, int64_t>;
  A acc = 0;
  alignas(64) L buf[kChunk];
  for_each_reduced_row(p, base, [&](int64_t off, int64_t stride, int64_t n) {
    for (int64_t s = 0; s < n; s += kChunk) {
      const int64_t m = n - s < kChunk ? n - s : kChunk;
      load_chunk<L>(in, off + s * stride, stride, m, compute, buf);
      if constexpr (std::is_same_v<T, bool>) {
        for (int64_t i = 0; i < m; ++i) acc = acc_add<A>(acc, buf[i] != 0);
      } else if constexpr (is_int_v<T>) {
        for (int64_t i = 0; i < m; ++i) acc = acc_add<A>(acc, static_cast<int64_t>(static_cast<T>(buf[i])));
      } else {
        acc += sum_as_double(buf, m);
      }
    }
  });
  return acc;
}

// sum.IntList_out / mean.out: (self, int[1]? dim, bool keepdim, ScalarType? dtype, out)
template <bool kMean>
void sum_mean(KernelContext& ctx, std::span<EValue*> args) {
  const char* name = kMean ? "aten::mean.out" : "aten::sum.IntList_out";
  KILN_NARGS(5, name);
  Tensor* in = tensor_arg(ctx, args, 0, name);
  Tensor* out = in ? tensor_arg(ctx, args, 4, name) : nullptr;
  if (out == nullptr) return;
  std::span<const int64_t> dims;
  if (!args[1]->is_none() && !int_list_arg(ctx, args, 1, name, &dims)) return;
  bool keepdim;
  ScalarType dtype;
  bool has_dtype;
  if (!bool_arg(ctx, args, 2, name, &keepdim) || !opt_dtype_arg(ctx, args, 3, name, &dtype, &has_dtype)) return;
  if (has_dtype && !check_out_dtype(ctx, *out, dtype, name)) return;
  const ScalarType compute = has_dtype ? dtype : out->dtype;
  if (kMean) {
    if (!has_dtype && !is_floating(in->dtype)) {
      ctx.fail(Status::InvalidArgument, "%s: could not infer output dtype: input dtype must be floating, got %s",
               name, dtype_str(in->dtype));
      return;
    }
    if (!is_floating(compute)) {
      ctx.fail(Status::InvalidArgument, "%s: can only compute the mean of floating types, got %s", name,
               dtype_str(compute));
      return;
    }
  }
  bool mask[kMaxDims];
  if (!parse_dims(ctx, dims, in->dim, name, mask)) return;
  const ReducePlan p = make_reduce_plan(*in, mask, keepdim);
  if (!resize_out(ctx, *out, {p.out_shape, static_cast<size_t>(p.out_dim)}, name)) return;
  if (out->numel == 0) return;
  dispatch(compute, [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* o = out->data_as<T>();
    for_each_out(p, [&](int64_t k, int64_t base) {
      auto acc = p.red_numel == 0 ? sum_acc_t<T>(0) : reduce_sum<T>(*in, p, base, compute);
      if constexpr (kMean && is_float_v<T>) {
        o[k] = convert<T>(acc / static_cast<double>(p.red_numel));  // empty: 0 / 0 = NaN, as torch
      } else {
        o[k] = convert<T>(acc);
      }
    });
  });
}

// amax.out / amin.out: (self, int[1] dim, bool keepdim, out); NaN propagates.
template <bool kMax>
void amax_amin(KernelContext& ctx, std::span<EValue*> args) {
  const char* name = kMax ? "aten::amax.out" : "aten::amin.out";
  KILN_NARGS(4, name);
  Tensor* in = tensor_arg(ctx, args, 0, name);
  Tensor* out = in ? tensor_arg(ctx, args, 3, name) : nullptr;
  if (out == nullptr) return;
  std::span<const int64_t> dims;
  bool keepdim;
  if (!int_list_arg(ctx, args, 1, name, &dims) || !bool_arg(ctx, args, 2, name, &keepdim)) return;
  if (!check_out_dtype(ctx, *out, in->dtype, name)) return;
  bool mask[kMaxDims];
  if (!parse_dims(ctx, dims, in->dim, name, mask)) return;
  const ReducePlan p = make_reduce_plan(*in, mask, keepdim);
  if (p.any_reduced_dim_empty) {
    ctx.fail(Status::InvalidArgument, "%s: cannot reduce over a dim of size 0", name);
    return;
  }
  if (!resize_out(ctx, *out, {p.out_shape, static_cast<size_t>(p.out_dim)}, name)) return;
  if (out->numel == 0) return;
  dispatch(in->dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using C = compute_t<T>;
    const T* x = in->data_as<const T>();
    T* o = out->data_as<T>();
    for_each_out(p, [&](int64_t k, int64_t base) {
      C best = convert<C>(x[base]);
      for_each_reduced_row(p, base, [&](int64_t off, int64_t stride, int64_t n) {
        for (int64_t i = 0; i < n; ++i) {
          const C v = convert<C>(x[off + i * stride]);
          if constexpr (std::is_floating_point_v<C>) {
            if (v != v) best = v;
          }
          if (kMax ? v > best : v < best) best = v;
        }
      });
      o[k] = convert<T>(best);
    });
  });
}

// argmax.out: (self, int? dim, bool keepdim, out int64); first index of the max; NaN is the max.
void argmax(KernelContext& ctx, std::span<EValue*> args) {
  const char* name = "aten::argmax.out";
  KILN_NARGS(4, name);
  Tensor* in = tensor_arg(ctx, args, 0, name);
  Tensor* out = in ? tensor_arg(ctx, args, 3, name) : nullptr;
  if (out == nullptr) return;
  bool keepdim;
  if (!bool_arg(ctx, args, 2, name, &keepdim)) return;
  if (!check_out_dtype(ctx, *out, ScalarType::Long, name)) return;
  if (in->dtype == ScalarType::Bool) {
    ctx.fail(Status::InvalidArgument, "%s: does not support bool input", name);
    return;
  }
  bool mask[kMaxDims];
  ReducePlan p;
  if (args[1]->is_none()) {
    for (int32_t d = 0; d < kMaxDims; ++d) mask[d] = true;
    p = make_reduce_plan(*in, mask, keepdim);
    if (!keepdim) p.out_dim = 0;
  } else {
    int64_t dim;
    if (!int_arg(ctx, args, 1, name, &dim)) return;
    if (!parse_dims(ctx, std::span<const int64_t>(&dim, 1), in->dim, name, mask)) return;
    p = make_reduce_plan(*in, mask, keepdim);
  }
  if (p.any_reduced_dim_empty) {
    ctx.fail(Status::InvalidArgument, "%s: cannot reduce over a dim of size 0", name);
    return;
  }
  if (!resize_out(ctx, *out, {p.out_shape, static_cast<size_t>(p.out_dim)}, name)) return;
  if (out->numel == 0) return;
  dispatch<kRealTypes>(in->dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using C = compute_t<T>;
    const T* x = in->data_as<const T>();
    int64_t* o = out->data_as<int64_t>();
    for_each_out(p, [&](int64_t k, int64_t base) {
      C best = convert<C>(x[base]);
      int64_t best_i = 0, i = 0;
      bool done = false;
      for_each_reduced_row(p, base, [&](int64_t off, int64_t stride, int64_t n) {
        for (int64_t j = 0; j < n && !done; ++j, ++i) {
          const C v = convert<C>(x[off + j * stride]);
          if constexpr (std::is_floating_point_v<C>) {
            if (v != v) {
              best_i = i;
              done = true;
              break;
            }
          }
          if (v > best) {
            best = v;
            best_i = i;
          }
        }
      });
      o[k] = best_i;
    });
  });
}

// any.out (int dim) / any.dims_out (int[]? dim) / any.all_out: out bool or uint8.
// `dims` empty: all dims when `all`, else none (any.dims with an explicit [] reduces nothing).
void any_impl(KernelContext& ctx, Tensor* in, Tensor* out, std::span<const int64_t> dims, bool all, bool keepdim,
              const char* name) {
  if (out->dtype != ScalarType::Bool && out->dtype != ScalarType::Byte) {
    ctx.fail(Status::InvalidArgument, "%s: out must be bool or uint8, got %s", name, dtype_str(out->dtype));
    return;
  }
  bool mask[kMaxDims];
  if (!parse_dims(ctx, dims, in->dim, name, mask, all)) return;
  const ReducePlan p = make_reduce_plan(*in, mask, keepdim);
  if (!resize_out(ctx, *out, {p.out_shape, static_cast<size_t>(p.out_dim)}, name)) return;
  if (out->numel == 0) return;
  alignas(64) bool buf[kChunk];
  for_each_out(p, [&](int64_t k, int64_t base) {
    bool r = false;
    if (p.red_numel != 0) {
      for_each_reduced_row(p, base, [&](int64_t off, int64_t stride, int64_t n) {
        for (int64_t s = 0; s < n && !r; s += kChunk) {
          const int64_t m = n - s < kChunk ? n - s : kChunk;
          load_as<bool>(elem_ptr(*in, off + s * stride), in->dtype, stride, m, buf);
          for (int64_t i = 0; i < m; ++i) r = r || buf[i];
        }
      });
    }
    if (out->dtype == ScalarType::Bool) out->data_as<bool>()[k] = r;
    else out->data_as<uint8_t>()[k] = r ? 1 : 0;
  });
}

void any_dim(KernelContext& ctx, std::span<EValue*> args) {
  const char* name = "aten::any.out";
  KILN_NARGS(4, name);
  Tensor* in = tensor_arg(ctx, args, 0, name);
  Tensor* out = in ? tensor_arg(ctx, args, 3, name) : nullptr;
  int64_t dim;
  bool keepdim;
  if (out == nullptr || !int_arg(ctx, args, 1, name, &dim) || !bool_arg(ctx, args, 2, name, &keepdim)) return;
  any_impl(ctx, in, out, std::span<const int64_t>(&dim, 1), false, keepdim, name);
}

void any_dims(KernelContext& ctx, std::span<EValue*> args) {
  const char* name = "aten::any.dims_out";
  KILN_NARGS(4, name);
  Tensor* in = tensor_arg(ctx, args, 0, name);
  Tensor* out = in ? tensor_arg(ctx, args, 3, name) : nullptr;
  if (out == nullptr) return;
  std::span<const int64_t> dims;
  bool keepdim;
  const bool all = args[1]->is_none();
  if (!all && !int_list_arg(ctx, args, 1, name, &dims)) return;
  if (!bool_arg(ctx, args, 2, name, &keepdim)) return;
  any_impl(ctx, in, out, dims, all, keepdim, name);
}

void any_all(KernelContext& ctx, std::span<EValue*> args) {
  const char* name = "aten::any.all_out";
  KILN_NARGS(2, name);
  Tensor* in = tensor_arg(ctx, args, 0, name);
  Tensor* out = in ? tensor_arg(ctx, args, 1, name) : nullptr;
  if (out == nullptr) return;
  any_impl(ctx, in, out, {}, true, false, name);
}

// ---------------------------------------------------------------------------
// Along-one-dim ops: the tensor viewed as [outer, n, inner]; each line has stride `inner`.

struct Lines {
  int64_t outer = 1, n = 1, inner = 1;
};

Lines lines_along(const Tensor& t, int32_t dim) {
  Lines l;
  for (int32_t d = 0; d < t.dim; ++d) {
    if (d < dim) l.outer *= t.sizes[d];
    else if (d == dim) l.n = t.sizes[d];
    else l.inner *= t.sizes[d];
  }
  return l;
}

// Calls f(offset) with the first element offset of every line.
template <typename F>
void for_each_line(const Lines& l, F&& f) {
  for (int64_t o = 0; o < l.outer; ++o)
    for (int64_t i = 0; i < l.inner; ++i) f(o * l.n * l.inner + i);
}

// Softmax or log-softmax of contiguous float32 rows, vectorized for the CPU's ISA.
KILN_VECTOR_CLONES void softmax_rows_f32(const float* in, float* out, int64_t rows, int64_t n, bool log) {
  alignas(64) float e[kChunk];
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = in + r * n;
    float* y = out + r * n;
    const float mx = max_nan(x, n, -std::numeric_limits<float>::infinity());
    double sum = 0;
    for (int64_t s = 0; s < n; s += kChunk) {
      const int64_t m = n - s < kChunk ? n - s : kChunk;
      const int64_t mv = m & ~int64_t{15};
      for (int64_t i = 0; i < mv; ++i) e[i] = exp_f(x[s + i] - mx);
      for (int64_t i = mv; i < m; ++i) e[i] = exp_f(x[s + i] - mx);
      sum += sum_as_double(e, m);
      if (!log) std::memcpy(y + s, e, sizeof(float) * static_cast<size_t>(m));
    }
    if (log) {
      const float shift = mx + static_cast<float>(std::log(sum));
      for (int64_t i = 0; i < n; ++i) y[i] = x[i] - shift;
    } else {
      const float scale = static_cast<float>(1.0 / sum);
      const int64_t nv = n & ~int64_t{15};
      for (int64_t i = 0; i < nv; ++i) y[i] *= scale;
      for (int64_t i = nv; i < n; ++i) y[i] *= scale;
    }
  }
}

// _softmax.out / _log_softmax.out: (self, int dim, bool half_to_float, out)
template <bool kLog>
void softmax(KernelContext& ctx, std::span<EValue*> args) {
  const char* name = kLog ? "aten::_log_softmax.out" : "aten::_softmax.out";
  KILN_NARGS(4, name);
  Tensor* in = tensor_arg(ctx, args, 0, name);
  Tensor* out = in ? tensor_arg(ctx, args, 3, name) : nullptr;
  if (out == nullptr) return;
  int64_t dim_arg;
  bool half_to_float;
  if (!int_arg(ctx, args, 1, name, &dim_arg) || !bool_arg(ctx, args, 2, name, &half_to_float)) return;
  if (half_to_float) {
    ctx.fail(Status::InvalidArgument, "%s: softmax with half to float conversion is not supported on CPU", name);
    return;
  }
  if (!is_floating(in->dtype)) {
    ctx.fail(Status::InvalidArgument, "%s: not implemented for dtype %s", name, dtype_str(in->dtype));
    return;
  }
  int32_t dim;
  if (!check_out_dtype(ctx, *out, in->dtype, name) || !wrap_dim(ctx, dim_arg, in->dim, name, &dim)) return;
  if (!resize_out(ctx, *out, in->shape(), name)) return;
  if (in->numel == 0) return;
  const Lines l = lines_along(*in, dim);
  if (l.inner == 1 && in->dtype == ScalarType::Float) {  // rows along the last dim: the common case
    softmax_rows_f32(in->data_as<const float>(), out->data_as<float>(), l.outer, l.n, kLog);
    return;
  }
  auto run = [&](auto ctag) {
    using C = typename decltype(ctag)::type;  // float, or double for float64
    // loops below run to round_up8(m) (so they vectorize); past m the buffer holds
    // defined but unused values
    alignas(64) C buf[kChunk] = {};
    auto expc = [](C v) {
      if constexpr (std::is_same_v<C, float>) return exp_f(v);
      else return std::exp(v);
    };
    for_each_line(l, [&](int64_t base) {
      const int64_t stride = l.inner;
      C mx = -std::numeric_limits<C>::infinity();
      for (int64_t s = 0; s < l.n; s += kChunk) {
        const int64_t m = l.n - s < kChunk ? l.n - s : kChunk;
        load_as<C>(elem_ptr(*in, base + s * stride), in->dtype, stride, m, buf);
        mx = max_nan(buf, m, mx);
      }
      double sum = 0;
      for (int64_t s = 0; s < l.n; s += kChunk) {
        const int64_t m = l.n - s < kChunk ? l.n - s : kChunk;
        load_as<C>(elem_ptr(*in, base + s * stride), in->dtype, stride, m, buf);
        for (int64_t i = 0; i < round_up8(m); ++i) buf[i] = expc(buf[i] - mx);
        sum += sum_as_double(buf, m);
      }
      const C scale = static_cast<C>(1.0 / sum);
      const C shift = static_cast<C>(mx + static_cast<C>(std::log(sum)));
      for (int64_t s = 0; s < l.n; s += kChunk) {
        const int64_t m = l.n - s < kChunk ? l.n - s : kChunk;
        load_as<C>(elem_ptr(*in, base + s * stride), in->dtype, stride, m, buf);
        if constexpr (kLog) {
          for (int64_t i = 0; i < round_up8(m); ++i) buf[i] = buf[i] - shift;
        } else {
          for (int64_t i = 0; i < round_up8(m); ++i) buf[i] = expc(buf[i] - mx) * scale;
        }
        store_as<C>(buf, elem_ptr(*out, base + s * stride), out->dtype, stride, m);
      }
    });
  };
  if (in->dtype == ScalarType::Double) run(TypeTag<double>{});
  else run(TypeTag<float>{});
}

// Layer norm of one contiguous float32 row (w, b optional float32), vectorized for the CPU's ISA.
KILN_VECTOR_CLONES void layer_norm_row_f32(const float* x, float* y, int64_t n, const float* w, const float* b,
                                           double eps, double* mean_out, double* rstd_out) {
  const double mean = n == 0 ? 0.0 : sum_as_double(x, n) / static_cast<double>(n);
  const double var = sum_sq_dev(x, n, mean) / static_cast<double>(n);  // 0 columns: NaN, as torch
  const double rstd = 1.0 / std::sqrt(var + eps);
  const float cm = static_cast<float>(mean), cr = static_cast<float>(rstd);
  const int64_t nv = n & ~int64_t{15};
  if (w != nullptr && b != nullptr) {
    for (int64_t i = 0; i < nv; ++i) y[i] = (x[i] - cm) * cr * w[i] + b[i];
    for (int64_t i = nv; i < n; ++i) y[i] = (x[i] - cm) * cr * w[i] + b[i];
  } else {
    for (int64_t i = 0; i < nv; ++i) y[i] = (x[i] - cm) * cr;
    for (int64_t i = nv; i < n; ++i) y[i] = (x[i] - cm) * cr;
    if (w != nullptr)
      for (int64_t i = 0; i < n; ++i) y[i] *= w[i];
    if (b != nullptr)
      for (int64_t i = 0; i < n; ++i) y[i] += b[i];
  }
  *mean_out = mean;
  *rstd_out = rstd;
}

// native_layer_norm.out: (input, int[] normalized_shape, Tensor? weight, Tensor? bias, float eps, out, mean, rstd)
void layer_norm(KernelContext& ctx, std::span<EValue*> args) {
  const char* name = "aten::native_layer_norm.out";
  KILN_NARGS(8, name);
  Tensor* in = tensor_arg(ctx, args, 0, name);
  if (in == nullptr) return;
  std::span<const int64_t> norm;
  Tensor *w, *b;
  double eps;
  if (!int_list_arg(ctx, args, 1, name, &norm) || !opt_tensor_arg(ctx, args, 2, name, &w) ||
      !opt_tensor_arg(ctx, args, 3, name, &b) || !double_arg(ctx, args, 4, name, &eps))
    return;
  Tensor* out = tensor_arg(ctx, args, 5, name);
  Tensor* mean_out = out ? tensor_arg(ctx, args, 6, name) : nullptr;
  Tensor* rstd_out = mean_out ? tensor_arg(ctx, args, 7, name) : nullptr;
  if (rstd_out == nullptr) return;
  const int32_t k = static_cast<int32_t>(norm.size());
  char s1[160], s2[160];
  if (k == 0 || k > in->dim) {
    ctx.fail(Status::InvalidArgument, "%s: normalized_shape %s must be non-empty and no longer than the input's rank",
             name, format_shape(s1, sizeof(s1), norm));
    return;
  }
  const int32_t axis = in->dim - k;
  for (int32_t i = 0; i < k; ++i) {
    if (in->sizes[axis + i] != norm[static_cast<size_t>(i)]) {
      ctx.fail(Status::InvalidArgument, "%s: input shape %s does not end with normalized_shape %s", name,
               format_shape(s1, sizeof(s1), in->shape()), format_shape(s2, sizeof(s2), norm));
      return;
    }
  }
  for (Tensor* t : {w, b}) {
    if (t != nullptr && !t->same_shape(norm)) {
      ctx.fail(Status::InvalidArgument, "%s: weight and bias must have shape %s, got %s", name,
               format_shape(s1, sizeof(s1), norm), format_shape(s2, sizeof(s2), t->shape()));
      return;
    }
    if (t != nullptr && !is_floating(t->dtype)) {
      ctx.fail(Status::InvalidArgument, "%s: weight and bias must be floating, got %s", name, dtype_str(t->dtype));
      return;
    }
  }
  if (!is_floating(in->dtype)) {
    ctx.fail(Status::InvalidArgument, "%s: not implemented for dtype %s", name, dtype_str(in->dtype));
    return;
  }
  if (!check_out_dtype(ctx, *out, in->dtype, name)) return;
  for (Tensor* t : {mean_out, rstd_out}) {
    if (!is_floating(t->dtype)) {
      ctx.fail(Status::InvalidArgument, "%s: mean and rstd outs must be floating, got %s", name, dtype_str(t->dtype));
      return;
    }
  }
  int64_t stat_shape[kMaxDims];
  int64_t rows = 1, cols = 1;
  for (int32_t d = 0; d < in->dim; ++d) {
    stat_shape[d] = d < axis ? in->sizes[d] : 1;
    if (d < axis) rows *= in->sizes[d];
    else cols *= in->sizes[d];
  }
  const std::span<const int64_t> stat{stat_shape, static_cast<size_t>(in->dim)};
  if (!resize_out(ctx, *out, in->shape(), name) || !resize_out(ctx, *mean_out, stat, name) ||
      !resize_out(ctx, *rstd_out, stat, name))
    return;
  if (in->dtype == ScalarType::Float && (w == nullptr || w->dtype == ScalarType::Float) &&
      (b == nullptr || b->dtype == ScalarType::Float)) {
    for (int64_t r = 0; r < rows; ++r) {
      double mean, rstd;
      layer_norm_row_f32(in->data_as<const float>() + r * cols, out->data_as<float>() + r * cols, cols,
                         w ? w->data_as<const float>() : nullptr, b ? b->data_as<const float>() : nullptr, eps,
                         &mean, &rstd);
      store_as<double>(&mean, elem_ptr(*mean_out, r), mean_out->dtype, 1, 1);
      store_as<double>(&rstd, elem_ptr(*rstd_out, r), rstd_out->dtype, 1, 1);
    }
    return;
  }
  auto run = [&](auto ctag) {
    using C = typename decltype(ctag)::type;
    alignas(64) C x[kChunk] = {}, wb[kChunk] = {}, bb[kChunk] = {};  // see softmax: loops run to round_up8(m)
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t base = r * cols;
      double sum = 0;
      for (int64_t s = 0; s < cols; s += kChunk) {
        const int64_t m = cols - s < kChunk ? cols - s : kChunk;
        load_as<C>(elem_ptr(*in, base + s), in->dtype, 1, m, x);
        sum += sum_as_double(x, m);
      }
      const double mean = cols == 0 ? 0.0 : sum / static_cast<double>(cols);
      double sq = 0;
      for (int64_t s = 0; s < cols; s += kChunk) {
        const int64_t m = cols - s < kChunk ? cols - s : kChunk;
        load_as<C>(elem_ptr(*in, base + s), in->dtype, 1, m, x);
        sq += sum_sq_dev(x, m, mean);
      }
      const double var = sq / static_cast<double>(cols);  // 0 columns: NaN, as torch
      const double rstd = 1.0 / std::sqrt(var + eps);
      const C cm = static_cast<C>(mean), cr = static_cast<C>(rstd);
      for (int64_t s = 0; s < cols; s += kChunk) {
        const int64_t m = cols - s < kChunk ? cols - s : kChunk;
        load_as<C>(elem_ptr(*in, base + s), in->dtype, 1, m, x);
        const int64_t mp = round_up8(m);
        for (int64_t i = 0; i < mp; ++i) x[i] = (x[i] - cm) * cr;
        if (w != nullptr) {
          load_as<C>(elem_ptr(*w, s), w->dtype, 1, m, wb);
          for (int64_t i = 0; i < mp; ++i) x[i] *= wb[i];
        }
        if (b != nullptr) {
          load_as<C>(elem_ptr(*b, s), b->dtype, 1, m, bb);
          for (int64_t i = 0; i < mp; ++i) x[i] += bb[i];
        }
        store_as<C>(x, elem_ptr(*out, base + s), out->dtype, 1, m);
      }
      store_as<double>(&mean, elem_ptr(*mean_out, r), mean_out->dtype, 1, 1);
      store_as<double>(&rstd, elem_ptr(*rstd_out, r), rstd_out->dtype, 1, 1);
    }
  };
  if (in->dtype == ScalarType::Double) run(TypeTag<double>{});
  else run(TypeTag<float>{});
}

// cumsum.out: (self, int dim, ScalarType? dtype, out)
void cumsum(KernelContext& ctx, std::span<EValue*> args) {
  const char* name = "aten::cumsum.out";
  KILN_NARGS(4, name);
  Tensor* in = tensor_arg(ctx, args, 0, name);
  Tensor* out = in ? tensor_arg(ctx, args, 3, name) : nullptr;
  if (out == nullptr) return;
  int64_t dim_arg;
  ScalarType dtype;
  bool has_dtype;
  if (!int_arg(ctx, args, 1, name, &dim_arg) || !opt_dtype_arg(ctx, args, 2, name, &dtype, &has_dtype)) return;
  if (has_dtype && !check_out_dtype(ctx, *out, dtype, name)) return;
  const ScalarType compute = out->dtype;
  if (compute == ScalarType::Bool) {
    ctx.fail(Status::InvalidArgument, "%s: not implemented for dtype bool", name);
    return;
  }
  int32_t dim;
  if (!wrap_dim(ctx, dim_arg, in->dim, name, &dim)) return;
  if (!resize_out(ctx, *out, in->shape(), name)) return;
  if (in->numel == 0) return;
  const Lines l = lines_along(*in, dim);
  dispatch<kRealTypes>(compute, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using L = std::conditional_t<is_float_v<T>, double, int64_t>;
    alignas(64) L buf[kChunk];
    for_each_line(l, [&](int64_t base) {
      L acc = 0;
      for (int64_t s = 0; s < l.n; s += kChunk) {
        const int64_t m = l.n - s < kChunk ? l.n - s : kChunk;
        load_chunk<L>(*in, base + s * l.inner, l.inner, m, compute, buf);
        for (int64_t i = 0; i < m; ++i) {
          if constexpr (is_int_v<T>) acc = acc_add<L>(acc, static_cast<int64_t>(static_cast<T>(buf[i])));
          else acc += buf[i];
          buf[i] = acc;
        }
        store_as<L>(buf, elem_ptr(*out, base + s * l.inner), out->dtype, l.inner, m);
      }
    });
  });
}

#undef KILN_NARGS


}  // namespace

KILN_BOXED_KERNEL(softmax_out, softmax<false>);
KILN_BOXED_KERNEL(log_softmax_out, softmax<true>);
KILN_BOXED_KERNEL(native_layer_norm_out, layer_norm);
KILN_BOXED_KERNEL(sum_IntList_out, sum_mean<false>);
KILN_BOXED_KERNEL(mean_out, sum_mean<true>);
KILN_BOXED_KERNEL(amax_out, amax_amin<true>);
KILN_BOXED_KERNEL(amin_out, amax_amin<false>);
KILN_BOXED_KERNEL(argmax_out, argmax);
KILN_BOXED_KERNEL(any_out, any_dim);
KILN_BOXED_KERNEL(any_dims_out, any_dims);
KILN_BOXED_KERNEL(any_all_out, any_all);
KILN_BOXED_KERNEL(cumsum_out, cumsum);

}  // namespace kiln::rt::kernels
