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

}  // namespace kiln
