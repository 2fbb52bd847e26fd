// cpu::ThreadPool (see the header for why it is not pthreadpool).
//
// One job at a time. A job is published by closing the previous one's claim
// word ((epoch << 32 | UINT32_MAX): no index of it can be claimed), writing the
// job's fields, then storing (epoch << 32 | 0) into `claim`; a thread claims
// index i by a compare-exchange of (epoch, i) -> (epoch, i + 1), so a thread that
// wakes up late can never take an index of a later job with an earlier job's
// function, nor an index outside a job's claims. `left` counts unfinished indices;
// the thread that finishes the last one wakes the caller if it sleeps.
#include "kiln/cpu/threadpool.h"

#include <pthread.h>
#include <pthreadpool.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define KILN_CPU_RELAX() _mm_pause()
#elif defined(__aarch64__)
#define KILN_CPU_RELAX() __asm__ __volatile__("yield")
#else
#define KILN_CPU_RELAX() ((void)0)
#endif

namespace kiln::cpu {
namespace {

using Clock = std::chrono::steady_clock;

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
}

// How long an idle thread spins before it sleeps: long enough to bridge the
// gap between two loops of one model step, short enough not to hold a core.
constexpr int64_t kWorkerSpinNs = 100'000;
constexpr int64_t kCallerSpinNs = 30'000;
// The caller's waiting is judged over windows of loops: when the tails (the
// caller waiting for others after its own share) are more than a quarter of the
// window's loop time, loops run on the caller alone for a while. One tail this
// long is judged at once.
constexpr int64_t kWindowNs = 4'000'000;
constexpr int64_t kStallNs = 1'000'000;
constexpr int64_t kSerialMinNs = 10'000'000;
constexpr int64_t kSerialMaxNs = 500'000'000;

// Spins until pred() or `budget_ns` passed; returns pred().
template <class Pred>
bool spin_until(const Pred& pred, int64_t budget_ns) {
  const int64_t deadline = now_ns() + budget_ns;
  for (;;) {
    for (int i = 0; i < 64; ++i) {
      if (pred()) return true;
      KILN_CPU_RELAX();
    }
    if (now_ns() >= deadline) return pred();
  }
}

}  // namespace

struct ThreadPool::Impl {
  explicit Impl(size_t threads) : want(threads) {}

  // The current job (written by the caller before it is published).
  // (atomics, read relaxed: a late worker may read them while the next job is
  // written, and then fails its claim)
  std::atomic<void (*)(void*, size_t)> task{nullptr};
  std::atomic<void*> ctx{nullptr};
  std::atomic<uint32_t> n{0};

  alignas(64) std::atomic<uint64_t> claim{0};  // epoch << 32 | next index
  alignas(64) std::atomic<uint32_t> epoch{0};  // what sleeping workers wait on
  std::atomic<uint32_t> sleepers{0};
  std::atomic<bool> stop{false};
  alignas(64) std::atomic<uint32_t> left{0};   // unfinished indices of the job
  std::atomic<uint32_t> caller_sleeping{0};

  // Adaptivity (the caller's thread only).
  int64_t serial_until = 0;
  int64_t serial_period = kSerialMinNs;
  int64_t window_start = 0, window_tail = 0, window_total = 0;
  std::atomic<size_t> fallbacks{0};

  size_t want;
  std::vector<pthread_t> workers;

  std::once_flag raw_once;
  pthreadpool_t raw = nullptr;

  // Runs indices of job `e` until none is left unclaimed.
  size_t work(uint32_t e) {
    size_t ran = 0;
    uint64_t c = claim.load(std::memory_order_acquire);
    for (;;) {
      if (static_cast<uint32_t>(c >> 32) != e) return ran;
      const uint32_t i = static_cast<uint32_t>(c);
      // this job's n (it cannot end while i is unclaimed); acquire: a new job's n is stored after
      // run() closed the old job's claims, so a thread that sees the new n cannot claim an old index
      if (i >= n.load(std::memory_order_acquire)) return ran;
      void (*const f)(void*, size_t) = task.load(std::memory_order_relaxed);
      void* const x = ctx.load(std::memory_order_relaxed);
      if (!claim.compare_exchange_weak(c, c + 1, std::memory_order_acq_rel, std::memory_order_acquire)) continue;
      f(x, i);
      ++ran;
      // seq_cst, as the caller's store of caller_sleeping and its load of left: no lost wake-up
      if (left.fetch_sub(1, std::memory_order_seq_cst) == 1) {
        if (caller_sleeping.load(std::memory_order_seq_cst) != 0) left.notify_one();
      }
      c = claim.load(std::memory_order_acquire);
    }
  }

  static void* worker_main(void* arg) {
    auto* p = static_cast<Impl*>(arg);
    uint32_t seen = 0;
    for (;;) {
      uint32_t e = p->epoch.load(std::memory_order_acquire);
      if (e == seen && !p->stop.load(std::memory_order_relaxed)) {
        spin_until([&] { return p->epoch.load(std::memory_order_acquire) != seen || p->stop.load(std::memory_order_relaxed); },
                   kWorkerSpinNs);
        e = p->epoch.load(std::memory_order_acquire);
        if (e == seen && !p->stop.load(std::memory_order_relaxed)) {
          p->sleepers.fetch_add(1, std::memory_order_seq_cst);
          if (p->epoch.load(std::memory_order_seq_cst) == seen && !p->stop.load(std::memory_order_seq_cst))
            p->epoch.wait(seen, std::memory_order_seq_cst);
          p->sleepers.fetch_sub(1, std::memory_order_seq_cst);
          continue;
        }
      }
      if (p->stop.load(std::memory_order_acquire)) return nullptr;
      seen = e;
      p->work(e);
    }
  }
};

ThreadPool::ThreadPool(size_t threads) {
  if (threads <= 1) return;
  impl_ = std::make_unique<Impl>(threads);
  for (size_t i = 1; i < threads; ++i) {
    pthread_t t;
    if (pthread_create(&t, nullptr, &Impl::worker_main, impl_.get()) != 0) break;
    impl_->workers.push_back(t);
  }
  if (impl_->workers.empty()) impl_.reset();
}

ThreadPool::~ThreadPool() {
  if (impl_ == nullptr) return;
  impl_->stop.store(true, std::memory_order_seq_cst);
  impl_->epoch.fetch_add(1, std::memory_order_seq_cst);
  impl_->epoch.notify_all();
  for (pthread_t t : impl_->workers) pthread_join(t, nullptr);
  if (impl_->raw != nullptr) pthreadpool_destroy(impl_->raw);
}

size_t ThreadPool::threads() const { return impl_ ? impl_->workers.size() + 1 : 1; }

size_t ThreadPool::serial_fallbacks() const { return impl_ ? impl_->fallbacks.load() : 0; }

pthreadpool_t ThreadPool::raw() const {
  if (impl_ == nullptr) return nullptr;
  std::call_once(impl_->raw_once, [this] { impl_->raw = pthreadpool_create(threads()); });
  return impl_->raw;
}

void ThreadPool::run(size_t n, void (*task)(void*, size_t), void* ctx) const {
  Impl& p = *impl_;
  const int64_t t0 = now_ns();
  if (t0 < p.serial_until || n > UINT32_MAX) {
    for (size_t i = 0; i < n; ++i) task(ctx, i);
    return;
  }
  // Publish: close the previous job's claim word, the job's fields, then the claim word, then
  // the epoch workers watch. Closing first matters: a worker late in the previous job holds its
  // claim word (all claimed: index == old n); had it read the new, larger n while the word still
  // showed the old job, its compare-exchange would succeed, run an index outside the claims and
  // count it against the new job's `left` (which then never reaches 0: the caller hung).
  const uint32_t e = static_cast<uint32_t>(p.claim.load(std::memory_order_relaxed) >> 32) + 1;
  p.claim.store(static_cast<uint64_t>(e) << 32 | UINT32_MAX, std::memory_order_relaxed);
  p.task.store(task, std::memory_order_relaxed);
  p.ctx.store(ctx, std::memory_order_relaxed);
  p.left.store(static_cast<uint32_t>(n), std::memory_order_relaxed);
  p.n.store(static_cast<uint32_t>(n), std::memory_order_release);  // after the close (work() acquires it)
  p.claim.store(static_cast<uint64_t>(e) << 32, std::memory_order_release);
  p.epoch.store(e, std::memory_order_seq_cst);
  if (p.sleepers.load(std::memory_order_seq_cst) != 0) p.epoch.notify_all();

  p.work(e);
  const int64_t t1 = now_ns();
  auto done = [&] { return p.left.load(std::memory_order_acquire) == 0; };
  if (!spin_until(done, kCallerSpinNs)) {
    p.caller_sleeping.store(1, std::memory_order_seq_cst);
    for (uint32_t l; (l = p.left.load(std::memory_order_seq_cst)) != 0;) p.left.wait(l, std::memory_order_seq_cst);
    p.caller_sleeping.store(0, std::memory_order_relaxed);
  }
  const int64_t t2 = now_ns();
  // Long tails mean a worker held an index without running (another process
  // has its core): run alone for a while, twice as long each time it happens
  // again, half as long after a window without it.
  const int64_t tail = t2 - t1;
  if (p.window_total == 0) p.window_start = t0;
  p.window_tail += tail;
  p.window_total += t2 - t0;
  const bool judged = tail > kStallNs || t2 - p.window_start >= kWindowNs;
  if (!judged) return;
  if (tail > kStallNs || 4 * p.window_tail > p.window_total) {
    p.serial_until = t2 + p.serial_period;
    p.serial_period = std::min(2 * p.serial_period, kSerialMaxNs);
    p.fallbacks.fetch_add(1, std::memory_order_relaxed);
  } else {
    p.serial_period = std::max(p.serial_period / 2, kSerialMinNs);
  }
  p.window_tail = p.window_total = 0;
}

}  // namespace kiln::cpu
