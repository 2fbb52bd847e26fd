// Internal to kiln_cpu: the loop structure every vector qd8 product shares (AVX2, AVX-512,
// NEON), whatever its instructions: activation rows in blocks whose size is a compile-time
// constant (so a block's accumulators stay in registers), the block's row pointers, and
// the per-output epilogue y = s_x (dot - z sum_w) + bias, clamped. ISA-neutral code only;
// each variant's file includes it after its target pragma (everything here has internal
// linkage, so each file gets its own copy built for its ISA).
#pragma once

#include "../isa.h"
#include "kiln/cpu/quant.h"

#include <cstdint>
#include <type_traits>

namespace kiln::cpu {
namespace {

// A block of MR activation rows, as a value whose type carries MR (decltype(rows)::value).
template <int MR>
using RowBlock = std::integral_constant<int, MR>;

// body(RowBlock<4>{}, m0) for each whole block of 4 rows from m0 = 0, then
// body(RowBlock<r>{}, m0) once for the r = 1 .. 3 rows left.
template <class Body>
KILN_CPU_INLINE void for_row_blocks(int64_t m, Body&& body) {
  int64_t m0 = 0;
  for (; m0 + 4 <= m; m0 += 4) body(RowBlock<4>{}, m0);
  switch (m - m0) {
    case 3: body(RowBlock<3>{}, m0); break;
    case 2: body(RowBlock<2>{}, m0); break;
    case 1: body(RowBlock<1>{}, m0); break;
    default: break;
  }
}

// A whole product over m rows (a Qd8Qb4wGemmFn or Qd8Qc8wGemmFn, for the weights W) from an
// ISA's kernel for one block of rows: block_rows(IsaTag{}, RowBlock<MR>{}, a, m0, k, w, n0, n1,
// bias, y, ldy, lo, hi), an overload for W found by argument-dependent lookup (IsaTag: the
// variant's empty tag type, declared beside its kernels).
template <class IsaTag, class W>
void by_row_blocks(const Qd8Rows& a, int64_t m, int64_t k, const W& w, int64_t n0, int64_t n1, const float* bias,
                   float* y, int64_t ldy, float lo, float hi) {
  for_row_blocks(m, [&](auto rows, int64_t m0) KILN_CPU_LAMBDA {
    block_rows(IsaTag{}, rows, a, m0, k, w, n0, n1, bias, y, ldy, lo, hi);
  });
}

KILN_CPU_INLINE float clampf(float v, float lo, float hi) { return v < lo ? lo : (v > hi ? hi : v); }

// arow[r]: the bytes of activation row m0 + r, as T.
template <class T, int MR>
KILN_CPU_INLINE void row_pointers(const Qd8Rows& a, int64_t m0, const T* (&arow)[MR]) {
  #pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) arow[r] = reinterpret_cast<const T*>(a.data + (m0 + r) * a.stride);
}

// Signed rows (the qb4w panels products): arow[r], row m0 + r's bytes as signed q, and
// srow[r], its sums of q per 32 inputs.
template <int MR>
KILN_CPU_INLINE void signed_rows(const Qd8Rows& a, int64_t m0, const int8_t* (&arow)[MR], const int32_t* (&srow)[MR]) {
  row_pointers(a, m0, arow);
  #pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) srow[r] = a.sums + (m0 + r) * a.sums_stride;
}

// A signed row's sum of q over group g (per_group sums of 32 inputs each).
KILN_CPU_INLINE int32_t group_qsum(const int32_t* srow, int64_t g, int64_t per_group) {
  int32_t qsum = 0;
  for (int64_t c = g * per_group; c < (g + 1) * per_group; ++c) qsum += srow[c];
  return qsum;
}

// Output j's qb4w weights: (k + 1) / 2 bytes (two inputs a byte) and k / group bf16 scales.
struct Qb4wRow {
  const uint8_t* data;
  const uint16_t* scales;
};
KILN_CPU_INLINE Qb4wRow qb4w_row(const Qb4wWeights& w, int64_t k, int64_t j) {
  return {w.data + j * ((k + 1) / 2), w.scales + j * (k / w.group)};
}

// The outputs loop of a block kernel (rows m0 .. m0 + MR - 1, whose bytes are arow[r]), for
// each output j in n0 .. n1: MR accumulators of type Acc, zeroed; accumulate(j, arow, acc)
// adds row r's products with output j's weights into acc[r]; dot(j, arow[r], acc[r]) is then
// row r's float dot product (the weights' scales applied), and y = s_x (dot - z sum_w[j]) +
// bias[j], clamped to [lo, hi], where z is the row's zero point less zp_offset (128 where the
// kernel made the activations signed).
template <int MR, class Acc, class Accumulate, class Dot>
KILN_CPU_INLINE void for_outputs(const Qd8Rows& a, int64_t m0, int64_t n0, int64_t n1, const float* sum_w,
                                 const float* bias, float* y, int64_t ldy, float lo, float hi, int32_t zp_offset,
                                 Accumulate&& accumulate, Dot&& dot) {
  const uint8_t* arow[MR];
  row_pointers(a, m0, arow);
  for (int64_t j = n0; j < n1; ++j) {
    Acc acc[MR];
    #pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) acc[r] = Acc{};
    accumulate(j, arow, acc);
    const float b = bias ? bias[j] : 0.0f;
    #pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      const float v = a.scale[m0 + r] * (dot(j, arow[r], acc[r]) - static_cast<float>(a.zp[m0 + r] - zp_offset) * sum_w[j]) + b;
      y[(m0 + r) * ldy + j] = clampf(v, lo, hi);
    }
  }
}

}  // namespace
}  // namespace kiln::cpu
