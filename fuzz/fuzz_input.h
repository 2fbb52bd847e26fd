// Shared by kiln's libFuzzer targets (fuzz/*.cpp, built by scripts/fuzz into build-fuzz/).
// kiln's readers take paths, so each input is written to an in-memory file (memfd) and
// read back through /proc/self/fd/N: the readers run exactly as on a file on disk.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

namespace kiln::fuzz {

// The path of a memfd holding exactly `data`. `slot` picks one of a few files (a target that
// needs two files at once uses two slots); each slot's memfd is reused from input to input.
inline const char* write_input(const void* data, size_t size, int slot = 0) {
  static int fds[4] = {-1, -1, -1, -1};
  static char paths[4][64];
  if (slot < 0 || slot >= 4) std::abort();
  if (fds[slot] < 0) {
    fds[slot] = memfd_create("kiln-fuzz", MFD_CLOEXEC);
    if (fds[slot] < 0) {
      std::perror("memfd_create");
      std::abort();
    }
    std::snprintf(paths[slot], sizeof paths[slot], "/proc/self/fd/%d", fds[slot]);
  }
  if (ftruncate(fds[slot], 0) != 0) std::abort();
  const auto* bytes = static_cast<const uint8_t*>(data);
  for (size_t done = 0; done < size;) {
    ssize_t n = pwrite(fds[slot], bytes + done, size - done, static_cast<off_t>(done));
    if (n <= 0) std::abort();
    done += static_cast<size_t>(n);
  }
  return paths[slot];
}

// `data` cut at each NUL byte (the targets whose input is several text files in one).
inline std::vector<std::string_view> split_at_nul(const uint8_t* data, size_t size) {
  std::vector<std::string_view> parts;
  std::string_view all(reinterpret_cast<const char*>(data), size);
  size_t at = 0;
  while (true) {
    size_t nul = all.find('\0', at);
    parts.push_back(all.substr(at, nul == std::string_view::npos ? std::string_view::npos : nul - at));
    if (nul == std::string_view::npos) break;
    at = nul + 1;
  }
  return parts;
}

}  // namespace kiln::fuzz
