// Internal to kiln_cpu: the qd8 x qb4w / qc8w bodies built on a 16-byte dot-product
// step (P::dot: int32x4 += 4-byte dots of signed bytes), included by
// qd8-gemm-dotprod.cpp after its `#pragma GCC target` (everything here has internal
// linkage, so nothing is shared with a baseline caller). See qd8-gemm-dotprod.cpp for
// the sign tricks and the zero-point algebra.
#pragma once

#include "../isa.h"
#include "kiln/cpu/quant.h"
#include "qd8-gemm-rows.h"

#include <arm_neon.h>

#include <cstdint>
#include <cstring>

namespace kiln::cpu {
namespace {

KILN_CPU_INLINE float bf16f(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// The tag of the NEON block kernels (by_row_blocks), with P's dot-product step.
template <class P>
struct Neon {};

// MR rows (m0 ..) x outputs n0 .. n1: per 16 weight bytes (32 inputs, one group or part of
// one), 2 dot steps per row; per group one FMA per row into 4 float partial sums.
template <class P, int MR>
KILN_CPU_INLINE void block_rows(Neon<P>, RowBlock<MR>, const Qd8Rows& a, int64_t m0, int64_t k, const Qb4wWeights& w,
                                int64_t n0, int64_t n1, const float* bias, float* y, int64_t ldy, float lo, float hi) {
  const int64_t ldw = (k + 1) / 2, regs = ldw / 16, per_group = w.group / 32;
  const uint8x16_t x88 = vdupq_n_u8(0x88), xf0 = vdupq_n_u8(0xf0), x80 = vdupq_n_u8(0x80);
  auto accumulate = [&](int64_t j, const uint8_t* const (&arow)[MR], float32x4_t (&f)[MR]) KILN_CPU_LAMBDA {
    const auto [wr, sr] = qb4w_row(w, k, j);
    int32x4_t d[MR];
    for (int r = 0; r < MR; ++r) d[r] = vdupq_n_s32(0);
    int64_t left = per_group, g = 0;
    // one register of weights: bytes wp .. wp+15 (inputs 32 apart from the last), their even
    // inputs at activation bytes off .. off+15 of the row, the odd ones 64 further
    auto step = [&](const uint8_t* wp, int64_t off) KILN_CPU_LAMBDA {
      const uint8x16_t wb = veorq_u8(vld1q_u8(wp), x88);
      const int8x16_t we = vreinterpretq_s8_u8(vshlq_n_u8(wb, 4));  // 16 w_even
      const int8x16_t wo = vreinterpretq_s8_u8(vandq_u8(wb, xf0));  // 16 w_odd
#pragma GCC unroll 4
      for (int r = 0; r < MR; ++r) {
        const int8x16_t ae = vreinterpretq_s8_u8(veorq_u8(vld1q_u8(arow[r] + off), x80));
        const int8x16_t ao = vreinterpretq_s8_u8(veorq_u8(vld1q_u8(arow[r] + off + 64), x80));
        d[r] = P::dot(P::dot(d[r], ae, we), ao, wo);
      }
      if (--left == 0) {  // a group ends: its int32 partial sums into the float ones, scaled
        const float32x4_t sv = vdupq_n_f32(bf16f(sr[g++]));
#pragma GCC unroll 4
        for (int r = 0; r < MR; ++r) {
          f[r] = vfmaq_f32(f[r], vcvtq_f32_s32(d[r]), sv);
          d[r] = vdupq_n_s32(0);
        }
        left = per_group;
      }
    };
    // whole chunks of 128 inputs (64 weight bytes, 4 registers), then the registers left
    int64_t i = 0;
    if (per_group == 1) {
      // groups of 32 (the default): each register is one group; per chunk, the 4 groups'
      // sums are added pairwise into one vector and scaled by their 4 scales in one FMA
      for (; i + 4 <= regs; i += 4) {
        const uint8_t* wp = wr + 16 * i;
        const int64_t off = i * 32;
        int32x4_t dg[MR][4];
#pragma GCC unroll 4
        for (int q = 0; q < 4; ++q) {
          const uint8x16_t wb = veorq_u8(vld1q_u8(wp + 16 * q), x88);
          const int8x16_t we = vreinterpretq_s8_u8(vshlq_n_u8(wb, 4));
          const int8x16_t wo = vreinterpretq_s8_u8(vandq_u8(wb, xf0));
#pragma GCC unroll 4
          for (int r = 0; r < MR; ++r) {
            const int8x16_t ae = vreinterpretq_s8_u8(veorq_u8(vld1q_u8(arow[r] + off + 16 * q), x80));
            const int8x16_t ao = vreinterpretq_s8_u8(veorq_u8(vld1q_u8(arow[r] + off + 16 * q + 64), x80));
            dg[r][q] = P::dot(P::dot(vdupq_n_s32(0), ae, we), ao, wo);
          }
        }
        // the 4 bf16 scales of groups i .. i+3, widened to fp32 (bf16 is the top half)
        const float32x4_t sv = vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(sr + i), 16));
#pragma GCC unroll 4
        for (int r = 0; r < MR; ++r) {
          const int32x4_t sums = vpaddq_s32(vpaddq_s32(dg[r][0], dg[r][1]), vpaddq_s32(dg[r][2], dg[r][3]));
          f[r] = vfmaq_f32(f[r], vcvtq_f32_s32(sums), sv);
        }
      }
      g = i;
    }
    for (; i + 4 <= regs; i += 4) {
      const uint8_t* wp = wr + 16 * i;
      const int64_t off = i * 32;  // chunk i / 4 starts at activation byte 128 (i / 4)
      step(wp, off);
      step(wp + 16, off + 16);
      step(wp + 32, off + 32);
      step(wp + 48, off + 48);
    }
    for (; i < regs; ++i) step(wr + 16 * i, (i >> 2) * 128 + (i & 3) * 16);
  };
  // the 16 of 16 w comes out exactly; the activations were made signed (zero point less 128)
  for_outputs<MR, float32x4_t>(a, m0, n0, n1, w.sums, bias, y, ldy, lo, hi, 128, accumulate,
                               [](int64_t, const uint8_t*, float32x4_t f) KILN_CPU_LAMBDA { return vaddvq_f32(f) * 0.0625f; });
}

template <class P, int MR>
KILN_CPU_INLINE void block_rows(Neon<P>, RowBlock<MR>, const Qd8Rows& a, int64_t m0, int64_t k, const Qc8wWeights& w,
                                int64_t n0, int64_t n1, const float* bias, float* y, int64_t ldy, float lo, float hi) {
  const uint8x16_t x80 = vdupq_n_u8(0x80);
  const int64_t k16 = k / 16 * 16;
  auto accumulate = [&](int64_t j, const uint8_t* const (&arow)[MR], int32x4_t (&d)[MR]) KILN_CPU_LAMBDA {
    const int8_t* wr = w.data + j * k;
    for (int64_t i = 0; i < k16; i += 16) {
      const int8x16_t wv = vld1q_s8(wr + i);
#pragma GCC unroll 4
      for (int r = 0; r < MR; ++r)
        d[r] = P::dot(d[r], vreinterpretq_s8_u8(veorq_u8(vld1q_u8(arow[r] + i), x80)), wv);
    }
  };
  for_outputs<MR, int32x4_t>(a, m0, n0, n1, w.sums, bias, y, ldy, lo, hi, 128, accumulate,
                             [&](int64_t j, const uint8_t* ar, int32x4_t d) KILN_CPU_LAMBDA {
                               const int8_t* wr = w.data + j * k;
                               int32_t dot = vaddvq_s32(d);  // sum of q w, exact
                               for (int64_t i = k16; i < k; ++i) dot += (static_cast<int32_t>(ar[i]) - 128) * wr[i];
                               return w.scales[j] * static_cast<float>(dot);
                             });
}

}  // namespace
}  // namespace kiln::cpu
