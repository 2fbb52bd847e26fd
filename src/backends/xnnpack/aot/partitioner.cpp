// The XNNPACK partitioner (include/kiln/backends/xnnpack/partitioner.h).
#include "kiln/backends/xnnpack/partitioner.h"

#include "kiln/backends/xnnpack/payload.h"
#include "kiln/backends/xnnpack/support.h"
#include "kiln/core/error.h"
#include "kiln/passes/dynamic.h"

#include <algorithm>
#include <set>

namespace kiln::backends::xnnpack {
namespace {

namespace xnn = kiln::backends::xnnpack;

constexpr size_t kMaxDims = 6;  // XNN_MAX_TENSOR_DIMS

// The bytes of constant `v`, streamed from the .pt2 or the folded buffer.
pte::DataBlob constant_blob(const passes::EdgeProgram& p, graph::ValueId v) {
  const passes::ConstantData& c = p.constants.at(v);
  pte::DataBlob blob;
  if (c.generated) {
    auto gen = c.generated;
    blob.size = gen->size;
    blob.write = [gen](const std::function<void(std::span<const std::byte>)>& sink) { gen->write(sink); };
  } else if (c.bytes) {
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

// A dynamic program's graph with every symbol bound to one less than its upper bound (a symbol of
// one value keeps it): the sizes of its tensors and its symbolic integer arguments there. (At 1, a
// size-1 dim can make the payload builder take another form: then the node stays portable, which
// is safe, only less delegated.)
graph::Graph rebound_graph(const passes::EdgeProgram& p) {
  const passes::DynamicShapes& dyn = *p.dynamic;
  std::map<std::string, int64_t, std::less<>> binding;
  for (const graph::Symbol& sym : dyn.symbols) binding[sym.name] = sym.max > sym.min ? sym.max - 1 : sym.max;
  graph::Graph g = p.graph;
  for (const auto& [v, exprs] : dyn.sizes) {
    graph::TensorMeta& m = g.values[v].meta;
    const bool contiguous = m.is_contiguous();
    for (size_t k = 0; k < exprs.size() && k < m.sizes.size(); ++k) m.sizes[k] = exprs[k].eval(binding);
    if (contiguous && m.strides.size() == m.sizes.size()) {
      int64_t stride = 1;
      for (size_t k = m.sizes.size(); k-- > 0;) {
        m.strides[k] = stride;
        stride *= std::max<int64_t>(1, m.sizes[k]);
      }
    }
  }
  for (const auto& [key, exprs] : dyn.int_args) {
    graph::Node& n = g.nodes[static_cast<size_t>(key.first)];
    for (graph::NamedArgument& in : n.inputs) {
      if (in.name != key.second) continue;
      if (in.arg.kind == graph::Argument::Kind::Int && exprs.size() == 1) in.arg.payload = exprs[0].eval(binding);
      if (in.arg.kind == graph::Argument::Kind::Ints) {
        auto& ints = std::get<std::vector<int64_t>>(in.arg.payload);
        for (size_t k = 0; k < ints.size() && k < exprs.size(); ++k) ints[k] = exprs[k].eval(binding);
      }
    }
  }
  return g;
}

}  // namespace

std::string xnnpack_constant_key(const partition::ContentDigest& digest) {
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

XnnpackDelegation delegate_to_xnnpack(const passes::EdgeProgram& program, const partition::PartitionOptions& options,
                                      const xnn::PayloadOptions& payload_options) {
  XnnpackDelegation d;
  // A dynamic program's regions are built twice, at the upper bounds and with the symbols bound
  // elsewhere: an XNNPACK node that differs between the two other than in a reshape's one inferred
  // size would fix a size that changes per call, and its edge node stays on the portable path.
  std::optional<graph::Graph> elsewhere;
  if (program.dynamic) elsewhere = rebound_graph(program);
  std::set<size_t> fixed_sizes;
  partition::SupportFn supports = [&program, &fixed_sizes](const graph::Graph& g, const graph::Node& n,
                                                           std::string* reason) {
    if (!fixed_sizes.empty() && fixed_sizes.contains(static_cast<size_t>(&n - g.nodes.data()))) {
      if (reason) *reason = "dynamic shapes: its XNNPACK form would fix a size that changes from call to call";
      return false;
    }
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
  const auto& g = program.graph;
  std::vector<xnn::Payload> payloads;
  for (int round = 0;; ++round) {
    d.partition = partition::partition_program(program, supports, xnnpack_boundary, options);
    payloads.clear();
    std::set<size_t> bad;
    for (const partition::Region& r : d.partition.regions) {
      xnn::Region xr;
      xr.nodes = r.nodes;
      xr.inputs = r.inputs;
      xr.outputs = r.outputs;
      for (graph::ValueId v : r.constants)
        xr.constants.push_back({v, xnnpack_constant_key(d.partition.constant_digest.at(v)), constant_blob(program, v),
                                program.constants.at(v).quantized});
      payloads.push_back(xnn::build_payload(g, xr, payload_options));
      if (elsewhere) {
        // compared for its graph only: its weights are not quantized a second time
        const xnn::Payload other = xnn::build_payload(*elsewhere, xr, payload_options, xnn::Shapes::Only);
        for (int32_t node : xnn::make_sizes_inferred(payloads.back(), other)) bad.insert(static_cast<size_t>(node));
      }
    }
    if (bad.empty()) break;
    check(round < 32, "internal: dynamic-shape partitioning did not settle");
    fixed_sizes.insert(bad.begin(), bad.end());
  }

  for (size_t ri = 0; ri < d.partition.regions.size(); ++ri) {
    const partition::Region& r = d.partition.regions[ri];
    xnn::Payload& payload = payloads[ri];
    d.summary.xnnpack_nodes += payload.stats.xnodes;
    d.summary.quantized_nodes += payload.stats.quantized_nodes;
    d.summary.affine_nodes += payload.stats.affine_nodes;
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
    partition::DelegatedRegion er;
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

}  // namespace kiln::backends::xnnpack
