// Argument checks shared by the data movement kernels (portable/copy, views,
// cat_split, index, gather, fill): shapes as text for messages, dims wrapped with
// torch's message, out shapes, element counts, values that must fit a dtype,
// memory formats and overlap between an out and the tensors it is computed from.
// Each check reports its failure through ctx and returns false.
#pragma once

#include "util/register.h"
#include "util/strided_copy.h"

#include <cstdint>
#include <cstdio>
#include <optional>
#include <span>

namespace kiln::rt::kernels {

// A shape as "[2, 3]", for messages: ShapeText(t.shape()).buf.
struct ShapeText {
  char buf[200];
  explicit ShapeText(std::span<const int64_t> s) { format_shape(buf, sizeof(buf), s); }
};

// Wraps a possibly negative dim into [0, rank); a 0-dim tensor accepts -1 and 0
// as torch does. The message is torch's ("expected to be in range of [-r, r-1]").
inline bool normalize_dim(KernelContext& ctx, const char* op, int64_t dim, int64_t rank, int64_t* out) {
  const int64_t r = rank <= 0 ? 1 : rank;
  if (dim < -r || dim >= r) {
    ctx.fail(Status::InvalidArgument, "%s: dimension %lld out of range (expected to be in range of [%lld, %lld])", op,
             static_cast<long long>(dim), static_cast<long long>(-r), static_cast<long long>(r - 1));
    return false;
  }
  *out = dim < 0 ? dim + r : dim;
  return true;
}

// Makes `out` the result shape: as planned, or resized within its capacity.
inline bool prepare_out(KernelContext& ctx, const char* op, Tensor& out, std::span<const int64_t> shape) {
  if (out.same_shape(shape)) return true;
  if (resize_tensor(out, shape) == Status::Ok) {
    if (out.numel > 0 && out.data == nullptr) {
      ctx.fail(Status::InvalidArgument, "%s: out has no data", op);
      return false;
    }
    return true;
  }
  ctx.fail(Status::InvalidArgument, "%s: out has shape %s but the result has shape %s, which does not fit in it", op,
           ShapeText(out.shape()).buf, ShapeText(shape).buf);
  return false;
}

// An embedding lookup's result shape: the indices' shape and one more dim of `width` (into `shape`).
inline bool embedding_shape(KernelContext& ctx, const char* op, const Tensor& indices, int64_t width,
                            int64_t (&shape)[kMaxDims]) {
  if (indices.dim + 1 > kMaxDims) {
    ctx.fail(Status::NotSupported, "%s: result would exceed %d dimensions", op, kMaxDims);
    return false;
  }
  for (int i = 0; i < indices.dim; ++i) shape[i] = indices.sizes[i];
  shape[indices.dim] = width;
  return true;
}

// `out` has self's dtype and takes `shape`.
inline bool prepare_same_dtype_out(KernelContext& ctx, const char* op, const Tensor& self, Tensor& out,
                                   std::span<const int64_t> shape) {
  return check_out_dtype(ctx, out, self.dtype, op) && prepare_out(ctx, op, out, shape);
}

// Number of elements of `shape`, failing on negative sizes, overflow or too many dims.
inline bool checked_numel(KernelContext& ctx, const char* op, std::span<const int64_t> shape, int64_t* numel) {
  if (shape.size() > static_cast<size_t>(kMaxDims)) {
    ctx.fail(Status::InvalidArgument, "%s: %zu dimensions exceed the maximum of %d", op, shape.size(), kMaxDims);
    return false;
  }
  int64_t n = 1;
  for (int64_t s : shape) {
    if (s < 0) {
      ctx.fail(Status::InvalidArgument, "%s: negative dimension %lld in %s", op, static_cast<long long>(s),
               ShapeText(shape).buf);
      return false;
    }
    if (__builtin_mul_overflow(n, s, &n)) {
      ctx.fail(Status::InvalidArgument, "%s: shape %s is too large", op, ShapeText(shape).buf);
      return false;
    }
  }
  *numel = n;
  return true;
}

// `v` becomes an element of `dtype` without overflow (torch's checked_convert).
inline bool check_value_fits(KernelContext& ctx, const char* op, const Scalar& v, ScalarType dtype) {
  if (!is_supported_dtype(dtype)) {
    ctx.fail(Status::NotSupported, "%s: dtype %s is not supported", op, dtype_str(dtype));
    return false;
  }
  if (!scalar_fits(v, dtype)) {
    ctx.fail(Status::InvalidArgument, "%s: value cannot be converted to type %s without overflow", op,
             dtype_str(dtype));
    return false;
  }
  return true;
}

// A MemoryFormat? argument: None, contiguous_format or preserve_format (outs are contiguous).
inline bool check_memory_format(KernelContext& ctx, const char* op, std::optional<MemoryFormat> f) {
  if (!f) return true;
  const auto v = static_cast<long long>(*f);
  if (v == 0 || v == 1) return true;
  ctx.fail(Status::NotSupported, "%s: memory_format %lld is not supported (contiguous outputs only)", op, v);
  return false;
}

// The gather-like kernels check their index values, then read them again to copy: an
// out that shares memory with an index tensor (or with the tensor read) would change
// them in between and send the copy anywhere. A planned program never does that (a
// damaged one can); torch rejects such overlap too.
inline bool check_no_overlap(KernelContext& ctx, const char* op, const Tensor& out, const Tensor& in,
                             const char* name) {
  if (out.data == nullptr || in.data == nullptr || out.nbytes() == 0 || in.nbytes() == 0) return true;
  const auto o = reinterpret_cast<uintptr_t>(out.data), i = reinterpret_cast<uintptr_t>(in.data);
  if (o < i + in.nbytes() && i < o + out.nbytes()) {
    ctx.fail(Status::InvalidArgument, "%s: out shares memory with %s", op, name);
    return false;
  }
  return true;
}

// The first value of an index tensor outside [lo, hi), if any (the kernel words the message).
inline std::optional<int64_t> index_outside(const Tensor& index, int64_t lo, int64_t hi) {
  for (int64_t i = 0; i < index.numel; ++i) {
    const int64_t v = read_index(index, i);
    if (v < lo || v >= hi) return v;
  }
  return std::nullopt;
}

}  // namespace kiln::rt::kernels
