// The memory planner on hand-made and random lifetimes, checked against
// invariants computed here: two storages alive at the same instruction never
// share a byte, every offset is aligned, the arena holds every storage, it is
// no larger than the aligned sum and no smaller than the bytes alive at the
// busiest instruction.
#include "kiln/emit/memory_plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <map>
#include <random>

namespace kiln::emit {
namespace {

uint64_t round_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

bool alive_together(const StorageRequest& a, const StorageRequest& b) {
  return std::max(a.first, b.first) <= std::min(a.last, b.last);
}

// Every property of a valid plan; the test's own arithmetic, not the planner's.
void expect_valid(const std::vector<StorageRequest>& req, const MemoryPlan& plan, uint64_t alignment) {
  ASSERT_EQ(plan.offsets.size(), req.size());
  uint64_t naive = 0, end = 0;
  for (size_t i = 0; i < req.size(); ++i) {
    EXPECT_EQ(plan.offsets[i] % alignment, 0u) << "request " << i;
    naive += round_up(req[i].bytes, alignment);
    end = std::max(end, plan.offsets[i] + req[i].bytes);
  }
  EXPECT_EQ(plan.naive_bytes, naive);
  EXPECT_GE(plan.total_bytes, end);
  EXPECT_LE(plan.total_bytes, naive);
  for (size_t i = 0; i < req.size(); ++i)
    for (size_t j = i + 1; j < req.size(); ++j) {
      if (!alive_together(req[i], req[j]) || req[i].bytes == 0 || req[j].bytes == 0) continue;
      bool disjoint = plan.offsets[i] + req[i].bytes <= plan.offsets[j] ||
                      plan.offsets[j] + req[j].bytes <= plan.offsets[i];
      EXPECT_TRUE(disjoint) << "requests " << i << " [" << plan.offsets[i] << ", +" << req[i].bytes << ") and " << j
                            << " [" << plan.offsets[j] << ", +" << req[j].bytes << ") are alive together";
    }
  // No plan can be smaller than what is alive at one instruction.
  std::map<int32_t, uint64_t> alive;
  for (const auto& r : req)
    for (int32_t t = r.first; t <= r.last; ++t) alive[t] += r.bytes;
  for (const auto& [t, bytes] : alive) EXPECT_GE(plan.total_bytes, bytes) << "instruction " << t;
}

TEST(MemoryPlan, EmptyProgramNeedsNoArena) {
  MemoryPlan plan = plan_memory({});
  EXPECT_TRUE(plan.offsets.empty());
  EXPECT_EQ(plan.total_bytes, 0u);
  EXPECT_EQ(plan.naive_bytes, 0u);
}

TEST(MemoryPlan, ChainReusesMemory) {
  // x -> a -> b -> c: each storage dies where the next is written, so one
  // pair is alive at a time and the arena holds the two largest neighbours.
  std::vector<StorageRequest> req{{100, -1, 0}, {200, 0, 1}, {100, 1, 2}, {200, 2, 3}};
  MemoryPlan plan = plan_memory(req, 64);
  expect_valid(req, plan, 64);
  EXPECT_EQ(plan.naive_bytes, 128u + 256 + 128 + 256);
  EXPECT_EQ(plan.total_bytes, 256u + 128);
  EXPECT_EQ(plan.offsets[1], plan.offsets[3]);  // b and d never meet
}

TEST(MemoryPlan, AllAliveAtOnceIsTheAlignedSum) {
  std::vector<StorageRequest> req{{10, 0, 5}, {70, 1, 5}, {64, 2, 5}, {1, 3, 5}};
  MemoryPlan plan = plan_memory(req, 64);
  expect_valid(req, plan, 64);
  EXPECT_EQ(plan.total_bytes, 64u + 128 + 64 + 64);
  EXPECT_EQ(plan.total_bytes, plan.naive_bytes);
}

TEST(MemoryPlan, LifetimesTouchingAtOneInstructionOverlap) {
  // `last` is inclusive: a storage read by instruction 3 and one written by
  // instruction 3 are alive together (a kernel's input and its out).
  std::vector<StorageRequest> req{{64, 0, 3}, {64, 3, 4}};
  MemoryPlan plan = plan_memory(req, 64);
  expect_valid(req, plan, 64);
  EXPECT_NE(plan.offsets[0], plan.offsets[1]);
  EXPECT_EQ(plan.total_bytes, 128u);
}

TEST(MemoryPlan, SmallStorageFillsAGap) {
  // A big storage alive throughout, a medium one early and one late; a small
  // storage alive in the middle fits where the early one was.
  std::vector<StorageRequest> req{{256, 0, 10}, {128, 0, 2}, {128, 6, 10}, {64, 3, 5}};
  MemoryPlan plan = plan_memory(req, 64);
  expect_valid(req, plan, 64);
  EXPECT_EQ(plan.total_bytes, 256u + 128);
}

TEST(MemoryPlan, ZeroByteStoragesAreHarmless) {
  std::vector<StorageRequest> req{{0, 0, 3}, {64, 0, 3}, {0, 1, 2}, {32, 2, 3}};
  MemoryPlan plan = plan_memory(req, 16);
  expect_valid(req, plan, 16);
  EXPECT_EQ(plan.total_bytes, 64u + 32);
}

TEST(MemoryPlan, AlignmentOfOneAndOdd) {
  std::vector<StorageRequest> req{{3, 0, 2}, {5, 1, 3}, {7, 2, 2}};
  MemoryPlan tight = plan_memory(req, 1);
  expect_valid(req, tight, 1);
  EXPECT_EQ(tight.total_bytes, 15u);
  MemoryPlan odd = plan_memory(req, 24);
  expect_valid(req, odd, 24);
}

TEST(MemoryPlan, RandomLifetimes) {
  std::mt19937 rng(20240610);
  for (int round = 0; round < 300; ++round) {
    const uint64_t alignment = std::array<uint64_t, 4>{1, 8, 64, 128}[round % 4];
    const int instructions = 1 + static_cast<int>(rng() % 40);
    const size_t count = rng() % 60;
    std::vector<StorageRequest> req(count);
    for (auto& r : req) {
      r.first = static_cast<int32_t>(rng() % static_cast<uint32_t>(instructions + 1)) - 1;  // -1: a graph input
      r.last = r.first + static_cast<int32_t>(rng() % static_cast<uint32_t>(instructions - std::max(r.first, 0) + 1));
      r.bytes = rng() % 8 == 0 ? 0 : 1 + rng() % (rng() % 2 ? 100 : 5000);
    }
    MemoryPlan plan = plan_memory(req, alignment);
    SCOPED_TRACE(testing::Message() << "round " << round << ", alignment " << alignment);
    expect_valid(req, plan, alignment);
    if (testing::Test::HasFailure()) return;
  }
}

}  // namespace
}  // namespace kiln::emit
