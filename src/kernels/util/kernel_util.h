// Internal helpers for kiln's portable kernels, for any kernel source to share:
// argument access and checking (arity, tags, dtypes, contiguity, out shapes),
// dtype dispatch, float16/bfloat16 storage types, torch's type promotion
// (promote_types, can_cast, result_type with wrapped numbers and 0-dim tensors),
// numpy broadcasting, and a broadcasting elementwise loop with dtype conversion.
// Header-only; nothing here allocates (fixed-size stack state).
#pragma once

#include "kiln/runtime/kernel.h"

#include <array>
#include <cstdint>
#include <cstdio>
#include <initializer_list>
#include <cstring>
#include <limits>
#include <span>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>

namespace kiln::rt::kernels {

// ---------------------------------------------------------------------------
// Reduced-precision floats: storage types; arithmetic happens in float.

struct Half {
  uint16_t bits;
};
struct BFloat16 {
  uint16_t bits;
};

inline float half_bits_to_float(uint16_t b) {
  _Float16 h;
  std::memcpy(&h, &b, 2);
  return static_cast<float>(h);
}
inline uint16_t float_to_half_bits(float f) {
  _Float16 h = static_cast<_Float16>(f);  // round to nearest even
  uint16_t b;
  std::memcpy(&b, &h, 2);
  return b;
}
inline float bf16_bits_to_float(uint16_t b) {
  uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint16_t float_to_bf16_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
  return static_cast<uint16_t>(u >> 16);
}

template <typename T>
inline constexpr bool is_reduced_float_v = std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>;
template <typename T>
inline constexpr bool is_float_v = std::is_floating_point_v<T> || is_reduced_float_v<T>;
template <typename T>
inline constexpr bool is_int_v = std::is_integral_v<T> && !std::is_same_v<T, bool>;

// The type arithmetic on a storage type T happens in (float for Half/BFloat16).
template <typename T>
using compute_t = std::conditional_t<is_reduced_float_v<T>, float, T>;

// Truncation toward zero; NaN and values outside int64 give INT64_MIN (what
// x86's conversion instruction gives) instead of undefined behaviour.
inline int64_t float_to_int64(double v) {
  if (!(v >= -9223372036854775808.0 && v < 9223372036854775808.0)) return std::numeric_limits<int64_t>::min();
  return static_cast<int64_t>(v);
}

// Value conversion between any two storage/compute types, as a C++ static_cast
// would do it (bool: != 0; floats to ints truncate, through int64), with Half/BFloat16 through float.
template <typename To, typename From>
inline To convert(From v) {
  if constexpr (std::is_same_v<To, From>) {
    return v;
  } else if constexpr (std::is_same_v<From, Half>) {
    return convert<To>(half_bits_to_float(v.bits));
  } else if constexpr (std::is_same_v<From, BFloat16>) {
    return convert<To>(bf16_bits_to_float(v.bits));
  } else if constexpr (std::is_same_v<To, Half>) {
    return Half{float_to_half_bits(static_cast<float>(v))};
  } else if constexpr (std::is_same_v<To, BFloat16>) {
    return BFloat16{float_to_bf16_bits(static_cast<float>(v))};
  } else if constexpr (std::is_same_v<To, bool>) {
    return v != From(0);
  } else if constexpr (std::is_floating_point_v<From> && std::is_integral_v<To>) {
    return static_cast<To>(float_to_int64(static_cast<double>(v)));  // via int64, defined for any value
  } else {
    return static_cast<To>(v);
  }
}

// ---------------------------------------------------------------------------
// Dtype dispatch: f(TypeTag<T>{}) with T the storage type of `dt`.

template <typename T>
struct TypeTag {
  using type = T;
};

enum DtypeSet : unsigned {
  kBoolTypes = 1u,
  kIntTypes = 2u,      // uint8, int8, int16, int32, int64
  kFloatTypes = 4u,    // float32, float64
  kReducedTypes = 8u,  // float16, bfloat16
  kFloatingTypes = kFloatTypes | kReducedTypes,
  kIntegralTypes = kBoolTypes | kIntTypes,
  kRealTypes = kIntTypes | kFloatingTypes,  // everything but bool
  kAllTypes = kBoolTypes | kIntTypes | kFloatingTypes,
};

// Calls f with the TypeTag of dt when dt is in `set`; false (f not called) otherwise.
// Every type of `set` instantiates f, so f's body must compile for each of them.
template <unsigned Set = kAllTypes, typename F>
inline bool dispatch(ScalarType dt, F&& f) {
  switch (dt) {
    case ScalarType::Bool:
      if constexpr ((Set & kBoolTypes) != 0) { f(TypeTag<bool>{}); return true; }
      break;
    case ScalarType::Byte:
      if constexpr ((Set & kIntTypes) != 0) { f(TypeTag<uint8_t>{}); return true; }
      break;
    case ScalarType::Char:
      if constexpr ((Set & kIntTypes) != 0) { f(TypeTag<int8_t>{}); return true; }
      break;
    case ScalarType::Short:
      if constexpr ((Set & kIntTypes) != 0) { f(TypeTag<int16_t>{}); return true; }
      break;
    case ScalarType::Int:
      if constexpr ((Set & kIntTypes) != 0) { f(TypeTag<int32_t>{}); return true; }
      break;
    case ScalarType::Long:
      if constexpr ((Set & kIntTypes) != 0) { f(TypeTag<int64_t>{}); return true; }
      break;
    case ScalarType::Float:
      if constexpr ((Set & kFloatTypes) != 0) { f(TypeTag<float>{}); return true; }
      break;
    case ScalarType::Double:
      if constexpr ((Set & kFloatTypes) != 0) { f(TypeTag<double>{}); return true; }
      break;
    case ScalarType::Half:
      if constexpr ((Set & kReducedTypes) != 0) { f(TypeTag<Half>{}); return true; }
      break;
    case ScalarType::BFloat16:
      if constexpr ((Set & kReducedTypes) != 0) { f(TypeTag<BFloat16>{}); return true; }
      break;
    default:
      break;
  }
  return false;
}

template <typename T>
constexpr ScalarType dtype_of() {
  if constexpr (std::is_same_v<T, bool>) return ScalarType::Bool;
  else if constexpr (std::is_same_v<T, uint8_t>) return ScalarType::Byte;
  else if constexpr (std::is_same_v<T, int8_t>) return ScalarType::Char;
  else if constexpr (std::is_same_v<T, int16_t>) return ScalarType::Short;
  else if constexpr (std::is_same_v<T, int32_t>) return ScalarType::Int;
  else if constexpr (std::is_same_v<T, int64_t>) return ScalarType::Long;
  else if constexpr (std::is_same_v<T, float>) return ScalarType::Float;
  else if constexpr (std::is_same_v<T, double>) return ScalarType::Double;
  else if constexpr (std::is_same_v<T, Half>) return ScalarType::Half;
  else {
    static_assert(std::is_same_v<T, BFloat16>, "not a kernel storage type");
    return ScalarType::BFloat16;
  }
}

// "No dtype": a ScalarType value outside c10's numbering.
inline constexpr ScalarType kNoDtype = static_cast<ScalarType>(-1);

// ---------------------------------------------------------------------------
// Dtype categories and torch's promotion rules (c10::promoteTypes, canCast, result_type).

inline bool in_set(ScalarType dt, unsigned set) {
  switch (dt) {
    case ScalarType::Bool: return (set & kBoolTypes) != 0;
    case ScalarType::Byte: case ScalarType::Char: case ScalarType::Short: case ScalarType::Int:
    case ScalarType::Long: return (set & kIntTypes) != 0;
    case ScalarType::Float: case ScalarType::Double: return (set & kFloatTypes) != 0;
    case ScalarType::Half: case ScalarType::BFloat16: return (set & kReducedTypes) != 0;
    default: return false;
  }
}
inline bool is_floating(ScalarType dt) { return in_set(dt, kFloatingTypes); }
inline bool is_integral(ScalarType dt, bool include_bool) {
  return in_set(dt, include_bool ? kIntegralTypes : kIntTypes);
}
inline bool is_supported_dtype(ScalarType dt) { return in_set(dt, kAllTypes); }

// Promotion of two supported dtypes (torch.promote_types).
inline ScalarType promote_types(ScalarType a, ScalarType b) {
  if (a == b) return a;
  auto float_rank = [](ScalarType t) { return t == ScalarType::Double ? 2 : t == ScalarType::Float ? 1 : 0; };
  if (is_floating(a) || is_floating(b)) {
    if (!is_floating(b)) return a;
    if (!is_floating(a)) return b;
    int ra = float_rank(a), rb = float_rank(b);
    if (ra == 0 && rb == 0) return ScalarType::Float;  // float16 with bfloat16
    return ra >= rb ? a : b;
  }
  if (a == ScalarType::Bool) return b;
  if (b == ScalarType::Bool) return a;
  if (a == ScalarType::Byte || b == ScalarType::Byte) {
    ScalarType other = a == ScalarType::Byte ? b : a;
    return other == ScalarType::Char ? ScalarType::Short : other;
  }
  auto int_rank = [](ScalarType t) {
    switch (t) {
      case ScalarType::Char: return 0;
      case ScalarType::Short: return 1;
      case ScalarType::Int: return 2;
      default: return 3;
    }
  };
  return int_rank(a) >= int_rank(b) ? a : b;
}

// torch.can_cast: no floating -> integral, no non-bool -> bool.
inline bool can_cast(ScalarType from, ScalarType to) {
  if (is_floating(from) && is_integral(to, true)) return false;
  if (from != ScalarType::Bool && to == ScalarType::Bool) return false;
  return true;
}

// A "Scalar" argument: what a Python number becomes in a schema.
struct Scalar {
  enum class Kind : uint8_t { Bool, Int, Double } kind = Kind::Int;
  int64_t i = 0;
  double d = 0;
  bool b = false;

  // The dtype torch gives the scalar when it promotes it as a wrapped number.
  ScalarType wrapped_dtype() const {
    return kind == Kind::Double ? ScalarType::Float : kind == Kind::Int ? ScalarType::Long : ScalarType::Bool;
  }
  template <typename C>
  C as() const {
    if (kind == Kind::Double) return convert<C>(d);
    if (kind == Kind::Int) return convert<C>(i);
    return convert<C>(b);
  }
  double as_double() const { return kind == Kind::Double ? d : kind == Kind::Int ? static_cast<double>(i) : b; }
};

// torch's result_type over operands of three priorities: tensors with dims,
// zero-dim tensors, and wrapped numbers (Scalars). A lower-priority operand only
// matters when it is of a higher category (bool < integral < floating).
struct ResultType {
  ScalarType dim = kNoDtype;
  ScalarType zero = kNoDtype;
  ScalarType wrapped = kNoDtype;

  void add(const Tensor& t) { add_to(t.dim == 0 ? zero : dim, t.dtype); }
  void add(const Scalar& s) { add_to(wrapped, s.wrapped_dtype()); }
  ScalarType result() const { return combine(dim, combine(zero, wrapped)); }

 private:
  static void add_to(ScalarType& slot, ScalarType t) { slot = slot == kNoDtype ? t : promote_types(slot, t); }
  static ScalarType combine(ScalarType higher, ScalarType lower) {
    if (higher == kNoDtype) return lower;
    if (lower == kNoDtype) return higher;
    if (is_floating(higher)) return higher;
    if (higher == ScalarType::Bool || is_floating(lower)) return promote_types(higher, lower);
    return higher;
  }
};

// ---------------------------------------------------------------------------
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

inline const char* dtype_str(ScalarType dt) { return dtype_name(dt).data(); }  // names are literals

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

// ---------------------------------------------------------------------------
// Broadcasting (numpy rules, size-0 dims included).

// Broadcasts shapes a and b into out; false when they are incompatible.
inline bool broadcast_shape(std::span<const int64_t> a, std::span<const int64_t> b, int64_t* out, int32_t* out_dim) {
  size_t n = a.size() > b.size() ? a.size() : b.size();
  if (n > static_cast<size_t>(kMaxDims)) return false;
  for (size_t k = 0; k < n; ++k) {
    int64_t sa = k < a.size() ? a[a.size() - 1 - k] : 1;
    int64_t sb = k < b.size() ? b[b.size() - 1 - k] : 1;
    if (sa != sb && sa != 1 && sb != 1) return false;
    out[n - 1 - k] = sa == 1 ? sb : sa;
  }
  *out_dim = static_cast<int32_t>(n);
  return true;
}

// Broadcast shape of several tensors; fails through ctx when incompatible.
inline bool broadcast_tensors_shape(KernelContext& ctx, std::initializer_list<const Tensor*> ts, int64_t* out,
                                    int32_t* out_dim, const char* op) {
  *out_dim = 0;
  for (const Tensor* t : ts) {
    int64_t tmp[kMaxDims];
    int32_t nd;
    if (!broadcast_shape(std::span<const int64_t>(out, static_cast<size_t>(*out_dim)), t->shape(), tmp, &nd)) {
      char s1[160], s2[160];
      ctx.fail(Status::InvalidArgument, "%s: shapes %s and %s are not broadcastable", op,
               format_shape(s1, sizeof(s1), std::span<const int64_t>(out, static_cast<size_t>(*out_dim))),
               format_shape(s2, sizeof(s2), t->shape()));
      return false;
    }
    std::memcpy(out, tmp, sizeof(int64_t) * static_cast<size_t>(nd));
    *out_dim = nd;
  }
  return true;
}

// ---------------------------------------------------------------------------
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

// Elements per chunk of the typed elementwise loops and conversion buffers (a multiple of 8).
constexpr int64_t kChunk = 256;

// Rounds m down / up to a multiple of 8. A loop whose trip count is known to be
// a multiple of 8 vectorizes under GCC's -O2 cost model (no scalar epilogue needed).
inline int64_t round_down8(int64_t m) { return m & ~int64_t{7}; }
inline int64_t round_up8(int64_t m) { return (m + 7) & ~int64_t{7}; }

// Whether values of C++ type C are stored as-is in a tensor of dtype dt.
template <typename C>
inline bool same_storage(ScalarType dt) {
  if constexpr (std::is_same_v<C, bool> || std::is_arithmetic_v<C>) return dt == dtype_of<C>();
  else return false;
}

// dst[i] = convert<To>(src[i * stride]) for i < m (non-overlapping).
template <typename To, typename From>
inline void convert_n(const From* __restrict src, int64_t stride, To* __restrict dst, int64_t m) {
  if (stride == 1) {
    const int64_t mv = round_down8(m);
    for (int64_t i = 0; i < mv; ++i) dst[i] = convert<To>(src[i]);
    for (int64_t i = mv; i < m; ++i) dst[i] = convert<To>(src[i]);
  } else {
    for (int64_t i = 0; i < m; ++i) dst[i] = convert<To>(src[i * stride]);
  }
}

// Converts m elements of dtype `dt` (stride in elements) at p into buf as C.
template <typename C>
inline void load_as(const char* p, ScalarType dt, int64_t stride, int64_t m, C* buf) {
  if (dt == ScalarType::Bool) {
    // Bool storage is read as bytes: memory a damaged program never wrote as bool (or
    // shares with a tensor of another dtype) may hold any byte, and loading one that is
    // not 0 or 1 as a C++ bool is undefined behaviour. Any nonzero byte is true.
    const auto* b = reinterpret_cast<const uint8_t*>(p);
    for (int64_t i = 0; i < m; ++i) buf[i] = convert<C>(b[i * stride] != 0);
    return;
  }
  if (stride == 1 && same_storage<C>(dt)) {
    std::memcpy(buf, p, sizeof(C) * static_cast<size_t>(m));
    return;
  }
  dispatch(dt, [&](auto tag) {
    using T = typename decltype(tag)::type;
    convert_n<C, T>(reinterpret_cast<const T*>(p), stride, buf, m);
  });
}

// Stores m values of C from buf into dtype `dt` at p (stride in elements).
template <typename C>
inline void store_as(const C* buf, char* p, ScalarType dt, int64_t stride, int64_t m) {
  if (stride == 1 && same_storage<C>(dt)) {
    std::memcpy(p, buf, sizeof(C) * static_cast<size_t>(m));
    return;
  }
  dispatch(dt, [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* __restrict dst = reinterpret_cast<T*>(p);
    if (stride == 1) {
      const int64_t mv = round_down8(m);
      for (int64_t i = 0; i < mv; ++i) dst[i] = convert<T>(buf[i]);
      for (int64_t i = mv; i < m; ++i) dst[i] = convert<T>(buf[i]);
    } else {
      for (int64_t i = 0; i < m; ++i) dst[i * stride] = convert<T>(buf[i]);
    }
  });
}

// Rounds float values to the precision of a reduced float dtype (no-op for others).
inline void round_to_dtype(float* buf, int64_t m, ScalarType dt) {
  if (dt == ScalarType::Half) {
    for (int64_t i = 0; i < m; ++i) buf[i] = half_bits_to_float(float_to_half_bits(buf[i]));
  } else if (dt == ScalarType::BFloat16) {
    for (int64_t i = 0; i < m; ++i) buf[i] = bf16_bits_to_float(float_to_bf16_bits(buf[i]));
  }
}
template <typename C>
inline void round_to_dtype(C*, int64_t, ScalarType) {}

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
