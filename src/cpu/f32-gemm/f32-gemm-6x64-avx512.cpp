// f32-gemm, 6 x 64 register tile (6 rows x 4 vectors of 16: 24 accumulators, 4 B vectors, one broadcast),
// AVX-512F, written with intrinsics, for cores with two full-width FMA pipes (Intel's server cores:
// f32_gemm_config() picks it when the measured 512-bit FMA rate is about twice the 256-bit one, see
// config.cpp). KC = 128: the 32 KiB B panel stays in L1 while every 6-row tile of A sweeps it.
//
// Why not the vector-extension template's tile (f32-gemm.h's micro_tile)? GCC 12 allocates its 4 x 64
// tile with one B vector spilled to the stack and reloaded by four FMAs per k, and a 6 x 64 tile worse; on
// a Xeon (AVX-512 FP16, AMX) that ran GPT-2's shapes at 46-55% of the FMA peak. The same loop over
// __m512 values keeps all 24 accumulators in registers (bench/RESULTS.md, issue 42).
#include "../ukernels.h"
#include "f32-gemm.h"
#include "fma-probe.h"

#ifdef KILN_CPU_X86
#include "../avx512-intrinsics.h"

namespace kiln::cpu {
namespace {

template <int MR, int NV>
struct TileAvx512 {
  static constexpr int NR = NV * 16;
  static constexpr bool kInterleavedPrefetch = true;
  // A function of its own (not inlined: the template that calls it is built for the baseline ISA until it is
  // inlined into the variant); one call per 6 x 64 x KC block of products. `pf`: lines to prefetch into L2,
  // one a trip of the k loop while they last, the rest after it.
  __attribute__((target("avx512f,fma"), noinline)) static void run(int64_t kc, const float* a, int64_t lda, int64_t mr, const float* bp, float* c,
                                  int64_t ldc, int64_t nr, float alpha, bool load_c, const PrefetchLines* pf = nullptr) {
    int p2 = 0;
    const int n2 = pf ? pf->n2 : 0;
    const float* ar[MR];
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) ar[i] = a + (i < mr ? i : mr - 1) * lda;  // rows past mr repeat the last one
    __m512 acc[MR][NV];
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
      for (int j = 0; j < NV; ++j) acc[i][j] = _mm512_setzero_ps();
    int64_t k = 0;
    const int64_t k2 = kc & ~int64_t{1};
    for (;;) {  // two steps a trip (fewer loop instructions among the FMAs), then an odd last one
      const int64_t steps = k < k2 ? 2 : k < kc ? 1 : 0;
      if (steps == 0) break;
      if (p2 < n2) __builtin_prefetch(pf->l2[p2++], 0, 2);
#pragma GCC unroll 2
      for (int64_t u = 0; u < 2; ++u) {
      if (u == steps) break;
      __m512 b[NV];
#pragma GCC unroll 4
      for (int j = 0; j < NV; ++j) b[j] = _mm512_loadu_ps(bp + k * NR + j * 16);  // packed panels need not be aligned
#pragma GCC unroll 8
      for (int i = 0; i < MR; ++i) {
        const __m512 av = _mm512_set1_ps(ar[i][k]);
#pragma GCC unroll 4
        for (int j = 0; j < NV; ++j) acc[i][j] = _mm512_fmadd_ps(av, b[j], acc[i][j]);
      }
      ++k;
      }
    }
    for (; p2 < n2; ++p2) __builtin_prefetch(pf->l2[p2], 0, 2);
    // The store, unrolled whole (a loop with a run-time bound would send the accumulators through memory):
    // columns under a mask where nr < NR, rows past mr skipped; alpha * acc + C in one rounding, as the
    // template's tile compiles (GCC contracts it).
    const __m512 va = _mm512_set1_ps(alpha);
    __mmask16 cols[NV];
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j) {
      const int64_t left = nr - j * 16;
      cols[j] = left >= 16 ? static_cast<__mmask16>(0xffff) : left <= 0 ? 0 : static_cast<__mmask16>((1u << left) - 1);
    }
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
      for (int j = 0; j < NV; ++j) {
        const __mmask16 mask = i < mr ? cols[j] : 0;
        float* p = c + i * ldc + j * 16;
        if (mask == 0xffff) {
          _mm512_storeu_ps(p, load_c ? _mm512_fmadd_ps(acc[i][j], va, _mm512_loadu_ps(p)) : _mm512_mul_ps(acc[i][j], va));
        } else if (mask != 0) {
          _mm512_mask_storeu_ps(p, mask, load_c ? _mm512_fmadd_ps(acc[i][j], va, _mm512_maskz_loadu_ps(mask, p))
                                              : _mm512_mul_ps(acc[i][j], va));
        }
      }
  }
};

using V16 = VecOf<64>::type;

}  // namespace


__attribute__((target("avx512f,fma"))) void f32_gemm_6x64__avx512(int64_t m, int64_t n, int64_t k, float alpha,
                                                                   const float* a, int64_t lda, const float* b,
                                                                   int64_t ldb, bool accumulate, float* c,
                                                                   int64_t ldc) {
  f32_gemm_blocked<6, 4, V16, 128, kRowsB, TileAvx512<6, 4>>(m, n, k, alpha, a, lda, b, ldb, accumulate, c, ldc);
}

__attribute__((target("avx512f,fma"))) void f32_gemm_6x64__avx512_bt(int64_t m, int64_t n, int64_t k, float alpha,
                                                                      const float* a, int64_t lda, const float* b,
                                                                      int64_t ldb, bool accumulate, float* c,
                                                                      int64_t ldc) {
  f32_gemm_blocked<6, 4, V16, 128, kTransposedB, TileAvx512<6, 4>>(m, n, k, alpha, a, lda, b, ldb, accumulate, c, ldc);
}

__attribute__((target("avx512f,fma"))) void f32_gemm_6x64__avx512_packed(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
    const float* b, int64_t ldb, bool accumulate, float* c, int64_t ldc) {
  f32_gemm_blocked<6, 4, V16, 128, kPanelsB, TileAvx512<6, 4>>(m, n, k, alpha, a, lda, b, ldb, accumulate, c, ldc);
}

__attribute__((target("avx512f,fma"))) double f32_fma_probe__avx512(long rounds) {
  return fma_probe<V16>(rounds);
}

}  // namespace kiln::cpu
#endif
