// kiln's one thread pool: a thin owner of a pthreadpool (Debian's
// libpthreadpool, the pool XNNPACK takes), for kiln's own parallel loops and,
// through raw(), for XNNPACK runtimes.
#pragma once

#include <cstddef>

typedef struct pthreadpool* pthreadpool_t;  // as <pthreadpool.h> declares it

namespace kiln::cpu {

class ThreadPool {
 public:
  // `threads` workers including the caller; 0 or 1: no pool, every loop runs on
  // the calling thread. If the pool cannot be created, likewise (threads() == 1).
  explicit ThreadPool(size_t threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  size_t threads() const { return threads_; }

  // f(i) for every i < n, split over the pool's threads; returns when all are
  // done. f must not throw or call parallel_for on this pool.
  template <class F>
  void parallel_for(size_t n, const F& f) const {
    if (pool_ == nullptr || n <= 1) {
      for (size_t i = 0; i < n; ++i) f(i);
      return;
    }
    run(n, [](void* ctx, size_t i) { (*static_cast<const F*>(ctx))(i); }, const_cast<F*>(&f));
  }

  // The pthreadpool, for XNNPACK (xnn_create_runtime_v2); null when single-threaded.
  pthreadpool_t raw() const { return pool_; }

 private:
  void run(size_t n, void (*task)(void*, size_t), void* ctx) const;

  pthreadpool_t pool_ = nullptr;
  size_t threads_ = 1;
};

}  // namespace kiln::cpu
