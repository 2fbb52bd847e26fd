// Per-row int8 activation quantization with AVX-512, for the Plain and Signed layouts
// (qd8_quantize_rows calls it when the selected qd8 variant is an AVX-512 one). The same
// operations as the generic loop in qd8-gemm-generic.cpp, element for element, so the
// bytes, scale and zero point are identical (tests/cpu/qd8_gemm_test.cpp checks them
// against the reference quantizer's formulas):
//   min / max: vminps / vmaxps with the running value second (a NaN input is ignored, as
//   std::min / std::max ignore it in second place; a -0 gives +0, as std::min(+0, -0));
//   q = clamp(round-half-even(x * (1 / s)) + z, -128, 127): vmulps, vrndscaleps, vaddps,
//   vmaxps / vminps.
// The whole file is compiled for the ISA: it uses no inline function from a header
// other than the intrinsics (no std::min, std::memset: a copy of those built for
// AVX-512 could be the one the linker keeps for baseline callers), and its helpers
// have internal linkage.
#include "../ukernels.h"  // (before the target pragma: declarations only)

#include <cfloat>

#ifdef KILN_CPU_X86
KILN_CPU_TARGET_BEGIN("arch=x86-64-v4")
#include "../avx512-intrinsics.h"

namespace kiln::cpu {
namespace {

// std::max and std::clamp, written out (the same comparisons)
inline float max_of(float a, float b) { return a < b ? b : a; }
inline float clamp_to(float v, float lo, float hi) { return v < lo ? lo : (hi < v ? hi : v); }

inline __mmask16 tail_mask(int64_t left) {
  return left >= 16 ? __mmask16{0xffff} : static_cast<__mmask16>((1u << left) - 1);
}

}  // namespace

void qd8_quantize_row__avx512(const float* x, int64_t k, bool signed_rows, uint8_t* dst, int64_t row_bytes,
                              float* scale, int32_t* zp, int32_t* sums) {
  __m512 vlo = _mm512_setzero_ps(), vhi = _mm512_setzero_ps();
  for (int64_t i = 0; i < k; i += 16) {
    const __m512 v = _mm512_maskz_loadu_ps(tail_mask(k - i), x + i);  // masked lanes read 0: min/max start at 0
    vlo = _mm512_min_ps(v, vlo);
    vhi = _mm512_max_ps(v, vhi);
  }
  const float lo = _mm512_reduce_min_ps(vlo), hi = _mm512_reduce_max_ps(vhi);
  const float s = max_of((hi - lo) / 255.0f, FLT_MIN);
  const float z = clamp_to(-128.0f - __builtin_nearbyintf(lo / s), -128.0f, 127.0f);
  const float inv = 1.0f / s;
  const __m512 vinv = _mm512_set1_ps(inv), vz = _mm512_set1_ps(z);
  const __m512 qmin = _mm512_set1_ps(-128.0f), qmax = _mm512_set1_ps(127.0f);
  const __m512i off = _mm512_set1_epi32(signed_rows ? 0 : 128);
  __builtin_memset(dst, 0, static_cast<size_t>(row_bytes));
  for (int64_t i = 0; i < k; i += 32) {  // 32 inputs: one sum of a Signed row
    int32_t total = 0;
    for (int64_t h = i; h < k && h < i + 32; h += 16) {
      const __mmask16 mask = tail_mask(k - h);
      const __m512 v = _mm512_maskz_loadu_ps(mask, x + h);
      const __m512 r = _mm512_roundscale_ps(_mm512_mul_ps(v, vinv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      const __m512 c = _mm512_min_ps(_mm512_max_ps(_mm512_add_ps(r, vz), qmin), qmax);
      const __m512i q = _mm512_maskz_mov_epi32(mask, _mm512_cvtps_epi32(c));
      if (signed_rows) total += _mm512_reduce_add_epi32(q);
      _mm_mask_storeu_epi8(dst + h, mask, _mm512_cvtepi32_epi8(_mm512_add_epi32(q, off)));
    }
    if (signed_rows) sums[i / 32] = total;
  }
  *scale = s;
  *zp = signed_rows ? static_cast<int32_t>(z) : 128 + static_cast<int32_t>(z);
}

}  // namespace kiln::cpu
KILN_CPU_TARGET_END
#endif
