// Kernel registration without the typed boxing (register.h has that): the
// KILN_BOXED_KERNEL line for a kernel written against the raw EValue* args, and
// the registry's checks.
#pragma once

#include "kiln/runtime/kernel.h"
#include "kiln/ops/op_id.h"

#include <cstddef>
#include <cstdint>
#include <span>

namespace kiln::rt::kernels {

// "" when `entry` may serve its operator (parameter types agree with the schema),
// else why not (written to msg).
const char* check_kernel_entry(const KernelEntry& entry, char* msg, size_t n);

// "" when every operator the lowering can emit (a table line with a target) has an
// entry among `entries`, else the first one missing (written to msg).
const char* check_kernel_coverage(std::span<const KernelEntry* const> entries, char* msg, size_t n);

}  // namespace kiln::rt::kernels

#define KILN_BOXED_KERNEL(id, fn)                            \
  extern const ::kiln::rt::KernelEntry kiln_kernel_##id;     \
  const ::kiln::rt::KernelEntry kiln_kernel_##id{static_cast<uint16_t>(::kiln::ops::OpId::id), &fn, nullptr, -1}
