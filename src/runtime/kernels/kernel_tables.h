// Internal: each kernel source file contributes one table; registry.cpp joins them.
#pragma once

#include "kiln/runtime/kernel.h"

#include <span>

namespace kiln::rt::kernels {

std::span<const KernelEntry> elementwise_kernels();     // elementwise.cpp: arithmetic, comparison, activations
std::span<const KernelEntry> reduction_kernels();       // reduction.cpp: softmax, layer norm, sums, means, cumsum
std::span<const KernelEntry> linear_algebra_kernels();  // linalg.cpp: mm, bmm, addmm
std::span<const KernelEntry> data_movement_kernels();   // data_movement.cpp: copies, views, cat, split, index, embedding, fill

}  // namespace kiln::rt::kernels
