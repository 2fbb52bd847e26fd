#include "kiln/core/dtype.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <string_view>

namespace kiln {
namespace {

// The export serialization's dtype codes (torch/_export/serde/schema.py) map
// onto c10's numbering, which ExecuTorch's program format also uses.
TEST(DType, ExportCodesMapToC10Numbering) {
  EXPECT_EQ(scalar_type_from_export_code(7), ScalarType::Float);
  EXPECT_EQ(static_cast<int>(ScalarType::Float), 6);
  EXPECT_EQ(scalar_type_from_export_code(5), ScalarType::Long);
  EXPECT_EQ(static_cast<int>(ScalarType::Long), 4);
  EXPECT_EQ(scalar_type_from_export_code(12), ScalarType::Bool);
  EXPECT_EQ(static_cast<int>(ScalarType::Bool), 11);
  EXPECT_EQ(scalar_type_from_export_code(13), ScalarType::BFloat16);
  EXPECT_EQ(static_cast<int>(ScalarType::BFloat16), 15);
  EXPECT_FALSE(scalar_type_from_export_code(0).has_value());
  EXPECT_FALSE(scalar_type_from_export_code(99).has_value());
}

TEST(DType, ElementSizes) {
  EXPECT_EQ(element_size(ScalarType::Float), 4);
  EXPECT_EQ(element_size(ScalarType::Long), 8);
  EXPECT_EQ(element_size(ScalarType::Half), 2);
  EXPECT_EQ(element_size(ScalarType::Bool), 1);
  EXPECT_EQ(dtype_name(ScalarType::Float), "float32");
}

// Every dtype's size and name as c10 defines them (c10/core/ScalarType.h),
// and its code in torch/_export/serde/schema.py where that schema has one.
TEST(DType, EveryDtypeAgreesWithC10AndTheExportSchema) {
  struct Row {
    ScalarType type;
    int size;
    std::string_view name;
    int export_code;  // 0: none
  };
  const Row rows[] = {
      {ScalarType::Byte, 1, "uint8", 1},           {ScalarType::Char, 1, "int8", 2},
      {ScalarType::Short, 2, "int16", 3},          {ScalarType::Int, 4, "int32", 4},
      {ScalarType::Long, 8, "int64", 5},           {ScalarType::Half, 2, "float16", 6},
      {ScalarType::Float, 4, "float32", 7},        {ScalarType::Double, 8, "float64", 8},
      {ScalarType::ComplexHalf, 4, "complex32", 9}, {ScalarType::ComplexFloat, 8, "complex64", 10},
      {ScalarType::ComplexDouble, 16, "complex128", 11}, {ScalarType::Bool, 1, "bool", 12},
      {ScalarType::QInt8, 1, "qint8", 0},          {ScalarType::QUInt8, 1, "quint8", 0},
      {ScalarType::QInt32, 4, "qint32", 0},        {ScalarType::BFloat16, 2, "bfloat16", 13},
      {ScalarType::UInt16, 2, "uint16", 28},       {ScalarType::UInt32, 4, "uint32", 34},
      {ScalarType::UInt64, 8, "uint64", 35},       {ScalarType::Float8_e5m2, 1, "float8_e5m2", 30},
      {ScalarType::Float8_e4m3fn, 1, "float8_e4m3fn", 29}, {ScalarType::Float8_e5m2fnuz, 1, "float8_e5m2fnuz", 32},
      {ScalarType::Float8_e4m3fnuz, 1, "float8_e4m3fnuz", 31}, {ScalarType::Float8_e8m0fnu, 1, "float8_e8m0fnu", 33},
  };
  for (const auto& r : rows) {
    SCOPED_TRACE(std::string(r.name));
    EXPECT_EQ(element_size(r.type), r.size);
    EXPECT_EQ(dtype_name(r.type), r.name);
    if (r.export_code != 0) {
      EXPECT_EQ(scalar_type_from_export_code(r.export_code), r.type);
    }
  }
  for (int code : {14, 27, 36, 44, -1}) EXPECT_FALSE(scalar_type_from_export_code(code).has_value()) << code;
  // Codes no dtype has (a corrupt file's): size 0, a name that says so.
  for (int code : {16, 22, 30, 43, 45, 100, -5}) {
    EXPECT_EQ(element_size(static_cast<ScalarType>(code)), 0) << code;
    EXPECT_EQ(dtype_name(static_cast<ScalarType>(code)), "unknown") << code;
  }
}

}  // namespace
}  // namespace kiln

#if defined(__x86_64__)  // the compiler's _Float16 (GCC 12 has it in C++ on x86-64 only) is the oracle
namespace {
uint16_t compiler_half(float f) {
  const _Float16 h = static_cast<_Float16>(f);
  uint16_t b;
  std::memcpy(&b, &h, 2);
  return b;
}
float float_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
}  // namespace

TEST(DType, HalfBitsWidenAsTheCompilerDoes) {
  for (uint32_t b = 0; b < 65536; ++b) {
    const auto h16 = static_cast<uint16_t>(b);
    _Float16 h;
    std::memcpy(&h, &h16, 2);
    const float want = static_cast<float>(h), got = kiln::half_bits_to_float_exact(h16);
    if (want != want) {
      EXPECT_NE(got, got) << b;
    } else {
      EXPECT_EQ(bits_of(got), bits_of(want)) << b;
    }
  }
}

TEST(DType, FloatRoundsToHalfAsTheCompilerDoes) {
  auto check = [](uint32_t u) {
    const float f = float_of(u);
    const uint16_t got = kiln::float_to_half_bits_rne(f), want = compiler_half(f);
    if (f != f) {
      EXPECT_EQ(got & 0x7c00, 0x7c00) << u;
      EXPECT_NE(got & 0x3ff, 0) << u;
    } else {
      ASSERT_EQ(got, want) << std::hex << u;
    }
  };
  for (uint64_t u = 0; u <= 0xffffffffull; u += 4093) check(static_cast<uint32_t>(u));
  // every half value's neighbourhood: the value, the midpoints to its neighbours and one float ulp either side
  for (uint32_t b = 0; b < 0x7c00; ++b) {
    const float lo = kiln::half_bits_to_float_exact(static_cast<uint16_t>(b));
    const float hi = kiln::half_bits_to_float_exact(static_cast<uint16_t>(b + 1));
    const uint32_t mid = bits_of(lo + (hi - lo) / 2);
    for (uint32_t u : {bits_of(lo), mid - 1, mid, mid + 1}) {
      check(u);
      check(u | 0x80000000u);
    }
  }
}
#endif
