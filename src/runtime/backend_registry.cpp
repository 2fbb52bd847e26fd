#include "kiln/runtime/backend.h"

#include <array>

namespace kiln::rt {
namespace {

// A fixed table: registration happens at startup, lookups at method load.
std::array<const Backend*, 8> g_backends{};

}  // namespace

const Backend* find_backend(std::string_view id) {
  for (const Backend* b : g_backends)
    if (b != nullptr && id == b->id) return b;
  return nullptr;
}

bool register_backend(const Backend* backend) {
  if (backend == nullptr || find_backend(backend->id) != nullptr) return false;
  for (auto& slot : g_backends)
    if (slot == nullptr) {
      slot = backend;
      return true;
    }
  return false;
}

}  // namespace kiln::rt
