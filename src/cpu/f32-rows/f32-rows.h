// Internal to kiln_cpu: the f32-rows template, operations over one row of n
// floats that reduce it and map it again. Each f32-rows-<isa>.cpp instantiates
// it for its vector width W inside functions compiled for its ISA (../isa.h).
//
// softmax: out = e^(in - max) / sum, the exponentials by ../vmath.h's exp_v.
// The sum runs in 16 partial sums over 16-value blocks (W lanes at a time),
// added in order, then the last n % 16 values one by one: the same order on
// every ISA (and as the steps' loop before this family).
// The maximum ignores NaN (a NaN input makes its exponential, so the sum and
// every output, NaN). out may be in (in place).
#pragma once

#include "../vmath.h"

#include <cstdint>

namespace kiln::cpu {
namespace {

template <int W>
KILN_CPU_INLINE void f32_softmax(const float* in, float* out, int64_t n) {
  static_assert(16 % W == 0, "16-value blocks of W lanes");
  constexpr int kV = 16 / W;
  using V = typename VF<W>::f;
  const int64_t nb = n & ~int64_t{15};
  const V ninf = V{} - __builtin_inff();
  V m[kV];
  for (int j = 0; j < kV; ++j) m[j] = ninf;
  for (int64_t i = 0; i < nb; i += 16)
    for (int j = 0; j < kV; ++j) {
      V x;
      load_v<W>(x, in + i + j * W);
      select_v<W>(m[j], x > m[j], x, m[j]);
    }
  float mx = -__builtin_inff();
  for (int j = 0; j < kV; ++j)
    for (int l = 0; l < W; ++l) mx = m[j][l] > mx ? m[j][l] : mx;
  for (int64_t i = nb; i < n; ++i) mx = in[i] > mx ? in[i] : mx;
  V vmx;
  splat_v<W>(vmx, mx);
  V acc[kV];
  for (int j = 0; j < kV; ++j) acc[j] = V{};
  for (int64_t i = 0; i < nb; i += 16)
    for (int j = 0; j < kV; ++j) {
      V x, e;
      load_v<W>(x, in + i + j * W);
      exp_v<W>(e, x - vmx);
      store_v<W>(out + i + j * W, e);
      acc[j] += e;
    }
  float sum = 0;
  for (int j = 0; j < kV; ++j)
    for (int l = 0; l < W; ++l) sum += acc[j][l];
  for (int64_t i = nb; i < n; i += W) {  // the tail's exponentials by vectors, summed one by one
    const int64_t c = n - i < W ? n - i : W;
    V x, e;
    load_part<W>(x, in + i, c, 0.0f);
    exp_v<W>(e, x - vmx);
    store_part<W>(out + i, e, c);
    for (int64_t l = 0; l < c; ++l) sum += out[i + l];
  }
  V inv;
  splat_v<W>(inv, 1.0f / sum);
  int64_t i = 0;
  for (; i + W <= n; i += W) {
    V x;
    load_v<W>(x, out + i);
    store_v<W>(out + i, x * inv);
  }
  if (i < n) {
    V x;
    load_part<W>(x, out + i, n - i, 0.0f);
    store_part<W>(out + i, x * inv, n - i);
  }
}

}  // namespace
}  // namespace kiln::cpu

#define KILN_DEFINE_F32_ROWS(isa, W, attr) \
  attr void f32_softmax__##isa(const float* in, float* out, int64_t n) { f32_softmax<W>(in, out, n); }
