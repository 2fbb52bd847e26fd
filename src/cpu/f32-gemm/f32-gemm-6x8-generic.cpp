// f32-gemm, 6 x 8 register tile (6 rows x 2 vectors of 4), baseline ISA
// (SSE2 on x86-64, NEON on AArch64: 16 vector registers, 12 accumulators).
// KC = 1024: the packed 8-wide B panel is 32 KiB (L1).
#include "../ukernels.h"
#include "f32-gemm.h"

namespace kiln::cpu {

void f32_gemm_6x8__generic(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                           const float* b, int64_t ldb, bool accumulate, float* c, int64_t ldc) {
  f32_gemm_blocked<6, 2, VecOf<16>::type>(m, n, k, alpha, a, lda, b, ldb, accumulate, c, ldc);
}

void f32_gemm_6x8__generic_bt(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda, const float* b,
    int64_t ldb, bool accumulate, float* c, int64_t ldc) {
  f32_gemm_blocked<6, 2, VecOf<16>::type, 32 * 1024 / (2 * 16), true>(m, n, k, alpha, a, lda, b, ldb, accumulate, c, ldc);
}

void f32_gemm_6x8__generic_packed(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
    const float* b, int64_t ldb, bool accumulate, float* c, int64_t ldc) {
  f32_gemm_blocked<6, 2, VecOf<16>::type, 32 * 1024 / (2 * 16), kPanelsB>(m, n, k, alpha, a, lda, b, ldb, accumulate, c, ldc);
}

}  // namespace kiln::cpu
