// libFuzzer target: arbitrary bytes as a model_spec.json through read_model_spec
// (src/pt2/model_spec.cpp). A kiln::Error is a clean refusal; any other exception, a
// crash, a sanitizer report, a leak or a hang is a finding.
#include "fuzz_input.h"
#include "kiln/core/error.h"
#include "kiln/pt2/model_spec.h"

#include <cstddef>
#include <cstdint>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const char* path = kiln::fuzz::write_input(data, size);
  try {
    kiln::pt2::ModelSpec spec = kiln::pt2::read_model_spec(path);
    (void)spec;
  } catch (const kiln::Error&) {
  }
  return 0;
}
