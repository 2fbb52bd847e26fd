// The XNNPACK partitioner: the generic partitioner (kiln/partition/partitioner.h)
// with the XNNPACK support table (support.h) as its predicate, and each region
// built into an XNNPACK delegate payload (payload.h) ready for the emitter.
//
// Named data keys are "xnnpack/const/<128-bit content digest>", the format
// the payload builder uses for the constants it makes itself, so equal bytes
// get one key (and are stored once) whether they are a weight, a folded
// constant or a builder-made scalar, and in however many regions.
#pragma once

#include "kiln/backends/xnnpack/payload.h"
#include "kiln/partition/delegated_region.h"
#include "kiln/partition/partitioner.h"
#include "kiln/passes/edge_program.h"

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace kiln::backends::xnnpack {

struct DelegationSummary {
  int64_t delegate_call_sites = 0;
  int64_t delegated_node_count = 0;
  std::map<std::string, int64_t> fallback_ops;  // target -> edge nodes left on the portable path
  int64_t fallback_count = 0;
  // target -> the distinct reasons its nodes were not delegated, in graph order
  std::map<std::string, std::vector<std::string>> fallback_reasons;
  int64_t xnnpack_nodes = 0;            // XNNPACK graph nodes over all payloads
  int64_t named_constants = 0;          // constant_data entries over all payloads
  int64_t constant_inputs = 0;          // constants passed as delegate inputs (their bytes in the constant segment)
  int64_t partition_rounds = 0;
  std::string quantization = "none";    // --quantize scheme ("8da4w:32", "8da8w")
  int64_t quantized_nodes = 0;          // fully connected nodes on quantized weights
  int64_t prequantized_nodes = 0;       // of those, on weights the .pt2 held quantized (torchao's quantize_)
  int64_t affine_nodes = 0;             // of those, int4 with an fp32 offset per group (--quantize-scales asym)
  int64_t prequantized_bits = 0;        // 4 or 8 (-1: both kinds)
  int64_t prequantized_group = 0;       // int4 group size (-1: several)
  int64_t kept_fp32_nodes = 0;          // linear layers kept fp32 by --quantize-skip
};

struct XnnpackDelegation {
  kiln::partition::Partition partition;
  std::vector<kiln::partition::DelegatedRegion> regions;  // one per partition region, same order
  DelegationSummary summary;
};

// The named-data key of bytes with this digest.
std::string xnnpack_constant_key(const partition::ContentDigest& digest);

// What may cross an XNNPACK delegate boundary: float32 tensors of rank 1 to 6.
std::optional<std::string> xnnpack_boundary(const graph::Graph& graph, graph::ValueId value);

// Partitions `program` for XNNPACK and builds every region's payload.
XnnpackDelegation delegate_to_xnnpack(const passes::EdgeProgram& program, const partition::PartitionOptions& options = {},
                                      const PayloadOptions& payload = {});

}  // namespace kiln::backends::xnnpack
