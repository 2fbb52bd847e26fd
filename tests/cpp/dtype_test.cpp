#include "kiln/core/dtype.h"

#include <gtest/gtest.h>

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

}  // namespace
}  // namespace kiln
