// XnnpackPartitioner (include/kiln/partition/xnnpack_partitioner.h).
#include "kiln/partition/xnnpack_partitioner.h"

#include "kiln/backends/xnnpack/payload.h"
#include "kiln/backends/xnnpack/support.h"
#include "kiln/core/error.h"

#include <algorithm>

namespace kiln::partition {
namespace {

namespace xnn = backends::xnnpack;

constexpr size_t kMaxDims = 6;  // XNN_MAX_TENSOR_DIMS

// The bytes of constant `v`, streamed from the .pt2 or the folded buffer.
pte::DataBlob constant_blob(const passes::EdgeProgram& p, graph::ValueId v) {
  const passes::ConstantData& c = p.constants.at(v);
  pte::DataBlob blob;
  if (c.bytes) {
    auto data = c.bytes;
    blob.size = data->size();
    blob.write = [data](const std::function<void(std::span<const std::byte>)>& sink) { sink(*data); };
  } else {
    const pt2::ConstantTensor* src = c.source;
    const pt2::ExportedProgram* ep = p.exported;
    blob.size = static_cast<uint64_t>(src->meta.nbytes());
    blob.write = [ep, src](const std::function<void(std::span<const std::byte>)>& sink) {
      ep->stream_constant(*src, sink);
    };
  }
  return blob;
}

}  // namespace

std::string xnnpack_constant_key(const ContentDigest& digest) {
  return fmt::format("xnnpack/const/{:016x}{:016x}", digest[0], digest[1]);
}

std::optional<std::string> xnnpack_boundary(const graph::Graph& graph, graph::ValueId value) {
  const graph::Value& v = graph.value(value);
  if (v.meta.dtype != ScalarType::Float)
    return fmt::format("'{}' is {} and XNNPACK delegate inputs and outputs are float32", v.name,
                       dtype_name(v.meta.dtype));
  if (v.meta.sizes.empty() || v.meta.sizes.size() > kMaxDims)
    return fmt::format("'{}' has rank {} and XNNPACK delegate inputs and outputs have rank 1 to {}", v.name,
                       v.meta.sizes.size(), kMaxDims);
  return std::nullopt;
}

XnnpackDelegation delegate_to_xnnpack(const passes::EdgeProgram& program, const PartitionOptions& options,
                                      const xnn::PayloadOptions& payload_options) {
  XnnpackDelegation d;
  SupportFn supports = [&program](const graph::Graph& g, const graph::Node& n, std::string* reason) {
    if (n.target == "aten.convolution.default") {  // XNNPACK packs convolution weights: they must be constants
      for (const auto& in : n.inputs)
        for (graph::ValueId v : in.arg.tensor_ids())
          if ((in.name == "weight" || in.name == "bias") && !program.is_constant(v)) {
            if (reason) *reason = fmt::format("convolution {} '{}' is not a constant", in.name, g.value(v).name);
            return false;
          }
    }
    return xnn::xnnpack_supports(g, n, reason);
  };
  d.partition = partition_program(program, supports, xnnpack_boundary, options);
  const auto& g = program.graph;

  for (const Region& r : d.partition.regions) {
    xnn::Region xr;
    xr.nodes = r.nodes;
    xr.inputs = r.inputs;
    xr.outputs = r.outputs;
    for (graph::ValueId v : r.constants)
      xr.constants.push_back({v, xnnpack_constant_key(d.partition.constant_digest.at(v)), constant_blob(program, v),
                              program.constants.at(v).quantized});
    xnn::Payload payload = xnn::build_payload(g, xr, payload_options);
    d.summary.xnnpack_nodes += payload.stats.xnodes;
    d.summary.quantized_nodes += payload.stats.quantized_nodes;
    if (payload.stats.prequantized_nodes) {
      auto merge = [](int64_t& into, int64_t v) { into = into == 0 ? v : (into == v ? into : -1); };
      d.summary.prequantized_nodes += payload.stats.prequantized_nodes;
      merge(d.summary.prequantized_bits, payload.stats.prequantized_bits);
      merge(d.summary.prequantized_group, payload.stats.prequantized_group);
    }
    d.summary.kept_fp32_nodes += payload.stats.kept_fp32_nodes;
    d.summary.named_constants += payload.stats.named_constants;
    d.summary.constant_inputs += std::count_if(r.inputs.begin(), r.inputs.end(),
                                               [&](graph::ValueId v) { return program.is_constant(v); });
    DelegatedRegion er;
    er.backend_id = std::string(xnn::kBackendId);
    er.nodes = r.nodes;
    er.inputs = r.inputs;
    er.outputs = r.outputs;
    er.payload = pte::DataBlob::from_bytes(std::move(payload.bytes));
    er.named_data = std::move(payload.named_data);
    d.regions.push_back(std::move(er));
    d.summary.delegated_node_count += static_cast<int64_t>(r.nodes.size());
  }
  d.summary.delegate_call_sites = static_cast<int64_t>(d.regions.size());
  d.summary.quantization = payload_options.quantize.name();
  d.summary.partition_rounds = d.partition.rounds;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    if (d.partition.region_of[i] >= 0) continue;
    const auto& n = g.nodes[i];
    ++d.summary.fallback_ops[n.target];
    ++d.summary.fallback_count;
    auto& reasons = d.summary.fallback_reasons[n.target];
    if (std::find(reasons.begin(), reasons.end(), d.partition.reason[i]) == reasons.end())
      reasons.push_back(d.partition.reason[i]);
  }
  return d;
}

}  // namespace kiln::partition
