// f32-gemm, 6 x 16 register tile (6 rows x 2 vectors of 8), AVX2 + FMA
// (16 ymm registers: 12 accumulators, 2 B vectors, one broadcast).
// KC = 512: the packed 16-wide B panel is 32 KiB (L1).
#include "../ukernels.h"
#include "f32-gemm.h"

#ifdef KILN_CPU_X86
namespace kiln::cpu {

__attribute__((target("avx2,fma"))) void f32_gemm_6x16__avx2(int64_t m, int64_t n, int64_t k, float alpha,
                                                              const float* a, int64_t lda, const float* b,
                                                              int64_t ldb, bool accumulate, float* c, int64_t ldc) {
  f32_gemm_blocked<6, 2, VecOf<32>::type>(m, n, k, alpha, a, lda, b, ldb, accumulate, c, ldc);
}

}  // namespace kiln::cpu
#endif
