// Internal to kiln_cpu: the f32-rows template, operations over one row of n
// floats that reduce it and map it again. Each f32-rows-<isa>.cpp instantiates
// it for its vector width W inside functions compiled for its ISA (../isa.h).
//
// softmax: out = e^(in - max) / sum, the exponentials by ../vmath.h's exp_v, those below FLT_MIN
// (masked positions) 0.
// The sum runs in 16 partial sums over 16-value blocks (W lanes at a time),
// added in order, then the last n % 16 values one by one: the same order on
// every ISA (and as the steps' loop before this family).
// The maximum ignores NaN (a NaN input makes its exponential, so the sum and
// every output, NaN). out may be in (in place).
//
// transpose: out[j, i] = in[i, j] in W x W blocks held in W vectors, each block
// transposed in registers by log2(W) rounds of two-vector permutes (every round
// swaps the off-diagonal S x S sub-blocks of each 2S x 2S block: S = W/2, ..., 1);
// edge blocks load the rows they have (the rest zero) and store the columns they
// have. A copy, so exact on every ISA. (The LM head's tile transposes, one element
// at a time, took 11 of its 85 ms on a Xeon.)
#pragma once

#include "../vmath.h"

#include <cstdint>
#include <utility>  // std::integer_sequence (the clang path of transpose_round)

namespace kiln::cpu {
namespace {

// e^x where that is at least FLT_MIN, else 0: softmax's exponentials (x - max <= 0). A masked position's
// e^(-huge) came out subnormal (e^-104 at exp_v's clamp), and an Intel core takes a microcode assist for
// each vector whose product is subnormal: GPT-2's causal softmax ran 4x slower for it (6.5 -> 1.6 ms a
// forward, a Xeon). The output there is below FLT_MIN / sum, which is under 2^-126 (sum >= 1): 0 now.
template <int W>
KILN_CPU_INLINE void exp_normal_v(typename VF<W>::f& r, const typename VF<W>::f& x) {
  using V = typename VF<W>::f;
  constexpr float kLo = -87.33f;  // e^kLo ~ 1.18e-38 >= FLT_MIN, and exp_v's product for it is normal
  const V lo = V{} + kLo, zero = V{};
  V xc, e;
  select_v<W>(xc, x < lo, lo, x);  // NaN passes through
  exp_v<W>(e, xc);
  select_v<W>(r, x < lo, zero, e);
}

// softmax's passes after the maximum `mx` of in[0:n]
template <int W>
KILN_CPU_INLINE void softmax_after_max(const float* in, float* out, int64_t n, float mx) {
  static_assert(16 % W == 0, "16-value blocks of W lanes");
  constexpr int kV = 16 / W;
  using V = typename VF<W>::f;
  const int64_t nb = n & ~int64_t{15};
  V vmx;
  splat_v<W>(vmx, mx);
  V acc[kV];
  for (int j = 0; j < kV; ++j) acc[j] = V{};
  for (int64_t i = 0; i < nb; i += 16)
    for (int j = 0; j < kV; ++j) {
      V x, e;
      load_v<W>(x, in + i + j * W);
      exp_normal_v<W>(e, x - vmx);
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
    exp_normal_v<W>(e, x - vmx);
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

// The row's maximum (W-lane blocks, then the tail; NaN ignored), then softmax_after_max. kScaled: the scores are
// in * scale + add (add: a row of n, or null), written to out on the way: attention's scaling, mask and softmax
// in one step (three passes over the row instead of five; the graph's multiply and add are each rounded here
// as there, as the compiler contracts them: FMA where the ISA has it).
template <int W, bool kScaled>
KILN_CPU_INLINE void softmax_rows(const float* in, float scale, const float* add, float* out, int64_t n) {
  constexpr int kV = 16 / W;
  using V = typename VF<W>::f;
  const int64_t nb = n & ~int64_t{15};
  const V ninf = V{} - __builtin_inff();
  V vs;
  splat_v<W>(vs, scale);
  V m[kV];
  for (int j = 0; j < kV; ++j) m[j] = ninf;
  for (int64_t i = 0; i < nb; i += 16)
    for (int j = 0; j < kV; ++j) {
      V x;
      load_v<W>(x, in + i + j * W);
      if constexpr (kScaled) {
        x = x * vs;
        if (add != nullptr) {
          V a;
          load_v<W>(a, add + i + j * W);
          x = x + a;
        }
        store_v<W>(out + i + j * W, x);
      }
      select_v<W>(m[j], x > m[j], x, m[j]);
    }
  float mx = -__builtin_inff();
  for (int j = 0; j < kV; ++j)
    for (int l = 0; l < W; ++l) mx = m[j][l] > mx ? m[j][l] : mx;
  for (int64_t i = nb; i < n; ++i) {
    float x = in[i];
    if constexpr (kScaled) {
      x = add != nullptr ? x * scale + add[i] : x * scale;
      out[i] = x;
    }
    mx = x > mx ? x : mx;
  }
  softmax_after_max<W>(kScaled ? out : in, out, n, mx);
}

template <int W>
KILN_CPU_INLINE void f32_softmax(const float* in, float* out, int64_t n) {
  softmax_rows<W, false>(in, 1.0f, nullptr, out, n);
}

template <int W>
KILN_CPU_INLINE void f32_softmax_scaled(const float* in, float scale, const float* add, float* out, int64_t n) {
  softmax_rows<W, true>(in, scale, add, out, n);
}

// One round of the block transpose: for each pair of rows (r, r + S) with r & S == 0, the lanes with
// j & S set in row r trade places with the lanes without it in row r + S.
template <int W, int S>
KILN_CPU_INLINE void transpose_round(typename VF<W>::f (&r)[W]) {
#if defined(__clang__)
  // clang (scripts/fuzz's build) has no __builtin_shuffle with a mask vector: the same lanes as constants
  [&]<int... J>(std::integer_sequence<int, J...>) {
    for (int i = 0; i < W; ++i)
      if ((i & S) == 0) {
        const typename VF<W>::f a = r[i], b = r[i + S];
        r[i] = __builtin_shufflevector(a, b, ((J & S) ? W + J - S : J)...);
        r[i + S] = __builtin_shufflevector(a, b, ((J & S) ? W + J : J + S)...);
      }
  }(std::make_integer_sequence<int, W>{});
#else
  using I = typename VF<W>::i;
  I lo, hi;  // lo: a's lanes j (j & S == 0), b's lanes j - S (j & S); hi: a's lanes j + S, b's lanes j (indices into a:b)
  for (int j = 0; j < W; ++j) {
    lo[j] = (j & S) ? W + j - S : j;
    hi[j] = (j & S) ? W + j : j + S;
  }
  for (int i = 0; i < W; ++i)
    if ((i & S) == 0) {
      const typename VF<W>::f a = r[i], b = r[i + S];
      r[i] = __builtin_shuffle(a, b, lo);
      r[i + S] = __builtin_shuffle(a, b, hi);
    }
#endif
}

template <int W, int S>
KILN_CPU_INLINE void transpose_rounds(typename VF<W>::f (&r)[W]) {
  if constexpr (S >= 1) {
    transpose_round<W, S>(r);
    transpose_rounds<W, S / 2>(r);
  }
}

template <int W>
KILN_CPU_INLINE void f32_transpose(const float* in, int64_t ldi, int64_t rows, int64_t cols, float* out, int64_t ldo) {
  using V = typename VF<W>::f;
  // W rows of out at a time, each written whole before the next (their cache lines complete while in L1:
  // out's rows are long and unaligned, as the LM head's logits, and a column of blocks at a time left
  // half-written lines to be read back, slower than the element loop)
  for (int64_t j0 = 0; j0 < cols; j0 += W)
    for (int64_t i0 = 0; i0 < rows; i0 += W) {
      const int64_t ri = rows - i0 < W ? rows - i0 : W, cj = cols - j0 < W ? cols - j0 : W;
      V r[W];
      for (int i = 0; i < W; ++i) {
        const float* p = in + (i0 + i) * ldi + j0;
        if (i >= ri) r[i] = V{};
        else if (cj == W) load_v<W>(r[i], p);
        else load_part<W>(r[i], p, cj, 0.0f);
      }
      transpose_rounds<W, W / 2>(r);
      for (int j = 0; j < cj; ++j) {
        float* q = out + (j0 + j) * ldo + i0;
        if (ri == W) store_v<W>(q, r[j]);
        else store_part<W>(q, r[j], ri);
      }
    }
}

}  // namespace
}  // namespace kiln::cpu

#define KILN_DEFINE_F32_ROWS(isa, W, attr)                                                                 \
  attr void f32_softmax__##isa(const float* in, float* out, int64_t n) { f32_softmax<W>(in, out, n); }      \
  attr void f32_softmax_scaled__##isa(const float* in, float scale, const float* add, float* out, int64_t n) { \
    f32_softmax_scaled<W>(in, scale, add, out, n);                                                         \
  }                                                                                                        \
  attr void f32_transpose__##isa(const float* in, int64_t ldi, int64_t rows, int64_t cols, float* out,      \
                                 int64_t ldo) {                                                            \
    f32_transpose<W>(in, ldi, rows, cols, out, ldo);                                                       \
  }
