// qd8 x qb4w / qc8w, AArch64 NEON + int8 matrix multiply (FEAT_I8MM: SMMLA; Armv8.6 cores
// such as Cortex-X2/A710, Neoverse V1/N2): a 2 x 2 tile of (activation row, weight row)
// per SMMLA, which multiplies a 2 x 8 block of signed activation bytes by a 2 x 8 block
// of signed weight bytes into four int32 sums: 32 multiply-adds per instruction, twice
// SDOT's. Two activation rows by two outputs per pass (an odd last row or output is
// computed twice and stored once). Same sign tricks and zero-point algebra as
// qd8-gemm-dotprod.cpp. The whole file is compiled for the ISA (internal helpers).
#include "../ukernels.h"  // (before the target pragma: declarations only)
#ifdef KILN_CPU_ARM64
#pragma GCC target("arch=armv8.2-a+dotprod+i8mm")
#include "qd8-gemm-neon.h"

namespace kiln::cpu {
namespace {

// The 2 x 2 tiles of (activation row, output): tile(r0, r1, a0, a1, j0, j1), rows r0 and r1
// (bytes a0, a1) by outputs j0 and j1, where an odd last row or output comes twice (r1 == r0,
// j1 == j0).
template <class Tile>
KILN_CPU_INLINE void for_tiles(const Qd8Rows& a, int64_t m, int64_t n0, int64_t n1, Tile&& tile) {
  for (int64_t r0 = 0; r0 < m; r0 += 2) {
    const int64_t r1 = r0 + 1 < m ? r0 + 1 : r0;
    const uint8_t* a0 = a.data + r0 * a.stride;
    const uint8_t* a1 = a.data + r1 * a.stride;
    for (int64_t j0 = n0; j0 < n1; j0 += 2) tile(r0, r1, a0, a1, j0, j0 + 1 < n1 ? j0 + 1 : j0);
  }
}

// [r0 j0, r0 j1, r1 j0, r1 j1] -> y (a duplicated row or output is stored once)
KILN_CPU_INLINE void store_tile(const float (&v)[4], const Qd8Rows& a, int64_t r0, int64_t r1, int64_t j0, int64_t j1,
                                const float* sums, float scale16, const float* bias, float* y, int64_t ldy, float lo,
                                float hi) {
  const int64_t rows[2] = {r0, r1}, cols[2] = {j0, j1};
  for (int ri = 0; ri < (r1 != r0 ? 2 : 1); ++ri)
    for (int ci = 0; ci < (j1 != j0 ? 2 : 1); ++ci) {
      const int64_t r = rows[ri], j = cols[ci];
      const float z = static_cast<float>(a.zp[r] - 128);
      const float v_rj = v[ri * 2 + ci] * scale16;
      y[r * ldy + j] = clampf(a.scale[r] * (v_rj - z * sums[j]) + (bias ? bias[j] : 0.0f), lo, hi);
    }
}

void qb4w_i8mm(const Qd8Rows& a, int64_t m, int64_t k, const Qb4wWeights& w, int64_t n0, int64_t n1,
               const float* bias, float* y, int64_t ldy, float lo, float hi) {
  const int64_t blocks = (k + 1) / 2 / 8, per_group = w.group / 16;
  const uint8x16_t x88 = vdupq_n_u8(0x88), xf0 = vdupq_n_u8(0xf0), x80 = vdupq_n_u8(0x80);
  for_tiles(a, m, n0, n1, [&](int64_t r0, int64_t r1, const uint8_t* a0, const uint8_t* a1, int64_t j0,
                              int64_t j1) KILN_CPU_LAMBDA {
    const auto [w0, s0] = qb4w_row(w, k, j0);
    const auto [w1, s1] = qb4w_row(w, k, j1);
    int32x4_t d = vdupq_n_s32(0);
    float32x4_t f = vdupq_n_f32(0.0f);
    int64_t left = per_group, g = 0;
    for (int64_t b = 0; b < blocks; ++b) {
      // weight bytes 8b .. 8b+7 of each output: inputs 16b .. 16b+15 (8 even, 8 odd)
      const uint8x16_t wb = veorq_u8(vcombine_u8(vld1_u8(w0 + 8 * b), vld1_u8(w1 + 8 * b)), x88);
      const int8x16_t we = vreinterpretq_s8_u8(vshlq_n_u8(wb, 4));
      const int8x16_t wo = vreinterpretq_s8_u8(vandq_u8(wb, xf0));
      const int64_t off = (b >> 3) * 128 + (b & 7) * 8;
      const int8x16_t ae = vreinterpretq_s8_u8(veorq_u8(vcombine_u8(vld1_u8(a0 + off), vld1_u8(a1 + off)), x80));
      const int8x16_t ao =
          vreinterpretq_s8_u8(veorq_u8(vcombine_u8(vld1_u8(a0 + off + 64), vld1_u8(a1 + off + 64)), x80));
      d = vmmlaq_s32(vmmlaq_s32(d, ae, we), ao, wo);
      if (--left == 0) {
        const float32x2_t sp = {bf16f(s0[g]), bf16f(s1[g])};
        ++g;
        f = vfmaq_f32(f, vcvtq_f32_s32(d), vcombine_f32(sp, sp));
        d = vdupq_n_s32(0);
        left = per_group;
      }
    }
    float v[4];
    vst1q_f32(v, f);
    store_tile(v, a, r0, r1, j0, j1, w.sums, 0.0625f, bias, y, ldy, lo, hi);
  });
}

void qc8w_i8mm(const Qd8Rows& a, int64_t m, int64_t k, const Qc8wWeights& w, int64_t n0, int64_t n1,
               const float* bias, float* y, int64_t ldy, float lo, float hi) {
  const uint8x16_t x80 = vdupq_n_u8(0x80);
  const int64_t k8 = k / 8 * 8;
  for_tiles(a, m, n0, n1, [&](int64_t r0, int64_t r1, const uint8_t* a0, const uint8_t* a1, int64_t j0,
                              int64_t j1) KILN_CPU_LAMBDA {
    const int8_t* w0 = w.data + j0 * k;
    const int8_t* w1 = w.data + j1 * k;
    int32x4_t d = vdupq_n_s32(0);
    for (int64_t i = 0; i < k8; i += 8) {
      const int8x16_t wv = vcombine_s8(vld1_s8(w0 + i), vld1_s8(w1 + i));
      const int8x16_t av = vreinterpretq_s8_u8(veorq_u8(vcombine_u8(vld1_u8(a0 + i), vld1_u8(a1 + i)), x80));
      d = vmmlaq_s32(d, av, wv);
    }
    int32_t dots[4];
    vst1q_s32(dots, d);
    const uint8_t* ar[2] = {a0, a1};
    const int8_t* wr[2] = {w0, w1};
    float v[4];
    for (int ri = 0; ri < 2; ++ri)
      for (int ci = 0; ci < 2; ++ci) {
        int32_t dot = dots[ri * 2 + ci];  // sum of q w, exact
        for (int64_t i = k8; i < k; ++i) dot += (static_cast<int32_t>(ar[ri][i]) - 128) * wr[ci][i];
        v[ri * 2 + ci] = w.scales[ci == 0 ? j0 : j1] * static_cast<float>(dot);
      }
    store_tile(v, a, r0, r1, j0, j1, w.sums, 1.0f, bias, y, ldy, lo, hi);
  });
}

}  // namespace

const Qd8GemmVariant qd8_gemm__i8mm{"qd8_gemm__i8mm", Isa::I8mm, false, qb4w_i8mm, qc8w_i8mm, nullptr};

}  // namespace kiln::cpu
#endif
