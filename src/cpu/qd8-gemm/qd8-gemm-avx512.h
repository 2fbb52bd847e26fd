// qd8 x qb4w / qc8w on AVX-512 (BW): the body of the avx512 and avx512vnni
// variants, which differ only in the u8 x s8 dot product (vpmaddubsw + vpmaddwd,
// or VNNI's vpdpbusd). Included by one file per variant after its
// `#pragma GCC target`; everything here has internal linkage.
#pragma once

#include "kiln/cpu/quant.h"
#include "qd8-gemm-rows.h"

#include "../avx512-intrinsics.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace kiln::cpu {
namespace {

template <bool Vnni>
inline __m512i dot_u8s8(__m512i acc, __m512i a_u8, __m512i b_s8) {
  if constexpr (Vnni) {
    return _mm512_dpbusd_epi32(acc, a_u8, b_s8);
  } else {  // |a * b| <= 255 * 8 per pair here (int4 weights): the 16-bit sums cannot saturate
    const __m512i p = _mm512_maddubs_epi16(a_u8, b_s8);
    return _mm512_add_epi32(acc, _mm512_madd_epi16(p, _mm512_set1_epi16(1)));
  }
}

inline float bf16f(uint16_t b) { return _mm_cvtss_f32(_mm_castsi128_ps(_mm_cvtsi32_si128(static_cast<int>(b) << 16))); }

// The tag of the AVX-512 block kernels (by_row_blocks), with or without VNNI.
template <bool Vnni>
struct Avx512 {};

// MR activation rows against weight rows n0..n1, qb4w.
template <bool Vnni, int MR>
inline void block_rows(Avx512<Vnni>, RowBlock<MR>, const Qd8Rows& a, int64_t m0, int64_t k, const Qb4wWeights& w,
                       int64_t n0, int64_t n1, const float* bias, float* y, int64_t ldy, float lo, float hi) {
  const int64_t ldw = (k + 1) / 2, G = w.group, groups = k / G, chunks = (k + 127) / 128;
  // Lane j of a chunk's int32 products holds inputs 8j .. 8j+7 of the chunk (even
  // ones from the low nibbles, odd ones from the high): its group is (8j) / G
  // past the chunk's first group.
  alignas(64) int32_t lane_group[16];
  for (int j = 0; j < 16; ++j) lane_group[j] = G <= 128 ? static_cast<int32_t>((8 * j) / G) : 0;
  const __m512i lane_idx = _mm512_load_si512(lane_group);
  const int per_chunk = G <= 128 ? static_cast<int>(128 / G) : 1;
  const __m512i low4 = _mm512_set1_epi8(0x0f), eight = _mm512_set1_epi8(8);
  auto accumulate = [&](int64_t j, const uint8_t* const (&arow)[MR], __m512 (&f)[MR]) KILN_CPU_LAMBDA {
    const auto [wr, sr] = qb4w_row(w, k, j);
    for (int64_t c = 0; c < chunks; ++c) {
      const int64_t rem = ldw - c * 64;
      const __m512i bytes = rem >= 64 ? _mm512_loadu_si512(wr + c * 64)
                                      : _mm512_maskz_loadu_epi8((__mmask64{1} << rem) - 1, wr + c * 64);
      const __m512i wl = _mm512_sub_epi8(_mm512_and_si512(bytes, low4), eight);
      const __m512i wh = _mm512_sub_epi8(_mm512_and_si512(_mm512_srli_epi16(bytes, 4), low4), eight);
      const int64_t g0 = (c * 128) / G;
      __m512 sv;
      if (per_chunk == 1) {
        sv = _mm512_set1_ps(bf16f(sr[g0]));
      } else {
        const int64_t cnt = groups - g0 < per_chunk ? groups - g0 : per_chunk;
        const __m128i s16 = _mm_maskz_loadu_epi16(static_cast<__mmask8>((1u << cnt) - 1), sr + g0);
        const __m128i s32 = _mm_slli_epi32(_mm_cvtepu16_epi32(s16), 16);
        sv = _mm512_permutexvar_ps(lane_idx, _mm512_castps128_ps512(_mm_castsi128_ps(s32)));
      }
      #pragma GCC unroll 8
      for (int r = 0; r < MR; ++r) {
        const uint8_t* ar = arow[r] + c * 128;
        __m512i acc = dot_u8s8<Vnni>(_mm512_setzero_si512(), _mm512_loadu_si512(ar), wl);
        acc = dot_u8s8<Vnni>(acc, _mm512_loadu_si512(ar + 64), wh);
        f[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc), sv, f[r]);
      }
    }
  };
  for_outputs<MR, __m512>(a, m0, n0, n1, w.sums, bias, y, ldy, lo, hi, 0, accumulate,
                          [](int64_t, const uint8_t*, __m512 f) KILN_CPU_LAMBDA { return _mm512_reduce_add_ps(f); });
}

// qb4w panels (kiln/cpu/quant.h), Signed rows: lane l of a 64-byte vector of low (high)
// nibbles holds output l's w + 8 for 4 consecutive inputs, so its dot product with
// the row's 4 bytes for those inputs, broadcast, adds to output l's sum directly:
// no horizontal sums, 16 outputs per instruction. Per group, fp32 accumulates
// s_g * (dot - 8 * sum q) per output. MR rows share each decoded weight vector; for
// one or two rows the low and high nibbles feed separate sums (two dependency chains).
inline __m512i bcast4(const int8_t* p) {  // 4 bytes, in every 32-bit lane
  int32_t v;
  __builtin_memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

template <bool Vnni, int MR>
inline void qb4w_panel_rows(const Qd8Rows& a, int64_t m0, int64_t k, const Qb4wPanels& w, int64_t n, int64_t p0,
                            int64_t p1, const float* bias, float* y, int64_t ldy, float lo, float hi) {
  constexpr bool kSplit = MR <= 2;
  const int64_t G = w.group, groups = k / G, steps = G / 8, per_group = G / 32;
  const size_t pb = qb4w_panel_bytes(k, G);
  const __m512i low4 = _mm512_set1_epi8(0x0f);
  const int8_t* arow[MR];
  const int32_t* srow[MR];
  signed_rows(a, m0, arow, srow);
  for (int64_t p = p0; p < p1; ++p) {
    const uint8_t* wp = w.data + static_cast<size_t>(p) * pb;
    __m512 f[MR][2];
    #pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) f[r][0] = f[r][1] = _mm512_setzero_ps();
    for (int64_t g = 0; g < groups; ++g) {
      __m512i acc[MR][2], acc_hi[MR][2];
      #pragma GCC unroll 8
      for (int r = 0; r < MR; ++r) {
        acc[r][0] = acc[r][1] = _mm512_setzero_si512();
        if constexpr (kSplit) acc_hi[r][0] = acc_hi[r][1] = _mm512_setzero_si512();
      }
      const int64_t gi = g * G;
      for (int64_t t = 0; t < steps; ++t, wp += 128) {
        const __m512i v0 = _mm512_load_si512(wp), v1 = _mm512_load_si512(wp + 64);
        const __m512i l0 = _mm512_and_si512(v0, low4), l1 = _mm512_and_si512(v1, low4);
        const __m512i h0 = _mm512_and_si512(_mm512_srli_epi16(v0, 4), low4);
        const __m512i h1 = _mm512_and_si512(_mm512_srli_epi16(v1, 4), low4);
        #pragma GCC unroll 8
        for (int r = 0; r < MR; ++r) {
          const int8_t* x = arow[r] + gi + 8 * t;
          const __m512i xl = bcast4(x), xh = bcast4(x + 4);
          acc[r][0] = dot_u8s8<Vnni>(acc[r][0], l0, xl);
          acc[r][1] = dot_u8s8<Vnni>(acc[r][1], l1, xl);
          if constexpr (kSplit) {
            acc_hi[r][0] = dot_u8s8<Vnni>(acc_hi[r][0], h0, xh);
            acc_hi[r][1] = dot_u8s8<Vnni>(acc_hi[r][1], h1, xh);
          } else {
            acc[r][0] = dot_u8s8<Vnni>(acc[r][0], h0, xh);
            acc[r][1] = dot_u8s8<Vnni>(acc[r][1], h1, xh);
          }
        }
      }
      const __m512 s0 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_load_si256(reinterpret_cast<const __m256i*>(wp))), 16));
      const __m512 s1 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_load_si256(reinterpret_cast<const __m256i*>(wp + 32))), 16));
      wp += 64;
      #pragma GCC unroll 8
      for (int r = 0; r < MR; ++r) {
        const int32_t qsum = group_qsum(srow[r], g, per_group);
        const __m512i corr = _mm512_set1_epi32(8 * qsum);
        __m512i d0 = acc[r][0], d1 = acc[r][1];
        if constexpr (kSplit) {
          d0 = _mm512_add_epi32(d0, acc_hi[r][0]);
          d1 = _mm512_add_epi32(d1, acc_hi[r][1]);
        }
        f[r][0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(d0, corr)), s0, f[r][0]);
        f[r][1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(d1, corr)), s1, f[r][1]);
      }
    }
    // y = s_x * (acc - zp * sums) + bias, clamped; the last panel's outputs past n are not stored
    const int64_t j0 = p * kQb4wPanel;
    #pragma GCC unroll 8
    for (int h = 0; h < 2; ++h) {
      const int64_t left = n - (j0 + 16 * h);
      if (left <= 0) break;
      const __mmask16 mask = left >= 16 ? __mmask16{0xffff} : static_cast<__mmask16>((1u << left) - 1);
      const __m512 sums = _mm512_maskz_loadu_ps(mask, w.sums + j0 + 16 * h);
      const __m512 b = bias ? _mm512_maskz_loadu_ps(mask, bias + j0 + 16 * h) : _mm512_setzero_ps();
      #pragma GCC unroll 8
      for (int r = 0; r < MR; ++r) {
        const __m512 t = _mm512_fnmadd_ps(_mm512_set1_ps(static_cast<float>(a.zp[m0 + r])), sums, f[r][h]);
        __m512 v = _mm512_fmadd_ps(_mm512_set1_ps(a.scale[m0 + r]), t, b);
        v = _mm512_min_ps(_mm512_max_ps(v, _mm512_set1_ps(lo)), _mm512_set1_ps(hi));
        _mm512_mask_storeu_ps(y + (m0 + r) * ldy + j0 + 16 * h, mask, v);
      }
    }
  }
}

template <bool Vnni>
inline void qb4w_panels_avx512(const Qd8Rows& a, int64_t m, int64_t k, const Qb4wPanels& w, int64_t n, int64_t p0,
                               int64_t p1, const float* bias, float* y, int64_t ldy, float lo, float hi) {
  if (m == 1) return qb4w_panel_rows<Vnni, 1>(a, 0, k, w, n, p0, p1, bias, y, ldy, lo, hi);
  // Panels in chunks of ~128 KB, which stay in L2 while every block of 4 rows passes over them
  // (each panel in L1 for one block): a block's stores are then 4 runs of contiguous outputs.
  // Panel by panel, with all rows inside, the stores of one panel went to m rows ldy apart,
  // which for an LM head's ldy (49152 floats: a multiple of 64 KiB) share one cache set.
  const int64_t chunk = static_cast<int64_t>(std::max<size_t>(1, (size_t{128} << 10) / qb4w_panel_bytes(k, w.group)));
  for (int64_t c0 = p0; c0 < p1; c0 += chunk) {
    const int64_t c1 = std::min(p1, c0 + chunk);
    for_row_blocks(m, [&](auto rows, int64_t m0) KILN_CPU_LAMBDA {
      qb4w_panel_rows<Vnni, decltype(rows)::value>(a, m0, k, w, n, c0, c1, bias, y, ldy, lo, hi);
    });
  }
}

// int8 weights: |a * b| reaches 255 * 128 per pair, so without VNNI the bytes are
// widened to 16 bits first (exact).
template <bool Vnni>
inline __m512i dot_u8s8_wide(__m512i acc, __m512i a_u8, __m512i b_s8) {
  if constexpr (Vnni) {
    return _mm512_dpbusd_epi32(acc, a_u8, b_s8);
  } else {
    const __m512i a0 = _mm512_cvtepu8_epi16(_mm512_castsi512_si256(a_u8));
    const __m512i a1 = _mm512_cvtepu8_epi16(_mm512_extracti64x4_epi64(a_u8, 1));
    const __m512i b0 = _mm512_cvtepi8_epi16(_mm512_castsi512_si256(b_s8));
    const __m512i b1 = _mm512_cvtepi8_epi16(_mm512_extracti64x4_epi64(b_s8, 1));
    acc = _mm512_add_epi32(acc, _mm512_madd_epi16(a0, b0));
    return _mm512_add_epi32(acc, _mm512_madd_epi16(a1, b1));
  }
}

template <bool Vnni, int MR>
inline void block_rows(Avx512<Vnni>, RowBlock<MR>, const Qd8Rows& a, int64_t m0, int64_t k, const Qc8wWeights& w,
                       int64_t n0, int64_t n1, const float* bias, float* y, int64_t ldy, float lo, float hi) {
  const int64_t chunks = (k + 63) / 64;
  auto accumulate = [&](int64_t j, const uint8_t* const (&arow)[MR], __m512i (&acc)[MR]) KILN_CPU_LAMBDA {
    const int8_t* wr = w.data + j * k;
    for (int64_t c = 0; c < chunks; ++c) {
      const int64_t rem = k - c * 64;
      const __m512i wv = rem >= 64 ? _mm512_loadu_si512(wr + c * 64)
                                   : _mm512_maskz_loadu_epi8((__mmask64{1} << rem) - 1, wr + c * 64);
      #pragma GCC unroll 8
      for (int r = 0; r < MR; ++r) acc[r] = dot_u8s8_wide<Vnni>(acc[r], _mm512_loadu_si512(arow[r] + c * 64), wv);
    }
  };
  for_outputs<MR, __m512i>(a, m0, n0, n1, w.sums, bias, y, ldy, lo, hi, 0, accumulate,
                           [&](int64_t j, const uint8_t*, __m512i acc) KILN_CPU_LAMBDA {
                             return w.scales[j] * static_cast<float>(_mm512_reduce_add_epi32(acc));
                           });
}

// The variant's row of the selection table (config.cpp), with its products for Vnni.
template <bool Vnni>
constexpr Qd8GemmVariant avx512_variant(const char* name) {
  return {name, Isa::Avx512, Vnni, by_row_blocks<Avx512<Vnni>, Qb4wWeights>, by_row_blocks<Avx512<Vnni>, Qc8wWeights>,
          qb4w_panels_avx512<Vnni>};
}

}  // namespace
}  // namespace kiln::cpu
