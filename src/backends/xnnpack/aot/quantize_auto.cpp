// kiln lower --quantize auto --max-size MB: 8da4w or 8da8w per linear layer from a data-free sensitivity, within a
// size budget (quantize.h: plan_mixed_precision).
#include "kiln/backends/xnnpack/quantize.h"

#include "kiln/core/dtype.h"
#include "kiln/core/error.h"
#include "kiln/passes/edge_program.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <set>

namespace kiln::backends::xnnpack {
namespace {

std::optional<graph::ValueId> tensor_input(const graph::Node& n, std::string_view name) {
  const graph::NamedArgument* a = n.input(name);
  if (!a || a->arg.kind != graph::Argument::Kind::Tensor) return std::nullopt;
  return std::get<graph::ValueId>(a->arg.payload);
}

bool is_transpose(const graph::Node& t) {
  const graph::NamedArgument* dims = t.input("dims");
  return t.target == "aten.permute_copy.default" && dims && dims->arg.kind == graph::Argument::Kind::Ints &&
         std::get<std::vector<int64_t>>(dims->arg.payload) == std::vector<int64_t>{1, 0};
}

int64_t numel(const graph::TensorMeta& m) {
  return std::accumulate(m.sizes.begin(), m.sizes.end(), int64_t{1}, std::multiplies<>());
}

// The constant 1-D weight (gamma) that scales the layer's input `a` of `k` channels, if a norm's multiply makes it:
// a's producer, through copies and views, is aten.mul.Tensor with a constant fp32 operand of k elements.
std::optional<graph::ValueId> input_gamma(const passes::EdgeProgram& program, graph::ValueId a, int64_t k) {
  const graph::Graph& g = program.graph;
  for (int step = 0; step < 6; ++step) {
    const int32_t p = g.value(a).producer;
    if (p < 0) return std::nullopt;
    const graph::Node& n = g.nodes[static_cast<size_t>(p)];
    if (n.target == "aten.mul.Tensor") {
      for (const char* name : {"other", "self"}) {
        auto c = tensor_input(n, name);
        if (!c || !program.is_constant(*c)) continue;
        const auto& m = g.value(*c).meta;
        if (m.dtype == ScalarType::Float && !m.sizes.empty() && m.sizes.back() == k && numel(m) == k) return c;
      }
      return std::nullopt;
    }
    if (n.target != "aten.view_copy.default" && n.target != "aten._to_copy.default" &&
        n.target != "aten.clone.default" && n.target != "aten.permute_copy.default" &&
        n.target != "aten.unsqueeze_copy.default" && n.target != "aten.squeeze_copy.dims")
      return std::nullopt;
    auto self = tensor_input(n, "self");
    if (!self) return std::nullopt;
    a = *self;
  }
  return std::nullopt;
}

// sum_rows sum_i c_i (w - dq)^2 for the quantized form `q` of w [n, k]
double weighted_error(const float* w, int64_t n, int64_t k, const QuantizedWeights& q, const QuantScheme& s,
                      const std::vector<double>& c) {
  double e = 0;
  const auto* bytes = reinterpret_cast<const uint8_t*>(q.data.data());
  if (s.kind == QuantScheme::Kind::Int4Groups) {
    const int64_t groups = k / s.group;
    for (int64_t r = 0; r < n; ++r)
      for (int64_t b = 0; b < groups; ++b) {
        const float scale = bf16_to_float(q.scales.data() + static_cast<size_t>(r * groups + b) * 2);
        float offset = 0.0f;  // asym: w ~ scale q + offset
        if (has_offsets(s)) std::memcpy(&offset, q.offsets.data() + static_cast<size_t>(r * groups + b) * 4, 4);
        for (int64_t j = 0; j < s.group; ++j) {
          const int64_t i = b * s.group + j;
          const uint8_t byte = bytes[r * (k / 2) + i / 2];
          const int code = ((i & 1) ? byte >> 4 : byte & 0xf) - 8;  // the even input in the low nibble
          const double d = static_cast<double>(w[r * k + i]) -
                           (static_cast<double>(scale * static_cast<float>(code)) + static_cast<double>(offset));
          e += c[static_cast<size_t>(i)] * d * d;
        }
      }
    return e;
  }
  for (int64_t r = 0; r < n; ++r) {
    float scale;
    std::memcpy(&scale, q.scales.data() + static_cast<size_t>(r) * 4, 4);
    for (int64_t i = 0; i < k; ++i) {
      const double d = static_cast<double>(w[r * k + i]) -
                       static_cast<double>(scale * static_cast<float>(static_cast<int8_t>(bytes[r * k + i])));
      e += c[static_cast<size_t>(i)] * d * d;
    }
  }
  return e;
}

struct Site {
  graph::ValueId weight, input;
  bool kn;  // the weight is [K, N]
  const graph::Node* product;
};

// The linear layers in graph order, one per weight (the first product that reads it): mm/addmm on a constant
// [K, N], through permute_copy [1,0] of a constant [N, K], or the tied head's mm(W, x^T).
std::vector<Site> linear_sites(const passes::EdgeProgram& program,
                               const std::function<bool(const graph::Node&, graph::ValueId)>& keep_fp32) {
  const graph::Graph& g = program.graph;
  auto is_weight = [&](graph::ValueId v) {
    const auto& m = g.value(v).meta;
    if (!program.is_constant(v) || m.dtype != ScalarType::Float || m.sizes.size() != 2) return false;
    return program.constants.at(v).quantized == nullptr;  // a weight the .pt2 holds quantized keeps its own form
  };
  std::vector<Site> sites;
  std::set<graph::ValueId> seen;
  for (const graph::Node& n : g.nodes) {
    if (n.target != "aten.mm.default" && n.target != "aten.addmm.default") continue;
    auto mat2 = tensor_input(n, "mat2");
    auto x = tensor_input(n, n.target == "aten.mm.default" ? "self" : "mat1");
    if (!mat2 || !x) continue;
    std::optional<Site> site;
    if (n.target == "aten.mm.default" && is_weight(*x) && !is_weight(*mat2)) {
      site = Site{*x, *mat2, false, &n};  // W @ x^T (the tied head): its input is x^T, followed through the transpose
    } else if (is_weight(*mat2)) {
      site = Site{*mat2, *x, true, &n};
    } else if (const int32_t p = g.value(*mat2).producer; p >= 0 && is_transpose(g.nodes[static_cast<size_t>(p)])) {
      if (auto w = tensor_input(g.nodes[static_cast<size_t>(p)], "self"); w && is_weight(*w)) site = Site{*w, *x, false, &n};
    }
    if (!site || (keep_fp32 && keep_fp32(n, site->weight))) continue;
    if (seen.insert(site->weight).second) sites.push_back(*site);
  }
  return sites;
}

}  // namespace

std::optional<HeadLayer> find_output_head(const passes::EdgeProgram& program,
                                          const std::function<bool(const graph::Node&, graph::ValueId)>& keep_fp32) {
  const std::vector<Site> sites = linear_sites(program, {});
  if (sites.empty()) return std::nullopt;
  const Site& s = sites.back();
  const graph::Graph& g = program.graph;
  HeadLayer h;
  h.weight = s.weight;
  const auto& meta = g.value(s.weight).meta;
  h.n = s.kn ? meta.sizes[1] : meta.sizes[0];
  h.k = s.kn ? meta.sizes[0] : meta.sizes[1];
  const auto& cd = program.constants.at(s.weight);
  h.name = cd.name.empty() ? g.value(s.weight).name : cd.name;
  h.layer = s.product->module_path.empty() ? s.product->name : s.product->module_path;
  h.kept_fp32 = keep_fp32 && keep_fp32(*s.product, s.weight);
  return h;
}

AutoPlan plan_mixed_precision(const passes::EdgeProgram& program, int64_t max_bytes, const QuantScheme& base,
                              const std::function<bool(const graph::Node&, graph::ValueId)>& keep_fp32,
                              const std::set<graph::ValueId>& forced_int8) {
  const graph::Graph& g = program.graph;
  const std::vector<Site> sites = linear_sites(program, keep_fp32);
  std::set<graph::ValueId> seen;
  for (const Site& s : sites) seen.insert(s.weight);

  QuantScheme q4 = base, q8 = base;
  q4.kind = QuantScheme::Kind::Int4Groups;
  q8.kind = QuantScheme::Kind::Int8Channels;
  AutoPlan plan;
  for (const Site& s : sites) {
    AutoLayer L;
    L.weight = s.weight;
    const auto& meta = g.value(s.weight).meta;
    L.n = s.kn ? meta.sizes[1] : meta.sizes[0];
    L.k = s.kn ? meta.sizes[0] : meta.sizes[1];
    const auto& cd = program.constants.at(s.weight);
    L.name = cd.name.empty() ? g.value(s.weight).name : cd.name;
    L.layer = s.product->module_path.empty() ? s.product->name : s.product->module_path;
    std::vector<double> c(static_cast<size_t>(L.k), 1.0);
    if (auto gamma = input_gamma(program, s.input, L.k)) {
      const std::vector<std::byte> raw = program.constant_bytes(*gamma);
      const auto* gv = reinterpret_cast<const float*>(raw.data());
      for (int64_t i = 0; i < L.k; ++i) c[static_cast<size_t>(i)] = static_cast<double>(gv[i]) * gv[i];
      const auto& gd = program.constants.at(*gamma);
      L.norm = gd.name.empty() ? g.value(*gamma).name : gd.name;
    }
    const std::vector<std::byte> raw = program.constant_bytes(s.weight);
    std::vector<float> w(static_cast<size_t>(L.n * L.k));
    if (s.kn) {
      const auto* src = reinterpret_cast<const float*>(raw.data());
      for (int64_t i = 0; i < L.k; ++i)
        for (int64_t r = 0; r < L.n; ++r) w[static_cast<size_t>(r * L.k + i)] = src[i * L.n + r];
    } else {
      std::memcpy(w.data(), raw.data(), w.size() * sizeof(float));
    }
    double norm2 = 0;
    for (int64_t r = 0; r < L.n; ++r)
      for (int64_t i = 0; i < L.k; ++i) {
        const double v = w[static_cast<size_t>(r * L.k + i)];
        norm2 += c[static_cast<size_t>(i)] * v * v;
      }
    norm2 = std::max(norm2, 1e-30);
    L.bytes8 = L.n * L.k + L.n * 4;
    L.err8 = weighted_error(w.data(), L.n, L.k, quantize_weights(w.data(), L.n, L.k, q8), q8, c) / norm2;
    L.int4_possible = L.k % q4.group == 0 && L.k % 2 == 0;
    if (L.int4_possible) {
      L.bytes4 = L.n * (L.k / 2) + L.n * (L.k / q4.group) * (has_offsets(q4) ? 6 : 2);  // (asym: fp32 offsets)
      L.err4 = weighted_error(w.data(), L.n, L.k, quantize_weights(w.data(), L.n, L.k, q4), q4, c) / norm2;
    } else {
      L.bytes4 = L.bytes8, L.err4 = L.err8, L.int8 = true;
    }
    if (forced_int8.contains(s.weight)) L.int8 = L.forced_int8 = true;
    plan.layers.push_back(std::move(L));
  }

  // everything else the program reads, as it is stored (the layers' fp32 weights are not in the file)
  std::set<graph::ValueId> read;
  for (const auto& n : g.nodes)
    for (const auto& in : n.inputs)
      for (graph::ValueId id : in.arg.tensor_ids()) read.insert(id);
  for (const auto& o : g.outputs)
    for (graph::ValueId id : o.tensor_ids()) read.insert(id);
  int64_t others = 0;
  for (const auto& [v, cd] : program.constants) {
    if (!read.contains(v) || seen.contains(v)) continue;
    const auto& m = g.value(v).meta;
    plan.other_bytes += numel(m) * element_size(m.dtype);
    ++others;
  }
  // asym: the group-sum matrix [K/G, K] fp32, stored once per input width (counted whatever the plan)
  if (has_offsets(q4)) {
    std::set<int64_t> widths;
    for (const AutoLayer& L : plan.layers)
      if (L.int4_possible) widths.insert(L.k);
    for (int64_t k : widths) plan.other_bytes += (k / q4.group) * k * 4;
  }
  // the graph, the payloads and the alignment of each blob: a small allowance, checked against the written file
  plan.other_bytes += 16 * 1024 + 256 * others + 2048 * static_cast<int64_t>(plan.layers.size());

  int64_t total = plan.other_bytes;
  plan.max_bytes = plan.other_bytes;
  for (const AutoLayer& L : plan.layers) total += L.int8 ? L.bytes8 : L.bytes4, plan.max_bytes += L.bytes8;
  plan.min_bytes = total;
  check(max_bytes >= plan.min_bytes,
        "--max-size {:.2f} MB: the smallest file --quantize auto can write is {:.2f} MB (every linear layer 8da4w:{}"
        "{}{}); give at least that",
        static_cast<double>(max_bytes) / 1e6, static_cast<double>(plan.min_bytes) / 1e6, q4.group,
        forced_int8.empty() ? "" : " but the head 8da8w",
        program.constants.empty() ? "" : ", the other constants as they are");
  // greedy: the best error reduction per extra byte first, while the budget allows
  std::vector<size_t> order;
  for (size_t i = 0; i < plan.layers.size(); ++i)
    if (!plan.layers[i].int8) order.push_back(i);
  auto gain = [&](size_t i) {
    const AutoLayer& L = plan.layers[i];
    return (L.err4 - L.err8) / static_cast<double>(std::max<int64_t>(L.bytes8 - L.bytes4, 1));
  };
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return gain(a) > gain(b); });
  for (size_t i : order) {
    AutoLayer& L = plan.layers[i];
    if (L.err4 <= L.err8) continue;
    const int64_t extra = L.bytes8 - L.bytes4;
    if (total + extra > max_bytes) continue;  // a smaller layer further down may still fit
    total += extra;
    L.int8 = true;
  }
  plan.estimate = total;
  for (const AutoLayer& L : plan.layers) {
    plan.error += L.int8 ? L.err8 : L.err4;
    plan.schemes[L.weight] = L.int8 ? q8 : q4;
  }
  return plan;
}

}  // namespace kiln::backends::xnnpack
