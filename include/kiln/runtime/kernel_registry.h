// The executor's kernel table: Program::load_method resolves every operator of
// a plan here. The executor holds no kernels itself; kernel libraries add
// theirs at startup (kiln's portable kernels do so when kiln_kernels is linked,
// see src/runtime/register_portable_kernels.cpp). Registration is not
// thread-safe: do it before loading programs (static initialization is fine).
#pragma once

#include "kiln/runtime/kernel.h"

#include <cstddef>
#include <span>
#include <string_view>

namespace kiln::rt {

// Adds a table of kernels (its storage must outlive every lookup). When two
// tables name the same operator, the one registered first wins. False if the
// executor's table of tables is full.
bool register_kernels(std::span<const KernelEntry> kernels);

// The registered kernel for `name`.`overload`, or nullptr.
KernelFn lookup_kernel(std::string_view name, std::string_view overload);

// Number of registered kernels, over all tables.
size_t registered_kernel_count();

}  // namespace kiln::rt
