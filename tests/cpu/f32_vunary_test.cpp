// Every f32-vunary, f32-vbinary and f32-rows variant against double-precision
// references and the generic variant (vunary_tester.h).
#include <bit>
#include "vunary_tester.h"

namespace kiln::cpu::testing {
namespace {

double ref_exp(double x) { return std::exp(x); }
double ref_tanh(double x) { return std::tanh(x); }
double ref_sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }
double ref_sqrt(double x) { return std::sqrt(x); }
double ref_rsqrt(double x) { return 1.0 / std::sqrt(x); }
double ref_square(double x) { return x * x; }
double ref_neg(double x) { return -x; }
double ref_abs(double x) { return std::fabs(x); }
double ref_gelu(double x) { return 0.5 * x * (1.0 + std::erf(x * 0.70710678118654752440)); }
double ref_log(double x) { return std::log(x); }
double ref_sin(double x) { return std::sin(x); }
double ref_cos(double x) { return std::cos(x); }
double ref_gelu_tanh(double x) {
  return 0.5 * x * (1.0 + std::tanh(0.79788456080286535588 * (x + 0.044715 * x * x * x)));
}

// exp_f / tanh_f: within 2 ulp (math.h); with FMA contraction AVX2/AVX-512 may
// round differently from the generic variant, by an ulp or two. sigmoid: 1/(1+e)
// adds two roundings; below -88.7 e^-x overflows and the result (< 3e-39, under
// FLT_MIN) is 0. gelu: 1 + erf(x) cancels for x < 0, so an absolute bound there.
// The rest is IEEE or libm per element: the same bits on every variant.
const UnaryCase kCases[] = {
    {"exp", &F32VUnaryVariant::exp, ref_exp, 2, 0, 2, -104.0f, 89.0f},
    {"tanh", &F32VUnaryVariant::tanh, ref_tanh, 2, 0, 2, -10.0f, 10.0f},
    {"sigmoid", &F32VUnaryVariant::sigmoid, ref_sigmoid, 3, 3e-39, 2, -100.0f, 100.0f},
    {"sqrt", &F32VUnaryVariant::sqrt, ref_sqrt, 0, 0, 0, 0.0f, 1e6f},
    {"rsqrt", &F32VUnaryVariant::rsqrt, ref_rsqrt, 1, 0, 0, 1e-6f, 1e6f},
    {"square", &F32VUnaryVariant::square, ref_square, 0, 0, 0, -1e19f, 1e19f},
    {"neg", &F32VUnaryVariant::neg, ref_neg, 0, 0, 0, -1e30f, 1e30f},
    {"abs", &F32VUnaryVariant::abs, ref_abs, 0, 0, 0, -1e30f, 1e30f},
    {"gelu", &F32VUnaryVariant::gelu, ref_gelu, 4, 1e-6, 0, -10.0f, 10.0f},
    {"log", &F32VUnaryVariant::log, ref_log, 1, 0, 0, 1e-30f, 1e30f},
    {"sin", &F32VUnaryVariant::sin, ref_sin, 1, 0, 0, -100.0f, 100.0f},
    {"cos", &F32VUnaryVariant::cos, ref_cos, 1, 0, 0, -100.0f, 100.0f},
    // tanh_f's 2 ulp and the float argument's roundings (|arg| up to ~30 at x = 10), then 1 + t cancelling
    // for x < 0: an absolute bound there, as gelu's
    {"gelu_tanh", &F32VUnaryVariant::gelu_tanh, ref_gelu_tanh, 8, 2e-6, 8, -10.0f, 10.0f},
};

class F32VUnary : public ::testing::TestWithParam<F32VUnaryVariant> {
 protected:
  void SetUp() override {
    if (!isa_supported(GetParam().isa))
      GTEST_SKIP() << GetParam().name << " NOT TESTED: this CPU (or build) lacks " << isa_name(GetParam().isa);
  }
};

TEST_P(F32VUnary, EverySizeAroundTheVector) {
  for (const UnaryCase& c : kCases)
    for (int64_t n = 0; n <= 2 * GetParam().lanes + 1; ++n)
      VUnaryTester::test(GetParam(), c, random_values(n, c.lo, c.hi, static_cast<uint32_t>(n + 1)));
}

TEST_P(F32VUnary, LargeAndDense) {
  for (const UnaryCase& c : kCases) {
    VUnaryTester::test(GetParam(), c, random_values(4099, c.lo, c.hi, 7));
    VUnaryTester::test(GetParam(), c, random_values(1000, -1.0f, 1.0f, 8));  // around 0 (log, sqrt: NaN below)
  }
  const UnaryCase& tanh = kCases[1];
  VUnaryTester::test(GetParam(), tanh, random_values(4099, -0.5f, 0.5f, 9));  // both sides of the 0.4 switch
}

TEST_P(F32VUnary, SpecialValues) {
  const std::vector<float> sp = special_values();
  for (const UnaryCase& c : kCases)
    for (int rot = 0; rot <= GetParam().lanes; ++rot) {  // each value in every lane, and in the partial vector
      std::vector<float> v = sp;
      std::rotate(v.begin(), v.begin() + rot, v.end());
      VUnaryTester::test(GetParam(), c, v);
    }
}

TEST_P(F32VUnary, Clamp) {
  const float inf = std::numeric_limits<float>::infinity();
  const F32VUnaryVariant& gen = generic_of(f32_vunary_variants());
  for (auto [lo, hi] : {std::pair{-1.0f, 1.0f}, std::pair{0.0f, inf}, std::pair{-inf, 6.0f}, std::pair{2.0f, 2.0f},
                        std::pair{-0.0f, -0.0f}})
    for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{GetParam().lanes - 1}, int64_t{2 * GetParam().lanes + 1}, int64_t{1001}}) {
      std::vector<float> in = random_values(n, -10.0f, 10.0f, static_cast<uint32_t>(n));
      const std::vector<float> sp = special_values();
      for (size_t i = 0; i < in.size(); ++i)
        if (i % 3 == 0) in[i] = sp[i % sp.size()];
      std::vector<float> out(in.size() + 1, 77.0f), g(in.size()), y = in;
      GetParam().clamp(in.data(), out.data(), n, lo, hi);
      gen.clamp(in.data(), g.data(), n, lo, hi);
      GetParam().clamp(y.data(), y.data(), n, lo, hi);
      EXPECT_EQ(out[in.size()], 77.0f);
      for (size_t i = 0; i < in.size(); ++i) {
        const float want = std::min(std::max(in[i], lo), hi);  // NaN stays NaN
        EXPECT_EQ(ulp_distance(out[i], want), 0) << "clamp(" << in[i] << ", " << lo << ", " << hi << ") = " << out[i];
        EXPECT_EQ(std::signbit(out[i]), std::signbit(want)) << "clamp(" << in[i] << ", " << lo << ", " << hi << ")";
        EXPECT_EQ(ulp_distance(g[i], out[i]), 0);
        EXPECT_EQ(ulp_distance(y[i], out[i]), 0) << "in place";
      }
    }
}

INSTANTIATE_TEST_SUITE_P(Variants, F32VUnary,
                         ::testing::ValuesIn(f32_vunary_variants().begin(), f32_vunary_variants().end()),
                         [](const ::testing::TestParamInfo<F32VUnaryVariant>& p) { return std::string(p.param.name); });

// ---------------------------------------------------------------- f32-vbinary

class F32VBinary : public ::testing::TestWithParam<F32VBinaryVariant> {
 protected:
  void SetUp() override {
    if (!isa_supported(GetParam().isa))
      GTEST_SKIP() << GetParam().name << " NOT TESTED: this CPU (or build) lacks " << isa_name(GetParam().isa);
  }
};

struct BinaryCase {
  const char* name;
  F32VBinaryForms F32VBinaryVariant::*forms;
  float (*ref)(float, float);  // IEEE float arithmetic is correctly rounded: the reference is exact
};

const BinaryCase kBinary[] = {
    {"add", &F32VBinaryVariant::add, [](float x, float y) { return static_cast<float>(double{x} + double{y}); }},
    {"sub", &F32VBinaryVariant::sub, [](float x, float y) { return static_cast<float>(double{x} - double{y}); }},
    {"mul", &F32VBinaryVariant::mul, [](float x, float y) { return static_cast<float>(double{x} * double{y}); }},
    {"div", &F32VBinaryVariant::div, [](float x, float y) { return static_cast<float>(double{x} / double{y}); }},
    {"max", &F32VBinaryVariant::max, [](float x, float y) { return x < y ? y : x; }},
    {"min", &F32VBinaryVariant::min, [](float x, float y) { return y < x ? y : x; }},
};

TEST_P(F32VBinary, AllFormsSizesAndSpecials) {
  static const char* const kForms[] = {"vv", "vs", "sv"};
  const std::vector<float> sp = special_values();
  for (const BinaryCase& c : kBinary)
    for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{2}, int64_t{3}, int64_t{GetParam().lanes - 1}, int64_t{GetParam().lanes},
                      int64_t{GetParam().lanes + 1}, int64_t{2 * GetParam().lanes + 1}, int64_t{1003}}) {
      std::vector<float> a = random_values(n, -100.0f, 100.0f, 11), b = random_values(n, -100.0f, 100.0f, 12);
      for (size_t i = 0; i < a.size(); ++i) {
        if (i % 4 == 1) a[i] = sp[i % sp.size()];
        if (i % 5 == 2) b[i] = sp[(i * 7) % sp.size()];
      }
      const F32VBinaryForms& f = GetParam().*c.forms;
      for (int form = 0; form < 3; ++form) {
        SCOPED_TRACE(::testing::Message() << GetParam().name << " " << c.name << " form " << kForms[form]
                                          << " n=" << n);
        const F32VBinaryFn fn = form == 0 ? f.vv : form == 1 ? f.vs : f.sv;
        for (float s : {1.5f, -0.0f, std::numeric_limits<float>::quiet_NaN()}) {
          std::vector<float> x = a, y = b;
          if (form == 1 && n > 0) y[0] = s;
          if (form == 2 && n > 0) x[0] = s;
          std::vector<float> out(a.size() + 1, 77.0f);
          fn(x.data(), y.data(), out.data(), n);
          EXPECT_EQ(out[a.size()], 77.0f) << "wrote past the end";
          std::vector<float> in_a = x, in_b = y;  // in place over either operand
          fn(in_a.data(), y.data(), in_a.data(), n);
          fn(x.data(), in_b.data(), in_b.data(), n);
          for (size_t i = 0; i < a.size(); ++i) {
            const float xi = form == 2 ? x[0] : x[i], yi = form == 1 ? y[0] : y[i];
            const float want = c.ref(xi, yi);
            ASSERT_EQ(ulp_distance(out[i], want), 0) << c.name << "(" << xi << ", " << yi << ") = " << out[i];
            if (!std::isnan(want)) {
              ASSERT_EQ(std::signbit(out[i]), std::signbit(want)) << c.name << "(" << xi << ", " << yi << ")";
            }
            if (form != 2) {
              ASSERT_EQ(ulp_distance(in_a[i], out[i]), 0) << "in place over a, " << i;
            }
            if (form != 1) {
              ASSERT_EQ(ulp_distance(in_b[i], out[i]), 0) << "in place over b, " << i;
            }
          }
        }
      }
    }
}

INSTANTIATE_TEST_SUITE_P(Variants, F32VBinary,
                         ::testing::ValuesIn(f32_vbinary_variants().begin(), f32_vbinary_variants().end()),
                         [](const ::testing::TestParamInfo<F32VBinaryVariant>& p) { return std::string(p.param.name); });

// ---------------------------------------------------------------- f32-rows

class F32Rows : public ::testing::TestWithParam<F32RowsVariant> {
 protected:
  void SetUp() override {
    if (!isa_supported(GetParam().isa))
      GTEST_SKIP() << GetParam().name << " NOT TESTED: this CPU (or build) lacks " << isa_name(GetParam().isa);
  }
};

TEST_P(F32Rows, SoftmaxAgainstDouble) {
  const F32RowsVariant& gen = generic_of(f32_rows_variants());
  std::vector<int64_t> sizes;
  for (int64_t n = 1; n <= 2 * 16 + 1; ++n) sizes.push_back(n);
  for (int64_t n : {100, 768, 1023, 4099}) sizes.push_back(n);
  for (int64_t n : sizes)
    for (float scale : {1.0f, 30.0f}) {  // 30: most exponentials underflow
      SCOPED_TRACE(::testing::Message() << GetParam().name << " softmax n=" << n << " scale " << scale);
      std::vector<float> in = random_values(n, -scale, scale, static_cast<uint32_t>(n));
      if (n > 3) in[static_cast<size_t>(n / 2)] = -std::numeric_limits<float>::infinity();  // a masked position
      std::vector<float> out(in.size() + 1, 77.0f), g(in.size()), y = in;
      GetParam().softmax(in.data(), out.data(), n);
      gen.softmax(in.data(), g.data(), n);
      GetParam().softmax(y.data(), y.data(), n);
      EXPECT_EQ(out[in.size()], 77.0f) << "wrote past the end";
      double mx = -INFINITY, sum = 0;
      for (float v : in) mx = std::max(mx, double{v});
      for (float v : in) sum += std::exp(double{v} - mx);
      for (size_t i = 0; i < in.size(); ++i) {
        const double want = std::exp(double{in[i]} - mx) / sum;
        // in - max rounds in float (to 2^-24 relative), which e^ turns into |in - max| 2^-24 relative
        const double rel = std::isinf(in[i]) ? 0.0 : 1e-6 + std::fabs(double{in[i]} - mx) * 0x1p-24;  // -inf: exactly 0
        // (+ FLT_MIN: exponentials below it are 0, see f32-rows.h)
        ASSERT_LE(std::fabs(out[i] - want), rel * want + 0x1p-126) << i << ": " << out[i] << " vs " << want;
        ASSERT_LE(std::fabs(out[i] - g[i]), 1e-6 * g[i] + 1e-38) << i << " vs generic";
        ASSERT_EQ(ulp_distance(y[i], out[i]), 0) << "in place, " << i;
      }
    }
  // a NaN makes every output NaN; an all -inf row has no maximum: NaN too (0/0), like the reference
  std::vector<float> nan_row = {1.0f, std::numeric_limits<float>::quiet_NaN(), 2.0f}, out(3);
  GetParam().softmax(nan_row.data(), out.data(), 3);
  for (float v : out) EXPECT_TRUE(std::isnan(v));
}

// softmax(in * scale + add) against the double reference of the same float scores (each of in * scale and
// + add rounded, or one FMA: the scores' rounding, |score| 2^-23, is what e^ turns into a relative error).
TEST_P(F32Rows, ScaledSoftmaxAgainstDouble) {
  for (int64_t n : {1, 5, 16, 17, 33, 128, 300})
    for (bool with_add : {false, true}) {
      SCOPED_TRACE(::testing::Message() << GetParam().name << " scaled softmax n=" << n << " add " << with_add);
      std::vector<float> in = random_values(n, -20.0f, 20.0f, static_cast<uint32_t>(3 * n));
      std::vector<float> add = random_values(n, -5.0f, 5.0f, static_cast<uint32_t>(5 * n));
      if (n > 2) add[static_cast<size_t>(n - 1)] = -3.4028235e38f;  // a masked position
      const float scale = 0.125f;
      std::vector<float> out(in.size() + 1, 77.0f), y = in;
      GetParam().softmax_scaled(in.data(), scale, with_add ? add.data() : nullptr, out.data(), n);
      GetParam().softmax_scaled(y.data(), scale, with_add ? add.data() : nullptr, y.data(), n);  // in place
      EXPECT_EQ(out[in.size()], 77.0f) << "wrote past the end";
      std::vector<double> t(in.size());
      double mx = -INFINITY, sum = 0;
      for (size_t i = 0; i < in.size(); ++i) {
        t[i] = double{in[i]} * scale + (with_add ? double{add[i]} : 0.0);
        mx = std::max(mx, t[i]);
      }
      for (double v : t) sum += std::exp(v - mx);
      for (size_t i = 0; i < in.size(); ++i) {
        const double want = std::exp(t[i] - mx) / sum;
        const double rel = 2e-6 + (std::fabs(t[i]) + std::fabs(mx)) * 0x1p-23;
        ASSERT_LE(std::fabs(out[i] - want), rel * want + 0x1p-126) << i << ": " << out[i] << " vs " << want;
        ASSERT_EQ(ulp_distance(y[i], out[i]), 0) << "in place, " << i;
      }
    }
}

// A causal mask as transformers writes it (finfo.min added to the scores): the masked positions are exactly 0,
// the rest as the double reference; exponentials in the subnormal range (x - max in (-104, -87.3)) are 0 too.
TEST_P(F32Rows, SoftmaxOfAMaskedRow) {
  for (int64_t n : {7, 16, 128, 300}) {
    SCOPED_TRACE(::testing::Message() << GetParam().name << " masked softmax n=" << n);
    std::vector<float> in = random_values(n, -3.0f, 3.0f, static_cast<uint32_t>(n));
    for (int64_t i = n / 2; i < n; ++i) in[static_cast<size_t>(i)] = i % 3 == 0 ? -3.4028235e38f : i % 3 == 1 ? -95.0f : -88.0f;
    std::vector<float> out(in.size());
    GetParam().softmax(in.data(), out.data(), n);
    double mx = -INFINITY, sum = 0;
    for (float v : in) mx = std::max(mx, double{v});
    for (float v : in) sum += std::exp(double{v} - mx);
    for (int64_t i = 0; i < n; ++i) {
      const double want = std::exp(double{in[static_cast<size_t>(i)]} - mx) / sum;
      if (i >= n / 2) {
        ASSERT_EQ(out[static_cast<size_t>(i)], 0.0f) << i << ": e^(" << in[static_cast<size_t>(i)] << " - max) is below FLT_MIN";
        ASSERT_LT(want, 0x1p-126) << i;
      } else {
        ASSERT_LE(std::fabs(out[static_cast<size_t>(i)] - want), 2e-6 * want) << i;
      }
    }
  }
}

// The definition, element by element: every shape around the block edges, strides past the width, a
// border of sentinels around the output that must stay untouched (bit patterns: a copy is exact, NaNs too).
TEST_P(F32Rows, TransposeIsTheDefinition) {
  for (int64_t rows : {1, 3, 4, 7, 8, 15, 16, 17, 31, 33, 126, 128})
    for (int64_t cols : {1, 2, 5, 8, 9, 16, 18, 40, 126, 128}) {
      SCOPED_TRACE(::testing::Message() << GetParam().name << " transpose " << rows << " x " << cols);
      const int64_t ldi = cols + 3, ldo = rows + 5;
      std::vector<float> in = random_values(rows * ldi, -1.0f, 1.0f, static_cast<uint32_t>(rows * 131 + cols));
      in[0] = std::numeric_limits<float>::quiet_NaN();
      std::vector<float> out(static_cast<size_t>((cols + 1) * ldo), 77.0f);
      GetParam().transpose(in.data(), ldi, rows, cols, out.data(), ldo);
      for (int64_t j = 0; j <= cols; ++j)
        for (int64_t i = 0; i < ldo; ++i) {
          const float got = out[static_cast<size_t>(j * ldo + i)];
          if (j < cols && i < rows)
            ASSERT_EQ(std::bit_cast<uint32_t>(got), std::bit_cast<uint32_t>(in[static_cast<size_t>(i * ldi + j)]))
                << "out[" << j << ", " << i << "]";
          else
            ASSERT_EQ(got, 77.0f) << "wrote outside the output at " << j << ", " << i;
        }
    }
}

INSTANTIATE_TEST_SUITE_P(Variants, F32Rows, ::testing::ValuesIn(f32_rows_variants().begin(), f32_rows_variants().end()),
                         [](const ::testing::TestParamInfo<F32RowsVariant>& p) { return std::string(p.param.name); });

}  // namespace
}  // namespace kiln::cpu::testing
