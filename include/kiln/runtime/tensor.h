// rt::Tensor: a non-owning view of tensor memory as the runtime executes it.
// Shapes are static in kiln's programs, so a Tensor is a fixed-size record
// (no heap): data pointer, dtype, sizes, strides and dim order.
#pragma once

#include "kiln/core/dtype.h"
#include "kiln/runtime/status.h"

#include <cstddef>
#include <cstdint>
#include <span>

namespace kiln::rt {

constexpr int kMaxDims = 16;

struct Tensor {
  void* data = nullptr;
  ScalarType dtype = ScalarType::Float;
  int32_t dim = 0;
  int64_t sizes[kMaxDims] = {};
  int64_t strides[kMaxDims] = {};   // in elements, derived from dim_order
  uint8_t dim_order[kMaxDims] = {};
  int64_t numel = 1;
  size_t capacity_bytes = 0;        // bytes available at `data` (planned size)

  std::span<const int64_t> shape() const { return {sizes, static_cast<size_t>(dim)}; }
  size_t nbytes() const { return static_cast<size_t>(numel) * static_cast<size_t>(element_size(dtype)); }
  int64_t size(int32_t d) const { return sizes[d < 0 ? d + dim : d]; }
  template <typename T>
  T* data_as() const { return static_cast<T*>(data); }
  // True when dim_order is the identity (row-major contiguous).
  bool is_contiguous() const;
  bool same_shape(std::span<const int64_t> other) const;
};

// Fills sizes/dim_order/strides/numel for a contiguous tensor of `shape`.
// InvalidArgument if rank exceeds kMaxDims or a size is negative.
Status make_contiguous_tensor(Tensor& t, ScalarType dtype, std::span<const int64_t> shape, void* data,
                              size_t capacity_bytes);

// Gives `t` a new shape, keeping its dtype and memory: InvalidArgument if the
// shape needs more bytes than t.capacity_bytes (static programs: the planned shape).
Status resize_tensor(Tensor& t, std::span<const int64_t> new_shape);

}  // namespace kiln::rt
