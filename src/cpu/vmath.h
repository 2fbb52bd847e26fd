// Internal to kiln_cpu: float vectors of W lanes (GCC/Clang vector extensions)
// and the elementwise math of the f32-vunary, f32-vbinary and f32-rows families,
// written once for every width: each variant's file instantiates it for its
// ISA's width inside functions with that ISA's target attribute (see isa.h).
//
// exp_v, tanh_v and sigmoid_v are include/kiln/cpu/math.h's exp_f, tanh_f and
// sigmoid_f lane by lane: the same operations in the same order. Where the ISA
// has FMA the compiler fuses a multiply and an add (GCC's default
// -ffp-contract=fast, as in the target_clones loops before), so AVX2/AVX-512
// results may differ from the generic variant's by rounding (tests/cpu bounds
// it in ulps). Vectors pass by reference and reinterpret by __builtin_bit_cast
// (a vector value crossing a function boundary changes the psabi); everything
// is always inlined.
#pragma once

#include "isa.h"

#include <bit>
#include <cstdint>
#include <cstring>

namespace kiln::cpu {
namespace {  // internal linkage: each variant's file keeps its own copy, built for its ISA

template <int W>
struct VF {
  typedef float f __attribute__((vector_size(4 * W)));
  typedef int32_t i __attribute__((vector_size(4 * W)));
  typedef float uf __attribute__((vector_size(4 * W), aligned(4)));  // unaligned; aliases float
};

template <int W>
KILN_CPU_INLINE void load_v(typename VF<W>::f& v, const float* p) {
  v = *reinterpret_cast<const typename VF<W>::uf*>(p);
}
template <int W>
KILN_CPU_INLINE void store_v(float* p, const typename VF<W>::f& v) {
  *reinterpret_cast<typename VF<W>::uf*>(p) = v;
}
// v = s in every lane (not V{} + s: 0 + -0 is +0)
template <int W>
KILN_CPU_INLINE void splat_v(typename VF<W>::f& v, float s) {
  for (int j = 0; j < W; ++j) v[j] = s;
}

// The first n < W lanes (the rest: `fill`), and back.
template <int W>
KILN_CPU_INLINE void load_part(typename VF<W>::f& v, const float* p, int64_t n, float fill) {
  float t[W];
  for (int j = 0; j < W; ++j) t[j] = fill;
  std::memcpy(t, p, static_cast<size_t>(n) * sizeof(float));
  std::memcpy(&v, t, sizeof v);
}
template <int W>
KILN_CPU_INLINE void store_part(float* p, const typename VF<W>::f& v, int64_t n) {
  std::memcpy(p, &v, static_cast<size_t>(n) * sizeof(float));
}

// Reinterpretations (macros: a function returning a vector would cross the psabi)
#define KILN_BITS_F(W, v) __builtin_bit_cast(typename VF<W>::f, v)
#define KILN_BITS_I(W, v) __builtin_bit_cast(typename VF<W>::i, v)

// c ? a : b per lane, c a comparison's mask (all ones or zero)

template <int W>
KILN_CPU_INLINE void select_v(typename VF<W>::f& r, const typename VF<W>::i& c, const typename VF<W>::f& a,
                              const typename VF<W>::f& b) {
  r = c ? a : b;
}

// r = e^x (math.h's exp_f)
template <int W>
KILN_CPU_INLINE void exp_v(typename VF<W>::f& r, const typename VF<W>::f& x) {
  using V = typename VF<W>::f;
  using I = typename VF<W>::i;
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693359375f;
  constexpr float kLn2Lo = -2.12194440e-4f;
  constexpr float kShift = 12582912.0f;  // 1.5 * 2^23
  const V hi = V{} + 89.0f, lo = V{} - 104.0f;
  V xc;
  select_v<W>(xc, x > hi, hi, x);  // NaN passes through
  select_v<W>(xc, xc < lo, lo, xc);
  const V t = xc * kLog2e + kShift;
  const V nf = t - kShift;
  const I n = KILN_BITS_I(W, t) - std::bit_cast<int32_t>(kShift);
  V rr = xc - nf * kLn2Hi;
  rr = rr - nf * kLn2Lo;
  V p = V{} + 1.9875691500e-4f;
  p = p * rr + 1.3981999507e-3f;
  p = p * rr + 8.3334519073e-3f;
  p = p * rr + 4.1665795894e-2f;
  p = p * rr + 1.6666665459e-1f;
  p = p * rr + 5.0000001201e-1f;
  p = p * (rr * rr) + rr + 1.0f;
  const I n1 = n >> 1, n2 = n - n1;
  const V s1 = KILN_BITS_F(W, (n1 + 127) << 23);
  const V s2 = KILN_BITS_F(W, (n2 + 127) << 23);
  r = p * s1 * s2;
}

// r = |x| with the sign of s
template <int W>
KILN_CPU_INLINE void copysign_v(typename VF<W>::f& r, const typename VF<W>::f& x, const typename VF<W>::f& s) {
  for (int j = 0; j < W; ++j) r[j] = __builtin_copysignf(x[j], s[j]);
}

// r = tanh(x) (math.h's tanh_f)
template <int W>
KILN_CPU_INLINE void tanh_v(typename VF<W>::f& r, const typename VF<W>::f& x) {
  using V = typename VF<W>::f;
  const V x2 = x * x;
  V q = V{} + 21844.0f / 6081075.0f;
  q = q * x2 - 1382.0f / 155925.0f;
  q = q * x2 + 62.0f / 2835.0f;
  q = q * x2 - 17.0f / 315.0f;
  q = q * x2 + 2.0f / 15.0f;
  q = q * x2 - 1.0f / 3.0f;
  V small;
  copysign_v<W>(small, x + x * x2 * q, x);  // keeps tanh(-0) = -0
  V ax;
  for (int j = 0; j < W; ++j) ax[j] = __builtin_fabsf(x[j]);
  V e;
  exp_v<W>(e, 2.0f * ax);
  const V big = 1.0f - 2.0f / (e + 1.0f);
  V signed_big;
  copysign_v<W>(signed_big, big, x);
  select_v<W>(r, ax < 0.4f, small, signed_big);  // NaN: the big branch, which is NaN
}

// r = 1 / (1 + e^-x) (math.h's sigmoid_f)
template <int W>
KILN_CPU_INLINE void sigmoid_v(typename VF<W>::f& r, const typename VF<W>::f& x) {
  typename VF<W>::f e;
  exp_v<W>(e, -x);
  r = 1.0f / (1.0f + e);
}

}  // namespace
}  // namespace kiln::cpu
