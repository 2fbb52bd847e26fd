// kiln::Module: load a .pte and run one of its methods in a few lines, in the
// spirit of ExecuTorch's extension/module.
//
//   kiln::Module m("gpt2_xnnpack.pte", {.threads = 4});
//   int64_t shape[] = {1, 16};
//   kiln::TensorView ids{kiln::ScalarType::Long, shape, ids_data};
//   auto out = m.forward({&ids, 1});
//   if (!out.ok()) { std::fprintf(stderr, "%s\n", m.error_message()); return 1; }
//   const kiln::TensorView& logits = out.value()[0];   // valid until the next forward()
//
// The program is mapped and the method prepared on first use (or by load()),
// with the options below: they apply to this module's method, not to the
// process. No exceptions (the runtime is built without them): failures are a
// Status, and error_message() says what went wrong.
//
// The Module brings everything kiln's runtime has: the executor, the portable
// kernels and the XNNPACK backend (registered on first load).
#pragma once

#include "kiln/core/dtype.h"
#include "kiln/runtime/program.h"
#include "kiln/runtime/status.h"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace kiln {

using rt::Result;
using rt::Status;

// A tensor as a caller hands it over or gets it back: dtype, shape and
// row-major contiguous data. A view: it owns nothing.
struct TensorView {
  ScalarType dtype = ScalarType::Float;
  std::span<const int64_t> shape;
  const void* data = nullptr;

  int64_t numel() const {
    int64_t n = 1;
    for (int64_t s : shape) n *= s;
    return n;
  }
  size_t nbytes() const { return static_cast<size_t>(numel()) * static_cast<size_t>(element_size(dtype)); }
  template <typename T>
  const T* data_as() const { return static_cast<const T*>(data); }
};

struct ModuleOptions {
  std::string method = "forward";  // the execution plan forward() runs
  size_t threads = 1;              // delegates' parallelism (the XNNPACK backend's thread pool)
  std::string engine = "kiln";     // XNNPACK delegates: "kiln" or "xnnpack" (kiln/backends/xnnpack/runtime.h)
  bool profiling = false;          // time every instruction (method().profile())
};

class Module {
 public:
  explicit Module(std::string path, ModuleOptions options = {});
  Module(Module&&) noexcept;
  Module& operator=(Module&&) noexcept;
  ~Module();

  // Maps and verifies the program, prepares the method. Idempotent; forward() calls it.
  Status load();
  bool is_loaded() const;

  // Copies `inputs` (one per method input, dtypes and shapes as the program
  // declares them) into the method, runs it, and returns views of its outputs,
  // valid until the next forward() or until the Module goes away.
  Result<std::vector<TensorView>> forward(std::span<const TensorView> inputs);

  // Inputs the method expects (after a successful load()).
  size_t num_inputs() const;
  Result<TensorView> input_meta(size_t i) const;  // dtype and shape; data is null

  // The prepared method, for what the Module does not cover (profiles, labels).
  // Only after a successful load().
  rt::Method& method();

  // The last failure's message ("" if none).
  const char* error_message() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln
