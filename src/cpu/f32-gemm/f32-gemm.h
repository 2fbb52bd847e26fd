// Internal to kiln_cpu: the f32-gemm template. Each f32-gemm-<MR>x<NR>-<isa>.cpp
// instantiates it once, for its register tile and vector width, inside a
// function compiled for its ISA (see ../isa.h).
//
// The GEMM (Goto-style, simplified for inference shapes): K is cut into blocks
// of KC; for each block, B is packed one NR-wide column panel at a time into a
// stack buffer (32 KiB, 192 KiB for AVX-512: L1 / L2 resident; packing also avoids
// the cache-set conflicts that power-of-two row strides cause), and every
// MR-row tile of A sweeps that panel with an MR x NR register tile of
// accumulators. A is read in place (its M x KC block stays in L2 across all
// panels). The micro-kernel is written with GCC/Clang vector extensions, so the
// same source compiles to AVX-512, AVX2+FMA or the baseline ISA (SSE2 / NEON).
// Single-threaded; m, n, k >= 1 (sgemm handles the degenerate sizes).
#pragma once

#include "../isa.h"

#include <cstdint>
#include <cstring>
#include <utility>

namespace kiln::cpu {
namespace {  // internal linkage: each variant's file keeps its own copy, built for its ISA

template <int kBytes>
struct VecOf {
  typedef float type __attribute__((vector_size(kBytes)));
  typedef float unaligned __attribute__((vector_size(kBytes), aligned(4)));  // aliases float, as GCC's vectors do
};

// Vector loads/stores through references (vector values never cross a function boundary: psabi).
template <typename V>
KILN_CPU_INLINE void load_v(V& v, const float* p) {
  using U = typename VecOf<sizeof(V)>::unaligned;
  v = *reinterpret_cast<const U*>(p);
}
template <typename V>
KILN_CPU_INLINE void store_v(float* p, const V& v) {
  using U = typename VecOf<sizeof(V)>::unaligned;
  *reinterpret_cast<U*>(p) = v;
}

// Copies B[0:kc, 0:nr] (row stride ldb) into bp as kc rows of NR floats, zero-padding columns >= nr.
template <int NR>
KILN_CPU_INLINE void pack_b(const float* b, int64_t ldb, int64_t kc, int64_t nr, float* bp) {
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

// The same panel from a transposed B, given as Bᵀ[0:nr, 0:kc] (row stride ldb): each of its rows is
// a column of the panel (a linear layer's weights as files hold them, [N, K]).
template <int NR>
KILN_CPU_INLINE void pack_b_transposed(const float* bt, int64_t ldb, int64_t kc, int64_t nr, float* bp) {
  int64_t j = 0;
  for (; j + 4 <= nr; j += 4) {  // four rows of Bᵀ at a time: four streams, each written NR apart
    const float *r0 = bt + j * ldb, *r1 = r0 + ldb, *r2 = r1 + ldb, *r3 = r2 + ldb;
    for (int64_t k = 0; k < kc; ++k) {
      float* o = bp + k * NR + j;
      o[0] = r0[k], o[1] = r1[k], o[2] = r2[k], o[3] = r3[k];
    }
  }
  for (; j < nr; ++j)
    for (int64_t k = 0; k < kc; ++k) bp[k * NR + j] = bt[j * ldb + k];
  for (; j < NR; ++j)
    for (int64_t k = 0; k < kc; ++k) bp[k * NR + j] = 0.0f;
}

// One MR x NR tile: C[0:mr, 0:nr] = alpha * A[0:mr, 0:kc] · Bp + (load_c ? C : 0).
// Rows of A past mr repeat the last valid row (their results are discarded).
template <int MR, int NV, typename V>
KILN_CPU_INLINE void micro_tile(int64_t kc, const float* a, int64_t lda, int64_t mr, const float* bp, float* c,
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

// Lines a tile may prefetch into L2 while it runs (Tile::kInterleavedPrefetch): its share of the next B block,
// where B streams from memory (more than 1 MiB: a linear layer's weights). Issued one a trip among the tile's
// FMAs: as a burst before the tile they stalled on full fill buffers (a Xeon: GPT-2's linear layers ~2% slower in
// the model, 3-10% per shape in a standalone loop). A B that stays in L2 (the LM head's packed activations) and
// the next tile's rows of A keep the burst, which measured faster there (the LM head, A from memory: 4 ms of 85
// with both spread).
struct PrefetchLines {
  static constexpr int kMax = 128;
  const char* l2[kMax];
  int n2 = 0;
};

// The template's register tile, as a policy type: a variant may bring its own (written with its ISA's
// intrinsics, where the compiler's allocation of the vector-extension tile spills: f32-gemm-6x64-avx512.cpp).
template <int MR, int NV, typename V>
struct VectorTile {
  static constexpr bool kInterleavedPrefetch = false;
  static KILN_CPU_INLINE void run(int64_t kc, const float* a, int64_t lda, int64_t mr, const float* bp, float* c,
                                  int64_t ldc, int64_t nr, float alpha, bool load_c) {
    micro_tile<MR, NV, V>(kc, a, lda, mr, bp, c, ldc, nr, alpha, load_c);
  }
};

// B's layout (BL): rows, B [k, n] with row stride ldb; transposed, b is Bᵀ, [n, k] with row stride ldb
// (C = A · bᵀ); panels, B packed once (gemm.h's sgemm_pack_b): the panel of columns
// [j, j + NR) is k rows of NR floats at b + j * k (ldb: nonzero where B streams from memory), read in place, nothing packed per call.
inline constexpr int kRowsB = 0, kTransposedB = 1, kPanelsB = 2;

// KC: rows of a packed B panel; the default keeps the panel at 32 KiB (L1).
template <int MR, int NV, typename V, int64_t KC = 32 * 1024 / (NV * static_cast<int64_t>(sizeof(V))), int BL = kRowsB,
          typename Tile = VectorTile<MR, NV, V>>
KILN_CPU_INLINE void f32_gemm_blocked(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                                      const float* b, int64_t ldb, bool accumulate, float* c, int64_t ldc) {
  constexpr int VL = static_cast<int>(sizeof(V) / sizeof(float));
  constexpr int NR = NV * VL;
  constexpr bool BT = BL == kTransposedB;
  if constexpr (BL == kPanelsB) {
    // Panels packed once: each panel's K blocks in turn (one contiguous stream of B), every MR-row tile of
    // A sweeping the block; each tile prefetches its share of the next block (the next K rows, or the next
    // panel's first ones) into L2.
    const int64_t tiles = (m + MR - 1) / MR;
    // (ldb, unused by packed panels, says B streams from memory: a slice of a linear layer's weights)
    [[maybe_unused]] const bool spread_b = ldb != 0 || k * n * static_cast<int64_t>(sizeof(float)) > (int64_t{1} << 20);
    for (int64_t jr = 0; jr < n; jr += NR) {
      const int64_t nr = n - jr < NR ? n - jr : NR;
      for (int64_t pc = 0; pc < k; pc += KC) {
        const int64_t kc = k - pc < KC ? k - pc : KC;
        const bool load_c = accumulate || pc > 0;
        const float* block = b + jr * k + pc * NR;
        const char* next = reinterpret_cast<const char*>(block + kc * NR);
        const int64_t next_bytes =
            (pc + KC < k ? (k - pc - KC < KC ? k - pc - KC : KC) : jr + NR < n ? (k < KC ? k : KC) : 0) * NR *
            static_cast<int64_t>(sizeof(float));
        for (int64_t ir = 0; ir < m; ir += MR) {
          const int64_t t = ir / MR;
          [[maybe_unused]] PrefetchLines pf;
          // (a tile that interleaves B's prefetches gets them as a list, at most kMax: the rest now)
          auto prefetch = [&](const char* p, bool to_l1) {
            if constexpr (Tile::kInterleavedPrefetch) {
              if (!to_l1 && spread_b && pf.n2 < PrefetchLines::kMax) { pf.l2[pf.n2++] = p; return; }
            }
            if (to_l1) __builtin_prefetch(p, 0, 3);
            else __builtin_prefetch(p, 0, 2);
          };
          for (int64_t off = next_bytes * t / tiles / 64 * 64; off < next_bytes * (t + 1) / tiles; off += 64)
            prefetch(next + off, false);
          // and the next tile's rows of A for this K block (or the first tile's for the next block): MR short
          // streams, which the hardware prefetcher does not follow in time when A comes from memory (the LM
          // head's tied embedding, read in place as A)
          const int64_t next_ir = ir + MR < m ? ir + MR : 0, next_pc = ir + MR < m ? pc : pc + KC;
          if (next_pc < k) {
            const int64_t next_kc = k - next_pc < KC ? k - next_pc : KC;
            const int64_t rows_next = m - next_ir < MR ? m - next_ir : MR;
            for (int64_t i = 0; i < rows_next; ++i) {
              const char* row = reinterpret_cast<const char*>(a + (next_ir + i) * lda + next_pc);
              const int64_t bytes = next_kc * static_cast<int64_t>(sizeof(float));
              for (int64_t off = 0; off < bytes; off += 64) prefetch(row + off, true);
              prefetch(row + bytes - 1, true);
            }
          }
          const int64_t mr = m - ir < MR ? m - ir : MR;
          if constexpr (Tile::kInterleavedPrefetch)
            Tile::run(kc, a + ir * lda + pc, lda, mr, block, c + ir * ldc + jr, ldc, nr, alpha, load_c, &pf);
          else
            Tile::run(kc, a + ir * lda + pc, lda, mr, block, c + ir * ldc + jr, ldc, nr, alpha, load_c);
        }
      }
    }
    return;
  }
  alignas(64) float bp[KC * NR];
  for (int64_t pc = 0; pc < k; pc += KC) {
    const int64_t kc = k - pc < KC ? k - pc : KC;
    const bool load_c = accumulate || pc > 0;
    for (int64_t jr = 0; jr < n; jr += NR) {
      const int64_t nr = n - jr < NR ? n - jr : NR;
      if constexpr (BT) {
        pack_b_transposed<NR>(b + jr * ldb + pc, ldb, kc, nr, bp);
      } else {
        pack_b<NR>(b + pc * ldb + jr, ldb, kc, nr, bp);
      }
      // The next panel's rows of B (the next columns, or the next K block's first ones): kc rows
      // ldb apart, each its own stream, too many for the hardware prefetcher, so packing them
      // would wait on memory row by row. Each tile below prefetches its share of those rows.
      const float* next_b = nullptr;
      int64_t next_kc = 0, next_nr = 0;
      if (jr + NR < n) {
        next_b = BT ? b + (jr + NR) * ldb + pc : b + pc * ldb + jr + NR, next_kc = kc,
        next_nr = n - jr - NR < NR ? n - jr - NR : NR;
      } else if (pc + KC < k) {
        next_b = BT ? b + pc + KC : b + (pc + KC) * ldb, next_kc = k - pc - KC < KC ? k - pc - KC : KC,
        next_nr = n < NR ? n : NR;
      }
      if constexpr (BT) std::swap(next_kc, next_nr);  // Bᵀ's panel: next_nr rows of next_kc floats
      const int64_t tiles = (m + MR - 1) / MR;
      for (int64_t ir = 0; ir < m; ir += MR) {
        const int64_t mr = m - ir < MR ? m - ir : MR;
        if (next_b != nullptr) {
          const int64_t t = ir / MR, r0 = next_kc * t / tiles, r1 = next_kc * (t + 1) / tiles;
          for (int64_t r = r0; r < r1; ++r) {
            const char* row = reinterpret_cast<const char*>(next_b + r * ldb);
            const int64_t bytes = next_nr * static_cast<int64_t>(sizeof(float));
            for (int64_t off = 0; off < bytes; off += 64) __builtin_prefetch(row + off, 0, 2);
            __builtin_prefetch(row + bytes - 1, 0, 2);
          }
        }
        if (ir + MR < m) {  // the next tile's rows of C: ldc apart, too far for the hardware prefetcher
          const int64_t next_mr = m - ir - MR < MR ? m - ir - MR : MR;
          for (int64_t i = 0; i < next_mr; ++i)
            for (int64_t j = 0; j < nr; j += 16) __builtin_prefetch(c + (ir + MR + i) * ldc + jr + j, 1, 3);
        }
        Tile::run(kc, a + ir * lda + pc, lda, mr, bp, c + ir * ldc + jr, ldc, nr, alpha, load_c);
      }
    }
  }
}

}  // namespace
}  // namespace kiln::cpu
