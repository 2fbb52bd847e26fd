// libFuzzer target: arbitrary bytes as a .npy (kiln run's inputs) through read_npy
// (src/io/npy.cpp). A kiln::Error is a clean refusal; any other exception, a crash, a
// sanitizer report, a leak or a hang is a finding. An array that reads must hold exactly
// the bytes its dtype and shape say.
#include "fuzz_input.h"
#include "kiln/core/error.h"
#include "kiln/io/npy.h"

#include <cstddef>
#include <cstdint>
#include <cstdlib>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const char* path = kiln::fuzz::write_input(data, size);
  try {
    kiln::io::NpyArray a = kiln::io::read_npy(path);
    uint64_t numel = 1;
    for (int64_t d : a.shape) {
      if (d < 0) std::abort();
      numel *= static_cast<uint64_t>(d);
    }
    if (numel * kiln::element_size(a.dtype) != a.data.size()) std::abort();
  } catch (const kiln::Error&) {
  }
  return 0;
}
