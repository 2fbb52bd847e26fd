// Internal to kiln_cpu: the FMA rate probe (config.cpp's cpu_fma512_pipes), instantiated once per
// vector width in a file compiled for its ISA. 12 independent chains of multiply-adds per round
// (enough to cover the FMA latency on two pipes), no memory traffic; flops per second of this
// thread's CPU time (robust to the core running others).
#pragma once

#include "../isa.h"

#include <cstdint>
#include <ctime>

namespace kiln::cpu {
namespace {

// a * b + c is one FMA where the ISA has it (GCC contracts C++ by default: -ffp-contract=fast).
template <typename V>
KILN_CPU_INLINE double fma_probe(long rounds) {
  constexpr int kLanes = static_cast<int>(sizeof(V) / sizeof(float));
  V acc[12];
  const V mul = V{} + 1.0000001f, add = V{} + 1e-7f;
  for (int i = 0; i < 12; ++i) acc[i] = V{} + static_cast<float>(i);
  timespec t0, t1;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t0);
  for (long r = 0; r < rounds; ++r)
#pragma GCC unroll 128
    for (int u = 0; u < 128; ++u) acc[u % 12] = acc[u % 12] * mul + add;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t1);
  V sum = acc[0];
  for (int i = 1; i < 12; ++i) sum += acc[i];
  volatile float sink = sum[0];  // keeps the chains
  (void)sink;
  const double s = static_cast<double>(t1.tv_sec - t0.tv_sec) + static_cast<double>(t1.tv_nsec - t0.tv_nsec) * 1e-9;
  return s > 0 ? 2.0 * kLanes * 128.0 * static_cast<double>(rounds) / s : 0.0;
}

}  // namespace
}  // namespace kiln::cpu
