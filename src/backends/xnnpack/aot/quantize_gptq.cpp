// GPTQ-style error feedback for kiln lower --calibrate (quantize.h: quantize_weights_gptq).
//
// Frantar et al., "GPTQ: Accurate Post-Training Quantization for Generative Pre-trained Transformers" (2022),
// written from the paper's algorithm: the layer's output error on the calibration inputs X is
//   || X W^T - X Q^T ||^2 = sum_rows (w - q) H (w - q)^T,   H = X^T X,
// and quantizing the columns of every row one at a time, each column's rounding error e_i is compensated on the
// columns not yet quantized: w[j] -= e_i U[i][j] / U[i][i] for j > i, with U the upper Cholesky factor of H^-1
// (H^-1 = U^T U). Rows are independent given U. Groups of `group` columns take their scale (the scheme's rule:
// mse or minmax, the same code the plain quantizer runs) from the row's error-fed values when the group starts.
#include "kiln/backends/xnnpack/quantize.h"

#include "kiln/core/dtype.h"
#include "kiln/core/error.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <thread>

namespace kiln::backends::xnnpack {
namespace {

// y[0..n) -= a x[0..n), 32 bytes at a time (GCC's and Clang's vector extension: -O2 does not vectorise the plain
// loop); on x86-64 an AVX2 clone where the CPU has it
template <class T>
[[gnu::always_inline]] inline void axpy_sub_impl(T* __restrict y, T a, const T* __restrict x, int64_t n) {
  typedef T V __attribute__((vector_size(32)));
  constexpr int64_t L = 32 / sizeof(T);
  const V va = a - V{};
  int64_t i = 0;
  for (; i + L <= n; i += L) {
    V vy, vx;
    std::memcpy(&vy, y + i, sizeof vy);
    std::memcpy(&vx, x + i, sizeof vx);
    vy -= va * vx;
    std::memcpy(y + i, &vy, sizeof vy);
  }
  for (; i < n; ++i) y[i] -= a * x[i];
}

template <class T>
void axpy_sub_baseline(T* __restrict y, T a, const T* __restrict x, int64_t n) {
  axpy_sub_impl(y, a, x, n);
}
#if defined(__x86_64__)
template <class T>
__attribute__((target("avx2"))) void axpy_sub_avx2(T* __restrict y, T a, const T* __restrict x, int64_t n) {
  axpy_sub_impl(y, a, x, n);
}
#endif

template <class T>
void axpy_sub(T* __restrict y, T a, const T* __restrict x, int64_t n) {
#if defined(__x86_64__)
  static const bool avx2 = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2");
  }();
  if (avx2) return axpy_sub_avx2(y, a, x, n);
#endif
  axpy_sub_baseline(y, a, x, n);
}

}  // namespace

void gptq_gram_update(float* gram, const float* x, int64_t k) {
  for (int64_t i = 0; i < k; ++i)
    if (x[i] != 0.0f) axpy_sub(gram + i * k + i, -x[i], x + i, k - i);
}

namespace {

}  // namespace

std::vector<float> gptq_inverse_factor(std::vector<double> h, int64_t k, double damp, int64_t* dead) {
  check(static_cast<int64_t>(h.size()) == k * k, "internal: GPTQ Gram matrix of {} entries for {} inputs", h.size(), k);
  double mean_diag = 0;
  for (int64_t i = 0; i < k; ++i) mean_diag += h[static_cast<size_t>(i * k + i)];
  mean_diag /= static_cast<double>(k);
  if (!(mean_diag > 0) || !std::isfinite(mean_diag)) mean_diag = 1;
  int64_t zero = 0;
  for (int64_t i = 0; i < k; ++i) {
    double& d = h[static_cast<size_t>(i * k + i)];
    if (!(d > 0)) d = mean_diag, ++zero;  // an input the calibration never saw: an independent unit column
    d += damp * mean_diag;
  }
  if (dead) *dead = zero;
  // H = R R^T with R upper triangular (a Cholesky factorisation from the last column to the first), right-looking:
  // column j of R is column j of the updated matrix over its square root, then the leading block loses c c^T.
  // Only the lower triangle a[i][0..i] of the leading block is read and updated.
  std::vector<double> r(static_cast<size_t>(k * k), 0.0), c(static_cast<size_t>(k));
  for (int64_t j = k - 1; j >= 0; --j) {
    double d = h[static_cast<size_t>(j * k + j)];
    if (!(d > 1e-12 * mean_diag)) d = 1e-12 * mean_diag;  // not positive definite in floating point: keep going
    const double root = std::sqrt(d);
    for (int64_t i = 0; i < j; ++i) c[static_cast<size_t>(i)] = h[static_cast<size_t>(j * k + i)] / root;  // a[j][i] = a[i][j]
    r[static_cast<size_t>(j * k + j)] = root;
    for (int64_t i = 0; i < j; ++i) r[static_cast<size_t>(i * k + j)] = c[static_cast<size_t>(i)];
    for (int64_t i = 0; i < j; ++i) axpy_sub(h.data() + i * k, c[static_cast<size_t>(i)], c.data(), i + 1);
  }
  // U = R^-1 (upper): H^-1 = R^-T R^-1 = U^T U. Row i from the rows below it: U[i][i] = 1 / R[i][i],
  // U[i][i+1..] = -(1 / R[i][i]) sum_{m > i} R[i][m] U[m][..]
  std::vector<double> u(static_cast<size_t>(k * k), 0.0);
  for (int64_t i = k - 1; i >= 0; --i) {
    double* ui = u.data() + i * k;
    const double inv = 1.0 / r[static_cast<size_t>(i * k + i)];
    for (int64_t m = i + 1; m < k; ++m) axpy_sub(ui + m, r[static_cast<size_t>(i * k + m)], u.data() + m * k + m, k - m);
    for (int64_t m = i + 1; m < k; ++m) ui[m] *= inv;
    ui[i] = inv;
  }
  return std::vector<float>(u.begin(), u.end());
}

namespace {

// Act-order with static groups: every group's scale is the scheme's rule on the row's original values (taken before
// any feedback), and the columns are quantized in `order` (U factors H permuted by `order`), each with its own
// group's scale: the error feedback goes to the columns that come later in that order.
QuantizedWeights gptq_ordered(std::vector<float>& w, int64_t n, int64_t k, const std::vector<float>& u,
                              const QuantScheme& scheme, const std::vector<int64_t>& order) {
  const bool int4 = scheme.kind == QuantScheme::Kind::Int4Groups, affine = has_offsets(scheme);
  const int64_t g = int4 ? scheme.group : k, groups = k / g;
  check(static_cast<int64_t>(order.size()) == k, "internal: GPTQ order size");
  QuantizedWeights q = quantize_weights(w.data(), n, k, scheme);  // the static scales (its codes are replaced)
  std::fill(q.data.begin(), q.data.end(), std::byte{0});
  const float qmin = int4 ? -8.0f : -128.0f, qmax = int4 ? 7.0f : 127.0f;
  auto rows = [&](int64_t r0, int64_t r1) {
    std::vector<float> row(static_cast<size_t>(k)), scale(static_cast<size_t>(k)), offset(static_cast<size_t>(k), 0.0f);
    for (int64_t j = r0; j < r1; ++j) {
      float* orig = w.data() + j * k;
      for (int64_t i = 0; i < k; ++i) {
        const int64_t c = order[static_cast<size_t>(i)];
        row[static_cast<size_t>(i)] = orig[c];
        float s;
        if (int4) {
          s = bf16_to_float(q.scales.data() + static_cast<size_t>(j * groups + c / g) * 2);
          if (affine) std::memcpy(&offset[static_cast<size_t>(i)], q.offsets.data() + static_cast<size_t>(j * groups + c / g) * 4, 4);
        } else {
          std::memcpy(&s, q.scales.data() + static_cast<size_t>(j) * 4, 4);
        }
        scale[static_cast<size_t>(i)] = s;
      }
      for (int64_t i = 0; i < k; ++i) {
        const float* ui = u.data() + i * k;
        const float s = scale[static_cast<size_t>(i)], o = offset[static_cast<size_t>(i)], v = row[static_cast<size_t>(i)];
        const float code = std::clamp(std::nearbyint((v - o) * (1.0f / s)), qmin, qmax);
        const float e = (v - (code * s + o)) / ui[i];
        row[static_cast<size_t>(i)] = code * s + o;
        axpy_sub(row.data() + i + 1, e, ui + i + 1, k - i - 1);
        const int64_t c = order[static_cast<size_t>(i)];
        orig[c] = code * s + o;
        if (int4) {
          const auto nib = static_cast<uint8_t>(static_cast<int>(code) + 8);
          auto* out = reinterpret_cast<uint8_t*>(q.data.data()) + j * (k / 2) + c / 2;
          *out |= static_cast<uint8_t>((c & 1) ? nib << 4 : nib);
        } else {
          reinterpret_cast<int8_t*>(q.data.data())[j * k + c] = static_cast<int8_t>(code);
        }
      }
    }
  };
  const int64_t threads = std::clamp<int64_t>(std::thread::hardware_concurrency(), 1, std::min<int64_t>(8, n));
  std::vector<std::thread> pool;
  for (int64_t t = 1; t < threads; ++t) pool.emplace_back([&, t] { rows(n * t / threads, n * (t + 1) / threads); });
  rows(0, n / threads);
  for (auto& th : pool) th.join();
  return q;
}

}  // namespace

QuantizedWeights quantize_weights_gptq(std::vector<float>& w, int64_t n, int64_t k, const std::vector<float>& u,
                                       const QuantScheme& scheme, const std::vector<int64_t>* order) {
  if (order) return gptq_ordered(w, n, k, u, scheme, *order);
  const bool int4 = scheme.kind == QuantScheme::Kind::Int4Groups, affine = has_offsets(scheme);
  check(int4 || scheme.kind == QuantScheme::Kind::Int8Channels, "internal: GPTQ for 8da4w or 8da8w only");
  const int64_t g = int4 ? scheme.group : k, groups = k / g;
  check(k % g == 0 && static_cast<int64_t>(w.size()) == n * k && static_cast<int64_t>(u.size()) == k * k,
        "internal: GPTQ shapes");
  const float qmin = int4 ? -8.0f : -128.0f, qmax = int4 ? 7.0f : 127.0f;
  QuantizedWeights q;
  if (int4) {
    q.data.assign(static_cast<size_t>(n * (k / 2)), std::byte{0});
    q.scales.resize(static_cast<size_t>(n * groups) * 2);
    if (affine) q.offsets.resize(static_cast<size_t>(n * groups) * 4);
  } else {
    q.data.resize(static_cast<size_t>(n * k));
    q.scales.resize(static_cast<size_t>(n) * 4);
  }
  constexpr int64_t kRows = 16;  // rows per pass over U: U's row i is read once for all of them
  QuantScheme one = scheme;      // the group's scale: the scheme's own rule on the error-fed values
  auto rows = [&](int64_t r0, int64_t r1) {
    std::vector<float> seg(static_cast<size_t>(kRows * g)), scale(static_cast<size_t>(kRows)),
        inv(static_cast<size_t>(kRows)), offset(static_cast<size_t>(kRows), 0.0f);
    for (int64_t c0 = r0; c0 < r1; c0 += kRows) {
      const int64_t m = std::min(kRows, r1 - c0);
      for (int64_t i = 0; i < k; ++i) {
        if (i % g == 0) {
          for (int64_t r = 0; r < m; ++r)
            std::memcpy(seg.data() + r * g, w.data() + (c0 + r) * k + i, static_cast<size_t>(g) * sizeof(float));
          const QuantizedWeights part = quantize_weights(seg.data(), m, g, one);
          for (int64_t r = 0; r < m; ++r) {
            const std::byte* s = part.scales.data() + static_cast<size_t>(r) * (int4 ? 2 : 4);
            if (int4) {
              scale[static_cast<size_t>(r)] = bf16_to_float(s);
              std::memcpy(q.scales.data() + static_cast<size_t>((c0 + r) * groups + i / g) * 2, s, 2);
              if (affine) {  // the group's offset, chosen with its scale (asym_fit) on the error-fed values
                std::memcpy(&offset[static_cast<size_t>(r)], part.offsets.data() + static_cast<size_t>(r) * 4, 4);
                std::memcpy(q.offsets.data() + static_cast<size_t>((c0 + r) * groups + i / g) * 4,
                            &offset[static_cast<size_t>(r)], 4);
              }
            } else {
              std::memcpy(&scale[static_cast<size_t>(r)], s, 4);
              std::memcpy(q.scales.data() + static_cast<size_t>(c0 + r) * 4, s, 4);
            }
            inv[static_cast<size_t>(r)] = 1.0f / scale[static_cast<size_t>(r)];
          }
        }
        const float* ui = u.data() + i * k;
        const float d = ui[i];
        for (int64_t r = 0; r < m; ++r) {
          float* row = w.data() + (c0 + r) * k;
          const float v = row[i];
          // as the plain quantizer: v * (1 / scale), rounded half to even, clamped to the grid
          const float o = offset[static_cast<size_t>(r)];
          const float code = std::clamp(std::nearbyint((v - o) * inv[static_cast<size_t>(r)]), qmin, qmax);
          const float e = (v - (code * scale[static_cast<size_t>(r)] + o)) / d;
          row[i] = code * scale[static_cast<size_t>(r)] + o;
          axpy_sub(row + i + 1, e, ui + i + 1, k - i - 1);
          const int64_t j = c0 + r;
          if (int4) {  // the even input in the low nibble, as q + 8
            const auto nib = static_cast<uint8_t>(static_cast<int>(code) + 8);
            auto* out = reinterpret_cast<uint8_t*>(q.data.data()) + j * (k / 2) + i / 2;
            *out |= static_cast<uint8_t>((i & 1) ? nib << 4 : nib);
          } else {
            reinterpret_cast<int8_t*>(q.data.data())[j * k + i] = static_cast<int8_t>(code);
          }
        }
      }
    }
  };
  // rows are independent: split them over the cores in whole passes
  const int64_t passes = (n + kRows - 1) / kRows;
  const int64_t threads = std::clamp<int64_t>(std::thread::hardware_concurrency(), 1, std::min<int64_t>(8, passes));
  std::vector<std::thread> pool;
  for (int64_t t = 1; t < threads; ++t)
    pool.emplace_back([&, t] { rows(std::min(n, passes * t / threads * kRows), std::min(n, passes * (t + 1) / threads * kRows)); });
  rows(0, std::min(n, passes / threads * kRows));
  for (auto& th : pool) th.join();
  return q;
}

}  // namespace kiln::backends::xnnpack
