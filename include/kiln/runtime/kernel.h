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

struct KernelEntry {
  const char* name;      // "aten::add"
  const char* overload;  // "out"
  KernelFn fn;
};

// Finds the kernel for `name`.`overload`; nullptr if kiln has none.
KernelFn find_kernel(std::string_view name, std::string_view overload);

// Every registered kernel (for `kiln inspect`, tests and error hints).
std::span<const KernelEntry> registered_kernels();

}  // namespace kiln::rt
