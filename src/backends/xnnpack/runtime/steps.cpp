// kiln's own code for the steps of an XNNPACK delegate that do not run on the
// XNNPACK library: GEMM/GEMV fully-connected products and the tied LM head,
// batch matmul, transpose, slice, concatenate, elementwise maps, and fused
// row chains. Each splits its work over the backend's thread pool (cpu::ThreadPool);
// none allocates. The products run on kiln::cpu's f32-gemm and f32-gemv families,
// the elementwise maps and row chains on f32-vunary, f32-vbinary and f32-rows.
#include "backend_state.h"
#include "kiln/cpu/config.h"
#include "kiln/cpu/gemm.h"
#include "kiln/cpu/quant.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

namespace kiln::backends::xnnpack::detail {

// ---------------------------------------------------------------- kiln's steps

LiveSpan live_span(const float* mask, int64_t rows, int64_t n) {
  LiveSpan all;
  all.hi[0] = all.lo[1] = all.hi[1] = n;
  auto kept = [](float v) { return !(v <= kMaskedBelow); };  // NaN: kept
  for (int64_t r = 0; r < rows; ++r) {  // a row that keeps nothing: all n, as eager
    const float* row = mask + r * n;
    int64_t j = 0;
    while (j < n && !kept(row[j])) ++j;
    if (j == n) return all;
  }
  auto column_kept = [&](int64_t j) {  // by some row (the last rows, a prompt's latest queries, keep the most)
    for (int64_t r = rows - 1; r >= 0; --r)
      if (kept(mask[r * n + j])) return true;
    return false;
  };
  int64_t first = -1, last = -1, gap_lo = 0, gap_hi = 0;  // the longest hidden run between kept columns
  for (int64_t j = 0; j < n; ++j) {
    if (!column_kept(j)) continue;
    if (first < 0) {
      first = j;
    } else if (j - last - 1 > gap_hi - gap_lo) {
      gap_lo = last + 1;
      gap_hi = j;
    }
    last = j;
  }
  if (first < 0) return all;  // no rows
  LiveSpan s;
  s.lo[0] = first;
  s.hi[1] = last + 1;
  s.hi[0] = gap_hi > gap_lo ? gap_lo : last + 1;
  s.lo[1] = gap_hi > gap_lo ? gap_hi : last + 1;
  return s;
}

void run_bmm(const Exec& ex, const Step& s, const float* a, const float* b, float* c, const LiveSpan* live) {
  LiveSpan span;  // the positions computed (all without `live`)
  if (live != nullptr && live->count() > 0) {
    span = *live;
  } else {
    span.hi[0] = span.lo[1] = span.hi[1] = s.trans_b ? s.n : s.k;
  }
  const int64_t len0 = span.hi[0] - span.lo[0], len1 = span.hi[1] - span.lo[1];
  if (s.trans_b) {  // C[i] = A[i] · B[i]ᵀ, B[i] [n, k]; a few rows of A: dot products
    const cpu::F32GemvVariant& gemv = cpu::f32_gemv_config();
    const int64_t n = len0 + len1;  // the live positions, the second interval's after the first's
    // one thread: one call per batch (the kernel prefetches ahead within a call; B, a KV cache, comes
    // from memory once per token)
    const int64_t col_blocks = ex.threads <= 1 ? 1 : std::max<int64_t>(1, std::min<int64_t>((n + 63) / 64, 4 * static_cast<int64_t>(ex.threads)));
    const int64_t cols = (n + col_blocks - 1) / col_blocks;
    ex.parallel_for(static_cast<size_t>(s.batch * col_blocks), [&](size_t t) {
      const int64_t bi = static_cast<int64_t>(t) / col_blocks, v0 = (static_cast<int64_t>(t) % col_blocks) * cols;
      const int64_t v1 = std::min(n, v0 + cols);
      const float* ab = a + bi * s.a_batch_stride;
      const float* bb = b + bi * s.b_batch_stride;
      float* cb = c + bi * s.m * s.n;
      if (n < s.n && v0 == 0)  // the masked positions: 0 (any finite value gives the same softmax: 0 there)
        for (int64_t r = 0; r < s.m; ++r) {
          float* row = cb + r * s.n;
          std::fill(row, row + span.lo[0], 0.0f);
          std::fill(row + span.hi[0], row + span.lo[1], 0.0f);
          std::fill(row + span.hi[1], row + s.n, 0.0f);
        }
      for (int iv = 0; iv < 2; ++iv) {  // this block's part of each interval
        const int64_t base = iv == 0 ? 0 : len0, len = iv == 0 ? len0 : len1;
        const int64_t x0 = std::max(v0, base), x1 = std::min(v1, base + len);
        const int64_t j = span.lo[iv] + (x0 - base);
        if (x1 > x0) gemv.dot_block(ab, s.k, s.m, bb + j * s.k, s.k, x1 - x0, s.k, cb + j, s.n);
      }
    });
    return;
  }
  // C[i] = A[i] · B[i], row-major, batches of A/B broadcast when their stride is 0.
  // live: A's other columns are 0 (the softmax of masked positions), so the live rows of B give the product
  if (s.m <= 8) {  // a few rows (decode attention's P · V: the query heads of one KV head): stream B once, in
    // place, as one sequential read (the GEMM would pack it first); parallel over batches
    const cpu::F32GemvVariant& gemv = cpu::f32_gemv_config();
    ex.parallel_for(static_cast<size_t>(s.batch), [&](size_t t) {
      const int64_t bi = static_cast<int64_t>(t);
      float* cb = c + bi * s.m * s.n;
      std::fill(cb, cb + s.m * s.n, 0.0f);
      for (int iv = 0; iv < 2; ++iv)
        if (span.hi[iv] > span.lo[iv])
          gemv.axpy_rows(a + bi * s.a_batch_stride + span.lo[iv], s.k, s.m, span.hi[iv] - span.lo[iv],
                         b + bi * s.b_batch_stride + span.lo[iv] * s.n, s.n, s.n, cb, s.n);
    });
    return;
  }
  // Parallel over batches and over blocks of rows.
  const int64_t row_blocks = std::max<int64_t>(1, std::min<int64_t>((s.m + 63) / 64, 4 * static_cast<int64_t>(ex.threads)));
  const int64_t rows = (s.m + row_blocks - 1) / row_blocks;
  ex.parallel_for(static_cast<size_t>(s.batch * row_blocks), [&](size_t t) {
    int64_t bi = static_cast<int64_t>(t) / row_blocks, r0 = (static_cast<int64_t>(t) % row_blocks) * rows;
    int64_t r1 = std::min(s.m, r0 + rows);
    if (r1 <= r0) return;
    bool accumulate = false;
    for (int iv = 0; iv < 2; ++iv) {
      const int64_t lo = span.lo[iv], len = span.hi[iv] - lo;
      if (len == 0 && (iv == 1 || len1 > 0)) continue;  // (an empty product still writes C once)
      cpu::sgemm(r1 - r0, s.n, len, 1.0f, a + bi * s.a_batch_stride + r0 * s.k + lo, s.k,
                 b + bi * s.b_batch_stride + lo * s.n, s.n, accumulate, c + bi * s.m * s.n + r0 * s.n, s.n);
      accumulate = true;
    }
  });
}

// out[M, N] = x[M, K] · W[N, K]ᵀ for the tied LM head, whose graph says
// transpose(bmm(W, transpose(x))): per block of W's rows, one GEMM into a
// small tile (in the stack) and its transpose into out, so the [N, M]
// intermediate never exists. `xt` is x transposed, [K, M].
// out[i, j] = tile[j, i] for i < mb, j < nb (row stride ldo): f32-rows' block transpose (in registers)
static void transpose_tile(const float* tile, int64_t mb, int64_t nb, float* out, int64_t ldo) {
  cpu::f32_rows_config().transpose(tile, mb, nb, mb, out, ldo);
}

// x's rows or xt's packed panels (run_lm_head) go into the step's scratch, sized by fuse_lm_head for the
// rows' upper bound (the executor checks this call's rows against it), so a run allocates nothing.
int64_t lm_head_scratch_floats(int64_t m, int64_t k) {
  return m < kGemvRows ? 0 : std::max(m * k, cpu::sgemm_packed_floats(k, m));
}

void run_lm_head(const Exec& ex, Step& s, const float* w, const float* w_panels, const float* xt, float* out) {
  constexpr int64_t kBlock = 128;
  const int64_t M = s.m, N = s.n, K = s.k;
  if (M < kGemvRows) {  // a few tokens: one pass over W, dot products with x's rows (xt's columns)
    const cpu::F32GemvVariant& gemv = cpu::f32_gemv_config();
    const int64_t blocks = std::max<int64_t>(1, std::min<int64_t>((N + 1023) / 1024, 16 * static_cast<int64_t>(ex.threads)));
    const int64_t rows = (N + blocks - 1) / blocks;
    ex.parallel_for(static_cast<size_t>(blocks), [&](size_t t) {
      const int64_t n0 = static_cast<int64_t>(t) * rows, n1 = std::min(N, n0 + rows);
      alignas(64) float x[kGemvRows][1024];
      if (K > 1024) return;  // checked at init
      for (int64_t m = 0; m < M; ++m)
        for (int64_t p = 0; p < K; ++p) x[m][p] = xt[p * M + m];
      // Where the GEMM packs its weights once (cpu::sgemm_pack_once: the AVX-512 rows, measured there; the
      // other rows keep the loop they were measured with): blocks of W's rows against every row of x (AVX-512: 16 rows at a
      // time, one transposing reduction per 16 sums; a dot product and its horizontal sum per output ran at
      // 11 GB/s of W on a Xeon).
      if (cpu::sgemm_pack_once()) {
        if (n1 > n0) gemv.dot_block(x[0], 1024, M, w + n0 * K, K, n1 - n0, K, out + n0, N);
        return;
      }
      for (int64_t n = n0; n < n1; ++n)
        for (int64_t m = 0; m < M; ++m) out[m * N + n] = gemv.dot(x[m], w + n * K, K);
    });
    return;
  }
  if (w_panels) {  // Wᵀ packed once (fuse_lm_head, or the first call: lm_head_panels): x · Wᵀ into the logits' rows, tasks of whole panels
    // x [M, K] from xt [K, M], in the step's scratch (M x K floats, small next to the product)
    float* x = s.scratch.data();  // M x K floats (lm_head_scratch_floats)
    for (int64_t p = 0; p < K; ++p)
      for (int64_t m = 0; m < M; ++m) x[m * K + p] = xt[p * M + m];
    const int64_t width = cpu::sgemm_panel_width();
    const int64_t tasks = std::max<int64_t>(1, std::min<int64_t>((N + width - 1) / width, kTasksPerThread * ex.threads));
    const int64_t cols = ((N + tasks - 1) / tasks + width - 1) / width * width;
    ex.parallel_for(static_cast<size_t>(tasks), [&](size_t t) {
      const int64_t n0 = static_cast<int64_t>(t) * cols, nb = std::min(cols, N - n0);
      if (nb > 0) cpu::sgemm_packed(M, nb, K, 1.0f, x, K, w_panels + n0 * K, false, out + n0, N, true);
    });
    return;
  }
  // Tasks of consecutive blocks: each task's transposed stores share cache lines with another task's only at
  // its two ends (one block per task, the two threads wrote neighbouring blocks' edges into the same lines of
  // every output row at once).
  auto tasks_of = [&](int64_t blocks) { return std::max<int64_t>(1, std::min(blocks, kTasksPerThread * ex.threads)); };
  if (!cpu::sgemm_pack_once() && M % cpu::sgemm_panel_width() != 0) {
    // The AVX2, NEON and generic rows where the tokens are not a whole number of the GEMM's panels (GPT-2's 128
    // in 24-wide AVX2 panels): W as the transposed B, blocks of its rows a whole number of panels each, x as A.
    // With W as A and xt as B (below), the last panel of every block ran part empty: 144 columns computed for
    // 128, 12.5% of the head's multiply-adds wasted. Each output is the same sum in the same order either way
    // (K in the same blocks, the same fused multiply-adds), so the logits are the same bits.
    float* x = s.scratch.data();  // M x K floats (lm_head_scratch_floats)
    for (int64_t p = 0; p < K; ++p)
      for (int64_t m = 0; m < M; ++m) x[m * K + p] = xt[p * M + m];
    const int64_t width = cpu::sgemm_panel_width(), rows = std::max<int64_t>(width, kBlock / width * width);
    const int64_t blocks = (N + rows - 1) / rows, tasks = tasks_of(blocks), per = (blocks + tasks - 1) / tasks;
    ex.parallel_for(static_cast<size_t>(tasks), [&](size_t t) {
      for (int64_t b = static_cast<int64_t>(t) * per; b < std::min(blocks, (static_cast<int64_t>(t) + 1) * per); ++b) {
        const int64_t n0 = b * rows, nb = std::min(rows, N - n0);
        cpu::sgemm_bt(M, nb, K, 1.0f, x, K, w + n0 * K, K, false, out + n0, N);
      }
    });
    return;
  }
  if (!cpu::sgemm_pack_once()) {  // the AVX2, NEON and generic rows: B (xt) packed per call, as measured there
    const int64_t blocks = (N + kBlock - 1) / kBlock, tasks = tasks_of(blocks), per = (blocks + tasks - 1) / tasks;
    ex.parallel_for(static_cast<size_t>(tasks), [&](size_t t) {
      alignas(64) float tile[kBlock * 256];  // kBlock KiB of the worker's stack
      for (int64_t b = static_cast<int64_t>(t) * per; b < std::min(blocks, (static_cast<int64_t>(t) + 1) * per); ++b) {
        const int64_t n0 = b * kBlock, nb = std::min(kBlock, N - n0);
        for (int64_t m0 = 0; m0 < M; m0 += 256) {
          int64_t mb = std::min<int64_t>(256, M - m0);
          cpu::sgemm(nb, mb, K, 1.0f, w + n0 * K, K, xt + m0, M, false, tile, mb);
          transpose_tile(tile, mb, nb, out + m0 * N + n0, N);
        }
      }
    });
    return;
  }
  // xt [K, M] packed once per run as the GEMM's B panels (each of W's row blocks reads them in place), in
  // the step's scratch
  float* xp = s.scratch.data();  // sgemm_packed_floats(K, M) floats (lm_head_scratch_floats)
  cpu::sgemm_pack_b(K, M, xt, M, false, xp);
  // W's rows in blocks of whole register tiles (the last tile of a 128-row block of 6-row tiles was a third full)
  const int64_t mr = cpu::f32_gemm_config().mr, rows = std::max<int64_t>(mr, kBlock / mr * mr);
  const int64_t width = cpu::sgemm_panel_width(), chunk = std::max<int64_t>(width, 256 / width * width);
  const int64_t blocks = (N + rows - 1) / rows, tasks = tasks_of(blocks), per = (blocks + tasks - 1) / tasks;
  ex.parallel_for(static_cast<size_t>(tasks), [&](size_t t) {
    alignas(64) float tile[kBlock * 256];  // kBlock KiB of the worker's stack
    for (int64_t b = static_cast<int64_t>(t) * per; b < std::min(blocks, (static_cast<int64_t>(t) + 1) * per); ++b) {
      // tile[nb, M] = W[n0:n0+nb, :] · xt; M is small here (the sequence), checked at init
      const int64_t n0 = b * rows, nb = std::min(rows, N - n0);
      for (int64_t m0 = 0; m0 < M; m0 += chunk) {  // chunk: whole panels, at most 256 columns
        int64_t mb = std::min<int64_t>(chunk, M - m0);
        cpu::sgemm_packed(nb, mb, K, 1.0f, w + n0 * K, K, xp + m0 * K, false, tile, mb);
        transpose_tile(tile, mb, nb, out + m0 * N + n0, N);
      }
    }
  });
}

// out[m, n] = x[m, k] · W[k, n] (+ bias), clamped; parallel over column blocks
// (over rows when W has a few columns).
void run_fully_connected(const Exec& ex, const Step& s, const float* x, float* out) {
  if (s.group_sums) {  // out[r, j] = sum_i x[r, j g + i] (+ bias), clamped (nodes/fully_connected.cpp)
    const int64_t g = s.group;
    const int64_t parts = std::max<int64_t>(1, std::min<int64_t>(s.m / 16, kTasksPerThread * ex.threads));
    const int64_t per = (s.m + parts - 1) / parts;
    ex.parallel_for(static_cast<size_t>(parts), [&](size_t t) {
      const int64_t r0 = static_cast<int64_t>(t) * per, r1 = std::min(s.m, r0 + per);
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t j = 0; j < s.n; ++j) {
          const float* v = x + r * s.k + j * g;
          float acc[8] = {};
          int64_t i = 0;
          for (; i + 8 <= g; i += 8)
            for (int l = 0; l < 8; ++l) acc[l] += v[i + l];
          float sum = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
          for (; i < g; ++i) sum += v[i];
          if (s.bias) sum += s.bias[j];
          out[r * s.n + j] = std::min(std::max(sum, s.lo), s.hi);
        }
    });
    return;
  }
  const cpu::F32GemvVariant& gemv = cpu::f32_gemv_config();  // a few rows: streaming products (W read once)
  if (s.weights_nk && s.m < kGemvRows) {  // W [n, k], a few rows: each task reads one contiguous block of W's rows
    const int64_t blocks = std::max<int64_t>(1, std::min<int64_t>((s.n + 31) / 32, kTasksPerThread * ex.threads));
    const int64_t per = (s.n + blocks - 1) / blocks;
    ex.parallel_for(static_cast<size_t>(blocks), [&](size_t t) {
      const int64_t n0 = static_cast<int64_t>(t) * per, n1 = std::min(s.n, n0 + per);
      for (int64_t j = n0; j < n1; ++j) {
        const float* wj = s.weights + j * s.k;
        const float b = s.bias ? s.bias[j] : 0.0f;
        for (int64_t r = 0; r < s.m; ++r)
          out[r * s.n + j] = std::min(std::max(gemv.dot(x + r * s.k, wj, s.k) + b, s.lo), s.hi);
      }
    });
    return;
  }
  if (s.m < kGemvRows && s.n >= 4) {
    const int64_t blocks = std::max<int64_t>(1, std::min<int64_t>((s.n + 127) / 128, kTasksPerThread * ex.threads));
    const int64_t cols = ((s.n + blocks - 1) / blocks + 15) / 16 * 16;
    ex.parallel_for(static_cast<size_t>(blocks), [&](size_t t) {
      const int64_t n0 = static_cast<int64_t>(t) * cols, nb = std::min(cols, s.n - n0);
      if (nb <= 0) return;
      for (int64_t r = 0; r < s.m; ++r) {
        if (s.bias) std::memcpy(out + r * s.n + n0, s.bias + n0, static_cast<size_t>(nb) * sizeof(float));
        else std::memset(out + r * s.n + n0, 0, static_cast<size_t>(nb) * sizeof(float));
      }
      gemv.axpy_rows(x, s.k, s.m, s.k, s.weights + n0, s.n, nb, out + n0, s.n);
      if (s.lo != -INFINITY || s.hi != INFINITY)
        for (int64_t r = 0; r < s.m; ++r)
          for (int64_t j = n0; j < n0 + nb; ++j) out[r * s.n + j] = std::min(std::max(out[r * s.n + j], s.lo), s.hi);
    });
    return;
  }
  if (s.n < 4 && !s.weights_nk) {  // W [k, n] with a few columns: columns of W, strided
    const int64_t parts = std::max<int64_t>(1, std::min<int64_t>(s.m / 16, kTasksPerThread * ex.threads));
    const int64_t per = (s.m + parts - 1) / parts;
    ex.parallel_for(static_cast<size_t>(parts), [&](size_t t) {
      const int64_t r0 = static_cast<int64_t>(t) * per, r1 = std::min(s.m, r0 + per);
      for (int64_t c = 0; c < s.n; ++c) {
        if (r1 > r0) gemv.dot_rows(x + r0 * s.k, s.k, r1 - r0, s.k, s.weights + c, s.n, out + r0 * s.n + c, s.n);
        for (int64_t r = r0; r < r1; ++r) {
          float& o = out[r * s.n + c];
          if (s.bias) o += s.bias[c];
          o = std::min(std::max(o, s.lo), s.hi);
        }
      }
    });
    return;
  }
  // columns in whole panels of the packed weights (64 otherwise: the AVX-512 tiles' width)
  const int64_t width = s.weights_panels ? cpu::sgemm_panel_width() : 64;
  const int64_t tasks = std::max<int64_t>(1, std::min<int64_t>((s.n + width - 1) / width, kTasksPerThread * ex.threads));
  const int64_t cols = ((s.n + tasks - 1) / tasks + width - 1) / width * width;
  ex.parallel_for(static_cast<size_t>(tasks), [&](size_t t) {
    const int64_t n0 = static_cast<int64_t>(t) * cols, nb = std::min(cols, s.n - n0);
    if (nb <= 0) return;
    if (s.bias)
      for (int64_t i = 0; i < s.m; ++i) std::memcpy(out + i * s.n + n0, s.bias + n0, static_cast<size_t>(nb) * sizeof(float));
    if (s.weights_panels)
      cpu::sgemm_packed(s.m, nb, s.k, 1.0f, x, s.k, s.weights + n0 * s.k, s.bias != nullptr, out + n0, s.n, true);
    else if (s.weights_nk)  // W as the file has it, [n, k] (a dynamic delegate keeps one layout for every size):
      cpu::sgemm_bt(s.m, nb, s.k, 1.0f, x, s.k, s.weights + n0 * s.k, s.k, s.bias != nullptr, out + n0, s.n);
    else
      cpu::sgemm(s.m, nb, s.k, 1.0f, x, s.k, s.weights + n0, s.n, s.bias != nullptr, out + n0, s.n);
    if (s.lo != -INFINITY || s.hi != INFINITY)
      for (int64_t i = 0; i < s.m; ++i)
        for (int64_t j = n0; j < n0 + nb; ++j) out[i * s.n + j] = std::min(std::max(out[i * s.n + j], s.lo), s.hi);
  });
}

// x [m, k] fp32 -> int8 rows (a cpu::Qd8Rows block in `out`'s bytes).
void run_quantize_rows(const Exec& ex, const Step& s, const float* x, float* out) {
  (void)ex;  // m x k work, small next to the products that read it
  cpu::Qd8Rows rows;
  cpu::qd8_quantize_rows(x, s.m, s.k, s.k, static_cast<cpu::Qd8Layout>(s.rows_layout), out, &rows);
}

// y [m, n] = rows [m, k] · W[n, k]ᵀ for int4 (groups) or int8 (channels) weights;
// parallel over blocks of output columns.
void run_qfully_connected(const Exec& ex, const Step& s, const float* rows_bytes, float* y) {
  const cpu::Qd8Rows rows = cpu::qd8_rows_view(rows_bytes, s.m, s.k, static_cast<cpu::Qd8Layout>(s.rows_layout));
  const cpu::Qd8GemmVariant& v = cpu::qd8_gemm_config();
  if (s.qb4w_panels) {  // tasks of whole panels (32 outputs)
    // a task reads at least ~48 KB of weights: a one-token product of a small layer (SmolLM2's
    // 192 x 576 k / v projections: 55 KB) takes a few microseconds, what waking a thread costs
    const int64_t panels = (s.n + cpu::kQb4wPanel - 1) / cpu::kQb4wPanel;
    const auto panel_bytes = static_cast<int64_t>(cpu::qb4w_panel_bytes(s.k, s.group));
    const int64_t by_work = std::max<int64_t>(1, s.m * panels * panel_bytes / (48 << 10));
    const int64_t tasks = std::max<int64_t>(1, std::min({panels, kTasksPerThread * ex.threads, by_work}));
    const int64_t per = (panels + tasks - 1) / tasks;
    const cpu::Qb4wPanels wp{static_cast<const uint8_t*>(s.qweights), s.weight_sums, s.group};
    ex.parallel_for(static_cast<size_t>(tasks), [&](size_t t) {
      const int64_t p0 = static_cast<int64_t>(t) * per, p1 = std::min(panels, p0 + per);
      if (p1 > p0) v.qb4w_panels(rows, s.m, s.k, wp, s.n, p0, p1, s.bias, y, s.n, s.lo, s.hi);
    });
    return;
  }
  const int64_t blocks = std::max<int64_t>(1, std::min<int64_t>((s.n + 15) / 16, kTasksPerThread * ex.threads));
  const int64_t cols = ((s.n + blocks - 1) / blocks + 3) / 4 * 4;
  const cpu::Qb4wWeights w4{static_cast<const uint8_t*>(s.qweights), s.group_scales, s.weight_sums, s.group};
  const cpu::Qc8wWeights w8{static_cast<const int8_t*>(s.qweights), s.channel_scales, s.weight_sums};
  ex.parallel_for(static_cast<size_t>(blocks), [&](size_t t) {
    const int64_t n0 = static_cast<int64_t>(t) * cols, n1 = std::min(s.n, n0 + cols);
    if (n1 <= n0) return;
    if (s.group > 0) v.qb4w(rows, s.m, s.k, w4, n0, n1, s.bias, y, s.n, s.lo, s.hi);
    else v.qc8w(rows, s.m, s.k, w8, n0, n1, s.bias, y, s.n, s.lo, s.hi);
  });
}

// Element strides of a contiguous tensor of `rank` dims.
static std::array<int64_t, kMaxRank> row_major_strides(const std::array<int64_t, kMaxRank>& dims, uint32_t rank) {
  std::array<int64_t, kMaxRank> stride{};
  int64_t st = 1;
  for (int i = static_cast<int>(rank) - 1; i >= 0; --i) {
    stride[static_cast<size_t>(i)] = st;
    st *= dims[static_cast<size_t>(i)];
  }
  return stride;
}

void run_transpose(const Exec& ex, const Step& s, const float* in, float* out) {
  const uint32_t r = s.rank;
  const std::array<int64_t, kMaxRank> in_stride = row_major_strides(s.in_dims, r);
  // the output's dims and, for each, the input stride it walks
  std::array<int64_t, kMaxRank> od{}, os{};
  for (uint32_t i = 0; i < r; ++i) {
    od[i] = s.out_dims[i];
    os[i] = in_stride[static_cast<size_t>(s.perm[i])];
  }
  if (r == 2 || (r >= 2 && os[r - 1] != 1)) {
    // the last output dim walks a strided input dim: blocked over the last two output dims
    const int64_t R = od[r - 2], C = od[r - 1];
    const int64_t sr = os[r - 2], sc = os[r - 1];
    int64_t outer = 1;
    for (uint32_t i = 0; i + 2 < r; ++i) outer *= od[i];
    constexpr int64_t B = 32;
    const int64_t rb = (R + B - 1) / B;
    const Exec serial;  // a small transpose (a one-token step's heads) is cheaper than a fork and join
    (elementwise_pieces(outer * rb, 2, outer * R * C) > 1 ? ex : serial).parallel_for(static_cast<size_t>(outer * rb), [&](size_t t) {
      int64_t o = static_cast<int64_t>(t) / rb, r0 = (static_cast<int64_t>(t) % rb) * B;
      int64_t base = 0, rem = o;
      for (int i = static_cast<int>(r) - 3; i >= 0; --i) {
        base += (rem % od[static_cast<size_t>(i)]) * os[static_cast<size_t>(i)];
        rem /= od[static_cast<size_t>(i)];
      }
      float* dst = out + o * R * C;
      if (sr == 1) {  // out[i, j] = in[j * sc + i]: a 2-D transpose of rows r0.. (f32-rows' block transpose)
        cpu::f32_rows_config().transpose(in + base + r0, sc, C, std::min(B, R - r0), dst + r0 * C, C);
        return;
      }
      for (int64_t c0 = 0; c0 < C; c0 += B)
        for (int64_t i = r0; i < std::min(R, r0 + B); ++i)
          for (int64_t j = c0; j < std::min(C, c0 + B); ++j) dst[i * C + j] = in[base + i * sr + j * sc];
    });
    return;
  }
  // the last output dim is contiguous in the input: copy rows
  const int64_t row = od[r - 1];
  int64_t rows = 1;
  for (uint32_t i = 0; i + 1 < r; ++i) rows *= od[i];
  const int64_t parts = elementwise_pieces(rows, 4 * ex.threads, rows * row);
  ex.parallel_for(static_cast<size_t>(parts), [&](size_t t) {
    int64_t per = (rows + parts - 1) / parts;
    for (int64_t q = static_cast<int64_t>(t) * per; q < std::min(rows, (static_cast<int64_t>(t) + 1) * per); ++q) {
      int64_t base = 0, rem = q;
      for (int i = static_cast<int>(r) - 2; i >= 0; --i) {
        base += (rem % od[static_cast<size_t>(i)]) * os[static_cast<size_t>(i)];
        rem /= od[static_cast<size_t>(i)];
      }
      std::memcpy(out + q * row, in + base, static_cast<size_t>(row) * sizeof(float));
    }
  });
}

void run_slice(const Exec& ex, const Step& s, const float* in, float* out) {
  // rows of the innermost dim, each a contiguous run; in pieces over the pool (GPT-2's q/k/v splits copy 128
  // rows of 768 floats each)
  const uint32_t r = s.rank;
  const std::array<int64_t, kMaxRank> in_stride = row_major_strides(s.in_dims, r);
  const int64_t row = s.out_dims[r - 1];
  int64_t rows = 1;
  for (uint32_t i = 0; i + 1 < r; ++i) rows *= s.out_dims[i];
  const int64_t parts = elementwise_pieces(rows, 4 * ex.threads, rows * row), per = (rows + parts - 1) / parts;
  ex.parallel_for(static_cast<size_t>(parts), [&](size_t t) {
    for (int64_t q = static_cast<int64_t>(t) * per; q < std::min(rows, (static_cast<int64_t>(t) + 1) * per); ++q) {
      int64_t base = s.offsets[r - 1], rem = q;
      for (int i = static_cast<int>(r) - 2; i >= 0; --i) {
        const auto d = static_cast<size_t>(i);
        base += (rem % s.out_dims[d] + s.offsets[d]) * in_stride[d];
        rem /= s.out_dims[d];
      }
      std::memcpy(out + q * row, in + base, static_cast<size_t>(row) * sizeof(float));
    }
  });
}

void run_unary(const Exec& ex, const Step& s, const float* in, float* out) {
  const int64_t n = s.count;
  const int64_t parts = std::max<int64_t>(1, std::min<int64_t>(n / 16384, kTasksPerThread * ex.threads));
  const int64_t per = (n + parts - 1) / parts;
  ex.parallel_for(static_cast<size_t>(parts), [&](size_t t) {
    int64_t b = static_cast<int64_t>(t) * per, e = std::min(n, b + per);
    const cpu::F32VUnaryVariant& vu = cpu::f32_vunary_config();
    const float* x = in + b;
    float* y = out + b;
    switch (s.unary) {
      case UnaryOp::Tanh: vu.tanh(x, y, e - b); break;
      case UnaryOp::Rsqrt: vu.rsqrt(x, y, e - b); break;
      case UnaryOp::Gelu: vu.gelu(x, y, e - b); break;
      case UnaryOp::Exp: vu.exp(x, y, e - b); break;
      case UnaryOp::Log: vu.log(x, y, e - b); break;
      case UnaryOp::Sin: vu.sin(x, y, e - b); break;
      case UnaryOp::Cos: vu.cos(x, y, e - b); break;
      case UnaryOp::Copy: std::memcpy(y, x, static_cast<size_t>(e - b) * sizeof(float)); break;
    }
    if (s.lo != -INFINITY || s.hi != INFINITY) vu.clamp(y, y, e - b, s.lo, s.hi);
  });
}

void run_concat(const Step& s, std::span<const float* const> ins, float* out) {
  int64_t total = 0;
  for (size_t j = 0; j < s.in.size(); ++j) total += s.widths[j];
  for (int64_t o = 0; o < s.outer; ++o) {
    float* dst = out + o * total;
    for (size_t j = 0; j < s.in.size(); ++j) {
      std::memcpy(dst, ins[j] + o * s.widths[j], static_cast<size_t>(s.widths[j]) * sizeof(float));
      dst += s.widths[j];
    }
  }
}


// ---------------------------------------------------------------- fused rows

// out = a op b over n floats; a scalar operand (as/bs) is one float for all n.
static void row_binary(RowOpKind k, const float* a, bool as, const float* b, bool bs, float* o, int64_t n) {
  const cpu::F32VBinaryVariant& vb = cpu::f32_vbinary_config();
  const cpu::F32VBinaryForms* f = nullptr;
  switch (k) {
    case RowOpKind::Add: f = &vb.add; break;
    case RowOpKind::Sub: f = &vb.sub; break;
    case RowOpKind::Mul: f = &vb.mul; break;
    case RowOpKind::Div: f = &vb.div; break;
    case RowOpKind::Max: f = &vb.max; break;
    case RowOpKind::Min: f = &vb.min; break;
    default: return;
  }
  if (as && bs) {  // one value for the whole row
    if (n <= 0) return;
    f->vv(a, b, o, 1);
    std::fill(o + 1, o + n, o[0]);
  } else {
    (as ? f->sv : bs ? f->vs : f->vv)(a, b, o, n);
  }
}

static void row_unary(RowOpKind k, const float* in, float* o, int64_t n) {
  const cpu::F32VUnaryVariant& vu = cpu::f32_vunary_config();
  switch (k) {
    case RowOpKind::Square: vu.square(in, o, n); break;
    case RowOpKind::Sqrt: vu.sqrt(in, o, n); break;
    case RowOpKind::Rsqrt: vu.rsqrt(in, o, n); break;
    case RowOpKind::Neg: vu.neg(in, o, n); break;
    case RowOpKind::Abs: vu.abs(in, o, n); break;
    case RowOpKind::Sigmoid: vu.sigmoid(in, o, n); break;
    case RowOpKind::Tanh: vu.tanh(in, o, n); break;
    case RowOpKind::Exp: vu.exp(in, o, n); break;
    case RowOpKind::Gelu: vu.gelu(in, o, n); break;
    case RowOpKind::GeluTanh: vu.gelu_tanh(in, o, n); break;
    case RowOpKind::Copy: if (o != in) std::memcpy(o, in, static_cast<size_t>(n) * sizeof(float)); break;
    default: break;
  }
}

// Runs a fused chain: its rows (for an elementwise chain, the rows' column chunks: rows_chunk)
// split into step.tasks blocks; each row goes through every op with its intermediate rows in the
// task's scratch (L1/L2-resident).
constexpr int64_t kRowChunk = 512;  // floats: 2 KiB of each slot

// A chain of elementwise operations only (no row reduction, no softmax, no per-row scalar) runs over each
// row in column chunks, all its operations on one chunk before the next: the chunks of its slots stay in
// L1 (whole rows of GPT-2's MLP, 12 KiB a slot, did not: its tanh GELU's nine operations ran at a third
// of the speed). Every element gets the same operations in the same order either way. The chunks are
// also what the tasks split: one long row (a 262144-wide LM head's logits through Gemma's soft cap)
// runs on every thread.
int64_t rows_chunk(const std::vector<RowOp>& ops, int64_t cols) {
  bool elementwise = cols > kRowChunk;
  for (const RowOp& op : ops)
    elementwise = elementwise && !op.out_scalar && op.kind != RowOpKind::Softmax &&
                  op.kind != RowOpKind::ScaledSoftmax && op.kind != RowOpKind::RowDot;
  // (a row of no columns still runs once: its per-row scalars are written)
  return elementwise ? kRowChunk : std::max<int64_t>(cols, 1);
}

void run_rows(const Exec& ex, Step& s, const std::vector<Group>& groups, std::byte* arena, std::span<EValue*> args) {
  for (size_t m = 0; m < s.in.size(); ++m)  // memory operands and written groups, resolved once per call
    s.slot_ptr[static_cast<size_t>(s.tasks * s.slots) + m] = const_cast<float*>(s.in[m].data(groups, arena, args));
  float* const* base = s.slot_ptr.data() + s.tasks * s.slots;
  const int64_t C = s.cols;
  const cpu::F32GemvVariant& gemv = cpu::f32_gemv_config();
  const cpu::F32RowsVariant& rows = cpu::f32_rows_config();
  const cpu::F32VUnaryVariant& vu = cpu::f32_vunary_config();
  const int64_t chunk = rows_chunk(s.row_ops, C);
  const int64_t chunks = std::max<int64_t>(1, (C + chunk - 1) / chunk);
  const int64_t units = s.rows * chunks, per = (units + s.tasks - 1) / s.tasks;
  ex.parallel_for(static_cast<size_t>(s.tasks), [&](size_t t) {
    float** sp = s.slot_ptr.data() + static_cast<int64_t>(t) * s.slots;
    float* scratch = s.scratch.data() + static_cast<int64_t>(t) * s.scratch_per_task;
    const int64_t u1 = std::min(units, (static_cast<int64_t>(t) + 1) * per);
    for (int64_t rc = static_cast<int64_t>(t) * per; rc < u1; ++rc) {
      const int64_t r = rc / chunks, c0 = rc % chunks * chunk;  // one chunk of a row: all of it unless `elementwise`
      for (const RowOp& op : s.row_ops) {
        auto fetch = [&](const RowOperand& x) -> const float* {
          if (x.src == RowOperand::Src::Slot) return sp[x.index];
          if (x.src == RowOperand::Src::Memory) {
            // (no division where the rows do not repeat, or all repeat one: a constant, a bias)
            const int64_t rr = x.period == 1 ? 0 : x.period >= s.rows ? r : r % x.period;
            return base[x.index] + rr * (x.scalar ? 1 : C) + (x.scalar ? 0 : c0);
          }
          return nullptr;
        };
        const float* a = fetch(op.a);
        const float* b = fetch(op.b);
        float* out = op.write_group >= 0 ? base[op.write_group] + r * (op.out_scalar ? 1 : C) + (op.out_scalar ? 0 : c0)
                                         : scratch + s.slot_offset[static_cast<size_t>(op.out_slot)] + (op.out_scalar ? 0 : c0);
        sp[op.out_slot] = out;
        const int64_t n = op.out_scalar ? 1 : std::min(chunk, C - c0);
        switch (op.kind) {
          case RowOpKind::Add: case RowOpKind::Sub: case RowOpKind::Mul: case RowOpKind::Div: case RowOpKind::Max:
          case RowOpKind::Min:
            row_binary(op.kind, a, op.a.scalar && !op.out_scalar, b, op.b.scalar && !op.out_scalar, out, n);
            break;
          case RowOpKind::Softmax: rows.softmax(a, out, n); break;
          case RowOpKind::ScaledSoftmax: rows.softmax_scaled(a, op.bias, b, out, n); break;
          case RowOpKind::RowDot: out[0] = gemv.dot(a, op.w, C) + op.bias; break;
          default: row_unary(op.kind, a, out, n); break;
        }
        if (op.lo != -INFINITY || op.hi != INFINITY) vu.clamp(out, out, n, op.lo, op.hi);
      }
    }
  });
}

// How operand `e` broadcasts against output `d` seen as rows of d's last dim:
// full rows (e's last dim is d's) or one value per row (e's last dim 1),
// repeating every `period` rows; false if e is not numpy-broadcastable that way.
bool row_mode(const Value& e, const Value& d, int64_t* period, bool* scalar) {
  const uint32_t n = d.ndims;
  if (n == 0 || e.ndims > n) return false;
  std::array<int64_t, kMaxRank> ed{};
  for (uint32_t i = 0; i < n; ++i) ed[i] = i < n - e.ndims ? 1 : e.dims[i - (n - e.ndims)];
  const int64_t C = d.dims[n - 1];
  if (C == 1 || ed[n - 1] == 1) *scalar = true;
  else if (ed[n - 1] == C) *scalar = false;
  else return false;
  uint32_t k = n - 1;
  while (k > 0 && ed[k - 1] == d.dims[k - 1]) --k;
  for (uint32_t i = 0; i < k; ++i)
    if (ed[i] != 1) return false;
  *period = 1;
  for (uint32_t i = k; i + 1 < n; ++i) *period *= d.dims[i];
  return true;
}


}  // namespace kiln::backends::xnnpack::detail
