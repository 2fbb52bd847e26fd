// Argument access and checks for kiln's portable kernels: the raw EValue getters
// (arity, tags, dtypes, contiguity), TensorOrScalar (a Tensor argument that may
// arrive as a wrapped number), dim wrapping, and the out checks (shape, dtype).
#pragma once

#include "dtype.h"
#include "promote.h"
#include "scalar.h"

#include <cstdint>
#include <cstdio>
#include <span>

namespace kiln::rt::kernels {

// Argument access. Every getter reports its own failure through ctx and returns
// false/nullptr; kernels return as soon as one does.

// Formats a shape as "[2, 3]" into buf.
inline const char* format_shape(char* buf, size_t n, std::span<const int64_t> shape) {
  size_t used = 0;
  auto put = [&](const char* s) {
    int w = std::snprintf(buf + used, n - used, "%s", s);
    if (w > 0) used = used + static_cast<size_t>(w) < n ? used + static_cast<size_t>(w) : n - 1;
  };
  put("[");
  for (size_t i = 0; i < shape.size(); ++i) {
    char num[32];
    std::snprintf(num, sizeof(num), i == 0 ? "%lld" : ", %lld", static_cast<long long>(shape[i]));
    put(num);
  }
  put("]");
  return buf;
}

// Exactly n arguments, none of them a null pointer.
inline bool check_nargs(KernelContext& ctx, std::span<EValue*> args, size_t n, const char* op) {
  if (args.size() != n) {
    ctx.fail(Status::InvalidArgument, "%s: expected %zu arguments, got %zu", op, n, args.size());
    return false;
  }
  for (size_t i = 0; i < n; ++i) {
    if (args[i] == nullptr) {
      ctx.fail(Status::InvalidArgument, "%s: argument %zu is missing", op, i);
      return false;
    }
  }
  return true;
}

// A tensor argument: present, of a dtype kiln's kernels know, contiguous.
inline Tensor* tensor_arg(KernelContext& ctx, std::span<EValue*> args, size_t i, const char* op) {
  const EValue* v = args[i];
  if (v == nullptr || v->tag != EValue::Tag::Tensor || v->scalar.t == nullptr) {
    ctx.fail(Status::InvalidArgument, "%s: argument %zu must be a tensor", op, i);
    return nullptr;
  }
  Tensor& t = v->tensor();
  if (!is_supported_dtype(t.dtype)) {
    ctx.fail(Status::NotSupported, "%s: argument %zu has unsupported dtype %s", op, i, dtype_str(t.dtype));
    return nullptr;
  }
  if (!t.is_contiguous()) {
    ctx.fail(Status::NotSupported, "%s: argument %zu is not contiguous (only identity dim order is supported)", op, i);
    return nullptr;
  }
  if (t.data == nullptr && t.numel > 0) {
    ctx.fail(Status::InvalidArgument, "%s: argument %zu has no data", op, i);
    return nullptr;
  }
  return &t;
}

// An optional tensor: *out = nullptr for None.
inline bool opt_tensor_arg(KernelContext& ctx, std::span<EValue*> args, size_t i, const char* op, Tensor** out) {
  *out = nullptr;
  if (args[i] != nullptr && args[i]->is_none()) return true;
  *out = tensor_arg(ctx, args, i, op);
  return *out != nullptr;
}

inline bool scalar_arg(KernelContext& ctx, std::span<EValue*> args, size_t i, const char* op, Scalar* out) {
  const EValue* v = args[i];
  if (v != nullptr) {
    switch (v->tag) {
      case EValue::Tag::Int: out->kind = Scalar::Kind::Int; out->i = v->to_int(); return true;
      case EValue::Tag::Double: out->kind = Scalar::Kind::Double; out->d = v->to_double(); return true;
      case EValue::Tag::Bool: out->kind = Scalar::Kind::Bool; out->b = v->to_bool(); return true;
      default: break;
    }
  }
  ctx.fail(Status::InvalidArgument, "%s: argument %zu must be a scalar (int, float or bool)", op, i);
  return false;
}

// A Tensor argument that may also arrive as a number (Int, Double or Bool), which
// then acts as torch's wrapped number: a 0-dim operand that promotes as a Scalar
// (an int as int64, a float as the default float32, a bool as bool) and keeps
// its full value (a double is not rounded to the compute dtype before use).
// Holds the 0-dim tensor it builds, so it must stay where it was filled.
struct TensorOrScalar {
  Tensor* tensor = nullptr;  // the tensor, or `wrapped` for a number
  bool is_scalar = false;
  Scalar scalar;
  Tensor wrapped;
  union {
    double d;
    int64_t i;
    bool b;
  } storage = {0.0};

  const Tensor& t() const { return *tensor; }
  // Makes this the wrapped number `s` (a 0-dim tensor over `storage`).
  void set_scalar(const Scalar& s) {
    scalar = s;
    is_scalar = true;
    ScalarType dt = ScalarType::Bool;
    switch (s.kind) {
      case Scalar::Kind::Double: storage.d = s.d; dt = ScalarType::Double; break;
      case Scalar::Kind::Int: storage.i = s.i; dt = ScalarType::Long; break;
      case Scalar::Kind::Bool: storage.b = s.b; break;
    }
    make_contiguous_tensor(wrapped, dt, {}, &storage, sizeof(storage));
    tensor = &wrapped;
  }
  void add_to(ResultType& rt) const {
    if (is_scalar) rt.add(scalar);
    else rt.add(*tensor);
  }
};

inline bool tensor_or_scalar_arg(KernelContext& ctx, std::span<EValue*> args, size_t i, const char* op,
                                 TensorOrScalar* out) {
  const EValue* v = args[i];
  if (v != nullptr && (v->tag == EValue::Tag::Int || v->tag == EValue::Tag::Double || v->tag == EValue::Tag::Bool)) {
    Scalar sc;
    scalar_arg(ctx, args, i, op, &sc);
    out->set_scalar(sc);
    return true;
  }
  out->tensor = tensor_arg(ctx, args, i, op);
  return out->tensor != nullptr;
}

// An optional Scalar: false in *present for None.
inline bool opt_scalar_arg(KernelContext& ctx, std::span<EValue*> args, size_t i, const char* op, Scalar* out,
                           bool* present) {
  *present = !(args[i] != nullptr && args[i]->is_none());
  return !*present || scalar_arg(ctx, args, i, op, out);
}

inline bool int_arg(KernelContext& ctx, std::span<EValue*> args, size_t i, const char* op, int64_t* out) {
  if (args[i] != nullptr && args[i]->tag == EValue::Tag::Int) {
    *out = args[i]->to_int();
    return true;
  }
  ctx.fail(Status::InvalidArgument, "%s: argument %zu must be an int", op, i);
  return false;
}

inline bool bool_arg(KernelContext& ctx, std::span<EValue*> args, size_t i, const char* op, bool* out) {
  if (args[i] != nullptr && args[i]->tag == EValue::Tag::Bool) {
    *out = args[i]->to_bool();
    return true;
  }
  ctx.fail(Status::InvalidArgument, "%s: argument %zu must be a bool", op, i);
  return false;
}

inline bool double_arg(KernelContext& ctx, std::span<EValue*> args, size_t i, const char* op, double* out) {
  if (args[i] != nullptr && (args[i]->tag == EValue::Tag::Double || args[i]->tag == EValue::Tag::Int)) {
    *out = args[i]->tag == EValue::Tag::Double ? args[i]->to_double() : static_cast<double>(args[i]->to_int());
    return true;
  }
  ctx.fail(Status::InvalidArgument, "%s: argument %zu must be a float", op, i);
  return false;
}

// An int list (an `int[]` argument); `int[1]` arguments also accept a single Int.
inline bool int_list_arg(KernelContext& ctx, std::span<EValue*> args, size_t i, const char* op,
                         std::span<const int64_t>* out) {
  const EValue* v = args[i];
  if (v != nullptr && v->tag == EValue::Tag::IntList) {
    *out = v->ints;
    return true;
  }
  if (v != nullptr && v->tag == EValue::Tag::Int) {
    *out = std::span<const int64_t>(&v->scalar.i, 1);
    return true;
  }
  ctx.fail(Status::InvalidArgument, "%s: argument %zu must be an int list", op, i);
  return false;
}

// An optional ScalarType (c10 numbering as Int); *present false for None.
inline bool opt_dtype_arg(KernelContext& ctx, std::span<EValue*> args, size_t i, const char* op, ScalarType* out,
                          bool* present) {
  *present = false;
  if (args[i] != nullptr && args[i]->is_none()) return true;
  int64_t code;
  if (!int_arg(ctx, args, i, op, &code)) return false;
  ScalarType dt = static_cast<ScalarType>(code);
  if (code < 0 || code > 127 || !is_supported_dtype(dt)) {
    ctx.fail(Status::NotSupported, "%s: dtype code %lld is not supported", op, static_cast<long long>(code));
    return false;
  }
  *out = dt;
  *present = true;
  return true;
}

// Wraps a (possibly negative) dim into [0, ndim); 0-dim tensors accept -1 and 0.
inline bool wrap_dim(KernelContext& ctx, int64_t d, int32_t ndim, const char* op, int32_t* out) {
  int64_t n = ndim == 0 ? 1 : ndim;
  if (d < -n || d >= n) {
    ctx.fail(Status::InvalidArgument, "%s: dim %lld out of range for a tensor of rank %d", op,
             static_cast<long long>(d), ndim);
    return false;
  }
  *out = static_cast<int32_t>(d < 0 ? d + n : d);
  return true;
}

// Gives `out` the shape the kernel computed: a no-op when it already has it,
// else a resize within its planned capacity; InvalidArgument when it cannot.
inline bool resize_out(KernelContext& ctx, Tensor& out, std::span<const int64_t> shape, const char* op) {
  if (out.same_shape(shape)) {
    if (out.nbytes() <= out.capacity_bytes) return true;
    ctx.fail(Status::InvalidArgument, "%s: out needs %zu bytes but has room for %zu", op, out.nbytes(),
             out.capacity_bytes);
    return false;
  }
  if (resize_tensor(out, shape) == Status::Ok) return true;
  char want[160], have[160];
  ctx.fail(Status::InvalidArgument, "%s: out has shape %s but the result has shape %s", op,
           format_shape(have, sizeof(have), out.shape()), format_shape(want, sizeof(want), shape));
  return false;
}

inline bool check_out_dtype(KernelContext& ctx, const Tensor& out, ScalarType want, const char* op) {
  if (out.dtype == want) return true;
  ctx.fail(Status::InvalidArgument, "%s: out has dtype %s, expected %s", op, dtype_str(out.dtype), dtype_str(want));
  return false;
}

// The result dtype `from` must be castable to the out tensor's dtype (torch's out= rule).
inline bool check_can_cast_out(KernelContext& ctx, ScalarType from, const Tensor& out, const char* op) {
  if (can_cast(from, out.dtype)) return true;
  ctx.fail(Status::InvalidArgument, "%s: result type %s can't be cast to the out dtype %s", op, dtype_str(from),
           dtype_str(out.dtype));
  return false;
}

}  // namespace kiln::rt::kernels
