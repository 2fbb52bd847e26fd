// The executor's kernel table: Program::load_method resolves every operator of
// a plan here. The executor holds no kernels itself; kernel libraries add
// themselves at startup (kiln's portable kernels do so when kiln_kernels is
// linked, see src/kernels/register_portable.cpp). A library is a lookup
// function, so the executor does not depend on how a library lays out its
// table. Registration is not thread-safe: do it before loading programs
// (static initialization is fine).
#pragma once

#include "kiln/runtime/kernel.h"

#include <cstddef>
#include <string_view>

namespace kiln::rt {

struct KernelLibrary {
  const char* name;                                                  // "portable"
  KernelFn (*find)(std::string_view name, std::string_view overload);  // nullptr if the library lacks it
  size_t (*count)();                                                 // kernels it holds
};

// Adds a library (its storage must outlive every lookup). When two libraries
// have the same operator, the one registered first wins. False if the
// executor's table of libraries is full.
bool register_kernel_library(const KernelLibrary* library);

// The registered kernel for `name`.`overload` ("aten::add", "out"), or nullptr.
KernelFn lookup_kernel(std::string_view name, std::string_view overload);

// Number of registered kernels, over all libraries.
size_t registered_kernel_count();

}  // namespace kiln::rt
