// f32-gemm, 8 x 8 register tile (8 rows x 2 vectors of 4), AArch64 NEON with FMA.
// AArch64 has 32 vector registers (the generic 6x8 tile is sized for SSE2's 16):
// 16 accumulators, 2 B vectors and the 8 A values of one k, with no spills (GCC folds
// each A value into the by-element form of FMLA; an 8 x 12 tile needs 35 registers and
// spills three accumulators per k). Per k: 2 B loads and 8 A loads feed 16 FMAs.
// KC = 1024: the packed 8-wide B panel is 32 KiB (the Cortex-A76 has 64 KiB of L1D).
#include "../ukernels.h"
#include "f32-gemm.h"

#ifdef KILN_CPU_ARM64
namespace kiln::cpu {

void f32_gemm_8x8__neon(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda, const float* b,
                        int64_t ldb, bool accumulate, float* c, int64_t ldc) {
  f32_gemm_blocked<8, 2, VecOf<16>::type, 1024>(m, n, k, alpha, a, lda, b, ldb, accumulate, c, ldc);
}

void f32_gemm_8x8__neon_bt(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda, const float* b,
    int64_t ldb, bool accumulate, float* c, int64_t ldc) {
  f32_gemm_blocked<8, 2, VecOf<16>::type, 1024, true>(m, n, k, alpha, a, lda, b, ldb, accumulate, c, ldc);
}

void f32_gemm_8x8__neon_packed(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
    const float* b, int64_t ldb, bool accumulate, float* c, int64_t ldc) {
  f32_gemm_blocked<8, 2, VecOf<16>::type, 1024, kPanelsB>(m, n, k, alpha, a, lda, b, ldb, accumulate, c, ldc);
}

}  // namespace kiln::cpu
#endif
