// EdgeProgram: a program in kiln's edge form, ready for partitioning and
// emission. Every node calls a functional core-ATen operator that the op
// table (op_table.h) maps to an out-variant kernel; views are explicit
// *_copy nodes; every tensor is contiguous; constants are values with data
// (streamed from the .pt2 or computed ahead of time) rather than inputs.
#pragma once

#include "kiln/graph/graph.h"
#include "kiln/pt2/pt2_reader.h"

#include <cstddef>
#include <functional>
#include <span>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace kiln::passes {

// A linear layer's weight W [N, K] that the .pt2 holds already quantized (torchao's quantize_ before
// torch.export, rewrites_quant.cpp), in the layouts ExecuTorch's XNNPACK payload stores.
struct QuantizedConstant {
  int bits = 0;        // 4: int4 in groups of `group` input channels; 8: int8, one scale per output channel
  int64_t group = 0;   // bits 4 only
  int64_t rows = 0;    // N
  int64_t cols = 0;    // K
  std::vector<std::byte> data;    // bits 4: [N, K/2], q + 8, even columns in the low nibble; bits 8: [N, K] int8
  std::vector<std::byte> scales;  // bits 4: bf16 [N, K/group]; bits 8: fp32 [N]
};

// Bytes computed as the .pte is written (a quantized embedding table too large to hold: kiln lower
// --quantize-embedding on Gemma 4's per-layer table), `size` of them, passed to the sink in order.
struct GeneratedBytes {
  uint64_t size = 0;
  std::function<void(const std::function<void(std::span<const std::byte>)>&)> write;
};

// Where a constant value's bytes come from: a tensor of the .pt2 (read on
// demand) or bytes computed during lowering (folded subgraphs, transposed weights).
struct ConstantData {
  const pt2::ConstantTensor* source = nullptr;
  std::shared_ptr<const std::vector<std::byte>> bytes;
  std::string name;  // parameter FQN or a description of the folded expression
  // Set for a weight the .pt2 holds quantized; `bytes` then holds it dequantized (what a reader other
  // than XNNPACK's quantized fully connected node sees), the payload builder uses this.
  std::shared_ptr<const QuantizedConstant> quantized{};
  // Set instead of `source` and `bytes` for bytes computed while the file is written (GeneratedBytes).
  std::shared_ptr<const GeneratedBytes> generated{};
};

// A buffer the program mutates (a KV cache): planned memory that lives across
// calls, starts as `initial` and is written in place by the one in-place node
// (index_put_ or copy_, see rewrites_state.cpp) whose `self` it is.
struct MutableBuffer {
  graph::ValueId value = 0;  // the buffer as the program reads it
  ConstantData initial;      // its contents before the first call
  std::string name;          // its fully qualified name
};

struct DynamicShapes;  // kiln/passes/dynamic.h

struct EdgeProgram {
  const pt2::ExportedProgram* exported = nullptr;  // the .pt2 the constants stream from
  graph::Graph graph;                      // graph.inputs: user inputs only
  std::vector<graph::ValueId> outputs;     // user outputs, in order (tensors)
  std::map<graph::ValueId, ConstantData> constants;
  std::string inputs_spec, outputs_spec;   // pytree specs from the .pt2 (may be empty)
  std::vector<MutableBuffer> mutable_buffers;  // empty for a stateless program
  // A dynamic program's symbolic sizes (graph at the upper bounds); null when static.
  std::shared_ptr<const DynamicShapes> dynamic;
  // The functional form of a program with in-place operators (functionalize.h), which `exported`
  // then points to; null when the .pt2's graph was lowered as it is.
  std::shared_ptr<const pt2::ExportedProgram> functionalized;

  const MutableBuffer* mutable_buffer(graph::ValueId v) const {
    for (const auto& b : mutable_buffers)
      if (b.value == v) return &b;
    return nullptr;
  }

  bool is_constant(graph::ValueId v) const { return constants.contains(v); }
  // The constant's row-major bytes, read from the .pt2 or the folded buffer.
  std::vector<std::byte> constant_bytes(graph::ValueId v) const;
};

struct LoweringStats {
  int64_t source_nodes = 0;
  int64_t prequantized_linears = 0;  // linear layers whose weights the .pt2 holds quantized (rewrites_quant.cpp)
  int64_t folded_nodes = 0;   // nodes computed ahead of time
  int64_t removed_nodes = 0;  // no-ops and dead code
  int64_t edge_nodes = 0;
};

struct EdgeOptions {
  // A linear layer's weight W [N, K] becomes the constant Wᵀ [K, N] its mm reads (computed now,
  // held in memory). False: it stays permute_copy(W), which XNNPACK's payload turns into a fully
  // connected node on W as the file has it. kiln lower --quantize 8da4w / 8da8w sets it false: the
  // weights are then read from the .pt2 one at a time while quantized, never all in memory.
  bool fold_weight_transposes = true;
};

// Decomposes the exported program (either IR flavor) into edge form, folds
// constant subgraphs with kiln's kernels and removes dead code. Throws
// kiln::Error naming the operator, node and source line for anything kiln
// cannot lower.
EdgeProgram to_edge(const pt2::ExportedProgram& ep, LoweringStats* stats = nullptr, const EdgeOptions& options = {});

}  // namespace kiln::passes
