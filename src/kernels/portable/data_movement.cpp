// Data movement kernels: materialized views (view/permute/expand/slice/...),
// copies and dtype conversion, concatenation and splitting, indexing and
// embedding lookup, and constant fills (full, arange, padding).
//
// Inputs and outs are contiguous. Copies move bytes (dtype-agnostic); only the
// conversion kernels compute in a dtype. Argument schemas are the out variants'
// (see kernel.h); each kernel checks arity, tags, dtypes, shapes and index
// ranges and fails through the context instead of reading out of bounds.
#include "util/shape_checks.h"
#include "util/registration.h"

#include <cmath>
#include <cstring>

namespace kiln::rt::kernels {
namespace {

using Args = std::span<EValue*>;

// Boxed-argument helpers (named arguments) for the kernels of this file, which still
// take the raw EValue* args; they go when these kernels become typed (util/register.h).


// ---------------------------------------------------------------------------
// Argument access. Each reports a failure and returns false/nullptr.

inline bool check_arity(KernelContext& ctx, const char* op, Args args, size_t n) {
  if (args.size() != n) {
    ctx.fail(Status::InvalidArgument, "%s: expected %zu arguments, got %zu", op, n, args.size());
    return false;
  }
  for (size_t i = 0; i < n; ++i)
    if (args[i] == nullptr) {
      ctx.fail(Status::InvalidArgument, "%s: argument %zu is missing", op, i);
      return false;
    }
  return true;
}

// A tensor the kernel can read or write: contiguous, sane rank, data present.
inline bool check_tensor(KernelContext& ctx, const char* op, const char* name, const Tensor* t) {
  if (t == nullptr) {
    ctx.fail(Status::InvalidArgument, "%s: %s is a null tensor", op, name);
    return false;
  }
  if (t->dim < 0 || t->dim > kMaxDims) {
    ctx.fail(Status::InvalidArgument, "%s: %s has invalid rank %d", op, name, t->dim);
    return false;
  }
  if (!t->is_contiguous()) {
    ctx.fail(Status::NotSupported, "%s: %s is not contiguous (only dim order identity is supported)", op, name);
    return false;
  }
  if (element_size(t->dtype) <= 0) {
    ctx.fail(Status::NotSupported, "%s: %s has unsupported dtype %d", op, name, static_cast<int>(t->dtype));
    return false;
  }
  if (t->numel > 0 && t->data == nullptr) {
    ctx.fail(Status::InvalidArgument, "%s: %s has no data", op, name);
    return false;
  }
  return true;
}

inline Tensor* tensor_arg(KernelContext& ctx, const char* op, const char* name, const EValue* v) {
  if (v->tag != EValue::Tag::Tensor) {
    ctx.fail(Status::InvalidArgument, "%s: %s must be a tensor", op, name);
    return nullptr;
  }
  Tensor* t = v->scalar.t;
  return check_tensor(ctx, op, name, t) ? t : nullptr;
}

inline bool int_arg(KernelContext& ctx, const char* op, const char* name, const EValue* v, int64_t* out) {
  if (v->tag != EValue::Tag::Int) {
    ctx.fail(Status::InvalidArgument, "%s: %s must be an int", op, name);
    return false;
  }
  *out = v->to_int();
  return true;
}

// Optional int: *present false for None.
inline bool opt_int_arg(KernelContext& ctx, const char* op, const char* name, const EValue* v, bool* present,
                        int64_t* out) {
  if (v->tag == EValue::Tag::None) {
    *present = false;
    return true;
  }
  *present = true;
  return int_arg(ctx, op, name, v, out);
}

inline bool bool_arg(KernelContext& ctx, const char* op, const char* name, const EValue* v, bool* out) {
  if (v->tag != EValue::Tag::Bool) {
    ctx.fail(Status::InvalidArgument, "%s: %s must be a bool", op, name);
    return false;
  }
  *out = v->to_bool();
  return true;
}

inline bool int_list_arg(KernelContext& ctx, const char* op, const char* name, const EValue* v,
                         std::span<const int64_t>* out) {
  if (v->tag != EValue::Tag::IntList) {
    ctx.fail(Status::InvalidArgument, "%s: %s must be an int list", op, name);
    return false;
  }
  *out = v->ints;
  return true;
}

inline bool scalar_arg(KernelContext& ctx, const char* op, const char* name, const EValue* v, Scalar* out) {
  switch (v->tag) {
    case EValue::Tag::Int: out->kind = Scalar::Kind::Int; out->i = v->to_int(); return true;
    case EValue::Tag::Double: out->kind = Scalar::Kind::Double; out->d = v->to_double(); return true;
    case EValue::Tag::Bool: out->kind = Scalar::Kind::Bool; out->b = v->to_bool(); return true;
    default: ctx.fail(Status::InvalidArgument, "%s: %s must be a scalar (int, float or bool)", op, name); return false;
  }
}

// A MemoryFormat? argument: None, contiguous_format (0) or preserve_format (1).
inline bool memory_format_arg(KernelContext& ctx, const char* op, const EValue* v) {
  if (v->tag == EValue::Tag::None) return true;
  if (v->tag != EValue::Tag::Int) {
    ctx.fail(Status::InvalidArgument, "%s: memory_format must be an int or None", op);
    return false;
  }
  if (v->to_int() != 0 && v->to_int() != 1) {
    ctx.fail(Status::NotSupported, "%s: memory_format %lld is not supported (contiguous outputs only)", op,
             static_cast<long long>(v->to_int()));
    return false;
  }
  return true;
}

// Wraps a possibly negative dim into [0, rank); a 0-dim tensor accepts -1 and 0 as torch does.
inline bool wrap_dim(KernelContext& ctx, const char* op, int64_t dim, int64_t rank, int64_t* out) {
  int64_t r = rank <= 0 ? 1 : rank;
  if (dim < -r || dim >= r) {
    ctx.fail(Status::InvalidArgument, "%s: dimension %lld out of range (expected to be in range of [%lld, %lld])", op,
             static_cast<long long>(dim), static_cast<long long>(-r), static_cast<long long>(r - 1));
    return false;
  }
  *out = dim < 0 ? dim + r : dim;
  return true;
}


// tril.out / triu.out(Tensor self, SymInt diagonal=0, *, Tensor(a!) out)
template <bool kLower>
void triangle_out(KernelContext& ctx, Args args) {
  const char* op = kLower ? "aten::tril.out" : "aten::triu.out";
  if (!check_arity(ctx, op, args, 3)) return;
  int64_t diag = 0;
  Tensor* self = tensor_arg(ctx, op, "self", args[0]);
  Tensor* out = self ? tensor_arg(ctx, op, "out", args[2]) : nullptr;
  if (!out || !int_arg(ctx, op, "diagonal", args[1], &diag)) return;
  if (self->dim < 2) {
    ctx.fail(Status::InvalidArgument, "%s: input tensor must have at least 2 dimensions", op);
    return;
  }
  if (!check_out_dtype(ctx, *out, self->dtype, op) || !prepare_out(ctx, op, *out, self->shape())) return;
  const int64_t rows = self->sizes[self->dim - 2], cols = self->sizes[self->dim - 1];
  if (self->numel == 0) return;
  const int64_t es = element_size(self->dtype), batch = self->numel / (rows * cols);
  const int64_t bound = rows + cols + 1;  // diagonals beyond this behave alike; keeps i + diag from overflowing
  diag = diag > bound ? bound : diag < -bound ? -bound : diag;
  const auto* s = static_cast<const char*>(self->data);
  auto* d = static_cast<char*>(out->data);
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

// ---------------------------------------------------------------------------
// Concatenation and splitting

// cat.out(Tensor[] tensors, int dim=0, *, Tensor(a!) out)
void cat_out(KernelContext& ctx, Args args) {
  const char* op = "aten::cat.out";
  if (!check_arity(ctx, op, args, 3)) return;
  int64_t dim = 0;
  if (args[0]->tag != EValue::Tag::TensorList) {
    ctx.fail(Status::InvalidArgument, "%s: tensors must be a tensor list", op);
    return;
  }
  std::span<Tensor* const> list = args[0]->tensors;
  Tensor* out = tensor_arg(ctx, op, "out", args[2]);
  if (!out || !int_arg(ctx, op, "dim", args[1], &dim)) return;
  if (list.empty()) {
    ctx.fail(Status::InvalidArgument, "%s: expected a non-empty list of tensors", op);
    return;
  }
  // torch skips legacy empty 1-d tensors (shape [0]) whatever the other shapes.
  auto skipped = [](const Tensor* t) { return t->dim == 1 && t->sizes[0] == 0; };
  const Tensor* ref = nullptr;
  for (size_t i = 0; i < list.size(); ++i) {
    if (!check_tensor(ctx, op, "tensors[i]", list[i])) return;
    if (!ref && !skipped(list[i])) ref = list[i];
  }
  if (ref == nullptr) {  // everything skipped: the result is the empty 1-d tensor
    const int64_t empty[1] = {0};
    prepare_out(ctx, op, *out, empty);
    return;
  }
  if (ref->dim == 0) {
    ctx.fail(Status::InvalidArgument, "%s: zero-dimensional tensor cannot be concatenated", op);
    return;
  }
  if (!wrap_dim(ctx, op, dim, ref->dim, &dim)) return;
  int64_t shape[kMaxDims];
  for (int i = 0; i < ref->dim; ++i) shape[i] = ref->sizes[i];
  shape[dim] = 0;
  for (size_t k = 0; k < list.size(); ++k) {
    const Tensor* t = list[k];
    if (skipped(t)) continue;
    bool match = t->dim == ref->dim;
    for (int i = 0; match && i < ref->dim; ++i) match = i == dim || t->sizes[i] == ref->sizes[i];
    if (!match) {
      ctx.fail(Status::InvalidArgument, "%s: sizes of tensors must match except in dimension %lld: tensor %zu has "
               "shape %s, expected %s", op, static_cast<long long>(dim), k, ShapeText(t->shape()).buf,
               ShapeText(ref->shape()).buf);
      return;
    }
    if (!can_cast(t->dtype, out->dtype) || (t->dtype != out->dtype && !is_supported_dtype(t->dtype))) {
      ctx.fail(Status::InvalidArgument, "%s: input dtype %s can't be cast to the out dtype %s", op,
               dtype_str(t->dtype), dtype_str(out->dtype));
      return;
    }
    shape[dim] += t->sizes[dim];
  }
  if (!prepare_out(ctx, op, *out, {shape, static_cast<size_t>(ref->dim)})) return;
  if (out->numel == 0) return;
  int64_t outer = 1, inner = 1;
  for (int i = 0; i < dim; ++i) outer *= shape[i];
  for (int i = static_cast<int>(dim) + 1; i < ref->dim; ++i) inner *= shape[i];
  const int64_t oes = element_size(out->dtype);
  auto* dst = static_cast<char*>(out->data);
  int64_t dst_pos = 0;  // elements
  for (int64_t o = 0; o < outer; ++o) {
    for (const Tensor* t : list) {
      if (skipped(t)) continue;
      const int64_t chunk = t->sizes[dim] * inner;
      if (chunk == 0) continue;
      const int64_t tes = element_size(t->dtype);
      const char* src = static_cast<const char*>(t->data) + o * chunk * tes;
      if (t->dtype == out->dtype) {
        std::memcpy(dst + dst_pos * oes, src, static_cast<size_t>(chunk * oes));
      } else {
        ConvertRowFn fn = convert_row_fn(out->dtype, t->dtype);
        if (fn == nullptr) {
          ctx.fail(Status::NotSupported, "%s: conversion from %s to %s is not supported", op, dtype_str(t->dtype),
                   dtype_str(out->dtype));
          return;
        }
        fn(dst + dst_pos * oes, src, chunk, oes, tes);
      }
      dst_pos += chunk;
    }
  }
}

// Copies consecutive chunks of self along dim into the outs; chunk(i) is out i's extent.
template <typename ChunkFn>
void split_into(KernelContext& ctx, const char* op, const Tensor& self, int64_t dim, const EValue* outs_ev,
                int64_t count, ChunkFn chunk) {
  if (outs_ev->tag != EValue::Tag::TensorList) {
    ctx.fail(Status::InvalidArgument, "%s: out must be a tensor list", op);
    return;
  }
  std::span<Tensor* const> outs = outs_ev->tensors;
  if (outs.size() != static_cast<size_t>(count)) {
    ctx.fail(Status::InvalidArgument, "%s: expected %lld out tensors, got %zu", op, static_cast<long long>(count),
             outs.size());
    return;
  }
  int64_t outer = 1, inner = 1;
  for (int i = 0; i < dim; ++i) outer *= self.sizes[i];
  for (int i = static_cast<int>(dim) + 1; i < self.dim; ++i) inner *= self.sizes[i];
  const int64_t es = element_size(self.dtype), dim_size = self.sizes[dim];
  int64_t shape[kMaxDims];
  for (int i = 0; i < self.dim; ++i) shape[i] = self.sizes[i];
  int64_t start = 0;
  for (size_t k = 0; k < outs.size(); ++k) {
    Tensor* o = outs[k];
    const int64_t c = chunk(static_cast<int64_t>(k));
    shape[dim] = c;
    if (!check_tensor(ctx, op, "out[i]", o) || !check_out_dtype(ctx, *o, self.dtype, op) ||
        !prepare_out(ctx, op, *o, {shape, static_cast<size_t>(self.dim)}))
      return;
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

// split_with_sizes_copy.out(Tensor self, SymInt[] split_sizes, int dim=0, *, Tensor(a!)[] out)
void split_with_sizes_copy_out(KernelContext& ctx, Args args) {
  const char* op = "aten::split_with_sizes_copy.out";
  if (!check_arity(ctx, op, args, 4)) return;
  std::span<const int64_t> split_sizes;
  int64_t dim = 0;
  Tensor* self = tensor_arg(ctx, op, "self", args[0]);
  if (!self || !int_list_arg(ctx, op, "split_sizes", args[1], &split_sizes) || !int_arg(ctx, op, "dim", args[2], &dim))
    return;
  if (self->dim == 0) {
    ctx.fail(Status::InvalidArgument, "%s: split expects at least a 1-dimensional tensor", op);
    return;
  }
  if (!wrap_dim(ctx, op, dim, self->dim, &dim)) return;
  int64_t sum = 0;
  for (int64_t s : split_sizes) {
    if (s < 0 || __builtin_add_overflow(sum, s, &sum)) {
      ctx.fail(Status::InvalidArgument, "%s: invalid split sizes %s", op, ShapeText(split_sizes).buf);
      return;
    }
  }
  if (sum != self->sizes[dim]) {
    ctx.fail(Status::InvalidArgument, "%s: split_sizes %s must sum exactly to %lld (dimension %lld)", op,
             ShapeText(split_sizes).buf, static_cast<long long>(self->sizes[dim]), static_cast<long long>(dim));
    return;
  }
  split_into(ctx, op, *self, dim, args[3], static_cast<int64_t>(split_sizes.size()),
             [&](int64_t i) { return split_sizes[static_cast<size_t>(i)]; });
}

// split_copy.Tensor_out(Tensor self, SymInt split_size, int dim=0, *, Tensor(a!)[] out)
void split_copy_out(KernelContext& ctx, Args args) {
  const char* op = "aten::split_copy.Tensor_out";
  if (!check_arity(ctx, op, args, 4)) return;
  int64_t split = 0, dim = 0;
  Tensor* self = tensor_arg(ctx, op, "self", args[0]);
  if (!self || !int_arg(ctx, op, "split_size", args[1], &split) || !int_arg(ctx, op, "dim", args[2], &dim)) return;
  if (self->dim == 0) {
    ctx.fail(Status::InvalidArgument, "%s: split expects at least a 1-dimensional tensor", op);
    return;
  }
  if (!wrap_dim(ctx, op, dim, self->dim, &dim)) return;
  const int64_t dim_size = self->sizes[dim];
  if (split < 0 || (split == 0 && dim_size != 0)) {
    ctx.fail(Status::InvalidArgument, "%s: split_size %lld is invalid for dimension size %lld", op,
             static_cast<long long>(split), static_cast<long long>(dim_size));
    return;
  }
  // torch: at least one chunk; split_size 0 only for an empty dimension
  int64_t count = 1;
  if (split != 0) count = dim_size / split + (dim_size % split != 0 ? 1 : 0);
  if (count < 1) count = 1;
  const int64_t last = dim_size - split * (count - 1);
  split_into(ctx, op, *self, dim, args[3], count, [&](int64_t i) { return i == count - 1 ? last : split; });
}

// ---------------------------------------------------------------------------
// Indexing

// One index tensor of an advanced index: an integer tensor indexing one dim of
// self, or a bool/uint8 mask covering `span` dims (standing for the positions of
// its true elements).
struct IndexSource {
  const Tensor* t = nullptr;
  int self_dim = 0;
  int span = 1;
  bool mask = false;
  int64_t nnz = 0;              // masks: true elements
  int64_t dim_size = 0;         // integer: size of the indexed dim
  int64_t self_stride = 0;      // elements of self per index step (masks: per flat mask position)
  int64_t bstride[kMaxDims];    // element strides over the broadcast index shape (0: broadcast)
  int64_t offset = 0;           // iteration state: element of t (integer)
  int64_t cur_j = -1, cur_f = -1;  // iteration state (mask): j-th true element is at flat position f
};

struct IndexPlan {
  int nsrc = 0;
  IndexSource src[kMaxDims];
  int brank = 0;
  int64_t bsizes[kMaxDims];
  int64_t bnumel = 1;
  int prank = 0;  // prefix dims of self kept before the index result (adjacent indices)
  int64_t psizes[kMaxDims], pstrides[kMaxDims];
  int qrank = 0;  // dims of self kept after the index result
  int64_t qsizes[kMaxDims], qstrides[kMaxDims];
  int out_rank = 0;
  int64_t out_sizes[kMaxDims];
};

// Flat position of the j-th true element of a mask; j moves forward or restarts at 0.
int64_t mask_position(IndexSource& s, int64_t j) {
  if (j == s.cur_j) return s.cur_f;
  const auto* m = s.t->data_as<const uint8_t>();
  int64_t f = 0, need = j + 1;
  if (s.cur_j >= 0 && j > s.cur_j) {
    f = s.cur_f + 1;
    need = j - s.cur_j;
  }
  for (; f < s.t->numel; ++f)
    if (m[f] != 0 && --need == 0) break;
  s.cur_j = j;
  s.cur_f = f;
  return f;
}

bool build_index_plan(KernelContext& ctx, const char* op, const Tensor& self, const EValue* indices_ev,
                      IndexPlan& p) {
  if (indices_ev->tag != EValue::Tag::OptionalTensorList && indices_ev->tag != EValue::Tag::TensorList) {
    ctx.fail(Status::InvalidArgument, "%s: indices must be a list of optional tensors", op);
    return false;
  }
  std::span<Tensor* const> list = indices_ev->tensors;
  if (list.empty()) {
    ctx.fail(Status::InvalidArgument, "%s: at least one index must be provided", op);
    return false;
  }
  int64_t st[kMaxDims];
  contiguous_strides(self.dim, self.sizes, st);
  bool indexed[kMaxDims] = {};
  int d = 0;
  for (size_t i = 0; i < list.size(); ++i) {
    const Tensor* t = list[i];
    const int need = t == nullptr ? 1 : (t->dtype == ScalarType::Bool || t->dtype == ScalarType::Byte) ? t->dim : 1;
    if (need < 0 || d + need > self.dim) {
      ctx.fail(Status::InvalidArgument, "%s: too many indices for tensor of dimension %d", op, self.dim);
      return false;
    }
    if (t == nullptr) {
      ++d;
      continue;
    }
    if (!check_tensor(ctx, op, "indices[i]", t)) return false;
    IndexSource& s = p.src[p.nsrc];
    s.t = t;
    s.self_dim = d;
    if (t->dtype == ScalarType::Bool || t->dtype == ScalarType::Byte) {
      if (t->dim == 0) {
        ctx.fail(Status::NotSupported, "%s: 0-dim boolean indices are not supported", op);
        return false;
      }
      for (int c = 0; c < t->dim; ++c)
        if (t->sizes[c] != self.sizes[d + c]) {
          ctx.fail(Status::InvalidArgument, "%s: the shape of the mask %s at index %zu does not match the shape of "
                   "the indexed tensor %s", op, ShapeText(t->shape()).buf, i, ShapeText(self.shape()).buf);
          return false;
        }
      s.mask = true;
      s.span = t->dim;
      const auto* m = t->data_as<const uint8_t>();
      s.nnz = 0;
      for (int64_t k = 0; k < t->numel; ++k) s.nnz += m[k] != 0;
      s.self_stride = st[d + t->dim - 1];  // self is contiguous: flat mask position * innermost stride
    } else if (t->dtype == ScalarType::Long || t->dtype == ScalarType::Int) {
      s.mask = false;
      s.span = 1;
      s.dim_size = self.sizes[d];
      s.self_stride = st[d];
    } else {
      ctx.fail(Status::InvalidArgument, "%s: tensors used as indices must be long, int, byte or bool tensors, got %s",
               op, dtype_str(t->dtype));
      return false;
    }
    for (int c = 0; c < s.span; ++c) indexed[d + c] = true;
    d += s.span;
    ++p.nsrc;
  }
  // broadcast shape of the index tensors (a mask counts as a 1-d tensor of its true elements)
  p.brank = 0;
  for (int k = 0; k < p.nsrc; ++k) {
    const int r = p.src[k].mask ? 1 : p.src[k].t->dim;
    if (r > p.brank) p.brank = r;
  }
  for (int j = 0; j < p.brank; ++j) p.bsizes[j] = 1;
  for (int k = 0; k < p.nsrc; ++k) {
    IndexSource& s = p.src[k];
    const int r = s.mask ? 1 : s.t->dim;
    const int64_t* sizes = s.mask ? &s.nnz : s.t->sizes;
    int64_t own[kMaxDims];
    own[0] = 1;
    if (!s.mask) contiguous_strides(r, sizes, own);
    for (int j = 0; j < p.brank; ++j) s.bstride[j] = 0;
    for (int j = 0; j < r; ++j) {
      const int bj = p.brank - r + j;
      const int64_t n = sizes[j];
      if (p.bsizes[bj] == 1) {
        p.bsizes[bj] = n;
      } else if (n != 1 && n != p.bsizes[bj]) {
        ctx.fail(Status::InvalidArgument, "%s: shape mismatch: indexing tensors could not be broadcast together", op);
        return false;
      }
      s.bstride[bj] = n == 1 ? 0 : own[j];
    }
  }
  p.bnumel = 1;
  for (int j = 0; j < p.brank; ++j) p.bnumel *= p.bsizes[j];
  // result layout: [prefix dims] + broadcast shape + [rest] when the indexed dims are
  // adjacent, else broadcast shape + [all non-indexed dims]
  int first = -1, last = -1;
  for (int i = 0; i < self.dim; ++i)
    if (indexed[i]) {
      if (first < 0) first = i;
      last = i;
    }
  bool adjacent = true;
  for (int i = first; first >= 0 && i <= last; ++i) adjacent = adjacent && indexed[i];
  p.prank = p.qrank = 0;
  for (int i = 0; i < self.dim; ++i) {
    if (indexed[i]) continue;
    if (adjacent && i < first) {
      p.psizes[p.prank] = self.sizes[i];
      p.pstrides[p.prank++] = st[i];
    } else {
      p.qsizes[p.qrank] = self.sizes[i];
      p.qstrides[p.qrank++] = st[i];
    }
  }
  p.out_rank = p.prank + p.brank + p.qrank;
  if (p.out_rank > kMaxDims) {
    ctx.fail(Status::NotSupported, "%s: result would exceed %d dimensions", op, kMaxDims);
    return false;
  }
  int n = 0;
  for (int i = 0; i < p.prank; ++i) p.out_sizes[n++] = p.psizes[i];
  for (int i = 0; i < p.brank; ++i) p.out_sizes[n++] = p.bsizes[i];
  for (int i = 0; i < p.qrank; ++i) p.out_sizes[n++] = p.qsizes[i];
  return true;
}

bool check_no_index_overlap(KernelContext& ctx, const char* op, const Tensor& out, const IndexPlan& p) {
  for (int k = 0; k < p.nsrc; ++k)
    if (!check_no_overlap(ctx, op, out, *p.src[k].t, "an index tensor")) return false;
  return true;
}

// Every integer index within [-size, size) of its dim.
bool check_index_ranges(KernelContext& ctx, const char* op, const IndexPlan& p) {
  for (int k = 0; k < p.nsrc; ++k) {
    const IndexSource& s = p.src[k];
    if (s.mask) continue;
    for (int64_t i = 0; i < s.t->numel; ++i) {
      const int64_t v = read_index(*s.t, i);
      if (v < -s.dim_size || v >= s.dim_size) {
        ctx.fail(Status::OutOfRange, "%s: index %lld is out of bounds for dimension %d with size %lld", op,
                 static_cast<long long>(v), s.self_dim, static_cast<long long>(s.dim_size));
        return false;
      }
    }
  }
  return true;
}

// Calls fn(self_offset, pidx, bidx) for every (prefix, broadcast) position of
// the plan in result order; self_offset (elements) is where that position's
// block of the remaining dims starts in self. Index ranges must be checked.
template <typename Fn>
void for_each_index_position(IndexPlan& p, Fn&& fn) {
  int64_t pnumel = 1;
  for (int i = 0; i < p.prank; ++i) pnumel *= p.psizes[i];
  int64_t pidx[kMaxDims] = {};
  int64_t poff = 0;
  for (int64_t pi = 0; pi < pnumel; ++pi) {
    int64_t bidx[kMaxDims] = {};
    for (int k = 0; k < p.nsrc; ++k) {
      p.src[k].offset = 0;
      p.src[k].cur_j = -1;
    }
    for (int64_t bi = 0; bi < p.bnumel; ++bi) {
      int64_t off = poff;
      for (int k = 0; k < p.nsrc; ++k) {
        IndexSource& s = p.src[k];
        if (s.mask) {
          const int64_t j = s.nnz == 1 ? 0 : bidx[p.brank - 1];
          off += mask_position(s, j) * s.self_stride;
        } else {
          int64_t v = read_index(*s.t, s.offset);
          if (v < 0) v += s.dim_size;
          off += v * s.self_stride;
        }
      }
      fn(off, static_cast<const int64_t*>(pidx), static_cast<const int64_t*>(bidx));
      for (int j = p.brank - 1; j >= 0; --j) {  // advance the broadcast odometer
        for (int k = 0; k < p.nsrc; ++k) p.src[k].offset += p.src[k].bstride[j];
        if (++bidx[j] < p.bsizes[j]) break;
        for (int k = 0; k < p.nsrc; ++k) p.src[k].offset -= p.src[k].bstride[j] * p.bsizes[j];
        bidx[j] = 0;
      }
    }
    for (int j = p.prank - 1; j >= 0; --j) {  // advance the prefix odometer
      poff += p.pstrides[j];
      if (++pidx[j] < p.psizes[j]) break;
      poff -= p.pstrides[j] * p.psizes[j];
      pidx[j] = 0;
    }
  }
}

// index.Tensor_out(Tensor self, Tensor?[] indices, *, Tensor(a!) out)
void index_tensor_out(KernelContext& ctx, Args args) {
  const char* op = "aten::index.Tensor_out";
  if (!check_arity(ctx, op, args, 3)) return;
  Tensor* self = tensor_arg(ctx, op, "self", args[0]);
  Tensor* out = self ? tensor_arg(ctx, op, "out", args[2]) : nullptr;
  if (!out || !check_out_dtype(ctx, *out, self->dtype, op)) return;
  IndexPlan p;
  if (!build_index_plan(ctx, op, *self, args[1], p)) return;
  if (!prepare_out(ctx, op, *out, {p.out_sizes, static_cast<size_t>(p.out_rank)})) return;
  if (out->numel == 0 || !check_no_index_overlap(ctx, op, *out, p) || !check_no_overlap(ctx, op, *out, *self, "self") ||
      !check_index_ranges(ctx, op, p))
    return;
  const int es = element_size(self->dtype);
  int64_t qdst[kMaxDims];
  contiguous_strides(p.qrank, p.qsizes, qdst);
  StridedPlan qplan;
  plan_strided(qplan, p.qrank, p.qsizes, qdst, es, p.qstrides, es);
  int64_t qcount = 1;
  for (int i = 0; i < p.qrank; ++i) qcount *= p.qsizes[i];
  const auto* base = static_cast<const char*>(self->data);
  auto* dst = static_cast<char*>(out->data);
  for_each_index_position(p, [&](int64_t off, const int64_t*, const int64_t*) {
    copy_with_plan(qplan, dst, base + off * es, es);
    dst += qcount * es;
  });
}

// dst[i] += src[i] in T's arithmetic (float for half/bfloat16, wrapping for integers, or for bool).
template <typename T>
void add_row(char* dst, const char* src, int64_t n, int64_t dst_step, int64_t src_step) {
  for (int64_t i = 0; i < n; ++i) {
    T a, b, r;
    std::memcpy(&a, dst + i * dst_step, sizeof(T));
    std::memcpy(&b, src + i * src_step, sizeof(T));
    if constexpr (std::is_same_v<T, bool>) {
      r = a || b;
    } else if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) {
      r = convert<T>(convert<float>(a) + convert<float>(b));
    } else if constexpr (std::is_integral_v<T>) {
      r = static_cast<T>(static_cast<uint64_t>(a) + static_cast<uint64_t>(b));
    } else {
      r = a + b;
    }
    std::memcpy(dst + i * dst_step, &r, sizeof(T));
  }
}

// index_put.out(Tensor self, Tensor?[] indices, Tensor values, bool accumulate=False, *, Tensor(a!) out):
// out <- self, then out[indices] <- values (broadcast to the indexing result), or += with accumulate.
void index_put_out(KernelContext& ctx, Args args) {
  const char* op = "aten::index_put.out";
  if (!check_arity(ctx, op, args, 5)) return;
  bool accumulate = false;
  Tensor* self = tensor_arg(ctx, op, "self", args[0]);
  Tensor* values = self ? tensor_arg(ctx, op, "values", args[2]) : nullptr;
  Tensor* out = values ? tensor_arg(ctx, op, "out", args[4]) : nullptr;
  if (!out || !bool_arg(ctx, op, "accumulate", args[3], &accumulate) || !check_out_dtype(ctx, *out, self->dtype, op))
    return;
  if (values->dtype != self->dtype) {
    ctx.fail(Status::InvalidArgument, "%s: index put requires the source and destination dtypes match, got %s for "
             "the destination and %s for the source", op, dtype_str(self->dtype), dtype_str(values->dtype));
    return;
  }
  ConvertRowFn add = nullptr;
  if (accumulate) {
    dispatch(self->dtype, [&](auto tag) { add = &add_row<typename decltype(tag)::type>; });
    if (add == nullptr) {
      ctx.fail(Status::NotSupported, "%s: accumulate is not supported for %s", op, dtype_str(self->dtype));
      return;
    }
  }
  IndexPlan p;
  if (!build_index_plan(ctx, op, *self, args[1], p)) return;
  // values broadcast to the indexing result
  int64_t vst[kMaxDims];
  if (!broadcast_strides(values->dim, values->sizes, p.out_rank, p.out_sizes, vst)) {
    ctx.fail(Status::InvalidArgument, "%s: shape mismatch: value tensor of shape %s cannot be broadcast to indexing "
             "result of shape %s", op, ShapeText(values->shape()).buf,
             ShapeText({p.out_sizes, static_cast<size_t>(p.out_rank)}).buf);
    return;
  }
  if (!prepare_out(ctx, op, *out, self->shape()) || !check_no_index_overlap(ctx, op, *out, p) ||
      !check_no_overlap(ctx, op, *out, *values, "values"))
    return;
  copy_bytes(*self, *out);
  int64_t result_numel = 1;
  for (int i = 0; i < p.out_rank; ++i) result_numel *= p.out_sizes[i];
  if (result_numel == 0 || !check_index_ranges(ctx, op, p)) return;
  const int es = element_size(self->dtype);
  StridedPlan qplan;
  plan_strided(qplan, p.qrank, p.qsizes, p.qstrides, es, vst + p.prank + p.brank, es);
  auto* dst = static_cast<char*>(out->data);
  const auto* src = static_cast<const char*>(values->data);
  for_each_index_position(p, [&](int64_t off, const int64_t* pidx, const int64_t* bidx) {
    int64_t voff = 0;
    for (int i = 0; i < p.prank; ++i) voff += pidx[i] * vst[i];
    for (int j = 0; j < p.brank; ++j) voff += bidx[j] * vst[p.prank + j];
    if (add != nullptr) convert_with_plan(qplan, dst + off * es, src + voff * es, add);
    else copy_with_plan(qplan, dst + off * es, src + voff * es, es);
  });
}

// index_select.out(Tensor self, int dim, Tensor index, *, Tensor(a!) out)
void index_select_out(KernelContext& ctx, Args args) {
  const char* op = "aten::index_select.out";
  if (!check_arity(ctx, op, args, 4)) return;
  int64_t dim = 0;
  Tensor* self = tensor_arg(ctx, op, "self", args[0]);
  Tensor* index = self ? tensor_arg(ctx, op, "index", args[2]) : nullptr;
  Tensor* out = index ? tensor_arg(ctx, op, "out", args[3]) : nullptr;
  if (!out || !int_arg(ctx, op, "dim", args[1], &dim) || !wrap_dim(ctx, op, dim, self->dim, &dim) ||
      !check_index_dtype(ctx, op, "index", *index) || !check_out_dtype(ctx, *out, self->dtype, op))
    return;
  if (index->dim > 1) {
    ctx.fail(Status::InvalidArgument, "%s: index is supposed to be a vector, got shape %s", op,
             ShapeText(index->shape()).buf);
    return;
  }
  if (self->dim == 0 && index->numel != 1) {
    ctx.fail(Status::InvalidArgument, "%s: index to scalar can have only 1 value, got %lld", op,
             static_cast<long long>(index->numel));
    return;
  }
  const int64_t size = self->dim == 0 ? 1 : self->sizes[dim];
  for (int64_t i = 0; i < index->numel; ++i) {
    const int64_t v = read_index(*index, i);
    if (v < 0 || v >= size) {
      ctx.fail(Status::OutOfRange, "%s: index %lld out of range for dimension %lld with size %lld", op,
               static_cast<long long>(v), static_cast<long long>(dim), static_cast<long long>(size));
      return;
    }
  }
  int64_t shape[kMaxDims];
  for (int i = 0; i < self->dim; ++i) shape[i] = i == dim ? index->numel : self->sizes[i];
  if (!prepare_out(ctx, op, *out, {shape, static_cast<size_t>(self->dim)}) || out->numel == 0 ||
      !check_no_overlap(ctx, op, *out, *index, "index") || !check_no_overlap(ctx, op, *out, *self, "self"))
    return;
  int64_t outer = 1, inner = 1;
  for (int i = 0; i < dim; ++i) outer *= self->sizes[i];
  for (int i = static_cast<int>(dim) + 1; i < self->dim; ++i) inner *= self->sizes[i];
  const int64_t es = element_size(self->dtype), row = inner * es;
  const auto* s = static_cast<const char*>(self->data);
  auto* d = static_cast<char*>(out->data);
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = 0; i < index->numel; ++i, d += row)
      std::memcpy(d, s + (o * size + read_index(*index, i)) * row, static_cast<size_t>(row));
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

// gather.out(Tensor self, int dim, Tensor index, *, bool sparse_grad=False, Tensor(a!) out)
void gather_out(KernelContext& ctx, Args args) {
  const char* op = "aten::gather.out";
  if (!check_arity(ctx, op, args, 5)) return;
  int64_t dim = 0;
  bool sparse_grad = false;
  Tensor* self = tensor_arg(ctx, op, "self", args[0]);
  Tensor* index = self ? tensor_arg(ctx, op, "index", args[2]) : nullptr;
  Tensor* out = index ? tensor_arg(ctx, op, "out", args[4]) : nullptr;
  if (!out || !int_arg(ctx, op, "dim", args[1], &dim) || !bool_arg(ctx, op, "sparse_grad", args[3], &sparse_grad) ||
      !wrap_dim(ctx, op, dim, self->dim, &dim) || !check_index_dtype(ctx, op, "index", *index) ||
      !check_out_dtype(ctx, *out, self->dtype, op))
    return;
  const int srank = self->dim == 0 ? 1 : self->dim, irank = index->dim == 0 ? 1 : index->dim;
  if (srank != irank) {
    ctx.fail(Status::InvalidArgument, "%s: index tensor must have the same number of dimensions as input tensor", op);
    return;
  }
  if (self->dim > 0 && index->dim > 0)
    for (int d = 0; d < self->dim; ++d)
      if (d != dim && index->sizes[d] > self->sizes[d]) {
        ctx.fail(Status::InvalidArgument, "%s: size does not match at dimension %d: index %s must be no larger than "
                 "self %s apart from dimension %lld", op, d, ShapeText(index->shape()).buf,
                 ShapeText(self->shape()).buf, static_cast<long long>(dim));
        return;
      }
  const int64_t size = self->dim == 0 ? 1 : self->sizes[dim];
  if (!prepare_out(ctx, op, *out, index->shape()) || !check_no_overlap(ctx, op, *out, *index, "index") ||
      !check_no_overlap(ctx, op, *out, *self, "self"))
    return;
  for (int64_t i = 0; i < index->numel; ++i) {
    const int64_t v = read_index(*index, i);
    if (v < 0 || v >= size) {
      ctx.fail(Status::OutOfRange, "%s: index %lld is out of bounds for dimension %lld with size %lld", op,
               static_cast<long long>(v), static_cast<long long>(dim), static_cast<long long>(size));
      return;
    }
  }
  if (index->numel == 0) return;
  int64_t st[kMaxDims];
  contiguous_strides(self->dim, self->sizes, st);
  auto* d = static_cast<char*>(out->data);
  switch (element_size(self->dtype)) {
    case 1: gather_elements<1>(*self, *index, dim, st, d); break;
    case 2: gather_elements<2>(*self, *index, dim, st, d); break;
    case 4: gather_elements<4>(*self, *index, dim, st, d); break;
    case 8: gather_elements<8>(*self, *index, dim, st, d); break;
    default: gather_elements<16>(*self, *index, dim, st, d); break;
  }
}

// embedding.out(Tensor weight, Tensor indices, SymInt padding_idx=-1, bool scale_grad_by_freq=False,
//               bool sparse=False, *, Tensor(a!) out)
void embedding_out(KernelContext& ctx, Args args) {
  const char* op = "aten::embedding.out";
  if (!check_arity(ctx, op, args, 6)) return;
  int64_t padding_idx = 0;
  bool scale = false, sparse = false;
  Tensor* weight = tensor_arg(ctx, op, "weight", args[0]);
  Tensor* indices = weight ? tensor_arg(ctx, op, "indices", args[1]) : nullptr;
  Tensor* out = indices ? tensor_arg(ctx, op, "out", args[5]) : nullptr;
  if (!out || !int_arg(ctx, op, "padding_idx", args[2], &padding_idx) ||
      !bool_arg(ctx, op, "scale_grad_by_freq", args[3], &scale) || !bool_arg(ctx, op, "sparse", args[4], &sparse) ||
      !check_index_dtype(ctx, op, "indices", *indices) || !check_out_dtype(ctx, *out, weight->dtype, op))
    return;
  if (weight->dim != 2) {
    ctx.fail(Status::InvalidArgument, "%s: weight must be 2-D, got shape %s", op, ShapeText(weight->shape()).buf);
    return;
  }
  if (indices->dim + 1 > kMaxDims) {
    ctx.fail(Status::NotSupported, "%s: result would exceed %d dimensions", op, kMaxDims);
    return;
  }
  int64_t shape[kMaxDims];
  for (int i = 0; i < indices->dim; ++i) shape[i] = indices->sizes[i];
  shape[indices->dim] = weight->sizes[1];
  if (!prepare_out(ctx, op, *out, {shape, static_cast<size_t>(indices->dim + 1)}) ||
      !check_no_overlap(ctx, op, *out, *indices, "indices") || !check_no_overlap(ctx, op, *out, *weight, "weight"))
    return;
  const int64_t rows = weight->sizes[0], row = weight->sizes[1] * element_size(weight->dtype);
  for (int64_t i = 0; i < indices->numel; ++i) {
    const int64_t v = read_index(*indices, i);
    if (v < 0 || v >= rows) {
      ctx.fail(Status::OutOfRange, "%s: index %lld out of range for %lld embeddings", op, static_cast<long long>(v),
               static_cast<long long>(rows));
      return;
    }
  }
  if (row == 0) return;
  const auto* w = static_cast<const char*>(weight->data);
  auto* d = static_cast<char*>(out->data);
  for (int64_t i = 0; i < indices->numel; ++i)
    std::memcpy(d + i * row, w + read_index(*indices, i) * row, static_cast<size_t>(row));
}

// ---------------------------------------------------------------------------
// Fills and factories

// out (already shaped) <- value in out's dtype.
void fill_out_with(KernelContext& ctx, const char* op, const Scalar& value, Tensor& out) {
  if (!check_value_fits(ctx, op, value, out.dtype)) return;
  alignas(16) unsigned char elem[16] = {};
  scalar_to_element(value, out.dtype, elem);
  fill_elements(out.data, out.numel, elem, element_size(out.dtype));
}

// full.out(SymInt[] size, Scalar fill_value, *, Tensor(a!) out)
void full_out(KernelContext& ctx, Args args) {
  const char* op = "aten::full.out";
  if (!check_arity(ctx, op, args, 3)) return;
  std::span<const int64_t> size;
  Scalar value;
  int64_t numel = 0;
  Tensor* out = tensor_arg(ctx, op, "out", args[2]);
  if (!out || !int_list_arg(ctx, op, "size", args[0], &size) || !scalar_arg(ctx, op, "fill_value", args[1], &value) ||
      !checked_numel(ctx, op, size, &numel) || !check_value_fits(ctx, op, value, out->dtype) ||
      !prepare_out(ctx, op, *out, size))
    return;
  fill_out_with(ctx, op, value, *out);
}

// full_like.out(Tensor self, Scalar fill_value, *, MemoryFormat? memory_format=None, Tensor(a!) out)
void full_like_out(KernelContext& ctx, Args args) {
  const char* op = "aten::full_like.out";
  if (!check_arity(ctx, op, args, 4)) return;
  Scalar value;
  Tensor* self = tensor_arg(ctx, op, "self", args[0]);
  Tensor* out = self ? tensor_arg(ctx, op, "out", args[3]) : nullptr;
  if (!out || !scalar_arg(ctx, op, "fill_value", args[1], &value) || !memory_format_arg(ctx, op, args[2]) ||
      !check_value_fits(ctx, op, value, out->dtype) || !prepare_out(ctx, op, *out, self->shape()))
    return;
  fill_out_with(ctx, op, value, *out);
}

// scalar_tensor.out(Scalar s, *, Tensor(a!) out)
void scalar_tensor_out(KernelContext& ctx, Args args) {
  const char* op = "aten::scalar_tensor.out";
  if (!check_arity(ctx, op, args, 2)) return;
  Scalar value;
  Tensor* out = tensor_arg(ctx, op, "out", args[1]);
  if (!out || !scalar_arg(ctx, op, "s", args[0], &value) || !check_value_fits(ctx, op, value, out->dtype) ||
      !prepare_out(ctx, op, *out, {}))
    return;
  fill_out_with(ctx, op, value, *out);
}

// fill.Scalar_out(Tensor self, Scalar value, *, Tensor(a!) out)
void fill_scalar_out(KernelContext& ctx, Args args) {
  const char* op = "aten::fill.Scalar_out";
  if (!check_arity(ctx, op, args, 3)) return;
  Scalar value;
  Tensor* self = tensor_arg(ctx, op, "self", args[0]);
  Tensor* out = self ? tensor_arg(ctx, op, "out", args[2]) : nullptr;
  if (!out || !scalar_arg(ctx, op, "value", args[1], &value) || !check_out_dtype(ctx, *out, self->dtype, op) ||
      !check_value_fits(ctx, op, value, out->dtype) || !prepare_out(ctx, op, *out, self->shape()))
    return;
  fill_out_with(ctx, op, value, *out);
}

// fill.Tensor_out(Tensor self, Tensor value, *, Tensor(a!) out): value is 0-dim
void fill_tensor_out(KernelContext& ctx, Args args) {
  const char* op = "aten::fill.Tensor_out";
  if (!check_arity(ctx, op, args, 3)) return;
  Tensor* self = tensor_arg(ctx, op, "self", args[0]);
  Tensor* value = self ? tensor_arg(ctx, op, "value", args[1]) : nullptr;
  Tensor* out = value ? tensor_arg(ctx, op, "out", args[2]) : nullptr;
  if (!out || !check_out_dtype(ctx, *out, self->dtype, op)) return;
  if (value->dim != 0) {
    ctx.fail(Status::InvalidArgument, "%s: fill only supports a 0-dimension value tensor, got %d dimensions", op,
             value->dim);
    return;
  }
  ConvertRowFn fn = convert_row_fn(out->dtype, value->dtype);
  if (fn == nullptr) {
    ctx.fail(Status::NotSupported, "%s: conversion from %s to %s is not supported", op, dtype_str(value->dtype),
             dtype_str(out->dtype));
    return;
  }
  if (!prepare_out(ctx, op, *out, self->shape())) return;
  alignas(16) char elem[16] = {};
  const int es = element_size(out->dtype);
  fn(elem, static_cast<const char*>(value->data), 1, es, element_size(value->dtype));
  fill_elements(out->data, out->numel, elem, es);
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

// arange.out(Scalar end, *, Tensor(a!) out)
void arange_out(KernelContext& ctx, Args args) {
  const char* op = "aten::arange.out";
  if (!check_arity(ctx, op, args, 2)) return;
  Scalar end;
  Tensor* out = tensor_arg(ctx, op, "out", args[1]);
  if (!out || !scalar_arg(ctx, op, "end", args[0], &end)) return;
  Scalar start, step;
  step.i = 1;
  arange_into(ctx, op, start, end, step, *out);
}

// arange.start_out(Scalar start, Scalar end, Scalar step=1, *, Tensor(a!) out)
void arange_start_out(KernelContext& ctx, Args args) {
  const char* op = "aten::arange.start_out";
  if (!check_arity(ctx, op, args, 4)) return;
  Scalar start, end, step;
  Tensor* out = tensor_arg(ctx, op, "out", args[3]);
  if (!out || !scalar_arg(ctx, op, "start", args[0], &start) || !scalar_arg(ctx, op, "end", args[1], &end) ||
      !scalar_arg(ctx, op, "step", args[2], &step))
    return;
  arange_into(ctx, op, start, end, step, *out);
}

// constant_pad_nd.out(Tensor self, SymInt[] pad, Scalar value=0, *, Tensor(a!) out): pad pairs
// (before, after) from the last dim backwards; negative pads crop.
void constant_pad_nd_out(KernelContext& ctx, Args args) {
  const char* op = "aten::constant_pad_nd.out";
  if (!check_arity(ctx, op, args, 4)) return;
  std::span<const int64_t> pad;
  Scalar value;
  Tensor* self = tensor_arg(ctx, op, "self", args[0]);
  Tensor* out = self ? tensor_arg(ctx, op, "out", args[3]) : nullptr;
  if (!out || !int_list_arg(ctx, op, "pad", args[1], &pad) || !scalar_arg(ctx, op, "value", args[2], &value) ||
      !check_out_dtype(ctx, *out, self->dtype, op) || !check_value_fits(ctx, op, value, self->dtype))
    return;
  if (pad.size() % 2 != 0) {
    ctx.fail(Status::InvalidArgument, "%s: length of pad must be even, got %zu", op, pad.size());
    return;
  }
  if (pad.size() / 2 > static_cast<size_t>(self->dim)) {
    ctx.fail(Status::InvalidArgument, "%s: pad length %zu is more than twice the input's %d dimensions", op,
             pad.size(), self->dim);
    return;
  }
  const int n = self->dim;
  int64_t shape[kMaxDims], before[kMaxDims] = {}, after[kMaxDims] = {};
  for (int d = 0; d < n; ++d) shape[d] = self->sizes[d];
  for (size_t k = 0; k < pad.size() / 2; ++k) {
    const int d = n - 1 - static_cast<int>(k);
    before[d] = pad[2 * k];
    after[d] = pad[2 * k + 1];
    if (__builtin_add_overflow(shape[d], before[d], &shape[d]) ||
        __builtin_add_overflow(shape[d], after[d], &shape[d]) || shape[d] < 0) {
      ctx.fail(Status::InvalidArgument, "%s: the input size %lld plus padding %lld and %lld gives an invalid output "
               "size", op, static_cast<long long>(self->sizes[d]), static_cast<long long>(before[d]),
               static_cast<long long>(after[d]));
      return;
    }
  }
  int64_t numel = 0;
  if (!checked_numel(ctx, op, {shape, static_cast<size_t>(n)}, &numel) ||
      !prepare_out(ctx, op, *out, {shape, static_cast<size_t>(n)}))
    return;
  fill_out_with(ctx, op, value, *out);
  if (!ctx.ok() || out->numel == 0) return;
  // the part of self that survives the cropping, and where it lands in out
  int64_t sizes[kMaxDims], sst[kMaxDims], dstd[kMaxDims], soff = 0, doff = 0;
  contiguous_strides(n, self->sizes, sst);
  contiguous_strides(n, shape, dstd);
  for (int d = 0; d < n; ++d) {
    const int64_t crop_lo = before[d] < 0 ? -before[d] : 0, crop_hi = after[d] < 0 ? -after[d] : 0;
    sizes[d] = self->sizes[d] - crop_lo - crop_hi;
    if (sizes[d] <= 0) return;
    soff += crop_lo * sst[d];
    doff += (before[d] > 0 ? before[d] : 0) * dstd[d];
  }
  copy_region(ctx, op, *out, doff, dstd, *self, soff, sst, n, sizes);
}


}  // namespace

KILN_BOXED_KERNEL(tril_out, triangle_out<true>);
KILN_BOXED_KERNEL(triu_out, triangle_out<false>);
KILN_BOXED_KERNEL(cat_out, cat_out);
KILN_BOXED_KERNEL(split_with_sizes_copy_out, split_with_sizes_copy_out);
KILN_BOXED_KERNEL(split_copy_Tensor_out, split_copy_out);
KILN_BOXED_KERNEL(index_Tensor_out, index_tensor_out);
KILN_BOXED_KERNEL(index_put_out, index_put_out);
KILN_BOXED_KERNEL(index_select_out, index_select_out);
KILN_BOXED_KERNEL(gather_out, gather_out);
KILN_BOXED_KERNEL(embedding_out, embedding_out);
KILN_BOXED_KERNEL(full_out, full_out);
KILN_BOXED_KERNEL(full_like_out, full_like_out);
KILN_BOXED_KERNEL(scalar_tensor_out, scalar_tensor_out);
KILN_BOXED_KERNEL(fill_Scalar_out, fill_scalar_out);
KILN_BOXED_KERNEL(fill_Tensor_out, fill_tensor_out);
KILN_BOXED_KERNEL(arange_out, arange_out);
KILN_BOXED_KERNEL(arange_start_out, arange_start_out);
KILN_BOXED_KERNEL(constant_pad_nd_out, constant_pad_nd_out);

}  // namespace kiln::rt::kernels
