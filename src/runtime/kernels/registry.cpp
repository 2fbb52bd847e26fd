#include "kernel_tables.h"

#include <array>
#include <string_view>
#include <vector>

namespace kiln::rt {
namespace {

// Built once, on first lookup (load time, not execute time).
const std::vector<KernelEntry>& all_kernels() {
  static const std::vector<KernelEntry> table = [] {
    std::vector<KernelEntry> t;
    for (auto part : {kernels::elementwise_kernels(), kernels::reduction_kernels(), kernels::linear_algebra_kernels(),
                      kernels::data_movement_kernels()})
      t.insert(t.end(), part.begin(), part.end());
    return t;
  }();
  return table;
}

}  // namespace

KernelFn find_kernel(std::string_view name, std::string_view overload) {
  for (const auto& k : all_kernels())
    if (name == k.name && overload == k.overload) return k.fn;
  return nullptr;
}

std::span<const KernelEntry> registered_kernels() { return all_kernels(); }

}  // namespace kiln::rt
