// Typed kernels and their one-line registration.
//
// A kernel is a function with a typed signature, one C++ parameter per schema
// argument of its out variant (outs included, in schema order):
//
//   void gelu_out(KernelContext& ctx, const Tensor& self, std::string_view approximate, Tensor& out);
//   KILN_KERNEL(gelu_out, gelu_out);   // the aten_ops.def id, the function
//
// The macro builds the boxed entry point the executor calls (EValue* args ->
// typed values, every EValue tag checked first, so a malformed program gets an
// error naming the argument, never a crash) and records the parameter types,
// which the registry checks against the schema text at start-up
// (check_kernel_entry). Schema types and the C++ types that take them:
//
//   Tensor            const Tensor&, Tensor& (outs: Tensor& only), TensorOrScalar (a wrapped number allowed)
//   Tensor?           const Tensor*              Tensor[] TensorList     Tensor?[] OptionalTensorList
//   int, SymInt       int64_t                    int?     std::optional<int64_t>
//   int[], SymInt[]   IntArrayRef                int[]?   std::optional<IntArrayRef>
//   float             double                     float?   std::optional<double>
//   float[]           FloatArrayRef              float[]? std::optional<FloatArrayRef>
//   bool              bool                       bool?    std::optional<bool>
//   Scalar            Scalar                     Scalar?  std::optional<Scalar>
//   ScalarType        ScalarType                 ScalarType?  std::optional<ScalarType>
//   str               std::string_view           str?     std::optional<std::string_view>
//   MemoryFormat?     std::optional<MemoryFormat>
//
// KILN_KERNEL and KILN_BOXED_KERNEL (a kernel still written against the raw
// EValue* args; no type check) are used at namespace kiln::rt::kernels scope.
#pragma once

#include "kernel_util.h"
#include "registration.h"
#include "widen_16_bit.h"

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>

namespace kiln::rt::kernels {

using IntArrayRef = std::span<const int64_t>;
using TensorList = std::span<Tensor* const>;
using FloatArrayRef = std::span<const double>;
struct OptionalTensorList {
  std::span<Tensor* const> items;  // nullptr for a None entry
};
enum class MemoryFormat : int64_t { Contiguous = 0, Preserve = 1, ChannelsLast = 2, ChannelsLast3d = 3 };

// A parameter's schema type as recorded in KernelEntry::params: the ops::Type, with
// kMutableParam set for Tensor& (a kernel may write it) and kWrappedParam for
// TensorOrScalar.
constexpr uint8_t kMutableParam = 0x80;
constexpr uint8_t kWrappedParam = 0x40;
constexpr uint8_t kParamTypeMask = 0x3f;

namespace boxing {

// Where an argument sits, for messages: "aten::gelu.out: argument 1 (approximate) must be a str".
struct Where {
  const char* op;
  size_t index;
  std::string_view name;
  bool complex_ok = false;  // the kernel takes complex64/complex128 tensors (KILN_KERNEL_COMPLEX)
};

inline bool fail_arg(KernelContext& ctx, const Where& w, const char* what) {
  ctx.fail(Status::InvalidArgument, "%s: argument %zu (%.*s) must be %s", w.op, w.index,
           static_cast<int>(w.name.size()), w.name.data(), what);
  return false;
}

inline bool is_none(const EValue* v) { return v->tag == EValue::Tag::None; }

// A tensor the kernels can read or write: rank, dtype, dim order, data.
inline bool check_tensor(KernelContext& ctx, const Where& w, const Tensor* t) {
  if (t == nullptr) return fail_arg(ctx, w, "a tensor");
  if (t->dim < 0 || t->dim > kMaxDims) {
    ctx.fail(Status::InvalidArgument, "%s: argument %zu has invalid rank %d", w.op, w.index, t->dim);
    return false;
  }
  if (!is_supported_dtype(t->dtype) && !(w.complex_ok && is_complex_dtype(t->dtype))) {
    ctx.fail(Status::NotSupported, "%s: argument %zu has unsupported dtype %s", w.op, w.index, dtype_str(t->dtype));
    return false;
  }
  if (!t->is_contiguous()) {
    ctx.fail(Status::NotSupported, "%s: argument %zu is not contiguous (only identity dim order is supported)",
             w.op, w.index);
    return false;
  }
  if (t->data == nullptr && t->numel > 0) {
    ctx.fail(Status::InvalidArgument, "%s: argument %zu has no data", w.op, w.index);
    return false;
  }
  return true;
}

inline bool load_scalar(const EValue* v, Scalar* out) {
  switch (v->tag) {
    case EValue::Tag::Int: out->kind = Scalar::Kind::Int; out->i = v->to_int(); return true;
    case EValue::Tag::Double: out->kind = Scalar::Kind::Double; out->d = v->to_double(); return true;
    case EValue::Tag::Bool: out->kind = Scalar::Kind::Bool; out->b = v->to_bool(); return true;
    default: return false;
  }
}

// Arg<P>: schema type code, storage, load (tag checks), and the value passed to the kernel.
template <typename P>
struct Arg {
  static_assert(sizeof(P) == 0, "KILN_KERNEL: this parameter type has no schema type (see register.h)");
};

template <typename Value, uint8_t Code>
struct Simple {
  static constexpr uint8_t code = Code;
  using Storage = Value;
  static Value pass(Storage& s) { return s; }
};

template <>
struct Arg<const Tensor&> {
  static constexpr uint8_t code = static_cast<uint8_t>(ops::Type::Tensor);
  using Storage = Tensor*;
  static bool load(KernelContext& ctx, const Where& w, const EValue* v, Storage& s) {
    if (v->tag != EValue::Tag::Tensor) return fail_arg(ctx, w, "a tensor");
    s = v->scalar.t;
    return check_tensor(ctx, w, s);
  }
  static const Tensor& pass(Storage& s) { return *s; }
};
template <>
struct Arg<Tensor&> : Arg<const Tensor&> {
  static constexpr uint8_t code = static_cast<uint8_t>(ops::Type::Tensor) | kMutableParam;
  static Tensor& pass(Storage& s) { return *s; }
};
template <>
struct Arg<const TensorOrScalar&> {
  static constexpr uint8_t code = static_cast<uint8_t>(ops::Type::Tensor) | kWrappedParam;
  using Storage = TensorOrScalar;
  static bool load(KernelContext& ctx, const Where& w, const EValue* v, Storage& s) {
    Scalar sc;
    if (load_scalar(v, &sc)) {
      s.set_scalar(sc);
      return true;
    }
    if (v->tag != EValue::Tag::Tensor) return fail_arg(ctx, w, "a tensor or a number");
    s.tensor = v->scalar.t;
    return check_tensor(ctx, w, s.tensor);
  }
  static const TensorOrScalar& pass(Storage& s) { return s; }
};
template <>
struct Arg<const Tensor*> {
  static constexpr uint8_t code = static_cast<uint8_t>(ops::Type::OptionalTensor);
  using Storage = const Tensor*;
  static bool load(KernelContext& ctx, const Where& w, const EValue* v, Storage& s) {
    if (is_none(v)) {
      s = nullptr;
      return true;
    }
    if (v->tag != EValue::Tag::Tensor) return fail_arg(ctx, w, "a tensor or None");
    s = v->scalar.t;
    return check_tensor(ctx, w, s);
  }
  static const Tensor* pass(Storage& s) { return s; }
};
template <>
struct Arg<TensorList> : Simple<TensorList, static_cast<uint8_t>(ops::Type::TensorList)> {
  static bool load(KernelContext& ctx, const Where& w, const EValue* v, Storage& s) {
    if (v->tag != EValue::Tag::TensorList) return fail_arg(ctx, w, "a tensor list");
    for (Tensor* t : v->tensors)
      if (!check_tensor(ctx, w, t)) return false;
    s = v->tensors;
    return true;
  }
};
template <>
struct Arg<OptionalTensorList> : Simple<OptionalTensorList, static_cast<uint8_t>(ops::Type::OptionalTensorList)> {
  static bool load(KernelContext& ctx, const Where& w, const EValue* v, Storage& s) {
    if (v->tag != EValue::Tag::OptionalTensorList && v->tag != EValue::Tag::TensorList)
      return fail_arg(ctx, w, "a list of optional tensors");
    for (Tensor* t : v->tensors)
      if (t != nullptr && !check_tensor(ctx, w, t)) return false;
    s.items = v->tensors;
    return true;
  }
};
template <>
struct Arg<int64_t> : Simple<int64_t, static_cast<uint8_t>(ops::Type::Int)> {
  static bool load(KernelContext& ctx, const Where& w, const EValue* v, Storage& s) {
    if (v->tag != EValue::Tag::Int) return fail_arg(ctx, w, "an int");
    s = v->to_int();
    return true;
  }
};
template <>
struct Arg<double> : Simple<double, static_cast<uint8_t>(ops::Type::Float)> {
  static bool load(KernelContext& ctx, const Where& w, const EValue* v, Storage& s) {
    if (v->tag == EValue::Tag::Double) s = v->to_double();
    else if (v->tag == EValue::Tag::Int) s = static_cast<double>(v->to_int());
    else return fail_arg(ctx, w, "a float");
    return true;
  }
};
template <>
struct Arg<bool> : Simple<bool, static_cast<uint8_t>(ops::Type::Bool)> {
  static bool load(KernelContext& ctx, const Where& w, const EValue* v, Storage& s) {
    if (v->tag != EValue::Tag::Bool) return fail_arg(ctx, w, "a bool");
    s = v->to_bool();
    return true;
  }
};
template <>
struct Arg<Scalar> : Simple<Scalar, static_cast<uint8_t>(ops::Type::Scalar)> {
  static bool load(KernelContext& ctx, const Where& w, const EValue* v, Storage& s) {
    return load_scalar(v, &s) || fail_arg(ctx, w, "a scalar (int, float or bool)");
  }
};
template <>
struct Arg<IntArrayRef> : Simple<IntArrayRef, static_cast<uint8_t>(ops::Type::IntList)> {
  // an int[N] argument also takes a single int
  static bool load(KernelContext& ctx, const Where& w, const EValue* v, Storage& s) {
    if (v->tag == EValue::Tag::IntList) s = v->ints;
    else if (v->tag == EValue::Tag::Int) s = IntArrayRef(&v->scalar.i, 1);
    else return fail_arg(ctx, w, "an int list");
    return true;
  }
};
template <>
struct Arg<FloatArrayRef> : Simple<FloatArrayRef, static_cast<uint8_t>(ops::Type::FloatList)> {
  static bool load(KernelContext& ctx, const Where& w, const EValue* v, Storage& s) {
    if (v->tag != EValue::Tag::DoubleList) return fail_arg(ctx, w, "a float list");
    s = v->doubles;
    return true;
  }
};
template <>
struct Arg<ScalarType> : Simple<ScalarType, static_cast<uint8_t>(ops::Type::ScalarType)> {
  static bool load(KernelContext& ctx, const Where& w, const EValue* v, Storage& s) {
    if (v->tag != EValue::Tag::Int) return fail_arg(ctx, w, "a dtype");
    const int64_t code = v->to_int();
    s = static_cast<ScalarType>(code);
    if (code < 0 || code > 127 || !is_supported_dtype(s)) {
      ctx.fail(Status::NotSupported, "%s: dtype code %lld is not supported", w.op, static_cast<long long>(code));
      return false;
    }
    return true;
  }
};
template <>
struct Arg<std::string_view> : Simple<std::string_view, static_cast<uint8_t>(ops::Type::String)> {
  static bool load(KernelContext& ctx, const Where& w, const EValue* v, Storage& s) {
    if (v->tag != EValue::Tag::String) return fail_arg(ctx, w, "a string");
    s = v->str;
    return true;
  }
};
template <>
struct Arg<MemoryFormat> : Simple<MemoryFormat, static_cast<uint8_t>(ops::Type::MemoryFormat)> {
  static bool load(KernelContext& ctx, const Where& w, const EValue* v, Storage& s) {
    if (v->tag != EValue::Tag::Int) return fail_arg(ctx, w, "a memory format");
    s = static_cast<MemoryFormat>(v->to_int());
    return true;
  }
};

// X? from X: None, or what Arg<X> takes.
constexpr uint8_t optional_code(uint8_t code) {
  switch (static_cast<ops::Type>(code)) {
    case ops::Type::Int: return static_cast<uint8_t>(ops::Type::OptionalInt);
    case ops::Type::IntList: return static_cast<uint8_t>(ops::Type::OptionalIntList);
    case ops::Type::FloatList: return static_cast<uint8_t>(ops::Type::OptionalFloatList);
    case ops::Type::Float: return static_cast<uint8_t>(ops::Type::OptionalFloat);
    case ops::Type::Bool: return static_cast<uint8_t>(ops::Type::OptionalBool);
    case ops::Type::Scalar: return static_cast<uint8_t>(ops::Type::OptionalScalar);
    case ops::Type::ScalarType: return static_cast<uint8_t>(ops::Type::OptionalScalarType);
    case ops::Type::String: return static_cast<uint8_t>(ops::Type::OptionalString);
    case ops::Type::MemoryFormat: return static_cast<uint8_t>(ops::Type::OptionalMemoryFormat);
    default: return static_cast<uint8_t>(ops::Type::Count);
  }
}
template <typename X>
struct Arg<std::optional<X>> : Simple<std::optional<X>, optional_code(Arg<X>::code)> {
  static_assert(optional_code(Arg<X>::code) != static_cast<uint8_t>(ops::Type::Count), "no optional form");
  static bool load(KernelContext& ctx, const Where& w, const EValue* v, std::optional<X>& s) {
    if (is_none(v)) {
      s.reset();
      return true;
    }
    typename Arg<X>::Storage x{};
    if (!Arg<X>::load(ctx, w, v, x)) return false;
    s = x;
    return true;
  }
};

// Parameter types as declared (const T by value is T; const T& of a value type is T).
template <typename P>
struct Normalize {
  using type = std::remove_cv_t<P>;
};
template <typename P>
  requires(std::is_reference_v<P> && !std::is_same_v<std::remove_cvref_t<P>, Tensor> &&
           !std::is_same_v<std::remove_cvref_t<P>, TensorOrScalar>)
struct Normalize<P> {
  using type = std::remove_cvref_t<P>;
};
template <typename P>
using ArgOf = Arg<typename Normalize<P>::type>;

template <typename F>
struct Signature;
template <typename... P>
struct Signature<void (*)(KernelContext&, P...)> {
  static constexpr uint8_t codes[sizeof...(P) + 1] = {ArgOf<P>::code..., 0};
  static constexpr int count = static_cast<int>(sizeof...(P));
};

template <ops::OpId Id, auto Fn, bool ComplexOk, typename... P>
void call(KernelContext& ctx, std::span<EValue*> args, void (*)(KernelContext&, P...)) {
  const ops::Schema& schema = ops::op_schema(Id);
  const char* op = ops::op_name(Id).data();  // NUL-terminated
  if (args.size() != sizeof...(P)) {
    ctx.fail(Status::InvalidArgument, "%s: expected %zu arguments, got %zu", op, sizeof...(P), args.size());
    return;
  }
  for (size_t i = 0; i < args.size(); ++i)
    if (args[i] == nullptr) {
      ctx.fail(Status::InvalidArgument, "%s: argument %zu is missing", op, i);
      return;
    }
  std::tuple<typename ArgOf<P>::Storage...> st;
  const bool ok = [&]<size_t... I>(std::index_sequence<I...>) {
    return (ArgOf<P>::load(ctx, Where{op, I, schema.args[I].name, ComplexOk}, args[I], std::get<I>(st)) && ...);
  }(std::index_sequence_for<P...>{});
  if (!ok) return;
  [&]<size_t... I>(std::index_sequence<I...>) { Fn(ctx, ArgOf<P>::pass(std::get<I>(st))...); }(
      std::index_sequence_for<P...>{});
}

template <ops::OpId Id, auto Fn, bool ComplexOk = false>
void boxed(KernelContext& ctx, std::span<EValue*> args) {
  call<Id, Fn, ComplexOk>(ctx, args, Fn);
}

template <ops::OpId Id, auto Fn, bool ComplexOk = false>
constexpr KernelEntry typed_entry() {
  using S = Signature<decltype(Fn)>;
  return KernelEntry{static_cast<uint16_t>(Id), &boxed<Id, Fn, ComplexOk>, S::codes, S::count};
}

template <ops::OpId Id, auto Fn>
void boxed_widened(KernelContext& ctx, std::span<EValue*> args) {
  run_widened_16_bit(ctx, args, static_cast<size_t>(ops::op_schema(Id).num_outs), &boxed<Id, Fn>);
}

template <ops::OpId Id, auto Fn>
constexpr KernelEntry widened_entry() {
  using S = Signature<decltype(Fn)>;
  return KernelEntry{static_cast<uint16_t>(Id), &boxed_widened<Id, Fn>, S::codes, S::count};
}

}  // namespace boxing

}  // namespace kiln::rt::kernels

#define KILN_KERNEL(id, fn)                                  \
  extern const ::kiln::rt::KernelEntry kiln_kernel_##id;     \
  const ::kiln::rt::KernelEntry kiln_kernel_##id =           \
      ::kiln::rt::kernels::boxing::typed_entry<::kiln::ops::OpId::id, &fn>()

// A float32 kernel also run for float16 / bfloat16 tensors, on float32 copies, its outs rounded back
// (widen_16_bit.h): for operators torch computes in float32 for those types.
#define KILN_KERNEL_WIDENS_16_BIT(id, fn)                    \
  extern const ::kiln::rt::KernelEntry kiln_kernel_##id;     \
  const ::kiln::rt::KernelEntry kiln_kernel_##id =           \
      ::kiln::rt::kernels::boxing::widened_entry<::kiln::ops::OpId::id, &fn>()

// A kernel whose tensors may also be complex64/complex128 (the copies and conversions: kiln computes nothing
// in complex; a program that converts to complex and returns it runs). Every other kernel refuses them.
#define KILN_KERNEL_COMPLEX(id, fn)                          \
  extern const ::kiln::rt::KernelEntry kiln_kernel_##id;     \
  const ::kiln::rt::KernelEntry kiln_kernel_##id =           \
      ::kiln::rt::kernels::boxing::typed_entry<::kiln::ops::OpId::id, &fn, true>()

