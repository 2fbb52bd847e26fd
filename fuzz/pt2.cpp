// libFuzzer target: arbitrary bytes as a .pt2 through kiln's whole .pt2 reader -- the zip
// container (src/pt2/archive.cpp: sizes, compression, names, zip64), the serialized graph and
// the weight configs (src/pt2/pt2_reader.cpp) -- then every constant's bytes read back.
// A kiln::Error is a clean refusal; any other exception, a crash, a sanitizer report, a
// leak or a hang is a finding.
#include "fuzz_input.h"
#include "kiln/core/error.h"
#include "kiln/pt2/pt2_reader.h"

#include <cstddef>
#include <cstdint>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const char* path = kiln::fuzz::write_input(data, size);
  try {
    kiln::pt2::ExportedProgram ep = kiln::pt2::read_pt2(path);
    uint64_t sum = 0;
    for (const auto& c : ep.constants) {
      ep.stream_constant(c, [&](std::span<const std::byte> chunk) { sum += chunk.size(); });
      sum += ep.content_crc32(c);
    }
    (void)sum;
  } catch (const kiln::Error&) {
  }
  return 0;
}
