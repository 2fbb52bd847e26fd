#include "kiln/cpu/threadpool.h"

#include <pthreadpool.h>

namespace kiln::cpu {

ThreadPool::ThreadPool(size_t threads) {
  if (threads > 1) pool_ = pthreadpool_create(threads);
  threads_ = pool_ != nullptr ? pthreadpool_get_threads_count(pool_) : 1;
}

ThreadPool::~ThreadPool() {
  if (pool_ != nullptr) pthreadpool_destroy(pool_);
}

void ThreadPool::run(size_t n, void (*task)(void*, size_t), void* ctx) const {
  pthreadpool_parallelize_1d(pool_, task, ctx, n, 0);
}

}  // namespace kiln::cpu
