// Hands the portable kernels (registry.cpp) to the executor's registry at
// static initialization. kiln_kernels' link interface names
// kiln_portable_kernels_anchor as undefined (CMake: LINKER:--undefined=...),
// so the linker keeps this object, and with it the registration, in every
// program that links the kernel library.
#include "kiln/runtime/kernel.h"
#include "kiln/runtime/kernel_registry.h"

namespace kiln::rt::kernels {
// portable/prim_ops.cpp: the scalar instructions of dynamic programs (sym_size, executorch_prim).
KernelFn find_prim_kernel(std::string_view name, std::string_view overload);
size_t prim_kernel_count();
}  // namespace kiln::rt::kernels

namespace {

size_t portable_count() { return kiln::rt::registered_kernels().size() + kiln::rt::kernels::prim_kernel_count(); }

kiln::rt::KernelFn find_portable(std::string_view name, std::string_view overload) {
  if (kiln::rt::KernelFn fn = kiln::rt::find_kernel(name, overload)) return fn;
  return kiln::rt::kernels::find_prim_kernel(name, overload);
}

const kiln::rt::KernelLibrary kPortable{"portable", find_portable, portable_count};

}  // namespace

extern "C" {
extern const bool kiln_portable_kernels_anchor;
const bool kiln_portable_kernels_anchor = kiln::rt::register_kernel_library(&kPortable);
}
