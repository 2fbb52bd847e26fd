// Reduction geometry and chunked loads shared by the reduction kernels
// (reduce.cpp, softmax.cpp, layer_norm.cpp, cumsum.cpp): which dims a reduction
// covers and the out shape (ReducePlan), a tensor viewed as lines along one dim
// (Lines), chunk-by-chunk iteration over stack buffers, and sum accumulators
// (double for floating dtypes, wrapping int64 for integers).
#pragma once

#include "args.h"
#include "dtype.h"
#include "load_store.h"

#include <cstdint>
#include <span>
#include <type_traits>

namespace kiln::rt::kernels {

// ---------------------------------------------------------------------------
// Reduction geometry: which dims are reduced, the out shape, and iteration over
// the input offsets that make up each out element.

struct ReducePlan {
  int32_t n_kept = 0;
  int64_t kept_sizes[kMaxDims] = {};
  int64_t kept_strides[kMaxDims] = {};
  int32_t n_red = 0;  // reduced dims, size-1 dropped, neighbours merged
  int64_t red_sizes[kMaxDims] = {};
  int64_t red_strides[kMaxDims] = {};
  int64_t red_numel = 1;
  bool any_reduced_dim_empty = false;
  int32_t out_dim = 0;
  int64_t out_shape[kMaxDims] = {};

  std::span<const int64_t> out_sizes() const { return {out_shape, static_cast<size_t>(out_dim)}; }
};

// Marks the dims in `dims` in mask (an empty list: all dims, or none if !empty_is_all);
// duplicates and out-of-range dims fail.
inline bool parse_dims(KernelContext& ctx, std::span<const int64_t> dims, int32_t ndim, const char* name, bool* mask,
                       bool empty_is_all = true) {
  for (int32_t d = 0; d < kMaxDims; ++d) mask[d] = dims.empty() && empty_is_all;
  bool seen[kMaxDims + 1] = {};
  for (int64_t raw : dims) {
    int32_t d;
    if (!wrap_dim(ctx, raw, ndim, name, &d)) return false;
    if (seen[d]) {
      ctx.fail(Status::InvalidArgument, "%s: dim %d appears multiple times in the list of dims", name, d);
      return false;
    }
    seen[d] = true;
    mask[d] = true;
  }
  return true;
}

inline ReducePlan make_reduce_plan(const Tensor& in, const bool* mask, bool keepdim) {
  ReducePlan p;
  bool prev_reduced = false;
  for (int32_t d = 0; d < in.dim; ++d) {
    const int64_t sz = in.sizes[d];
    if (mask[d]) {
      if (keepdim) p.out_shape[p.out_dim++] = 1;
      if (sz == 0) p.any_reduced_dim_empty = true;
      p.red_numel *= sz;
      if (sz != 1) {
        if (prev_reduced && p.n_red > 0) {  // contiguous input: merge with the previous reduced dim
          p.red_sizes[p.n_red - 1] *= sz;
          p.red_strides[p.n_red - 1] = in.strides[d];
        } else {
          p.red_sizes[p.n_red] = sz;
          p.red_strides[p.n_red++] = in.strides[d];
        }
        prev_reduced = true;
      }
    } else {
      p.out_shape[p.out_dim++] = sz;
      if (sz != 1) {
        p.kept_sizes[p.n_kept] = sz;
        p.kept_strides[p.n_kept++] = in.strides[d];
        prev_reduced = false;
      }
    }
  }
  return p;
}

// Calls f(offset) for every index of an nd-dim odometer over sizes/strides
// (row-major, every size nonzero), offset = base + the index's strided sum.
template <typename F>
void for_each_offset(int32_t nd, const int64_t* sizes, const int64_t* strides, int64_t base, F&& f) {
  int64_t idx[kMaxDims] = {};
  for (;;) {
    f(base);
    int32_t d = nd - 1;
    for (; d >= 0; --d) {
      base += strides[d];
      if (++idx[d] < sizes[d]) break;
      base -= strides[d] * sizes[d];
      idx[d] = 0;
    }
    if (d < 0) return;
  }
}

// Calls f(k, base) for each out element k (row-major), base = its first input offset.
template <typename F>
void for_each_out(const ReducePlan& p, F&& f) {
  int64_t k = 0;
  for_each_offset(p.n_kept, p.kept_sizes, p.kept_strides, 0, [&](int64_t base) { f(k++, base); });
}

// Calls f(offset, stride, n) for each innermost row of the reduced elements from base, in row-major order.
template <typename F>
void for_each_reduced_row(const ReducePlan& p, int64_t base, F&& f) {
  if (p.n_red == 0) {
    f(base, int64_t{1}, int64_t{1});
    return;
  }
  const int32_t inner = p.n_red - 1;
  for_each_offset(inner, p.red_sizes, p.red_strides, base,
                  [&](int64_t off) { f(off, p.red_strides[inner], p.red_sizes[inner]); });
}

// ---------------------------------------------------------------------------
// Along-one-dim ops: the tensor viewed as [outer, n, inner]; each line has stride `inner`.

struct Lines {
  int64_t outer = 1, n = 1, inner = 1;
};

inline Lines lines_along(const Tensor& t, int32_t dim) {
  Lines l;
  for (int32_t d = 0; d < t.dim; ++d) {
    if (d < dim) l.outer *= t.sizes[d];
    else if (d == dim) l.n = t.sizes[d];
    else l.inner *= t.sizes[d];
  }
  return l;
}

// Calls f(offset) with the first element offset of every line.
template <typename F>
void for_each_line(const Lines& l, F&& f) {
  for (int64_t o = 0; o < l.outer; ++o)
    for (int64_t i = 0; i < l.inner; ++i) f(o * l.n * l.inner + i);
}

// ---------------------------------------------------------------------------
// Chunked access: n elements processed kChunk at a time through stack buffers.

// Calls f(s, m) for the chunks [s, s + m) of [0, n), m <= kChunk. When f returns
// bool, false stops the iteration.
template <typename F>
void for_each_chunk(int64_t n, F&& f) {
  for (int64_t s = 0; s < n; s += kChunk) {
    const int64_t m = n - s < kChunk ? n - s : kChunk;
    if constexpr (std::is_same_v<decltype(f(s, m)), bool>) {
      if (!f(s, m)) return;
    } else {
      f(s, m);
    }
  }
}

inline const char* elem_ptr(const Tensor& t, int64_t offset) {
  return static_cast<const char*>(t.data) + offset * element_size(t.dtype);
}
inline char* elem_ptr(Tensor& t, int64_t offset) { return static_cast<char*>(t.data) + offset * element_size(t.dtype); }

// Loads m elements of `in` at offset (stride) as C, rounded to dtype `as` first
// when the input has another dtype (torch converts the input to the compute dtype).
template <typename C>
void load_chunk(const Tensor& in, int64_t offset, int64_t stride, int64_t m, ScalarType as, C* buf) {
  load_as<C>(elem_ptr(in, offset), in.dtype, stride, m, buf);
  if constexpr (std::is_same_v<C, float> || std::is_same_v<C, double>) {
    if (in.dtype != as && (as == ScalarType::Half || as == ScalarType::BFloat16 || as == ScalarType::Float)) {
      for (int64_t i = 0; i < m; ++i) {
        float f = static_cast<float>(buf[i]);
        if (as == ScalarType::Half) f = half_bits_to_float(float_to_half_bits(f));
        else if (as == ScalarType::BFloat16) f = bf16_bits_to_float(float_to_bf16_bits(f));
        buf[i] = static_cast<C>(f);
      }
    }
  }
}

// ---------------------------------------------------------------------------
// Sums in compute dtype T.

// The accumulator: double for floating, wrapping int64 for integral (and bool).
template <typename T>
using sum_acc_t = std::conditional_t<is_float_v<T>, double, int64_t>;
// What input values are loaded as before they are added: double for floating
// and bool, int64 for integers.
template <typename T>
using sum_load_t = std::conditional_t<is_float_v<T> || std::is_same_v<T, bool>, double, int64_t>;

template <typename A>
inline A acc_add(A a, A b) {
  if constexpr (std::is_same_v<A, int64_t>) {
    return static_cast<int64_t>(static_cast<uint64_t>(a) + static_cast<uint64_t>(b));
  } else {
    return a + b;
  }
}

// acc + v, v a loaded value (sum_load_t<T>) taken as T first (bool: nonzero is 1;
// integers wrap as T, then the int64 sum wraps).
template <typename T>
inline sum_acc_t<T> add_as(sum_acc_t<T> acc, sum_load_t<T> v) {
  using A = sum_acc_t<T>;
  if constexpr (std::is_same_v<T, bool>) return acc_add<A>(acc, v != 0);
  else if constexpr (is_int_v<T>) return acc_add<A>(acc, static_cast<int64_t>(static_cast<T>(v)));
  else return acc + v;
}

}  // namespace kiln::rt::kernels
