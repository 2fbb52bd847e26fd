// Gathers by one index tensor: index_select (whole slices along a dim), gather
// (one element per index position) and embedding (rows of a 2-d weight).
//
// Index values are checked before anything is read, and an out may not share
// memory with what it is gathered from (util/shape_checks.h's check_no_overlap).
#include "util/register.h"
#include "util/shape_checks.h"

#include <cstring>

namespace kiln::rt::kernels {
namespace {

// out takes `shape` and overlaps neither the index tensor nor the source.
bool prepare_gather_out(KernelContext& ctx, const char* op, Tensor& out, std::span<const int64_t> shape,
                        const Tensor& index, const char* index_name, const Tensor& src, const char* src_name) {
  return prepare_out(ctx, op, out, shape) && check_no_overlap(ctx, op, out, index, index_name) &&
         check_no_overlap(ctx, op, out, src, src_name);
}

// index_select and gather: dim wrapped for self, an int64/int32 index, out of self's dtype.
bool check_dim_index_out(KernelContext& ctx, const char* op, const Tensor& self, int64_t* dim, const Tensor& index,
                         const Tensor& out) {
  return normalize_dim(ctx, op, *dim, self.dim, dim) && check_index_dtype(ctx, op, "index", index) &&
         check_out_dtype(ctx, out, self.dtype, op);
}

void index_select_out(KernelContext& ctx, const Tensor& self, int64_t dim, const Tensor& index, Tensor& out) {
  const char* op = "aten::index_select.out";
  if (!check_dim_index_out(ctx, op, self, &dim, index, out)) return;
  if (index.dim > 1) {
    ctx.fail(Status::InvalidArgument, "%s: index is supposed to be a vector, got shape %s", op,
             ShapeText(index.shape()).buf);
    return;
  }
  if (self.dim == 0 && index.numel != 1) {
    ctx.fail(Status::InvalidArgument, "%s: index to scalar can have only 1 value, got %lld", op,
             static_cast<long long>(index.numel));
    return;
  }
  const int64_t size = self.dim == 0 ? 1 : self.sizes[dim];
  if (auto bad = index_outside(index, 0, size)) {
    ctx.fail(Status::OutOfRange, "%s: index %lld out of range for dimension %lld with size %lld", op,
             static_cast<long long>(*bad), static_cast<long long>(dim), static_cast<long long>(size));
    return;
  }
  int64_t shape[kMaxDims];
  for (int i = 0; i < self.dim; ++i) shape[i] = i == dim ? index.numel : self.sizes[i];
  if (!prepare_gather_out(ctx, op, out, {shape, static_cast<size_t>(self.dim)}, index, "index", self, "self") ||
      out.numel == 0)
    return;
  int64_t outer = 1, inner = 1;
  for (int i = 0; i < dim; ++i) outer *= self.sizes[i];
  for (int i = static_cast<int>(dim) + 1; i < self.dim; ++i) inner *= self.sizes[i];
  const int64_t es = element_size(self.dtype), row = inner * es;
  const auto* s = static_cast<const char*>(self.data);
  auto* d = static_cast<char*>(out.data);
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = 0; i < index.numel; ++i, d += row)
      std::memcpy(d, s + (o * size + read_index(index, i)) * row, static_cast<size_t>(row));
}

template <size_t E>
void gather_elements(const Tensor& self, const Tensor& index, int64_t dim, const int64_t* self_strides, char* dst) {
  const int rank = index.dim;
  const auto* src = static_cast<const char*>(self.data);
  const int64_t dim_stride = self.dim == 0 ? 1 : self_strides[dim];
  int64_t idx[kMaxDims] = {};
  int64_t base = 0;  // self offset of the index position, dim excluded
  for (int64_t i = 0; i < index.numel; ++i) {
    const int64_t off = base + read_index(index, i) * dim_stride;
    std::memcpy(dst + i * static_cast<int64_t>(E), src + off * static_cast<int64_t>(E), E);
    for (int d = rank - 1; d >= 0; --d) {
      const int64_t step = d == dim ? 0 : self_strides[d];
      base += step;
      if (++idx[d] < index.sizes[d]) break;
      base -= step * index.sizes[d];
      idx[d] = 0;
    }
  }
}

void gather_out(KernelContext& ctx, const Tensor& self, int64_t dim, const Tensor& index, bool /*sparse_grad*/,
                Tensor& out) {
  const char* op = "aten::gather.out";
  if (!check_dim_index_out(ctx, op, self, &dim, index, out)) return;
  const int srank = self.dim == 0 ? 1 : self.dim, irank = index.dim == 0 ? 1 : index.dim;
  if (srank != irank) {
    ctx.fail(Status::InvalidArgument, "%s: index tensor must have the same number of dimensions as input tensor", op);
    return;
  }
  if (self.dim > 0 && index.dim > 0)
    for (int d = 0; d < self.dim; ++d)
      if (d != dim && index.sizes[d] > self.sizes[d]) {
        ctx.fail(Status::InvalidArgument, "%s: size does not match at dimension %d: index %s must be no larger than "
                 "self %s apart from dimension %lld", op, d, ShapeText(index.shape()).buf,
                 ShapeText(self.shape()).buf, static_cast<long long>(dim));
        return;
      }
  const int64_t size = self.dim == 0 ? 1 : self.sizes[dim];
  if (!prepare_gather_out(ctx, op, out, index.shape(), index, "index", self, "self")) return;
  if (auto bad = index_outside(index, 0, size)) {
    ctx.fail(Status::OutOfRange, "%s: index %lld is out of bounds for dimension %lld with size %lld", op,
             static_cast<long long>(*bad), static_cast<long long>(dim), static_cast<long long>(size));
    return;
  }
  if (index.numel == 0) return;
  int64_t st[kMaxDims];
  contiguous_strides(self.dim, self.sizes, st);
  auto* d = static_cast<char*>(out.data);
  switch (element_size(self.dtype)) {
    case 1: gather_elements<1>(self, index, dim, st, d); break;
    case 2: gather_elements<2>(self, index, dim, st, d); break;
    case 4: gather_elements<4>(self, index, dim, st, d); break;
    case 8: gather_elements<8>(self, index, dim, st, d); break;
    default: gather_elements<16>(self, index, dim, st, d); break;
  }
}

void embedding_out(KernelContext& ctx, const Tensor& weight, const Tensor& indices, int64_t /*padding_idx*/,
                   bool /*scale_grad_by_freq*/, bool /*sparse*/, Tensor& out) {
  const char* op = "aten::embedding.out";
  if (!check_index_dtype(ctx, op, "indices", indices) || !check_out_dtype(ctx, out, weight.dtype, op)) return;
  if (weight.dim != 2) {
    ctx.fail(Status::InvalidArgument, "%s: weight must be 2-D, got shape %s", op, ShapeText(weight.shape()).buf);
    return;
  }
  int64_t shape[kMaxDims];
  if (!embedding_shape(ctx, op, indices, weight.sizes[1], shape)) return;
  if (!prepare_gather_out(ctx, op, out, {shape, static_cast<size_t>(indices.dim + 1)}, indices, "indices", weight,
                          "weight"))
    return;
  const int64_t rows = weight.sizes[0], row = weight.sizes[1] * element_size(weight.dtype);
  if (auto bad = index_outside(indices, 0, rows)) {
    ctx.fail(Status::OutOfRange, "%s: index %lld out of range for %lld embeddings", op, static_cast<long long>(*bad),
             static_cast<long long>(rows));
    return;
  }
  if (row == 0) return;
  const auto* w = static_cast<const char*>(weight.data);
  auto* d = static_cast<char*>(out.data);
  for (int64_t i = 0; i < indices.numel; ++i)
    std::memcpy(d + i * row, w + read_index(indices, i) * row, static_cast<size_t>(row));
}

}  // namespace

KILN_KERNEL(index_select_out, index_select_out);
KILN_KERNEL(gather_out, gather_out);
KILN_KERNEL(embedding_out, embedding_out);

}  // namespace kiln::rt::kernels
