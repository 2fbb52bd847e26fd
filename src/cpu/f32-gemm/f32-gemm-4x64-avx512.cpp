// f32-gemm, 4 x 64 register tile (4 rows x 4 vectors of 16), AVX-512F + FMA
// (32 zmm registers: 16 accumulators, 4 B vectors, one broadcast).
// KC = 768: the 192 KiB B panel sits in L2, which feeds it fast enough, and C is
// revisited less: GPT-2's K = 768 layers accumulate in one pass. Measured on the
// AVX-512 machine against KC = 128/192/256/384: 2-5% faster (bench/kernels/gemm_bench.cpp).
#include "../ukernels.h"
#include "f32-gemm.h"

#ifdef KILN_CPU_X86
namespace kiln::cpu {

__attribute__((target("avx512f,fma"))) void f32_gemm_4x64__avx512(int64_t m, int64_t n, int64_t k, float alpha,
                                                                   const float* a, int64_t lda, const float* b,
                                                                   int64_t ldb, bool accumulate, float* c,
                                                                   int64_t ldc) {
  f32_gemm_blocked<4, 4, VecOf<64>::type, 768>(m, n, k, alpha, a, lda, b, ldb, accumulate, c, ldc);
}

__attribute__((target("avx512f,fma"))) void f32_gemm_4x64__avx512_bt(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda, const float* b,
    int64_t ldb, bool accumulate, float* c, int64_t ldc) {
  f32_gemm_blocked<4, 4, VecOf<64>::type, 768, true>(m, n, k, alpha, a, lda, b, ldb, accumulate, c, ldc);
}

__attribute__((target("avx512f,fma"))) void f32_gemm_4x64__avx512_packed(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
    const float* b, int64_t ldb, bool accumulate, float* c, int64_t ldc) {
  f32_gemm_blocked<4, 4, VecOf<64>::type, 768, kPanelsB>(m, n, k, alpha, a, lda, b, ldb, accumulate, c, ldc);
}

}  // namespace kiln::cpu
#endif
