#include "kiln/core/dtype.h"

namespace kiln {

int element_size(ScalarType t) {
  switch (t) {
    case ScalarType::Byte:
    case ScalarType::Char:
    case ScalarType::Bool:
    case ScalarType::QInt8:
    case ScalarType::QUInt8:
    case ScalarType::Float8_e5m2:
    case ScalarType::Float8_e4m3fn:
    case ScalarType::Float8_e5m2fnuz:
    case ScalarType::Float8_e4m3fnuz:
    case ScalarType::Float8_e8m0fnu:
      return 1;
    case ScalarType::Short:
    case ScalarType::Half:
    case ScalarType::BFloat16:
    case ScalarType::UInt16:
      return 2;
    case ScalarType::Int:
    case ScalarType::Float:
    case ScalarType::QInt32:
    case ScalarType::UInt32:
    case ScalarType::ComplexHalf:
      return 4;
    case ScalarType::Long:
    case ScalarType::Double:
    case ScalarType::ComplexFloat:
    case ScalarType::UInt64:
      return 8;
    case ScalarType::ComplexDouble:
      return 16;
  }
  return 0;
}

std::string_view dtype_name(ScalarType t) {
  switch (t) {
    case ScalarType::Byte: return "uint8";
    case ScalarType::Char: return "int8";
    case ScalarType::Short: return "int16";
    case ScalarType::Int: return "int32";
    case ScalarType::Long: return "int64";
    case ScalarType::Half: return "float16";
    case ScalarType::Float: return "float32";
    case ScalarType::Double: return "float64";
    case ScalarType::ComplexHalf: return "complex32";
    case ScalarType::ComplexFloat: return "complex64";
    case ScalarType::ComplexDouble: return "complex128";
    case ScalarType::Bool: return "bool";
    case ScalarType::QInt8: return "qint8";
    case ScalarType::QUInt8: return "quint8";
    case ScalarType::QInt32: return "qint32";
    case ScalarType::BFloat16: return "bfloat16";
    case ScalarType::UInt16: return "uint16";
    case ScalarType::UInt32: return "uint32";
    case ScalarType::UInt64: return "uint64";
    case ScalarType::Float8_e5m2: return "float8_e5m2";
    case ScalarType::Float8_e4m3fn: return "float8_e4m3fn";
    case ScalarType::Float8_e5m2fnuz: return "float8_e5m2fnuz";
    case ScalarType::Float8_e4m3fnuz: return "float8_e4m3fnuz";
    case ScalarType::Float8_e8m0fnu: return "float8_e8m0fnu";
  }
  return "unknown";
}

std::optional<ScalarType> scalar_type_from_export_code(int64_t code) {
  switch (code) {
    case 1: return ScalarType::Byte;
    case 2: return ScalarType::Char;
    case 3: return ScalarType::Short;
    case 4: return ScalarType::Int;
    case 5: return ScalarType::Long;
    case 6: return ScalarType::Half;
    case 7: return ScalarType::Float;
    case 8: return ScalarType::Double;
    case 9: return ScalarType::ComplexHalf;
    case 10: return ScalarType::ComplexFloat;
    case 11: return ScalarType::ComplexDouble;
    case 12: return ScalarType::Bool;
    case 13: return ScalarType::BFloat16;
    case 28: return ScalarType::UInt16;
    case 29: return ScalarType::Float8_e4m3fn;
    case 30: return ScalarType::Float8_e5m2;
    case 31: return ScalarType::Float8_e4m3fnuz;
    case 32: return ScalarType::Float8_e5m2fnuz;
    case 33: return ScalarType::Float8_e8m0fnu;
    case 34: return ScalarType::UInt32;
    case 35: return ScalarType::UInt64;
    default: return std::nullopt;
  }
}

}  // namespace kiln
