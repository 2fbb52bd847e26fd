// The method `kiln bench` and `kiln profile` time, and the inputs they run it on: the
// --input .npy files, each checked against the method's input, or zeros of the planned
// shapes (valid token ids for language models).
#pragma once

#include "kiln/runtime/program.h"

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace kiln::cli {

struct TimedRunOptions;  // commands.h

// The program a timed run names (o.file); throws kiln::Error "FILE: why" if it does not load.
rt::Result<rt::Program> load_program(const TimedRunOptions& o);
// Its method o.method with o's threads and engine (profiling_detail: XNNPACK's nodes one
// subgraph each, so that each is timed); throws kiln::Error "FILE: method 'M': why".
rt::Result<rt::Method> load_method(const rt::Program& program, const TimedRunOptions& o, bool profiling_detail);

struct MethodInputs {
  std::vector<std::vector<std::byte>> data;
  std::vector<std::vector<int64_t>> shapes;  // of the --input files (empty: the planned shapes)
};

// Throws kiln::Error (naming `program` and the file) when the files do not fit the method.
MethodInputs method_inputs(const rt::Method& m, const std::vector<std::string>& files, const std::string& program);

// Sets every input of `m`; throws kiln::Error naming the input that is refused.
void set_method_inputs(rt::Method& m, const MethodInputs& in);

}  // namespace kiln::cli
