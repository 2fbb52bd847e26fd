// Names of enumerators, for enums numbered 0, 1, 2, ... in declaration order.
#pragma once

#include <array>
#include <cstddef>
#include <string_view>

namespace kiln {

// names[i] names the enumerator of value i; `Last` is the enum's last
// enumerator, so a table that misses one fails to compile.
template <auto Last, size_t N>
constexpr std::string_view enum_name(decltype(Last) e, const std::array<std::string_view, N>& names) {
  static_assert(N == static_cast<size_t>(Last) + 1, "one name per enumerator");
  auto i = static_cast<size_t>(e);
  return i < N ? names[i] : "?";
}

}  // namespace kiln
