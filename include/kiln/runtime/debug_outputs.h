// Intermediate outputs of a run, as ExecuTorch's runtime logs them into an
// ETDump's debug buffer: after each instruction, its output tensors (a kernel
// call's out arguments; a delegate call's arguments, inputs then outputs, as
// ExecuTorch logs them), and, inside a delegate whose backend logs its nodes
// (rt::Backend::enable_debug_outputs: kiln's XNNPACK backend), each step's
// output under the debug handle of the payload node that computes it
// (delegate_node), during the call, before the call's own entries.
//
//   rt::DebugOutputLog log(64 << 20, 1 << 16);   // bytes and entries: fixed, allocated here
//   method.enable_debug_outputs(&log);          // nullptr turns it off (the default)
//   method.execute();                           // copies each output into the log, allocates nothing
//   for (const rt::DebugOutput& e : log.entries()) ... log.data() + e.offset ...
//
// Bounded: a tensor that does not fit in what is left is not logged and the log
// says it overflowed. Off (no log), execute() tests one pointer per instruction.
#pragma once

#include "kiln/core/dtype.h"
#include "kiln/runtime/tensor.h"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

namespace kiln::rt {

struct DebugOutput {
  uint32_t instruction = 0;
  int32_t delegate_node = -1;  // -1: an instruction's own tensor; else the delegate's node (XNode.debug_handle)
  ScalarType dtype = ScalarType::Float;
  int32_t dim = 0;
  int64_t sizes[kMaxDims] = {};
  uint64_t offset = 0;         // into data(), 64-byte aligned
  uint64_t nbytes = 0;
  // A delegate's node whose output later nodes only view (reshapes sharing its bytes, which run no step):
  // the last such view's node and sizes (-1: none), so a reader can name the tensor by the view instead.
  static constexpr int kMaxViewDims = 8;  // (XNNPACK's values have at most 6)
  int32_t view_node = -1;
  int32_t view_dim = 0;
  int64_t view_sizes[kMaxViewDims] = {};
};

class DebugOutputLog {
 public:
  // Holds at most `bytes` of tensor data and `max_entries` tensors.
  DebugOutputLog(size_t bytes, size_t max_entries);
  DebugOutputLog(const DebugOutputLog&) = delete;
  DebugOutputLog& operator=(const DebugOutputLog&) = delete;

  // Forgets what was logged (the next run starts from an empty log).
  void clear() {
    used_ = 0;
    count_ = 0;
    overflowed_ = false;
  }
  // Copies `t` (row-major contiguous) into the log; false (and overflowed()) when it does not fit.
  bool log(uint32_t instruction, int32_t delegate_node, const Tensor& t);
  // The same for row-major `data` of `sizes` (a delegate's own tensor).
  bool log(uint32_t instruction, int32_t delegate_node, ScalarType dtype, std::span<const int64_t> sizes,
           const void* data, int32_t view_node = -1, std::span<const int64_t> view_sizes = {});
  // The instruction running now (Method::execute sets it before a delegate call): what a delegate
  // logs inside the call belongs to it.
  void set_instruction(uint32_t instruction) { instruction_ = instruction; }
  uint32_t instruction() const { return instruction_; }

  std::span<const DebugOutput> entries() const { return {entries_.get(), count_}; }
  const std::byte* data() const { return data_.get(); }
  size_t bytes_used() const { return used_; }
  bool overflowed() const { return overflowed_; }

 private:
  DebugOutput* reserve(uint32_t instruction, int32_t node, ScalarType dtype, std::span<const int64_t> sizes,
                       uint64_t nbytes);
  std::unique_ptr<std::byte[]> data_;
  std::unique_ptr<DebugOutput[]> entries_;
  size_t capacity_ = 0, max_entries_ = 0, used_ = 0, count_ = 0;
  uint32_t instruction_ = 0;
  bool overflowed_ = false;
};

}  // namespace kiln::rt
