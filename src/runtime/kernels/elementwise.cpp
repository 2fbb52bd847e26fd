#include "kernel_tables.h"

namespace kiln::rt::kernels {

std::span<const KernelEntry> elementwise_kernels() { return {}; }

}  // namespace kiln::rt::kernels
