// The executor's kernel table (kiln/runtime/kernel_registry.h): a fixed array
// of the tables kernel libraries registered, searched at method load.
#include "kiln/runtime/kernel_registry.h"

#include <array>

namespace kiln::rt {
namespace {

struct Tables {
  std::array<std::span<const KernelEntry>, 16> tables{};
  size_t count = 0;
};

// Constructed on first use, so kernel libraries may register from their own
// static initializers in any order.
Tables& tables() {
  static Tables t;
  return t;
}

}  // namespace

bool register_kernels(std::span<const KernelEntry> kernels) {
  Tables& t = tables();
  if (t.count == t.tables.size()) return false;
  t.tables[t.count++] = kernels;
  return true;
}

KernelFn lookup_kernel(std::string_view name, std::string_view overload) {
  const Tables& t = tables();
  for (size_t i = 0; i < t.count; ++i)
    for (const KernelEntry& k : t.tables[i])
      if (name == k.name && overload == k.overload) return k.fn;
  return nullptr;
}

size_t registered_kernel_count() {
  const Tables& t = tables();
  size_t n = 0;
  for (size_t i = 0; i < t.count; ++i) n += t.tables[i].size();
  return n;
}

}  // namespace kiln::rt
