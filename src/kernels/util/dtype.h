// Dtypes for kiln's portable kernels: the float16/bfloat16 storage types and
// their float conversions, value conversion between any two storage types
// (convert), dtype sets and dispatch over them (dispatch: a dtype to its C++
// storage type), dtype_of (the other way), and the dtype categories.
#pragma once

#include "kiln/runtime/kernel.h"

#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

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

// Every dtype the kernels know, once: X(ScalarType enumerator, storage type, DtypeSet).
// dispatch, dtype_of and in_set are generated from it.
#define KILN_FOR_EACH_DTYPE(X)                                                 \
  X(Bool, bool, kBoolTypes)                                                   \
  X(Byte, uint8_t, kIntTypes) X(Char, int8_t, kIntTypes)                      \
  X(Short, int16_t, kIntTypes) X(Int, int32_t, kIntTypes)                     \
  X(Long, int64_t, kIntTypes)                                                 \
  X(Float, float, kFloatTypes) X(Double, double, kFloatTypes)                 \
  X(Half, Half, kReducedTypes) X(BFloat16, BFloat16, kReducedTypes)

// Calls f with the TypeTag of dt when dt is in `set`; false (f not called) otherwise.
// Every type of `set` instantiates f, so f's body must compile for each of them.
template <unsigned Set = kAllTypes, typename F>
inline bool dispatch(ScalarType dt, F&& f) {
  switch (dt) {
#define KILN_DISPATCH_CASE(name, type, set)   \
  case ScalarType::name:                      \
    if constexpr ((Set & (set)) != 0) {       \
      f(TypeTag<type>{});                     \
      return true;                            \
    }                                         \
    break;
    KILN_FOR_EACH_DTYPE(KILN_DISPATCH_CASE)
#undef KILN_DISPATCH_CASE
    default:
      break;
  }
  return false;
}

template <typename T>
struct DtypeOf {
  static_assert(sizeof(T) == 0, "not a kernel storage type");
};
#define KILN_DTYPE_OF(name, type, set)                    \
  template <>                                             \
  struct DtypeOf<type> {                                  \
    static constexpr ScalarType value = ScalarType::name; \
  };
KILN_FOR_EACH_DTYPE(KILN_DTYPE_OF)
#undef KILN_DTYPE_OF

template <typename T>
constexpr ScalarType dtype_of() {
  return DtypeOf<T>::value;
}

// "No dtype": a ScalarType value outside c10's numbering.
inline constexpr ScalarType kNoDtype = static_cast<ScalarType>(-1);

// ---------------------------------------------------------------------------
// Dtype categories.

inline bool in_set(ScalarType dt, unsigned set) {
  switch (dt) {
#define KILN_IN_SET_CASE(name, type, types) \
  case ScalarType::name:                    \
    return (set & (types)) != 0;
    KILN_FOR_EACH_DTYPE(KILN_IN_SET_CASE)
#undef KILN_IN_SET_CASE
    default: return false;
  }
}
inline bool is_floating(ScalarType dt) { return in_set(dt, kFloatingTypes); }
inline bool is_integral(ScalarType dt, bool include_bool) {
  return in_set(dt, include_bool ? kIntegralTypes : kIntTypes);
}
inline bool is_supported_dtype(ScalarType dt) { return in_set(dt, kAllTypes); }

// complex64 / complex128: storage only (pairs of float / double), for the kernels that opt in (register.h's
// KILN_KERNEL_COMPLEX) and the conversions of util/strided_copy.h.
inline bool is_complex_dtype(ScalarType dt) {
  return dt == ScalarType::ComplexFloat || dt == ScalarType::ComplexDouble;
}

inline const char* dtype_str(ScalarType dt) { return dtype_name(dt).data(); }  // names are literals

}  // namespace kiln::rt::kernels