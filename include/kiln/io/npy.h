// .npy files (NumPy's array format, version 1.0-3.0): the tensors `kiln run`
// reads and writes. Little-endian, C order; the dtypes kiln's tensors use.
#pragma once

#include "kiln/core/dtype.h"
#include "kiln/core/output_file.h"

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace kiln::io {

struct NpyArray {
  ScalarType dtype = ScalarType::Float;
  std::vector<int64_t> shape;
  std::vector<std::byte> data;  // row-major
};

// Throws kiln::Error naming the file for anything kiln cannot read
// (Fortran order, big-endian, unknown dtype, truncated data).
NpyArray read_npy(const std::string& path);

// NumPy has no bfloat16: a bfloat16 tensor is written as float32, widened exactly.
// Writes through a StagedFile (kiln/core/output_file.h) renamed into place.
void write_npy(const std::string& path, ScalarType dtype, std::span<const int64_t> shape,
               std::span<const std::byte> data);
// Writes into a staged file and closes it; the caller publishes it (with others: kiln run's outputs).
void write_npy(StagedFile& file, ScalarType dtype, std::span<const int64_t> shape, std::span<const std::byte> data);

// The array as the type a method input takes, where `a` is float32 and the input bfloat16 (NumPy has none):
// each value rounded to the nearest bfloat16, ties to even (torch's .to(torch.bfloat16)). Returns false and
// leaves `a` alone for any other pair.
bool float_to_bfloat16(NpyArray& a, ScalarType want);

}  // namespace kiln::io
