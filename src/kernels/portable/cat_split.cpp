// Concatenation and splitting along a dim: cat, split_with_sizes_copy, split_copy.
//
// A contiguous tensor is [outer, size along dim, inner]; each input (cat) or out
// (split) holds one [outer, its extent, inner] block, so both move whole rows of
// `extent * inner` elements.
#include "util/register.h"
#include "util/shape_checks.h"

#include <cstring>

namespace kiln::rt::kernels {
namespace {

// Element counts before and after `dim` of a shape.
void outer_inner(std::span<const int64_t> shape, int64_t dim, int64_t* outer, int64_t* inner) {
  *outer = 1;
  *inner = 1;
  for (int64_t i = 0; i < dim; ++i) *outer *= shape[static_cast<size_t>(i)];
  for (size_t i = static_cast<size_t>(dim) + 1; i < shape.size(); ++i) *inner *= shape[i];
}

void cat_out(KernelContext& ctx, TensorList tensors, int64_t dim, Tensor& out) {
  const char* op = "aten::cat.out";
  if (tensors.empty()) {
    ctx.fail(Status::InvalidArgument, "%s: expected a non-empty list of tensors", op);
    return;
  }
  // torch skips legacy empty 1-d tensors (shape [0]) whatever the other shapes.
  auto skipped = [](const Tensor* t) { return t->dim == 1 && t->sizes[0] == 0; };
  const Tensor* ref = nullptr;
  for (const Tensor* t : tensors)
    if (!ref && !skipped(t)) ref = t;
  if (ref == nullptr) {  // everything skipped: the result is the empty 1-d tensor
    const int64_t empty[1] = {0};
    prepare_out(ctx, op, out, empty);
    return;
  }
  if (ref->dim == 0) {
    ctx.fail(Status::InvalidArgument, "%s: zero-dimensional tensor cannot be concatenated", op);
    return;
  }
  if (!normalize_dim(ctx, op, dim, ref->dim, &dim)) return;
  int64_t shape[kMaxDims];
  for (int i = 0; i < ref->dim; ++i) shape[i] = ref->sizes[i];
  shape[dim] = 0;
  for (size_t k = 0; k < tensors.size(); ++k) {
    const Tensor* t = tensors[k];
    if (skipped(t)) continue;
    bool match = t->dim == ref->dim;
    for (int i = 0; match && i < ref->dim; ++i) match = i == dim || t->sizes[i] == ref->sizes[i];
    if (!match) {
      ctx.fail(Status::InvalidArgument, "%s: sizes of tensors must match except in dimension %lld: tensor %zu has "
               "shape %s, expected %s", op, static_cast<long long>(dim), k, ShapeText(t->shape()).buf,
               ShapeText(ref->shape()).buf);
      return;
    }
    if (!can_cast(t->dtype, out.dtype)) {
      ctx.fail(Status::InvalidArgument, "%s: input dtype %s can't be cast to the out dtype %s", op,
               dtype_str(t->dtype), dtype_str(out.dtype));
      return;
    }
    shape[dim] += t->sizes[dim];
  }
  const std::span<const int64_t> result{shape, static_cast<size_t>(ref->dim)};
  if (!prepare_out(ctx, op, out, result) || out.numel == 0) return;
  int64_t outer = 1, inner = 1;
  outer_inner(result, dim, &outer, &inner);
  const int64_t oes = element_size(out.dtype);
  auto* dst = static_cast<char*>(out.data);
  int64_t dst_pos = 0;  // elements
  for (int64_t o = 0; o < outer; ++o) {
    for (const Tensor* t : tensors) {
      if (skipped(t)) continue;
      const int64_t chunk = t->sizes[dim] * inner;
      if (chunk == 0) continue;
      const int64_t tes = element_size(t->dtype);
      const char* src = static_cast<const char*>(t->data) + o * chunk * tes;
      if (t->dtype == out.dtype) {
        std::memcpy(dst + dst_pos * oes, src, static_cast<size_t>(chunk * oes));
      } else {
        ConvertRowFn fn = checked_convert_row_fn(ctx, op, out.dtype, t->dtype);
        if (fn == nullptr) return;
        fn(dst + dst_pos * oes, src, chunk, oes, tes);
      }
      dst_pos += chunk;
    }
  }
}

// The dim that split_copy / split_with_sizes_copy split self along.
bool split_dim(KernelContext& ctx, const char* op, const Tensor& self, int64_t* dim) {
  if (self.dim == 0) {
    ctx.fail(Status::InvalidArgument, "%s: split expects at least a 1-dimensional tensor", op);
    return false;
  }
  return normalize_dim(ctx, op, *dim, self.dim, dim);
}

// Copies consecutive chunks of self along dim into the outs; chunk(i) is out i's extent.
template <typename ChunkFn>
void split_into(KernelContext& ctx, const char* op, const Tensor& self, int64_t dim, TensorList outs, int64_t count,
                ChunkFn chunk) {
  if (outs.size() != static_cast<size_t>(count)) {
    ctx.fail(Status::InvalidArgument, "%s: expected %lld out tensors, got %zu", op, static_cast<long long>(count),
             outs.size());
    return;
  }
  int64_t outer = 1, inner = 1;
  outer_inner(self.shape(), dim, &outer, &inner);
  const int64_t es = element_size(self.dtype), dim_size = self.sizes[dim];
  int64_t shape[kMaxDims];
  for (int i = 0; i < self.dim; ++i) shape[i] = self.sizes[i];
  int64_t start = 0;
  for (size_t k = 0; k < outs.size(); ++k) {
    Tensor* o = outs[k];
    const int64_t c = chunk(static_cast<int64_t>(k));
    shape[dim] = c;
    if (!prepare_same_dtype_out(ctx, op, self, *o, {shape, static_cast<size_t>(self.dim)})) return;
    if (o->numel > 0) {
      const auto* s = static_cast<const char*>(self.data);
      auto* d = static_cast<char*>(o->data);
      const size_t bytes = static_cast<size_t>(c * inner * es);
      for (int64_t i = 0; i < outer; ++i)
        std::memcpy(d + i * c * inner * es, s + (i * dim_size + start) * inner * es, bytes);
    }
    start += c;
  }
}

void split_with_sizes_copy_out(KernelContext& ctx, const Tensor& self, IntArrayRef split_sizes, int64_t dim,
                               TensorList out) {
  const char* op = "aten::split_with_sizes_copy.out";
  if (!split_dim(ctx, op, self, &dim)) return;
  int64_t sum = 0;
  for (int64_t s : split_sizes) {
    if (s < 0 || __builtin_add_overflow(sum, s, &sum)) {
      ctx.fail(Status::InvalidArgument, "%s: invalid split sizes %s", op, ShapeText(split_sizes).buf);
      return;
    }
  }
  if (sum != self.sizes[dim]) {
    ctx.fail(Status::InvalidArgument, "%s: split_sizes %s must sum exactly to %lld (dimension %lld)", op,
             ShapeText(split_sizes).buf, static_cast<long long>(self.sizes[dim]), static_cast<long long>(dim));
    return;
  }
  split_into(ctx, op, self, dim, out, static_cast<int64_t>(split_sizes.size()),
             [&](int64_t i) { return split_sizes[static_cast<size_t>(i)]; });
}

void split_copy_out(KernelContext& ctx, const Tensor& self, int64_t split_size, int64_t dim, TensorList out) {
  const char* op = "aten::split_copy.Tensor_out";
  if (!split_dim(ctx, op, self, &dim)) return;
  const int64_t dim_size = self.sizes[dim];
  if (split_size < 0 || (split_size == 0 && dim_size != 0)) {
    ctx.fail(Status::InvalidArgument, "%s: split_size %lld is invalid for dimension size %lld", op,
             static_cast<long long>(split_size), static_cast<long long>(dim_size));
    return;
  }
  // torch: at least one chunk; split_size 0 only for an empty dimension
  int64_t count = 1;
  if (split_size != 0) count = dim_size / split_size + (dim_size % split_size != 0 ? 1 : 0);
  if (count < 1) count = 1;
  const int64_t last = dim_size - split_size * (count - 1);
  split_into(ctx, op, self, dim, out, count, [&](int64_t i) { return i == count - 1 ? last : split_size; });
}

}  // namespace

KILN_KERNEL(cat_out, cat_out);
KILN_KERNEL(split_with_sizes_copy_out, split_with_sizes_copy_out);
KILN_KERNEL(split_copy_Tensor_out, split_copy_out);

}  // namespace kiln::rt::kernels
