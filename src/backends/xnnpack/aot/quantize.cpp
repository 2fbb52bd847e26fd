// Weight quantization for kiln lower --quantize (see quantize.h for the rules).
#include "kiln/backends/xnnpack/quantize.h"

#include "quantize_common.h"

#include "kiln/core/error.h"
#include "kiln/passes/edge_program.h"

#include <fmt/format.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <condition_variable>
#include <deque>
#include <exception>
#include <tuple>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <thread>

namespace kiln::backends::xnnpack {
using namespace qdetail;
namespace {

// ---- the mse scale rule (ScaleRule::Mse) ---------------------------------------------------------------------


struct GridSums {
  float wq = 0.0f, qq = 0.0f;  // sum v*q, sum q*q over the values, q = clamp(round(v * inv), qmin, qmax)
};

// The sums go to 8 partial sums (lane l: the values at l, l + 8, l + 16, ... in order), then lanes l and l + 4 are
// added, then the four in pairs, then any tail after n rounded down to 8, one value at a time.
KILN_QUANT_INLINE GridSums grid_sums(const float* v, int64_t n, float inv, float qmin, float qmax) {
  const F32x8 vinv = inv - F32x8{}, lo = qmin - F32x8{}, hi = qmax - F32x8{}, rounder = kRounder - F32x8{};
  F32x8 wq = {}, qq = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    F32x8 x;
    std::memcpy(&x, v + i, sizeof x);
    F32x8 t = x * vinv;
    t = t < lo ? lo : t;
    t = t > hi ? hi : t;
    const F32x8 q = (t + rounder) - rounder;
    wq += x * q;
    qq += q * q;
  }
  GridSums s;
  s.wq = ((wq[0] + wq[4]) + (wq[1] + wq[5])) + ((wq[2] + wq[6]) + (wq[3] + wq[7]));
  s.qq = ((qq[0] + qq[4]) + (qq[1] + qq[5])) + ((qq[2] + qq[6]) + (qq[3] + qq[7]));
  for (; i < n; ++i) {
    const float q = (std::min(std::max(v[i] * inv, qmin), qmax) + kRounder) - kRounder;
    s.wq += v[i] * q;
    s.qq += q * q;
  }
  return s;
}

// The scale s that minimises the reconstruction error sum_i (v_i - s q_i)^2 of n values over the symmetric grid
// [qmin, qmax] with q_i = clamp(round(v_i / s)) (the grid point nearest each value, which is what quantization
// stores): a search over clipping ratios, s = max|v| / r for r = (qmax + 1) x kRatios (7, 8, 8.5, 9, 10, 11 for
// int4), each followed by the least-squares refit s = <v,q> / <q,q> of the q that scale gives (the best scale for
// those q), then one more refit round from the best. Every candidate is rounded to what the file stores (bf16 when
// `bf16_scales`) before its error is measured (for fixed q the error is a parabola in s, so the stored value
// nearest the refit is the best stored value for those q), and the minmax rule's own scale and q are a
// candidate: the result's error is never above minmax's. `minmax` is the minmax rule's fp32 scale. On
// SmolLM2's weights the error is within 0.5% of the best bf16 scale found exhaustively, at 8 passes per group.
KILN_QUANT_INLINE float mse_scale(const float* v, int64_t n, float qmin, float qmax, bool bf16_scales, float minmax) {
  static constexpr float kRatios[] = {0.875f, 1.0f, 1.0625f, 1.125f, 1.25f, 1.375f};
  F32x4 amax4 = {}, vv4 = {};
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    const F32x4 x = load4(v + i), a = x < 0.0f ? -x : x;
    amax4 = a > amax4 ? a : amax4;
    vv4 += x * x;
  }
  float amax = std::max(std::max(amax4[0], amax4[1]), std::max(amax4[2], amax4[3]));
  double vv = (static_cast<double>(vv4[0]) + vv4[1]) + (static_cast<double>(vv4[2]) + vv4[3]);
  for (; i < n; ++i) amax = std::max(amax, std::fabs(v[i])), vv += static_cast<double>(v[i]) * v[i];
  // nothing to search (all zero), or values whose inverse scale would overflow or that are not finite
  if (!(amax > 1e-30f) || !std::isfinite(amax) || !std::isfinite(vv)) return minmax;
  auto stored = [&](float s) __attribute__((always_inline)) { return bf16_scales ? from_bf16(to_bf16(s)) : s; };
  auto error = [&](float s, const GridSums& g) __attribute__((always_inline)) {  // sum (v - s q)^2 for the q behind g
    return vv - 2.0 * s * g.wq + static_cast<double>(s) * s * g.qq;
  };
  float best = stored(minmax);
  const float half = qmax + 1.0f;
  if (n % 8 == 0 && static_cast<double>(n) * qmin * qmin <= 16777216.0) {
    // the first seven candidates (minmax's, then the six ratios) at once, one per lane (the eighth lane repeats the
    // last ratio and is not read), each lane's sums in grid_sums' order: partial sums over the values at l, l + 8,
    // l + 16, ... for l = 0..7, then combined as grid_sums combines its lanes
    F32x8 inv = {1.0f / minmax};
    for (int c = 1; c < 8; ++c) inv[c] = kRatios[std::min(c, 6) - 1] * half / amax;
    const F32x8 lo = qmin - F32x8{}, hi = qmax - F32x8{}, rounder = kRounder - F32x8{};
    // (sum q*q is a sum of integers below 2^24 here (the condition above), exact in any order: one accumulator)
    F32x8 wq[8] = {}, qq = {};
    for (int64_t e = 0; e < n; e += 8)
#pragma GCC unroll 8
      for (int l = 0; l < 8; ++l) {
        const F32x8 x = v[e + l] - F32x8{};
        F32x8 t = x * inv;
        t = t < lo ? lo : t;
        t = t > hi ? hi : t;
        const F32x8 q = (t + rounder) - rounder;
        wq[l] += x * q;
        qq += q * q;
      }
    const F32x8 W = ((wq[0] + wq[4]) + (wq[1] + wq[5])) + ((wq[2] + wq[6]) + (wq[3] + wq[7])), Q = qq;
    double best_error = error(best, GridSums{W[0], Q[0]});
    for (int c = 1; c < 7; ++c) {  // try_refit's rule, lane by lane in the candidates' order
      if (!(Q[c] > 0.0f) || !(W[c] > 0.0f)) continue;
      const float sc = stored(W[c] / Q[c]);
      const double e = error(sc, GridSums{W[c], Q[c]});
      if (sc > 0.0f && e < best_error) best = sc, best_error = e;
    }
    const GridSums g = grid_sums(v, n, 1.0f / best, qmin, qmax);  // the last refit, from the best
    if (!(g.qq > 0.0f) || !(g.wq > 0.0f)) return best;
    const float sc = stored(g.wq / g.qq);
    if (sc > 0.0f && error(sc, g) < best_error) best = sc;
    return best;
  }
  double best_error = error(best, grid_sums(v, n, 1.0f / minmax, qmin, qmax));
  auto try_refit = [&](float inv) __attribute__((always_inline)) {  // the refit scale of the q that inv gives, if it is the new best
    const GridSums g = grid_sums(v, n, inv, qmin, qmax);
    if (!(g.qq > 0.0f) || !(g.wq > 0.0f)) return;
    const float s = stored(g.wq / g.qq);
    const double e = error(s, g);
    if (s > 0.0f && e < best_error) best = s, best_error = e;
  };
  for (float r : kRatios) try_refit(r * half / amax);
  try_refit(1.0f / best);
  return best;
}

// q = clamp(round(v * inv), qmin, qmax) for 8 values (rounding after the clamp gives the same integers: the bounds
// are integers), as int32 lanes
KILN_QUANT_INLINE void quantize8(const float* v, float inv, float qmin, float qmax, int32_t* out) {
  F32x8 x;
  std::memcpy(&x, v, sizeof x);
  const F32x8 lo = qmin - F32x8{}, hi = qmax - F32x8{}, rounder = kRounder - F32x8{};
  F32x8 t = x * (inv - F32x8{});
  t = t < lo ? lo : t;
  t = t > hi ? hi : t;
  const I32x8 q = __builtin_convertvector((t + rounder) - rounder, I32x8);
  std::memcpy(out, &q, sizeof q);
}


// ---- the asym rule (ScaleRule::Asym): an affine int4 grid per group ---------------------------------------------

// The codes of v under (scale, offset): clamp(round((v - offset) / scale), -8, 7), the arithmetic quantize_rows uses
// to store them ((v - offset) in float, times the float inverse, rounded half to even).
KILN_QUANT_INLINE float affine_code(float v, float inv, float offset) {
  return std::nearbyint(std::clamp((v - offset) * inv, -8.0f, 7.0f));
}

// sum (v - (scale q + offset))^2 over the group, q its codes under (scale, offset), in double
KILN_QUANT_INLINE double affine_error(const float* v, int64_t n, float scale, float offset) {
  const float inv = 1.0f / scale;
  double e = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const double d = static_cast<double>(v[i]) - (static_cast<double>(scale) * affine_code(v[i], inv, offset) + offset);
    e += d * d;
  }
  return e;
}

struct AffineFit {
  float scale = 1.0f, offset = 0.0f;
};

// The group's (bf16 scale, fp32 offset) under ScaleRule::Asym. Candidates: the symmetric one (`sym`, mse's scale,
// offset 0: the result is never worse than mse's), and the min-max range [lo, hi] shrunk about its middle by
// kShrink, lo on code -8 and hi on 7; from each, two rounds of: codes for the current (scale, offset), the
// least-squares (scale, offset) for those codes (a 2x2 solve), the scale rounded to bf16 (as stored), the offset
// refitted for that scale (the mean of v - scale q). Each candidate's error is measured with the codes its final
// (scale, offset) give. A group of a 4-bit GGUF (Q4_1: m + d k, k = 0..15) comes back with d (bf16-rounded) and
// m + 8d (least squares): the whole group on its grid but for d's rounding.
KILN_QUANT_INLINE AffineFit asym_fit(const float* v, int64_t n, float sym) {
  AffineFit best{sym, 0.0f};
  double best_error = affine_error(v, n, sym, 0.0f);
  float lo = v[0], hi = v[0];
  double sum_v = 0.0;
  for (int64_t i = 0; i < n; ++i) lo = std::min(lo, v[i]), hi = std::max(hi, v[i]), sum_v += v[i];
  if (!std::isfinite(lo) || !std::isfinite(hi) || !std::isfinite(sum_v) || best_error == 0.0) return best;
  auto stored = [](double s) { return from_bf16(to_bf16(static_cast<float>(s))); };
  if (!(hi > lo)) {  // a constant group: code 0 at the value itself
    const float c = lo;
    if (affine_error(v, n, sym, c) < best_error) best = {sym, c};
    return best;
  }
  static constexpr double kShrink[] = {1.0, 0.93, 0.86, 0.8};
  const double mid = 0.5 * (static_cast<double>(lo) + hi), half = 0.5 * (static_cast<double>(hi) - lo);
  for (double r : kShrink) {
    float s = stored(2.0 * half * r / 15.0);
    if (!(s > 0.0f) || !std::isfinite(s)) continue;
    float c = static_cast<float>(mid - half * r + 8.0 * s);
    for (int round = 0; round < 2; ++round) {
      const float inv = 1.0f / s;
      double sq = 0.0, sqq = 0.0, svq = 0.0;
      for (int64_t i = 0; i < n; ++i) {
        const double q = affine_code(v[i], inv, c);
        sq += q, sqq += q * q, svq += q * v[i];
      }
      const double det = static_cast<double>(n) * sqq - sq * sq;
      if (!(det > 0.0)) break;
      const float s2 = stored((static_cast<double>(n) * svq - sq * sum_v) / det);
      if (!(s2 > 0.0f) || !std::isfinite(s2)) break;
      s = s2;
      c = static_cast<float>((sum_v - static_cast<double>(s) * sq) / static_cast<double>(n));
    }
    if (!std::isfinite(c)) continue;
    const double e = affine_error(v, n, s, c);
    if (e < best_error) best = {s, c}, best_error = e;
  }
  return best;
}

// rows [r0, r1) under ScaleRule::MinMax with torchao's arithmetic in the weights' 16-bit type (QuantScheme::source);
// w holds row r0 first
KILN_QUANT_INLINE void quantize_rows_narrow_impl(const float* w, int64_t r0, int64_t r1, int64_t k,
                                                 const QuantScheme& scheme, QuantizedWeights& q) {
  const bool bf16 = scheme.source == QuantScheme::Source::BFloat16;
  auto round = [bf16](float f) { return bf16 ? from_bf16(to_bf16(f)) : round_to_half(f); };
  const float eps = bf16 ? FLT_MIN : 0x1p-14f;  // torch.finfo(dtype).smallest_normal
  const bool int4 = scheme.kind == QuantScheme::Kind::Int4Groups;
  const int64_t g = int4 ? scheme.group : k, groups = k / g;
  const float half_range = int4 ? 7.5f : 127.5f, qmin = int4 ? -8.0f : -128.0f, qmax = int4 ? 7.0f : 127.0f;
  auto* bytes = reinterpret_cast<uint8_t*>(q.data.data());
  std::vector<float> t(static_cast<size_t>(g));
  for (int64_t j = r0; j < r1; ++j)
    for (int64_t b = 0; b < groups; ++b) {
      const float* v = w + (j - r0) * k + b * g;
      float amax = 0.0f;  // max(-min(v, 0), max(v, 0)): exact in any type and order (a NaN is skipped either way)
      int64_t i0 = 0;
      {
        F32x8 m8 = {};
        for (; i0 + 8 <= g; i0 += 8) {
          U32x8 u;
          std::memcpy(&u, v + i0, sizeof u);
          u &= 0x7fffffffu;  // |x|
          F32x8 x;
          std::memcpy(&x, &u, sizeof x);
          m8 = x > m8 ? x : m8;
        }
        for (int l = 0; l < 8; ++l) amax = std::max(amax, m8[l]);
      }
      for (int64_t i = i0; i < g; ++i) amax = std::max(amax, std::fabs(v[i]));
      const float scale = std::max(round(amax / half_range), eps);
      const float inv = round(1.0f / scale);
      if (int4) {
        const uint16_t s16 = to_bf16(scale);
        std::memcpy(q.scales.data() + static_cast<size_t>(j * groups + b) * 2, &s16, 2);
      } else {
        std::memcpy(q.scales.data() + static_cast<size_t>(j) * 4, &scale, 4);
      }
      // clamp(nearbyint(round(v * inv))): clamping before the integer rounding gives the same integers (the bounds
      // are integers, both roundings monotonic), and (x + kRounder) - kRounder is nearbyint (ties to even) on the
      // clamped range, a form the compiler vectorises (a NaN stays NaN either way)
      float* tt = t.data();
      int64_t i1 = 0;
      if (bf16) {  // 8 at a time: the same operations lane by lane (bf16 rounding as to_bf16's integer arithmetic)
        const F32x8 vinv = inv - F32x8{}, lo = qmin - F32x8{}, hi = qmax - F32x8{}, rounder = kRounder - F32x8{};
        for (; i1 + 8 <= g; i1 += 8) {
          F32x8 x;
          std::memcpy(&x, v + i1, sizeof x);
          x *= vinv;
          U32x8 u;
          std::memcpy(&u, &x, sizeof u);
          u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;  // to_bf16 then from_bf16 (wrapping as they do)
          std::memcpy(&x, &u, sizeof x);
          x = x < lo ? lo : x;  // std::max(x, qmin)
          x = hi < x ? hi : x;  // std::min(x, qmax)
          x = (x + rounder) - rounder;
          std::memcpy(tt + i1, &x, sizeof x);
        }
      }
      for (int64_t i = i1; i < g; ++i) {
        const float x = std::min(std::max(round(v[i] * inv), qmin), qmax);
        tt[i] = (x + kRounder) - kRounder;
      }
      if (int4) {  // the even input in the low nibble, as q + 8 (g is even: a group starts on a byte)
        uint8_t* out = bytes + j * (k / 2) + b * g / 2;
        for (int64_t i = 0; i < g; i += 2)
          out[i / 2] = static_cast<uint8_t>(static_cast<uint8_t>(static_cast<int>(tt[i]) + 8) |
                                            static_cast<uint8_t>(static_cast<int>(tt[i + 1]) + 8) << 4);
      } else {
        for (int64_t i = 0; i < g; ++i) reinterpret_cast<int8_t*>(bytes)[j * k + i] = static_cast<int8_t>(static_cast<int>(tt[i]));
      }
    }
}

// rows [r0, r1) of quantize_weights' output (allocated, zeroed for int4); w holds row r0 first
KILN_QUANT_INLINE void quantize_rows_impl(const float* w, int64_t r0, int64_t r1, int64_t k, const QuantScheme& scheme,
                                          QuantizedWeights& q) {
  const bool mse = scheme.scales != ScaleRule::MinMax;  // (8da8w under Asym: mse)
  if (scheme.kind == QuantScheme::Kind::Int4Groups) {
    const int64_t g = scheme.group, groups = k / g;
    const bool asym = scheme.scales == ScaleRule::Asym;
    check(!asym || g <= 256, "internal: asym int4 groups of {} (at most 256)", g);
    auto* bytes = reinterpret_cast<uint8_t*>(q.data.data());
    int32_t codes[8];
    float shifted[256];  // asym: the group less its offset (g <= 256)
    for (int64_t j = r0; j < r1; ++j)
      for (int64_t b = 0; b < groups; ++b) {
        const float* v = w + (j - r0) * k + b * g;
        float scale = symmetric_scale(v, g, 7.5f);
        // minmax: q from the fp32 scale, the bf16 scale stored (torchao's); mse: q from the stored bf16 scale
        if (mse) scale = mse_scale(v, g, -8.0f, 7.0f, true, scale);
        if (asym) {  // q = clamp(round((v - offset) / scale)): the codes of the shifted values, as mse's
          const AffineFit f = asym_fit(v, g, scale);
          scale = f.scale;
          std::memcpy(q.offsets.data() + static_cast<size_t>(j * groups + b) * 4, &f.offset, 4);
          for (int64_t i = 0; i < g; ++i) shifted[i] = v[i] - f.offset;
          v = shifted;
        }
        const float inv = 1.0f / scale;
        const uint16_t s16 = to_bf16(scale);
        std::memcpy(q.scales.data() + static_cast<size_t>(j * groups + b) * 2, &s16, 2);
        uint8_t* out = bytes + j * (k / 2) + b * g / 2;  // g is even (32 to 256): the group starts on a byte
        int64_t i = 0;
        for (; i + 8 <= g; i += 8) {
          quantize8(v + i, inv, -8.0f, 7.0f, codes);
          for (int p = 0; p < 4; ++p)  // the even input in the low nibble, as q + 8
            out[(i >> 1) + p] = static_cast<uint8_t>((codes[2 * p] + 8) | (codes[2 * p + 1] + 8) << 4);
        }
        for (; i < g; ++i) {
          const auto u = static_cast<uint8_t>(quantize(v[i], inv, -8, 7) + 8);
          out[i / 2] |= static_cast<uint8_t>((i & 1) ? u << 4 : u);
        }
      }
    return;
  }
  auto* out = reinterpret_cast<int8_t*>(q.data.data());
  int32_t codes[8];
  for (int64_t j = r0; j < r1; ++j) {
    const float* v = w + (j - r0) * k;
    float scale = symmetric_scale(v, k, 127.5f);
    if (mse) scale = mse_scale(v, k, -128.0f, 127.0f, false, scale);
    const float inv = 1.0f / scale;
    std::memcpy(q.scales.data() + static_cast<size_t>(j) * 4, &scale, 4);
    int64_t i = 0;
    for (; i + 8 <= k; i += 8) {
      quantize8(v + i, inv, -128.0f, 127.0f, codes);
      for (int l = 0; l < 8; ++l) out[j * k + i + l] = static_cast<int8_t>(codes[l]);
    }
    for (; i < k; ++i) out[j * k + i] = static_cast<int8_t>(quantize(v[i], inv, -128, 127));
  }
}

void quantize_rows_narrow_baseline(const float* w, int64_t r0, int64_t r1, int64_t k, const QuantScheme& scheme,
                                   QuantizedWeights& q) {
  quantize_rows_narrow_impl(w, r0, r1, k, scheme, q);
}

void quantize_rows_baseline(const float* w, int64_t r0, int64_t r1, int64_t k, const QuantScheme& scheme,
                            QuantizedWeights& q) {
  quantize_rows_impl(w, r0, r1, k, scheme, q);
}

#if defined(__x86_64__)
__attribute__((target("avx2"))) void quantize_rows_narrow_avx2(const float* w, int64_t r0, int64_t r1, int64_t k,
                                                                const QuantScheme& scheme, QuantizedWeights& q) {
  quantize_rows_narrow_impl(w, r0, r1, k, scheme, q);
}

__attribute__((target("avx2"))) void quantize_rows_avx2(const float* w, int64_t r0, int64_t r1, int64_t k,
                                                         const QuantScheme& scheme, QuantizedWeights& q) {
  quantize_rows_impl(w, r0, r1, k, scheme, q);
}
#endif

// rows [r0, r1) of quantize_weights' output (w holds row r0 first), in the widest form this CPU runs

void quantize_rows(const float* w, int64_t r0, int64_t r1, int64_t k, const QuantScheme& scheme, QuantizedWeights& q) {
  const bool narrow = scheme.source != QuantScheme::Source::Float && scheme.scales == ScaleRule::MinMax;
#if defined(__x86_64__)
  if (cpu_has_avx2()) return narrow ? quantize_rows_narrow_avx2(w, r0, r1, k, scheme, q) : quantize_rows_avx2(w, r0, r1, k, scheme, q);
#endif
  if (narrow) return quantize_rows_narrow_baseline(w, r0, r1, k, scheme, q);
  quantize_rows_baseline(w, r0, r1, k, scheme, q);
}

}  // namespace

std::string_view scale_rule_name(ScaleRule r) {
  return r == ScaleRule::MinMax ? "minmax" : r == ScaleRule::Asym ? "asym" : "mse";
}

std::optional<ScaleRule> parse_scale_rule(std::string_view text, std::string* error) {
  if (text == "minmax") return ScaleRule::MinMax;
  if (text == "mse") return ScaleRule::Mse;
  if (text == "asym") return ScaleRule::Asym;
  *error = fmt::format("unknown scale rule '{}' in --quantize-scales (minmax, mse or asym)", text);
  return std::nullopt;
}

std::string QuantScheme::name() const {
  std::string base;
  switch (kind) {
    case Kind::Int4Groups: base = fmt::format("8da4w:{}", group); break;
    case Kind::Int8Channels: base = "8da8w"; break;
    case Kind::Int8WeightOnly: base = "int8w"; break;
    case Kind::None: return "none";
  }
  if (scales == ScaleRule::Asym && kind == Kind::Int4Groups) return base + " (asym: scale + offset per group)";
  return scales != ScaleRule::MinMax ? base + " (mse scales)" : base;
}

std::optional<QuantScheme> parse_quant_scheme(std::string_view text, std::string* error) {
  QuantScheme s;
  std::string_view base = text, group;
  if (auto colon = text.find(':'); colon != std::string_view::npos) {
    base = text.substr(0, colon);
    group = text.substr(colon + 1);
  }
  if (base == "8da8w" && group.empty()) {
    s.kind = QuantScheme::Kind::Int8Channels;
    return s;
  }
  if (base == "int8w" && group.empty()) {
    s.kind = QuantScheme::Kind::Int8WeightOnly;
    return s;
  }
  if (base == "8da4w") {
    s.kind = QuantScheme::Kind::Int4Groups;
    if (!group.empty()) {
      if (group == "32") s.group = 32;
      else if (group == "64") s.group = 64;
      else if (group == "128") s.group = 128;
      else if (group == "256") s.group = 256;
      else {
        *error = fmt::format("unknown group size '{}' in --quantize {} (8da4w takes 32, 64, 128 or 256)", group, text);
        return std::nullopt;
      }
    }
    return s;
  }
  *error = fmt::format("unknown quantization scheme '{}' (8da4w[:32|64|128|256], 8da8w or int8w)", text);
  return std::nullopt;
}

int64_t lower_threads() {
  static const int64_t threads = [] {
    if (const char* env = std::getenv("KILN_LOWER_THREADS"); env && *env) {
      char* end = nullptr;
      const long t = std::strtol(env, &end, 10);
      check(*end == '\0' && t >= 1 && t <= 64, "KILN_LOWER_THREADS={}: expected a number of threads from 1 to 64", env);
      return static_cast<int64_t>(t);
    }
    return std::clamp<int64_t>(std::thread::hardware_concurrency(), 1, 8);
  }();
  return threads;
}

int64_t lower_block_bytes(int64_t usual) {
  static const int64_t bytes = [] {
    if (const char* env = std::getenv("KILN_LOWER_BLOCK_BYTES"); env && *env) {
      char* end = nullptr;
      const long long b = std::strtoll(env, &end, 10);
      check(*end == '\0' && b >= 1, "KILN_LOWER_BLOCK_BYTES={}: expected a positive number of bytes", env);
      return static_cast<int64_t>(b);
    }
    return int64_t{0};
  }();
  return bytes ? bytes : usual;
}

namespace {

QuantizedWeights allocate_quantized(int64_t n, int64_t k, const QuantScheme& scheme) {
  QuantizedWeights q;
  if (scheme.kind == QuantScheme::Kind::Int4Groups) {
    q.data.assign(static_cast<size_t>(n * (k / 2)), std::byte{0});
    q.scales.resize(static_cast<size_t>(n * (k / scheme.group)) * 2);
    if (has_offsets(scheme)) q.offsets.resize(static_cast<size_t>(n * (k / scheme.group)) * 4);
  } else {
    q.data.resize(static_cast<size_t>(n * k));
    q.scales.resize(static_cast<size_t>(n) * 4);
  }
  return q;
}

}  // namespace

QuantizedWeights quantize_weights(const float* w, int64_t n, int64_t k, const QuantScheme& scheme) {
  QuantizedWeights q = allocate_quantized(n, k, scheme);
  // Rows split over lower_threads() when there is enough work (rows quantize independently, into their own bytes,
  // so the result does not depend on the split)
  int64_t threads = 1;
  if (n * k >= (int64_t{1} << 18)) threads = std::min(lower_threads(), n);
  if (threads == 1) {
    quantize_rows(w, 0, n, k, scheme, q);
    return q;
  }
  std::vector<std::thread> pool;
  for (int64_t t = 1; t < threads; ++t)
    pool.emplace_back([&, t] {
      const int64_t r0 = n * t / threads;
      quantize_rows(w + r0 * k, r0, n * (t + 1) / threads, k, scheme, q);
    });
  quantize_rows(w, 0, n / threads, k, scheme, q);
  for (auto& th : pool) th.join();
  return q;
}

// ---- StreamingQuantizer -------------------------------------------------------------------------------------------

struct StreamingQuantizer::Impl {
  int64_t n, k, block_rows;
  QuantScheme scheme;
  QuantizedWeights q;
  std::vector<std::vector<float>> buffers;
  int64_t current = -1;    // the buffer the caller fills
  int64_t rows_seen = 0;   // rows submitted so far
  std::mutex m;
  std::condition_variable cv;
  std::vector<int64_t> free;                          // buffers nobody holds
  std::deque<std::tuple<int64_t, int64_t, int64_t>> queue;  // (buffer, first row, rows) to quantize, in order
  int64_t busy = 0;                                   // blocks a worker is quantizing now
  bool closing = false;
  std::vector<std::thread> workers;

  void work() {
    for (;;) {
      std::tuple<int64_t, int64_t, int64_t> job;
      {
        std::unique_lock<std::mutex> lock(m);
        cv.wait(lock, [&] { return closing || !queue.empty(); });
        if (queue.empty()) return;
        job = queue.front();
        queue.pop_front();
        ++busy;
      }
      const auto [b, first, rows] = job;
      quantize_rows(buffers[static_cast<size_t>(b)].data(), first, first + rows, k, scheme, q);
      {
        std::lock_guard<std::mutex> lock(m);
        free.push_back(b);
        --busy;
      }
      cv.notify_all();
    }
  }
};

StreamingQuantizer::StreamingQuantizer(int64_t n, int64_t k, const QuantScheme& scheme, int64_t block_rows)
    : impl_(std::make_unique<Impl>()) {
  Impl& s = *impl_;
  s.n = n, s.k = k, s.scheme = scheme;
  s.block_rows = std::max<int64_t>(1, std::min(block_rows, n));
  // A weight smaller than one block would be quantized on the caller's thread alone (most of an LLM's linears are
  // 1-4 MB): split it into at least two blocks per thread when there is enough work for the threads
  if (const int64_t t = lower_threads(); t > 1 && n * k >= (int64_t{1} << 18))
    s.block_rows = std::min(s.block_rows, std::max<int64_t>(1, (n + 2 * t - 1) / (2 * t)));
  s.q = allocate_quantized(n, k, scheme);
  const int64_t blocks = (n + s.block_rows - 1) / s.block_rows;
  const int64_t workers = std::min(lower_threads(), blocks) > 1 ? std::min(lower_threads(), blocks) : 0;
  // one buffer per worker and one the caller fills: at most workers + 1 blocks in memory
  s.buffers.resize(static_cast<size_t>(workers + 1));
  for (int64_t b = 0; b <= workers; ++b) s.free.push_back(workers - b);
  for (int64_t t = 0; t < workers; ++t) s.workers.emplace_back([&s] { s.work(); });
}

StreamingQuantizer::~StreamingQuantizer() {
  Impl& s = *impl_;
  {
    std::lock_guard<std::mutex> lock(s.m);
    s.closing = true;
  }
  s.cv.notify_all();
  for (auto& t : s.workers) t.join();
}

int64_t StreamingQuantizer::block_rows() const { return impl_->block_rows; }

float* StreamingQuantizer::block() {
  Impl& s = *impl_;
  if (s.current < 0) {
    std::unique_lock<std::mutex> lock(s.m);
    s.cv.wait(lock, [&] { return !s.free.empty(); });
    s.current = s.free.back();
    s.free.pop_back();
  }
  auto& buf = s.buffers[static_cast<size_t>(s.current)];
  buf.resize(static_cast<size_t>(s.block_rows * s.k));
  return buf.data();
}

void StreamingQuantizer::submit(int64_t rows) {
  Impl& s = *impl_;
  check(s.current >= 0 && rows >= 1 && rows <= s.block_rows && s.rows_seen + rows <= s.n,
        "internal: a streamed weight's block of {} rows after {} of its {} rows", rows, s.rows_seen, s.n);
  const int64_t b = s.current, first = s.rows_seen;
  s.current = -1;
  s.rows_seen += rows;
  if (s.workers.empty()) {  // one thread: quantized now
    quantize_rows(s.buffers[static_cast<size_t>(b)].data(), first, first + rows, s.k, s.scheme, s.q);
    s.free.push_back(b);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(s.m);
    s.queue.emplace_back(b, first, rows);
  }
  s.cv.notify_all();
}

QuantizedWeights StreamingQuantizer::finish() {
  Impl& s = *impl_;
  {
    std::unique_lock<std::mutex> lock(s.m);
    s.cv.wait(lock, [&] { return s.queue.empty() && s.busy == 0; });
  }
  check(s.rows_seen == s.n, "constant data streamed {} rows, declared {}", s.rows_seen, s.n);
  return std::move(s.q);
}

WeightOnlyStats quantize_weights_int8_only(passes::EdgeProgram& program,
                                           const std::function<bool(const graph::Node&, graph::ValueId)>& keep_fp32,
                                           ScaleRule scales) {
  graph::Graph& g = program.graph;
  using K = graph::Argument::Kind;
  auto is_weight = [&](graph::ValueId v) { return is_fp32_matrix_constant(program, v); };
  // (the reader node to rewire, its argument name, the weight, the channel axis, the product node)
  struct Site {
    size_t reader;
    std::string arg;
    graph::ValueId weight;
    int64_t axis;
    size_t product;
  };
  std::vector<Site> sites;
  WeightOnlyStats stats;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const graph::Node& n = g.nodes[i];
    if (n.target != "aten.mm.default" && n.target != "aten.addmm.default") continue;
    auto mat2 = tensor_arg(n, "mat2");
    if (!mat2) continue;
    std::optional<Site> site;
    if (auto self = tensor_arg(n, "self"); n.target == "aten.mm.default" && self && is_weight(*self) &&
                                           !is_weight(*mat2)) {
      site = Site{i, "self", *self, 0, i};  // W @ x^T (a tied LM head's form): W [N, K], channels along dim 0
    } else if (is_weight(*mat2)) {
      site = Site{i, "mat2", *mat2, 1, i};  // [K, N]: output channels along dim 1
    } else if (const int32_t p = g.value(*mat2).producer; p >= 0) {
      const graph::Node& t = g.nodes[static_cast<size_t>(p)];
      auto w = tensor_arg(t, "self");
      const graph::NamedArgument* dims = t.input("dims");
      if (t.target == "aten.permute_copy.default" && w && is_weight(*w) && dims && dims->arg.kind == K::Ints &&
          std::get<std::vector<int64_t>>(dims->arg.payload) == std::vector<int64_t>{1, 0})
        site = Site{static_cast<size_t>(p), "self", *w, 0, i};  // W [N, K] read through its transpose
    }
    if (!site) continue;
    if (keep_fp32 && keep_fp32(g.nodes[site->product], site->weight)) {
      ++stats.kept_fp32;
      continue;
    }
    sites.push_back(*site);
  }
  // one dequantize per weight, however many readers; inserted before the first reader
  std::map<graph::ValueId, graph::ValueId> dequantized;
  std::map<size_t, std::vector<graph::Node>> insert_before;
  for (const Site& s : sites) {
    auto [it, fresh_weight] = dequantized.try_emplace(s.weight, 0);
    if (fresh_weight) {
      const graph::TensorMeta meta = g.value(s.weight).meta;
      const int64_t rows = meta.sizes[0], cols = meta.sizes[1], channels = meta.sizes[static_cast<size_t>(s.axis)];
      const std::vector<std::byte> raw = program.constant_bytes(s.weight);
      const auto* src = reinterpret_cast<const float*>(raw.data());
      std::vector<float> w(static_cast<size_t>(rows * cols));  // as [channels, inputs]
      const int64_t inputs = rows * cols / channels;
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c)
          w[static_cast<size_t>(s.axis == 0 ? r * cols + c : c * rows + r)] = src[r * cols + c];
      QuantScheme q8;
      q8.kind = QuantScheme::Kind::Int8Channels;
      q8.scales = scales;
      QuantizedWeights qw = quantize_weights(w.data(), channels, inputs, q8);
      std::vector<std::byte> data(qw.data.size());  // back to the weight's own layout
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c)
          data[static_cast<size_t>(r * cols + c)] = qw.data[static_cast<size_t>(s.axis == 0 ? r * cols + c : c * rows + r)];
      graph::TensorMeta qm = meta;
      qm.dtype = ScalarType::Char;
      graph::TensorMeta sm;
      sm.dtype = ScalarType::Float;
      sm.sizes = {channels};
      sm.strides = {1};
      auto fresh = [&](std::string base) {
        std::string name = base;
        for (int k = 1; g.find_value(name); ++k) name = fmt::format("{}_{}", base, k);
        return name;
      };
      const std::string base = g.value(s.weight).name, fqn = program.constants.at(s.weight).name;
      const graph::ValueId qv = g.add_value(fresh(base + "_int8"), qm);
      program.constants[qv] = passes::ConstantData{
          nullptr, std::make_shared<const std::vector<std::byte>>(std::move(data)), fqn + " (int8 per channel)"};
      const graph::ValueId sv = g.add_value(fresh(base + "_scales"), sm);
      program.constants[sv] = passes::ConstantData{
          nullptr, std::make_shared<const std::vector<std::byte>>(std::move(qw.scales)), fqn + " (int8 scales)"};
      graph::Node dq;
      dq.name = fresh(base + "_dequantized");
      dq.target = "quantized_decomposed.dequantize_per_channel.default";
      dq.module_path = g.nodes[s.product].module_path;
      dq.stack_trace = g.nodes[s.product].stack_trace;
      graph::Argument dtype_arg;
      dtype_arg.kind = K::ScalarType;
      dtype_arg.payload = ScalarType::Char;
      dq.inputs = {{"input", graph::Argument::tensor(qv), false},
                   {"scales", graph::Argument::tensor(sv), false},
                   {"zero_points", graph::Argument::none(), false},
                   {"axis", graph::Argument::integer(s.axis), false},
                   {"quant_min", graph::Argument::integer(-128), false},
                   {"quant_max", graph::Argument::integer(127), false},
                   {"dtype", dtype_arg, false}};
      const graph::ValueId out = g.add_value(dq.name, meta);
      dq.outputs = {graph::Argument::tensor(out)};
      it->second = out;
      insert_before[s.reader].push_back(std::move(dq));
      ++stats.quantized;
    }
    for (auto& in : g.nodes[s.reader].inputs)
      if (in.name == s.arg) in.arg = graph::Argument::tensor(it->second);
  }
  if (insert_before.empty()) return stats;
  std::vector<graph::Node> nodes;
  nodes.reserve(g.nodes.size() + dequantized.size());
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    if (auto it = insert_before.find(i); it != insert_before.end())
      for (auto& n : it->second) nodes.push_back(std::move(n));
    nodes.push_back(std::move(g.nodes[i]));
  }
  g.nodes = std::move(nodes);
  for (auto& v : g.values) v.producer = -1;
  for (size_t i = 0; i < g.nodes.size(); ++i)
    for (graph::ValueId v : g.nodes[i].output_ids()) g.values[static_cast<size_t>(v)].producer = static_cast<int32_t>(i);
  // fp32 weights nothing reads any more
  for (const auto& [w, dq] : dequantized) {
    bool read = false;
    for (const auto& n : g.nodes)
      for (const auto& in : n.inputs)
        for (graph::ValueId id : in.arg.tensor_ids()) read = read || id == w;
    for (const auto& o : g.outputs)
      for (graph::ValueId id : o.tensor_ids()) read = read || id == w;
    if (!read) program.constants.erase(w);
  }
  return stats;
}

UntiedWeights untie_quantized_linear_weights(passes::EdgeProgram& program,
                                       const std::function<bool(const graph::Node&, graph::ValueId)>& keep_fp32) {
  graph::Graph& g = program.graph;
  using K = graph::Argument::Kind;
  auto is_weight = [&](graph::ValueId v) { return is_fp32_matrix_constant(program, v); };
  auto is_transpose = [&](const graph::Node& t) {
    const graph::NamedArgument* dims = t.input("dims");
    return t.target == "aten.permute_copy.default" && dims && dims->arg.kind == K::Ints &&
           std::get<std::vector<int64_t>>(dims->arg.payload) == std::vector<int64_t>{1, 0};
  };
  // per weight read as a linear product's operand: (the node reading it, the product it feeds)
  struct Read {
    size_t reader, product;
  };
  std::map<graph::ValueId, std::vector<Read>> product_reads;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const graph::Node& n = g.nodes[i];
    if (n.target != "aten.mm.default" && n.target != "aten.addmm.default") continue;
    auto self = tensor_arg(n, "self"), mat2 = tensor_arg(n, "mat2");
    if (!mat2) continue;
    if (n.target == "aten.mm.default" && self && is_weight(*self) && !is_weight(*mat2)) {
      product_reads[*self].push_back({i, i});  // W @ x^T, the tied head's form
    } else if (const int32_t p = g.value(*mat2).producer; p >= 0 && is_transpose(g.nodes[static_cast<size_t>(p)])) {
      if (auto w = tensor_arg(g.nodes[static_cast<size_t>(p)], "self"); w && is_weight(*w))
        product_reads[*w].push_back({static_cast<size_t>(p), i});  // x @ W^T, W transposed at run time
    }
  }
  UntiedWeights untied;
  for (auto& [w, reads] : product_reads) {
    // readers of w: the product sites, and anything else (the embedding lookup)
    const int64_t total = reads_of(g, w);
    std::map<size_t, int> site_reads;  // a transpose read by several products is one read of w
    for (const Read& r : reads) site_reads[r.reader] = 1;
    if (total <= static_cast<int64_t>(site_reads.size())) continue;  // only products read it: nothing to untie
    if (keep_fp32 && std::any_of(reads.begin(), reads.end(),
                                 [&](const Read& r) { return keep_fp32(g.nodes[r.product], w); })) {
      untied.kept_fp32 += static_cast<int64_t>(reads.size());  // the head keeps sharing the table (no second copy)
      continue;
    }
    const graph::Value& orig = g.value(w);
    std::string name = orig.name + "_linear";
    for (int k = 1; g.find_value(name); ++k) name = fmt::format("{}_linear_{}", orig.name, k);
    const graph::TensorMeta meta = orig.meta;
    const graph::ValueId copy = g.add_value(name, meta);
    program.constants[copy] = program.constants.at(w);  // the same bytes (the .pt2 tensor), read on demand
    for (const auto& site : site_reads)
      for (auto& in : g.nodes[site.first].inputs)
        if (in.arg.kind == K::Tensor && std::get<graph::ValueId>(in.arg.payload) == w) in.arg = graph::Argument::tensor(copy);
    untied.copies.push_back(copy);
  }
  return untied;
}

}  // namespace kiln::backends::xnnpack
