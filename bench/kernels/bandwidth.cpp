// kiln_bandwidth: this machine's memory read bandwidth, for the roofline of a
// memory-bound product (an LLM's decode reads every weight once per token).
//
//   build/kiln_bandwidth [--mb 512] [--threads 1,2] [--reps 7]
//
// Each thread sums its own contiguous share of one buffer far larger than the
// caches (8 independent AVX2 vector accumulators where the CPU has them, so the
// loop is bound by memory, not by the adds), in two patterns: one sequential stream,
// and 4 streams at once (its share's four quarters, read side by side, as a GEMV
// reads several weight rows). Per pattern the figure is bytes read / wall time, the
// median over reps after one warm-up pass; read_gb_per_s is the faster pattern's
// (the roofline's bandwidth: the most this machine gave). Prints one JSON object.
#include <sys/mman.h>

#include <algorithm>
#include <memory>
#include <span>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace {

#if defined(__x86_64__)
// the 64 lanes of 8 accumulators, summed
__attribute__((target("arch=x86-64-v3"))) float lane_sum(__m256 a0, __m256 a1, __m256 a2, __m256 a3, __m256 a4,
                                                         __m256 a5, __m256 a6, __m256 a7) {
  const __m256 t = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)),
                                 _mm256_add_ps(_mm256_add_ps(a4, a5), _mm256_add_ps(a6, a7)));
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, t);
  float s = 0;
  for (float v : lanes) s += v;
  return s;
}

// 8 independent vector accumulators, 64 floats a pass: bound by memory, not by the adds
__attribute__((target("arch=x86-64-v3"))) float sum_avx2(const float* p, size_t n) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
  size_t i = 0;
  for (; i + 64 <= n; i += 64) {
    a0 = _mm256_add_ps(a0, _mm256_loadu_ps(p + i));
    a1 = _mm256_add_ps(a1, _mm256_loadu_ps(p + i + 8));
    a2 = _mm256_add_ps(a2, _mm256_loadu_ps(p + i + 16));
    a3 = _mm256_add_ps(a3, _mm256_loadu_ps(p + i + 24));
    a4 = _mm256_add_ps(a4, _mm256_loadu_ps(p + i + 32));
    a5 = _mm256_add_ps(a5, _mm256_loadu_ps(p + i + 40));
    a6 = _mm256_add_ps(a6, _mm256_loadu_ps(p + i + 48));
    a7 = _mm256_add_ps(a7, _mm256_loadu_ps(p + i + 56));
  }
  float s = lane_sum(a0, a1, a2, a3, a4, a5, a6, a7);
  for (; i < n; ++i) s += p[i];
  return s;
}
// 4 streams: quarters of [p, p + n), 16 floats of each per pass
__attribute__((target("arch=x86-64-v3"))) float sum4_avx2(const float* p, size_t n) {
  const size_t q = n / 4 / 16 * 16;
  const float *p0 = p, *p1 = p + q, *p2 = p + 2 * q, *p3 = p + 3 * q;
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
  for (size_t i = 0; i < q; i += 16) {
    a0 = _mm256_add_ps(a0, _mm256_loadu_ps(p0 + i));
    a1 = _mm256_add_ps(a1, _mm256_loadu_ps(p0 + i + 8));
    a2 = _mm256_add_ps(a2, _mm256_loadu_ps(p1 + i));
    a3 = _mm256_add_ps(a3, _mm256_loadu_ps(p1 + i + 8));
    a4 = _mm256_add_ps(a4, _mm256_loadu_ps(p2 + i));
    a5 = _mm256_add_ps(a5, _mm256_loadu_ps(p2 + i + 8));
    a6 = _mm256_add_ps(a6, _mm256_loadu_ps(p3 + i));
    a7 = _mm256_add_ps(a7, _mm256_loadu_ps(p3 + i + 8));
  }
  float s = lane_sum(a0, a1, a2, a3, a4, a5, a6, a7);
  for (size_t i = 4 * q; i < n; ++i) s += p[i];
  return s;
}
#endif

float sum_plain(const float* p, size_t n) {
  float acc[64] = {};
  size_t i = 0;
  for (; i + 64 <= n; i += 64)
    for (int j = 0; j < 64; ++j) acc[j] += p[i + j];
  float s = 0;
  for (float a : acc) s += a;
  for (; i < n; ++i) s += p[i];
  return s;
}

float sum4_plain(const float* p, size_t n) {
  const size_t q = n / 4;
  float acc[4][16] = {};
  size_t i = 0;
  for (; i + 16 <= q; i += 16)
    for (int s = 0; s < 4; ++s)
      for (int j = 0; j < 16; ++j) acc[s][j] += p[s * q + i + j];
  float s = 0;
  for (auto& a : acc)
    for (float v : a) s += v;
  for (size_t j = 0; j < 4; ++j)
    for (size_t r = i; r < q; ++r) s += p[j * q + r];
  for (size_t r = 4 * q; r < n; ++r) s += p[r];
  return s;
}

float sum(const float* p, size_t n, int streams) {
#if defined(__x86_64__)
  static const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (avx2) return streams == 4 ? sum4_avx2(p, n) : sum_avx2(p, n);
#endif
  return streams == 4 ? sum4_plain(p, n) : sum_plain(p, n);
}

}  // namespace

int main(int argc, char** argv) {
  size_t mb = 512;
  int reps = 7;
  std::vector<int> threads{1, 2};
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--mb" && i + 1 < argc) {
      mb = std::strtoull(argv[++i], nullptr, 10);
    } else if (a == "--reps" && i + 1 < argc) {
      reps = std::atoi(argv[++i]);
    } else if (a == "--threads" && i + 1 < argc) {
      threads.clear();
      std::string list = argv[++i];
      for (size_t at = 0; at <= list.size();) {
        size_t comma = list.find(',', at);
        if (comma == std::string::npos) comma = list.size();
        threads.push_back(std::atoi(list.substr(at, comma - at).c_str()));
        at = comma + 1;
      }
    } else {
      std::fprintf(stderr, "usage: kiln_bandwidth [--mb N] [--threads 1,2] [--reps R]\n");
      return 2;
    }
  }
  if (mb < 64 || reps < 1 || threads.empty() || *std::min_element(threads.begin(), threads.end()) < 1) {
    std::fprintf(stderr, "kiln_bandwidth: --mb at least 64, --reps and --threads at least 1\n");
    return 2;
  }
  const size_t n = mb * (size_t{1} << 20) / sizeof(float);
  // 2 MiB-aligned and advised into transparent huge pages (as kiln's repacked weights are): with
  // 4 KiB pages a stream pays a TLB miss per page, which is not the memory's limit
  const size_t bytes = (n * sizeof(float) + (size_t{2} << 20) - 1) / (size_t{2} << 20) * (size_t{2} << 20);
  std::unique_ptr<float, decltype(&std::free)> mem(static_cast<float*>(std::aligned_alloc(size_t{2} << 20, bytes)), &std::free);
  if (!mem) {
    std::fprintf(stderr, "kiln_bandwidth: cannot allocate %zu MB\n", mb);
    return 1;
  }
  if (!std::getenv("KILN_BANDWIDTH_SMALL_PAGES")) ::madvise(mem.get(), bytes, MADV_HUGEPAGE);
  std::span<float> buf(mem.get(), n);
  for (size_t i = 0; i < n; ++i) buf[i] = static_cast<float>(i & 7);  // touched: every page is real
  std::printf("{\"mb\": %zu, \"results\": [", mb);
  volatile float sink = 0;
  for (size_t ti = 0; ti < threads.size(); ++ti) {
    const int t = threads[ti];
    double best = 0, best_max = 0;
    std::string patterns;
    for (int streams : {1, 4}) {
      std::vector<double> gbs;
      for (int r = -1; r < reps; ++r) {
        std::vector<float> part(static_cast<size_t>(t));
        auto t0 = std::chrono::steady_clock::now();
        std::vector<std::thread> pool;
        for (int k = 0; k < t; ++k)
          pool.emplace_back([&, k] {
            const size_t b = n * static_cast<size_t>(k) / static_cast<size_t>(t);
            const size_t e = n * static_cast<size_t>(k + 1) / static_cast<size_t>(t);
            part[static_cast<size_t>(k)] = sum(buf.data() + b, e - b, streams);
          });
        for (auto& th : pool) th.join();
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        for (float v : part) sink = sink + v;
        if (r >= 0) gbs.push_back(static_cast<double>(n * sizeof(float)) / s / 1e9);
      }
      std::sort(gbs.begin(), gbs.end());
      const double med = gbs[gbs.size() / 2];
      if (med > best) best = med, best_max = gbs.back();
      char one[96];
      std::snprintf(one, sizeof one, "%s\"%d\": %.2f", patterns.empty() ? "" : ", ", streams, med);
      patterns += one;
    }
    std::printf("%s{\"threads\": %d, \"read_gb_per_s\": %.2f, \"max\": %.2f, \"by_streams\": {%s}}", ti ? ", " : "",
                t, best, best_max, patterns.c_str());
  }
  std::printf("]}\n");
  return 0;
}
