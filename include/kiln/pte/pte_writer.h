// The .pte writer: serializes a ProgramModel (program_model.h) into the file
// layout ExecuTorch 1.5's default to_executorch() + serialization produces —
// the "ET12" program flatbuffer with its extended header, the constant
// segment, delegate payloads and named data as segments — so ExecuTorch's
// runtime and kiln's loader (kiln/runtime/pte_file.h) both load it.
#pragma once

#include "kiln/pte/program_model.h"
#include "kiln/pte/pte_format.h"

#include <cstdint>
#include <string>

namespace kiln::pte {

struct WriteOptions {
  // Every segment starts at a multiple of this (ExecutorchBackendConfig.segment_alignment).
  uint64_t segment_alignment = kDefaultSegmentAlignment;
  // Each constant starts at a multiple of this inside the constant segment
  // (ExecutorchBackendConfig.constant_tensor_alignment; ExecuTorch's ALIGNMENT).
  uint64_t tensor_alignment = kDefaultTensorAlignment;
};

// Writes `program` to `path`, through a StagedFile (kiln/core/output_file.h) renamed into
// place only on success (the staged file is removed on failure). Constant, delegate
// and named data are streamed from their DataBlob callbacks straight into
// the file. Throws kiln::Error on an inconsistent program (an index out of
// range, a blob that streams a different number of bytes than it declares)
// or an I/O failure.
void write_pte(const Program& program, const std::string& path, const WriteOptions& opts = {});

}  // namespace kiln::pte
