// qd8 x qb4w / qc8w, x86-64-v4 (AVX-512 F/BW/DQ/VL), products by vpmaddubsw + vpmaddwd.
// The whole file is compiled for the ISA (its helpers have internal linkage).
#include "../isa.h"
#ifdef KILN_CPU_X86
KILN_CPU_TARGET_BEGIN("arch=x86-64-v4")
#include "qd8-gemm-avx512.h"

namespace kiln::cpu {

void qd8_qb4w_gemm__avx512(const Qd8Rows& a, int64_t m, int64_t k, const Qb4wWeights& w, int64_t n0, int64_t n1,
                           const float* bias, float* y, int64_t ldy, float lo, float hi) {
  qb4w_avx512<false>(a, m, k, w, n0, n1, bias, y, ldy, lo, hi);
}

void qd8_qc8w_gemm__avx512(const Qd8Rows& a, int64_t m, int64_t k, const Qc8wWeights& w, int64_t n0, int64_t n1,
                           const float* bias, float* y, int64_t ldy, float lo, float hi) {
  qc8w_avx512<false>(a, m, k, w, n0, n1, bias, y, ldy, lo, hi);
}

void qd8_qb4w_panels__avx512(const Qd8Rows& a, int64_t m, int64_t k, const Qb4wPanels& w, int64_t n, int64_t p0, int64_t p1,
                             const float* bias, float* y, int64_t ldy, float lo, float hi) {
  qb4w_panels_avx512<false>(a, m, k, w, n, p0, p1, bias, y, ldy, lo, hi);
}

}  // namespace kiln::cpu
KILN_CPU_TARGET_END
#endif
