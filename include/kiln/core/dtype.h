// Tensor element types. kiln numbers them as PyTorch's c10::ScalarType does,
// which is also the numbering ExecuTorch's program format stores, so a dtype
// travels from the .pt2 reader to the .pte writer without translation.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

namespace kiln {

enum class ScalarType : int8_t {
  Byte = 0,      // uint8
  Char = 1,      // int8
  Short = 2,     // int16
  Int = 3,       // int32
  Long = 4,      // int64
  Half = 5,      // float16
  Float = 6,     // float32
  Double = 7,    // float64
  ComplexHalf = 8,
  ComplexFloat = 9,
  ComplexDouble = 10,
  Bool = 11,
  QInt8 = 12,
  QUInt8 = 13,
  QInt32 = 14,
  BFloat16 = 15,
  UInt16 = 27,
  UInt32 = 28,
  UInt64 = 29,
  Float8_e5m2 = 23,
  Float8_e4m3fn = 24,
  Float8_e5m2fnuz = 25,
  Float8_e4m3fnuz = 26,
  Float8_e8m0fnu = 44,
};

// Bytes per element.
int element_size(ScalarType t);

// Short lowercase name as numpy/torch users know it ("float32", "int64", ...).
std::string_view dtype_name(ScalarType t);

// The torch.export serialization (torch/_export/serde/schema.py ScalarType)
// numbers dtypes differently from c10; nullopt for codes kiln does not know.
std::optional<ScalarType> scalar_type_from_export_code(int64_t code);

// The bfloat16 value stored at `p` (two bytes, little-endian, any alignment), widened exactly to float.
inline float bf16_to_float(const std::byte* p) {
  uint16_t b;
  std::memcpy(&b, p, 2);
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// IEEE binary16 (float16) bits widened exactly to float, and a float rounded to the nearest binary16, ties
// to even (overflow to infinity, NaN kept a quiet NaN): plain integer code, because GCC 12 has no C++
// _Float16 on AArch64 and code outside the kernels must build there too.
inline float half_bits_to_float_exact(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t man = h & 0x3ffu, u;
  if (exp == 0x1f) {
    u = sign | 0x7f800000u | (man << 13);
  } else if (exp != 0) {
    u = sign | ((exp + 112u) << 23) | (man << 13);
  } else if (man == 0) {
    u = sign;
  } else {  // subnormal: man * 2^-24, normalised
    uint32_t e = 113;
    while (!(man & 0x400u)) {
      man <<= 1;
      --e;
    }
    u = sign | (e << 23) | ((man & 0x3ffu) << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint16_t float_to_half_bits_rne(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const auto sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  u &= 0x7fffffffu;
  if (u >= 0x7f800000u) return static_cast<uint16_t>(sign | (u > 0x7f800000u ? 0x7e00u : 0x7c00u));
  if (u >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // 65520 and up: infinity
  if (u < 0x38800000u) {  // below 2^-14: a subnormal, in units of 2^-24 (1024: the smallest normal)
    if (u < 0x33000000u) return sign;  // at most 2^-25: rounds to zero (2^-25 itself ties to the even 0)
    const uint32_t exp = u >> 23, man = (u & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126u - exp;  // man * 2^(exp - 150) in units of 2^-24: man >> (126 - exp)
    uint32_t q = man >> shift;
    const uint32_t rem = man & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1u))) ++q;
    return static_cast<uint16_t>(sign | q);
  }
  u += 0xfffu + ((u >> 13) & 1u);  // round the 13 dropped bits to nearest, ties to even
  return static_cast<uint16_t>(sign | ((u - (112u << 23)) >> 13));
}

// float16, bfloat16, float32 or float64.
inline bool is_floating_type(ScalarType t) {
  return t == ScalarType::Half || t == ScalarType::BFloat16 || t == ScalarType::Float || t == ScalarType::Double;
}

// torch.promote_types over the real dtypes and bool (c10::promoteTypes): the one rule the lowering passes and
// the portable kernels share. Floating beats integral; two 16-bit floats of different kinds meet at float32;
// uint8 with int8 meets at int16; otherwise the wider type.
inline ScalarType promote_types(ScalarType a, ScalarType b) {
  if (a == b) return a;
  auto floating = is_floating_type;
  auto float_rank = [](ScalarType t) { return t == ScalarType::Double ? 2 : t == ScalarType::Float ? 1 : 0; };
  if (floating(a) || floating(b)) {
    if (!floating(b)) return a;
    if (!floating(a)) return b;
    const int ra = float_rank(a), rb = float_rank(b);
    if (ra == 0 && rb == 0) return ScalarType::Float;  // float16 with bfloat16
    return ra >= rb ? a : b;
  }
  if (a == ScalarType::Bool) return b;
  if (b == ScalarType::Bool) return a;
  if (a == ScalarType::Byte || b == ScalarType::Byte) {
    const ScalarType other = a == ScalarType::Byte ? b : a;
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

}  // namespace kiln
