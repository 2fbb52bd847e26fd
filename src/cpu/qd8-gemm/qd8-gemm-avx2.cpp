// qd8 x qb4w / qc8w, x86-64-v3 (AVX2 + FMA): products by vpmaddubsw + vpmaddwd
// (int4 weights), or bytes widened to 16 bits + vpmaddwd (int8 weights, exact).
// The whole file is compiled for the ISA (its helpers have internal linkage).
#include "../ukernels.h"  // (before the target pragma: declarations only)
#ifdef KILN_CPU_X86
KILN_CPU_TARGET_BEGIN("arch=x86-64-v3")
#include "kiln/cpu/quant.h"
#include "qd8-gemm-rows.h"

#include <immintrin.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace kiln::cpu {
namespace {

inline float bf16f(uint16_t b) { return _mm_cvtss_f32(_mm_castsi128_ps(_mm_cvtsi32_si128(static_cast<int>(b) << 16))); }

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline int32_t hsum_i32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
  return _mm_cvtsi128_si32(s);
}

// 32 weight bytes (64 inputs: 32 even in the low nibbles, 32 odd in the high);
// a partial last block is copied into a zeroed buffer first.
inline __m256i load_w(const uint8_t* p, int64_t rem) {
  if (rem >= 32) return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  alignas(32) uint8_t buf[32] = {};
  for (int64_t i = 0; i < rem; ++i) buf[i] = p[i];
  return _mm256_load_si256(reinterpret_cast<const __m256i*>(buf));
}

// The tag of the AVX2 block kernels (by_row_blocks).
struct Avx2 {};

template <int MR>
inline void block_rows(Avx2, RowBlock<MR>, const Qd8Rows& a, int64_t m0, int64_t k, const Qb4wWeights& w, int64_t n0,
                       int64_t n1, const float* bias, float* y, int64_t ldy, float lo, float hi) {
  const int64_t ldw = (k + 1) / 2, G = w.group, groups = k / G, chunks = (k + 127) / 128;
  const __m256i low4 = _mm256_set1_epi8(0x0f), eight = _mm256_set1_epi8(8), ones = _mm256_set1_epi16(1);
  auto accumulate = [&](int64_t j, const uint8_t* const (&arow)[MR], __m256 (&f)[MR]) KILN_CPU_LAMBDA {
    const auto [wr, sr] = qb4w_row(w, k, j);
    for (int64_t c = 0; c < chunks; ++c) {
      for (int h = 0; h < 2; ++h) {  // half h: inputs 64h .. 64h+63 of the chunk
        const int64_t rem = ldw - c * 64 - h * 32;
        if (rem <= 0) break;
        const __m256i bytes = load_w(wr + c * 64 + h * 32, rem);
        const __m256i wl = _mm256_sub_epi8(_mm256_and_si256(bytes, low4), eight);
        const __m256i wh = _mm256_sub_epi8(_mm256_and_si256(_mm256_srli_epi16(bytes, 4), low4), eight);
        // lane j (of 8) holds inputs 64h + 8j .. +7: with groups of 32 the first
        // four lanes are one group and the last four the next
        const int64_t g0 = (c * 128 + h * 64) / G;
        const float s0 = bf16f(sr[g0]);
        const float s1 = G == 32 && g0 + 1 < groups ? bf16f(sr[g0 + 1]) : s0;
        const __m256 sv = _mm256_setr_ps(s0, s0, s0, s0, s1, s1, s1, s1);
        #pragma GCC unroll 8
        for (int r = 0; r < MR; ++r) {
          const uint8_t* ar = arow[r] + c * 128 + h * 32;
          const __m256i pe = _mm256_maddubs_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(ar)), wl);
          const __m256i po = _mm256_maddubs_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(ar + 64)), wh);
          const __m256i acc = _mm256_madd_epi16(_mm256_add_epi16(pe, po), ones);
          f[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc), sv, f[r]);
        }
      }
    }
  };
  for_outputs<MR, __m256>(a, m0, n0, n1, w.sums, bias, y, ldy, lo, hi, 0, accumulate,
                          [](int64_t, const uint8_t*, __m256 f) KILN_CPU_LAMBDA { return hsum(f); });
}

template <int MR>
inline void block_rows(Avx2, RowBlock<MR>, const Qd8Rows& a, int64_t m0, int64_t k, const Qc8wWeights& w, int64_t n0,
                       int64_t n1, const float* bias, float* y, int64_t ldy, float lo, float hi) {
  const int64_t k16 = k / 16 * 16;
  auto accumulate = [&](int64_t j, const uint8_t* const (&arow)[MR], __m256i (&acc)[MR]) KILN_CPU_LAMBDA {
    const int8_t* wr = w.data + j * k;
    for (int64_t i = 0; i < k16; i += 16) {
      const __m256i wv = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(wr + i)));
      #pragma GCC unroll 8
      for (int r = 0; r < MR; ++r) {
        const __m256i av = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(arow[r] + i)));
        acc[r] = _mm256_add_epi32(acc[r], _mm256_madd_epi16(av, wv));
      }
    }
  };
  for_outputs<MR, __m256i>(a, m0, n0, n1, w.sums, bias, y, ldy, lo, hi, 0, accumulate,
                           [&](int64_t j, const uint8_t* ar, __m256i acc) KILN_CPU_LAMBDA {
                             const int8_t* wr = w.data + j * k;
                             int32_t dot = hsum_i32(acc);
                             for (int64_t i = k16; i < k; ++i) dot += static_cast<int32_t>(ar[i]) * wr[i];
                             return w.scales[j] * static_cast<float>(dot);
                           });
}

// qb4w panels (kiln/cpu/quant.h), Signed rows, AVX2: a panel step is 128 bytes, four 256-bit
// vectors of 8 outputs each (outputs 8v .. 8v + 7 of the panel, byte b of an output's 4 holding
// inputs b and 4 + b). One row takes the whole panel (V = 4 vectors: 4 accumulators, the panel
// read once, in order); two rows take half a panel at a time (V = 2, at vector 2h: what 16 ymm
// registers hold). The low- and high-nibble products of a step meet in 16 bits, and so do the
// four steps' of 32 inputs (each step's at most 2 * 2 * 15 * 128 = 7680, four 30720 < 2^15)
// before vpmaddwd widens them: one widening per 32 inputs, not per 8 (it shares the multiplier
// pipe), and no 32-bit sums between the 16-bit ones and the float ones (no spills).
inline __m256i bcast4(const int8_t* p) {
  int32_t v;
  __builtin_memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}

constexpr int64_t kPrefetchAhead = 1024;  // bytes: 8 steps of a panel (2048 measured no better)

template <int MR, int V>
inline void qb4w_panel_part(const Qd8Rows& a, int64_t m0, int64_t k, const Qb4wPanels& w, int64_t n, int64_t p, int h,
                            const float* bias, float* y, int64_t ldy, float lo, float hi) {
  static_assert(V == 2 || V == 4);
  const int64_t G = w.group, groups = k / G, steps = G / 8, per_group = G / 32, gbytes = steps * 128 + 64;
  const __m256i low4 = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1);
  const int8_t* arow[MR];
  const int32_t* srow[MR];
  signed_rows(a, m0, arow, srow);
  const int v0 = V == 4 ? 0 : 2 * h;  // the first vector (of 4) this part reads
  const uint8_t* panel = w.data + static_cast<size_t>(p) * qb4w_panel_bytes(k, G);
  __m256 f[MR][V];
  #pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
    #pragma GCC unroll 4
    for (int q = 0; q < V; ++q) f[r][q] = _mm256_setzero_ps();
  // Per 32 inputs (four steps: the 16-bit sums' bound), widen, take off 8 x (the rows' sum of q
  // over those inputs: what the + 8 of the nibbles added) and scale into the float sums. The
  // registers: V x MR float sums, V x MR 16-bit sums, the rows' inputs and a step's vector.
  for (int64_t g = 0; g < groups; ++g) {
    const uint8_t* gp = panel + g * gbytes;
    const uint8_t* sp = gp + steps * 128 + 16 * v0;  // the group's 32 scales follow its steps
    for (int64_t c = 0; c < per_group; ++c) {
      __m256i s16[MR][V];
      #pragma GCC unroll 8
      for (int r = 0; r < MR; ++r)
        #pragma GCC unroll 4
        for (int q = 0; q < V; ++q) s16[r][q] = _mm256_setzero_si256();
      #pragma GCC unroll 4
      for (int t = 0; t < 4; ++t) {
        const uint8_t* wp = gp + (4 * c + t) * 128 + 32 * v0;
        // The first (or only) part's pass asks for both lines of a step ahead, so the stream
        // arrives in order (and the second half's pass finds its lines in cache).
        if (v0 == 0) {
          _mm_prefetch(reinterpret_cast<const char*>(wp) + kPrefetchAhead, _MM_HINT_T0);
          _mm_prefetch(reinterpret_cast<const char*>(wp) + kPrefetchAhead + 64, _MM_HINT_T0);
        }
        __m256i xl[MR], xu[MR];
        #pragma GCC unroll 8
        for (int r = 0; r < MR; ++r) {
          const int8_t* x = arow[r] + g * G + 32 * c + 8 * t;
          xl[r] = bcast4(x);
          xu[r] = bcast4(x + 4);
        }
        #pragma GCC unroll 4
        for (int q = 0; q < V; ++q) {
          const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wp + 32 * q));
          const __m256i l = _mm256_and_si256(v, low4), u = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
          #pragma GCC unroll 8
          for (int r = 0; r < MR; ++r) {
            s16[r][q] = _mm256_add_epi16(
                s16[r][q], _mm256_add_epi16(_mm256_maddubs_epi16(l, xl[r]), _mm256_maddubs_epi16(u, xu[r])));
            // each step's sum now: GCC otherwise reassociates the four steps' integer sums into a tree
            // over all 32 products of the 32 inputs, which spills most of them to the stack
            __asm__("" : "+x"(s16[r][q]));
          }
        }
      }
      #pragma GCC unroll 4
      for (int q = 0; q < V; ++q) {
        const __m128i sb = _mm_loadu_si128(reinterpret_cast<const __m128i*>(sp + 16 * q));
        const __m256 sc = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(sb), 16));
        #pragma GCC unroll 8
        for (int r = 0; r < MR; ++r) {
          const __m256i d = _mm256_sub_epi32(_mm256_madd_epi16(s16[r][q], ones),
                                             _mm256_set1_epi32(8 * srow[r][g * per_group + c]));
          f[r][q] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d), sc, f[r][q]);
        }
      }
    }
  }
  const __m256i iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  #pragma GCC unroll 4
  for (int q = 0; q < V; ++q) {
    const int64_t j0 = p * kQb4wPanel + 8 * (v0 + q), left = n - j0;
    if (left <= 0) break;
    const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int32_t>(left < 8 ? left : 8)), iota);
    const __m256 sums = _mm256_maskload_ps(w.sums + j0, mask);
    const __m256 b = bias ? _mm256_maskload_ps(bias + j0, mask) : _mm256_setzero_ps();
    #pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      const __m256 t = _mm256_fnmadd_ps(_mm256_set1_ps(static_cast<float>(a.zp[m0 + r])), sums, f[r][q]);
      __m256 v = _mm256_fmadd_ps(_mm256_set1_ps(a.scale[m0 + r]), t, b);
      v = _mm256_min_ps(_mm256_max_ps(v, _mm256_set1_ps(lo)), _mm256_set1_ps(hi));
      _mm256_maskstore_ps(y + (m0 + r) * ldy + j0, mask, v);
    }
  }
}

void qb4w_panels_avx2(const Qd8Rows& a, int64_t m, int64_t k, const Qb4wPanels& w, int64_t n, int64_t p0, int64_t p1,
                      const float* bias, float* y, int64_t ldy, float lo, float hi) {
  // Panels in chunks of ~128 KB that stay in L2 while every pair of rows passes over them (as the
  // AVX-512 body: a pair's stores are then contiguous runs, not rows ldy apart).
  const int64_t chunk = static_cast<int64_t>(std::max<size_t>(1, (size_t{128} << 10) / qb4w_panel_bytes(k, w.group)));
  for (int64_t c0 = p0; c0 < p1; c0 += chunk) {
    const int64_t c1 = std::min(p1, c0 + chunk);
    for (int64_t m0 = 0; m0 < m; m0 += 2)
      for (int64_t p = c0; p < c1; ++p) {
        if (m0 + 2 > m) {
          qb4w_panel_part<1, 4>(a, m0, k, w, n, p, 0, bias, y, ldy, lo, hi);
          continue;
        }
        for (int h = 0; h < 2 && p * kQb4wPanel + 16 * h < n; ++h)
          qb4w_panel_part<2, 2>(a, m0, k, w, n, p, h, bias, y, ldy, lo, hi);
      }
  }
}

}  // namespace

const Qd8GemmVariant qd8_gemm__avx2{"qd8_gemm__avx2", Isa::Avx2, false, by_row_blocks<Avx2, Qb4wWeights>,
                                    by_row_blocks<Avx2, Qc8wWeights>, qb4w_panels_avx2};

}  // namespace kiln::cpu
KILN_CPU_TARGET_END
#endif
