// Fills and factories: full, full_like, scalar_tensor, fill (Scalar and 0-dim
// Tensor value), arange, constant_pad_nd (a fill around a copy of self), and
// tril/triu (self with zeros outside a triangle).
//
// A Scalar becomes an element only when it fits the out dtype (torch's overflow
// check, util/strided_copy.h's scalar_fits); a fill repeats that element.
#include "util/register.h"
#include "util/shape_checks.h"

#include <cmath>
#include <cstring>
#include <optional>
#include <type_traits>

namespace kiln::rt::kernels {
namespace {

// out (already shaped) <- value in out's dtype.
void fill_out_with(KernelContext& ctx, const char* op, const Scalar& value, Tensor& out) {
  if (!check_value_fits(ctx, op, value, out.dtype)) return;
  alignas(16) unsigned char elem[16] = {};
  scalar_to_element(value, out.dtype, elem);
  fill_elements(out.data, out.numel, elem, element_size(out.dtype));
}

// out takes `shape` and is filled with value (checked to fit before out is touched).
void fill_shape(KernelContext& ctx, const char* op, const Scalar& value, std::span<const int64_t> shape,
                Tensor& out) {
  if (check_value_fits(ctx, op, value, out.dtype) && prepare_out(ctx, op, out, shape))
    fill_out_with(ctx, op, value, out);
}

void full_out(KernelContext& ctx, IntArrayRef size, Scalar fill_value, Tensor& out) {
  const char* op = "aten::full.out";
  int64_t numel = 0;
  if (checked_numel(ctx, op, size, &numel)) fill_shape(ctx, op, fill_value, size, out);
}

void full_like_out(KernelContext& ctx, const Tensor& self, Scalar fill_value, std::optional<MemoryFormat> memory_format,
                   Tensor& out) {
  const char* op = "aten::full_like.out";
  if (check_memory_format(ctx, op, memory_format)) fill_shape(ctx, op, fill_value, self.shape(), out);
}

void scalar_tensor_out(KernelContext& ctx, Scalar s, Tensor& out) {
  fill_shape(ctx, "aten::scalar_tensor.out", s, {}, out);
}

void fill_scalar_out(KernelContext& ctx, const Tensor& self, Scalar value, Tensor& out) {
  const char* op = "aten::fill.Scalar_out";
  if (check_out_dtype(ctx, out, self.dtype, op)) fill_shape(ctx, op, value, self.shape(), out);
}

// fill.Tensor_out: value is 0-dim, converted to out's dtype.
void fill_tensor_out(KernelContext& ctx, const Tensor& self, const Tensor& value, Tensor& out) {
  const char* op = "aten::fill.Tensor_out";
  if (!check_out_dtype(ctx, out, self.dtype, op)) return;
  if (value.dim != 0) {
    ctx.fail(Status::InvalidArgument, "%s: fill only supports a 0-dimension value tensor, got %d dimensions", op,
             value.dim);
    return;
  }
  ConvertRowFn fn = checked_convert_row_fn(ctx, op, out.dtype, value.dtype);
  if (fn == nullptr || !prepare_out(ctx, op, out, self.shape())) return;
  alignas(16) char elem[16] = {};
  const int es = element_size(out.dtype);
  fn(elem, static_cast<const char*>(value.data), 1, es, element_size(value.dtype));
  fill_elements(out.data, out.numel, elem, es);
}

// Scalar as torch's Scalar::to<int64_t>() (truncating a double); false if it does not fit.
bool scalar_to_int64(const Scalar& s, int64_t* v) {
  switch (s.kind) {
    case Scalar::Kind::Int: *v = s.i; return true;
    case Scalar::Kind::Bool: *v = s.b ? 1 : 0; return true;
    default:
      if (!(s.d >= -9223372036854775808.0 && s.d < 9223372036854775808.0)) return false;
      *v = static_cast<int64_t>(s.d);
      return true;
  }
}

// arange: torch's rules. Values are start + step * i computed in the dtype's
// accumulate type (int64 for integers, double for float/double, float for
// half/bfloat16); the length is ceil((end - start) / step), in int64 for an
// int64 result and in double otherwise.
void arange_into(KernelContext& ctx, const char* op, const Scalar& start, const Scalar& end, const Scalar& step,
                 Tensor& out) {
  const ScalarType dt = out.dtype;
  if (dt == ScalarType::Bool || !is_supported_dtype(dt)) {
    ctx.fail(Status::NotSupported, "%s: arange is not implemented for %s", op, dtype_str(dt));
    return;
  }
  const double ds = start.as_double(), de = end.as_double(), dst = step.as_double();
  if (!std::isfinite(ds) || !std::isfinite(de) || !std::isfinite(dst)) {
    ctx.fail(Status::InvalidArgument, "%s: unsupported range %g -> %g step %g", op, ds, de, dst);
    return;
  }
  const bool integral = !is_floating(dt);
  int64_t is = 0, ie = 0, istep = 0;
  if (integral && (!scalar_to_int64(start, &is) || !scalar_to_int64(end, &ie) || !scalar_to_int64(step, &istep))) {
    ctx.fail(Status::InvalidArgument, "%s: range does not fit in int64", op);
    return;
  }
  // checks in the accumulate type
  bool zero_step = false, consistent = true;
  if (integral) {
    zero_step = istep == 0;
    consistent = (istep > 0 && ie >= is) || (istep < 0 && ie <= is);
  } else if (dt == ScalarType::Half || dt == ScalarType::BFloat16) {
    const float fs = static_cast<float>(ds), fe = static_cast<float>(de), fst = static_cast<float>(dst);
    zero_step = fst == 0.0f;
    consistent = (fst > 0 && fe >= fs) || (fst < 0 && fe <= fs);
  } else {
    zero_step = dst == 0.0;
    consistent = (dst > 0 && de >= ds) || (dst < 0 && de <= ds);
  }
  if (zero_step) {
    ctx.fail(Status::InvalidArgument, "%s: step must be nonzero", op);
    return;
  }
  if (!consistent) {
    ctx.fail(Status::InvalidArgument, "%s: upper bound and lower bound inconsistent with step sign", op);
    return;
  }
  double size_d = 0;
  if (dt == ScalarType::Long) {
    const int64_t sgn = istep > 0 ? 1 : -1;
    int64_t span = 0;
    if (__builtin_sub_overflow(ie, is, &span) || __builtin_add_overflow(span, istep - sgn, &span)) {
      ctx.fail(Status::InvalidArgument, "%s: invalid size, possible overflow", op);
      return;
    }
    size_d = static_cast<double>(span / istep);
  } else {
    size_d = std::ceil((de - ds) / dst);
  }
  if (!(size_d >= 0 && size_d <= 9.0e18)) {
    ctx.fail(Status::InvalidArgument, "%s: invalid size, possible overflow", op);
    return;
  }
  const int64_t shape[1] = {static_cast<int64_t>(size_d)};
  if (!prepare_out(ctx, op, out, shape)) return;
  const int64_t n = shape[0];
  dispatch(dt, [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* p = out.data_as<T>();
    if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) {
      const float fs = static_cast<float>(ds), fst = static_cast<float>(dst);
      for (int64_t i = 0; i < n; ++i) p[i] = convert<T>(fs + fst * static_cast<float>(i));
    } else if constexpr (std::is_floating_point_v<T>) {
      for (int64_t i = 0; i < n; ++i) p[i] = static_cast<T>(ds + dst * static_cast<double>(i));
    } else {
      for (int64_t i = 0; i < n; ++i)
        p[i] = static_cast<T>(static_cast<int64_t>(static_cast<uint64_t>(is) +
                                                   static_cast<uint64_t>(istep) * static_cast<uint64_t>(i)));
    }
  });
}

void arange_out(KernelContext& ctx, Scalar end, Tensor& out) {
  Scalar start, step;
  step.i = 1;
  arange_into(ctx, "aten::arange.out", start, end, step, out);
}

void arange_start_out(KernelContext& ctx, Scalar start, Scalar end, Scalar step, Tensor& out) {
  arange_into(ctx, "aten::arange.start_out", start, end, step, out);
}

// constant_pad_nd: pad pairs (before, after) from the last dim backwards; negative pads crop.
void constant_pad_nd_out(KernelContext& ctx, const Tensor& self, IntArrayRef pad, Scalar value, Tensor& out) {
  const char* op = "aten::constant_pad_nd.out";
  if (!check_out_dtype(ctx, out, self.dtype, op) || !check_value_fits(ctx, op, value, self.dtype)) return;
  if (pad.size() % 2 != 0) {
    ctx.fail(Status::InvalidArgument, "%s: length of pad must be even, got %zu", op, pad.size());
    return;
  }
  if (pad.size() / 2 > static_cast<size_t>(self.dim)) {
    ctx.fail(Status::InvalidArgument, "%s: pad length %zu is more than twice the input's %d dimensions", op,
             pad.size(), self.dim);
    return;
  }
  const int n = self.dim;
  int64_t shape[kMaxDims], before[kMaxDims] = {}, after[kMaxDims] = {};
  for (int d = 0; d < n; ++d) shape[d] = self.sizes[d];
  for (size_t k = 0; k < pad.size() / 2; ++k) {
    const int d = n - 1 - static_cast<int>(k);
    before[d] = pad[2 * k];
    after[d] = pad[2 * k + 1];
    if (__builtin_add_overflow(shape[d], before[d], &shape[d]) ||
        __builtin_add_overflow(shape[d], after[d], &shape[d]) || shape[d] < 0) {
      ctx.fail(Status::InvalidArgument, "%s: the input size %lld plus padding %lld and %lld gives an invalid output "
               "size", op, static_cast<long long>(self.sizes[d]), static_cast<long long>(before[d]),
               static_cast<long long>(after[d]));
      return;
    }
  }
  const std::span<const int64_t> result{shape, static_cast<size_t>(n)};
  int64_t numel = 0;
  if (!checked_numel(ctx, op, result, &numel) || !prepare_out(ctx, op, out, result)) return;
  fill_out_with(ctx, op, value, out);
  if (!ctx.ok() || out.numel == 0) return;
  // the part of self that survives the cropping, and where it lands in out
  int64_t sizes[kMaxDims], sst[kMaxDims], dstd[kMaxDims], soff = 0, doff = 0;
  contiguous_strides(n, self.sizes, sst);
  contiguous_strides(n, shape, dstd);
  for (int d = 0; d < n; ++d) {
    const int64_t crop_lo = before[d] < 0 ? -before[d] : 0, crop_hi = after[d] < 0 ? -after[d] : 0;
    sizes[d] = self.sizes[d] - crop_lo - crop_hi;
    if (sizes[d] <= 0) return;
    soff += crop_lo * sst[d];
    doff += (before[d] > 0 ? before[d] : 0) * dstd[d];
  }
  copy_region(ctx, op, out, doff, dstd, self, soff, sst, n, sizes);
}

// tril / triu: self with zeros below (triu) or above (tril) the diagonal-th diagonal.
template <bool kLower>
void triangle_out(KernelContext& ctx, const Tensor& self, int64_t diagonal, Tensor& out) {
  const char* op = kLower ? "aten::tril.out" : "aten::triu.out";
  if (self.dim < 2) {
    ctx.fail(Status::InvalidArgument, "%s: input tensor must have at least 2 dimensions", op);
    return;
  }
  if (!prepare_same_dtype_out(ctx, op, self, out, self.shape())) return;
  const int64_t rows = self.sizes[self.dim - 2], cols = self.sizes[self.dim - 1];
  if (self.numel == 0) return;
  const int64_t es = element_size(self.dtype), batch = self.numel / (rows * cols);
  const int64_t bound = rows + cols + 1;  // diagonals beyond this behave alike; keeps i + diag from overflowing
  const int64_t diag = diagonal > bound ? bound : diagonal < -bound ? -bound : diagonal;
  const auto* s = static_cast<const char*>(self.data);
  auto* d = static_cast<char*>(out.data);
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t i = 0; i < rows; ++i) {
      const int64_t row = (b * rows + i) * cols * es;
      // kept columns: tril j <= i + diag, triu j >= i + diag
      int64_t lo = kLower ? 0 : i + diag, hi = kLower ? i + diag + 1 : cols;
      lo = lo < 0 ? 0 : lo > cols ? cols : lo;
      hi = hi < lo ? lo : hi > cols ? cols : hi;
      if (lo > 0) std::memset(d + row, 0, static_cast<size_t>(lo * es));
      if (hi > lo && d != s) std::memmove(d + row + lo * es, s + row + lo * es, static_cast<size_t>((hi - lo) * es));
      if (hi < cols) std::memset(d + row + hi * es, 0, static_cast<size_t>((cols - hi) * es));
    }
  }
}

}  // namespace

KILN_KERNEL(full_out, full_out);
KILN_KERNEL(full_like_out, full_like_out);
KILN_KERNEL(scalar_tensor_out, scalar_tensor_out);
KILN_KERNEL(fill_Scalar_out, fill_scalar_out);
KILN_KERNEL(fill_Tensor_out, fill_tensor_out);
KILN_KERNEL(arange_out, arange_out);
KILN_KERNEL(arange_start_out, arange_start_out);
KILN_KERNEL(constant_pad_nd_out, constant_pad_nd_out);
KILN_KERNEL(tril_out, triangle_out<true>);
KILN_KERNEL(triu_out, triangle_out<false>);

}  // namespace kiln::rt::kernels
