// Every f32-gemv variant: row counts, K around the 4-row and 16-wide steps of
// its loops, N remainders, strides wider than the rows (gemv_tester.h).
#include "gemv_tester.h"

namespace kiln::cpu::testing {
namespace {

class F32Gemv : public ::testing::TestWithParam<F32GemvVariant> {
 protected:
  void SetUp() override {
    if (!isa_supported(GetParam().isa))
      GTEST_SKIP() << GetParam().name << " NOT TESTED: this CPU (or build) lacks " << isa_name(GetParam().isa);
  }
};

TEST_P(F32Gemv, AxpyRowsAllRemainders) {
  for (int64_t rows : {1, 2, 3, 5, 15})
    for (int64_t k : {1, 2, 3, 4, 5, 7, 8, 9, 33})
      for (int64_t n = 1; n <= 49; ++n) GemvTester().rows(rows).k(k).n(n).test_axpy_rows(GetParam());
}

TEST_P(F32Gemv, AxpyRowsWideAndStrided) {
  for (int64_t n : {64, 100, 257, 768})
    for (int64_t k : {1, 6, 768})
      GemvTester().rows(2).k(k).n(n).x_pad(3).w_pad(5).o_pad(7).test_axpy_rows(GetParam());
  for (int64_t n : {1, 15, 16, 17, 31, 33})
    GemvTester().rows(3).k(13).n(n).x_pad(1).w_pad(2).o_pad(1).test_axpy_rows(GetParam());
}

TEST_P(F32Gemv, Dot) {
  for (int64_t k = 0; k <= 65; ++k) GemvTester().k(k).test_dot(GetParam());
  for (int64_t k : {255, 768, 1000, 3072}) GemvTester().k(k).test_dot(GetParam());
}

TEST_P(F32Gemv, DotRows) {
  for (int64_t rows : {1, 2, 4, 17})
    for (int64_t k = 1; k <= 40; ++k)
      for (int64_t w_pad : {0, 2})
        GemvTester().rows(rows).k(k).x_pad(k % 3).w_pad(w_pad).o_pad(1).test_dot_rows(GetParam());
  GemvTester().rows(3).k(768).w_pad(3).test_dot_rows(GetParam());
}

TEST_P(F32Gemv, DotBlock) {
  for (int64_t rows : {1, 2, 3, 4, 5, 7})
    for (int64_t n : {1, 7, 8, 9, 15, 16, 17, 33, 64})
      for (int64_t k : {1, 7, 16, 17, 64, 100, 128})
        GemvTester().rows(rows).n(n).k(k).x_pad(k % 3).w_pad(n % 2).o_pad(1).test_dot_block(GetParam());
  GemvTester().rows(3).n(256).k(64).test_dot_block(GetParam());
  for (uint32_t seed : {1u, 2u})
    GemvTester().rows(3).n(50).k(64).w_pad(2).o_pad(3).float_data(true).seed(seed).test_dot_block(GetParam());
}

TEST_P(F32Gemv, FloatData) {
  for (uint32_t seed : {1u, 2u}) {
    GemvTester().rows(3).k(771).n(203).w_pad(4).float_data(true).seed(seed).test_axpy_rows(GetParam());
    GemvTester().k(771).float_data(true).seed(seed).test_dot(GetParam());
    GemvTester().rows(5).k(771).w_pad(1).float_data(true).seed(seed).test_dot_rows(GetParam());
  }
}

INSTANTIATE_TEST_SUITE_P(Variants, F32Gemv, ::testing::ValuesIn(f32_gemv_variants().begin(), f32_gemv_variants().end()),
                         [](const ::testing::TestParamInfo<F32GemvVariant>& p) { return std::string(p.param.name); });

}  // namespace
}  // namespace kiln::cpu::testing
