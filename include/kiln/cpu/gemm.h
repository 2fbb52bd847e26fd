// Internal: kiln's fp32 matrix multiply core (mm, bmm, addmm and any kernel or
// backend that needs a GEMM). Cache-blocked and register-tiled; the widest
// vector code the CPU runs (AVX-512, AVX2+FMA, or the baseline ISA) is chosen
// once at run time. Allocates nothing; it packs B panels in 64 KiB of stack.
#pragma once

#include <cstdint>

namespace kiln::cpu {

// C[m, n] = alpha * A[m, k] · B[k, n] + (accumulate ? C : 0), all row-major with
// leading dimensions (row strides, in elements) lda, ldb, ldc. C must not alias A or B.
void sgemm(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda, const float* b, int64_t ldb,
           bool accumulate, float* c, int64_t ldc);

// The vector code paths of sgemm; sgemm runs the widest this CPU supports.
enum class SgemmIsa : uint8_t { Generic, Avx2, Avx512 };

SgemmIsa sgemm_isa();
const char* sgemm_isa_name(SgemmIsa isa);  // "generic", "avx2", "avx512"

// sgemm on one given code path (benchmarks, cross-checks); false, computing
// nothing, when this build or CPU lacks it.
bool sgemm_with(SgemmIsa isa, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                const float* b, int64_t ldb, bool accumulate, float* c, int64_t ldc);

}  // namespace kiln::cpu
