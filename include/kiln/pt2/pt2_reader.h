// The .pt2 reader: a torch.export archive (torch 2.13, torch.export.save) into
// kiln's graph IR plus a table of the program's constant tensors (parameters,
// buffers, tensor constants) whose bytes stay in the archive until read.
// Both IR flavors are accepted: the default export IR and core ATen
// (after run_decompositions()).
#pragma once

#include "kiln/graph/graph.h"
#include "kiln/pt2/archive.h"

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace kiln::pt2 {

// A parameter, buffer or tensor constant of the exported program.
struct ConstantTensor {
  enum class Kind : uint8_t { Parameter, Buffer, TensorConstant };
  std::string name;           // fully qualified name, "model.transformer.wte.weight"
  Kind kind = Kind::Parameter;
  graph::TensorMeta meta;     // sizes, strides and storage offset into its storage entry
  std::string entry;          // archive entry holding the storage bytes
  uint64_t entry_bytes = 0;   // size of that entry (of its nested member, for a tensor subclass's part)
  uint64_t entry_offset = 0;  // where the storage starts in the entry: 0, or a nested member's offset
  // Set by widen_to_float: the archive holds the elements in this 16-bit float type (bfloat16 or float16) and
  // meta.dtype is Float; every read widens them (exactly) as it streams.
  std::optional<ScalarType> stored_dtype{};
};

std::string_view constant_kind_name(ConstantTensor::Kind kind);

struct ExportedProgram {
  std::string path;
  std::string model_name;       // archive's model name ("model")
  std::string torch_version;
  std::string schema_version;   // "major.minor"
  std::string dialect;          // verifier: "TRAINING" (default export IR) or "ATEN" (core ATen)
  std::string inputs_spec;      // pytree spec of forward's inputs (torch's treespec JSON), may be empty
  std::string outputs_spec;     // pytree spec of forward's outputs
  graph::Graph graph;
  graph::GraphSignature signature;
  std::vector<ConstantTensor> constants;
  std::shared_ptr<const Pt2Archive> archive;
  // Set by widen_to_float: the 16-bit float type the program's floating-point values had, and whether its
  // user inputs and outputs were widened too (WidenIo::Widen) or kept in that type.
  std::optional<ScalarType> widened_from{};
  bool io_widened = false;

  const ConstantTensor* find_constant(std::string_view name) const;

  // The tensor's elements, row-major and contiguous, streamed in chunks
  // (strided views are gathered through one storage-sized buffer).
  void stream_constant(const ConstantTensor& c, const std::function<void(std::span<const std::byte>)>& sink) const;
  // The tensor's elements, row-major and contiguous, into `out` (size must be meta.nbytes()).
  void read_constant(const ConstantTensor& c, std::span<std::byte> out) const;
  // Bytes [offset, offset + out.size()) of the row-major contents (a seek for
  // contiguous tensors; strided ones are gathered whole first).
  void read_constant_range(const ConstantTensor& c, uint64_t offset, std::span<std::byte> out) const;
  // CRC-32 (zlib) of the tensor's row-major contiguous bytes: content identity
  // that torch's side can compute as zlib.crc32(t.contiguous().numpy().tobytes()).
  uint32_t content_crc32(const ConstantTensor& c) const;
};

// Reads and validates `path`. Throws kiln::Error with a one-line message that
// names the file and the offending entry, node or argument.
//
// A program exported with dynamic_shapes has symbols (graph.symbols, from the
// archive's range_constraints; each must have a finite upper bound). The graph
// is read at one value per symbol, `binding` (default: every symbol at its
// upper bound): sizes and symbolic int arguments are those values, tensors keep
// their size expressions in TensorMeta::sym_sizes, and the nodes that only
// compute or check symbols (aten.sym_size.int, operator.mul on SymInts,
// _assert_scalar) are left out: their values are known.
using SymbolBinding = std::map<std::string, int64_t, std::less<>>;
ExportedProgram read_pt2(const std::string& path, const SymbolBinding* binding = nullptr);

// A bfloat16 or float16 program as float32 (kiln lower --dtype fp32): every value and constant of that type
// becomes Float and every dtype argument naming it names Float; the constants stay in the archive and are
// widened (exactly) as they are read. With WidenIo::Keep (the default) the program still takes and returns what
// it was exported with: each 16-bit user input is read through an aten._to_copy to float32 made first, each
// 16-bit user output is an aten._to_copy of the float32 value made last (a user input the program writes in
// place, an external cache, is state: it is widened like a buffer). WidenIo::Widen widens those too (kiln lower
// --io-dtype fp32). Returns the type widened from, or std::nullopt for a program with no 16-bit float values
// (left as it is). Throws kiln::Error for a program with both bfloat16 and float16 values.
enum class WidenIo : uint8_t { Keep, Widen };
std::optional<ScalarType> widen_to_float(ExportedProgram& ep, WidenIo io = WidenIo::Keep);

}  // namespace kiln::pt2
