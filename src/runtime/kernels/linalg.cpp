#include "kernel_tables.h"

namespace kiln::rt::kernels {

std::span<const KernelEntry> linear_algebra_kernels() { return {}; }

}  // namespace kiln::rt::kernels
