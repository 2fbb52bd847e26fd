// Internal to kiln_cpu: the f32-vbinary template, out[i] = a[i] op b[i] in three
// forms: vv (both rows), vs (b one scalar, b[0]) and sv (a one scalar, a[0]).
// Each f32-vbinary-<isa>.cpp instantiates it for its vector width W inside
// functions compiled for its ISA (see ../isa.h). Loads come before the store
// of every step, so out may be a or b (in place).
//
// add, sub, mul, div: IEEE; max(x, y) = x < y ? y : x, min(x, y) = y < x ? y : x
// (so a NaN x gives x, a NaN y gives x: the steps' semantics before this family).
#pragma once

#include "../vmath.h"
#include "kiln/cpu/config.h"

#include <cstdint>

namespace kiln::cpu {
namespace {

// op(r, x, y) on W-lane vectors; kA/kB: the operand is one scalar.
template <int W, bool kA, bool kB, typename Op>
KILN_CPU_INLINE void f32_vbinary_map(const float* a, const float* b, float* out, int64_t n, const Op& op) {
  using V = typename VF<W>::f;
  if (n <= 0) return;
  V as{}, bs{};
  if (kA) splat_v<W>(as, a[0]);
  if (kB) splat_v<W>(bs, b[0]);
  int64_t i = 0;
  for (; i + W <= n; i += W) {
    V x = as, y = bs, r;
    if (!kA) load_v<W>(x, a + i);
    if (!kB) load_v<W>(y, b + i);
    op(r, x, y);
    store_v<W>(out + i, r);
  }
  if (i < n) {
    V x = as, y = bs, r;
    if (!kA) load_part<W>(x, a + i, n - i, 1.0f);
    if (!kB) load_part<W>(y, b + i, n - i, 1.0f);
    op(r, x, y);
    store_part<W>(out + i, r, n - i);
  }
}

template <int W>
struct F32VBinaryOps {
  using V = typename VF<W>::f;
  static KILN_CPU_INLINE void add(V& r, const V& x, const V& y) { r = x + y; }
  static KILN_CPU_INLINE void sub(V& r, const V& x, const V& y) { r = x - y; }
  static KILN_CPU_INLINE void mul(V& r, const V& x, const V& y) { r = x * y; }
  static KILN_CPU_INLINE void div(V& r, const V& x, const V& y) { r = x / y; }
  static KILN_CPU_INLINE void max(V& r, const V& x, const V& y) { select_v<W>(r, x < y, y, x); }
  static KILN_CPU_INLINE void min(V& r, const V& x, const V& y) { select_v<W>(r, y < x, y, x); }
};

}  // namespace
}  // namespace kiln::cpu

// One variant's functions f32_v<op>_{vv,vs,sv}__<isa>, W lanes, compiled with `attr`.
#define KILN_F32_VBINARY_FORM(op, form, kA, kB, isa, W, attr)                                          \
  attr void f32_v##op##_##form##__##isa(const float* a, const float* b, float* out, int64_t n) {       \
    f32_vbinary_map<W, kA, kB>(a, b, out, n, [](typename VF<W>::f& r, const typename VF<W>::f& x,      \
                                                const typename VF<W>::f& y)                            \
                                                 KILN_CPU_LAMBDA { F32VBinaryOps<W>::op(r, x, y); });  \
  }
#define KILN_F32_VBINARY_OP(op, isa, W, attr)          \
  KILN_F32_VBINARY_FORM(op, vv, false, false, isa, W, attr) \
  KILN_F32_VBINARY_FORM(op, vs, false, true, isa, W, attr)  \
  KILN_F32_VBINARY_FORM(op, sv, true, false, isa, W, attr)
#define KILN_DEFINE_F32_VBINARY(isa, W, attr) KILN_F32_VBINARY_OPS(KILN_F32_VBINARY_OP, isa, W, attr)
