#include "kiln/core/dtype.h"

#include <array>

namespace kiln {
namespace {

// One row per dtype: c10's ScalarType, its name, bytes per element and its
// code in the torch.export serialization (torch/_export/serde/schema.py
// ScalarType; 0 where that schema has none).
struct DTypeRow {
  ScalarType type;
  std::string_view name;
  int size;
  int export_code;
};

constexpr DTypeRow kDTypes[] = {
    {ScalarType::Byte, "uint8", 1, 1},
    {ScalarType::Char, "int8", 1, 2},
    {ScalarType::Short, "int16", 2, 3},
    {ScalarType::Int, "int32", 4, 4},
    {ScalarType::Long, "int64", 8, 5},
    {ScalarType::Half, "float16", 2, 6},
    {ScalarType::Float, "float32", 4, 7},
    {ScalarType::Double, "float64", 8, 8},
    {ScalarType::ComplexHalf, "complex32", 4, 9},
    {ScalarType::ComplexFloat, "complex64", 8, 10},
    {ScalarType::ComplexDouble, "complex128", 16, 11},
    {ScalarType::Bool, "bool", 1, 12},
    {ScalarType::QInt8, "qint8", 1, 0},
    {ScalarType::QUInt8, "quint8", 1, 0},
    {ScalarType::QInt32, "qint32", 4, 0},
    {ScalarType::BFloat16, "bfloat16", 2, 13},
    {ScalarType::UInt16, "uint16", 2, 28},
    {ScalarType::UInt32, "uint32", 4, 34},
    {ScalarType::UInt64, "uint64", 8, 35},
    {ScalarType::Float8_e5m2, "float8_e5m2", 1, 30},
    {ScalarType::Float8_e4m3fn, "float8_e4m3fn", 1, 29},
    {ScalarType::Float8_e5m2fnuz, "float8_e5m2fnuz", 1, 32},
    {ScalarType::Float8_e4m3fnuz, "float8_e4m3fnuz", 1, 31},
    {ScalarType::Float8_e8m0fnu, "float8_e8m0fnu", 1, 33},
};

// Row index by c10 code (element_size sits on kernels' paths: no search).
constexpr int kMaxCode = 63;
constexpr auto kRowOf = [] {
  std::array<int8_t, kMaxCode + 1> rows{};
  rows.fill(-1);
  for (size_t i = 0; i < std::size(kDTypes); ++i) rows[static_cast<size_t>(kDTypes[i].type)] = static_cast<int8_t>(i);
  return rows;
}();

const DTypeRow* row_of(ScalarType t) {
  auto code = static_cast<int>(t);
  if (code < 0 || code > kMaxCode || kRowOf[static_cast<size_t>(code)] < 0) return nullptr;
  return &kDTypes[kRowOf[static_cast<size_t>(code)]];
}

}  // namespace

int element_size(ScalarType t) {
  const DTypeRow* r = row_of(t);
  return r ? r->size : 0;
}

std::string_view dtype_name(ScalarType t) {
  const DTypeRow* r = row_of(t);
  return r ? r->name : "unknown";
}

std::optional<ScalarType> scalar_type_from_export_code(int64_t code) {
  if (code <= 0) return std::nullopt;
  for (const auto& r : kDTypes)
    if (r.export_code == code) return r.type;
  return std::nullopt;
}

}  // namespace kiln
