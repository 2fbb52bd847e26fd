// f32-gemm, 4 x 24 register tile (4 rows x 3 vectors of 8), AVX2 + FMA
// (16 ymm registers: 12 accumulators, 3 B vectors, one broadcast; per k, 7 loads
// for 12 FMAs against 6x16's 8, and M = 128 and GPT-2's N are multiples of 4 and
// 24, so no tile runs part empty). KC = 256: the packed 24-wide B panel is 24 KiB,
// inside Zen 3's 32 KiB L1. Measured on Zen 3 against 6x16/KC 512 (GPT-2 small's
// seq_len 128 shapes, one thread): 61-78 GFLOP/s against 46-70 (bench/RESULTS.md).
#include "../ukernels.h"
#include "f32-gemm.h"
#include "fma-probe.h"

#ifdef KILN_CPU_X86
namespace kiln::cpu {

__attribute__((target("avx2,fma"))) void f32_gemm_4x24__avx2(int64_t m, int64_t n, int64_t k, float alpha,
                                                              const float* a, int64_t lda, const float* b,
                                                              int64_t ldb, bool accumulate, float* c, int64_t ldc) {
  f32_gemm_blocked<4, 3, VecOf<32>::type, 256>(m, n, k, alpha, a, lda, b, ldb, accumulate, c, ldc);
}

__attribute__((target("avx2,fma"))) void f32_gemm_4x24__avx2_bt(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda, const float* b,
    int64_t ldb, bool accumulate, float* c, int64_t ldc) {
  f32_gemm_blocked<4, 3, VecOf<32>::type, 256, true>(m, n, k, alpha, a, lda, b, ldb, accumulate, c, ldc);
}

__attribute__((target("avx2,fma"))) void f32_gemm_4x24__avx2_packed(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
    const float* b, int64_t ldb, bool accumulate, float* c, int64_t ldc) {
  f32_gemm_blocked<4, 3, VecOf<32>::type, 256, kPanelsB>(m, n, k, alpha, a, lda, b, ldb, accumulate, c, ldc);
}

__attribute__((target("avx2,fma"))) double f32_fma_probe__avx2(long rounds) {
  return fma_probe<VecOf<32>::type>(rounds);
}

}  // namespace kiln::cpu
#endif
