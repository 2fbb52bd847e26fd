// The XNNPACK backend's ahead-of-time half: a region of an edge graph into
// the delegate payload that ExecuTorch 1.5's XNNPACK backend
// ("XnnpackBackend") compiles and runs unchanged.
//
// Payload layout (all little-endian; schema/xnnpack_graph.fbs is the graph):
//   bytes  0..3   zero (where a bare flatbuffer has its root offset)
//   bytes  4..7   "XH00" (where a bare flatbuffer has its identifier)
//   bytes  8..9   u16 header length, 30
//   bytes 10..13  u32 offset of the flatbuffer (32: the header padded to 16)
//   bytes 14..17  u32 size of the flatbuffer
//   bytes 18..21  u32 offset of the constant data (flatbuffer end padded to 16)
//   bytes 22..29  u64 size of the constant data
//   then the flatbuffer ("XN01") and padding. kiln's payloads have no
//   constant data of their own (size 0), as ExecuTorch 1.5's serializer's
//   have none: the backend frees the payload once the XNNPACK runtime is
//   built, and operators that do not pack their static operands (elementwise
//   ones) keep pointing at the bytes, which named data keeps alive.
//
// How the delegate call and the graph meet: the DelegateCall's arguments are
// the region inputs then the region outputs, and the XNNPACK value of
// argument i has external_id i and the external input (1) or output (2)
// flag; num_externs is their count. Every other value has external_id
// 0xFFFFFFFF and flags 0. Constants are not in the payload: a value's
// constant_data entry names its bytes by key in the program's named data, so
// a weight used by several regions, or by the portable path, is stored once.
// The small constants the builder makes itself (scalar operands, 1/K rows
// for means, zeros for broadcasts) are named data too, keyed by their
// content ("xnnpack/const/<hash>"), so equal ones are also stored once.
#pragma once

#include "kiln/backends/xnnpack/quantize.h"
#include "kiln/graph/graph.h"
#include "kiln/passes/edge_program.h"
#include "kiln/pte/program_model.h"

#include <cstddef>
#include <functional>
#include <memory>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace kiln::backends::xnnpack {

inline constexpr std::string_view kBackendId = "XnnpackBackend";

// Payload framing.
inline constexpr char kHeaderMagic[4] = {'X', 'H', '0', '0'};
inline constexpr char kGraphIdentifier[4] = {'X', 'N', '0', '1'};
inline constexpr uint16_t kHeaderLength = 30;
inline constexpr uint64_t kPayloadAlignment = 16;  // the header and the flatbuffer are padded to this

// Graph values and nodes.
inline constexpr uint32_t kInvalidValueId = 0xFFFFFFFFu;    // XNN_INVALID_VALUE_ID
inline constexpr uint32_t kValueFlagExternalInput = 1u;     // XNN_VALUE_FLAG_EXTERNAL_INPUT
inline constexpr uint32_t kValueFlagExternalOutput = 2u;    // XNN_VALUE_FLAG_EXTERNAL_OUTPUT
inline constexpr uint32_t kFlagTransposeWeights = 1u;       // XNN_FLAG_TRANSPOSE_WEIGHTS (fully connected)
inline constexpr uint64_t kNamedConstantOffset = ~uint64_t{0};  // ConstantDataOffset.offset of a named entry

// A constant the region reads: a graph value that is not computed at run
// time, with its row-major bytes (exactly the value's meta.nbytes()).
struct RegionConstant {
  graph::ValueId value = -1;
  // Key of the program's named data entry that holds the bytes; the caller
  // chooses it (a content hash, or the weight's identity) so that equal keys
  // mean equal bytes across regions. Empty: the builder reads the bytes and
  // keys them by content, as it does its own constants.
  std::string key;
  pte::DataBlob data;
  // A weight the .pt2 holds quantized (passes::QuantizedConstant): its fully connected node uses this form.
  std::shared_ptr<const passes::QuantizedConstant> quantized{};
};

struct Region {
  std::vector<int32_t> nodes;           // indices into graph.nodes, in execution order
  std::vector<graph::ValueId> inputs;   // delegate call inputs, in argument order
  std::vector<graph::ValueId> outputs;  // delegate call outputs, in argument order (after the inputs)
  std::vector<RegionConstant> constants;
};

struct PayloadStats {
  int64_t xnodes = 0;
  int64_t xvalues = 0;
  int64_t absorbed_nodes = 0;        // region nodes folded into another node (weight transposes)
  int64_t named_constants = 0;       // constant_data entries (all name program data)
  int64_t made_constants = 0;        // of those, constants the builder made (scalars, reduction rows, zeros)
  int64_t quantized_nodes = 0;       // fully connected nodes on quantized weights (--quantize, or quantized in the .pt2)
  int64_t affine_nodes = 0;          // of those, int4 with an offset per group (--quantize-scales asym)
  int64_t prequantized_nodes = 0;    // of those, on weights the .pt2 held quantized
  int64_t prequantized_bits = 0;     // 4 or 8 when all of those are one kind, -1 when mixed
  int64_t prequantized_group = 0;    // their int4 group size (-1 when mixed)
  int64_t kept_fp32_nodes = 0;       // linear layers PayloadOptions::keep_fp32 kept in fp32 (--quantize-skip)
};

struct PayloadOptions {
  // Linear layers (a product with a constant [N, K] or [K, N] weight) become
  // ExecuTorch's dynamically quantized fully connected nodes: a convert of the
  // input to int8 rows, and the weights quantized at lowering time. Layers whose
  // input count the scheme does not divide stay fp32. (The tied LM head, a
  // product with the constant on the left, stays fp32.)
  QuantScheme quantize;
  // A linear layer (the product node, its constant weight) for which this
  // returns true stays fp32 (--quantize-skip). Empty: none.
  std::function<bool(const graph::Node&, graph::ValueId)> keep_fp32;
  // Per weight value: the scheme that replaces `quantize` for its products (--quantize auto's choices).
  std::map<graph::ValueId, QuantScheme> per_weight;
  // Per weight value: its quantization computed ahead (--calibrate's GPTQ, compiler/calibrate.h), stored as is for
  // its products (the scheme it was made with replaces `quantize`; quantize_weights' layout, [N, K]).
  std::map<graph::ValueId, std::pair<QuantScheme, QuantizedWeights>> precomputed;
};

struct Payload {
  std::vector<std::byte> bytes;             // header + graph + inline constant data
  std::vector<pte::NamedBlob> named_data;   // one per distinct key the graph names
  PayloadStats stats;
};

// Builds the payload of `region` of `graph`. Checks that every node is
// supported (support.h), that every tensor a node reads is a region input,
// a region constant or computed by an earlier region node, that values
// computed in the region and read outside it are region outputs, and that
// inputs, outputs and constants are distinct. Throws kiln::Error naming the
// node or value otherwise.
// Shapes::Only: the payload's graph only (what make_sizes_inferred compares), its quantized weights left empty
// instead of quantized (a dynamic program's second build, which is never written).
enum class Shapes : bool { AndData, Only };
Payload build_payload(const graph::Graph& graph, const Region& region, const PayloadOptions& options = {},
                      Shapes what = Shapes::AndData);

// A region of a dynamic program: `at_bounds` built from the graph at its upper bounds, `elsewhere`
// from the same graph with its symbols bound to other values. Where one entry of a reshape's new
// shape differs between them, sets it to 0 in at_bounds (the size XNNPACK's reshape, and kiln's
// runtime, infer per call); returns the edge nodes (debug handles) whose XNNPACK nodes differ in any
// other way (a slice, pad or constant sized for the upper bounds): those cannot be delegated.
std::vector<int32_t> make_sizes_inferred(Payload& at_bounds, const Payload& elsewhere);

// Adds `blobs` to `program.named_data`, skipping keys already there (the
// same weight is stored once however many payloads name it). Returns the
// number added. Throws kiln::Error if a key is already present with a
// different size.
size_t add_named_data(pte::Program& program, const std::vector<pte::NamedBlob>& blobs);

// Moves `payload` into `program` (a delegate payload, its named data) and
// appends a BackendDelegate for it to program.plans[plan]; returns the
// delegate's index for a pte::DelegateCall, whose arguments must be the
// values of region.inputs then region.outputs.
int32_t add_delegate(pte::Program& program, size_t plan, Payload payload);

}  // namespace kiln::backends::xnnpack
