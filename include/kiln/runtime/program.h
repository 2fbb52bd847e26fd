// kiln's runtime API: load a .pte, prepare a method, set inputs, execute,
// read outputs.
//
//   rt::ErrorMessage err;
//   auto program = rt::Program::load("model.pte", &err);      // mmap + verify
//   auto method = program->load_method("forward", &err);      // values, memory, kernels
//   (or load_method("forward", MethodOptions{...}, &err): threads, engine, profiling per method)
//   method->set_input(0, ids_data, ids_bytes, &err);           // copies into planned memory
//   method->execute(&err);                                     // allocates nothing
//   const rt::Tensor& logits = method->output(0);
//
// Kernels come from the executor's registry (kiln/runtime/kernel_registry.h),
// which kernel libraries fill at startup; delegates from the backend registry.
// For a one-call API over all of this, see kiln/runtime/module.h.
//
// Everything a method needs (planned buffers, value table, kernel and
// argument tables, backend handles) is allocated by load_method; execute()
// only runs the instructions. No exceptions: failures are a Status plus a
// message in the caller's ErrorMessage.
#pragma once

#include "kiln/runtime/backend.h"
#include "kiln/runtime/debug_outputs.h"
#include "kiln/runtime/evalue.h"
#include "kiln/runtime/kernel.h"
#include "kiln/runtime/pte_file.h"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace kiln::rt {

class Program;
class MethodLoader;  // program.cpp: Program::load_method's steps

// Per-instruction timing, filled when profiling is enabled.
struct InstructionProfile {
  uint64_t calls = 0;
  uint64_t total_ns = 0;
  uint64_t last_start_ns = 0;  // the last run's start and end (steady clock, ns since its epoch)
  uint64_t last_end_ns = 0;
};

// How a method is prepared: what its delegates may use, whether it profiles.
struct MethodOptions {
  BackendOptions backend;  // handed to every delegate's backend at init
  bool profiling = false;  // as enable_profiling(true) right after loading
};

class Method {
 public:
  Method(Method&&) noexcept;
  Method& operator=(Method&&) noexcept;
  ~Method();

  const char* name() const { return name_.c_str(); }
  size_t num_inputs() const { return inputs_.size(); }
  size_t num_outputs() const { return outputs_.size(); }
  // The input slot's tensor (dtype, shape; data is the planned buffer or null).
  const Tensor& input(size_t i) const { return *values_[static_cast<size_t>(inputs_[i])].scalar.t; }
  // Output i's tensor; only when output_is_tensor(i) (constant methods return scalars: output_value).
  const Tensor& output(size_t i) const { return *values_[static_cast<size_t>(outputs_[i])].scalar.t; }
  bool output_is_tensor(size_t i) const { return values_[static_cast<size_t>(outputs_[i])].is_tensor(); }
  // Output i as a value of any kind (constant methods return Int, Bool, Double).
  const EValue& output_value(size_t i) const { return values_[static_cast<size_t>(outputs_[i])]; }

  // Copies `bytes` of row-major data into input i (its planned memory), or,
  // for an input the program did not plan, points the input at `data`, which
  // must stay valid through execute(). InvalidArgument if the size differs.
  Status set_input(size_t i, const void* data, size_t bytes, ErrorMessage* error = nullptr);
  // As above, for an input of another shape: a DYNAMIC_BOUND input takes any
  // shape of its rank within its planned (upper-bound) size; a static input
  // only its own. Kernels then compute every output's shape from it.
  Status set_input(size_t i, const void* data, size_t bytes, std::span<const int64_t> shape,
                   ErrorMessage* error = nullptr);
  // As set_input, but without a copy where that is safe: input i is pointed at `data` (the caller's
  // memory, which must stay valid through execute(); a program that mutates the input writes it
  // there) when the program did not plan it, or when no other tensor of the method lies in its
  // planned memory (kiln's programs keep each input's memory to themselves for the whole call:
  // no view, in-place result or later value shares it). Otherwise it copies, as set_input.
  // *shared says which happened. unshare_inputs() points the inputs back at their planned memory.
  Status share_input(size_t i, void* data, size_t bytes, std::span<const int64_t> shape, bool* shared,
                     ErrorMessage* error = nullptr);
  void unshare_inputs();
  // True when input i is DYNAMIC_BOUND (its shape may change per call).
  bool input_is_dynamic(size_t i) const { return input_dynamic_[i]; }

  // Runs every instruction once.
  Status execute(ErrorMessage* error = nullptr);

  // Number of instructions and, for profiling, a label for each ("aten::mm.out", "XnnpackBackend").
  size_t num_instructions() const { return instructions_.size(); }
  const char* instruction_label(size_t i) const;
  // The delegate instruction i calls, or -1 if it is not a delegate call.
  int instruction_delegate(size_t i) const {
    return instructions_[i].kind == Instruction::Kind::Delegate ? instructions_[i].op_or_delegate : -1;
  }
  // Profiling times every instruction, and inside delegates whose backend has a profile, every step.
  void enable_profiling(bool on);
  std::span<const InstructionProfile> profile() const { return profile_; }
  // Delegates (index = a Delegate instruction's op_or_delegate) and their own profiles.
  size_t num_delegates() const { return delegates_.size(); }
  const char* delegate_label(size_t d) const { return delegate_labels_[d].c_str(); }
  // Fills up to out.size() entries of delegate d's profile; returns how many it has (0: none).
  size_t delegate_profile(size_t d, std::span<BackendProfileEntry> out) const;
  // Fills up to out.size() of delegate d's steps (kiln/runtime/backend.h); returns how many it has (0: none).
  size_t delegate_steps(size_t d, std::span<BackendStepProfile> out) const;

  // Intermediate outputs (kiln/runtime/debug_outputs.h): while `log` is set, every instruction's
  // outputs are copied into it (a delegate call: all its arguments, as ExecuTorch's runtime logs them),
  // and, in delegates whose backend logs its own nodes (Backend::enable_debug_outputs), each step's
  // output during the call. The caller clears it between runs; nullptr turns logging off. Allocates
  // here, not in execute().
  void enable_debug_outputs(DebugOutputLog* log);

  // Bytes of planned memory this method allocated.
  uint64_t planned_bytes() const { return planned_bytes_; }

 private:
  friend class Program;
  friend class MethodLoader;
  Method() = default;

  struct Instruction {
    enum class Kind : uint8_t { Kernel, Delegate, Move, JumpFalse, Free } kind = Kind::Kernel;
    KernelFn fn = nullptr;
    uint32_t args_begin = 0, args_count = 0;  // into arg_ptrs_
    int32_t op_or_delegate = 0;               // operator index or delegate index
    int32_t a = 0, b = 0;                     // move from/to, jump cond/destination, free value
    uint32_t refresh_begin = 0, refresh_count = 0;  // int_refresh_ entries to apply after it runs
  };

  std::string name_;
  std::vector<EValue> values_;
  std::vector<Tensor> tensors_;
  std::vector<int64_t> int_arena_;
  std::vector<double> double_arena_;
  std::unique_ptr<bool[]> bool_arena_;
  std::vector<Tensor*> tensor_ptr_arena_;
  std::vector<EValue*> arg_ptrs_;
  std::vector<Instruction> instructions_;
  std::vector<std::string> operator_labels_;
  std::vector<std::string> delegate_labels_;
  std::vector<int32_t> inputs_, outputs_;
  std::vector<bool> input_planned_;
  std::vector<bool> input_dynamic_;
  std::vector<void*> input_home_;      // share_input: each input's planned memory (null: unplanned)
  std::vector<int8_t> input_private_;  // share_input: -1 not yet known, 1 no other tensor in its memory, 0 shared
  // Int list items computed at run time (sym_size, executorch_prim): after the
  // instruction that writes the Int value, its copy in int_arena_ is updated.
  std::vector<std::pair<uint32_t, int32_t>> int_refresh_;  // (int_arena_ slot, value index)
  std::vector<std::byte*> buffers_;  // planned memory, index = memory_id
  uint64_t planned_bytes_ = 0;
  std::vector<DelegateHandle> delegates_;
  std::vector<InstructionProfile> profile_;
  bool profiling_ = false;
  DebugOutputLog* debug_log_ = nullptr;
  std::vector<uint8_t> debug_outs_;  // per kernel instruction: trailing out arguments to log (0: the last one)
  void log_debug_outputs(size_t pc, const Instruction& in, std::span<EValue*> args);
};

class Program {
 public:
  static Result<Program> load(const char* path, ErrorMessage* error = nullptr);

  // Prepares execution plan `name`: parses and checks its values, allocates
  // its planned memory, resolves every operator to a kernel and initializes
  // every delegate. NotFound names a missing kernel or backend.
  Result<Method> load_method(const char* name = "forward", ErrorMessage* error = nullptr) const;
  // As above, with per-method options (threads, backend engine, profiling).
  Result<Method> load_method(const char* name, const MethodOptions& options, ErrorMessage* error = nullptr) const;

  const PteFile& file() const { return file_; }

 private:
  explicit Program(PteFile f) : file_(std::move(f)) {}
  PteFile file_;
};

// Whether memory that is streamed every call (large planned buffers such as a KV cache; the
// XNNPACK backend's weight memory) is advised into transparent huge pages: true unless
// KILN_HUGE_PAGES=0 (then fp32 weights are also read in place from the file).
bool huge_pages_enabled();

}  // namespace kiln::rt
