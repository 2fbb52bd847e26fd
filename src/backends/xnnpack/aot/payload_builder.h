// The XNNPACK payload builder (private to kiln_xnnpack_aot): a region of an
// edge graph into an XNNGraph flatbuffer (schema/xnnpack_graph.fbs) framed by
// the XNNHeader. One class, its work in one file per kind:
//   payload_builder.cpp  the region (who reads and writes what), values,
//                        constants (named data), the framed payload
//   payload_lower.cpp    the walk: one edge node at a time (elementwise,
//                        shape and data movement)
//   payload_linear.cpp   products (fully connected, quantized), reductions,
//                        layer norm
//   payload_conv.cpp     convolution and pooling (NCHW values, NHWC operators)
//
// Values are defined in this order: the region inputs (id i = argument i),
// the region outputs (ids following), then constants and intermediates as
// the nodes first need them. A graph value keeps one XNNPACK id; a constant
// gets one per shape it is read as (a rank-0 scalar is read as [1]). Every
// constant is named data (see payload.h for why none is in the payload).
#pragma once

#include "kiln/backends/xnnpack/payload.h"
#include "kiln/core/error.h"
#include "kiln/fb/xnnpack_graph_generated.h"
#include "node_args.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace kiln::backends::xnnpack::detail {

namespace fbx = kiln::fb::xnnpack;
using Dims = std::vector<uint32_t>;
using XType = fbx::XNodeUnion;

inline uint64_t align_up(uint64_t n, uint64_t a) { return (n + a - 1) / a * a; }

inline Dims dims_of(const std::vector<int64_t>& sizes) {
  Dims d;
  for (int64_t s : sizes) d.push_back(static_cast<uint32_t>(s));
  if (d.empty()) d.push_back(1);  // a rank-0 value is read as [1]
  return d;
}

inline uint64_t product(const Dims& d, size_t from = 0, size_t to = std::numeric_limits<size_t>::max()) {
  uint64_t p = 1;
  for (size_t i = from; i < std::min(to, d.size()); ++i) p *= d[i];
  return p;
}

// "xnnpack/const/<128-bit XXH3 of the bytes, seeded with their length>".
std::string content_key(const std::vector<std::byte>& bytes);

class PayloadBuilder {
 public:
  PayloadBuilder(const graph::Graph& g, const Region& r, const PayloadOptions& o, bool shapes_only = false)
      : g_(g), r_(r), opts_(o), shapes_only_(shapes_only) {}

  Payload build();

 private:
  // ---- the region: who reads and writes what --------------------------------
  std::string name(graph::ValueId v) const { return g_.value(v).name; }
  const graph::Node& node(int32_t i) const { return g_.nodes.at(static_cast<size_t>(i)); }
  Dims dims(graph::ValueId v) const { return dims_of(g_.value(v).meta.sizes); }

  static std::vector<graph::ValueId> reads_of(const graph::Node& n) {
    std::vector<graph::ValueId> out;
    for (const auto& in : n.inputs)
      for (graph::ValueId v : in.arg.tensor_ids()) out.push_back(v);
    return out;
  }

  void index_region();
  void validate_region();
  void check_boundary_tensor(graph::ValueId v, std::string_view role);

  // ---- region nodes folded into the node that reads them --------------------
  const graph::Node* producer_node(graph::ValueId v) const;

  // `v`, or the value it is a view of (through in-region view_copy / unsqueeze_copy / squeeze_copy / alias_copy
  // nodes, which keep the elements and their order): equal roots hold equal values.
  graph::ValueId view_root(graph::ValueId v) const;
  // The input of a permute_copy(x, [1, 0]) region node that computes `v`.
  std::optional<graph::ValueId> transpose_input(graph::ValueId v) const;
  void plan_absorptions();

  // ---- values ---------------------------------------------------------------
  uint32_t add_value(const Dims& d, uint32_t constant_index, uint32_t external_id, uint32_t flags);
  void define_externals();

  // An intermediate value the builder needs beyond the graph's.
  uint32_t temp(const Dims& d) { return add_value(d, 0, kInvalidValueId, 0); }

  uint32_t constant_value(graph::ValueId v, const Dims& d);
  static std::vector<std::byte> collect(const RegionConstant& c);

  // W [K, N] (a folded transpose, small): gathered whole, transposed, quantized.
  static QuantizedWeights quantize_transposed(const RegionConstant& c, int64_t n, int64_t k, const QuantScheme& q);

  // W [N, K] as the .pt2 stores it: quantized a block of rows at a time as its bytes stream in (rows
  // quantize independently), so no fp32 copy of the weight is ever whole in memory.
  static QuantizedWeights quantize_streamed(const RegionConstant& c, int64_t n, int64_t k, const QuantScheme& q);

  // The constant_data entry naming `key` in the program's named data.
  uint32_t named_constant(const std::string& key, const pte::DataBlob& data);

  // A constant the builder makes (scalar operands, reduction rows): named data
  // under a key derived from its bytes, so equal constants are stored once.
  uint32_t made_constant(const std::vector<float>& values, const Dims& d);
  uint32_t scalar_constant(double x) { return made_constant({static_cast<float>(x)}, {1}); }

  // The id of a graph value a node reads.
  uint32_t read(graph::ValueId v) { return read_as(v, dims(v)); }

  uint32_t read_as(graph::ValueId v, const Dims& d);

  // `v` read with shape `d` (same element count): a constant gets a value of
  // that shape, anything else goes through an XNNStaticReshape.
  uint32_t read_reshaped(graph::ValueId v, const Dims& d);

  // The id a node writes graph value `v` to.
  uint32_t write(graph::ValueId v);

  // How often region nodes and the region outputs read `v`.
  int64_t reads(graph::ValueId v) const {
    auto it = reads_.find(v);
    return it == reads_.end() ? 0 : it->second;
  }
  bool used(graph::ValueId v) const { return reads(v) > 0; }

  static std::optional<graph::ValueId> output_at(const graph::Node& n, size_t i) {
    if (i >= n.outputs.size() || n.outputs[i].kind != Argument::Kind::Tensor) return std::nullopt;
    return std::get<graph::ValueId>(n.outputs[i].payload);
  }

  // ---- nodes ------------------------------------------------------------------
  void add_node(XType type, flatbuffers::Offset<void> body, std::optional<std::pair<float, float>> clamp = {}) {
    flatbuffers::Offset<fbx::OutputMinMax> mm = 0;
    if (clamp) mm = fbx::CreateOutputMinMax(fb_, clamp->first, clamp->second);
    xnodes_.push_back(fbx::CreateXNode(fb_, type, body, static_cast<uint32_t>(node_index_), mm));
  }
  void binary(XType type, uint32_t a, uint32_t b, uint32_t out) {
    add_node(type, fbx::Create_XNNNode2x1(fb_, a, b, out, 0).Union());
  }
  void unary(XType type, uint32_t in, uint32_t out, std::optional<std::pair<float, float>> clamp = {}) {
    add_node(type, fbx::Create_XNNNode1x1(fb_, in, out, 0).Union(), clamp);
  }
  void fully_connected(uint32_t in, uint32_t filter, uint32_t bias, uint32_t out, uint32_t flags) {
    add_node(XType::XNNFullyConnected, fbx::CreateXNNFullyConnected(fb_, in, filter, bias, out, flags).Union());
  }
  void transpose(const Dims& perm, uint32_t in, uint32_t out) {
    auto p = fb_.CreateVector(perm);
    add_node(XType::XNNStaticTranspose,
             fbx::CreateXNNStaticTranspose(fb_, static_cast<uint32_t>(perm.size()), p, in, out, 0).Union());
  }
  void reshape(const Dims& shape, uint32_t in, uint32_t out) {
    auto s = fb_.CreateVector(shape);
    add_node(XType::XNNStaticReshape,
             fbx::CreateXNNStaticReshape(fb_, static_cast<uint32_t>(shape.size()), s, in, out, 0).Union());
  }
  // out = in reshaped to `shape` (a copy when the shape is the same).
  void reshape_or_copy(const Dims& from, const Dims& shape, uint32_t in, uint32_t out) {
    if (from == shape) unary(XType::XNNCopy, in, out);
    else reshape(shape, in, out);
  }
  void slice(const Dims& offsets, const Dims& sizes, uint32_t in, uint32_t out) {
    auto o = fb_.CreateVector(offsets);
    auto s = fb_.CreateVector(sizes);
    add_node(XType::XNNStaticSlice,
             fbx::CreateXNNStaticSlice(fb_, static_cast<uint32_t>(offsets.size()), o, s, in, out, 0).Union());
  }
  void concatenate(uint32_t axis, const std::vector<uint32_t>& in, uint32_t out) {
    static constexpr XType kTypes[] = {XType::XNNConcatenate2, XType::XNNConcatenate3, XType::XNNConcatenate4,
                                       XType::XNNConcatenate5};
    check(in.size() >= 2 && in.size() <= 5, "internal: concatenation of {} inputs", in.size());
    auto at = [&](size_t i) { return i < in.size() ? in[i] : kInvalidValueId; };
    add_node(kTypes[in.size() - 2], fbx::Create_XNNCat(fb_, axis, at(0), at(1), at(2), at(3), out, 0, at(4)).Union());
  }

  // ---- lowering, one edge node at a time ------------------------------------
  void lower(const graph::Node& n);

  // ---- convolution and pooling: NCHW graph values, NHWC XNNPACK operators --------
  uint32_t to_nhwc(uint32_t id, const Dims& nchw) {
    uint32_t t = temp({nchw[0], nchw[2], nchw[3], nchw[1]});
    transpose({0, 2, 3, 1}, id, t);
    return t;
  }

  static std::vector<float> floats_of(const std::vector<std::byte>& bytes);
  void lower_convolution(const graph::Node& n, const std::vector<Argument>& args, graph::ValueId out);
  void lower_pooling(const graph::Node& n, const std::vector<Argument>& args, const std::vector<graph::ValueId>& outs);
  void lower_binary(const graph::Node& n, XType type, const std::vector<Argument>& args, graph::ValueId out);
  void lower_pow(graph::ValueId x, double e, graph::ValueId out);

  // elu (scale = input_scale = 1) and leaky_relu: one node each
  void lower_activation(const std::string& t, const std::vector<Argument>& args, graph::ValueId x, graph::ValueId out);

  // 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
  void lower_gelu_tanh(graph::ValueId x, graph::ValueId out);

  // out = a @ b (+ bias) with a [M,K], b [K,N]; `bias` broadcasts to [M,N].
  void lower_matmul(graph::ValueId a, graph::ValueId b, std::optional<graph::ValueId> bias, graph::ValueId out);

  // a @ W as ExecuTorch's dynamically quantized fully connected (PayloadOptions):
  // XNNConvert of a to int8 rows (qdint8, one set of parameters per row), then
  // a fully connected node on W quantized now (qbint4 with bf16 group scales, or
  // qcint8 with fp32 channel scales, both named data). W is [N, K] (or [K, N]
  // when kn). False, emitting nothing, when the scheme does not apply.
  template <class FusableBias, class WithAddedBias>
  bool quantized_fc(graph::ValueId a, graph::ValueId wv, bool kn, graph::ValueId out, const FusableBias& fusable_bias,
                    const WithAddedBias& with_added_bias);
  uint32_t add_quantized_value(const Dims& d, fbx::XNNDatatype dtype, fbx::XNNQuantParams ptype,
                               flatbuffers::Offset<void> params, uint32_t constant_index);

  // out = sum (or mean) of x over its last `count` dims, shaped as out.
  // A fully connected node against a [1, K] row of ones (or 1/K).
  uint32_t reduce_rows(uint32_t x, const Dims& xd, size_t count, bool mean, std::optional<uint32_t> into = {});
  void reduce_trailing(graph::ValueId x, size_t count, bool mean, graph::ValueId out);
  void lower_layer_norm(const graph::Node& n, const std::vector<Argument>& args);

  // Broadcast x to out's shape: x + zeros, the zeros shaped [.., out[d] where
  // x broadcasts along d, 1 elsewhere]; a reshape when nothing broadcasts.
  void lower_expand(graph::ValueId x, graph::ValueId out);

  // ---- the payload ------------------------------------------------------------
  Payload finish();
  const graph::Graph& g_;
  const Region& r_;
  flatbuffers::FlatBufferBuilder fb_{1024};
  std::vector<flatbuffers::Offset<fbx::XValue>> xvalues_;
  std::vector<flatbuffers::Offset<fbx::XNode>> xnodes_;
  std::vector<flatbuffers::Offset<fbx::ConstantDataOffset>> constant_data_;
  std::vector<uint32_t> input_ids_, output_ids_;
  std::map<std::string, uint32_t> named_index_;
  std::map<std::string, uint64_t> named_size_;
  std::vector<pte::NamedBlob> named_out_;
  std::set<int32_t> in_region_;
  std::map<graph::ValueId, int32_t> producer_;
  std::map<graph::ValueId, int64_t> reads_;
  std::map<graph::ValueId, std::vector<int32_t>> readers_;
  std::map<graph::ValueId, const RegionConstant*> constants_;
  std::set<int32_t> absorbed_;
  std::map<graph::ValueId, graph::ValueId> weight_of_transpose_;  // permute_copy(W) output -> W
  std::map<int32_t, graph::ValueId> tied_input_;                  // mm node -> x of its permute_copy(x) operand
  std::map<int32_t, graph::ValueId> tied_output_;                 // mm node -> output of the permute_copy reading it

  std::map<graph::ValueId, uint32_t> ids_;
  std::map<std::pair<graph::ValueId, Dims>, uint32_t> constant_ids_;
  std::map<std::pair<std::string, Dims>, uint32_t> made_ids_;
  // quantized products' inputs by (view_root, dims): their int8 rows (qdint8, per weight kind: int4 or not) and, per
  // group size, their group sums (asym int4's offsets), made once for the layers that read the same values
  std::map<std::pair<std::pair<graph::ValueId, Dims>, bool>, uint32_t> quantized_inputs_;
  std::map<std::pair<std::pair<graph::ValueId, Dims>, int64_t>, uint32_t> group_sums_;
  std::set<graph::ValueId> available_;
  int32_t node_index_ = 0;
  PayloadStats stats_;
  const PayloadOptions& opts_;  // the caller's, which outlives the builder (--calibrate's results are large)
  bool shapes_only_ = false;    // build_payload's Shapes::Only: quantized weights are not computed
};

}  // namespace kiln::backends::xnnpack::detail
