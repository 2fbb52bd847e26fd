// The method `kiln bench` and `kiln profile` time and its inputs (method_inputs.h).
#include "method_inputs.h"

#include "commands.h"

#include "kiln/core/error.h"
#include "kiln/io/npy.h"

#include <fmt/format.h>

namespace kiln::cli {

rt::Result<rt::Program> load_program(const TimedRunOptions& o) {
  rt::ErrorMessage err;
  auto program = rt::Program::load(o.file.c_str(), &err);
  if (!program.ok()) fail("{}: {}", o.file, err.c_str());
  return program;
}

rt::Result<rt::Method> load_method(const rt::Program& program, const TimedRunOptions& o, bool profiling_detail) {
  rt::ErrorMessage err;
  rt::MethodOptions mo;
  mo.backend.threads = static_cast<size_t>(o.threads);
  mo.backend.engine = o.engine.c_str();
  mo.backend.profiling_detail = profiling_detail;
  auto method = program.load_method(o.method.c_str(), mo, &err);
  if (!method.ok()) fail("{}: method '{}': {}", o.file, o.method, err.c_str());
  return method;
}

MethodInputs method_inputs(const rt::Method& m, const std::vector<std::string>& files, const std::string& program) {
  MethodInputs in;
  check(files.empty() || files.size() == m.num_inputs(), "{}: {} --input given for {} input(s)", program,
        files.size(), m.num_inputs());
  for (size_t i = 0; i < m.num_inputs(); ++i) {
    if (files.empty()) {
      in.data.emplace_back(m.input(i).nbytes());
    } else {
      io::NpyArray a = io::read_npy(files[i]);
      io::float_to_bfloat16(a, m.input(i).dtype);  // NumPy has no bfloat16: a float32 file, rounded as torch rounds
      check(a.dtype == m.input(i).dtype, "--input {}: dtype {} where input {} takes {}", files[i],
            dtype_name(a.dtype), i, dtype_name(m.input(i).dtype));
      // A DYNAMIC_BOUND input takes any shape within its bounds (set_input checks them).
      check(m.input(i).same_shape(a.shape) || m.input_is_dynamic(i), "--input {}: shape [{}] where input {} takes [{}]",
            files[i], fmt::join(a.shape, ", "), i, fmt::join(m.input(i).shape(), ", "));
      in.shapes.push_back(a.shape);
      in.data.push_back(std::move(a.data));
    }
  }
  return in;
}

void set_method_inputs(rt::Method& m, const MethodInputs& in) {
  rt::ErrorMessage err;
  for (size_t i = 0; i < in.data.size(); ++i)
    if ((in.shapes.empty() ? m.set_input(i, in.data[i].data(), in.data[i].size(), &err)
                           : m.set_input(i, in.data[i].data(), in.data[i].size(), in.shapes[i], &err)) !=
        rt::Status::Ok)
      fail("input {}: {}", i, err.c_str());
}

}  // namespace kiln::cli
