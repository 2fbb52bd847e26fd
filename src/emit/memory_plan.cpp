#include "kiln/emit/memory_plan.h"

#include <algorithm>
#include <numeric>

namespace kiln::emit {

MemoryPlan plan_memory(const std::vector<StorageRequest>& requests, uint64_t alignment) {
  auto align = [&](uint64_t x) { return (x + alignment - 1) / alignment * alignment; };
  MemoryPlan plan;
  plan.offsets.assign(requests.size(), 0);
  std::vector<size_t> order(requests.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return requests[a].bytes > requests[b].bytes; });
  struct Placed {
    uint64_t begin, end;
    int32_t first, last;
  };
  std::vector<Placed> placed;
  std::vector<std::pair<uint64_t, uint64_t>> busy;  // reused per request
  for (size_t idx : order) {
    const auto& r = requests[idx];
    plan.naive_bytes += align(r.bytes);
    busy.clear();
    for (const auto& p : placed)
      if (p.first <= r.last && r.first <= p.last) busy.emplace_back(p.begin, p.end);
    std::sort(busy.begin(), busy.end());
    uint64_t offset = 0;
    for (const auto& [b, e] : busy) {
      if (offset + r.bytes <= b) break;  // fits in the gap before this block
      offset = std::max(offset, align(e));
    }
    plan.offsets[idx] = offset;
    placed.push_back({offset, offset + std::max<uint64_t>(r.bytes, 1), r.first, r.last});
    plan.total_bytes = std::max(plan.total_bytes, align(offset + r.bytes));
  }
  return plan;
}

}  // namespace kiln::emit
