// kiln_gemm_bench: every f32-gemm and f32-gemv variant of kiln's CPU layer,
// alone on one thread, on GPT-2 small's shapes -- the GEMMs at seq_len 128
// (C[128, N] = A[128, K] · B[K, N], B row-major [K, N] as mm/addmm and the
// XNNPACK backend call it) and the GEMVs at one token (out[1, N] += x · W[K, N],
// and the tied LM head's 50257 dot products of length 768). GFLOP/s by wall
// clock and by thread CPU time, and the CPU-time rate as a fraction of the
// measured fp32 FMA peak of the variant's ISA. Not a test; run by hand:
// The qd8 x qb4w / qc8w products (8da4w / 8da8w) follow, on SmolLM2-135M's and
// GPT-2's linear shapes: GOP/s (two integer ops per multiply-add), the share of
// the int8 peak of the variant's product instruction (probed here, as the FMA
// peak is) and GB/s of weights (int4: half a byte per weight plus the bf16 scales).
//   build/kiln_gemm_bench [min_seconds_per_measurement [SECTION...]]
// SECTION: f32-gemm, f32-gemv or qd8-gemm (default: all three), or qd8-dram (not in the default):
// the one-row (decode) qb4w panel product of each runnable variant over 256 MB of panels in huge
// pages -- memory, not cache -- against a one-stream and a four-stream read of the same buffer, the
// rounds alternating: whether a decode step's products run at the memory's speed, and at which
// pattern's (kiln_bandwidth's roofline takes the faster).
#include "kiln/cpu/config.h"
#include "kiln/cpu/gemm.h"
#include "kiln/cpu/quant.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <random>
#include <string>
#include <vector>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif
#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace {

using kiln::cpu::Isa;

double now_wall() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double now_cpu() {  // this thread's CPU time: robust to other processes sharing the cores
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

// The core's fp32 ceiling for one vector width: 12 independent chains of
// multiply-adds (enough to cover the FMA latency on two pipes), no memory
// traffic. Fused where the ISA has FMA; 2 flops per lane either way.
template <int kBytes>
struct VecOf {
  typedef float type __attribute__((vector_size(kBytes)));
};

template <int kBytes>
inline __attribute__((always_inline)) double peak_loop(double seconds) {
  using V = typename VecOf<kBytes>::type;
  constexpr int kLanes = kBytes / 4;
  V acc[12];
  const V mul = V{} + 1.0000001f, add = V{} + 1e-7f;
  for (int i = 0; i < 12; ++i) acc[i] = V{} + static_cast<float>(i);
  long rounds = 0;
  const double c0 = now_cpu();
  double c1 = c0;
  while (c1 - c0 < seconds) {
    for (int r = 0; r < 100000; ++r)
#pragma GCC unroll 12
      for (int i = 0; i < 12; ++i) acc[i] = acc[i] * mul + add;
    rounds += 100000;
    c1 = now_cpu();
  }
  float sink = 0;
  for (int i = 0; i < 12; ++i) sink += acc[i][0];
  volatile float keep = sink;
  (void)keep;
  return static_cast<double>(rounds) * 12 * kLanes * 2 / (c1 - c0) * 1e-9;
}

double peak_generic(double s) { return peak_loop<16>(s); }
#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx2,fma"))) double peak_avx2(double s) { return peak_loop<32>(s); }
__attribute__((target("avx512f,fma"))) double peak_avx512(double s) { return peak_loop<64>(s); }
#endif

// The core's int8 ceiling for each qd8-gemm variant's product instruction: independent chains, no
// memory traffic; two ops per multiply-add. avx2 / avx512: vpmaddubsw alone (u8 x s8 pairs summed into
// i16: a bound, since a product also widens its sums to i32); avx512vnni: vpdpbusd; amx: tdpbssd
// (16 x 64 by 64 x 16 int8, four accumulator tiles), the tile state granted by the library (the amx
// variant runnable).
#if defined(__x86_64__) && defined(__GNUC__)
// Runs BODY (one round of ops_per_round ops) for `seconds` of this thread's CPU time; the GOP/s in `g`.
// (A macro, not a lambda: a lambda does not take its caller's target ISA.)
#define KILN_INT8_RATE(g, seconds, ops_per_round, BODY)                              \
  do {                                                                               \
    long rounds_ = 0;                                                                \
    const double c0_ = now_cpu();                                                    \
    double c1_ = c0_;                                                                \
    while (c1_ - c0_ < (seconds)) {                                                  \
      for (int r_ = 0; r_ < 10000; ++r_) { BODY }                                    \
      rounds_ += 10000;                                                              \
      c1_ = now_cpu();                                                               \
    }                                                                                \
    (g) = static_cast<double>(rounds_) * (ops_per_round) / (c1_ - c0_) * 1e-9;       \
  } while (0)

__attribute__((target("avx2"))) double int8_peak_avx2(double s) {
  __m256i acc[12];
  const __m256i b = _mm256_set1_epi8(1);
  for (int i = 0; i < 12; ++i) acc[i] = _mm256_set1_epi8(static_cast<char>(i + 1));
  double g = 0;
  KILN_INT8_RATE(g, s, 12 * 32 * 2, {
    _Pragma("GCC unroll 12") for (int i = 0; i < 12; ++i) acc[i] = _mm256_maddubs_epi16(acc[i], b);  // each chain its own input
  });
  for (int i = 1; i < 12; ++i) acc[0] = _mm256_add_epi32(acc[0], acc[i]);  // every chain feeds the result
  alignas(32) int32_t o[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(o), acc[0]);
  volatile int keep = o[0];
  (void)keep;
  return g;
}

__attribute__((target("avx512f,avx512bw"))) double int8_peak_avx512(double s) {
  __m512i acc[12];
  const __m512i b = _mm512_set1_epi8(1);
  for (int i = 0; i < 12; ++i) acc[i] = _mm512_set1_epi8(static_cast<char>(i + 1));
  double g = 0;
  KILN_INT8_RATE(g, s, 12 * 64 * 2, {
    _Pragma("GCC unroll 12") for (int i = 0; i < 12; ++i) acc[i] = _mm512_maddubs_epi16(acc[i], b);
  });
  for (int i = 1; i < 12; ++i) acc[0] = _mm512_add_epi32(acc[0], acc[i]);  // every chain feeds the result
  alignas(64) int32_t o[16];
  _mm512_store_si512(o, acc[0]);
  volatile int keep = o[0];
  (void)keep;
  return g;
}

__attribute__((target("avx512f,avx512bw,avx512vnni"))) double int8_peak_vnni(double s) {
  __m512i acc[12];
  const __m512i a = _mm512_set1_epi8(3), b = _mm512_set1_epi8(-2);
  for (int i = 0; i < 12; ++i) acc[i] = _mm512_set1_epi32(i);
  double g = 0;
  KILN_INT8_RATE(g, s, 12 * 64 * 2, {
    _Pragma("GCC unroll 12") for (int i = 0; i < 12; ++i) acc[i] = _mm512_dpbusd_epi32(acc[i], a, b);
  });
  for (int i = 1; i < 12; ++i) acc[0] = _mm512_add_epi32(acc[0], acc[i]);  // every chain feeds the result
  alignas(64) int32_t o[16];
  _mm512_store_si512(o, acc[0]);
  volatile int keep = o[0];
  (void)keep;
  return g;
}

struct alignas(64) AmxConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

__attribute__((target("amx-tile,amx-int8"))) double int8_peak_amx(double s) {
  AmxConfig c;  // tmm0-3: 16 x 16 int32 sums; tmm4: 16 x 64 int8 rows; tmm6: 16 x 64 (64 x 16 in fours)
  for (int t = 0; t < 8; ++t) c.colsb[t] = 64, c.rows[t] = 16;
  alignas(64) static int8_t data[16 * 64];
  for (int i = 0; i < 16 * 64; ++i) data[i] = static_cast<int8_t>(i % 7 - 3);
  _tile_loadconfig(&c);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  __asm__ volatile("" ::: "memory");
  _tile_loadd(4, data, 64);
  _tile_loadd(6, data, 64);
  double g = 0;
  KILN_INT8_RATE(g, s, 4 * 16.0 * 16 * 64 * 2, {
    _tile_dpbssd(0, 4, 6);
    _tile_dpbssd(1, 4, 6);
    _tile_dpbssd(2, 4, 6);
    _tile_dpbssd(3, 4, 6);
  });
  alignas(64) static int32_t out[16 * 16];
  _tile_stored(0, out, 64);
  _tile_release();
  volatile int keep = out[0];
  (void)keep;
  return g;
}
#endif

// The int8 peak (GOP/s) of a qd8-gemm variant's product instruction on this core, or 0 where none is probed.
double int8_peak_gops(const kiln::cpu::Qd8GemmVariant& v, double seconds) {
#if defined(__x86_64__) && defined(__GNUC__)
  const std::string name = v.name;
  if (name == "qd8_gemm__amx") return int8_peak_amx(seconds);
  if (name == "qd8_gemm__avx512vnni") return int8_peak_vnni(seconds);
  if (name == "qd8_gemm__avx512") return int8_peak_avx512(seconds);
  if (name == "qd8_gemm__avx2") return int8_peak_avx2(seconds);
#endif
  (void)v, (void)seconds;
  return 0;
}

double fma_peak_gflops(Isa isa, double seconds) {
  switch (isa) {
#if defined(__x86_64__) && defined(__GNUC__)
    case Isa::Avx512: return peak_avx512(seconds);
    case Isa::Avx2: return peak_avx2(seconds);
#endif
    default: return peak_generic(seconds);
  }
}

struct Timing {
  double ms, gflops_wall, gflops_cpu;
};

// Runs call() (after one warm-up) for at least min_seconds and three calls.
template <typename F>
Timing time_it(double min_seconds, double flop, const F& call) {
  call();
  int iters = 0;
  const double w0 = now_wall(), c0 = now_cpu();
  double w1 = w0;
  while (w1 - w0 < min_seconds || iters < 3) {
    call();
    ++iters;
    w1 = now_wall();
  }
  const double c1 = now_cpu();
  return {(w1 - w0) / iters * 1e3, flop * iters / (w1 - w0) * 1e-9, flop * iters / (c1 - c0) * 1e-9};
}

struct Shape {
  int64_t m, k, n;
  const char* what;
};

// Largest error of a sample of C's entries against a double-precision dot product, relative to sum |a b|.
double max_rel_error(const Shape& s, const std::vector<float>& a, const std::vector<float>& b, const std::vector<float>& c) {
  double worst = 0;
  std::mt19937 rng(1);
  for (int t = 0; t < 256; ++t) {
    const int64_t i = static_cast<int64_t>(rng() % static_cast<uint32_t>(s.m));
    const int64_t j = static_cast<int64_t>(rng() % static_cast<uint32_t>(s.n));
    double ref = 0, mag = 0;
    for (int64_t p = 0; p < s.k; ++p) {
      const double t2 = static_cast<double>(a[static_cast<size_t>(i * s.k + p)]) * b[static_cast<size_t>(p * s.n + j)];
      ref += t2;
      mag += std::fabs(t2);
    }
    const double err = std::fabs(ref - c[static_cast<size_t>(i * s.n + j)]) / (mag > 0 ? mag : 1);
    if (err > worst) worst = err;
  }
  return worst;
}

std::vector<float> random_floats(size_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& e : v) e = dist(rng);
  return v;
}

// Sums of 32-bit words over [p, p + bytes) read as `streams` equal parts side by side (64 bytes of
// each in turn), 8 independent sums: the loop waits on memory, not on the adds.
#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx2"))) uint32_t read_streams_avx2(const uint8_t* p, size_t bytes, int streams) {
  const size_t part = bytes / static_cast<size_t>(streams) / 64 * 64;
  __m256i s0 = _mm256_setzero_si256(), s1 = s0, s2 = s0, s3 = s0, s4 = s0, s5 = s0, s6 = s0, s7 = s0;
  if (streams == 1) {
    for (size_t i = 0; i + 256 <= part; i += 256) {
      const __m256i* q = reinterpret_cast<const __m256i*>(p + i);
      s0 = _mm256_add_epi32(s0, _mm256_load_si256(q)), s1 = _mm256_add_epi32(s1, _mm256_load_si256(q + 1));
      s2 = _mm256_add_epi32(s2, _mm256_load_si256(q + 2)), s3 = _mm256_add_epi32(s3, _mm256_load_si256(q + 3));
      s4 = _mm256_add_epi32(s4, _mm256_load_si256(q + 4)), s5 = _mm256_add_epi32(s5, _mm256_load_si256(q + 5));
      s6 = _mm256_add_epi32(s6, _mm256_load_si256(q + 6)), s7 = _mm256_add_epi32(s7, _mm256_load_si256(q + 7));
    }
  } else {  // four
    for (size_t i = 0; i + 64 <= part; i += 64) {
      const __m256i* a = reinterpret_cast<const __m256i*>(p + i);
      const __m256i* b = reinterpret_cast<const __m256i*>(p + part + i);
      const __m256i* c = reinterpret_cast<const __m256i*>(p + 2 * part + i);
      const __m256i* d = reinterpret_cast<const __m256i*>(p + 3 * part + i);
      s0 = _mm256_add_epi32(s0, _mm256_load_si256(a)), s1 = _mm256_add_epi32(s1, _mm256_load_si256(a + 1));
      s2 = _mm256_add_epi32(s2, _mm256_load_si256(b)), s3 = _mm256_add_epi32(s3, _mm256_load_si256(b + 1));
      s4 = _mm256_add_epi32(s4, _mm256_load_si256(c)), s5 = _mm256_add_epi32(s5, _mm256_load_si256(c + 1));
      s6 = _mm256_add_epi32(s6, _mm256_load_si256(d)), s7 = _mm256_add_epi32(s7, _mm256_load_si256(d + 1));
    }
  }
  const __m256i t = _mm256_add_epi32(_mm256_add_epi32(_mm256_add_epi32(s0, s1), _mm256_add_epi32(s2, s3)),
                                     _mm256_add_epi32(_mm256_add_epi32(s4, s5), _mm256_add_epi32(s6, s7)));
  alignas(32) uint32_t lanes[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), t);
  uint32_t r = 0;
  for (uint32_t v : lanes) r += v;
  return r;
}
#endif

uint32_t read_streams(const uint8_t* p, size_t bytes, int streams) {
#if defined(__x86_64__) && defined(__GNUC__)
  if (__builtin_cpu_supports("avx2")) return read_streams_avx2(p, bytes, streams);
#endif
  const size_t part = bytes / static_cast<size_t>(streams) / 64 * 64;
  uint32_t acc[16] = {};
  for (size_t i = 0; i + 64 <= part; i += 64)
    for (int s = 0; s < streams; ++s) {
      uint32_t w[16];
      std::memcpy(w, p + static_cast<size_t>(s) * part + i, 64);
      for (int j = 0; j < 16; ++j) acc[j] += w[j];
    }
  uint32_t r = 0;
  for (uint32_t v : acc) r += v;
  return r;
}

// The qd8-dram section (see the top of the file).
void qd8_dram(std::mt19937& rng) {
  using namespace kiln::cpu;
  const int64_t k = 2048, group = 32, tile_n = 4096;  // one 2048 x 4096 matrix of panels, repeated
  const size_t tile_bytes = qb4w_panels_bytes(tile_n, k, group), huge = size_t{2} << 20;
  const int64_t tiles = static_cast<int64_t>((size_t{256} << 20) / tile_bytes), n = tiles * tile_n;
  const size_t bytes = tile_bytes * static_cast<size_t>(tiles), alloc = (bytes + huge - 1) / huge * huge;
  auto* buf = static_cast<uint8_t*>(std::aligned_alloc(huge, alloc));
  if (buf == nullptr) {
    std::printf("\nqd8-dram: no memory for %zu bytes\n", alloc);
    return;
  }
#if defined(__linux__)
  ::madvise(buf, alloc, MADV_HUGEPAGE);  // as kiln's runtime keeps the weights a one-token step streams
#endif
  std::vector<uint8_t> w4(static_cast<size_t>(tile_n * k / 2));
  for (auto& b : w4) b = static_cast<uint8_t>(rng());
  const std::vector<uint16_t> sc(static_cast<size_t>(tile_n * (k / group)), f32_to_bf16(0.01f));
  qb4w_pack_panels(w4.data(), sc.data(), tile_n, k, group, buf);
  for (int64_t t = 1; t < tiles; ++t) std::memcpy(buf + static_cast<size_t>(t) * tile_bytes, buf, tile_bytes);
  std::vector<float> sums(static_cast<size_t>(n), 1.0f), y(static_cast<size_t>(n));
  const std::vector<float> x = random_floats(static_cast<size_t>(k), rng);
  std::vector<uint8_t> ws(qd8_rows_bytes(1, k, Qd8Layout::Signed) + 64);
  void* aligned = reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(ws.data()) + 63) / 64 * 64);
  Qd8Rows rows;
  qd8_quantize_rows(x.data(), 1, k, k, Qd8Layout::Signed, aligned, &rows);
  const Qb4wPanels qp{buf, sums.data(), group};
  std::vector<const Qd8GemmVariant*> vs;
  for (const Qd8GemmVariant& v : qd8_gemm_variants())
    if (qd8_gemm_runnable(v) && v.qb4w_panels) vs.push_back(&v);
  // rounds alternate the order of the cells; wall-clock GB/s of the buffer, median of the rounds
  const int rounds = 9;
  std::vector<std::vector<double>> gbs(vs.size() + 2);
  volatile uint32_t sink = 0;
  for (int r = 0; r < rounds; ++r)
    for (size_t i = 0; i < gbs.size(); ++i) {
      const size_t c = r % 2 ? gbs.size() - 1 - i : i;
      const double w0 = now_wall();
      if (c == 0) sink = sink + read_streams(buf, bytes, 1);
      else if (c == 1) sink = sink + read_streams(buf, bytes, 4);
      else vs[c - 2]->qb4w_panels(rows, 1, k, qp, n, 0, n / kQb4wPanel, nullptr, y.data(), n, -INFINITY, INFINITY);
      gbs[c].push_back(static_cast<double>(bytes) / (now_wall() - w0) * 1e-9);
    }
  auto med = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  const double one = med(gbs[0]), four = med(gbs[1]);
  std::printf("\nqd8-dram: one row (decode) x %lld x %lld qb4w panels, %.0f MB in huge pages (GB/s by wall clock, median of %d\n"
              "alternating rounds; the reads: the same buffer summed as one stream, and as four parts side by side)\n"
              "read, 1 stream          %8.1f GB/s\nread, 4 streams         %8.1f GB/s\n",
              static_cast<long long>(k), static_cast<long long>(n), static_cast<double>(bytes) / 1e6, rounds, one, four);
  for (size_t i = 0; i < vs.size(); ++i) {
    const double g = med(gbs[i + 2]);
    std::printf("%-24s%8.1f GB/s  (%.0f%% of 1 stream, %.0f%% of 4 streams)\n", vs[i]->name, g, 100 * g / one, 100 * g / four);
  }
  std::free(buf);
}

}  // namespace

int main(int argc, char** argv) {
  using namespace kiln::cpu;
  const double min_seconds = argc > 1 ? std::atof(argv[1]) : 1.0;
  bool want[4] = {argc <= 2, argc <= 2, argc <= 2, false};  // f32-gemm, f32-gemv, qd8-gemm, qd8-dram
  bool usage_ok = min_seconds > 0;
  for (int i = 2; i < argc; ++i) {
    const std::string section = argv[i];
    if (section == "f32-gemm") want[0] = true;
    else if (section == "f32-gemv") want[1] = true;
    else if (section == "qd8-gemm") want[2] = true;
    else if (section == "qd8-dram") want[3] = true;
    else usage_ok = false;
  }
  if (!usage_ok) {
    std::fprintf(stderr, "usage: kiln_gemm_bench [min_seconds_per_measurement > 0, default 1 [SECTION...]]\n"
                         "  SECTION: f32-gemm, f32-gemv or qd8-gemm (default: all three), or qd8-dram\n");
    return 2;
  }
  std::printf("kiln CPU micro-kernels, single thread. This CPU: best ISA %s; selected (KILN_CPU_ISA or best): %s -> %s, %s\n",
              isa_name(best_isa()), isa_name(active_isa()), f32_gemm_config().name, f32_gemv_config().name);
  std::printf("512-bit FMA pipes (measured, or KILN_FMA512_PIPES): %d\n", cpu_fma512_pipes());
  std::printf("GFLOP/s by wall clock and by thread CPU time (the latter discounts time the core ran others);\n"
              "%%peak: the CPU-time rate over the fp32 FMA peak of the variant's ISA on one core (no memory traffic)\n");
  double peak[3] = {0, 0, 0};
  for (Isa isa : {Isa::Avx512, Isa::Avx2, Isa::Generic})
    if (isa_supported(isa)) {
      peak[static_cast<int>(isa)] = fma_peak_gflops(isa, min_seconds);
      std::printf("fp32 FMA peak, %-7s: %.1f GFLOP/s\n", isa_name(isa), peak[static_cast<int>(isa)]);
    }

  std::mt19937 rng(0);
  if (want[3]) qd8_dram(rng);
  if (want[0]) {
  std::printf("\nf32-gemm (seq_len 128; B as rows [K, N], packed per call, then B packed once as the variant's panels: +P)\n%-24s %-20s %-12s %10s %10s %10s %7s %12s\n", "variant", "M x K x N", "layer",
              "ms/call", "GFLOP/s", "(cpu)", "%peak", "max rel err");
  const Shape gemm_shapes[] = {{128, 768, 768, "attn c_proj"}, {128, 768, 2304, "attn c_attn"}, {128, 768, 3072, "mlp c_fc"},
                               {128, 3072, 768, "mlp c_proj"}, {128, 768, 50257, "lm_head"}};
  for (const Shape& s : gemm_shapes) {
    const std::vector<float> a = random_floats(static_cast<size_t>(s.m * s.k), rng),
                             b = random_floats(static_cast<size_t>(s.k * s.n), rng);
    std::vector<float> c(static_cast<size_t>(s.m * s.n));
    for (const F32GemmVariant& v : f32_gemm_variants()) {
      if (!isa_supported(v.isa)) {
        std::printf("%-24s not run: this CPU lacks %s\n", v.name, isa_name(v.isa));
        continue;
      }
      const double flop = 2.0 * static_cast<double>(s.m) * static_cast<double>(s.k) * static_cast<double>(s.n);
      char dims[64];
      std::snprintf(dims, sizeof(dims), "%lld x %lld x %lld", static_cast<long long>(s.m), static_cast<long long>(s.k),
                    static_cast<long long>(s.n));
      std::vector<float> packed(static_cast<size_t>((s.n + v.nr - 1) / v.nr * v.nr * s.k));
      sgemm_pack_b_width(v.nr, s.k, s.n, b.data(), s.n, false, packed.data());
      for (bool panels : {false, true}) {
        const Timing t = time_it(min_seconds, flop, [&] {
          if (panels) v.gemm_packed(s.m, s.n, s.k, 1.0f, a.data(), s.k, packed.data(), 0, false, c.data(), s.n);
          else v.gemm(s.m, s.n, s.k, 1.0f, a.data(), s.k, b.data(), s.n, false, c.data(), s.n);
        });
        std::string name = std::string(v.name) + (panels ? " +P" : "");
        std::printf("%-24s %-20s %-12s %10.3f %10.1f %10.1f %6.1f%% %12.2e\n", name.c_str(), dims, s.what, t.ms,
                    t.gflops_wall, t.gflops_cpu, 100.0 * t.gflops_cpu / peak[static_cast<int>(v.isa)],
                    max_rel_error(s, a, b, c));
      }
    }
  }

  }

  if (want[1]) {
  std::printf("\nf32-gemv (one token; GB/s: the weights read per second, by CPU time)\n%-24s %-20s %-12s %10s %10s %10s %7s %8s\n",
              "variant", "K x N", "layer", "ms/call", "GFLOP/s", "(cpu)", "%peak", "GB/s");
  const Shape gemv_shapes[] = {{1, 768, 2304, "attn c_attn"}, {1, 768, 768, "attn c_proj"}, {1, 768, 3072, "mlp c_fc"},
                               {1, 3072, 768, "mlp c_proj"}, {1, 768, 50257, "lm_head dot"}};
  for (const Shape& s : gemv_shapes) {
    const bool dots = s.n == 50257;  // the tied LM head: W is [N, K], one dot product per output
    const std::vector<float> x = random_floats(static_cast<size_t>(s.k), rng),
                             w = random_floats(static_cast<size_t>(s.k * s.n), rng);
    std::vector<float> out(static_cast<size_t>(s.n));
    for (const F32GemvVariant& v : f32_gemv_variants()) {
      if (!isa_supported(v.isa)) {
        std::printf("%-24s not run: this CPU lacks %s\n", v.name, isa_name(v.isa));
        continue;
      }
      const double flop = 2.0 * static_cast<double>(s.k) * static_cast<double>(s.n);
      const Timing t = time_it(min_seconds, flop, [&] {
        if (dots) {
          for (int64_t j = 0; j < s.n; ++j) out[static_cast<size_t>(j)] = v.dot(x.data(), w.data() + j * s.k, s.k);
        } else {
          for (float& e : out) e = 0.0f;
          v.axpy_rows(x.data(), s.k, 1, s.k, w.data(), s.n, s.n, out.data(), s.n);
        }
      });
      char dims[64];
      std::snprintf(dims, sizeof(dims), "%lld x %lld", static_cast<long long>(s.k), static_cast<long long>(s.n));
      const double gbs = t.gflops_cpu / 2.0 * 4.0;  // one 4-byte weight per multiply-add
      std::printf("%-24s %-20s %-12s %10.3f %10.1f %10.1f %6.1f%% %8.1f\n", v.name, dims, s.what, t.ms, t.gflops_wall,
                  t.gflops_cpu, 100.0 * t.gflops_cpu / peak[static_cast<int>(v.isa)], gbs);
    }
  }
  }

  if (want[2]) {
  // each variant's product instruction alone: the int8 ceiling %peak is measured against
  std::vector<double> i8peak;
  for (const Qd8GemmVariant& v : qd8_gemm_variants()) {
    i8peak.push_back(qd8_gemm_runnable(v) ? int8_peak_gops(v, min_seconds) : 0.0);
    if (i8peak.back() > 0) std::printf("int8 peak, %-22s: %.1f GOP/s\n", v.name, i8peak.back());
  }
  std::printf("\nqd8 x qb4w (group 32) and qd8 x qc8w; m = 1: one token, m = 128: a prompt (GOP/s and weight GB/s by CPU time;\n"
              "%%peak: GOP/s over the int8 peak of the variant's product instruction, above; amx below 16 rows: VNNI's)\n"
              "%-24s %-5s %-16s %-12s %5s %10s %10s %7s %8s %10s\n",
              "variant", "w", "M x K x N", "layer", "", "ms/call", "GOP/s", "%peak", "GB/s", "(quantize ms)");
  const Shape q_shapes[] = {{1, 576, 1536, "smollm2 up"}, {1, 1536, 576, "smollm2 down"}, {1, 768, 3072, "gpt2 c_fc"},
                            {128, 576, 1536, "smollm2 up"}, {128, 768, 3072, "gpt2 c_fc"}};
  using namespace kiln::cpu;
  for (const Shape& s : q_shapes) {
    const std::vector<float> x = random_floats(static_cast<size_t>(s.m * s.k), rng);
    std::vector<uint8_t> w4(static_cast<size_t>(s.n * ((s.k + 1) / 2)));
    std::vector<int8_t> w8(static_cast<size_t>(s.n * s.k));
    for (auto& b : w4) b = static_cast<uint8_t>(rng());
    for (auto& b : w8) b = static_cast<int8_t>(rng());
    const int64_t group = 32;
    std::vector<uint16_t> sc(static_cast<size_t>(s.n * (s.k / group)), f32_to_bf16(0.01f));
    std::vector<float> sc8(static_cast<size_t>(s.n), 0.01f), sums4(static_cast<size_t>(s.n)), sums8(static_cast<size_t>(s.n));
    qb4w_weight_sums(w4.data(), sc.data(), s.n, s.k, group, sums4.data());
    qc8w_weight_sums(w8.data(), sc8.data(), s.n, s.k, sums8.data());
    std::vector<float> y(static_cast<size_t>(s.m * s.n));
    // qb4w in kiln's panels (packed once, as at load), the same weights
    std::vector<uint8_t> pw(qb4w_panels_bytes(s.n, s.k, group) + 64);
    auto* panels = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(pw.data()) + 63) / 64 * 64);
    qb4w_pack_panels(w4.data(), sc.data(), s.n, s.k, group, panels);
    const Qb4wPanels qp{panels, sums4.data(), group};
    for (Qd8Layout layout : {Qd8Layout::Nibbles, Qd8Layout::Signed, Qd8Layout::Plain}) {
      std::vector<uint8_t> ws(qd8_rows_bytes(s.m, s.k, layout) + 64);
      void* aligned = reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(ws.data()) + 63) / 64 * 64);
      Qd8Rows rows;
      const Timing tq = time_it(min_seconds / 4, 1.0, [&] { qd8_quantize_rows(x.data(), s.m, s.k, s.k, layout, aligned, &rows); });
      const bool b4 = layout != Qd8Layout::Plain, on_panels = layout == Qd8Layout::Signed;
      const Qb4wWeights qb{w4.data(), sc.data(), sums4.data(), group};
      const Qc8wWeights qc{w8.data(), sc8.data(), sums8.data()};
      for (size_t vi = 0; vi < qd8_gemm_variants().size(); ++vi) {
        const Qd8GemmVariant& v = qd8_gemm_variants()[vi];
        if (!qd8_gemm_runnable(v)) {
          std::printf("%-24s not run: this CPU lacks it\n", v.name);
          continue;
        }
        if (on_panels && !v.qb4w_panels) continue;
        const double ops = 2.0 * static_cast<double>(s.m) * static_cast<double>(s.k) * static_cast<double>(s.n);
        const Timing t = time_it(min_seconds, ops, [&] {
          if (on_panels) v.qb4w_panels(rows, s.m, s.k, qp, s.n, 0, (s.n + kQb4wPanel - 1) / kQb4wPanel, nullptr, y.data(), s.n, -INFINITY, INFINITY);
          else if (b4) v.qb4w(rows, s.m, s.k, qb, 0, s.n, nullptr, y.data(), s.n, -INFINITY, INFINITY);
          else v.qc8w(rows, s.m, s.k, qc, 0, s.n, nullptr, y.data(), s.n, -INFINITY, INFINITY);
        });
        const double wbytes = b4 ? static_cast<double>(w4.size() + 2 * sc.size()) : static_cast<double>(w8.size());
        char dims[64];
        std::snprintf(dims, sizeof(dims), "%lld x %lld x %lld", static_cast<long long>(s.m), static_cast<long long>(s.k),
                      static_cast<long long>(s.n));
        char share[16] = "-";
        double peak_of = i8peak[vi];
        if (std::string(v.name) == "qd8_gemm__amx" && s.m < 16)  // a few rows: the amx variant runs its VNNI code
          for (size_t u = 0; u < qd8_gemm_variants().size(); ++u)
            if (std::string(qd8_gemm_variants()[u].name) == "qd8_gemm__avx512vnni") peak_of = i8peak[u];
        if (peak_of > 0) std::snprintf(share, sizeof(share), "%.1f%%", 100.0 * t.gflops_cpu / peak_of);
        std::printf("%-24s %-5s %-16s %-12s %5s %10.3f %10.1f %7s %8.1f %10.3f\n", v.name, on_panels ? "qb4wP" : b4 ? "qb4w" : "qc8w", dims, s.what,
                    "", t.ms, t.gflops_cpu, share, wbytes * t.gflops_cpu / ops, tq.ms);
      }
    }
  }
  }
  return 0;
}
