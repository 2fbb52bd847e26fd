// Scatters along one dim: scatter.src_out / scatter.value_out (assignment),
// scatter_add.out and scatter_reduce.two_out (sum, prod, mean, amax, amin).
//
// out starts as a copy of self; index position p (index's shape) writes src[p]
// (or the value) to out at p with its `dim` coordinate replaced by index[p].
// Every index is checked before anything is written.
//
// masked_scatter.out: source's elements, in order, into the positions a
// (broadcast) bool mask selects.
#include "util/broadcast.h"
#include "util/register.h"
#include "util/shape_checks.h"

#include <cstring>
#include <limits>
#include <string_view>

namespace kiln::rt::kernels {
namespace {

enum class Reduce { None, Sum, Prod, Mean, Max, Min };

bool check_scatter(KernelContext& ctx, const char* op, const Tensor& self, int64_t* dim, const Tensor& index,
                   const Tensor* src, Tensor& out) {
  if (!normalize_dim(ctx, op, *dim, self.dim, dim) || !check_index_dtype(ctx, op, "index", index) ||
      !check_out_dtype(ctx, out, self.dtype, op))
    return false;
  if (src && src->dtype != self.dtype) {
    ctx.fail(Status::InvalidArgument, "%s: self (%s) and src (%s) must have the same dtype", op, dtype_str(self.dtype),
             dtype_str(src->dtype));
    return false;
  }
  const int srank = self.dim == 0 ? 1 : self.dim, irank = index.dim == 0 ? 1 : index.dim;
  if (index.numel > 0 && srank != irank) {
    ctx.fail(Status::InvalidArgument, "%s: index must have the same number of dimensions as self", op);
    return false;
  }
  if (src && index.numel > 0 && (src->dim == 0 ? 1 : src->dim) != irank) {
    ctx.fail(Status::InvalidArgument, "%s: index must have the same number of dimensions as src", op);
    return false;
  }
  for (int d = 0; d < index.dim && index.numel > 0; ++d) {
    if ((d != *dim && self.dim > 0 && index.sizes[d] > self.sizes[d]) || (src && src->dim > 0 && index.sizes[d] > src->sizes[d])) {
      ctx.fail(Status::InvalidArgument, "%s: index %s is larger than self %s (apart from dim %lld) or src", op,
               ShapeText(index.shape()).buf, ShapeText(self.shape()).buf, static_cast<long long>(*dim));
      return false;
    }
  }
  const int64_t size = self.dim == 0 ? 1 : self.sizes[*dim];
  if (auto bad = index_outside(index, 0, size)) {
    ctx.fail(Status::OutOfRange, "%s: index %lld is out of bounds for dimension %lld with size %lld", op,
             static_cast<long long>(*bad), static_cast<long long>(*dim), static_cast<long long>(size));
    return false;
  }
  if (!prepare_out(ctx, op, out, self.shape()) || !check_no_overlap(ctx, op, out, index, "index")) return false;
  if (src && !check_no_overlap(ctx, op, out, *src, "src")) return false;
  return true;
}

// Calls f(out_offset, src_offset) for each index position, in order.
template <typename F>
void for_each_scatter(const Tensor& out, const Tensor& index, const Tensor* src, int64_t dim, F&& f) {
  int64_t ost[kMaxDims], sst[kMaxDims];
  contiguous_strides(out.dim, out.sizes, ost);
  if (src) contiguous_strides(src->dim, src->sizes, sst);
  const int rank = index.dim;
  int64_t idx[kMaxDims] = {};
  for (int64_t i = 0; i < index.numel; ++i) {
    int64_t o = 0, s = 0;
    for (int d = 0; d < rank; ++d) {
      o += (d == dim ? read_index(index, i) : idx[d]) * ost[d];
      if (src) s += idx[d] * sst[d];
    }
    if (rank == 0) o = read_index(index, i) * (out.dim == 0 ? 0 : ost[0]);
    f(o, s);
    for (int d = rank - 1; d >= 0; --d) {
      if (++idx[d] < index.sizes[d]) break;
      idx[d] = 0;
    }
  }
}

void scatter_impl(KernelContext& ctx, const char* op, const Tensor& self, int64_t dim, const Tensor& index,
                  const Tensor* src, const Scalar* value, Reduce reduce, bool include_self, Tensor& out) {
  if (!check_scatter(ctx, op, self, &dim, index, src, out)) return;
  if (out.data != self.data) std::memcpy(out.data, self.data, static_cast<size_t>(self.nbytes()));
  if (index.numel == 0) return;
  dispatch<kRealTypes | kBoolTypes>(self.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using C = compute_t<T>;
    T* o = out.data_as<T>();
    const T* s = src ? src->data_as<const T>() : nullptr;
    const T v = value ? value->as<T>() : T{};
    auto src_at = [&](int64_t off) { return s ? s[off] : v; };
    if (reduce == Reduce::None) {
      for_each_scatter(out, index, src, dim, [&](int64_t oo, int64_t so) { o[oo] = src_at(so); });
      return;
    }
    if constexpr (std::is_same_v<T, bool>) {
      // bool, as torch computes it: sum and amax are "or", prod and amin "and" (mean: refused by the caller)
      const bool any = reduce == Reduce::Sum || reduce == Reduce::Max;
      if (!include_self) for_each_scatter(out, index, src, dim, [&](int64_t oo, int64_t) { o[oo] = !any; });
      for_each_scatter(out, index, src, dim, [&](int64_t oo, int64_t so) {
        o[oo] = any ? (o[oo] || src_at(so)) : (o[oo] && src_at(so));
      });
    } else {
      // Without include_self, the first write to an element replaces self's value:
      // mark written elements by a pass that resets them to the reduction's identity.
      if (!include_self) {
        C id{};
        if (reduce == Reduce::Prod) id = C(1);
        if (reduce == Reduce::Max) id = std::numeric_limits<C>::has_infinity ? -std::numeric_limits<C>::infinity()
                                                                               : std::numeric_limits<C>::lowest();
        if (reduce == Reduce::Min) id = std::numeric_limits<C>::has_infinity ? std::numeric_limits<C>::infinity()
                                                                               : std::numeric_limits<C>::max();
        for_each_scatter(out, index, src, dim, [&](int64_t oo, int64_t) { o[oo] = convert<T>(id); });
      }
      for_each_scatter(out, index, src, dim, [&](int64_t oo, int64_t so) {
        const C a = convert<C>(o[oo]), b = convert<C>(src_at(so));
        C r = a;
        switch (reduce) {
          case Reduce::Sum: case Reduce::Mean: r = static_cast<C>(a + b); break;
          case Reduce::Prod: r = static_cast<C>(a * b); break;
          case Reduce::Max: r = (b != b || b > a) ? b : a; break;
          case Reduce::Min: r = (b != b || b < a) ? b : a; break;
          case Reduce::None: break;
        }
        o[oo] = convert<T>(r);
      });
    }
  });
}

void scatter_src_out(KernelContext& ctx, const Tensor& self, int64_t dim, const Tensor& index, const Tensor& src,
                     Tensor& out) {
  scatter_impl(ctx, "aten::scatter.src_out", self, dim, index, &src, nullptr, Reduce::None, true, out);
}

void scatter_value_out(KernelContext& ctx, const Tensor& self, int64_t dim, const Tensor& index, Scalar value,
                       Tensor& out) {
  scatter_impl(ctx, "aten::scatter.value_out", self, dim, index, nullptr, &value, Reduce::None, true, out);
}

void scatter_add_out(KernelContext& ctx, const Tensor& self, int64_t dim, const Tensor& index, const Tensor& src,
                     Tensor& out) {
  scatter_impl(ctx, "aten::scatter_add.out", self, dim, index, &src, nullptr, Reduce::Sum, true, out);
}

void scatter_reduce_out(KernelContext& ctx, const Tensor& self, int64_t dim, const Tensor& index, const Tensor& src,
                        std::string_view reduce, bool include_self, Tensor& out) {
  const char* op = "aten::scatter_reduce.two_out";
  Reduce r;
  if (reduce == "sum") r = Reduce::Sum;
  else if (reduce == "prod") r = Reduce::Prod;
  else if (reduce == "amax") r = Reduce::Max;
  else if (reduce == "amin") r = Reduce::Min;
  else if (reduce == "mean") {
    ctx.fail(Status::NotSupported, "%s: reduce='mean' is not supported", op);
    return;
  } else {
    ctx.fail(Status::InvalidArgument, "%s: reduce must be one of sum, prod, mean, amax, amin", op);
    return;
  }
  scatter_impl(ctx, op, self, dim, index, &src, nullptr, r, include_self, out);
}

// masked_scatter.out: out is self broadcast with mask; in out's element order, each
// position whose mask is true takes the next element of source (read flat).
void masked_scatter_out(KernelContext& ctx, const Tensor& self, const Tensor& mask, const Tensor& source,
                        Tensor& out) {
  const char* op = "aten::masked_scatter.out";
  if (mask.dtype != ScalarType::Bool) {
    ctx.fail(Status::InvalidArgument, "%s: mask must be bool, got %s", op, dtype_str(mask.dtype));
    return;
  }
  if (source.dtype != self.dtype) {
    ctx.fail(Status::InvalidArgument, "%s: self (%s) and source (%s) must have the same dtype", op,
             dtype_str(self.dtype), dtype_str(source.dtype));
    return;
  }
  if (!check_out_dtype(ctx, out, self.dtype, op)) return;
  int64_t shape[kMaxDims];
  int32_t rank = 0;
  if (!broadcast_tensors_shape(ctx, {&self, &mask}, shape, &rank, op)) return;
  int64_t self_st[kMaxDims] = {}, mask_st[kMaxDims] = {}, out_st[kMaxDims] = {};
  broadcast_strides(self.dim, self.sizes, rank, shape, self_st);
  broadcast_strides(mask.dim, mask.sizes, rank, shape, mask_st);
  const std::span<const int64_t> out_shape{shape, static_cast<size_t>(rank)};
  if (!prepare_out(ctx, op, out, out_shape) || !check_no_overlap(ctx, op, out, mask, "mask") ||
      !check_no_overlap(ctx, op, out, source, "source"))
    return;
  // how many elements the mask selects, checked against source before anything is written
  const bool* m = mask.data_as<const bool>();
  int64_t idx[kMaxDims] = {};
  int64_t selected = 0;
  for (int64_t i = 0; i < out.numel; ++i) {
    int64_t mo = 0;
    for (int d = 0; d < rank; ++d) mo += idx[d] * mask_st[d];
    selected += m[mo] ? 1 : 0;
    for (int d = rank - 1; d >= 0; --d) {
      if (++idx[d] < shape[d]) break;
      idx[d] = 0;
    }
  }
  if (selected > source.numel) {
    ctx.fail(Status::InvalidArgument, "%s: the mask selects %lld elements but source has %lld", op,
             static_cast<long long>(selected), static_cast<long long>(source.numel));
    return;
  }
  contiguous_strides(rank, shape, out_st);
  if (out.data != self.data && !copy_region(ctx, op, out, 0, out_st, self, 0, self_st, rank, shape)) return;
  const size_t es = static_cast<size_t>(element_size(self.dtype));
  char* o = static_cast<char*>(out.data);
  const char* src = static_cast<const char*>(source.data);
  for (int d = 0; d < rank; ++d) idx[d] = 0;
  int64_t next = 0;
  for (int64_t i = 0; i < out.numel; ++i) {
    int64_t mo = 0;
    for (int d = 0; d < rank; ++d) mo += idx[d] * mask_st[d];
    if (m[mo]) std::memcpy(o + static_cast<size_t>(i) * es, src + static_cast<size_t>(next++) * es, es);
    for (int d = rank - 1; d >= 0; --d) {
      if (++idx[d] < shape[d]) break;
      idx[d] = 0;
    }
  }
}

}  // namespace

KILN_KERNEL(scatter_src_out, scatter_src_out);
KILN_KERNEL(scatter_value_out, scatter_value_out);
KILN_KERNEL(scatter_add_out, scatter_add_out);
KILN_KERNEL(scatter_reduce_two_out, scatter_reduce_out);
KILN_KERNEL(masked_scatter_out, masked_scatter_out);

}  // namespace kiln::rt::kernels
