// The executor's kernel table (kiln/runtime/kernel_registry.h): a fixed array
// of the libraries registered, searched at method load.
#include "kiln/runtime/kernel_registry.h"

#include <array>

namespace kiln::rt {
namespace {

struct Libraries {
  std::array<const KernelLibrary*, 16> items{};
  size_t count = 0;
};

// Constructed on first use, so kernel libraries may register from their own
// static initializers in any order.
Libraries& libraries() {
  static Libraries l;
  return l;
}

}  // namespace

bool register_kernel_library(const KernelLibrary* library) {
  Libraries& l = libraries();
  if (library == nullptr || library->find == nullptr || l.count == l.items.size()) return false;
  l.items[l.count++] = library;
  return true;
}

KernelFn lookup_kernel(std::string_view name, std::string_view overload) {
  const Libraries& l = libraries();
  for (size_t i = 0; i < l.count; ++i)
    if (KernelFn fn = l.items[i]->find(name, overload)) return fn;
  return nullptr;
}

size_t registered_kernel_count() {
  const Libraries& l = libraries();
  size_t n = 0;
  for (size_t i = 0; i < l.count; ++i) n += l.items[i]->count ? l.items[i]->count() : 0;
  return n;
}

}  // namespace kiln::rt
