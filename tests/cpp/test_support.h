// Helpers the C++ unit tests share: contiguous tensor metadata, constants of
// hand-built edge programs and small zip archives (the .pt2 container) written with libzip.
#pragma once

#include "kiln/graph/graph.h"
#include "kiln/passes/edge_program.h"

#include <gtest/gtest.h>
#include <unistd.h>
#include <zip.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace kiln::test {

// Row-major contiguous metadata of `sizes`.
inline graph::TensorMeta contiguous_meta(std::vector<int64_t> sizes, ScalarType dtype = ScalarType::Float) {
  graph::TensorMeta m;
  m.dtype = dtype;
  m.strides.assign(sizes.size(), 1);
  for (size_t d = sizes.size(); d-- > 1;) m.strides[d - 1] = m.strides[d] * sizes[d];
  m.sizes = std::move(sizes);
  return m;
}

// A float32 constant of `program` holding `data` (bytes computed, no .pt2 source).
inline graph::ValueId add_float_constant(passes::EdgeProgram& program, std::string name, const std::vector<float>& data,
                                         std::vector<int64_t> sizes) {
  graph::ValueId v = program.graph.add_value(name, contiguous_meta(std::move(sizes)));
  std::vector<std::byte> bytes(data.size() * sizeof(float));
  std::memcpy(bytes.data(), data.data(), bytes.size());
  program.constants[v] =
      passes::ConstantData{nullptr, std::make_shared<const std::vector<std::byte>>(std::move(bytes)), std::move(name)};
  return v;
}

// Writes a zip of `files` (entry -> bytes) to <temp dir>/<name>_<pid>.pt2 and returns its path.
inline std::string write_zip(const std::string& name, const std::map<std::string, std::string>& files) {
  std::filesystem::path path = std::filesystem::temp_directory_path() / (name + "_" + std::to_string(::getpid()) + ".pt2");
  std::filesystem::remove(path);
  int err = 0;
  zip_t* z = zip_open(path.c_str(), ZIP_CREATE | ZIP_TRUNCATE, &err);
  EXPECT_NE(z, nullptr);
  if (z == nullptr) return path.string();
  for (const auto& [entry, data] : files) {
    void* copy = std::malloc(data.size() + 1);
    std::memcpy(copy, data.data(), data.size());
    zip_source_t* src = zip_source_buffer(z, copy, data.size(), 1);
    EXPECT_GE(zip_file_add(z, entry.c_str(), src, ZIP_FL_ENC_UTF_8), 0);
  }
  EXPECT_EQ(zip_close(z), 0);
  return path.string();
}

}  // namespace kiln::test
