// kiln_gemm_bench: GFLOP/s of kiln's fp32 GEMM core (single thread) on the
// GPT-2 small projection shapes at seq_len 128: C[128, N] = A[128, 768] · B[768, N]
// with B row-major [K, N], as mm/addmm call it. Not a test; run by hand:
//   build/kiln_gemm_bench [min_seconds_per_shape]
#include "kiln/cpu/gemm.h"

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <random>
#include <vector>

namespace {

struct Shape {
  int64_t m, k, n;
  const char* what;
};

double seconds_now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Checks a sample of C's entries against a double-precision dot product.
double max_rel_error(const Shape& s, const std::vector<float>& a, const std::vector<float>& b,
                     const std::vector<float>& c) {
  double worst = 0;
  std::mt19937 rng(1);
  for (int t = 0; t < 256; ++t) {
    int64_t i = static_cast<int64_t>(rng() % static_cast<uint32_t>(s.m));
    int64_t j = static_cast<int64_t>(rng() % static_cast<uint32_t>(s.n));
    double ref = 0, mag = 0;
    for (int64_t p = 0; p < s.k; ++p) {
      ref += static_cast<double>(a[static_cast<size_t>(i * s.k + p)]) * b[static_cast<size_t>(p * s.n + j)];
      mag += std::fabs(static_cast<double>(a[static_cast<size_t>(i * s.k + p)]) * b[static_cast<size_t>(p * s.n + j)]);
    }
    double err = std::fabs(ref - c[static_cast<size_t>(i * s.n + j)]) / (mag > 0 ? mag : 1);
    if (err > worst) worst = err;
  }
  return worst;
}

}  // namespace

double now_wall() { return seconds_now(); }

double now_cpu() {  // this thread's CPU time: robust to other processes sharing the cores
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

#if defined(__x86_64__) && defined(__GNUC__)
// The core's fp32 FMA ceiling: 12 independent chains of 16-wide FMAs (enough to
// cover the FMA latency on two pipes), no memory traffic. GEMM efficiency is
// measured against this.
__attribute__((target("avx512f,fma"))) double fma_peak_gflops(double seconds) {
  typedef float v16 __attribute__((vector_size(64)));
  v16 acc[12];
  const v16 mul = v16{} + 1.0000001f, add = v16{} + 1e-7f;
  for (int i = 0; i < 12; ++i) acc[i] = v16{} + static_cast<float>(i);
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
  return static_cast<double>(rounds) * 12 * 32 / (c1 - c0) * 1e-9;
}
#endif

int main(int argc, char** argv) {
  using kiln::cpu::SgemmIsa;
  const double min_seconds = argc > 1 ? std::atof(argv[1]) : 1.0;
  const Shape shapes[] = {{128, 768, 768, "attn c_proj"},
                          {128, 768, 3072, "mlp c_fc"},
                          {128, 768, 50257, "lm_head"}};
  std::printf("kiln sgemm, single thread; sgemm() runs the %s path here\n",
              kiln::cpu::sgemm_isa_name(kiln::cpu::sgemm_isa()));
  std::printf("GFLOP/s by wall clock and by thread CPU time (the latter discounts time the core ran others)\n");
#if defined(__x86_64__) && defined(__GNUC__)
  if (__builtin_cpu_supports("avx512f"))
    std::printf("fp32 FMA peak of one core (AVX-512, no memory traffic): %.1f GFLOP/s\n", fma_peak_gflops(min_seconds));
#endif
  std::printf("%-8s %-20s %-12s %10s %10s %10s %12s\n", "isa", "M x K x N", "layer", "ms/call", "GFLOP/s",
              "(cpu)", "max rel err");
  std::mt19937 rng(0);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (const Shape& s : shapes) {
    std::vector<float> a(static_cast<size_t>(s.m * s.k)), b(static_cast<size_t>(s.k * s.n)),
        c(static_cast<size_t>(s.m * s.n));
    for (auto& v : a) v = dist(rng);
    for (auto& v : b) v = dist(rng);
    for (SgemmIsa isa : {SgemmIsa::Avx512, SgemmIsa::Avx2, SgemmIsa::Generic}) {
      auto call = [&] {
        return kiln::cpu::sgemm_with(isa, s.m, s.n, s.k, 1.0f, a.data(), s.k, b.data(), s.n, false, c.data(),
                                             s.n);
      };
      if (!call()) continue;  // not on this CPU; else this was the warm-up
      int iters = 0;
      const double w0 = now_wall(), c0 = now_cpu();
      double w1 = w0;
      while (w1 - w0 < min_seconds || iters < 3) {
        call();
        ++iters;
        w1 = now_wall();
      }
      const double c1 = now_cpu();
      const double flop = 2.0 * static_cast<double>(s.m) * static_cast<double>(s.k) * static_cast<double>(s.n);
      char dims[64];
      std::snprintf(dims, sizeof(dims), "%lld x %lld x %lld", static_cast<long long>(s.m),
                    static_cast<long long>(s.k), static_cast<long long>(s.n));
      std::printf("%-8s %-20s %-12s %10.3f %10.1f %10.1f %12.2e\n", kiln::cpu::sgemm_isa_name(isa), dims,
                  s.what, (w1 - w0) / iters * 1e3, flop * iters / (w1 - w0) * 1e-9, flop * iters / (c1 - c0) * 1e-9,
                  max_rel_error(s, a, b, c));
    }
  }
  return 0;
}
