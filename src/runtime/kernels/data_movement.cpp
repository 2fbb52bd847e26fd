#include "kernel_tables.h"

namespace kiln::rt::kernels {

std::span<const KernelEntry> data_movement_kernels() { return {}; }

}  // namespace kiln::rt::kernels
