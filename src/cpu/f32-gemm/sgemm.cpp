// kiln::cpu::sgemm, the fp32 GEMM core of mm, bmm, addmm and the XNNPACK backend's steps.
//
// The GEMM (Goto-style, simplified for inference shapes): K is cut into blocks
// of KC; for each block, B is packed one NR-wide column panel at a time into a
// stack buffer (32 KiB, 192 KiB for AVX-512: L1 / L2 resident; packing also avoids
// the cache-set conflicts that power-of-two row strides cause), and every
// MR-row tile of A sweeps that panel with an MR x NR register tile of
// accumulators. A is read in place (its M x KC block stays in L2 across all
// panels). The micro-kernel is written with GCC/Clang vector extensions, so the
// same source compiles to AVX-512, AVX2+FMA or the baseline ISA (SSE2 / NEON);
// the variant is picked once at run time. Single-threaded.
#include "kiln/cpu/gemm.h"

#include <cstring>
#include <initializer_list>

namespace kiln::cpu {
namespace {

#define KILN_ALWAYS_INLINE inline __attribute__((always_inline))

template <int kBytes>
struct VecOf {
  typedef float type __attribute__((vector_size(kBytes)));
  typedef float unaligned __attribute__((vector_size(kBytes), aligned(4)));  // aliases float, as GCC's vectors do
};

// Vector loads/stores through references (vector values never cross a function boundary: psabi).
template <typename V>
KILN_ALWAYS_INLINE void load_v(V& v, const float* p) {
  using U = typename VecOf<sizeof(V)>::unaligned;
  v = *reinterpret_cast<const U*>(p);
}
template <typename V>
KILN_ALWAYS_INLINE void store_v(float* p, const V& v) {
  using U = typename VecOf<sizeof(V)>::unaligned;
  *reinterpret_cast<U*>(p) = v;
}

// Copies B[0:kc, 0:nr] (row stride ldb) into bp as kc rows of NR floats, zero-padding columns >= nr.
template <int NR>
KILN_ALWAYS_INLINE void pack_b(const float* b, int64_t ldb, int64_t kc, int64_t nr, float* bp) {
  if (nr == NR) {
    for (int64_t k = 0; k < kc; ++k) std::memcpy(bp + k * NR, b + k * ldb, sizeof(float) * NR);
  } else {
    for (int64_t k = 0; k < kc; ++k) {
      int64_t j = 0;
      for (; j < nr; ++j) bp[k * NR + j] = b[k * ldb + j];
      for (; j < NR; ++j) bp[k * NR + j] = 0.0f;
    }
  }
}

// One MR x NR tile: C[0:mr, 0:nr] = alpha * A[0:mr, 0:kc] · Bp + (load_c ? C : 0).
// Rows of A past mr repeat the last valid row (their results are discarded).
template <int MR, int NV, typename V>
KILN_ALWAYS_INLINE void micro_tile(int64_t kc, const float* a, int64_t lda, int64_t mr, const float* bp, float* c,
                                   int64_t ldc, int64_t nr, float alpha, bool load_c) {
  constexpr int VL = static_cast<int>(sizeof(V) / sizeof(float));
  constexpr int NR = NV * VL;
  const float* ar[MR];
  for (int i = 0; i < MR; ++i) ar[i] = a + (i < mr ? i : mr - 1) * lda;
  V acc[MR][NV];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NV; ++j) acc[i][j] = V{};
  for (int64_t k = 0; k < kc; ++k) {
    V bv[NV];
#pragma GCC unroll 8
    for (int j = 0; j < NV; ++j) load_v<V>(bv[j], bp + k * NR + j * VL);
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
      const float a_ik = ar[i][k];
      const V av = a_ik - V{};  // a broadcast (x - 0 folds to x; x + 0 would not: -0 + 0 = +0)
#pragma GCC unroll 8
      for (int j = 0; j < NV; ++j) acc[i][j] += av * bv[j];
    }
  }
  if (mr == MR && nr == NR) {
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 8
      for (int j = 0; j < NV; ++j) {
        V r = acc[i][j] * alpha;
        if (load_c) {
          V old;
          load_v<V>(old, c + i * ldc + j * VL);
          r += old;
        }
        store_v<V>(c + i * ldc + j * VL, r);
      }
    }
    return;
  }
  alignas(64) float tile[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NV; ++j) store_v<V>(&tile[i][j * VL], acc[i][j]);
  for (int64_t i = 0; i < mr; ++i)
    for (int64_t j = 0; j < nr; ++j) {
      const float r = alpha * tile[i][j];
      c[i * ldc + j] = load_c ? c[i * ldc + j] + r : r;
    }
}

// KC: rows of a packed B panel; the default keeps the panel at 32 KiB (L1).
template <int MR, int NV, typename V, int64_t KC = 32 * 1024 / (NV * static_cast<int64_t>(sizeof(V)))>
KILN_ALWAYS_INLINE void sgemm_blocked(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                                      const float* b, int64_t ldb, bool accumulate, float* c, int64_t ldc) {
  constexpr int VL = static_cast<int>(sizeof(V) / sizeof(float));
  constexpr int NR = NV * VL;
  alignas(64) float bp[KC * NR];
  for (int64_t pc = 0; pc < k; pc += KC) {
    const int64_t kc = k - pc < KC ? k - pc : KC;
    const bool load_c = accumulate || pc > 0;
    for (int64_t jr = 0; jr < n; jr += NR) {
      const int64_t nr = n - jr < NR ? n - jr : NR;
      pack_b<NR>(b + pc * ldb + jr, ldb, kc, nr, bp);
      for (int64_t ir = 0; ir < m; ir += MR) {
        const int64_t mr = m - ir < MR ? m - ir : MR;
        if (ir + MR < m) {  // the next tile's rows of C: ldc apart, too far for the hardware prefetcher
          const int64_t next_mr = m - ir - MR < MR ? m - ir - MR : MR;
          for (int64_t i = 0; i < next_mr; ++i)
            for (int64_t j = 0; j < nr; j += 16) __builtin_prefetch(c + (ir + MR + i) * ldc + jr + j, 1, 3);
        }
        micro_tile<MR, NV, V>(kc, a + ir * lda + pc, lda, mr, bp, c + ir * ldc + jr, ldc, nr, alpha, load_c);
      }
    }
  }
}

using SgemmFn = void (*)(int64_t, int64_t, int64_t, float, const float*, int64_t, const float*, int64_t, bool,
                         float*, int64_t);

// Register tiles: MR rows x NV vectors. The baseline ISA has 16 vector registers
// (SSE2 / NEON: 6 x 8 floats, 12 accumulators), AVX2 has 16 (6 x 16), AVX-512 has
// 32 (4 x 64: 16 accumulators, 4 B vectors, one broadcast; with KC = 768 the
// 192 KiB B panel sits in L2, which feeds it fast enough, and C is revisited
// less: GPT-2's K = 768 layers accumulate in one pass. Measured on the AVX-512
// machine against KC = 128/192/256/384: 2-5% faster, bench/kernels/gemm_bench.cpp).
void sgemm_generic(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda, const float* b,
                   int64_t ldb, bool accumulate, float* c, int64_t ldc) {
  sgemm_blocked<6, 2, VecOf<16>::type>(m, n, k, alpha, a, lda, b, ldb, accumulate, c, ldc);
}

#if defined(__x86_64__) && defined(__GNUC__)
#define KILN_GEMM_X86 1
__attribute__((target("avx2,fma"))) void sgemm_avx2(int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                                                    int64_t lda, const float* b, int64_t ldb, bool accumulate,
                                                    float* c, int64_t ldc) {
  sgemm_blocked<6, 2, VecOf<32>::type>(m, n, k, alpha, a, lda, b, ldb, accumulate, c, ldc);
}

__attribute__((target("avx512f,fma"))) void sgemm_avx512(int64_t m, int64_t n, int64_t k, float alpha,
                                                         const float* a, int64_t lda, const float* b, int64_t ldb,
                                                         bool accumulate, float* c, int64_t ldc) {
  sgemm_blocked<4, 4, VecOf<64>::type, 768>(m, n, k, alpha, a, lda, b, ldb, accumulate, c, ldc);
}
#endif

// The function for an ISA, or nullptr when this build or CPU lacks it.
SgemmFn sgemm_fn(SgemmIsa isa) {
  switch (isa) {
    case SgemmIsa::Generic: return sgemm_generic;
#ifdef KILN_GEMM_X86
    case SgemmIsa::Avx2:
      __builtin_cpu_init();
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? sgemm_avx2 : nullptr;
    case SgemmIsa::Avx512:
      __builtin_cpu_init();
      return __builtin_cpu_supports("avx512f") ? sgemm_avx512 : nullptr;
#endif
    default: return nullptr;
  }
}

SgemmIsa pick_isa() {
  for (SgemmIsa isa : {SgemmIsa::Avx512, SgemmIsa::Avx2})
    if (sgemm_fn(isa) != nullptr) return isa;
  return SgemmIsa::Generic;
}

struct SgemmChoice {
  SgemmIsa isa;
  SgemmFn fn;
};

const SgemmChoice& sgemm_choice() {
  static const SgemmChoice choice = [] {
    const SgemmIsa isa = pick_isa();
    return SgemmChoice{isa, sgemm_fn(isa)};
  }();
  return choice;
}

// Degenerate sizes, handled the same on every path; false when there is nothing more to do.
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
    sgemm_choice().fn(m, n, k, alpha, a, lda, b, ldb, accumulate, c, ldc);
}

bool sgemm_with(SgemmIsa isa, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                const float* b, int64_t ldb, bool accumulate, float* c, int64_t ldc) {
  SgemmFn fn = sgemm_fn(isa);
  if (fn == nullptr) return false;
  if (sgemm_needs_work(m, n, k, accumulate, c, ldc)) fn(m, n, k, alpha, a, lda, b, ldb, accumulate, c, ldc);
  return true;
}

SgemmIsa sgemm_isa() { return sgemm_choice().isa; }

const char* sgemm_isa_name(SgemmIsa isa) {
  switch (isa) {
    case SgemmIsa::Avx512: return "avx512";
    case SgemmIsa::Avx2: return "avx2";
    default: return "generic";
  }
}

}  // namespace kiln::cpu
