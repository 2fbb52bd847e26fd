// f32-gemv dot_block, x86-64-v4 (AVX-512): a few rows of a against 16 rows of b at a
// time, 16 accumulators per row of a, then one transposing reduction that leaves the 16
// dot products in one vector (15 adds and 14 shuffles for 16 sums, where a horizontal
// sum each takes ~8 instructions per dot product). Attention's q · Kᵀ over a KV cache:
// rows of 64 floats, a few query heads per cache head, hundreds of positions.
// The whole file is compiled for the ISA; its helpers have internal linkage and it uses
// no inline function from a header other than the intrinsics.
#include "../ukernels.h"  // (before the target pragma: declarations only)

#ifdef KILN_CPU_X86
#pragma GCC target("arch=x86-64-v4")
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // GCC 12: _mm512_undefined_* (see qd8-gemm-avx512.h)
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>

namespace kiln::cpu {
namespace {

// lane j of the result: the sum of v[j]'s 16 lanes
inline __m512 reduce16(const __m512* v) {
  __m512 t[8], u[4], w[2];
  for (int i = 0; i < 8; ++i)  // 256-bit halves: v[2i]'s partials, then v[2i+1]'s
    t[i] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0x44), _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0xee));
  for (int i = 0; i < 4; ++i)  // 128-bit quarter c: v[4i + c]'s partials
    u[i] = _mm512_add_ps(_mm512_shuffle_f32x4(t[2 * i], t[2 * i + 1], 0x88), _mm512_shuffle_f32x4(t[2 * i], t[2 * i + 1], 0xdd));
  for (int i = 0; i < 2; ++i)  // quarter c: two of v[8i + c], two of v[8i + 4 + c]
    w[i] = _mm512_add_ps(_mm512_shuffle_ps(u[2 * i], u[2 * i + 1], 0x88), _mm512_shuffle_ps(u[2 * i], u[2 * i + 1], 0xdd));
  // element 4c + e: the sum of v[c + 4e]
  const __m512 z = _mm512_add_ps(_mm512_shuffle_ps(w[0], w[1], 0x88), _mm512_shuffle_ps(w[0], w[1], 0xdd));
  return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), z);
}

inline __mmask16 tail_mask(int64_t left) {
  return left >= 16 ? __mmask16{0xffff} : static_cast<__mmask16>((1u << left) - 1);
}

}  // namespace

void f32_gemv_dot_block__avx512(const float* __restrict a, int64_t lda, int64_t m, const float* __restrict b,
                                int64_t ldb, int64_t n, int64_t k, float* __restrict c, int64_t ldc) {
  const int64_t kv = k & ~int64_t{15};
  const __mmask16 km = tail_mask(k - kv);
  int64_t j0 = 0;
  for (; j0 + 16 <= n; j0 += 16) {
    const float* bj = b + j0 * ldb;
    // the block after next, into L2 while this one is computed: a KV cache is read once per token,
    // from memory, in short calls the hardware prefetcher does not ramp up for
    if (j0 + 48 <= n)
      for (int64_t l = 0; l < 16; ++l)
        for (int64_t p = 0; p < k; p += 16) _mm_prefetch(reinterpret_cast<const char*>(bj + (32 + l) * ldb + p), _MM_HINT_T1);
    for (int64_t r = 0; r < m; ++r) {
      const float* ar = a + r * lda;
      __m512 acc[16];
      for (int l = 0; l < 16; ++l) acc[l] = _mm512_setzero_ps();
      for (int64_t p = 0; p < kv; p += 16) {
        const __m512 av = _mm512_loadu_ps(ar + p);
        for (int l = 0; l < 16; ++l) acc[l] = _mm512_fmadd_ps(av, _mm512_loadu_ps(bj + l * ldb + p), acc[l]);
      }
      if (kv < k) {
        const __m512 av = _mm512_maskz_loadu_ps(km, ar + kv);
        for (int l = 0; l < 16; ++l) acc[l] = _mm512_fmadd_ps(av, _mm512_maskz_loadu_ps(km, bj + l * ldb + kv), acc[l]);
      }
      _mm512_storeu_ps(c + r * ldc + j0, reduce16(acc));
    }
  }
  for (; j0 < n; ++j0)
    for (int64_t r = 0; r < m; ++r) {
      __m512 acc = _mm512_setzero_ps();
      for (int64_t p = 0; p < k; p += 16) {
        const __mmask16 mk = tail_mask(k - p);
        acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mk, a + r * lda + p), _mm512_maskz_loadu_ps(mk, b + j0 * ldb + p), acc);
      }
      c[r * ldc + j0] = _mm512_reduce_add_ps(acc);
    }
}

}  // namespace kiln::cpu
#endif
