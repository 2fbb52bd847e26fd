// Hands the portable kernels (registry.cpp) to the executor's registry at
// static initialization. kiln_kernels' link interface names
// kiln_portable_kernels_anchor as undefined (CMake: LINKER:--undefined=...),
// so the linker keeps this object, and with it the registration, in every
// program that links the kernel library.
#include "kiln/runtime/kernel.h"
#include "kiln/runtime/kernel_registry.h"

namespace {

size_t portable_count() { return kiln::rt::registered_kernels().size(); }

const kiln::rt::KernelLibrary kPortable{"portable", kiln::rt::find_kernel, portable_count};

}  // namespace

extern "C" {
extern const bool kiln_portable_kernels_anchor;
const bool kiln_portable_kernels_anchor = kiln::rt::register_kernel_library(&kPortable);
}
