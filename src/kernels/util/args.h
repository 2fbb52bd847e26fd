// Argument types and checks for kiln's portable kernels: TensorOrScalar (a
// Tensor argument that may arrive as a wrapped number), dim wrapping, and the out
// checks (shape, dtype). Each check reports its own failure through ctx and
// returns false; kernels return as soon as one does. (Arity and EValue tags are
// checked by the typed boxing in register.h before a kernel runs.)
#pragma once

#include "dtype.h"
#include "promote.h"
#include "scalar.h"

#include <cstdint>
#include <cstdio>
#include <span>

namespace kiln::rt::kernels {

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
