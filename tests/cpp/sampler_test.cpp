// llm::Sampler: invariants (greedy cases, reproducibility, the candidate sets
// top-k and top-p allow, the repetition penalty's direction, frequencies).
#include "kiln/llm/sampler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <set>
#include <vector>

namespace kiln::llm {
namespace {

std::vector<float> logits(size_t n, uint32_t seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.0f, 3.0f);
  std::vector<float> v(n);
  for (float& x : v) x = d(g);
  return v;
}

TEST(Sampler, GreedyCases) {
  const auto l = logits(1000, 1);
  const int32_t best = argmax(l);
  for (float x : l) EXPECT_LE(x, l[static_cast<size_t>(best)]);
  Sampler t0(1000, {0.0f, 0, 1.0f, 1.0f, 7});
  Sampler k1(1000, {1.5f, 1, 1.0f, 1.0f, 7});
  for (int i = 0; i < 20; ++i) {
    EXPECT_EQ(t0.next(l, {}), best);
    EXPECT_EQ(k1.next(l, {}), best);
  }
}

TEST(Sampler, SameSeedSameTokens) {
  const auto l = logits(500, 2);
  SamplerOptions o{0.8f, 40, 0.95f, 1.1f, 1234};
  Sampler a(500, o), b(500, o);
  std::vector<int32_t> ha, hb;
  for (int i = 0; i < 100; ++i) {
    ha.push_back(a.next(l, ha));
    hb.push_back(b.next(l, hb));
  }
  EXPECT_EQ(ha, hb);
  o.seed = 99;
  Sampler c(500, o);
  std::vector<int32_t> hc;
  for (int i = 0; i < 100; ++i) hc.push_back(c.next(l, hc));
  EXPECT_NE(ha, hc);
}

TEST(Sampler, TopKAndTopPLimitTheCandidates) {
  std::vector<float> l(10);
  for (size_t i = 0; i < l.size(); ++i) l[i] = static_cast<float>(i);  // token 9 likeliest
  Sampler k3(10, {1.0f, 3, 1.0f, 1.0f, 5});
  std::set<int32_t> seen;
  for (int i = 0; i < 2000; ++i) seen.insert(k3.next(l, {}));
  EXPECT_EQ(seen, (std::set<int32_t>{7, 8, 9}));
  // softmax(0..9): p(9) = 0.632, p(8) = 0.233 -> top_p 0.8 keeps {9, 8}
  Sampler p8(10, {1.0f, 0, 0.8f, 1.0f, 5});
  seen.clear();
  for (int i = 0; i < 2000; ++i) seen.insert(p8.next(l, {}));
  EXPECT_EQ(seen, (std::set<int32_t>{8, 9}));
}

TEST(Sampler, FrequenciesFollowTheSoftmax) {
  std::vector<float> l = {0.0f, std::log(3.0f)};  // p = 1/4, 3/4 at temperature 1
  Sampler s(2, {1.0f, 0, 1.0f, 1.0f, 11});
  int ones = 0;
  const int n = 20000;
  for (int i = 0; i < n; ++i) ones += s.next(l, {}) == 1;
  EXPECT_NEAR(static_cast<double>(ones) / n, 0.75, 0.02);
}

TEST(Sampler, RepeatPenaltyDemotesSeenTokens) {
  std::vector<float> l = {2.0f, 1.9f, -1.0f};
  Sampler s(3, {0.0f, 0, 1.0f, 1.5f, 0});
  EXPECT_EQ(s.next(l, {}), 0);
  const std::vector<int32_t> hist = {0, 0};
  EXPECT_EQ(s.next(l, hist), 1);  // 2.0 / 1.5 < 1.9
  EXPECT_EQ(l[0], 2.0f);          // the caller's logits are untouched
}

}  // namespace
}  // namespace kiln::llm
