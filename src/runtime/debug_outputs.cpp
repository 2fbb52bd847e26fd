// The intermediate-output log (kiln/runtime/debug_outputs.h).
#include "kiln/runtime/debug_outputs.h"

#include <cstring>
#include <new>

namespace kiln::rt {

DebugOutputLog::DebugOutputLog(size_t bytes, size_t max_entries)
    : data_(new (std::nothrow) std::byte[bytes > 0 ? bytes : 1]),
      entries_(new (std::nothrow) DebugOutput[max_entries > 0 ? max_entries : 1]),
      capacity_(data_ ? bytes : 0),
      max_entries_(entries_ ? max_entries : 0) {}

DebugOutput* DebugOutputLog::reserve(uint32_t instruction, int32_t node, ScalarType dtype,
                                     std::span<const int64_t> sizes, uint64_t nbytes) {
  const uint64_t at = (used_ + 63) & ~uint64_t{63};
  if (count_ >= max_entries_ || sizes.size() > static_cast<size_t>(kMaxDims) || at > capacity_ ||
      nbytes > capacity_ - at) {
    overflowed_ = true;
    return nullptr;
  }
  DebugOutput& e = entries_[count_++];
  e.instruction = instruction;
  e.delegate_node = node;
  e.dtype = dtype;
  e.dim = static_cast<int32_t>(sizes.size());
  for (size_t d = 0; d < sizes.size(); ++d) e.sizes[d] = sizes[d];
  e.offset = at;
  e.nbytes = nbytes;
  e.view_node = -1;
  e.view_dim = 0;
  used_ = at + nbytes;
  return &e;
}

bool DebugOutputLog::log(uint32_t instruction, int32_t delegate_node, const Tensor& t) {
  const uint64_t n = t.data ? t.nbytes() : 0;
  DebugOutput* e = reserve(instruction, delegate_node, t.dtype, t.shape(), n);
  if (!e) return false;
  if (n) std::memcpy(data_.get() + e->offset, t.data, n);
  return true;
}

bool DebugOutputLog::log(uint32_t instruction, int32_t delegate_node, ScalarType dtype, std::span<const int64_t> sizes,
                         const void* data, int32_t view_node, std::span<const int64_t> view_sizes) {
  int64_t numel = 1;
  for (int64_t s : sizes) numel *= s;
  const uint64_t n = data ? static_cast<uint64_t>(numel) * static_cast<uint64_t>(element_size(dtype)) : 0;
  if (view_sizes.size() > static_cast<size_t>(DebugOutput::kMaxViewDims)) view_node = -1;
  DebugOutput* e = reserve(instruction, delegate_node, dtype, sizes, n);
  if (!e) return false;
  if (view_node >= 0) {
    e->view_node = view_node;
    e->view_dim = static_cast<int32_t>(view_sizes.size());
    for (size_t d = 0; d < view_sizes.size(); ++d) e->view_sizes[d] = view_sizes[d];
  }
  if (n) std::memcpy(data_.get() + e->offset, data, n);
  return true;
}

}  // namespace kiln::rt
