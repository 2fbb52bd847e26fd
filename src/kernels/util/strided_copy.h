// Strided copies and fills for the kernels that move data: a copy engine over
// any strides (contiguous runs become memcpy, transposes go by tiles), typed row
// conversion between dtypes, scalar-to-element stores with torch's overflow check,
// whole-tensor and region copies with conversion.
// Dtypes, Scalar and conversions are util/kernel_util.h's. Nothing here allocates.
#pragma once

#include "util/kernel_util.h"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <span>
#include <type_traits>
#include <utility>

namespace kiln::rt::kernels {

// Converts n elements; steps are in bytes between consecutive elements.
using ConvertRowFn = void (*)(char* dst, const char* src, int64_t n, int64_t dst_step, int64_t src_step);

template <typename D, typename S>
void convert_row(char* dst, const char* src, int64_t n, int64_t dst_step, int64_t src_step) {
  if (dst_step == static_cast<int64_t>(sizeof(D)) && src_step == static_cast<int64_t>(sizeof(S))) {
    for (int64_t i = 0; i < n; ++i) {
      S s;
      std::memcpy(&s, src + i * static_cast<int64_t>(sizeof(S)), sizeof(S));
      D d = convert<D>(s);
      std::memcpy(dst + i * static_cast<int64_t>(sizeof(D)), &d, sizeof(D));
    }
    return;
  }
  for (int64_t i = 0; i < n; ++i) {
    S s;
    std::memcpy(&s, src + i * src_step, sizeof(S));
    D d = convert<D>(s);
    std::memcpy(dst + i * dst_step, &d, sizeof(D));
  }
}

// complex64 / complex128 elements: a pair of float / double. kiln computes nothing in complex; only the
// conversions below (the copies that opt in with KILN_KERNEL_COMPLEX) read or write them, as torch converts:
// a real value becomes (value, 0); a complex value becomes its real part (torch drops the imaginary part, with
// a warning), or for bool "either part is not zero"; complex to complex converts each part.
template <typename C>
struct ComplexPair {
  C re, im;
};
template <typename T>
inline constexpr bool is_complex_pair_v = false;
template <typename C>
inline constexpr bool is_complex_pair_v<ComplexPair<C>> = true;

template <typename D, typename S>
inline D convert_complex(S s) {
  if constexpr (is_complex_pair_v<D> && is_complex_pair_v<S>) {
    using C = decltype(D::re);
    return D{static_cast<C>(s.re), static_cast<C>(s.im)};
  } else if constexpr (is_complex_pair_v<D>) {
    using C = decltype(D::re);
    return D{convert<C>(s), C(0)};
  } else if constexpr (std::is_same_v<D, bool>) {
    return s.re != 0 || s.im != 0;
  } else {
    return convert<D>(s.re);
  }
}

template <typename D, typename S>
void convert_complex_row(char* dst, const char* src, int64_t n, int64_t dst_step, int64_t src_step) {
  for (int64_t i = 0; i < n; ++i) {
    S s;
    std::memcpy(&s, src + i * src_step, sizeof(S));
    const D d = convert_complex<D>(s);
    std::memcpy(dst + i * dst_step, &d, sizeof(D));
  }
}

// f(TypeTag<ComplexPair<C>>{}) for complex64 / complex128; false for any other dtype.
template <typename F>
inline bool dispatch_complex(ScalarType dt, F&& f) {
  if (dt == ScalarType::ComplexFloat) {
    f(TypeTag<ComplexPair<float>>{});
    return true;
  }
  if (dt == ScalarType::ComplexDouble) {
    f(TypeTag<ComplexPair<double>>{});
    return true;
  }
  return false;
}

// f(TypeTag<T>{}) for any computable dtype or complex64 / complex128.
template <typename F>
inline bool dispatch_with_complex(ScalarType dt, F&& f) {
  return dispatch_complex(dt, f) || dispatch(dt, f);
}

// nullptr if either dtype is not computable (complex converts to and from every computable dtype).
inline ConvertRowFn convert_row_fn(ScalarType dst, ScalarType src) {
  ConvertRowFn fn = nullptr;
  if (is_complex_dtype(dst) || is_complex_dtype(src)) {
    dispatch_with_complex(dst, [&](auto dt) {
      dispatch_with_complex(src, [&](auto st) {
        using D = typename decltype(dt)::type;
        using S = typename decltype(st)::type;
        if constexpr (is_complex_pair_v<D> || is_complex_pair_v<S>) fn = &convert_complex_row<D, S>;
      });
    });
    return fn;
  }
  dispatch(dst, [&](auto dt) {
    dispatch(src, [&](auto st) { fn = &convert_row<typename decltype(dt)::type, typename decltype(st)::type>; });
  });
  return fn;
}

// convert_row_fn, failing through ctx when there is none.
inline ConvertRowFn checked_convert_row_fn(KernelContext& ctx, const char* op, ScalarType dst, ScalarType src) {
  ConvertRowFn fn = convert_row_fn(dst, src);
  if (fn == nullptr)
    ctx.fail(Status::NotSupported, "%s: conversion from %s to %s is not supported", op, dtype_str(src),
             dtype_str(dst));
  return fn;
}

// ---------------------------------------------------------------------------
// Scalars as elements

// Writes `s` as one element of `dtype` at dst; false if dtype is not computable.
inline bool scalar_to_element(const Scalar& s, ScalarType dtype, void* dst) {
  return dispatch(dtype, [&](auto tag) {
    using D = typename decltype(tag)::type;
    D v;
    switch (s.kind) {
      case Scalar::Kind::Int: v = convert<D>(s.i); break;
      case Scalar::Kind::Double: v = convert<D>(s.d); break;
      default: v = convert<D>(s.b); break;
    }
    std::memcpy(dst, &v, sizeof(D));
  });
}

// torch's overflow check when a Scalar becomes an element of `dtype`
// (c10::checked_convert): true when the value fits.
inline bool scalar_fits(const Scalar& s, ScalarType dtype) {
  if (s.kind == Scalar::Kind::Bool || dtype == ScalarType::Bool) return true;
  double lo = 0, hi = 0;
  switch (dtype) {
    case ScalarType::Byte: lo = 0; hi = 255; break;
    case ScalarType::Char: lo = -128; hi = 127; break;
    case ScalarType::Short: lo = -32768; hi = 32767; break;
    case ScalarType::Int: lo = -2147483648.0; hi = 2147483647.0; break;
    case ScalarType::Long:
      if (s.kind == Scalar::Kind::Int) return true;
      return s.d >= -9223372036854775808.0 && s.d < 9223372036854775808.0;
    case ScalarType::Half: lo = -65504.0; hi = 65504.0; break;
    case ScalarType::BFloat16: lo = -3.3895313892515355e38; hi = 3.3895313892515355e38; break;
    case ScalarType::Float:
      lo = -static_cast<double>(std::numeric_limits<float>::max());
      hi = static_cast<double>(std::numeric_limits<float>::max());
      break;
    case ScalarType::Double: return true;
    default: return false;
  }
  if (s.kind == Scalar::Kind::Int) {
    // unsigned targets accept negatives down to -max (c10's rule, e.g. -1 -> 255)
    if (dtype == ScalarType::Byte) return s.i >= -255 && s.i <= 255;
    double v = static_cast<double>(s.i);
    return v >= lo && v <= hi;
  }
  if (std::isinf(s.d)) return is_floating(dtype);
  if (std::isnan(s.d)) return is_floating(dtype);
  return s.d >= lo && s.d <= hi;
}

inline int64_t product(std::span<const int64_t> s) {
  int64_t p = 1;
  for (int64_t v : s) p *= v;
  return p;
}

// Contiguous (row-major) strides of a shape, in elements.
inline void contiguous_strides(int ndim, const int64_t* sizes, int64_t* strides) {
  int64_t s = 1;
  for (int d = ndim - 1; d >= 0; --d) {
    strides[d] = s;
    s *= sizes[d] == 0 ? 1 : sizes[d];
  }
}

// Reads element i of an int64 or int32 index tensor.
inline int64_t read_index(const Tensor& t, int64_t i) {
  return t.dtype == ScalarType::Long ? t.data_as<const int64_t>()[i] : t.data_as<const int32_t>()[i];
}

inline bool check_index_dtype(KernelContext& ctx, const char* op, const char* name, const Tensor& t) {
  if (t.dtype != ScalarType::Long && t.dtype != ScalarType::Int) {
    ctx.fail(Status::InvalidArgument, "%s: %s must be an int64 or int32 tensor, got %s", op, name,
             dtype_str(t.dtype));
    return false;
  }
  return true;
}

// ---------------------------------------------------------------------------
// Fills

// n copies of the element at `elem` (es bytes) at dst.
inline void fill_elements(void* dst, int64_t n, const void* elem, int es) {
  if (n <= 0) return;
  auto* d = static_cast<unsigned char*>(dst);
  const auto* e = static_cast<const unsigned char*>(elem);
  bool uniform = true;
  for (int i = 1; i < es; ++i) uniform = uniform && e[i] == e[0];
  const size_t total = static_cast<size_t>(n) * static_cast<size_t>(es);
  if (uniform) {
    std::memset(d, e[0], total);
    return;
  }
  std::memcpy(d, e, static_cast<size_t>(es));
  size_t done = static_cast<size_t>(es);
  while (done < total) {
    size_t chunk = done < total - done ? done : total - done;
    std::memcpy(d + done, d, chunk);
    done += chunk;
  }
}

// ---------------------------------------------------------------------------
// Strided copy engine: dst[i...] = src[i...] over an n-d index space, each side
// with its own strides. Dims of size 1 are dropped and dims contiguous on both
// sides merged, so contiguous runs become single memcpy calls.

constexpr int kMaxPlanDims = 2 * kMaxDims;

struct StridedPlan {
  int ndim = 0;
  bool empty = false;
  int64_t sizes[kMaxPlanDims];
  int64_t dst_step[kMaxPlanDims];  // bytes
  int64_t src_step[kMaxPlanDims];  // bytes
};

// Dims outer to inner; strides in elements of each side's element size.
inline void plan_strided(StridedPlan& p, int ndim, const int64_t* sizes, const int64_t* dst_strides,
                         int64_t dst_elem, const int64_t* src_strides, int64_t src_elem) {
  p.ndim = 0;
  p.empty = false;
  for (int d = 0; d < ndim; ++d) {
    if (sizes[d] == 0) {
      p.empty = true;
      return;
    }
    if (sizes[d] == 1) continue;
    const int64_t ds = dst_strides[d] * dst_elem, ss = src_strides[d] * src_elem;
    if (p.ndim > 0) {
      const int k = p.ndim - 1;
      if (p.dst_step[k] == ds * sizes[d] && p.src_step[k] == ss * sizes[d]) {
        p.sizes[k] *= sizes[d];
        p.dst_step[k] = ds;
        p.src_step[k] = ss;
        continue;
      }
    }
    p.sizes[p.ndim] = sizes[d];
    p.dst_step[p.ndim] = ds;
    p.src_step[p.ndim] = ss;
    ++p.ndim;
  }
  if (p.ndim == 0) {
    p.ndim = 1;
    p.sizes[0] = 1;
    p.dst_step[0] = dst_elem;
    p.src_step[0] = src_elem;
  }
}

// Calls block(dst_offset, src_offset) (bytes) for every index of dims [0, outer).
template <typename Block>
void for_each_outer(const StridedPlan& p, int outer, Block&& block) {
  int64_t idx[kMaxPlanDims] = {};
  int64_t doff = 0, soff = 0;
  for (;;) {
    block(doff, soff);
    int d = outer - 1;
    for (; d >= 0; --d) {
      doff += p.dst_step[d];
      soff += p.src_step[d];
      if (++idx[d] < p.sizes[d]) break;
      idx[d] = 0;
      doff -= p.dst_step[d] * p.sizes[d];
      soff -= p.src_step[d] * p.sizes[d];
    }
    if (d < 0) return;
  }
}

template <size_t E>
void copy_row(char* dst, const char* src, int64_t n, int64_t ds, int64_t ss) {
  constexpr auto e = static_cast<int64_t>(E);
  if (ds == e && ss == e) {
    std::memcpy(dst, src, static_cast<size_t>(n) * E);
  } else if (ss == 0 && ds == e) {
    fill_elements(dst, n, src, static_cast<int>(E));
  } else {
    for (int64_t i = 0; i < n; ++i) std::memcpy(dst + i * ds, src + i * ss, E);
  }
}

template <size_t E>
void copy_tile(char* dst, const char* src, int64_t rows, int64_t cols, int64_t d_row, int64_t s_row, int64_t d_col,
               int64_t s_col) {
  constexpr int64_t kTile = 16;  // small enough that power-of-two strides do not thrash L1
  for (int64_t r0 = 0; r0 < rows; r0 += kTile) {
    const int64_t r1 = r0 + kTile < rows ? r0 + kTile : rows;
    for (int64_t c0 = 0; c0 < cols; c0 += kTile) {
      const int64_t c1 = c0 + kTile < cols ? c0 + kTile : cols;
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = c0; c < c1; ++c) std::memcpy(dst + r * d_row + c * d_col, src + r * s_row + c * s_col, E);
    }
  }
}

template <size_t E>
void run_copy_plan(StridedPlan& p, char* dst, const char* src) {
  constexpr auto e = static_cast<int64_t>(E);
  const int last = p.ndim - 1;
  // A transpose-like copy (dst contiguous along `last`, src contiguous along
  // another dim): move that dim next to `last` and copy 2-d tiles.
  if (p.ndim >= 2 && p.dst_step[last] == e && p.src_step[last] != e && p.sizes[last] >= 8) {
    int j = -1;
    for (int d = 0; d < last; ++d)
      if (p.src_step[d] == e && p.sizes[d] >= 8) j = d;
    if (j >= 0) {
      const int k = last - 1;
      std::swap(p.sizes[j], p.sizes[k]);
      std::swap(p.dst_step[j], p.dst_step[k]);
      std::swap(p.src_step[j], p.src_step[k]);
      const int64_t rows = p.sizes[k], cols = p.sizes[last];
      const int64_t d_row = p.dst_step[k], s_row = p.src_step[k], s_col = p.src_step[last];
      for_each_outer(p, k, [&](int64_t doff, int64_t soff) {
        copy_tile<E>(dst + doff, src + soff, rows, cols, d_row, s_row, e, s_col);
      });
      return;
    }
  }
  const int64_t n = p.sizes[last], ds = p.dst_step[last], ss = p.src_step[last];
  for_each_outer(p, last, [&](int64_t doff, int64_t soff) { copy_row<E>(dst + doff, src + soff, n, ds, ss); });
}

// Copies (same dtype, element size es) according to the plan.
inline void copy_with_plan(StridedPlan& p, void* dst, const void* src, int es) {
  if (p.empty) return;
  auto* d = static_cast<char*>(dst);
  const auto* s = static_cast<const char*>(src);
  switch (es) {
    case 1: run_copy_plan<1>(p, d, s); break;
    case 2: run_copy_plan<2>(p, d, s); break;
    case 4: run_copy_plan<4>(p, d, s); break;
    case 8: run_copy_plan<8>(p, d, s); break;
    default: run_copy_plan<16>(p, d, s); break;
  }
}

// Converts (any computable dtypes) according to the plan.
inline void convert_with_plan(const StridedPlan& p, void* dst, const void* src, ConvertRowFn fn) {
  if (p.empty) return;
  auto* d = static_cast<char*>(dst);
  const auto* s = static_cast<const char*>(src);
  const int last = p.ndim - 1;
  const int64_t n = p.sizes[last], ds = p.dst_step[last], ss = p.src_step[last];
  for_each_outer(p, last, [&](int64_t doff, int64_t soff) { fn(d + doff, s + soff, n, ds, ss); });
}

// Reads a strided view of `src` (sizes/strides in elements, starting `offset`
// elements in) into contiguous dst of the same dtype.
inline void gather_view(void* dst, const Tensor& src, int ndim, const int64_t* sizes, const int64_t* strides,
                        int64_t offset) {
  int64_t dst_strides[kMaxPlanDims];
  contiguous_strides(ndim, sizes, dst_strides);
  StridedPlan p;
  const int es = element_size(src.dtype);
  plan_strided(p, ndim, sizes, dst_strides, es, strides, es);
  copy_with_plan(p, dst, static_cast<const char*>(src.data) + offset * es, es);
}


// ---------------------------------------------------------------------------
// Whole-tensor copies (contiguous tensors)

// out <- self, same dtype and element count (any shapes).
inline void copy_bytes(const Tensor& self, Tensor& out) {
  if (self.numel > 0 && out.data != self.data) std::memmove(out.data, self.data, self.nbytes());
}

// out <- src converted to out's dtype, same element count.
inline bool convert_into(KernelContext& ctx, const char* op, const Tensor& src, Tensor& out) {
  if (src.dtype == out.dtype) {
    copy_bytes(src, out);
    return true;
  }
  ConvertRowFn fn = checked_convert_row_fn(ctx, op, out.dtype, src.dtype);
  if (fn == nullptr) return false;
  if (src.numel > 0)
    fn(static_cast<char*>(out.data), static_cast<const char*>(src.data), src.numel, element_size(out.dtype),
       element_size(src.dtype));
  return true;
}

// Copies a strided region of `src` into a strided region of `dst` (sizes,
// strides and offsets in elements), converting when the dtypes differ.
inline bool copy_region(KernelContext& ctx, const char* op, Tensor& dst, int64_t dst_offset,
                        const int64_t* dst_strides, const Tensor& src, int64_t src_offset,
                        const int64_t* src_strides, int ndim, const int64_t* sizes) {
  const int des = element_size(dst.dtype), ses = element_size(src.dtype);
  StridedPlan p;
  plan_strided(p, ndim, sizes, dst_strides, des, src_strides, ses);
  if (p.empty) return true;
  char* d = static_cast<char*>(dst.data) + dst_offset * des;
  const char* s = static_cast<const char*>(src.data) + src_offset * ses;
  if (dst.dtype == src.dtype) {
    copy_with_plan(p, d, s, des);
    return true;
  }
  ConvertRowFn fn = checked_convert_row_fn(ctx, op, dst.dtype, src.dtype);
  if (fn == nullptr) return false;
  convert_with_plan(p, d, s, fn);
  return true;
}

// Strides of a contiguous tensor of shape (src_dim, src_sizes) broadcast
// (right-aligned) to `shape`; false if it does not broadcast.
inline bool broadcast_strides(int src_dim, const int64_t* src_sizes, int ndim, const int64_t* shape,
                              int64_t* strides) {
  if (src_dim > ndim) return false;
  int64_t own[kMaxDims];
  contiguous_strides(src_dim, src_sizes, own);
  const int lead = ndim - src_dim;
  for (int d = 0; d < ndim; ++d) {
    if (d < lead) {
      strides[d] = 0;
      continue;
    }
    const int64_t s = src_sizes[d - lead];
    if (s == shape[d]) strides[d] = s == 1 ? 0 : own[d - lead];
    else if (s == 1) strides[d] = 0;
    else return false;
  }
  return true;
}

}  // namespace kiln::rt::kernels
