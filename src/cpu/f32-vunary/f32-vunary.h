// Internal to kiln_cpu: the f32-vunary template, out[i] = f(in[i]) for i < n.
// Each f32-vunary-<isa>.cpp instantiates it for its vector width W inside
// functions compiled for its ISA (see ../isa.h). One vector per step, the last
// n % W values through a partial vector; every step loads before it stores, so
// out == in (in place) is fine.
//
// exp, tanh, sigmoid: ../vmath.h (math.h's polynomials, FMA where the ISA has
// it); sqrt, rsqrt (1 / sqrt), square, neg, abs, clamp: exact IEEE operations;
// gelu (erf form), log, sin, cos: libm per lane (the same on every ISA).
// gelu_tanh: (x / 2) (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))), the tanh form (GPT-2's, Gemma's) as
// PyTorch writes it, in one pass as x / (1 + e^(-2u)) (the XNNPACK backend runs the nine-operation chain
// transformers' models export as this one operation).
#pragma once

#include "../vmath.h"
#include "kiln/cpu/config.h"

#include <cmath>
#include <cstdint>

namespace kiln::cpu {
namespace {

// out[0:n] = op(in[0:n]), op(r, x) on W-lane vectors; `fill` pads a partial vector.
template <int W, typename Op>
KILN_CPU_INLINE void f32_vunary_map(const float* in, float* out, int64_t n, const Op& op) {
  using V = typename VF<W>::f;
  int64_t i = 0;
  for (; i + W <= n; i += W) {
    V x, r;
    load_v<W>(x, in + i);
    op(r, x);
    store_v<W>(out + i, r);
  }
  if (i < n) {
    V x, r;
    load_part<W>(x, in + i, n - i, 1.0f);
    op(r, x);
    store_part<W>(out + i, r, n - i);
  }
}

// A scalar libm function per lane.
template <int W, float (*F)(float)>
KILN_CPU_INLINE void lanes_v(typename VF<W>::f& r, const typename VF<W>::f& x) {
  for (int j = 0; j < W; ++j) r[j] = F(x[j]);
}

inline float gelu_erf(float x) { return 0.5f * x * (1.0f + std::erf(x * 0.70710678118654752f)); }
inline float log_f(float x) { return std::log(x); }
inline float sin_f(float x) { return std::sin(x); }
inline float cos_f(float x) { return std::cos(x); }

template <int W>
struct F32VUnary {
  using V = typename VF<W>::f;
  static KILN_CPU_INLINE void exp(const float* in, float* out, int64_t n) {
    f32_vunary_map<W>(in, out, n, [](V& r, const V& x) KILN_CPU_LAMBDA { exp_v<W>(r, x); });
  }
  static KILN_CPU_INLINE void tanh(const float* in, float* out, int64_t n) {
    f32_vunary_map<W>(in, out, n, [](V& r, const V& x) KILN_CPU_LAMBDA { tanh_v<W>(r, x); });
  }
  static KILN_CPU_INLINE void sigmoid(const float* in, float* out, int64_t n) {
    f32_vunary_map<W>(in, out, n, [](V& r, const V& x) KILN_CPU_LAMBDA { sigmoid_v<W>(r, x); });
  }
  static KILN_CPU_INLINE void sqrt(const float* in, float* out, int64_t n) {
    f32_vunary_map<W>(in, out, n, [](V& r, const V& x) KILN_CPU_LAMBDA {
      for (int j = 0; j < W; ++j) r[j] = std::sqrt(x[j]);  // one vector sqrt (kiln_cpu builds with -fno-math-errno)
    });
  }
  static KILN_CPU_INLINE void rsqrt(const float* in, float* out, int64_t n) {
    f32_vunary_map<W>(in, out, n, [](V& r, const V& x) KILN_CPU_LAMBDA {
      V s;
      for (int j = 0; j < W; ++j) s[j] = std::sqrt(x[j]);
      r = 1.0f / s;
    });
  }
  static KILN_CPU_INLINE void square(const float* in, float* out, int64_t n) {
    f32_vunary_map<W>(in, out, n, [](V& r, const V& x) KILN_CPU_LAMBDA { r = x * x; });
  }
  static KILN_CPU_INLINE void neg(const float* in, float* out, int64_t n) {
    f32_vunary_map<W>(in, out, n, [](V& r, const V& x) KILN_CPU_LAMBDA { r = -x; });
  }
  static KILN_CPU_INLINE void abs(const float* in, float* out, int64_t n) {
    f32_vunary_map<W>(in, out, n, [](V& r, const V& x) KILN_CPU_LAMBDA { r = KILN_BITS_F(W, KILN_BITS_I(W, x) & 0x7fffffff); });
  }
  static KILN_CPU_INLINE void gelu(const float* in, float* out, int64_t n) {
    f32_vunary_map<W>(in, out, n, [](V& r, const V& x) KILN_CPU_LAMBDA { lanes_v<W, gelu_erf>(r, x); });
  }
  static KILN_CPU_INLINE void log(const float* in, float* out, int64_t n) {
    f32_vunary_map<W>(in, out, n, [](V& r, const V& x) KILN_CPU_LAMBDA { lanes_v<W, log_f>(r, x); });
  }
  static KILN_CPU_INLINE void sin(const float* in, float* out, int64_t n) {
    f32_vunary_map<W>(in, out, n, [](V& r, const V& x) KILN_CPU_LAMBDA { lanes_v<W, sin_f>(r, x); });
  }
  static KILN_CPU_INLINE void cos(const float* in, float* out, int64_t n) {
    f32_vunary_map<W>(in, out, n, [](V& r, const V& x) KILN_CPU_LAMBDA { lanes_v<W, cos_f>(r, x); });
  }
  // (x / 2)(1 + tanh(u)) = x / (1 + e^(-2u)): one exponential and one division, no cancellation for x < 0
  // (1 + tanh(u) is 0 in float from u < -9, where this keeps the tiny values), and e^(-2u) is at most
  // exp_v's e^89, so x / (1 + e) stays normal (|x| > 10 there)
  static KILN_CPU_INLINE void gelu_tanh(const float* in, float* out, int64_t n) {
    f32_vunary_map<W>(in, out, n, [](V& r, const V& x) KILN_CPU_LAMBDA {
      const V u2 = (x + x * x * x * 0.044715f) * (-2.0f * 0.7978845608028654f);
      V e;
      exp_v<W>(e, u2);
      r = x / (1.0f + e);
    });
  }
  // min(max(x, lo), hi) as std::min/std::max: NaN stays NaN
  static KILN_CPU_INLINE void clamp(const float* in, float* out, int64_t n, float lo, float hi) {
    V vlo, vhi;
    splat_v<W>(vlo, lo);
    splat_v<W>(vhi, hi);
    f32_vunary_map<W>(in, out, n, [vlo, vhi](V& r, const V& x) KILN_CPU_LAMBDA {
      V t;
      select_v<W>(t, x < vlo, vlo, x);
      select_v<W>(r, vhi < t, vhi, t);
    });
  }
};

}  // namespace
}  // namespace kiln::cpu

// One variant's functions (f32_vexp__<isa>, ...), W lanes, compiled with `attr`.
#define KILN_F32_VUNARY_FN(op, isa, W, attr) \
  attr void f32_v##op##__##isa(const float* in, float* out, int64_t n) { F32VUnary<W>::op(in, out, n); }
#define KILN_DEFINE_F32_VUNARY(isa, W, attr)                                                \
  KILN_F32_VUNARY_OPS(KILN_F32_VUNARY_FN, isa, W, attr)                                     \
  attr void f32_vclamp__##isa(const float* in, float* out, int64_t n, float lo, float hi) { \
    F32VUnary<W>::clamp(in, out, n, lo, hi);                                                \
  }
