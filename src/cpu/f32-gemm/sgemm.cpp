// kiln::cpu::sgemm: the f32-gemm family's front door. The degenerate sizes are
// handled here, the same on every path; the variant (config.cpp) does the rest.
#include "kiln/cpu/gemm.h"

#include <cstring>

namespace kiln::cpu {
namespace {

// false when there is nothing more to do
bool sgemm_needs_work(int64_t m, int64_t n, int64_t k, bool accumulate, float* c, int64_t ldc) {
  if (m <= 0 || n <= 0) return false;
  if (k <= 0) {
    if (!accumulate)
      for (int64_t i = 0; i < m; ++i) std::memset(c + i * ldc, 0, sizeof(float) * static_cast<size_t>(n));
    return false;
  }
  return true;
}

}  // namespace

void sgemm(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda, const float* b, int64_t ldb,
           bool accumulate, float* c, int64_t ldc) {
  if (sgemm_needs_work(m, n, k, accumulate, c, ldc))
    f32_gemm_config().gemm(m, n, k, alpha, a, lda, b, ldb, accumulate, c, ldc);
}

// `fn` (gemm or gemm_bt) of the variant for `isa`; false when this build or CPU lacks it.
static bool run_variant(SgemmIsa isa, F32GemmFn F32GemmVariant::*fn, int64_t m, int64_t n, int64_t k, float alpha,
                        const float* a, int64_t lda, const float* b, int64_t ldb, bool accumulate, float* c,
                        int64_t ldc) {
  if (!isa_supported(isa)) return false;
  for (const F32GemmVariant& v : f32_gemm_variants())
    if (v.isa == isa && f32_gemm_for_this_cpu(v)) {
      if (sgemm_needs_work(m, n, k, accumulate, c, ldc)) (v.*fn)(m, n, k, alpha, a, lda, b, ldb, accumulate, c, ldc);
      return true;
    }
  return false;
}

bool sgemm_with(SgemmIsa isa, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                const float* b, int64_t ldb, bool accumulate, float* c, int64_t ldc) {
  return run_variant(isa, &F32GemmVariant::gemm, m, n, k, alpha, a, lda, b, ldb, accumulate, c, ldc);
}

void sgemm_bt(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda, const float* b, int64_t ldb,
              bool accumulate, float* c, int64_t ldc) {
  if (sgemm_needs_work(m, n, k, accumulate, c, ldc))
    f32_gemm_config().gemm_bt(m, n, k, alpha, a, lda, b, ldb, accumulate, c, ldc);
}

bool sgemm_bt_with(SgemmIsa isa, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                   const float* b, int64_t ldb, bool accumulate, float* c, int64_t ldc) {
  return run_variant(isa, &F32GemmVariant::gemm_bt, m, n, k, alpha, a, lda, b, ldb, accumulate, c, ldc);
}

SgemmIsa sgemm_isa() { return f32_gemm_config().isa; }

}  // namespace kiln::cpu
