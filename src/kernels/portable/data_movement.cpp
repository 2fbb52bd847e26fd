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

// ---------------------------------------------------------------------------
// Indexing

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
KILN_BOXED_KERNEL(full_out, full_out);
KILN_BOXED_KERNEL(full_like_out, full_like_out);
KILN_BOXED_KERNEL(scalar_tensor_out, scalar_tensor_out);
KILN_BOXED_KERNEL(fill_Scalar_out, fill_scalar_out);
KILN_BOXED_KERNEL(fill_Tensor_out, fill_tensor_out);
KILN_BOXED_KERNEL(arange_out, arange_out);
KILN_BOXED_KERNEL(arange_start_out, arange_start_out);
KILN_BOXED_KERNEL(constant_pad_nd_out, constant_pad_nd_out);

}  // namespace kiln::rt::kernels
