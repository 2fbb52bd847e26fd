// native_layer_norm: normalization over the trailing dims, with optional weight
// and bias, and the per-row mean and rstd as extra outs. Contiguous float32
// takes a vectorized path; other dtypes compute in float (double for float64)
// chunk by chunk through stack buffers, with the statistics in double.
#include "kiln/cpu/math.h"
#include "util/reduce.h"
#include "util/register.h"

#include <cmath>

namespace kiln::rt::kernels {

using namespace ::kiln::cpu;  // sum_as_double, sum_sq_dev: the compute layer's float math
namespace {

// The row statistics from the sum of its n values and the sum of their squared
// deviations from the mean (0 columns: NaN rstd, as torch).
inline double row_mean(double sum, int64_t n) { return n == 0 ? 0.0 : sum / static_cast<double>(n); }
inline double row_rstd(double sq_dev, int64_t n, double eps) {
  const double var = sq_dev / static_cast<double>(n);
  return 1.0 / std::sqrt(var + eps);
}

// Row r's statistics into the mean and rstd outs (any floating dtype).
void store_stats(Tensor& mean_out, Tensor& rstd_out, int64_t r, double mean, double rstd) {
  store_as<double>(&mean, elem_ptr(mean_out, r), mean_out.dtype, 1, 1);
  store_as<double>(&rstd, elem_ptr(rstd_out, r), rstd_out.dtype, 1, 1);
}

// Layer norm of one contiguous float32 row (w, b optional float32), vectorized for the CPU's ISA.
KILN_VECTOR_CLONES void layer_norm_row_f32(const float* x, float* y, int64_t n, const float* w, const float* b,
                                           double eps, double* mean_out, double* rstd_out) {
  const double mean = row_mean(sum_as_double(x, n), n);
  const double rstd = row_rstd(sum_sq_dev(x, n, mean), n, eps);
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

// Layer norm of `rows` contiguous rows of `cols` in compute type C (float, or
// double for float64); inputs of any floating dtype.
template <typename C>
void layer_norm_rows(const Tensor& in, const Tensor* w, const Tensor* b, double eps, int64_t rows, int64_t cols,
                     Tensor& out, Tensor& mean_out, Tensor& rstd_out) {
  alignas(64) C x[kChunk] = {}, wb[kChunk] = {}, bb[kChunk] = {};  // see softmax: loops run to round_up8(m)
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t base = r * cols;
    auto load = [&](int64_t s, int64_t m) { load_as<C>(elem_ptr(in, base + s), in.dtype, 1, m, x); };
    double sum = 0;
    for_each_chunk(cols, [&](int64_t s, int64_t m) {
      load(s, m);
      sum += sum_as_double(x, m);
    });
    const double mean = row_mean(sum, cols);
    double sq = 0;
    for_each_chunk(cols, [&](int64_t s, int64_t m) {
      load(s, m);
      sq += sum_sq_dev(x, m, mean);
    });
    const double rstd = row_rstd(sq, cols, eps);
    const C cm = static_cast<C>(mean), cr = static_cast<C>(rstd);
    for_each_chunk(cols, [&](int64_t s, int64_t m) {
      load(s, m);
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
      store_as<C>(x, elem_ptr(out, base + s), out.dtype, 1, m);
    });
    store_stats(mean_out, rstd_out, r, mean, rstd);
  }
}

// native_layer_norm.out: (input, int[] normalized_shape, Tensor? weight, Tensor? bias, float eps, out, mean, rstd)
void layer_norm(KernelContext& ctx, const Tensor& in, IntArrayRef norm, const Tensor* w, const Tensor* b, double eps,
                Tensor& out, Tensor& mean_out, Tensor& rstd_out) {
  const char* name = "aten::native_layer_norm.out";
  const int32_t k = static_cast<int32_t>(norm.size());
  char s1[160], s2[160];
  if (k == 0 || k > in.dim) {
    ctx.fail(Status::InvalidArgument, "%s: normalized_shape %s must be non-empty and no longer than the input's rank",
             name, format_shape(s1, sizeof(s1), norm));
    return;
  }
  const int32_t axis = in.dim - k;
  for (int32_t i = 0; i < k; ++i) {
    if (in.sizes[axis + i] != norm[static_cast<size_t>(i)]) {
      ctx.fail(Status::InvalidArgument, "%s: input shape %s does not end with normalized_shape %s", name,
               format_shape(s1, sizeof(s1), in.shape()), format_shape(s2, sizeof(s2), norm));
      return;
    }
  }
  for (const Tensor* t : {w, b}) {
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
  if (!is_floating(in.dtype)) {
    ctx.fail(Status::InvalidArgument, "%s: not implemented for dtype %s", name, dtype_str(in.dtype));
    return;
  }
  if (!check_out_dtype(ctx, out, in.dtype, name)) return;
  for (const Tensor* t : {&mean_out, &rstd_out}) {
    if (!is_floating(t->dtype)) {
      ctx.fail(Status::InvalidArgument, "%s: mean and rstd outs must be floating, got %s", name, dtype_str(t->dtype));
      return;
    }
  }
  int64_t stat_shape[kMaxDims];
  int64_t rows = 1, cols = 1;
  for (int32_t d = 0; d < in.dim; ++d) {
    stat_shape[d] = d < axis ? in.sizes[d] : 1;
    if (d < axis) rows *= in.sizes[d];
    else cols *= in.sizes[d];
  }
  const std::span<const int64_t> stat{stat_shape, static_cast<size_t>(in.dim)};
  if (!resize_out(ctx, out, in.shape(), name) || !resize_out(ctx, mean_out, stat, name) ||
      !resize_out(ctx, rstd_out, stat, name))
    return;
  if (in.dtype == ScalarType::Float && (w == nullptr || w->dtype == ScalarType::Float) &&
      (b == nullptr || b->dtype == ScalarType::Float)) {
    for (int64_t r = 0; r < rows; ++r) {
      double mean, rstd;
      layer_norm_row_f32(in.data_as<const float>() + r * cols, out.data_as<float>() + r * cols, cols,
                         w ? w->data_as<const float>() : nullptr, b ? b->data_as<const float>() : nullptr, eps,
                         &mean, &rstd);
      store_stats(mean_out, rstd_out, r, mean, rstd);
    }
  } else if (in.dtype == ScalarType::Double) {
    layer_norm_rows<double>(in, w, b, eps, rows, cols, out, mean_out, rstd_out);
  } else {
    layer_norm_rows<float>(in, w, b, eps, rows, cols, out, mean_out, rstd_out);
  }
}

}  // namespace

KILN_KERNEL(native_layer_norm_out, layer_norm);

}  // namespace kiln::rt::kernels
