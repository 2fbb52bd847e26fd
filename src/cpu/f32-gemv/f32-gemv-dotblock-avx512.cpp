// f32-gemv dot_block, x86-64-v4 (AVX-512): up to 3 rows of a against 16 (or 8) rows of b
// at a time, one accumulator per (row of a, row of b), then one transposing reduction per
// row of a that leaves its dot products in one vector (15 adds and 14 shuffles for 16
// sums, where a horizontal sum each takes ~8 instructions per dot product). Attention's
// q · Kᵀ over a KV cache: rows of 64 floats, a few query heads per cache head, hundreds
// of positions, the cache read from memory once per token. Each block of b is read once
// for all rows of a (up to 3 per pass), row by row in address order: with a pass per row
// of a, in column-chunk order, decode's q · Kᵀ was about twice as slow (SmolLM2, 3 query
// heads per cache head, a standalone loop over 30 layers' caches at position 200, each
// cold: 30 -> 16 us a layer).
// No software prefetch: the same loop ran slower with it (the hardware prefetcher follows
// one sequential stream per head).
// The whole file is compiled for the ISA; its helpers have internal linkage and it uses
// no inline function from a header other than the intrinsics.
#include "../ukernels.h"  // (before the target pragma: declarations only)

#ifdef KILN_CPU_X86
KILN_CPU_TARGET_BEGIN("arch=x86-64-v4")
#include "../avx512-intrinsics.h"

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

// lane j of the result: the sum of v[j]'s 16 lanes (j < 8)
inline __m256 reduce8(const __m512* v) {
  __m512 t[4], u[2];
  for (int i = 0; i < 4; ++i)  // 256-bit halves: v[2i]'s partials, then v[2i+1]'s
    t[i] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0x44), _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0xee));
  for (int i = 0; i < 2; ++i)  // 128-bit quarter c: v[4i + c]'s partials
    u[i] = _mm512_add_ps(_mm512_shuffle_f32x4(t[2 * i], t[2 * i + 1], 0x88), _mm512_shuffle_f32x4(t[2 * i], t[2 * i + 1], 0xdd));
  // quarter c: two partials of v[c], two of v[4 + c]
  const __m512 w = _mm512_add_ps(_mm512_shuffle_ps(u[0], u[1], 0x88), _mm512_shuffle_ps(u[0], u[1], 0xdd));
  // element 4c: the sum of v[c]; element 4c + 1: the sum of v[4 + c]
  const __m512 z = _mm512_add_ps(_mm512_shuffle_ps(w, w, 0x88), _mm512_shuffle_ps(w, w, 0xdd));
  return _mm512_castps512_ps256(_mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 0, 0, 0, 0, 0, 0, 0, 0), z));
}

inline __mmask16 tail_mask(int64_t left) {
  return left >= 16 ? __mmask16{0xffff} : static_cast<__mmask16>((1u << left) - 1);
}

// MR rows of a against NB rows of b (bj); c: the block's first output
template <int MR, int NB, int KC>
inline void block(const float* __restrict a, int64_t lda, const float* __restrict bj, int64_t ldb, int64_t k_,
                  int64_t kv_, __mmask16 km, float* __restrict c, int64_t ldc) {
  const int64_t k = KC > 0 ? KC : k_, kv = KC > 0 ? KC : kv_;
  __m512 acc[MR][NB];
  for (int r = 0; r < MR; ++r)
    for (int l = 0; l < NB; ++l) acc[r][l] = _mm512_setzero_ps();
  // b row by row, each row's lines in order: the access pattern is one sequential stream (column-chunk
  // order, a 256-byte stride for 64-float rows, ran at half the speed: the prefetcher follows it worse)
  for (int l = 0; l < NB; ++l) {
    for (int64_t p = 0; p < kv; p += 16) {
      const __m512 bv = _mm512_loadu_ps(bj + l * ldb + p);
      for (int r = 0; r < MR; ++r) acc[r][l] = _mm512_fmadd_ps(_mm512_loadu_ps(a + r * lda + p), bv, acc[r][l]);
    }
    if (kv < k) {
      const __m512 bv = _mm512_maskz_loadu_ps(km, bj + l * ldb + kv);
      for (int r = 0; r < MR; ++r) acc[r][l] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(km, a + r * lda + kv), bv, acc[r][l]);
    }
  }
  for (int r = 0; r < MR; ++r)
    if constexpr (NB == 16) _mm512_storeu_ps(c + r * ldc, reduce16(acc[r]));
    else _mm256_storeu_ps(c + r * ldc, reduce8(acc[r]));
}

// blocks of 16 rows of b (8 for a last block), a's rows in passes of 3; KC: k known at compile time
// (64, 128: a head's width), so each row's loads issue back to back; 0: any k
constexpr int kRowsB = 16;

template <int KC>
int64_t blocks(const float* __restrict a, int64_t lda, int64_t m, const float* __restrict b, int64_t ldb, int64_t n,
               int64_t k, int64_t kv, __mmask16 km, float* __restrict c, int64_t ldc) {
  int64_t j0 = 0;
  for (; j0 + kRowsB <= n; j0 += kRowsB) {  // the block (rows of b) stays in L1 across the passes over a's rows
    const float* bj = b + j0 * ldb;
    int64_t r = 0;
    for (; r + 3 <= m; r += 3) block<3, kRowsB, KC>(a + r * lda, lda, bj, ldb, k, kv, km, c + r * ldc + j0, ldc);
    if (m - r == 2) block<2, kRowsB, KC>(a + r * lda, lda, bj, ldb, k, kv, km, c + r * ldc + j0, ldc);
    if (m - r == 1) block<1, kRowsB, KC>(a + r * lda, lda, bj, ldb, k, kv, km, c + r * ldc + j0, ldc);
  }
  for (; j0 + 8 <= n; j0 += 8) {
    const float* bj = b + j0 * ldb;
    int64_t r = 0;
    for (; r + 3 <= m; r += 3) block<3, 8, KC>(a + r * lda, lda, bj, ldb, k, kv, km, c + r * ldc + j0, ldc);
    if (m - r == 2) block<2, 8, KC>(a + r * lda, lda, bj, ldb, k, kv, km, c + r * ldc + j0, ldc);
    if (m - r == 1) block<1, 8, KC>(a + r * lda, lda, bj, ldb, k, kv, km, c + r * ldc + j0, ldc);
  }
  return j0;
}

}  // namespace

void f32_gemv_dot_block__avx512(const float* __restrict a, int64_t lda, int64_t m, const float* __restrict b,
                                int64_t ldb, int64_t n, int64_t k, float* __restrict c, int64_t ldc) {
  const int64_t kv = k & ~int64_t{15};
  const __mmask16 km = tail_mask(k - kv);
  int64_t j0 = k == 64    ? blocks<64>(a, lda, m, b, ldb, n, k, kv, km, c, ldc)
               : k == 128 ? blocks<128>(a, lda, m, b, ldb, n, k, kv, km, c, ldc)
                          : blocks<0>(a, lda, m, b, ldb, n, k, kv, km, c, ldc);
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
KILN_CPU_TARGET_END
#endif
