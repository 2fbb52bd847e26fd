// Every f32-gemm variant over every M/N/K remainder of its tile and K block,
// alpha, accumulate and leading dimensions wider than the rows (gemm_tester.h).
#include "gemm_tester.h"

#include "kiln/cpu/gemm.h"

namespace kiln::cpu::testing {
namespace {

class F32Gemm : public ::testing::TestWithParam<F32GemmVariant> {
 protected:
  void SetUp() override {
    if (!isa_supported(GetParam().isa))
      GTEST_SKIP() << GetParam().name << " NOT TESTED: this CPU (or build) lacks " << isa_name(GetParam().isa);
  }
  int64_t mr() const { return GetParam().mr; }
  int64_t nr() const { return GetParam().nr; }
  int64_t kc() const { return GetParam().kc; }
};

TEST_P(F32Gemm, AllMNRemaindersSmallK) {
  for (int64_t k : {1, 2, 5, 17})
    for (int64_t m = 1; m <= 2 * mr() + 1; ++m)
      for (int64_t n = 1; n <= 2 * nr() + 1; ++n) GemmTester().m(m).n(n).k(k).test(GetParam());
}

TEST_P(F32Gemm, KAroundTheKBlock) {
  for (int64_t k : {kc() - 1, kc(), kc() + 1, 2 * kc() + 1})
    for (int64_t m : {int64_t{1}, mr() - 1, mr(), mr() + 1, 2 * mr() + 1})
      for (int64_t n : {int64_t{1}, nr() - 1, nr(), nr() + 1, 2 * nr() + 1})
        GemmTester().m(m).n(n).k(k).test(GetParam());
}

TEST_P(F32Gemm, Alpha) {
  for (float alpha : {0.5f, -2.0f, 0.0f})
    for (int64_t k : {int64_t{3}, kc() + 1})
      GemmTester().m(2 * mr() + 1).n(2 * nr() + 1).k(k).alpha(alpha).test(GetParam());
}

TEST_P(F32Gemm, Accumulate) {
  for (float alpha : {1.0f, -0.5f})
    for (int64_t k : {int64_t{1}, int64_t{7}, kc(), kc() + 1, 2 * kc() + 3})
      for (int64_t m : {int64_t{1}, mr() + 1, 2 * mr() + 1})
        GemmTester().m(m).n(2 * nr() + 1).k(k).alpha(alpha).accumulate(true).test(GetParam());
}

TEST_P(F32Gemm, LeadingDimensionsWiderThanRows) {
  for (int64_t k : {int64_t{3}, kc() + 1})
    for (int64_t m = 1; m <= 2 * mr() + 1; ++m)
      for (int64_t n : {int64_t{1}, nr() - 1, nr(), nr() + 1, 2 * nr() + 1})
        for (bool acc : {false, true})
          GemmTester().m(m).n(n).k(k).a_pad(3).b_pad(5).c_pad(7).accumulate(acc).test(GetParam());
}

// gemm_bt (B given as Bᵀ, [n, k]: a linear layer's weights as files hold them) against the same reference.
TEST_P(F32Gemm, TransposedB) {
  for (int64_t k : {int64_t{1}, int64_t{5}, kc() - 1, kc() + 1, 2 * kc() + 3})
    for (int64_t m : {int64_t{1}, mr() + 1, 2 * mr() + 1})
      for (int64_t n : {int64_t{1}, int64_t{3}, nr() - 1, nr(), nr() + 1, 2 * nr() + 5})
        for (bool acc : {false, true})
          GemmTester().m(m).n(n).k(k).b_pad(k % 2 == 0 ? 0 : 3).c_pad(2).accumulate(acc).alpha(acc ? 0.5f : 1.0f)
              .transposed_b(true).test(GetParam());
  GemmTester().m(37).n(200).k(300).float_data(true).transposed_b(true).test(GetParam());
}

// gemm_packed (B packed once as the variant's panels, from B or from Bᵀ: a linear layer's weights at
// load), over the remainders, and from the second panel on (a task's columns) against the same reference.
TEST_P(F32Gemm, PackedB) {
  for (int64_t k : {int64_t{1}, int64_t{5}, kc() - 1, kc() + 1, 2 * kc() + 3})
    for (int64_t m : {int64_t{1}, mr() - 1, mr() + 1, 2 * mr() + 1})
      for (int64_t n : {int64_t{1}, int64_t{3}, nr() - 1, nr(), nr() + 1, 2 * nr() + 5})
        for (bool acc : {false, true})
          for (bool from_bt : {false, true})
            GemmTester().m(m).n(n).k(k).b_pad(k % 2 == 0 ? 0 : 3).c_pad(2).accumulate(acc).alpha(acc ? 0.5f : 1.0f)
                .transposed_b(from_bt).packed_b(true).test(GetParam());
  GemmTester().m(37).n(200).k(300).float_data(true).packed_b(true).test(GetParam());
  // a long K: many K blocks over the packed panels
  for (bool acc : {false, true})
    GemmTester().m(2 * mr() + 1).n(2 * nr() + 5).k(2 * 2048 + 3).accumulate(acc).packed_b(true).test(GetParam());
}

TEST_P(F32Gemm, FloatData) {
  for (uint32_t seed : {1u, 2u, 3u})
    GemmTester().m(2 * mr() + 1).n(2 * nr() + 1).k(kc() + 5).alpha(0.7f).accumulate(seed == 2).b_pad(1).float_data(true)
        .seed(seed).test(GetParam());
  GemmTester().m(37).n(200).k(300).float_data(true).test(GetParam());  // many tiles and panels
}

// sgemm_with runs this variant (the ISA's only one) and handles degenerate sizes itself.
TEST_P(F32Gemm, SgemmWithRunsIt) {
  const float a[6] = {1, 2, 3, 4, 5, 6}, b[6] = {1, 0, -1, 2, 0.5f, 1};
  float c[4] = {9, 9, 9, 9};
  ASSERT_TRUE(sgemm_with(GetParam().isa, 2, 2, 3, 1.0f, a, 3, b, 2, false, c, 2));
  EXPECT_EQ(c[0], 1 * 1 + 2 * -1 + 3 * 0.5f);
  EXPECT_EQ(c[1], 0 + 2 * 2 + 3 * 1);
  EXPECT_EQ(c[2], 4 * 1 + 5 * -1 + 6 * 0.5f);
  EXPECT_EQ(c[3], 0 + 5 * 2 + 6 * 1);
  ASSERT_TRUE(sgemm_with(GetParam().isa, 2, 2, 0, 1.0f, a, 3, b, 2, false, c, 2));  // k = 0: C = 0
  for (float e : c) EXPECT_EQ(e, 0.0f);
  c[0] = 5;
  ASSERT_TRUE(sgemm_with(GetParam().isa, 2, 2, 0, 1.0f, a, 3, b, 2, true, c, 2));  // k = 0, accumulate: C stays
  EXPECT_EQ(c[0], 5.0f);
  ASSERT_TRUE(sgemm_with(GetParam().isa, 0, 2, 3, 1.0f, a, 3, b, 2, false, c, 2));  // m = 0: nothing
  EXPECT_EQ(c[0], 5.0f);
}

INSTANTIATE_TEST_SUITE_P(Variants, F32Gemm, ::testing::ValuesIn(f32_gemm_variants().begin(), f32_gemm_variants().end()),
                         [](const ::testing::TestParamInfo<F32GemmVariant>& p) { return std::string(p.param.name); });

}  // namespace
}  // namespace kiln::cpu::testing
