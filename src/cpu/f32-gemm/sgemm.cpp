// kiln::cpu::sgemm: the f32-gemm family's front door. The degenerate sizes are
// handled here, the same on every path; the variant (config.cpp) does the rest.
#include "kiln/cpu/gemm.h"

#include <algorithm>
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

bool sgemm_pack_once() { return f32_gemm_config().pack_once; }

int64_t sgemm_panel_width() { return f32_gemm_config().nr; }

int64_t sgemm_packed_floats(int64_t k, int64_t n) {
  const int64_t nr = sgemm_panel_width();
  return (n + nr - 1) / nr * nr * k;
}

void sgemm_pack_b_width(int64_t nr, int64_t k, int64_t n, const float* b, int64_t ldb, bool transposed,
                        float* packed) {
  for (int64_t j = 0; j < n; j += nr) {  // panel j: k rows of nr floats at packed + j * k
    const int64_t w = std::min(nr, n - j);
    float* out = packed + j * k;
    if (!transposed) {
      for (int64_t p = 0; p < k; ++p) {
        std::memcpy(out + p * nr, b + p * ldb + j, sizeof(float) * static_cast<size_t>(w));
        std::memset(out + p * nr + w, 0, sizeof(float) * static_cast<size_t>(nr - w));
      }
      continue;
    }
    if (w < nr)
      for (int64_t p = 0; p < k; ++p) std::memset(out + p * nr + w, 0, sizeof(float) * static_cast<size_t>(nr - w));
    int64_t q = 0;
    for (; q + 8 <= w; q += 8) {  // eight rows of Bᵀ at a time: eight streams, written as 32 contiguous bytes
      const float* r = b + (j + q) * ldb;
      for (int64_t p = 0; p < k; ++p) {
        float* o = out + p * nr + q;
        for (int64_t e = 0; e < 8; ++e) o[e] = r[e * ldb + p];
      }
    }
    for (; q < w; ++q)
      for (int64_t p = 0; p < k; ++p) out[p * nr + q] = b[(j + q) * ldb + p];
  }
}

void sgemm_pack_b(int64_t k, int64_t n, const float* b, int64_t ldb, bool transposed, float* packed) {
  sgemm_pack_b_width(sgemm_panel_width(), k, n, b, ldb, transposed, packed);
}

void sgemm_packed(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda, const float* packed,
                  bool accumulate, float* c, int64_t ldc, bool b_streams) {
  if (sgemm_needs_work(m, n, k, accumulate, c, ldc))
    f32_gemm_config().gemm_packed(m, n, k, alpha, a, lda, packed, b_streams ? 1 : 0, accumulate, c, ldc);
}

SgemmIsa sgemm_isa() { return f32_gemm_config().isa; }

}  // namespace kiln::cpu
