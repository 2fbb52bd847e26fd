// f32-vunary / f32-vbinary / f32-rows tester: each variant against a reference
// computed in double (std::exp, std::tanh, ... rounded to float, bounded in
// ulps) and against the generic variant, over every size up to two vectors
// plus one and some large ones, special values (NaN, ±inf, ±0, huge, tiny,
// the polynomials' range edges), in place and out of place, with a guard
// float after the end that must stay untouched.
#pragma once

#include "kiln/cpu/config.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <ostream>
#include <random>
#include <vector>

namespace kiln::cpu {
inline void PrintTo(const F32VUnaryVariant& v, std::ostream* os) { *os << v.name; }
inline void PrintTo(const F32VBinaryVariant& v, std::ostream* os) { *os << v.name; }
inline void PrintTo(const F32RowsVariant& v, std::ostream* os) { *os << v.name; }
}  // namespace kiln::cpu

namespace kiln::cpu::testing {

template <typename V>
const V& generic_of(std::span<const V> variants) {
  for (const V& v : variants)
    if (v.isa == Isa::Generic) return v;
  ADD_FAILURE() << "no generic variant";
  return variants.back();
}

// Distance in units in the last place (0 for two NaNs and for +0 / -0).
inline int64_t ulp_distance(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b) ? 0 : std::numeric_limits<int64_t>::max();
  auto ordered = [](float f) {
    const int64_t i = std::bit_cast<int32_t>(f);
    return i >= 0 ? i : int64_t{INT32_MIN} - i;
  };
  const int64_t d = ordered(a) - ordered(b);
  return d < 0 ? -d : d;
}

// One elementwise operation: the variant's function, its double reference,
// and how close a result must be: ulps, or an absolute error (for results
// whose float form has a cancellation or an underflow the reference lacks).
struct UnaryCase {
  const char* name;
  F32VUnaryFn F32VUnaryVariant::*fn;
  double (*ref)(double);
  int64_t max_ulp;       // against the double reference
  double max_abs;        // or within this absolute error (0: ulps only)
  int64_t max_ulp_generic;  // against the generic variant (FMA contraction, or none)
  float lo, hi;          // random inputs in [lo, hi]
};

inline bool close_enough(float got, double ref, int64_t max_ulp, double max_abs) {
  const float rf = static_cast<float>(ref);
  if (ulp_distance(got, rf) <= max_ulp) return true;
  return max_abs > 0 && std::isfinite(got) && std::isfinite(ref) && std::fabs(static_cast<double>(got) - ref) <= max_abs;
}

// The special inputs every unary operation sees.
inline std::vector<float> special_values() {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  return {nan, -nan, inf, -inf, 0.0f, -0.0f, 1.0f, -1.0f, 3.4e38f, -3.4e38f, 1e-38f, -1e-38f, 1.4e-45f, -1.4e-45f,
          1e-30f, 88.5f, 88.8f, 89.0f, 89.5f, -87.0f, -103.0f, -104.0f, -110.0f, 0.39999998f, 0.4f, 0.40000001f,
          -0.4f, 9.0f, -9.0f, 20.0f, -20.0f, 1e10f, -1e10f, 0.5f, 2.0f, 100.0f};
}

inline std::vector<float> random_values(int64_t n, float lo, float hi, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = d(rng);
  return v;
}

class VUnaryTester {
 public:
  // out = f(in) for the given inputs, out of place and in place, against the
  // reference and the generic variant; a guard after the end stays untouched.
  static void test(const F32VUnaryVariant& v, const UnaryCase& c, const std::vector<float>& in) {
    const int64_t n = static_cast<int64_t>(in.size());
    SCOPED_TRACE(::testing::Message() << v.name << " " << c.name << " n=" << n);
    constexpr float kGuard = -12345.5f;
    std::vector<float> x = in, out(in.size() + 1, kGuard), gen(in.size() + 1, kGuard);
    x.push_back(kGuard);
    (v.*c.fn)(x.data(), out.data(), n);
    (generic_of(f32_vunary_variants()).*c.fn)(in.data(), gen.data(), n);
    EXPECT_EQ(out[in.size()], kGuard) << "wrote past the end";
    EXPECT_EQ(x[in.size()], kGuard);
    int failures = 0;
    for (size_t i = 0; i < in.size() && failures < 5; ++i) {
      EXPECT_EQ(std::bit_cast<uint32_t>(x[i]), std::bit_cast<uint32_t>(in[i])) << "input changed at " << i;
      const double ref = c.ref(static_cast<double>(in[i]));
      const bool ok = close_enough(out[i], ref, c.max_ulp, c.max_abs);
      // (where the reference allows an absolute error, the generic variant's rounding may differ by as much)
      const bool ok_gen = close_enough(out[i], gen[i], c.max_ulp_generic, c.max_abs);
      // a zero keeps the reference's sign
      const bool ok_sign = !(out[i] == 0 && ref == 0) || std::signbit(out[i]) == std::signbit(ref);
      if (!ok || !ok_gen || !ok_sign) {
        ++failures;
        ADD_FAILURE() << c.name << "(" << in[i] << ") [" << i << "] = " << out[i] << ", reference " << ref << " ("
                      << ulp_distance(out[i], static_cast<float>(ref)) << " ulp), generic " << gen[i] << " ("
                      << ulp_distance(out[i], gen[i]) << " ulp)";
      }
    }
    // in place: the same bits as out of place
    std::vector<float> y = in;
    y.push_back(kGuard);
    (v.*c.fn)(y.data(), y.data(), n);
    EXPECT_EQ(y[in.size()], kGuard);
    for (size_t i = 0; i < in.size(); ++i)
      if (ulp_distance(y[i], out[i]) != 0 || std::signbit(y[i]) != std::signbit(out[i])) {
        ADD_FAILURE() << c.name << " in place differs at " << i << ": " << y[i] << " vs " << out[i];
        break;
      }
  }
};

}  // namespace kiln::cpu::testing
