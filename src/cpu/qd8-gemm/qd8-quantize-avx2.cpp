// Per-row int8 activation quantization with AVX2, for the Plain and Signed layouts
// (qd8_quantize_rows calls it when the selected qd8 variant is the AVX2 one; the generic loop
// took ~15 us for a row of 1536 inputs, ~4% of an 8da4w decode step of Gemma 4 E2B). The same
// operations as the generic loop in qd8-gemm-generic.cpp and the AVX-512 row, element for
// element, so the bytes, scale and zero point are identical (tests/cpu/qd8_gemm_test.cpp):
//   min / max: vminps / vmaxps with the running value second (a NaN input is ignored, as
//   std::min / std::max ignore it in second place; a -0 gives +0, as std::min(+0, -0));
//   q = clamp(round-half-even(x * (1 / s)) + z, -128, 127): vmulps, vroundps, vaddps,
//   vmaxps / vminps; the last partial 32 inputs by the same steps in scalar code.
// The whole file is compiled for the ISA and uses no inline function from a header other than
// the intrinsics (as the AVX-512 row: a copy built for AVX2 could be the one the linker keeps).
#include "../ukernels.h"  // (before the target pragma: declarations only)

#include <cfloat>

#ifdef KILN_CPU_X86
KILN_CPU_TARGET_BEGIN("arch=x86-64-v3")
#include <immintrin.h>

namespace kiln::cpu {
namespace {

inline float max_of(float a, float b) { return a < b ? b : a; }
inline float clamp_to(float v, float lo, float hi) { return v < lo ? lo : (hi < v ? hi : v); }

inline __m256i tail_mask(int64_t left) {
  const __m256i iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int32_t>(left < 8 ? left : 8)), iota);
}

// vmaxps / vminps as the vector body has them: max(a, b) = a > b ? a : b, min(a, b) = a < b ? a : b
inline float q_of(float x, float inv, float z) {
  float c = __builtin_nearbyintf(x * inv) + z;
  c = c > -128.0f ? c : -128.0f;
  return c < 127.0f ? c : 127.0f;
}

}  // namespace

void qd8_quantize_row__avx2(const float* x, int64_t k, bool signed_rows, uint8_t* dst, int64_t row_bytes,
                            float* scale, int32_t* zp, int32_t* sums) {
  __m256 vlo = _mm256_setzero_ps(), vhi = _mm256_setzero_ps();
  for (int64_t i = 0; i < k; i += 8) {
    const __m256 v = _mm256_maskload_ps(x + i, tail_mask(k - i));  // masked lanes read 0: min/max start at 0
    vlo = _mm256_min_ps(v, vlo);
    vhi = _mm256_max_ps(v, vhi);
  }
  alignas(32) float l8[8], h8[8];
  _mm256_store_ps(l8, vlo);
  _mm256_store_ps(h8, vhi);
  float lo = 0.0f, hi = 0.0f;  // lanes hold +0 or their extremes: any order gives the same value
  for (int j = 0; j < 8; ++j) {
    lo = l8[j] < lo ? l8[j] : lo;
    hi = max_of(hi, h8[j]);
  }
  const float s = max_of((hi - lo) / 255.0f, FLT_MIN);
  const float z = clamp_to(-128.0f - __builtin_nearbyintf(lo / s), -128.0f, 127.0f);
  const float inv = 1.0f / s;
  const __m256 vinv = _mm256_set1_ps(inv), vz = _mm256_set1_ps(z);
  const __m256 qmin = _mm256_set1_ps(-128.0f), qmax = _mm256_set1_ps(127.0f);
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  __builtin_memset(dst, 0, static_cast<size_t>(row_bytes));
  const int64_t k32 = k / 32 * 32;
  for (int64_t i = 0; i < k32; i += 32) {  // 32 inputs: one sum of a Signed row
    __m256i q[4];
    for (int h = 0; h < 4; ++h) {
      const __m256 r = _mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i + 8 * h), vinv),
                                       _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      q[h] = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(_mm256_add_ps(r, vz), qmin), qmax));
    }
    // 32-bit -> 16-bit -> 8-bit, each within range (no saturation), then the lanes back in order
    const __m256i w01 = _mm256_packs_epi32(q[0], q[1]), w23 = _mm256_packs_epi32(q[2], q[3]);
    __m256i b = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(w01, w23), order);
    if (signed_rows) {
      const __m256i t = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
      __m128i u = _mm_add_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1));
      u = _mm_add_epi32(u, _mm_shuffle_epi32(u, 0x4e));
      u = _mm_add_epi32(u, _mm_shuffle_epi32(u, 0xb1));
      sums[i / 32] = _mm_cvtsi128_si32(u);
    } else {
      b = _mm256_xor_si256(b, _mm256_set1_epi8(static_cast<char>(0x80)));  // q + 128
    }
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), b);
  }
  if (k32 < k) {
    int32_t total = 0;
    for (int64_t i = k32; i < k; ++i) {
      const int32_t q = static_cast<int32_t>(q_of(x[i], inv, z));
      total += q;
      dst[i] = static_cast<uint8_t>(signed_rows ? q : q + 128);
    }
    if (signed_rows) sums[k32 / 32] = total;
  }
  *scale = s;
  *zp = signed_rows ? static_cast<int32_t>(z) : 128 + static_cast<int32_t>(z);
}

}  // namespace kiln::cpu
KILN_CPU_TARGET_END
#endif
