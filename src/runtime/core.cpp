#include <cstdarg>
#include <cstdio>

#include "kiln/runtime/evalue.h"
#include "kiln/runtime/kernel.h"
#include "kiln/runtime/status.h"
#include "kiln/runtime/tensor.h"

namespace kiln::rt {

const char* status_name(Status s) {
  switch (s) {
    case Status::Ok: return "ok";
    case Status::InvalidArgument: return "invalid argument";
    case Status::InvalidProgram: return "invalid program";
    case Status::NotFound: return "not found";
    case Status::NotSupported: return "not supported";
    case Status::OutOfMemory: return "out of memory";
    case Status::OutOfRange: return "out of range";
    case Status::AccessFailed: return "access failed";
    case Status::Internal: return "internal error";
  }
  return "unknown status";
}

bool Tensor::is_contiguous() const {
  for (int32_t i = 0; i < dim; ++i)
    if (dim_order[i] != i) return false;
  return true;
}

bool Tensor::same_shape(std::span<const int64_t> other) const {
  if (other.size() != static_cast<size_t>(dim)) return false;
  for (int32_t i = 0; i < dim; ++i)
    if (sizes[i] != other[static_cast<size_t>(i)]) return false;
  return true;
}

Status make_contiguous_tensor(Tensor& t, ScalarType dtype, std::span<const int64_t> shape, void* data,
                              size_t capacity_bytes) {
  if (shape.size() > static_cast<size_t>(kMaxDims)) return Status::InvalidArgument;
  t.dtype = dtype;
  t.data = data;
  t.capacity_bytes = capacity_bytes;
  t.dim = static_cast<int32_t>(shape.size());
  for (int32_t i = 0; i < t.dim; ++i) {
    if (shape[static_cast<size_t>(i)] < 0) return Status::InvalidArgument;
    t.sizes[i] = shape[static_cast<size_t>(i)];
    t.dim_order[i] = static_cast<uint8_t>(i);
  }
  return resize_tensor(t, shape);
}

Status resize_tensor(Tensor& t, std::span<const int64_t> new_shape) {
  if (new_shape.size() > static_cast<size_t>(kMaxDims)) return Status::InvalidArgument;
  int64_t numel = 1;
  for (int64_t s : new_shape) {
    if (s < 0 || __builtin_mul_overflow(numel, s, &numel)) return Status::InvalidArgument;  // shapes come from files
  }
  size_t bytes = 0;
  if (__builtin_mul_overflow(static_cast<size_t>(numel), static_cast<size_t>(element_size(t.dtype)), &bytes) ||
      bytes > t.capacity_bytes)
    return Status::InvalidArgument;
  bool contiguous = t.is_contiguous() || static_cast<int32_t>(new_shape.size()) != t.dim;
  t.dim = static_cast<int32_t>(new_shape.size());
  for (int32_t i = 0; i < t.dim; ++i) {
    t.sizes[i] = new_shape[static_cast<size_t>(i)];
    if (contiguous) t.dim_order[i] = static_cast<uint8_t>(i);
  }
  // strides from dim order: innermost dim (last in dim_order) has stride 1
  int64_t stride = 1;
  for (int32_t k = t.dim - 1; k >= 0; --k) {
    int32_t d = t.dim_order[k];
    t.strides[d] = stride;
    stride *= t.sizes[d] == 0 ? 1 : t.sizes[d];
  }
  t.numel = numel;
  return Status::Ok;
}

bool EValue::scalar_as_double(double* out) const {
  switch (tag) {
    case Tag::Int: *out = static_cast<double>(scalar.i); return true;
    case Tag::Double: *out = scalar.d; return true;
    case Tag::Bool: *out = scalar.b ? 1.0 : 0.0; return true;
    default: return false;
  }
}

bool EValue::scalar_as_int(int64_t* out) const {
  switch (tag) {
    case Tag::Int: *out = scalar.i; return true;
    case Tag::Bool: *out = scalar.b ? 1 : 0; return true;
    default: return false;
  }
}

void KernelContext::fail(Status s, const char* format, ...) {
  if (status_ != Status::Ok) return;  // keep the first failure
  status_ = s;
  va_list ap;
  va_start(ap, format);
  std::vsnprintf(message_, sizeof(message_), format, ap);
  va_end(ap);
}

}  // namespace kiln::rt
