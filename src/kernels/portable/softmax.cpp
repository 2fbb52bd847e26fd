// Softmax and log-softmax along one dim. Contiguous float32 rows take a
// vectorized path; other dtypes and strides compute in float (double for
// float64) chunk by chunk through stack buffers, with the sum in double.
#include "kiln/cpu/math.h"
#include "util/reduce.h"
#include "util/register.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

namespace kiln::rt::kernels {

using namespace ::kiln::cpu;  // exp_f, max_nan, sum_as_double: the compute layer's float math
namespace {

// Softmax or log-softmax of contiguous float32 rows, vectorized for the CPU's ISA.
KILN_VECTOR_CLONES void softmax_rows_f32(const float* in, float* out, int64_t rows, int64_t n, bool log) {
  alignas(64) float e[kChunk];
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = in + r * n;
    float* y = out + r * n;
    const float mx = ::kiln::cpu::max_nan(x, n, -std::numeric_limits<float>::infinity());
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

// Softmax or log-softmax of every line of `in` in compute type C (float, or double for float64).
template <typename C, bool kLog>
void softmax_lines(const Tensor& in, Tensor& out, const Lines& l) {
  // loops below run to round_up8(m) (so they vectorize); past m the buffer holds
  // defined but unused values
  alignas(64) C buf[kChunk] = {};
  auto expc = [](C v) {
    if constexpr (std::is_same_v<C, float>) return exp_f(v);
    else return std::exp(v);
  };
  const int64_t stride = l.inner;
  for_each_line(l, [&](int64_t base) {
    auto load = [&](int64_t s, int64_t m) { load_as<C>(elem_ptr(in, base + s * stride), in.dtype, stride, m, buf); };
    C mx = -std::numeric_limits<C>::infinity();
    for_each_chunk(l.n, [&](int64_t s, int64_t m) {
      load(s, m);
      mx = ::kiln::cpu::max_nan(buf, m, mx);
    });
    double sum = 0;
    for_each_chunk(l.n, [&](int64_t s, int64_t m) {
      load(s, m);
      for (int64_t i = 0; i < round_up8(m); ++i) buf[i] = expc(buf[i] - mx);
      sum += sum_as_double(buf, m);
    });
    const C scale = static_cast<C>(1.0 / sum);
    const C shift = static_cast<C>(mx + static_cast<C>(std::log(sum)));
    for_each_chunk(l.n, [&](int64_t s, int64_t m) {
      load(s, m);
      if constexpr (kLog) {
        for (int64_t i = 0; i < round_up8(m); ++i) buf[i] = buf[i] - shift;
      } else {
        for (int64_t i = 0; i < round_up8(m); ++i) buf[i] = expc(buf[i] - mx) * scale;
      }
      store_as<C>(buf, elem_ptr(out, base + s * stride), out.dtype, stride, m);
    });
  });
}

// _softmax.out / _log_softmax.out: (self, int dim, bool half_to_float, out)
template <bool kLog>
void softmax(KernelContext& ctx, const Tensor& in, int64_t dim_arg, bool half_to_float, Tensor& out) {
  const char* name = kLog ? "aten::_log_softmax.out" : "aten::_softmax.out";
  if (half_to_float) {
    ctx.fail(Status::InvalidArgument, "%s: softmax with half to float conversion is not supported on CPU", name);
    return;
  }
  if (!is_floating(in.dtype)) {
    ctx.fail(Status::InvalidArgument, "%s: not implemented for dtype %s", name, dtype_str(in.dtype));
    return;
  }
  int32_t dim;
  if (!check_out_dtype(ctx, out, in.dtype, name) || !wrap_dim(ctx, dim_arg, in.dim, name, &dim)) return;
  if (!resize_out(ctx, out, in.shape(), name)) return;
  if (in.numel == 0) return;
  const Lines l = lines_along(in, dim);
  if (l.inner == 1 && in.dtype == ScalarType::Float) {  // rows along the last dim: the common case
    softmax_rows_f32(in.data_as<const float>(), out.data_as<float>(), l.outer, l.n, kLog);
  } else if (in.dtype == ScalarType::Double) {
    softmax_lines<double, kLog>(in, out, l);
  } else {
    softmax_lines<float, kLog>(in, out, l);
  }
}

}  // namespace

KILN_KERNEL(softmax_out, softmax<false>);
KILN_KERNEL(log_softmax_out, softmax<true>);

}  // namespace kiln::rt::kernels
