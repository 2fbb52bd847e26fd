// Private to src/backends/xnnpack/aot/quantize*.cpp: the scalar and 8-lane helpers the weight and table
// quantizers share (quantize.cpp, quantize_embedding.cpp). Inline, in kiln::backends::xnnpack::qdetail.
#pragma once

#include "kiln/backends/xnnpack/quantize.h"
#include "kiln/passes/edge_program.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

namespace kiln::backends::xnnpack::qdetail {

inline uint16_t to_bf16(float f) {  // round to nearest even, as torch's .to(bfloat16)
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// Everything from here to quantize_rows is compiled twice (quantize_rows_impl's callers below): for the build's
// baseline and, on x86-64, for AVX2 (without FMA: no fused multiply-adds, so both give the same bits). The vector
// arithmetic is written on 8 floats (GCC's and Clang's vector extension: two SSE or one AVX register on x86-64, two
// NEON registers on AArch64) in the order of the sums the scale search depends on, so every build and both x86-64
// forms write the same file.
#define KILN_QUANT_INLINE [[gnu::always_inline]] inline

typedef float F32x4 __attribute__((vector_size(16)));
typedef float F32x8 __attribute__((vector_size(32)));
typedef int32_t I32x8 __attribute__((vector_size(32)));
typedef uint32_t U32x8 __attribute__((vector_size(32)));

KILN_QUANT_INLINE F32x4 load4(const float* p) {
  F32x4 x;
  std::memcpy(&x, p, sizeof x);
  return x;
}

// the reference symmetric scale of values v[0..n): max(|min(v,0)|, max(v,0)) / half_range, at least FLT_MIN
// (min and max are exact, so the lanes' order does not matter; a NaN is skipped as std::min/max skip it here)
KILN_QUANT_INLINE float symmetric_scale(const float* v, int64_t n, float half_range) {
  F32x8 lo8 = {}, hi8 = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    F32x8 x;
    std::memcpy(&x, v + i, sizeof x);
    lo8 = x < lo8 ? x : lo8;
    hi8 = x > hi8 ? x : hi8;
  }
  float lo = 0.0f, hi = 0.0f;
  for (int l = 0; l < 8; ++l) lo = std::min(lo, lo8[l]), hi = std::max(hi, hi8[l]);
  for (; i < n; ++i) lo = std::min(lo, v[i]), hi = std::max(hi, v[i]);
  return std::max(std::max(-lo, hi) / half_range, FLT_MIN);
}

KILN_QUANT_INLINE int quantize(float w, float inv, int qmin, int qmax) {
  return static_cast<int>(std::clamp(std::nearbyint(w * inv), static_cast<float>(qmin), static_cast<float>(qmax)));
}

KILN_QUANT_INLINE float from_bf16(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// (x + kRounder) - kRounder is x rounded to the nearest integer, ties to even, for |x| < 2^22: nearbyint in a form
// the compiler vectorises (the callers clamp x to the grid first)
constexpr float kRounder = 12582912.0f;  // 1.5 * 2^23

// f rounded to the nearest float16 value (ties to even), as a float
inline float round_to_half(float f) {
  const float a = std::fabs(f);
  if (a != a) return f;
  if (!(a < 65520.0f)) return std::copysign(HUGE_VALF, f);  // 65520: halfway past the largest float16 (65504)
  if (a < 0x1p-14f) return std::copysign(std::nearbyint(a * 0x1p24f) * 0x1p-24f, f);  // subnormals: k * 2^-24
  int e = 0;
  std::frexp(a, &e);  // a = m 2^e, m in [0.5, 1): 11 significant bits are steps of 2^(e - 11)
  const float ulp = std::ldexp(1.0f, e - 11);
  return std::copysign(std::nearbyint(a / ulp) * ulp, f);
}

// whether this CPU runs the AVX2 forms (quantize_rows, quantize_embedding_rows)
inline bool cpu_has_avx2() {
#if defined(__x86_64__)
  static const bool avx2 = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2");
  }();
  return avx2;
#else
  return false;
#endif
}

// a node's tensor argument `name`, if it has one
inline std::optional<graph::ValueId> tensor_arg(const graph::Node& n, std::string_view name) {
  const graph::NamedArgument* a = n.input(name);
  if (!a || a->arg.kind != graph::Argument::Kind::Tensor) return std::nullopt;
  return std::get<graph::ValueId>(a->arg.payload);
}

// How many times the graph reads `v`: as a node's input (once per argument that names it) or as an output.
inline int64_t reads_of(const graph::Graph& g, graph::ValueId v) {
  int64_t n = 0;
  for (const auto& node : g.nodes)
    for (const auto& in : node.inputs)
      for (graph::ValueId id : in.arg.tensor_ids()) n += id == v;
  for (const auto& o : g.outputs)
    for (graph::ValueId id : o.tensor_ids()) n += id == v;
  return n;
}

// a constant fp32 matrix: what a linear layer's weight is
inline bool is_fp32_matrix_constant(const passes::EdgeProgram& program, graph::ValueId v) {
  const auto& m = program.graph.value(v).meta;
  return program.is_constant(v) && m.dtype == ScalarType::Float && m.sizes.size() == 2;
}

}  // namespace kiln::backends::xnnpack::qdetail
