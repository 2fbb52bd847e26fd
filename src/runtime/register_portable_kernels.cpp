// Part of kiln_kernels: hands the portable kernels' table (rt::registered_kernels(),
// the kernel library's own) to the executor's registry at static initialization.
// kiln_kernels' link interface names kiln_portable_kernels_anchor as undefined
// (CMake: LINKER:--undefined=...), so the linker keeps this object, and with
// it the registration, in every program that links the kernel library.
#include "kiln/runtime/kernel.h"
#include "kiln/runtime/kernel_registry.h"

extern "C" {
extern const bool kiln_portable_kernels_anchor;
const bool kiln_portable_kernels_anchor = kiln::rt::register_kernels(kiln::rt::registered_kernels());
}
