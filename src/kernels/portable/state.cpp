// In-place kernels for mutable state (buffers the program updates across
// calls): index_put_ writes rows of a buffer where one 1-D index tensor says
// (the KV-cache update), copy_ writes a whole buffer (the write-back of any
// other mutation). Both write `self` and touch nothing else of it: no copy of
// the buffer per call. Indices are checked before anything is written, so a
// rejected call leaves the state as it was.
#include "util/register.h"
#include "util/shape_checks.h"
#include "util/strided_copy.h"

#include <cstring>

namespace kiln::rt::kernels {
namespace {

// index_put_(self, indices, values): one non-null 1-D index tensor at dim d;
// values has self's shape except len(index) at d; self[..., index[j], ...] <- values[..., j, ...].
void index_put_inplace(KernelContext& ctx, Tensor& self, OptionalTensorList indices, const Tensor& values,
                       bool accumulate) {
  const char* op = "aten::index_put_";
  if (accumulate) {
    ctx.fail(Status::NotSupported, "%s: accumulate is not supported in place", op);
    return;
  }
  if (values.dtype != self.dtype) {
    ctx.fail(Status::InvalidArgument, "%s: values are %s, the destination is %s", op, dtype_str(values.dtype),
             dtype_str(self.dtype));
    return;
  }
  int dim = -1;
  for (size_t i = 0; i < indices.items.size(); ++i) {
    if (indices.items[i] == nullptr) continue;
    if (dim >= 0) {
      ctx.fail(Status::NotSupported, "%s: only one index tensor is supported in place", op);
      return;
    }
    dim = static_cast<int>(i);
  }
  if (dim < 0 || dim >= self.dim) {
    ctx.fail(Status::InvalidArgument, "%s: needs exactly one index tensor within the destination's %d dims", op,
             self.dim);
    return;
  }
  const Tensor& index = *indices.items[static_cast<size_t>(dim)];
  if (!check_index_dtype(ctx, op, "the index", index)) return;
  if (index.dim != 1 || values.dim != self.dim || values.sizes[dim] != index.numel) {
    ctx.fail(Status::InvalidArgument, "%s: values of shape %s do not match destination %s indexed by %lld positions at "
             "dim %d", op, ShapeText(values.shape()).buf, ShapeText(self.shape()).buf,
             static_cast<long long>(index.numel), dim);
    return;
  }
  for (int d = 0; d < self.dim; ++d)
    if (d != dim && values.sizes[d] != self.sizes[d]) {
      ctx.fail(Status::InvalidArgument, "%s: values of shape %s do not match destination %s outside dim %d", op,
               ShapeText(values.shape()).buf, ShapeText(self.shape()).buf, dim);
      return;
    }
  if (auto bad = index_outside(index, 0, self.sizes[dim])) {
    ctx.fail(Status::InvalidArgument, "%s: position %lld is outside dimension %d of size %lld", op,
             static_cast<long long>(*bad), dim, static_cast<long long>(self.sizes[dim]));
    return;
  }
  if (!check_no_overlap(ctx, op, self, values, "values")) return;
  int64_t lead = 1, row = element_size(self.dtype);
  for (int d = 0; d < dim; ++d) lead *= self.sizes[d];
  for (int d = dim + 1; d < self.dim; ++d) row *= self.sizes[d];
  const int64_t n = index.numel;
  auto* dst = static_cast<char*>(self.data);
  const auto* src = static_cast<const char*>(values.data);
  for (int64_t o = 0; o < lead; ++o)
    for (int64_t j = 0; j < n; ++j)
      std::memcpy(dst + (o * self.sizes[dim] + read_index(index, j)) * row, src + (o * n + j) * row,
                  static_cast<size_t>(row));
}

// copy_(self, src): src broadcast to self's shape, converted to self's dtype.
void copy_inplace(KernelContext& ctx, Tensor& self, const Tensor& src, bool /*non_blocking*/) {
  const char* op = "aten::copy_";
  if (self.data == src.data) return;  // the value already lives in the buffer
  int64_t src_strides[kMaxDims], dst_strides[kMaxDims];
  if (!broadcast_strides(src.dim, src.sizes, self.dim, self.sizes, src_strides)) {
    ctx.fail(Status::InvalidArgument, "%s: src of shape %s does not broadcast to %s", op, ShapeText(src.shape()).buf,
             ShapeText(self.shape()).buf);
    return;
  }
  if (!check_no_overlap(ctx, op, self, src, "src")) return;
  contiguous_strides(self.dim, self.sizes, dst_strides);
  copy_region(ctx, op, self, 0, dst_strides, src, 0, src_strides, self.dim, self.sizes);
}

}  // namespace

KILN_KERNEL(index_put_, index_put_inplace);
KILN_KERNEL(copy_, copy_inplace);

}  // namespace kiln::rt::kernels
