// Elementwise iteration over a broadcast shape for kiln's portable kernels: an
// ElementwisePlan (the out and up to three inputs, strided in the out's index
// space), its innermost rows, and map_elements (a typed op over a plan, with
// dtype conversion chunk by chunk).
#pragma once

#include "load_store.h"

#include <array>
#include <cstdint>
#include <initializer_list>
#include <tuple>
#include <utility>

namespace kiln::rt::kernels {

// Elementwise iteration over a broadcast shape.
//
// An ElementwisePlan holds the out tensor (operand 0) and up to three inputs,
// each with element strides in the out's index space (0 along broadcast dims),
// with dims of size 1 dropped and mergeable neighbours merged, so the innermost
// dim is as long as possible.

constexpr int kMaxOperands = 4;

struct Operand {
  char* data = nullptr;
  ScalarType dtype = ScalarType::Float;
  int64_t esize = 4;
  int64_t strides[kMaxDims] = {};
};

struct ElementwisePlan {
  int32_t ndim = 0;
  int64_t sizes[kMaxDims] = {};
  int nops = 0;
  Operand ops[kMaxOperands];
  int64_t numel = 1;
};

// Builds the plan for out (already shaped to the broadcast shape) and inputs
// (each broadcastable to it). A Scalar operand can be passed as a 0-dim tensor.
inline ElementwisePlan make_plan(const Tensor& out, std::initializer_list<const Tensor*> inputs) {
  ElementwisePlan p;
  p.nops = 1 + static_cast<int>(inputs.size());
  const Tensor* all[kMaxOperands] = {&out};
  int k = 1;
  for (const Tensor* t : inputs) all[k++] = t;
  int32_t nd = out.dim;
  p.numel = out.numel;
  // raw strides per operand in out index space
  int64_t raw[kMaxOperands][kMaxDims];
  for (int o = 0; o < p.nops; ++o) {
    const Tensor& t = *all[o];
    p.ops[o].data = static_cast<char*>(t.data);
    p.ops[o].dtype = t.dtype;
    p.ops[o].esize = element_size(t.dtype);
    for (int32_t d = 0; d < nd; ++d) {
      int32_t td = d - (nd - t.dim);
      raw[o][d] = (td < 0 || t.sizes[td] == 1) ? 0 : t.strides[td];
    }
  }
  // drop size-1 dims and merge dim d into the previous kept one when every operand allows it
  p.ndim = 0;
  for (int32_t d = 0; d < nd; ++d) {
    int64_t sz = out.sizes[d];
    if (sz == 1) continue;
    if (p.ndim > 0) {
      int32_t prev = p.ndim - 1;
      bool merge = true;
      for (int o = 0; o < p.nops && merge; ++o) merge = p.ops[o].strides[prev] == raw[o][d] * sz;
      if (merge) {
        p.sizes[prev] *= sz;
        for (int o = 0; o < p.nops; ++o) p.ops[o].strides[prev] = raw[o][d];
        continue;
      }
    }
    p.sizes[p.ndim] = sz;
    for (int o = 0; o < p.nops; ++o) p.ops[o].strides[p.ndim] = raw[o][d];
    ++p.ndim;
  }
  if (p.ndim == 0) {  // a single element
    p.ndim = 1;
    p.sizes[0] = 1;
    for (int o = 0; o < p.nops; ++o) p.ops[o].strides[0] = 0;
  }
  return p;
}

// Calls fn(ptrs, inner_strides, n) for every innermost row of the plan: ptrs[o]
// points at the row's first element of operand o; inner_strides[o] in elements.
template <typename Fn>
inline void for_each_row(const ElementwisePlan& p, Fn&& fn) {
  if (p.numel == 0) return;
  const int32_t inner = p.ndim - 1;
  int64_t idx[kMaxDims] = {};
  char* ptrs[kMaxOperands];
  int64_t inner_strides[kMaxOperands];
  for (int o = 0; o < p.nops; ++o) {
    ptrs[o] = p.ops[o].data;
    inner_strides[o] = p.ops[o].strides[inner];
  }
  const int64_t n = p.sizes[inner];
  for (;;) {
    fn(static_cast<char* const*>(ptrs), static_cast<const int64_t*>(inner_strides), n);
    int32_t d = inner - 1;
    for (; d >= 0; --d) {
      for (int o = 0; o < p.nops; ++o) ptrs[o] += p.ops[o].strides[d] * p.ops[o].esize;
      if (++idx[d] < p.sizes[d]) break;
      for (int o = 0; o < p.nops; ++o) ptrs[o] -= p.ops[o].strides[d] * p.ops[o].esize * p.sizes[d];
      idx[d] = 0;
    }
    if (d < 0) return;
  }
}

namespace detail {

// The per-chunk loops: a multiple-of-8 part (which vectorizes) and a short remainder.
template <typename R, typename A, typename Op>
inline void run1(R* __restrict o, const A* __restrict a, int64_t m, Op& op) {
  const int64_t mv = round_down8(m);
  for (int64_t i = 0; i < mv; ++i) o[i] = op(a[i]);
  for (int64_t i = mv; i < m; ++i) o[i] = op(a[i]);
}
template <typename R, typename A, typename B, typename Op>
inline void run2(R* __restrict o, const A* __restrict a, const B* __restrict b, int64_t m, Op& op) {
  const int64_t mv = round_down8(m);
  for (int64_t i = 0; i < mv; ++i) o[i] = op(a[i], b[i]);
  for (int64_t i = mv; i < m; ++i) o[i] = op(a[i], b[i]);
}
template <typename R, typename A, typename B, typename C, typename Op>
inline void run3(R* __restrict o, const A* __restrict a, const B* __restrict b, const C* __restrict c, int64_t m,
                 Op& op) {
  const int64_t mv = round_down8(m);
  for (int64_t i = 0; i < mv; ++i) o[i] = op(a[i], b[i], c[i]);
  for (int64_t i = mv; i < m; ++i) o[i] = op(a[i], b[i], c[i]);
}

template <typename R, typename... In, typename Op>
inline void run(R* o, const std::tuple<const In*...>& in, int64_t m, Op& op) {
  if constexpr (sizeof...(In) == 1) run1(o, std::get<0>(in), m, op);
  else if constexpr (sizeof...(In) == 2) run2(o, std::get<0>(in), std::get<1>(in), m, op);
  else run3(o, std::get<0>(in), std::get<1>(in), std::get<2>(in), m, op);
}

// m values of operand data at p (inner stride `stride`) as In: the tensor memory
// itself when it already holds In contiguously, else converted into buf.
template <typename In>
inline const In* fetch(const char* p, ScalarType dt, int64_t stride, int64_t m, In* buf) {
  // (bool tensors always go through load_as, which reads their bytes as bytes)
  if (stride == 1 && same_storage<In>(dt) && !std::is_same_v<In, bool>) return reinterpret_cast<const In*>(p);
  if (stride == 0) {
    In v{};
    load_as<In>(p, dt, 1, 1, &v);
    for (int64_t j = 0; j < m; j += 8)  // whole blocks of 8 (buf holds kChunk, a multiple of 8): they vectorize
      for (int k = 0; k < 8; ++k) buf[j + k] = v;
    return buf;
  }
  load_as<In>(p, dt, stride, m, buf);
  return buf;
}

}  // namespace detail

// Runs out[i] = op(in0[i], ...) over a plan. The op takes each input as In...
// (inputs are converted from their dtypes) and returns R, which is converted to
// the out dtype; when `round_through` is a reduced float dtype different from
// the out's, results are first rounded to it (torch computes in the common
// dtype, then casts to out).
template <typename R, typename... In, typename Op>
inline void map_elements(const ElementwisePlan& p, Op op, ScalarType round_through = kNoDtype) {
  static_assert(sizeof...(In) >= 1 && sizeof...(In) <= 3, "1 to 3 inputs");
  std::tuple<std::array<In, kChunk>...> bufs;
  alignas(64) R obuf[kChunk];
  const bool round = p.ops[0].dtype != round_through &&
                     (round_through == ScalarType::Half || round_through == ScalarType::BFloat16);
  for_each_row(p, [&](char* const* ptrs, const int64_t* strides, int64_t n) {
    for (int64_t s = 0; s < n; s += kChunk) {
      const int64_t m = n - s < kChunk ? n - s : kChunk;
      auto in = [&]<size_t... I>(std::index_sequence<I...>) {
        return std::tuple<const In*...>(detail::fetch<In>(
            ptrs[I + 1] + s * strides[I + 1] * p.ops[I + 1].esize, p.ops[I + 1].dtype, strides[I + 1], m,
            std::get<I>(bufs).data())...);
      }(std::index_sequence_for<In...>{});
      const bool direct = !round && strides[0] == 1 && same_storage<R>(p.ops[0].dtype);
      R* o = direct ? reinterpret_cast<R*>(ptrs[0]) + s : obuf;
      detail::run<R, In...>(o, in, m, op);
      if (!direct) {
        if (round) round_to_dtype(obuf, m, round_through);
        store_as<R>(obuf, ptrs[0] + s * strides[0] * p.ops[0].esize, p.ops[0].dtype, strides[0], m);
      }
    }
  });
}

}  // namespace kiln::rt::kernels
