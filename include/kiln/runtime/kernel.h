// Kernels: the out-variant operator implementations the executor calls, and
// the registry that finds them by operator name and overload.
//
// Calling convention (the one ExecuTorch programs encode): a KernelCall's args
// are the operator schema's arguments in order, defaults included, followed by
// its out tensors. E.g. "aten::add.out" gets [self, other, alpha, out];
// "aten::native_layer_norm.out" gets [input, normalized_shape, weight, bias,
// eps, out0, out1, out2]. Optional arguments that are absent are None values;
// ScalarType/MemoryFormat/Layout arguments are Ints (c10 numbering).
//
// In a .pte, ExecuTorch's KernelCall lists one more trailing slot after the
// outs: the operator's return value (the out tensor again, or a TensorList of
// the outs). The executor drops that slot, so kernels see exactly
// [schema args..., outs...].
//
// A kernel checks its arguments (dtypes, shapes, arity) and reports failure
// through the context instead of crashing; it allocates nothing.
#pragma once

#include "kiln/runtime/evalue.h"

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

namespace kiln::rt {

class ThreadPool;  // optional parallelism, may be null

class KernelContext {
 public:
  explicit KernelContext(ThreadPool* pool = nullptr) : pool_(pool) {}
  // Records the first failure: status and a printf-style message (kept in a fixed buffer).
  void fail(Status s, const char* format, ...) __attribute__((format(printf, 3, 4)));
  bool ok() const { return status_ == Status::Ok; }
  Status status() const { return status_; }
  const char* message() const { return message_; }
  ThreadPool* pool() const { return pool_; }
  void reset() { status_ = Status::Ok; message_[0] = '\0'; }

 private:
  ThreadPool* pool_;
  Status status_ = Status::Ok;
  char message_[256] = {};
};

using KernelFn = void (*)(KernelContext& ctx, std::span<EValue*> args);

// One registered kernel: the operator-table row it implements (kiln::ops::OpId,
// include/kiln/ops/aten_ops.def), its boxed entry point, and the schema types of its C++
// parameters (src/kernels/util/register.h), checked against the schema when the
// registry starts. A kernel written against the raw args has no params (-1).
struct KernelEntry {
  uint16_t op;
  KernelFn fn;
  const uint8_t* params;
  int num_params;
};

// Finds the kernel for `name`.`overload` ("aten::add", "out"); nullptr if kiln has none.
KernelFn find_kernel(std::string_view name, std::string_view overload);

// Every registered kernel (for tests and error hints), in operator-table order.
std::span<const KernelEntry* const> registered_kernels();

// The qualified name of an entry's operator: "aten::add.out".
std::string_view kernel_name(const KernelEntry& entry);

}  // namespace kiln::rt
