// Pairwise distances: _cdist_forward (every row of x1 against every row of x2,
// batch dims broadcast) and _pdist_forward (every pair i < j of one matrix's rows,
// in row-major order). The p-norm of the difference of two rows: p = 0 counts
// the nonzero differences, p = inf takes the largest |difference|, p = 1 and 2
// their own loops, any other p (sum |d|^p)^(1/p). Differences are taken in the
// dtype's compute type (as torch), sums accumulate in double.
#include "util/register.h"

#include <cmath>
#include <limits>
#include <optional>

namespace kiln::rt::kernels {
namespace {

enum class Norm { Zero, One, Two, Inf, General };

Norm norm_kind(double p) {
  if (p == 0) return Norm::Zero;
  if (p == 1) return Norm::One;
  if (p == 2) return Norm::Two;
  if (std::isinf(p)) return Norm::Inf;
  return Norm::General;
}

// ||a - b||_p over m elements (a, b with element strides sa, sb)
template <Norm kN, typename T>
double row_distance(const T* a, int64_t sa, const T* b, int64_t sb, int64_t m, double p) {
  using C = compute_t<T>;
  double acc = 0;
  for (int64_t i = 0; i < m; ++i) {
    const C diff = static_cast<C>(convert<C>(a[i * sa]) - convert<C>(b[i * sb]));
    const double d = std::fabs(static_cast<double>(diff));
    if constexpr (kN == Norm::Zero) acc += d != 0 ? 1.0 : 0.0;  // NaN counts
    else if constexpr (kN == Norm::One) acc += d;
    else if constexpr (kN == Norm::Two) acc += d * d;
    else if constexpr (kN == Norm::Inf) {
      if (acc == acc && !(d <= acc)) acc = d;  // a NaN stays
    } else {
      acc += std::pow(d, p);
    }
  }
  if constexpr (kN == Norm::Two) return std::sqrt(acc);
  else if constexpr (kN == Norm::General) return std::pow(acc, 1.0 / p);
  else return acc;
}

// Calls f(norm-specialized row_distance) for p.
template <typename T, typename F>
void with_norm(double p, F&& f) {
  switch (norm_kind(p)) {
    case Norm::Zero: return f(row_distance<Norm::Zero, T>);
    case Norm::One: return f(row_distance<Norm::One, T>);
    case Norm::Two: return f(row_distance<Norm::Two, T>);
    case Norm::Inf: return f(row_distance<Norm::Inf, T>);
    case Norm::General: return f(row_distance<Norm::General, T>);
  }
}

bool check_distance_args(KernelContext& ctx, const Tensor& a, const Tensor* b, double p, const Tensor& out,
                         const char* name) {
  if (!in_set(a.dtype, kFloatTypes)) {  // as torch on CPU: no float16/bfloat16
    ctx.fail(Status::InvalidArgument, "%s: only float32 and float64 are supported, got %s", name, dtype_str(a.dtype));
    return false;
  }
  if (b != nullptr && b->dtype != a.dtype) {
    ctx.fail(Status::InvalidArgument, "%s: x1 and x2 must have the same dtype, got %s and %s", name,
             dtype_str(a.dtype), dtype_str(b->dtype));
    return false;
  }
  if (!(p >= 0)) {
    ctx.fail(Status::InvalidArgument, "%s: p must be a non-negative value, got %g", name, p);
    return false;
  }
  return check_out_dtype(ctx, out, a.dtype, name);
}

// _cdist_forward.out: x1 [..., P, M], x2 [..., R, M] -> out [broadcast(...), P, R].
// compute_mode (whether torch may use a matrix product for p = 2) does not change
// the result beyond rounding: every distance is computed directly.
void cdist_forward(KernelContext& ctx, const Tensor& x1, const Tensor& x2, double p, std::optional<int64_t> compute_mode,
                   Tensor& out) {
  const char* name = "aten::_cdist_forward.out";
  (void)compute_mode;
  if (!check_distance_args(ctx, x1, &x2, p, out, name)) return;
  if (x1.dim < 2 || x2.dim < 2) {
    ctx.fail(Status::InvalidArgument, "%s: x1 and x2 must have at least 2 dims, got %d and %d", name, x1.dim, x2.dim);
    return;
  }
  const int64_t M = x1.sizes[x1.dim - 1];
  if (x2.sizes[x2.dim - 1] != M) {
    ctx.fail(Status::InvalidArgument, "%s: x1 and x2 must have the same number of columns, got %lld and %lld", name,
             static_cast<long long>(M), static_cast<long long>(x2.sizes[x2.dim - 1]));
    return;
  }
  const int64_t P = x1.sizes[x1.dim - 2], R = x2.sizes[x2.dim - 2];
  // batch dims, right-aligned and broadcast; strides 0 where a side has size 1 or lacks the dim
  const int32_t b1 = x1.dim - 2, b2 = x2.dim - 2;
  const int32_t nb = b1 > b2 ? b1 : b2;
  int64_t shape[kMaxDims], s1[kMaxDims], s2[kMaxDims];
  int64_t batch = 1;
  for (int32_t d = 0; d < nb; ++d) {
    const int32_t d1 = d - (nb - b1), d2 = d - (nb - b2);
    const int64_t n1 = d1 >= 0 ? x1.sizes[d1] : 1, n2 = d2 >= 0 ? x2.sizes[d2] : 1;
    if (n1 != n2 && n1 != 1 && n2 != 1) {
      ctx.fail(Status::InvalidArgument, "%s: batch dims %lld and %lld do not broadcast", name,
               static_cast<long long>(n1), static_cast<long long>(n2));
      return;
    }
    shape[d] = n1 == 1 ? n2 : n1;
    s1[d] = d1 >= 0 && n1 != 1 ? x1.strides[d1] : 0;
    s2[d] = d2 >= 0 && n2 != 1 ? x2.strides[d2] : 0;
    batch *= shape[d];
  }
  shape[nb] = P;
  shape[nb + 1] = R;
  if (!resize_out(ctx, out, {shape, static_cast<size_t>(nb + 2)}, name)) return;
  if (out.numel == 0) return;
  const int64_t r1 = x1.strides[x1.dim - 2], c1 = x1.strides[x1.dim - 1];
  const int64_t r2 = x2.strides[x2.dim - 2], c2 = x2.strides[x2.dim - 1];
  dispatch<kFloatTypes>(x1.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* a = x1.data_as<const T>();
    const T* b = x2.data_as<const T>();
    T* o = out.data_as<T>();
    with_norm<T>(p, [&](auto dist) {
      int64_t idx[kMaxDims] = {};
      for (int64_t k = 0; k < batch; ++k) {
        int64_t o1 = 0, o2 = 0;
        for (int32_t d = 0; d < nb; ++d) {
          o1 += idx[d] * s1[d];
          o2 += idx[d] * s2[d];
        }
        T* ob = o + k * P * R;
        for (int64_t i = 0; i < P; ++i)
          for (int64_t j = 0; j < R; ++j) ob[i * R + j] = convert<T>(dist(a + o1 + i * r1, c1, b + o2 + j * r2, c2, M, p));
        for (int32_t d = nb - 1; d >= 0; --d) {
          if (++idx[d] < shape[d]) break;
          idx[d] = 0;
        }
      }
    });
  });
}

// _pdist_forward.out: self [N, M] -> out [N (N - 1) / 2], the pairs (i, j), i < j, in order.
void pdist_forward(KernelContext& ctx, const Tensor& self, double p, Tensor& out) {
  const char* name = "aten::_pdist_forward.out";
  if (!check_distance_args(ctx, self, nullptr, p, out, name)) return;
  if (self.dim != 2) {
    ctx.fail(Status::InvalidArgument, "%s: expected a 2-D input, got %d dims", name, self.dim);
    return;
  }
  const int64_t N = self.sizes[0], M = self.sizes[1];
  const int64_t pairs = N > 1 ? N * (N - 1) / 2 : 0;
  if (!resize_out(ctx, out, {&pairs, 1}, name)) return;
  if (out.numel == 0) return;
  const int64_t rs = self.strides[0], cs = self.strides[1];
  dispatch<kFloatTypes>(self.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* x = self.data_as<const T>();
    T* o = out.data_as<T>();
    with_norm<T>(p, [&](auto dist) {
      int64_t k = 0;
      for (int64_t i = 0; i < N; ++i)
        for (int64_t j = i + 1; j < N; ++j) o[k++] = convert<T>(dist(x + i * rs, cs, x + j * rs, cs, M, p));
    });
  });
}

}  // namespace

KILN_KERNEL(_cdist_forward_out, cdist_forward);
KILN_KERNEL(_pdist_forward_out, pdist_forward);

}  // namespace kiln::rt::kernels
