// Chunked, dtype-converting loads and stores for kiln's portable kernels: m
// elements of a tensor's dtype (any stride) to or from a stack buffer of a C++
// compute type, kChunk elements at a time, in loops that vectorize.
#pragma once

#include "dtype.h"

#include <cstdint>
#include <cstring>
#include <type_traits>

namespace kiln::rt::kernels {

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

}  // namespace kiln::rt::kernels
