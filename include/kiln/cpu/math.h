// Internal: float math written so that loops calling it vectorize (no libm
// calls, no branches: selects only), for the kernels' hot loops — exp, tanh,
// and sums/maxima with independent partial accumulators. Accuracy: exp_f and
// tanh_f stay within 2 ulp of the correctly rounded float result.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

// KILN_VECTOR_CLONES: compile a function for x86-64-v4 (AVX-512), x86-64-v3
// (AVX2, FMA) and the baseline, the best picked when the program loads (an ifunc;
// x86-64 Linux). Only for the hot loops over contiguous float data: each use
// triples that function's code. Define such functions in an anonymous namespace.
#if defined(__x86_64__) && defined(__linux__) && defined(__GNUC__) && !defined(__clang__)  // clang: no target_clones on templates
#define KILN_VECTOR_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define KILN_VECTOR_CLONES
#endif

namespace kiln::cpu {

// c ? a : b on float bits. Both a and b are computed first, so no arm is
// evaluated conditionally; with -ftrapping-math (GCC's default) GCC would not
// speculate a conditional arm, and a loop containing one does not vectorize.
inline float select_f(bool c, float a, float b) {
  const int32_t m = -static_cast<int32_t>(c);
  return std::bit_cast<float>((std::bit_cast<int32_t>(a) & m) | (std::bit_cast<int32_t>(b) & ~m));
}

// e^x in float: Cody-Waite reduction x = n ln2 + r, |r| <= ln2/2, a degree-7
// polynomial for e^r (Cephes' coefficients), and 2^n applied in two steps so
// subnormal results and overflow to inf come out right. NaN propagates.
inline float exp_f(float x) {
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693359375f;  // few mantissa bits: n * kLn2Hi is exact
  constexpr float kLn2Lo = -2.12194440e-4f;
  constexpr float kShift = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  float xc = select_f(x > 89.0f, 89.0f, x);  // clamp; NaN passes through
  xc = select_f(xc < -104.0f, -104.0f, xc);
  const float t = xc * kLog2e + kShift;
  const float nf = t - kShift;
  const int32_t n = std::bit_cast<int32_t>(t) - std::bit_cast<int32_t>(kShift);
  float r = xc - nf * kLn2Hi;
  r = r - nf * kLn2Lo;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
  const int32_t n1 = n >> 1, n2 = n - n1;  // n in [-150, 129]: each half is a normal power of two
  const float s1 = std::bit_cast<float>(static_cast<uint32_t>(n1 + 127) << 23);  // (NaN: any bits; p is NaN)
  const float s2 = std::bit_cast<float>(static_cast<uint32_t>(n2 + 127) << 23);
  return p * s1 * s2;
}

// tanh in float: the odd Taylor series through x^13 below |x| = 0.4 (error
// < 2e-9 relative there), 1 - 2 / (e^{2|x|} + 1) with the sign restored above.
inline float tanh_f(float x) {
  const float x2 = x * x;
  float q = 21844.0f / 6081075.0f;
  q = q * x2 - 1382.0f / 155925.0f;
  q = q * x2 + 62.0f / 2835.0f;
  q = q * x2 - 17.0f / 315.0f;
  q = q * x2 + 2.0f / 15.0f;
  q = q * x2 - 1.0f / 3.0f;
  const float small = std::copysign(x + x * x2 * q, x);  // keeps tanh(-0) = -0
  const float ax = std::fabs(x);
  const float big = 1.0f - 2.0f / (exp_f(2.0f * ax) + 1.0f);
  const float signed_big = std::copysign(big, x);
  return select_f(ax < 0.4f, small, signed_big);  // NaN: the big branch, which is NaN
}

// 1 / (1 + e^-x)
inline float sigmoid_f(float x) { return 1.0f / (1.0f + exp_f(-x)); }

// Sum of n values as double, in eight independent partial sums (vectorizes and
// hides add latency; the order differs from a serial sum by rounding only).
template <typename T>
inline double sum_as_double(const T* x, int64_t n) {
  double acc[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) acc[j] += static_cast<double>(x[i + j]);
  double tail = 0;
  for (; i < n; ++i) tail += static_cast<double>(x[i]);
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7])) + tail;
}

// Sum of (x - mean)^2 as double, like sum_as_double.
template <typename T>
inline double sum_sq_dev(const T* x, int64_t n, double mean) {
  double acc[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) {
      const double d = static_cast<double>(x[i + j]) - mean;
      acc[j] += d * d;
    }
  double tail = 0;
  for (; i < n; ++i) {
    const double d = static_cast<double>(x[i]) - mean;
    tail += d * d;
  }
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7])) + tail;
}

// Maximum of n > 0 values, NaN if any is NaN.
template <typename T>
inline T max_nan(const T* x, int64_t n, T init) {
  T acc[8];
  for (int j = 0; j < 8; ++j) acc[j] = init;
  bool nan = false;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) {
      const T v = x[i + j];
      acc[j] = v > acc[j] ? v : acc[j];
      nan = nan | (v != v);
    }
  T m = init;
  for (; i < n; ++i) {
    m = x[i] > m ? x[i] : m;
    nan = nan | (x[i] != x[i]);
  }
  for (int j = 0; j < 8; ++j) m = acc[j] > m ? acc[j] : m;
  return nan ? std::numeric_limits<T>::quiet_NaN() : m;
}

}  // namespace kiln::cpu
