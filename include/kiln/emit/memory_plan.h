// MemoryPlan: offsets for every planned (non-constant) tensor storage in one
// arena, reusing memory between storages whose lifetimes do not overlap.
#pragma once

#include <cstdint>
#include <vector>

namespace kiln::emit {

struct StorageRequest {
  uint64_t bytes = 0;
  int32_t first = 0;  // index of the first instruction that writes it (-1: before the first)
  int32_t last = 0;   // index of the last instruction that reads it (inclusive)
};

struct MemoryPlan {
  std::vector<uint64_t> offsets;  // one per request
  uint64_t total_bytes = 0;       // arena size
  uint64_t naive_bytes = 0;       // sum of all requests (no reuse), aligned
};

// Greedy by size: the largest storages are placed first, each at the lowest
// aligned offset that overlaps no placed storage alive at the same time.
MemoryPlan plan_memory(const std::vector<StorageRequest>& requests, uint64_t alignment = 64);

}  // namespace kiln::emit
