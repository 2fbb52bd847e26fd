// cpu::ThreadPool: sizes, and parallel_for visiting every index exactly once.
#include "kiln/cpu/threadpool.h"

#include <gtest/gtest.h>

#include <array>
#include <atomic>
#include <chrono>
#include <memory>
#include <thread>
#include <vector>

namespace kiln::cpu {
namespace {

void expect_each_index_once(const ThreadPool& pool, size_t n) {
  std::unique_ptr<std::atomic<int>[]> hits(new std::atomic<int>[n + 1]);
  for (size_t i = 0; i <= n; ++i) hits[i] = 0;
  pool.parallel_for(n, [&](size_t i) { hits[i < n ? i : n].fetch_add(1); });
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "index " << i << " of " << n;
  EXPECT_EQ(hits[n].load(), 0) << "an index >= n";
}

TEST(ThreadPool, SingleThreadedRunsInline) {
  for (size_t t : {size_t{0}, size_t{1}}) {
    ThreadPool pool(t);
    EXPECT_EQ(pool.threads(), 1u);
    EXPECT_EQ(pool.raw(), nullptr);
    const std::thread::id caller = std::this_thread::get_id();
    bool elsewhere = false;
    pool.parallel_for(100, [&](size_t) { elsewhere = elsewhere || std::this_thread::get_id() != caller; });
    EXPECT_FALSE(elsewhere);
    expect_each_index_once(pool, 37);
  }
}

TEST(ThreadPool, WorkersCoverEveryIndexOnce) {
  ThreadPool pool(4);
  EXPECT_EQ(pool.threads(), 4u);
  EXPECT_NE(pool.raw(), nullptr);
  for (size_t n : {0, 1, 2, 3, 4, 5, 63, 1000}) expect_each_index_once(pool, n);
}

TEST(ThreadPool, ParallelSumMatchesSerial) {
  ThreadPool pool(3);
  std::vector<int64_t> part(97, 0);
  pool.parallel_for(part.size(), [&](size_t i) {
    for (int64_t j = 0; j < 1000; ++j) part[i] += static_cast<int64_t>(i) * j;
  });
  for (size_t i = 0; i < part.size(); ++i) EXPECT_EQ(part[i], static_cast<int64_t>(i) * 999 * 1000 / 2);
}

// Many small loops back to back: a worker that wakes late must never run an
// index of a newer loop with an older loop's function (each loop's function
// writes its own loop number).
TEST(ThreadPool, BackToBackLoopsNeverMix) {
  ThreadPool pool(2);
  std::vector<int> seen(3);
  for (int loop = 0; loop < 20000; ++loop) {
    pool.parallel_for(seen.size(), [&, loop](size_t i) { seen[i] = loop; });
    for (size_t i = 0; i < seen.size(); ++i) ASSERT_EQ(seen[i], loop) << "index " << i;
  }
}

// Loops of alternating sizes back to back (a small one after a larger one and the
// reverse), each index of each loop counted: a worker late in one loop, holding its
// claim word while the caller publishes the next, larger loop, must not claim an index
// outside the new loop's claims (it ran twice, and the loop's count of unfinished
// indices went below zero: the caller waited forever; seen in an LLM's decode loop).
TEST(ThreadPool, LoopsOfChangingSizeRunEachIndexOnce) {
  ThreadPool pool(2);
  constexpr size_t kMax = 16;
  std::array<std::atomic<int>, kMax> hits{};
  for (int loop = 0; loop < 300000; ++loop) {
    const size_t n = 2 + static_cast<size_t>(loop % 3 == 0 ? 11 : loop % 5);
    for (size_t i = 0; i < n; ++i) hits[i].store(0, std::memory_order_relaxed);
    pool.parallel_for(n, [&](size_t i) { hits[i].fetch_add(1, std::memory_order_relaxed); });
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "loop " << loop << " index " << i << " of " << n;
  }
}

// A worker that holds an index far longer than the caller's share (as a
// descheduled thread does) makes the pool run the next loops on the caller.
TEST(ThreadPool, StalledWorkerMakesLoopsRunOnTheCaller) {
  ThreadPool pool(2);
  const std::thread::id caller = std::this_thread::get_id();
  for (int attempt = 0; attempt < 50 && pool.serial_fallbacks() == 0; ++attempt)
    pool.parallel_for(64, [&](size_t) {  // the caller's share lasts long enough for a worker to wake
      const bool on_caller = std::this_thread::get_id() == caller;
      std::this_thread::sleep_for(on_caller ? std::chrono::microseconds(200) : std::chrono::microseconds(50000));
    });
  ASSERT_GT(pool.serial_fallbacks(), 0u) << "no worker ever took an index in 50 loops";
  bool elsewhere = false;
  pool.parallel_for(64, [&](size_t) { elsewhere = elsewhere || std::this_thread::get_id() != caller; });
  EXPECT_FALSE(elsewhere) << "the loop right after a stall should run on the caller alone";
  expect_each_index_once(pool, 1000);
}

}  // namespace
}  // namespace kiln::cpu
