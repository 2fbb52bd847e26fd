// Materialized views: view_copy, permute_copy, transpose_copy, expand_copy,
// unsqueeze/squeeze_copy, slice_copy/narrow_copy/select_copy and their scatters, flip, repeat,
// diagonal_copy, as_strided_copy.
//
// Each describes the view of a contiguous self as sizes, element strides and an
// offset, and copies it out through util/strided_copy.h's engine (a reshape
// moves bytes as they are).
#include "util/register.h"
#include "util/shape_checks.h"

#include <algorithm>
#include <optional>
#include <utility>

namespace kiln::rt::kernels {
namespace {

// A view of a contiguous tensor: sizes, element strides and offset.
struct View {
  int ndim = 0;
  int64_t sizes[kMaxPlanDims];
  int64_t strides[kMaxPlanDims];
  int64_t offset = 0;

  std::span<const int64_t> shape() const { return {sizes, static_cast<size_t>(ndim)}; }
};

// self itself as a view: its sizes and contiguous strides.
View identity_view(const Tensor& self) {
  View v;
  v.ndim = self.dim;
  for (int i = 0; i < self.dim; ++i) v.sizes[i] = self.sizes[i];
  contiguous_strides(self.dim, self.sizes, v.strides);
  return v;
}

// out <- the view v of self; out's shape is out_shape (v's own unless given).
void view_out(KernelContext& ctx, const char* op, const Tensor& self, Tensor& out, const View& v,
              std::span<const int64_t> out_shape) {
  if (!prepare_same_dtype_out(ctx, op, self, out, out_shape) || out.numel == 0) return;
  gather_view(out.data, self, v.ndim, v.sizes, v.strides, v.offset);
}
void view_out(KernelContext& ctx, const char* op, const Tensor& self, Tensor& out, const View& v) {
  view_out(ctx, op, self, out, v, v.shape());
}

// out <- self's bytes under a new shape (same dtype and element count).
void reshape_out(KernelContext& ctx, const char* op, const Tensor& self, Tensor& out,
                 std::span<const int64_t> shape) {
  if (prepare_same_dtype_out(ctx, op, self, out, shape)) copy_bytes(self, out);
}

// ---------------------------------------------------------------------------
// Reshapes

// The shape of view(size) for `numel` elements, one -1 inferred.
bool view_shape(KernelContext& ctx, const char* op, IntArrayRef size, int64_t numel, int64_t* shape) {
  if (size.size() > static_cast<size_t>(kMaxDims)) {
    ctx.fail(Status::InvalidArgument, "%s: %zu dimensions exceed the maximum of %d", op, size.size(), kMaxDims);
    return false;
  }
  int infer = -1;
  int64_t known = 1;
  for (size_t i = 0; i < size.size(); ++i) {
    const int64_t v = size[i];
    shape[i] = v;
    if (v == -1) {
      if (infer >= 0) {
        ctx.fail(Status::InvalidArgument, "%s: only one dimension can be inferred in %s", op, ShapeText(size).buf);
        return false;
      }
      infer = static_cast<int>(i);
    } else if (v < 0 || __builtin_mul_overflow(known, v, &known)) {
      ctx.fail(Status::InvalidArgument, "%s: invalid shape %s", op, ShapeText(size).buf);
      return false;
    }
  }
  if (infer >= 0 ? (known == 0 || numel % known != 0) : known != numel) {
    ctx.fail(Status::InvalidArgument, "%s: shape %s is invalid for input of size %lld", op, ShapeText(size).buf,
             static_cast<long long>(numel));
    return false;
  }
  if (infer >= 0) shape[infer] = numel / known;
  return true;
}

void view_copy_out(KernelContext& ctx, const Tensor& self, IntArrayRef size, Tensor& out) {
  const char* op = "aten::view_copy.out";
  if (!check_out_dtype(ctx, out, self.dtype, op)) return;
  int64_t shape[kMaxDims];
  if (view_shape(ctx, op, size, self.numel, shape)) reshape_out(ctx, op, self, out, {shape, size.size()});
}

void unsqueeze_copy_out(KernelContext& ctx, const Tensor& self, int64_t dim, Tensor& out) {
  const char* op = "aten::unsqueeze_copy.out";
  if (!normalize_dim(ctx, op, dim, self.dim + 1, &dim)) return;
  if (self.dim + 1 > kMaxDims) {
    ctx.fail(Status::NotSupported, "%s: result would exceed %d dimensions", op, kMaxDims);
    return;
  }
  int64_t shape[kMaxDims];
  for (int i = 0, j = 0; i <= self.dim; ++i) shape[i] = i == dim ? 1 : self.sizes[j++];
  reshape_out(ctx, op, self, out, {shape, static_cast<size_t>(self.dim + 1)});
}

// Squeezes the marked dims of size 1.
void squeeze_marked(KernelContext& ctx, const char* op, const Tensor& self, Tensor& out, const bool* marked) {
  int64_t shape[kMaxDims];
  size_t n = 0;
  for (int i = 0; i < self.dim; ++i)
    if (!(marked[i] && self.sizes[i] == 1)) shape[n++] = self.sizes[i];
  reshape_out(ctx, op, self, out, {shape, n});
}

// Marks the wrapped dims of `dims`, refusing repeats ("dim 1 appears multiple times").
bool mark_dims(KernelContext& ctx, const char* op, IntArrayRef dims, int32_t rank, bool* marked) {
  for (int64_t d : dims) {
    int64_t w = 0;
    if (!normalize_dim(ctx, op, d, rank, &w)) return false;
    if (marked[w]) {
      ctx.fail(Status::InvalidArgument, "%s: dim %lld appears multiple times in the list of dims", op,
               static_cast<long long>(w));
      return false;
    }
    marked[w] = true;
  }
  return true;
}

void squeeze_copy_dims_out(KernelContext& ctx, const Tensor& self, IntArrayRef dim, Tensor& out) {
  const char* op = "aten::squeeze_copy.dims_out";
  bool marked[kMaxDims + 1] = {};
  if (mark_dims(ctx, op, dim, self.dim, marked)) squeeze_marked(ctx, op, self, out, marked);
}

void squeeze_copy_dim_out(KernelContext& ctx, const Tensor& self, int64_t dim, Tensor& out) {
  const char* op = "aten::squeeze_copy.dim_out";
  if (!normalize_dim(ctx, op, dim, self.dim, &dim)) return;
  bool marked[kMaxDims + 1] = {};
  marked[dim] = true;
  squeeze_marked(ctx, op, self, out, marked);
}

void squeeze_copy_out(KernelContext& ctx, const Tensor& self, Tensor& out) {
  bool marked[kMaxDims + 1];
  for (bool& m : marked) m = true;
  squeeze_marked(ctx, "aten::squeeze_copy.out", self, out, marked);
}

// ---------------------------------------------------------------------------
// Permutations, broadcasts, flips, repeats

void permute_copy_out(KernelContext& ctx, const Tensor& self, IntArrayRef dims, Tensor& out) {
  const char* op = "aten::permute_copy.out";
  if (dims.size() != static_cast<size_t>(self.dim)) {
    ctx.fail(Status::InvalidArgument, "%s: number of dims %s doesn't match the %d-d input", op, ShapeText(dims).buf,
             self.dim);
    return;
  }
  const View in = identity_view(self);
  View v;
  v.ndim = self.dim;
  bool seen[kMaxDims] = {};
  for (int i = 0; i < self.dim; ++i) {
    int64_t d = 0;
    if (!normalize_dim(ctx, op, dims[static_cast<size_t>(i)], self.dim, &d)) return;
    if (seen[d]) {
      ctx.fail(Status::InvalidArgument, "%s: repeated dim in %s", op, ShapeText(dims).buf);
      return;
    }
    seen[d] = true;
    v.sizes[i] = in.sizes[d];
    v.strides[i] = in.strides[d];
  }
  view_out(ctx, op, self, out, v);
}

void transpose_copy_out(KernelContext& ctx, const Tensor& self, int64_t dim0, int64_t dim1, Tensor& out) {
  const char* op = "aten::transpose_copy.int_out";
  if (!normalize_dim(ctx, op, dim0, self.dim, &dim0) || !normalize_dim(ctx, op, dim1, self.dim, &dim1)) return;
  View v = identity_view(self);
  if (self.dim > 0) {
    std::swap(v.sizes[dim0], v.sizes[dim1]);
    std::swap(v.strides[dim0], v.strides[dim1]);
  }
  view_out(ctx, op, self, out, v);
}

void expand_copy_out(KernelContext& ctx, const Tensor& self, IntArrayRef size, bool /*implicit*/, Tensor& out) {
  const char* op = "aten::expand_copy.out";
  const int n = static_cast<int>(size.size());
  if (size.size() < static_cast<size_t>(self.dim) || size.size() > static_cast<size_t>(kMaxDims)) {
    ctx.fail(Status::InvalidArgument, "%s: the number of sizes provided (%zu) must be at least the input's rank (%d)",
             op, size.size(), self.dim);
    return;
  }
  const View in = identity_view(self);
  View v;
  v.ndim = n;
  const int lead = n - self.dim;
  for (int i = 0; i < n; ++i) {
    const int64_t target = size[static_cast<size_t>(i)];
    if (i < lead) {
      if (target < 0) {
        ctx.fail(Status::InvalidArgument, "%s: the expanded size (%lld) isn't allowed in a leading, non-existing "
                 "dimension %d", op, static_cast<long long>(target), i);
        return;
      }
      v.sizes[i] = target;
      v.strides[i] = 0;
      continue;
    }
    const int64_t s = self.sizes[i - lead];
    if (target == -1 || target == s) {
      v.sizes[i] = s;
      v.strides[i] = in.strides[i - lead];
    } else if (s == 1 && target >= 0) {
      v.sizes[i] = target;
      v.strides[i] = 0;
    } else {
      ctx.fail(Status::InvalidArgument, "%s: the expanded size %lld must match the existing size %lld at "
               "non-singleton dimension %d (target %s, input %s)", op, static_cast<long long>(target),
               static_cast<long long>(s), i, ShapeText(size).buf, ShapeText(self.shape()).buf);
      return;
    }
  }
  int64_t numel = 0;
  if (checked_numel(ctx, op, v.shape(), &numel)) view_out(ctx, op, self, out, v);
}

// flip: a view with negated strides.
void flip_out(KernelContext& ctx, const Tensor& self, IntArrayRef dims, Tensor& out) {
  const char* op = "aten::flip.out";
  bool flipped[kMaxDims + 1] = {};
  if (!mark_dims(ctx, op, dims, self.dim, flipped)) return;
  View v = identity_view(self);
  for (int d = 0; d < self.dim; ++d) {
    if (!flipped[d] || v.sizes[d] == 0) continue;
    v.offset += (v.sizes[d] - 1) * v.strides[d];
    v.strides[d] = -v.strides[d];
  }
  view_out(ctx, op, self, out, v);
}

// repeat: a view of self as [r0, s0, r1, s1, ...] with stride 0 on the repeat
// dims, read contiguously into the [r0 * s0, r1 * s1, ...] out.
void repeat_out(KernelContext& ctx, const Tensor& self, IntArrayRef repeats, Tensor& out) {
  const char* op = "aten::repeat.out";
  if (repeats.size() < static_cast<size_t>(self.dim)) {
    ctx.fail(Status::InvalidArgument, "%s: number of dimensions of repeat dims (%zu) can not be smaller than the "
             "number of dimensions of tensor (%d)", op, repeats.size(), self.dim);
    return;
  }
  if (repeats.size() > static_cast<size_t>(kMaxDims)) {
    ctx.fail(Status::NotSupported, "%s: %zu repeat dims exceed the maximum of %d", op, repeats.size(), kMaxDims);
    return;
  }
  const int n = static_cast<int>(repeats.size()), lead = n - self.dim;
  const View in = identity_view(self);
  int64_t shape[kMaxDims];
  View v;
  v.ndim = 2 * n;
  for (int i = 0; i < n; ++i) {
    const int64_t r = repeats[static_cast<size_t>(i)];
    const int64_t s = i < lead ? 1 : self.sizes[i - lead];
    if (r < 0) {
      ctx.fail(Status::InvalidArgument, "%s: negative repeat %lld", op, static_cast<long long>(r));
      return;
    }
    if (__builtin_mul_overflow(r, s, &shape[i])) {
      ctx.fail(Status::InvalidArgument, "%s: result is too large", op);
      return;
    }
    v.sizes[2 * i] = r;
    v.strides[2 * i] = 0;
    v.sizes[2 * i + 1] = s;
    v.strides[2 * i + 1] = i < lead ? 0 : in.strides[i - lead];
  }
  int64_t numel = 0;
  if (checked_numel(ctx, op, {shape, static_cast<size_t>(n)}, &numel))
    view_out(ctx, op, self, out, v, {shape, static_cast<size_t>(n)});
}

// ---------------------------------------------------------------------------
// Slices and selects, and writing into them

// torch's slice clamping: the first index and the number of elements taken.
void slice_bounds(int64_t size, std::optional<int64_t> start, std::optional<int64_t> end, int64_t step,
                  int64_t* first, int64_t* count) {
  int64_t s = start.value_or(0);
  int64_t e = end.value_or(size);
  if (s < 0) s += size;
  if (e < 0) e += size;
  if (s < 0) s = 0;
  else if (s > size) s = size;
  if (e < s) e = s;
  else if (e > size) e = size;
  *first = s;
  *count = e == s ? 0 : (e - s - 1) / step + 1;  // ceil without overflow for huge steps
}

// The view slice(dim, start, end, step) of self.
bool slice_view(KernelContext& ctx, const char* op, const Tensor& self, int64_t dim, std::optional<int64_t> start,
                std::optional<int64_t> end, int64_t step, View& v) {
  if (self.dim == 0) {
    ctx.fail(Status::InvalidArgument, "%s: slice() cannot be applied to a 0-dim tensor", op);
    return false;
  }
  if (!normalize_dim(ctx, op, dim, self.dim, &dim)) return false;
  if (step <= 0) {
    ctx.fail(Status::InvalidArgument, "%s: slice step must be positive, got %lld", op, static_cast<long long>(step));
    return false;
  }
  int64_t first = 0, count = 0;
  slice_bounds(self.sizes[dim], start, end, step, &first, &count);
  v = identity_view(self);
  v.sizes[dim] = count;
  v.offset = first * v.strides[dim];
  v.strides[dim] *= step;
  return true;
}

// The view select(dim, index) of self: self without `dim`, at `index` along it.
bool select_view(KernelContext& ctx, const char* op, const Tensor& self, int64_t dim, int64_t index, View& v) {
  if (self.dim == 0) {
    ctx.fail(Status::InvalidArgument, "%s: select() cannot be applied to a 0-dim tensor", op);
    return false;
  }
  if (!normalize_dim(ctx, op, dim, self.dim, &dim)) return false;
  const int64_t size = self.sizes[dim];
  if (index < -size || index >= size) {
    ctx.fail(Status::OutOfRange, "%s: index %lld out of range for tensor of size %s at dimension %lld", op,
             static_cast<long long>(index), ShapeText(self.shape()).buf, static_cast<long long>(dim));
    return false;
  }
  if (index < 0) index += size;
  const View in = identity_view(self);
  v.ndim = 0;
  for (int i = 0; i < self.dim; ++i) {
    if (i == dim) continue;
    v.sizes[v.ndim] = in.sizes[i];
    v.strides[v.ndim++] = in.strides[i];
  }
  v.offset = index * in.strides[dim];
  return true;
}

void slice_copy_out(KernelContext& ctx, const Tensor& self, int64_t dim, std::optional<int64_t> start,
                    std::optional<int64_t> end, int64_t step, Tensor& out) {
  const char* op = "aten::slice_copy.Tensor_out";
  View v;
  if (slice_view(ctx, op, self, dim, start, end, step, v)) view_out(ctx, op, self, out, v);
}

// narrow_copy: the slice [start, start + length) of dim, with torch's checks (a negative start counts from the end;
// the range must lie inside the dim). kiln's lowering writes narrow as slice_copy; ExecuTorch's writes this.
void narrow_copy_out(KernelContext& ctx, const Tensor& self, int64_t dim, int64_t start, int64_t length, Tensor& out) {
  const char* op = "aten::narrow_copy.out";
  if (self.dim == 0) {
    ctx.fail(Status::InvalidArgument, "%s: narrow() cannot be applied to a 0-dim tensor", op);
    return;
  }
  if (!normalize_dim(ctx, op, dim, self.dim, &dim)) return;
  const int64_t size = self.sizes[dim];
  if (start < -size || start > size) {
    ctx.fail(Status::OutOfRange, "%s: start %lld out of range for dimension %lld of size %lld", op,
             static_cast<long long>(start), static_cast<long long>(dim), static_cast<long long>(size));
    return;
  }
  if (start < 0) start += size;
  if (length < 0 || length > size - start) {
    ctx.fail(Status::OutOfRange, "%s: start (%lld) + length (%lld) exceeds dimension size (%lld)", op,
             static_cast<long long>(start), static_cast<long long>(length), static_cast<long long>(size));
    return;
  }
  View v;
  if (slice_view(ctx, op, self, dim, start, start + length, 1, v)) view_out(ctx, op, self, out, v);
}

void select_copy_out(KernelContext& ctx, const Tensor& self, int64_t dim, int64_t index, Tensor& out) {
  const char* op = "aten::select_copy.int_out";
  View v;
  if (select_view(ctx, op, self, dim, index, v)) view_out(ctx, op, self, out, v);
}

// out <- self, then out's view v <- src (src has v's shape; converted to self's dtype).
void scatter_into_view(KernelContext& ctx, const char* op, const Tensor& self, const Tensor& src, Tensor& out,
                       const View& v) {
  if (!src.same_shape(v.shape())) {
    ctx.fail(Status::InvalidArgument, "%s: expected src to have a size equal to the slice of self: src size %s, "
             "slice size %s", op, ShapeText(src.shape()).buf, ShapeText(v.shape()).buf);
    return;
  }
  if (!prepare_same_dtype_out(ctx, op, self, out, self.shape())) return;
  copy_bytes(self, out);
  int64_t src_strides[kMaxDims];
  contiguous_strides(src.dim, src.sizes, src_strides);
  copy_region(ctx, op, out, v.offset, v.strides, src, 0, src_strides, v.ndim, v.sizes);
}

void slice_scatter_out(KernelContext& ctx, const Tensor& self, const Tensor& src, int64_t dim,
                       std::optional<int64_t> start, std::optional<int64_t> end, int64_t step, Tensor& out) {
  const char* op = "aten::slice_scatter.out";
  View v;
  if (slice_view(ctx, op, self, dim, start, end, step, v)) scatter_into_view(ctx, op, self, src, out, v);
}

void select_scatter_out(KernelContext& ctx, const Tensor& self, const Tensor& src, int64_t dim, int64_t index,
                        Tensor& out) {
  const char* op = "aten::select_scatter.out";
  View v;
  if (select_view(ctx, op, self, dim, index, v)) scatter_into_view(ctx, op, self, src, out, v);
}

// ---------------------------------------------------------------------------
// Diagonals and arbitrary strided views

// diagonal_copy: self without dim1 and dim2, then one dim along their diagonal
// (offset > 0 above it, < 0 below), whose stride is the sum of theirs.
void diagonal_copy_out(KernelContext& ctx, const Tensor& self, int64_t offset, int64_t dim1, int64_t dim2,
                       Tensor& out) {
  const char* op = "aten::diagonal_copy.out";
  if (self.dim < 2) {
    ctx.fail(Status::InvalidArgument, "%s: diagonal requires a tensor of at least 2 dimensions, got %d", op, self.dim);
    return;
  }
  if (!normalize_dim(ctx, op, dim1, self.dim, &dim1) || !normalize_dim(ctx, op, dim2, self.dim, &dim2)) return;
  if (dim1 == dim2) {
    ctx.fail(Status::InvalidArgument, "%s: diagonal dimensions cannot be identical %lld, %lld", op,
             static_cast<long long>(dim1), static_cast<long long>(dim2));
    return;
  }
  const View in = identity_view(self);
  const int64_t s1 = self.sizes[dim1], s2 = self.sizes[dim2];
  int64_t len = offset >= 0 ? std::min(s1, s2 - offset) : std::min(s1 + offset, s2);
  if (len < 0) len = 0;
  View v;
  v.ndim = 0;
  for (int i = 0; i < self.dim; ++i) {
    if (i == dim1 || i == dim2) continue;
    v.sizes[v.ndim] = in.sizes[i];
    v.strides[v.ndim++] = in.strides[i];
  }
  v.sizes[v.ndim] = len;
  v.strides[v.ndim++] = in.strides[dim1] + in.strides[dim2];
  if (len > 0) v.offset = offset >= 0 ? offset * in.strides[dim2] : -offset * in.strides[dim1];
  view_out(ctx, op, self, out, v);
}

// as_strided_copy: the elements of self's (contiguous) storage at storage_offset + sum(i_d * stride_d).
void as_strided_copy_out(KernelContext& ctx, const Tensor& self, IntArrayRef size, IntArrayRef stride,
                         std::optional<int64_t> storage_offset, Tensor& out) {
  const char* op = "aten::as_strided_copy.out";
  if (size.size() != stride.size()) {
    ctx.fail(Status::InvalidArgument, "%s: mismatch in length of strides and shape (%zu and %zu)", op, stride.size(),
             size.size());
    return;
  }
  if (size.size() > static_cast<size_t>(kMaxDims)) {
    ctx.fail(Status::NotSupported, "%s: %zu dimensions exceed the maximum of %d", op, size.size(), kMaxDims);
    return;
  }
  const int64_t base = storage_offset.value_or(0);
  if (base < 0) {
    ctx.fail(Status::InvalidArgument, "%s: negative storage offset %lld", op, static_cast<long long>(base));
    return;
  }
  View v;
  v.ndim = static_cast<int>(size.size());
  v.offset = base;
  int64_t last = base;  // the furthest element the view reads
  bool empty = false;
  for (int i = 0; i < v.ndim; ++i) {
    const int64_t n = size[static_cast<size_t>(i)], st = stride[static_cast<size_t>(i)];
    if (n < 0 || st < 0) {
      ctx.fail(Status::InvalidArgument, "%s: negative size or stride in size %s, stride %s", op, ShapeText(size).buf,
               ShapeText(stride).buf);
      return;
    }
    v.sizes[i] = n;
    v.strides[i] = st;
    int64_t reach = 0;
    if (n == 0) empty = true;
    else if (__builtin_mul_overflow(n - 1, st, &reach) || __builtin_add_overflow(last, reach, &last)) {
      ctx.fail(Status::InvalidArgument, "%s: size %s with stride %s overflows", op, ShapeText(size).buf,
               ShapeText(stride).buf);
      return;
    }
  }
  if (!empty && last >= self.numel) {
    ctx.fail(Status::OutOfRange, "%s: size %s, stride %s and storage offset %lld reach element %lld of a storage of "
             "%lld elements", op, ShapeText(size).buf, ShapeText(stride).buf, static_cast<long long>(base),
             static_cast<long long>(last), static_cast<long long>(self.numel));
    return;
  }
  int64_t numel = 0;
  if (checked_numel(ctx, op, v.shape(), &numel)) view_out(ctx, op, self, out, v);
}

}  // namespace

KILN_KERNEL(view_copy_out, view_copy_out);
KILN_KERNEL(unsqueeze_copy_out, unsqueeze_copy_out);
KILN_KERNEL(squeeze_copy_dims_out, squeeze_copy_dims_out);
KILN_KERNEL(squeeze_copy_dim_out, squeeze_copy_dim_out);
KILN_KERNEL(squeeze_copy_out, squeeze_copy_out);
KILN_KERNEL(permute_copy_out, permute_copy_out);
KILN_KERNEL(transpose_copy_int_out, transpose_copy_out);
KILN_KERNEL(expand_copy_out, expand_copy_out);
KILN_KERNEL(flip_out, flip_out);
KILN_KERNEL(repeat_out, repeat_out);
KILN_KERNEL(slice_copy_Tensor_out, slice_copy_out);
KILN_KERNEL(narrow_copy_out, narrow_copy_out);
KILN_KERNEL(select_copy_int_out, select_copy_out);
KILN_KERNEL(slice_scatter_out, slice_scatter_out);
KILN_KERNEL(select_scatter_out, select_scatter_out);
KILN_KERNEL(diagonal_copy_out, diagonal_copy_out);
KILN_KERNEL(as_strided_copy_out, as_strided_copy_out);

}  // namespace kiln::rt::kernels
