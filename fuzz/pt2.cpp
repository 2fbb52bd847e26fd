// libFuzzer target: arbitrary bytes as a .pt2 through kiln's whole .pt2 reader -- the zip
// container (src/pt2/archive.cpp: sizes, compression, names, zip64), the serialized graph and
// the weight configs (src/pt2/pt2_reader.cpp) -- then every constant's bytes read back, and for a
// bfloat16 / float16 program read again widened to float32 (pt2_constants.h).
// A kiln::Error is a clean refusal; any other exception, a crash, a sanitizer report, a
// leak or a hang is a finding.
#include "fuzz_input.h"
#include "kiln/core/error.h"
#include "kiln/pt2/pt2_reader.h"
#include "pt2_constants.h"

#include <cstddef>
#include <cstdint>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const char* path = kiln::fuzz::write_input(data, size);
  try {
    kiln::pt2::ExportedProgram ep = kiln::pt2::read_pt2(path);
    kiln::fuzz::read_every_constant(ep);
  } catch (const kiln::Error&) {
  }
  return 0;
}
