// kiln's one thread pool, for kiln's own parallel loops; raw() also hands
// XNNPACK runtimes a pthreadpool (Debian's libpthreadpool), made on first use.
//
// Why kiln's loops do not run on pthreadpool: on a 2-core machine with another
// process busy on one core, a pool that splits a loop into fixed per-thread
// ranges and spins while it waits stalls every loop for a scheduler time slice
// (GPT-2 ran 1.5x slower at 2 threads than at 1). This pool
//   - hands out indices one at a time (a thread that is descheduled holds at
//     most the one index it is running; the caller does the rest);
//   - spins only briefly (tens of microseconds), then sleeps on a futex, so an
//     idle thread never keeps a core from the process that needs it;
//   - notices when the caller keeps waiting for a worker that does not run
//     (over a few milliseconds of loops, the caller's waits after its own share
//     are more than a quarter of the time, or one wait exceeds 1 ms) and then
//     runs loops on the calling thread alone for a while, probing again with a
//     period that doubles while the contention lasts (10 ms .. 0.5 s).
#pragma once

#include <cstddef>
#include <memory>

typedef struct pthreadpool* pthreadpool_t;  // as <pthreadpool.h> declares it

namespace kiln::cpu {

class ThreadPool {
 public:
  // `threads` workers including the caller; 0 or 1: no pool, every loop runs on
  // the calling thread. If a thread cannot be started, fewer (threads() says).
  explicit ThreadPool(size_t threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  size_t threads() const;

  // f(i) for every i < n, split over the pool's threads; returns when all are
  // done. f must not throw or call parallel_for on this pool. One caller at a
  // time (a pool serves one method's execution).
  template <class F>
  void parallel_for(size_t n, const F& f) const {
    if (impl_ == nullptr || n <= 1) {
      for (size_t i = 0; i < n; ++i) f(i);
      return;
    }
    run(n, [](void* ctx, size_t i) { (*static_cast<const F*>(ctx))(i); }, const_cast<F*>(&f));
  }

  // A pthreadpool of the same size for XNNPACK (xnn_create_runtime_v2), made
  // on the first call; null when single-threaded.
  pthreadpool_t raw() const;

  // How many times the pool saw a stalled worker and ran loops on the caller alone
  // for a while (tests/cpu/threadpool_test.cpp reads it; no CLI reports it yet: on a
  // quiet 2-core VM, a 2-thread `kiln bench-llm` of Gemma 4 E2B saw ~35 in 30 s,
  // 1.4% of the run serial, each after a worker stalled 1-3.5 ms).
  size_t serial_fallbacks() const;

 private:
  struct Impl;
  void run(size_t n, void (*task)(void*, size_t), void* ctx) const;

  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln::cpu
