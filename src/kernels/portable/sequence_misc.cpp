// Elementwise and shape ops of the sequence/indexing family: remainder and fmod
// (Tensor and Scalar forms), clamp.Tensor_out, roll, unfold_copy, bucketize.
#include "util/elementwise_ops.h"
#include "util/register.h"
#include "util/shape_checks.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

namespace kiln::rt::kernels {
namespace {

// ---------------------------------------------------------------------------
// remainder (sign of the divisor, Python's %) and fmod (sign of the dividend, C's fmod)

template <bool kPython, typename C>
inline C mod_op(C x, C y, bool* zero) {
  if constexpr (std::is_floating_point_v<C>) {
    C r = std::fmod(x, y);
    if (kPython && r != 0 && ((r < 0) != (y < 0))) r += y;
    return r;
  } else if constexpr (std::is_same_v<C, bool>) {
    return x;  // unreachable: bool is rejected by the dtype set
  } else {
    if (y == 0) {
      *zero = true;
      return 0;
    }
    if constexpr (std::is_signed_v<C>) {
      if (y == -1) return 0;  // INT_MIN % -1 would trap
    }
    C r = static_cast<C>(x % y);
    if (kPython && r != 0 && ((r < 0) != (y < 0))) r = static_cast<C>(r + y);
    return r;
  }
}

template <bool kPython>
void mod_tensor_out(KernelContext& ctx, const TensorOrScalar& a, const TensorOrScalar& b, Tensor& out) {
  const char* name = kPython ? "aten::remainder.Tensor_out" : "aten::fmod.Tensor_out";
  bool zero = false;
  binary_tensor<kRealTypes>(ctx, {name}, a, b, out, [&](auto tag) {
    using C = typename decltype(tag)::type;
    bool* z = &zero;
    return [z](C x, C y) { return mod_op<kPython>(x, y, z); };
  });
  if (zero) ctx.fail(Status::InvalidArgument, "%s: ZeroDivisionError (integer modulo by zero)", name);
}

template <bool kPython>
void mod_scalar_out(KernelContext& ctx, const Tensor& a, Scalar s, Tensor& out) {
  const char* name = kPython ? "aten::remainder.Scalar_out" : "aten::fmod.Scalar_out";
  bool zero = false;
  binary_scalar<kRealTypes>(ctx, {name}, a, s, out, [&](auto tag) {
    using C = typename decltype(tag)::type;
    const C v = s.as<C>();
    bool* z = &zero;
    return [v, z](C x) { return mod_op<kPython>(x, v, z); };
  });
  if (zero) ctx.fail(Status::InvalidArgument, "%s: ZeroDivisionError (integer modulo by zero)", name);
}

// ---------------------------------------------------------------------------
// clamp.Tensor_out(self, Tensor? min, Tensor? max): broadcasting bounds; NaN propagates.

template <typename C>
inline C clamp_lo(C x, C lo) {
  if constexpr (std::is_floating_point_v<C>) {
    if (x != x || lo != lo) return x != x ? x : lo;
  }
  return x < lo ? lo : x;
}
template <typename C>
inline C clamp_hi(C x, C hi) {
  if constexpr (std::is_floating_point_v<C>) {
    if (x != x || hi != hi) return x != x ? x : hi;
  }
  return x > hi ? hi : x;
}

void clamp_tensor_out(KernelContext& ctx, const Tensor& a, const Tensor* lo, const Tensor* hi, Tensor& out) {
  const char* name = "aten::clamp.Tensor_out";
  ScalarType common;
  // bool too: torch clamps bool tensors by bool tensors (false < true), not by scalars
  if (!clamp_common(ctx, name, a, lo, hi, &common, kRealTypes | kBoolTypes) || !check_can_cast_out(ctx, common, out, name))
    return;
  int64_t shape[kMaxDims];
  int32_t nd;
  if (lo && hi) {
    if (!broadcast_tensors_shape(ctx, {&a, lo, hi}, shape, &nd, name)) return;
  } else if (!broadcast_tensors_shape(ctx, {&a, lo ? lo : hi}, shape, &nd, name)) {
    return;
  }
  if (!resize_out(ctx, out, {shape, static_cast<size_t>(nd)}, name)) return;
  dispatch<kRealTypes | kBoolTypes>(common, [&](auto tag) {
    using C = compute_t<typename decltype(tag)::type>;
    if (lo && hi) {
      const ElementwisePlan plan = make_plan(out, {&a, lo, hi});
      map_elements<C, C, C, C>(plan, [](C x, C l, C h) { return clamp_hi(clamp_lo(x, l), h); }, common);
    } else if (lo) {
      const ElementwisePlan plan = make_plan(out, {&a, lo});
      map_elements<C, C, C>(plan, [](C x, C l) { return clamp_lo(x, l); }, common);
    } else {
      const ElementwisePlan plan = make_plan(out, {&a, hi});
      map_elements<C, C, C>(plan, [](C x, C h) { return clamp_hi(x, h); }, common);
    }
  });
}

// ---------------------------------------------------------------------------
// roll.out(self, shifts, dims): dims empty rolls the flattened tensor.

void roll_out(KernelContext& ctx, const Tensor& self, IntArrayRef shifts, IntArrayRef dims, Tensor& out) {
  const char* op = "aten::roll.out";
  if (!check_out_dtype(ctx, out, self.dtype, op)) return;
  if (dims.empty() ? shifts.size() != 1 : shifts.size() != dims.size()) {
    ctx.fail(Status::InvalidArgument, "%s: shifts and dimensions must align (shifts %zu, dims %zu)", op, shifts.size(),
             dims.size());
    return;
  }
  if (!prepare_out(ctx, op, out, self.shape()) || !check_no_overlap(ctx, op, out, self, "self") || self.numel == 0)
    return;
  const int64_t es = element_size(self.dtype);
  const auto* src = static_cast<const char*>(self.data);
  auto* dst = static_cast<char*>(out.data);
  if (dims.empty()) {
    const int64_t n = self.numel;
    const int64_t s = ((shifts[0] % n) + n) % n;
    std::memcpy(dst + s * es, src, static_cast<size_t>((n - s) * es));
    std::memcpy(dst, src + (n - s) * es, static_cast<size_t>(s * es));
    return;
  }
  int64_t shift[kMaxDims] = {};
  for (size_t i = 0; i < dims.size(); ++i) {
    int64_t d;
    if (!normalize_dim(ctx, op, dims[i], self.dim, &d)) return;
    const int64_t size = self.dim == 0 ? 1 : self.sizes[d];
    shift[d] = (((shift[d] + shifts[i]) % size) + size) % size;
  }
  int64_t st[kMaxDims];
  contiguous_strides(self.dim, self.sizes, st);
  int64_t idx[kMaxDims] = {};
  for (int64_t i = 0; i < self.numel; ++i) {
    int64_t o = 0;
    for (int d = 0; d < self.dim; ++d) {
      int64_t j = idx[d] + shift[d];
      if (j >= self.sizes[d]) j -= self.sizes[d];
      o += j * st[d];
    }
    std::memcpy(dst + o * es, src + i * es, static_cast<size_t>(es));
    for (int d = self.dim - 1; d >= 0; --d) {
      if (++idx[d] < self.sizes[d]) break;
      idx[d] = 0;
    }
  }
}

// ---------------------------------------------------------------------------
// unfold_copy.out(self, dimension, size, step): windows of `size` every `step` along
// `dimension`, the window as a new last dim.

void unfold_copy_out(KernelContext& ctx, const Tensor& self, int64_t dimension, int64_t size, int64_t step,
                     Tensor& out) {
  const char* op = "aten::unfold_copy.out";
  int64_t d;
  if (!normalize_dim(ctx, op, dimension, self.dim, &d) || !check_out_dtype(ctx, out, self.dtype, op)) return;
  const int64_t len = self.dim == 0 ? 1 : self.sizes[d];
  if (size < 0 || size > len) {
    ctx.fail(Status::InvalidArgument, "%s: maximum size for tensor at dimension %lld is %lld but size is %lld", op,
             static_cast<long long>(d), static_cast<long long>(len), static_cast<long long>(size));
    return;
  }
  if (step <= 0) {
    ctx.fail(Status::InvalidArgument, "%s: step is %lld but must be > 0", op, static_cast<long long>(step));
    return;
  }
  if (self.dim + 1 > kMaxDims) {
    ctx.fail(Status::NotSupported, "%s: result would exceed %d dimensions", op, kMaxDims);
    return;
  }
  const int64_t windows = (len - size) / step + 1;
  int64_t shape[kMaxDims];
  for (int i = 0; i < self.dim; ++i) shape[i] = i == d ? windows : self.sizes[i];
  shape[self.dim == 0 ? 0 : self.dim] = size;
  const int out_rank = self.dim == 0 ? 1 : self.dim + 1;
  if (!prepare_out(ctx, op, out, {shape, static_cast<size_t>(out_rank)}) ||
      !check_no_overlap(ctx, op, out, self, "self") || out.numel == 0)
    return;
  int64_t outer = 1, inner = 1;
  for (int64_t i = 0; i < d; ++i) outer *= self.sizes[i];
  for (int64_t i = d + 1; i < self.dim; ++i) inner *= self.sizes[i];
  const int64_t es = element_size(self.dtype);
  const auto* src = static_cast<const char*>(self.data);
  auto* dst = static_cast<char*>(out.data);
  // out[o][w][i][j] = self[o][w*step + j][i]
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t w = 0; w < windows; ++w)
      for (int64_t i = 0; i < inner; ++i)
        for (int64_t j = 0; j < size; ++j, dst += es)
          std::memcpy(dst, src + ((o * len + w * step + j) * inner + i) * es, static_cast<size_t>(es));
}

// ---------------------------------------------------------------------------
// bucketize.Tensor_out(self, boundaries, out_int32, right): the index of each value's
// bucket in the sorted 1-D boundaries (right=False: boundaries[i-1] < x <= boundaries[i]).

void bucketize_out(KernelContext& ctx, const Tensor& self, const Tensor& boundaries, bool out_int32, bool right,
                   Tensor& out) {
  const char* op = "aten::bucketize.Tensor_out";
  if (boundaries.dim != 1) {
    ctx.fail(Status::InvalidArgument, "%s: boundaries tensor must be 1 dimension, got %d", op, boundaries.dim);
    return;
  }
  if (!check_out_dtype(ctx, out, out_int32 ? ScalarType::Int : ScalarType::Long, op)) return;
  ResultType rt;
  rt.add(self);
  rt.add(boundaries);
  const ScalarType common = rt.result();
  if (!check_common(ctx, common, kRealTypes, op)) return;
  if (!prepare_out(ctx, op, out, self.shape()) || !check_no_overlap(ctx, op, out, self, "self")) return;
  const int64_t nb = boundaries.numel;
  dispatch<kRealTypes>(common, [&](auto tag) {
    using C = compute_t<typename decltype(tag)::type>;
    alignas(64) C xs[kChunk];
    for (int64_t s = 0; s < self.numel; s += kChunk) {
      const int64_t m = std::min<int64_t>(kChunk, self.numel - s);
      load_as<C>(static_cast<const char*>(self.data) + s * element_size(self.dtype), self.dtype, 1, m, xs);
      for (int64_t i = 0; i < m; ++i) {
        const C x = xs[i];
        int64_t lo = 0, hi = nb;  // first boundary b with (right ? b > x : b >= x)
        while (lo < hi) {
          const int64_t mid = lo + (hi - lo) / 2;
          C b;
          load_as<C>(static_cast<const char*>(boundaries.data) + mid * element_size(boundaries.dtype), boundaries.dtype,
                     1, 1, &b);
          const bool go_right = right ? !(b > x) : (b < x);
          if (go_right) lo = mid + 1;
          else hi = mid;
        }
        if (out_int32) out.data_as<int32_t>()[s + i] = static_cast<int32_t>(lo);
        else out.data_as<int64_t>()[s + i] = lo;
      }
    }
  });
}

}  // namespace

KILN_KERNEL(remainder_Tensor_out, mod_tensor_out<true>);
KILN_KERNEL(remainder_Scalar_out, mod_scalar_out<true>);
KILN_KERNEL(fmod_Tensor_out, mod_tensor_out<false>);
KILN_KERNEL(fmod_Scalar_out, mod_scalar_out<false>);
KILN_KERNEL(clamp_Tensor_out, clamp_tensor_out);
KILN_KERNEL(roll_out, roll_out);
KILN_KERNEL(unfold_copy_out, unfold_copy_out);
KILN_KERNEL(bucketize_Tensor_out, bucketize_out);

}  // namespace kiln::rt::kernels
