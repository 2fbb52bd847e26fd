// qd8 x qb4w / qc8w, AMX-INT8 (Sapphire Rapids and later): the integer dot products of a prompt's
// many rows by tile instructions, 16 rows x 16 outputs per tile, for products of 16 rows or more;
// fewer rows (one token), the rows past the last whole 16 and the file-layout qb4w product run
// the avx512vnni variant's code (qd8-gemm-avx512.h, compiled here too). Every integer sum is
// exact and the fp32 epilogue applies scales and sums in the avx512vnni order, so the results
// are bit-identical to that variant (tests/cpu/qd8_gemm_test.cpp checks it).
//
// The tiles (one configuration, loaded by each call in its thread and released at its end with
// tilerelease, so no thread keeps the 8 KB tile state between calls):
//   tmm0-3  int32 sums, 16 rows x 16 outputs
//   tmm4-5  activations, 16 rows x kt bytes (kt inputs: 64, or 32 for qb4w with groups of 32)
//   tmm6-7  weights, kt/4 rows x 64 bytes: row i holds each of 16 outputs' weights for inputs
//           4i .. 4i+3 (the dot-product instructions' layout), unpacked per call into a
//           per-thread buffer of 32 outputs x k bytes
// qc8w (per-channel int8, Plain rows: q + 128, u8 x s8 by tdpbusd): 32 rows x 32 outputs per
// block, whole-K sums in tmm0-3; the weights' [n, k] rows become tiles by a 16 x 16 transpose of
// 32-bit words per 64 inputs. y = s_x (s_w * dot - z sum_w) + bias as the avx512vnni variant's
// for_outputs computes it (see qc8w_epilogue).
// qb4w panels (Signed rows: q itself, s8 x s8 by tdpbssd): a panel's nibbles unpacked to w
// (-8..7, so no 8 * sum q correction is needed: the sums equal the avx512vnni variant's
// dot - 8 * sum q exactly), one tile of sums per group (kt = 32 for groups of 32, otherwise
// group / 64 products of kt = 64 per tile), stored and added into 16 fp32 registers per row as
// s_g * sum, group after group; the four tiles of sums rotate, each group's products issued two
// groups ahead of its store and its sums added two groups after it, so that the tile unit and the
// vector unit work on different groups. Measured (build/kiln_gemm_bench, one Xeon core, SmolLM2's
// 128 x 576 x 1536): qb4w panels (group 32) 0.30 ms vs 0.73 ms for avx512vnni, qc8w 0.15 ms vs
// 1.13 ms. A group of 32's products are bound by the tile loads and stores, not the multiplies:
// every group's 16 x 16 sums go through memory for their own fp32 scale.
// The whole file is compiled for the ISA (its helpers have internal linkage). The process must
// have the kernel's grant of the tile state before any tile instruction: amx_permitted()
// (config.cpp) asks for it once; without it every product runs the avx512vnni code.
#include "../ukernels.h"  // (before the target pragma: declarations only)
#ifdef KILN_CPU_X86
KILN_CPU_TARGET_BEGIN("arch=x86-64-v4,avx512vnni,amx-tile,amx-int8")
#include "qd8-gemm-avx512.h"

#include <cstdlib>

namespace kiln::cpu {
namespace {

// Rows of activations below which a product runs the avx512vnni code (one tile's rows).
constexpr int64_t kAmxMinRows = 16;

// The tile instructions: GCC's _tile_* macros take the tile numbers as literals, and their loads
// declare no memory input, so each load here is preceded by a compiler barrier (the weights'
// tiles are written by ordinary stores just before).
#define KILN_TILE_LOAD(t, base, stride)         \
  do {                                          \
    __asm__ volatile("" ::: "memory");          \
    _tile_loadd(t, (base), (stride));           \
  } while (0)

// The tile configuration (palette 1): tmm0-3 sums, tmm4-5 activations, tmm6-7 weights; kt
// inputs per product.
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Configures the calling thread's tiles; ~TileScope releases them.
struct TileScope {
  explicit TileScope(int kt) {
    TileConfig c;
    for (int t = 0; t < 4; ++t) c.colsb[t] = 64, c.rows[t] = 16;
    for (int t = 4; t < 6; ++t) c.colsb[t] = static_cast<uint16_t>(kt), c.rows[t] = 16;
    for (int t = 6; t < 8; ++t) c.colsb[t] = 64, c.rows[t] = static_cast<uint8_t>(kt / 4);
    __asm__ volatile("" ::: "memory");
    _tile_loadconfig(&c);
  }
  ~TileScope() { _tile_release(); }
  TileScope(const TileScope&) = delete;
  TileScope& operator=(const TileScope&) = delete;
};

// The calling thread's buffer of unpacked weights (64-byte aligned, grown as needed, kept for
// the thread's life).
struct ThreadBuffer {
  uint8_t* p = nullptr;
  size_t n = 0;
  ~ThreadBuffer() { std::free(p); }
  uint8_t* get(size_t bytes) {
    if (bytes > n) {
      std::free(p);
      n = (bytes + 4095) / 4096 * 4096;
      p = static_cast<uint8_t*>(std::aligned_alloc(64, n));
      if (p == nullptr) n = 0;
    }
    return p;
  }
};
thread_local ThreadBuffer t_weights;

// ---------------------------------------------------------------- qc8w

// out[i] = the 32-bit words i of r[0..15] (a 16 x 16 transpose of 32-bit words), in place.
KILN_CPU_INLINE void transpose16(__m512i (&r)[16]) {
  __m512i a[16], b[16];
  #pragma GCC unroll 16
  for (int i = 0; i < 16; i += 2) {
    a[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    a[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  // b[4q + c], 128-bit lane L: column 4L + c of rows 4q .. 4q + 3
  #pragma GCC unroll 4
  for (int i = 0; i < 16; i += 4) {
    b[i] = _mm512_unpacklo_epi64(a[i], a[i + 2]);
    b[i + 1] = _mm512_unpackhi_epi64(a[i], a[i + 2]);
    b[i + 2] = _mm512_unpacklo_epi64(a[i + 1], a[i + 3]);
    b[i + 3] = _mm512_unpackhi_epi64(a[i + 1], a[i + 3]);
  }
  #pragma GCC unroll 4
  for (int c = 0; c < 4; ++c) {
    const __m512i s0 = _mm512_shuffle_i32x4(b[c], b[4 + c], 0x44), s1 = _mm512_shuffle_i32x4(b[c], b[4 + c], 0xee);
    const __m512i s2 = _mm512_shuffle_i32x4(b[8 + c], b[12 + c], 0x44), s3 = _mm512_shuffle_i32x4(b[8 + c], b[12 + c], 0xee);
    r[c] = _mm512_shuffle_i32x4(s0, s2, 0x88);
    r[4 + c] = _mm512_shuffle_i32x4(s0, s2, 0xdd);
    r[8 + c] = _mm512_shuffle_i32x4(s1, s3, 0x88);
    r[12 + c] = _mm512_shuffle_i32x4(s1, s3, 0xdd);
  }
}

// Outputs j0 .. j0 + 31 (those below n1; the rest zero) of int8 weights [n, k] as tiles: per 64
// inputs c, two tiles of 1024 bytes (outputs 0-15, 16-31) at out + (2c + h) * 1024.
void qc8w_tiles(const Qc8wWeights& w, int64_t k, int64_t j0, int64_t n1, uint8_t* out) {
  const int64_t chunks = (k + 63) / 64;
  for (int h = 0; h < 2; ++h)
    for (int64_t c = 0; c < chunks; ++c) {
      const int64_t rem = k - c * 64;
      const __mmask64 mask = rem >= 64 ? ~__mmask64{0} : (__mmask64{1} << rem) - 1;
      __m512i r[16];
      #pragma GCC unroll 16
      for (int i = 0; i < 16; ++i) {
        const int64_t j = j0 + 16 * h + i;
        r[i] = j < n1 ? _mm512_maskz_loadu_epi8(mask, w.data + j * k + c * 64) : _mm512_setzero_si512();
      }
      transpose16(r);
      uint8_t* t = out + (2 * c + h) * 1024;
      #pragma GCC unroll 16
      for (int i = 0; i < 16; ++i) _mm512_store_si512(t + 64 * i, r[i]);
    }
}

// y for rows m0 .. m0 + rows - 1 and outputs j0 .. min(j0 + 32, n1) - 1 from their int32 sums
// (acc, 32 outputs a row), as for_outputs (qd8-gemm-rows.h) with the avx512vnni qc8w dot
// computes them; the operations are the ones GCC 12 makes of that expression there:
// t = fma(float(dot), s_w, -(z * sum_w)), y = fma(t, s_x, bias), then clamped (NaN kept).
void qc8w_epilogue(const Qd8Rows& a, int64_t m0, int rows, const Qc8wWeights& w, int64_t j0, int64_t n1,
                   const float* bias, float* y, int64_t ldy, float lo, float hi, const int32_t* acc) {
  const __m512 vlo = _mm512_set1_ps(lo), vhi = _mm512_set1_ps(hi);
  for (int h = 0; h < 2; ++h) {
    const int64_t left = n1 - (j0 + 16 * h);
    if (left <= 0) break;
    const __mmask16 mask = left >= 16 ? __mmask16{0xffff} : static_cast<__mmask16>((1u << left) - 1);
    const __m512 sw = _mm512_maskz_loadu_ps(mask, w.scales + j0 + 16 * h);
    const __m512 sums = _mm512_maskz_loadu_ps(mask, w.sums + j0 + 16 * h);
    const __m512 b = bias ? _mm512_maskz_loadu_ps(mask, bias + j0 + 16 * h) : _mm512_setzero_ps();
    for (int r = 0; r < rows; ++r) {
      const __m512 dot = _mm512_cvtepi32_ps(_mm512_load_si512(acc + 32 * r + 16 * h));
      const __m512 zs = _mm512_mul_ps(_mm512_set1_ps(static_cast<float>(a.zp[m0 + r])), sums);
      const __m512 t = _mm512_fmsub_ps(dot, sw, zs);
      __m512 v = _mm512_fmadd_ps(t, _mm512_set1_ps(a.scale[m0 + r]), b);
      const __mmask16 below = _mm512_cmp_ps_mask(v, vlo, _CMP_LT_OQ), above = _mm512_cmp_ps_mask(v, vhi, _CMP_GT_OQ);
      v = _mm512_mask_blend_ps(below, _mm512_mask_blend_ps(above, v, vhi), vlo);  // v < lo ? lo : v > hi ? hi : v
      _mm512_mask_storeu_ps(y + (m0 + r) * ldy + j0 + 16 * h, mask, v);
    }
  }
}

// 16 * MT rows from m0 against one block of 32 outputs (its tiles at wt): whole-K sums into
// acc[row][32].
template <int MT>
KILN_CPU_INLINE void qc8w_tile_block(const Qd8Rows& a, int64_t m0, int64_t chunks, const uint8_t* wt, int32_t* acc) {
  _tile_zero(0);
  _tile_zero(1);
  if constexpr (MT == 2) {
    _tile_zero(2);
    _tile_zero(3);
  }
  const uint8_t* a0 = a.data + m0 * a.stride;
  for (int64_t c = 0; c < chunks; ++c) {
    KILN_TILE_LOAD(4, a0 + c * 64, a.stride);
    KILN_TILE_LOAD(6, wt + 2 * c * 1024, 64);
    KILN_TILE_LOAD(7, wt + (2 * c + 1) * 1024, 64);
    _tile_dpbusd(0, 4, 6);
    _tile_dpbusd(1, 4, 7);
    if constexpr (MT == 2) {
      KILN_TILE_LOAD(5, a0 + 16 * a.stride + c * 64, a.stride);
      _tile_dpbusd(2, 5, 6);
      _tile_dpbusd(3, 5, 7);
    }
  }
  _tile_stored(0, acc, 128);
  _tile_stored(1, acc + 16, 128);
  if constexpr (MT == 2) {
    _tile_stored(2, acc + 16 * 32, 128);
    _tile_stored(3, acc + 16 * 32 + 16, 128);
  }
}

void qc8w_amx(const Qd8Rows& a, int64_t m, int64_t k, const Qc8wWeights& w, int64_t n0, int64_t n1, const float* bias,
              float* y, int64_t ldy, float lo, float hi) {
  const int64_t chunks = (k + 63) / 64, tiled = m / 16 * 16;
  uint8_t* wt = m >= kAmxMinRows && amx_permitted() ? t_weights.get(static_cast<size_t>(chunks) * 2048) : nullptr;
  if (wt == nullptr) return by_row_blocks<Avx512<true>, Qc8wWeights>(a, m, k, w, n0, n1, bias, y, ldy, lo, hi);
  {
    TileScope tiles(64);
    alignas(64) int32_t acc[32 * 32];
    for (int64_t j0 = n0; j0 < n1; j0 += 32) {
      qc8w_tiles(w, k, j0, n1, wt);
      int64_t m0 = 0;
      for (; m0 + 32 <= tiled; m0 += 32) {
        qc8w_tile_block<2>(a, m0, chunks, wt, acc);
        qc8w_epilogue(a, m0, 32, w, j0, n1, bias, y, ldy, lo, hi, acc);
      }
      if (m0 < tiled) {
        qc8w_tile_block<1>(a, m0, chunks, wt, acc);
        qc8w_epilogue(a, m0, 16, w, j0, n1, bias, y, ldy, lo, hi, acc);
      }
    }
  }
  // the rows past the last whole tile (fewer than 16): the avx512vnni blocks
  for_row_blocks(m - tiled, [&](auto rows, int64_t r0) KILN_CPU_LAMBDA {
    block_rows(Avx512<true>{}, rows, a, tiled + r0, k, w, n0, n1, bias, y, ldy, lo, hi);
  });
}

// ---------------------------------------------------------------- qb4w panels

// Panel p's weights as tiles of w (-8..7, s8) and its scales as fp32: per kt inputs c, two tiles
// of 16 kt bytes (outputs 0-15, 16-31) at wt + (2c + h) * 16 kt; the scales of group g at
// sc + 32 g. A panel's 128 bytes per 8 inputs are two vectors (outputs 0-15, 16-31) whose low
// nibbles are a tile's row for inputs 0-3 and high nibbles its row for inputs 4-7.
void qb4w_panel_tiles(const uint8_t* wp, int64_t k, int64_t G, int kt, uint8_t* wt, float* sc) {
  const int64_t groups = k / G, steps = G / 8;
  const __m512i low4 = _mm512_set1_epi8(0x0f), eight = _mm512_set1_epi8(8);
  const int steps_per_chunk = kt / 8;  // step s (inputs 8s .. 8s + 7): rows 2i, 2i + 1 of chunk s / (kt / 8)'s tiles
  int64_t s = 0;
  for (int64_t g = 0; g < groups; ++g) {
    for (int64_t t = 0; t < steps; ++t, ++s, wp += 128) {
      const int64_t c = s / steps_per_chunk, i = s % steps_per_chunk;
      uint8_t* row = wt + 2 * c * 16 * kt + 2 * i * 64;
      #pragma GCC unroll 2
      for (int h = 0; h < 2; ++h) {
        const __m512i v = _mm512_load_si512(wp + 64 * h);
        uint8_t* dst = row + h * 16 * kt;
        _mm512_store_si512(dst, _mm512_sub_epi8(_mm512_and_si512(v, low4), eight));
        _mm512_store_si512(dst + 64, _mm512_sub_epi8(_mm512_and_si512(_mm512_srli_epi16(v, 4), low4), eight));
      }
    }
    #pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
      const __m256i s16 = _mm256_load_si256(reinterpret_cast<const __m256i*>(wp + 32 * h));
      _mm512_store_ps(sc + 32 * g + 16 * h, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(s16), 16)));
    }
    wp += 64;
  }
}

// Rows m0 .. m0 + 15, outputs 16 h .. 16 h + 15 of panel p (its tiles at wt, scales at sc), group
// by group: the group's sums tile tmm(T) (T = g % 4, activations tmm(4 + T % 2), weights
// tmm(6 + T % 2)) is zeroed and given its products (issue), two groups ahead of its store
// (store), and its stored sums are added into f as s_g * sum two groups after that (add), so
// the tile unit and the vector unit work on different groups.
template <int T>
KILN_CPU_INLINE void qb4w_issue(const int8_t* a0, int64_t stride, const uint8_t* wt, int64_t g, int64_t sub, int kt,
                                int h) {
  if constexpr (T == 0) _tile_zero(0);
  if constexpr (T == 1) _tile_zero(1);
  if constexpr (T == 2) _tile_zero(2);
  if constexpr (T == 3) _tile_zero(3);
  for (int64_t s = 0; s < sub; ++s) {
    const int64_t c = g * sub + s;
    const int8_t* ap = a0 + c * kt;
    const uint8_t* bp = wt + (2 * c + h) * 16 * kt;
    if constexpr (T % 2 == 0) {
      KILN_TILE_LOAD(4, ap, stride);
      KILN_TILE_LOAD(6, bp, 64);
    } else {
      KILN_TILE_LOAD(5, ap, stride);
      KILN_TILE_LOAD(7, bp, 64);
    }
    if constexpr (T == 0) _tile_dpbssd(0, 4, 6);
    if constexpr (T == 1) _tile_dpbssd(1, 5, 7);
    if constexpr (T == 2) _tile_dpbssd(2, 4, 6);
    if constexpr (T == 3) _tile_dpbssd(3, 5, 7);
  }
}

template <int T>
KILN_CPU_INLINE void qb4w_store(int32_t* buf) {
  if constexpr (T == 0) _tile_stored(0, buf, 64);
  if constexpr (T == 1) _tile_stored(1, buf, 64);
  if constexpr (T == 2) _tile_stored(2, buf, 64);
  if constexpr (T == 3) _tile_stored(3, buf, 64);
}

// f[r] += s_g * sum[r] for the 16 rows (the avx512vnni panels' fmadd, with its sum's
// dot - 8 * sum q).
KILN_CPU_INLINE void qb4w_add(const int32_t* buf, const float* s, __m512 (&f)[16]) {
  const __m512 sv = _mm512_load_ps(s);
  #pragma GCC unroll 16
  for (int r = 0; r < 16; ++r) f[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(buf + 16 * r)), sv, f[r]);
}

void qb4w_panel_tile_rows(const Qd8Rows& a, int64_t m0, int64_t k, const Qb4wPanels& w, int64_t n, int64_t p,
                          const uint8_t* wt, const float* sc, int kt, const float* bias, float* y, int64_t ldy,
                          float lo, float hi) {
  const int64_t G = w.group, groups = k / G, sub = G / kt;
  const int8_t* a0 = reinterpret_cast<const int8_t*>(a.data + m0 * a.stride);
  alignas(64) int32_t buf[4][256];
  const int64_t j0 = p * kQb4wPanel;
  for (int h = 0; h < 2; ++h) {
    const int64_t left = n - (j0 + 16 * h);
    if (left <= 0) break;
    __m512 f[16];
    #pragma GCC unroll 16
    for (int r = 0; r < 16; ++r) f[r] = _mm512_setzero_ps();
    auto step = [&](auto tile, int64_t g) KILN_CPU_LAMBDA {
      constexpr int T = decltype(tile)::value;
      qb4w_store<T>(buf[T]);
      if (g + 2 < groups) qb4w_issue<(T + 2) % 4>(a0, a.stride, wt, g + 2, sub, kt, h);
      if (g >= 2) qb4w_add(buf[(T + 2) % 4], sc + 32 * (g - 2) + 16 * h, f);
    };
    qb4w_issue<0>(a0, a.stride, wt, 0, sub, kt, h);
    if (groups > 1) qb4w_issue<1>(a0, a.stride, wt, 1, sub, kt, h);
    for (int64_t g = 0; g < groups; g += 4) {
      step(std::integral_constant<int, 0>{}, g);
      if (g + 1 < groups) step(std::integral_constant<int, 1>{}, g + 1);
      if (g + 2 < groups) step(std::integral_constant<int, 2>{}, g + 2);
      if (g + 3 < groups) step(std::integral_constant<int, 3>{}, g + 3);
    }
    for (int64_t g = groups < 2 ? 0 : groups - 2; g < groups; ++g) qb4w_add(buf[g % 4], sc + 32 * g + 16 * h, f);
    // y = s_x * (acc - zp * sums) + bias, clamped, as the avx512vnni panels
    const __mmask16 mask = left >= 16 ? __mmask16{0xffff} : static_cast<__mmask16>((1u << left) - 1);
    const __m512 sums = _mm512_maskz_loadu_ps(mask, w.sums + j0 + 16 * h);
    const __m512 b = bias ? _mm512_maskz_loadu_ps(mask, bias + j0 + 16 * h) : _mm512_setzero_ps();
    #pragma GCC unroll 16
    for (int r = 0; r < 16; ++r) {
      const __m512 t = _mm512_fnmadd_ps(_mm512_set1_ps(static_cast<float>(a.zp[m0 + r])), sums, f[r]);
      __m512 v = _mm512_fmadd_ps(_mm512_set1_ps(a.scale[m0 + r]), t, b);
      v = _mm512_min_ps(_mm512_max_ps(v, _mm512_set1_ps(lo)), _mm512_set1_ps(hi));
      _mm512_mask_storeu_ps(y + (m0 + r) * ldy + j0 + 16 * h, mask, v);
    }
  }
}

void qb4w_panels_amx(const Qd8Rows& a, int64_t m, int64_t k, const Qb4wPanels& w, int64_t n, int64_t p0, int64_t p1,
                     const float* bias, float* y, int64_t ldy, float lo, float hi) {
  const int kt = w.group == 32 ? 32 : 64;
  const size_t tile_bytes = static_cast<size_t>(k) * 32, scale_bytes = static_cast<size_t>(k / w.group) * 32 * 4;
  uint8_t* wt = m >= kAmxMinRows && amx_permitted() ? t_weights.get(tile_bytes + scale_bytes) : nullptr;
  if (wt == nullptr) return qb4w_panels_avx512<true>(a, m, k, w, n, p0, p1, bias, y, ldy, lo, hi);
  float* sc = reinterpret_cast<float*>(wt + tile_bytes);
  const int64_t tiled = m / 16 * 16;
  const size_t pb = qb4w_panel_bytes(k, w.group);
  TileScope tiles(kt);
  for (int64_t p = p0; p < p1; ++p) {
    qb4w_panel_tiles(w.data + static_cast<size_t>(p) * pb, k, w.group, kt, wt, sc);
    for (int64_t m0 = 0; m0 < tiled; m0 += 16)
      qb4w_panel_tile_rows(a, m0, k, w, n, p, wt, sc, kt, bias, y, ldy, lo, hi);
    // the rows past the last whole tile: the avx512vnni blocks, on this panel while it is in cache
    for_row_blocks(m - tiled, [&](auto rows, int64_t r0) KILN_CPU_LAMBDA {
      qb4w_panel_rows<true, decltype(rows)::value>(a, tiled + r0, k, w, n, p, p + 1, bias, y, ldy, lo, hi);
    });
  }
}

}  // namespace
}  // namespace kiln::cpu

const kiln::cpu::Qd8GemmVariant kiln::cpu::qd8_gemm__amx = {
    "qd8_gemm__amx", kiln::cpu::Isa::Amx, true,
    kiln::cpu::by_row_blocks<kiln::cpu::Avx512<true>, kiln::cpu::Qb4wWeights>, kiln::cpu::qc8w_amx,
    kiln::cpu::qb4w_panels_amx};

KILN_CPU_TARGET_END
#endif
