// The XNNPACK payload builder: a region of an edge graph into an XNNGraph
// flatbuffer (schema/xnnpack_graph.fbs) framed by the XNNHeader.
//
// Values are defined in this order: the region inputs (id i = argument i),
// the region outputs (ids following), then constants and intermediates as
// the nodes first need them. A graph value keeps one XNNPACK id; a constant
// gets one per shape it is read as (a rank-0 scalar is read as [1]). Every
// constant is named data (see payload.h for why none is in the payload).
#include "kiln/backends/xnnpack/payload.h"

#include "kiln/backends/xnnpack/support.h"
#include "kiln/core/error.h"
#include "kiln/fb/xnnpack_graph_generated.h"
#include "node_args.h"

#include <xxhash.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <numbers>
#include <optional>
#include <set>
#include <utility>

namespace kiln::backends::xnnpack {
namespace {

namespace fbx = kiln::fb::xnnpack;
using namespace detail;
using Dims = std::vector<uint32_t>;
using XType = fbx::XNodeUnion;

uint64_t align_up(uint64_t n, uint64_t a) { return (n + a - 1) / a * a; }

Dims dims_of(const std::vector<int64_t>& sizes) {
  Dims d;
  for (int64_t s : sizes) d.push_back(static_cast<uint32_t>(s));
  if (d.empty()) d.push_back(1);  // a rank-0 value is read as [1]
  return d;
}

uint64_t product(const Dims& d, size_t from = 0, size_t to = std::numeric_limits<size_t>::max()) {
  uint64_t p = 1;
  for (size_t i = from; i < std::min(to, d.size()); ++i) p *= d[i];
  return p;
}

// "xnnpack/const/<128-bit XXH3 of the bytes, seeded with their length>".
std::string content_key(const std::vector<std::byte>& bytes) {
  XXH128_hash_t h = XXH3_128bits_withSeed(bytes.data(), bytes.size(), bytes.size());
  return fmt::format("xnnpack/const/{:016x}{:016x}", h.high64, h.low64);
}

std::vector<std::byte> float_bytes(const std::vector<float>& v) {
  std::vector<std::byte> b(v.size() * sizeof(float));
  if (!b.empty()) std::memcpy(b.data(), v.data(), b.size());
  return b;
}

void put_le(std::vector<std::byte>& out, size_t at, uint64_t v, size_t n) {
  for (size_t i = 0; i < n; ++i) out[at + i] = static_cast<std::byte>((v >> (8 * i)) & 0xFF);
}

class PayloadBuilder {
 public:
  PayloadBuilder(const graph::Graph& g, const Region& r, const PayloadOptions& o) : g_(g), r_(r), opts_(o) {}

  Payload build() {
    index_region();
    validate_region();
    plan_absorptions();
    define_externals();
    for (int32_t i : r_.nodes) {
      if (absorbed_.contains(i)) continue;
      auto outs = node(i).output_ids();
      if (std::none_of(outs.begin(), outs.end(), [&](graph::ValueId v) { return used(v); })) continue;  // dead
      node_index_ = i;
      lower(g_.nodes[static_cast<size_t>(i)]);
    }
    for (graph::ValueId v : r_.outputs)
      check(available_.contains(v), "region output '{}' was not computed by the region", name(v));
    return finish();
  }

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

  void index_region() {
    for (int32_t i : r_.nodes) {
      check(i >= 0 && static_cast<size_t>(i) < g_.nodes.size(), "region node index {} is out of range", i);
      check(in_region_.insert(i).second, "region lists node '{}' twice", node(i).name);
      for (graph::ValueId v : node(i).output_ids()) producer_[v] = i;
      for (graph::ValueId v : reads_of(node(i))) {
        ++reads_[v];
        readers_[v].push_back(i);
      }
    }
    for (graph::ValueId v : r_.outputs) ++reads_[v];
    for (const auto& c : r_.constants) {
      check(c.value >= 0 && static_cast<size_t>(c.value) < g_.values.size(), "region constant id {} is out of range",
            c.value);
      check(constants_.emplace(c.value, &c).second, "region lists constant '{}' twice", name(c.value));
      const auto& m = g_.value(c.value).meta;
      check(c.data.size == static_cast<uint64_t>(m.nbytes()), "constant '{}': {} bytes given for a {} of {} bytes",
            name(c.value), c.data.size, dtype_name(m.dtype), m.nbytes());
      check(static_cast<bool>(c.data.write) || c.data.size == 0, "constant '{}' has no data", name(c.value));
    }
  }

  void validate_region() {
    std::set<graph::ValueId> seen;
    for (graph::ValueId v : r_.inputs) {
      check(v >= 0 && static_cast<size_t>(v) < g_.values.size(), "region input id {} is out of range", v);
      check(seen.insert(v).second, "value '{}' is listed twice among the region inputs and outputs", name(v));
      check(!constants_.contains(v), "region input '{}' is also a region constant", name(v));
      check(!producer_.contains(v), "region input '{}' is computed inside the region", name(v));
      check(used(v), "region input '{}' is not read by any region node", name(v));
    }
    for (graph::ValueId v : r_.outputs) {
      check(v >= 0 && static_cast<size_t>(v) < g_.values.size(), "region output id {} is out of range", v);
      check(seen.insert(v).second, "value '{}' is listed twice among the region inputs and outputs", name(v));
      check(producer_.contains(v), "region output '{}' is not computed by a region node", name(v));
    }
    check(r_.inputs.size() + r_.outputs.size() < kInvalidValueId, "region has too many inputs and outputs");
    for (graph::ValueId v : r_.inputs) check_boundary_tensor(v, "input");
    for (graph::ValueId v : r_.outputs) check_boundary_tensor(v, "output");
    for (const auto& [v, c] : constants_)
      check(!producer_.contains(v), "region constant '{}' is computed inside the region", name(v));
    for (int32_t i : r_.nodes) {
      std::string why;
      check(xnnpack_supports(g_, node(i), &why), "node '{}' ({}) cannot run in XNNPACK: {}", node(i).name,
            node(i).target, why);
    }
    // Values computed here and read elsewhere must leave through the outputs.
    std::set<graph::ValueId> outputs(r_.outputs.begin(), r_.outputs.end());
    auto read_outside = [&](graph::ValueId v, std::string_view by) {
      if (producer_.contains(v) && !outputs.contains(v))
        fail("value '{}' computed in the region is read by {} outside it but is not a region output", name(v), by);
    };
    for (size_t i = 0; i < g_.nodes.size(); ++i) {
      if (in_region_.contains(static_cast<int32_t>(i))) continue;
      for (graph::ValueId v : reads_of(g_.nodes[i])) read_outside(v, fmt::format("node '{}'", g_.nodes[i].name));
    }
    for (const auto& out : g_.outputs)
      for (graph::ValueId v : out.tensor_ids()) read_outside(v, "the graph output");
  }

  void check_boundary_tensor(graph::ValueId v, std::string_view role) {
    const auto& m = g_.value(v).meta;
    check(m.dtype == ScalarType::Float, "region {} '{}' is {}, not float32", role, name(v), dtype_name(m.dtype));
    check(!m.sizes.empty() && m.sizes.size() <= kMaxDims, "region {} '{}' has rank {}; XNNPACK takes 1 to {}", role,
          name(v), m.sizes.size(), kMaxDims);
  }

  // ---- region nodes folded into the node that reads them --------------------
  const graph::Node* producer_node(graph::ValueId v) const {
    auto it = producer_.find(v);
    return it == producer_.end() ? nullptr : &node(it->second);
  }

  // The input of a permute_copy(x, [1, 0]) region node that computes `v`.
  std::optional<graph::ValueId> transpose_input(graph::ValueId v) const {
    const graph::Node* p = producer_node(v);
    if (!p || p->target != "aten.permute_copy.default") return std::nullopt;
    auto args = schema_arguments(*p);
    graph::ValueId x = tensor_of(args[0], p->name);
    auto perm = ints_of(args[1], p->name);
    if (g_.value(x).meta.sizes.size() != 2 || perm.size() != 2 || wrap_dim(perm[0], 2) != size_t{1} ||
        wrap_dim(perm[1], 2) != size_t{0})
      return std::nullopt;
    return x;
  }

  void plan_absorptions() {
    // mat2 = permute_copy(W, [1,0]) with W constant, read only as the mat2 of
    // mm/addmm nodes: those become fully connected nodes on W itself.
    std::map<graph::ValueId, int64_t> mat2_uses;
    for (int32_t i : r_.nodes) {
      const auto& n = node(i);
      if (n.target != "aten.mm.default" && n.target != "aten.addmm.default") continue;
      auto args = schema_arguments(n);
      ++mat2_uses[tensor_of(args[n.target == "aten.mm.default" ? 1 : 2], n.name)];
    }
    for (auto [y, uses] : mat2_uses) {
      auto w = transpose_input(y);
      if (w && constants_.contains(*w) && reads(y) == uses) {
        weight_of_transpose_[y] = *w;
        absorbed_.insert(producer_.at(y));
      }
    }
    // mm(A, permute_copy(x,[1,0])) with A constant is (x @ A^T)^T: a fully
    // connected node on x with A as filter; a permute_copy([1,0]) reading the
    // result (and nothing else reading it) takes the fully connected output.
    for (int32_t i : r_.nodes) {
      const auto& n = node(i);
      if (n.target != "aten.mm.default") continue;
      auto args = schema_arguments(n);
      graph::ValueId a = tensor_of(args[0], n.name), b = tensor_of(args[1], n.name);
      if (!constants_.contains(a) || constants_.contains(b) || weight_of_transpose_.contains(b)) continue;
      auto x = transpose_input(b);
      if (x && reads(b) == 1) {
        tied_input_[i] = *x;
        absorbed_.insert(producer_.at(b));
      }
      graph::ValueId y = n.output_ids().at(0);
      if (reads(y) == 1 && readers_.contains(y) && readers_.at(y).size() == 1) {
        int32_t q = readers_.at(y)[0];
        if (transpose_input(node(q).output_ids().at(0)) == y) {
          tied_output_[i] = node(q).output_ids().at(0);
          absorbed_.insert(q);
        }
      }
    }
    stats_.absorbed_nodes = static_cast<int64_t>(absorbed_.size());
  }

  // ---- values ---------------------------------------------------------------
  uint32_t add_value(const Dims& d, uint32_t constant_index, uint32_t external_id, uint32_t flags) {
    auto id = static_cast<uint32_t>(xvalues_.size());
    auto dims_vec = fb_.CreateVector(d);
    auto tv = fbx::CreateXNNTensorValue(fb_, fbx::XNNDatatype::xnn_datatype_fp32, static_cast<uint32_t>(d.size()),
                                        dims_vec, constant_index, external_id, flags, id);
    xvalues_.push_back(fbx::CreateXValue(fb_, fbx::XValueUnion::XNNTensorValue, tv.Union()));
    return id;
  }

  void define_externals() {
    constant_data_.push_back(fbx::CreateConstantDataOffset(fb_, 0, 0));  // [0]: "no constant data"
    uint32_t ext = 0;
    for (graph::ValueId v : r_.inputs) {
      uint32_t id = add_value(dims(v), 0, ext++, kValueFlagExternalInput);
      ids_[v] = id;
      input_ids_.push_back(id);
      available_.insert(v);
    }
    for (graph::ValueId v : r_.outputs) {
      uint32_t id = add_value(dims(v), 0, ext++, kValueFlagExternalOutput);
      ids_[v] = id;
      output_ids_.push_back(id);
    }
  }

  // An intermediate value the builder needs beyond the graph's.
  uint32_t temp(const Dims& d) { return add_value(d, 0, kInvalidValueId, 0); }

  uint32_t constant_value(graph::ValueId v, const Dims& d) {
    auto key = std::make_pair(v, d);
    if (auto it = constant_ids_.find(key); it != constant_ids_.end()) return it->second;
    const RegionConstant& c = *constants_.at(v);
    check(product(d) == product(dims(v)), "internal: constant '{}' read with a different element count", name(v));
    uint32_t index = 0;
    if (c.key.empty()) {
      std::vector<std::byte> bytes = collect(c);
      index = named_constant(content_key(bytes), pte::DataBlob::from_bytes(std::move(bytes)));
    } else {
      index = named_constant(c.key, c.data);
    }
    uint32_t id = add_value(d, index, kInvalidValueId, 0);
    constant_ids_[key] = id;
    return id;
  }

  static std::vector<std::byte> collect(const RegionConstant& c) {
    std::vector<std::byte> bytes;
    bytes.reserve(c.data.size);
    if (c.data.write)
      c.data.write([&](std::span<const std::byte> s) { bytes.insert(bytes.end(), s.begin(), s.end()); });
    check(bytes.size() == c.data.size, "constant data streamed {} bytes, declared {}", bytes.size(), c.data.size);
    return bytes;
  }

  // W [K, N] (a folded transpose, small): gathered whole, transposed, quantized.
  static QuantizedWeights quantize_transposed(const RegionConstant& c, int64_t n, int64_t k, const QuantScheme& q) {
    std::vector<std::byte> raw = collect(c);
    std::vector<float> w(static_cast<size_t>(n * k));
    const auto* src = reinterpret_cast<const float*>(raw.data());
    for (int64_t j = 0; j < n; ++j)
      for (int64_t i = 0; i < k; ++i) w[static_cast<size_t>(j * k + i)] = src[i * n + j];
    return quantize_weights(w.data(), n, k, q);
  }

  // W [N, K] as the .pt2 stores it: quantized a block of rows at a time as its bytes stream in (rows
  // quantize independently), so no fp32 copy of the weight is ever whole in memory.
  static QuantizedWeights quantize_streamed(const RegionConstant& c, int64_t n, int64_t k, const QuantScheme& q) {
    const size_t row_bytes = static_cast<size_t>(k) * sizeof(float);
    const int64_t block_rows = std::max<int64_t>(1, static_cast<int64_t>((size_t{4} << 20) / row_bytes));
    std::vector<float> block(static_cast<size_t>(block_rows * k));
    const size_t block_bytes = static_cast<size_t>(block_rows) * row_bytes;
    QuantizedWeights qw;
    const bool int4 = q.kind == QuantScheme::Kind::Int4Groups;
    qw.data.reserve(static_cast<size_t>(int4 ? n * (k / 2) : n * k));
    qw.scales.reserve(static_cast<size_t>(int4 ? n * (k / q.group) * 2 : n * 4));
    size_t filled = 0;
    int64_t rows_done = 0;
    auto flush = [&](int64_t rows) {
      check(rows_done + rows <= n, "constant data streamed more than its {} rows", n);
      QuantizedWeights part = quantize_weights(block.data(), rows, k, q);
      qw.data.insert(qw.data.end(), part.data.begin(), part.data.end());
      qw.scales.insert(qw.scales.end(), part.scales.begin(), part.scales.end());
      rows_done += rows;
    };
    if (c.data.write)
      c.data.write([&](std::span<const std::byte> s) {
        while (!s.empty()) {
          const size_t take = std::min(s.size(), block_bytes - filled);
          std::memcpy(reinterpret_cast<std::byte*>(block.data()) + filled, s.data(), take);
          filled += take;
          s = s.subspan(take);
          if (filled == block_bytes) {
            flush(block_rows);
            filled = 0;
          }
        }
      });
    check(filled % row_bytes == 0, "constant data streamed a partial row");
    if (filled) flush(static_cast<int64_t>(filled / row_bytes));
    check(rows_done == n, "constant data streamed {} rows, declared {}", rows_done, n);
    return qw;
  }

  // The constant_data entry naming `key` in the program's named data.
  uint32_t named_constant(const std::string& key, const pte::DataBlob& data) {
    if (auto it = named_index_.find(key); it != named_index_.end()) {
      check(named_size_.at(key) == data.size, "named data key '{}' is given for {} and for {} bytes", key,
            named_size_.at(key), data.size);
      return it->second;
    }
    auto index = static_cast<uint32_t>(constant_data_.size());
    auto key_string = fb_.CreateString(key);
    constant_data_.push_back(fbx::CreateConstantDataOffset(fb_, kNamedConstantOffset, data.size, key_string));
    named_index_[key] = index;
    named_size_[key] = data.size;
    named_out_.push_back({key, data});
    ++stats_.named_constants;
    return index;
  }

  // A constant the builder makes (scalar operands, reduction rows): named data
  // under a key derived from its bytes, so equal constants are stored once.
  uint32_t made_constant(const std::vector<float>& values, const Dims& d) {
    std::vector<std::byte> bytes = float_bytes(values);
    std::string key = content_key(bytes);
    auto id_key = std::make_pair(key, d);
    if (auto it = made_ids_.find(id_key); it != made_ids_.end()) return it->second;
    if (!named_index_.contains(key)) ++stats_.made_constants;
    uint32_t index = named_constant(key, pte::DataBlob::from_bytes(std::move(bytes)));
    uint32_t id = add_value(d, index, kInvalidValueId, 0);
    made_ids_[id_key] = id;
    return id;
  }

  uint32_t scalar_constant(double x) { return made_constant({static_cast<float>(x)}, {1}); }

  // The id of a graph value a node reads.
  uint32_t read(graph::ValueId v) { return read_as(v, dims(v)); }

  uint32_t read_as(graph::ValueId v, const Dims& d) {
    if (constants_.contains(v)) return constant_value(v, d);
    const graph::Node& n = node(node_index_);
    check(available_.contains(v),
          "node '{}' reads '{}', which is not a region input, a region constant, or computed earlier in the region",
          n.name, name(v));
    check(d == dims(v), "internal: '{}' read with another shape", name(v));
    return ids_.at(v);
  }

  // `v` read with shape `d` (same element count): a constant gets a value of
  // that shape, anything else goes through an XNNStaticReshape.
  uint32_t read_reshaped(graph::ValueId v, const Dims& d) {
    if (constants_.contains(v) || dims(v) == d) return read_as(v, d);
    uint32_t r = temp(d);
    reshape(d, read(v), r);
    return r;
  }

  // The id a node writes graph value `v` to.
  uint32_t write(graph::ValueId v) {
    check(!available_.contains(v) && !constants_.contains(v), "value '{}' is written twice", name(v));
    available_.insert(v);
    if (auto it = ids_.find(v); it != ids_.end()) return it->second;  // a region output
    uint32_t id = temp(dims(v));
    ids_[v] = id;
    return id;
  }

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
  void lower(const graph::Node& n) {
    const std::string& t = n.target;
    auto args = schema_arguments(n);
    auto outs = n.output_ids();
    auto in = [&](size_t i) { return tensor_of(args[i], n.name); };

    static const std::map<std::string_view, XType> kUnary = {
        {"aten.neg.default", XType::XNNNegate},      {"aten.abs.default", XType::XNNAbs},
        {"aten.exp.default", XType::XNNExp},         {"aten.log.default", XType::XNNLog},
        {"aten.sqrt.default", XType::XNNSquareRoot}, {"aten.rsqrt.default", XType::XNNReciprocalSquareRoot},
        {"aten.tanh.default", XType::XNNTanh},       {"aten.sigmoid.default", XType::XNNSigmoid},
        {"aten.sin.default", XType::XNNSin},         {"aten.cos.default", XType::XNNCos},
        {"aten._softmax.default", XType::XNNSoftmax}};
    static const std::map<std::string_view, XType> kBinary = {
        {"aten.add.Tensor", XType::XNNAdd},           {"aten.sub.Tensor", XType::XNNSubtract},
        {"aten.mul.Tensor", XType::XNNMultiply},      {"aten.div.Tensor", XType::XNNDiv},
        {"aten.maximum.default", XType::XNNMaximum},  {"aten.minimum.default", XType::XNNMinimum},
        {"aten.add.Scalar", XType::XNNAdd},           {"aten.sub.Scalar", XType::XNNSubtract},
        {"aten.mul.Scalar", XType::XNNMultiply},      {"aten.div.Scalar", XType::XNNDiv}};

    if (auto it = kUnary.find(t); it != kUnary.end()) {
      uint32_t x = read(in(0));
      unary(it->second, x, write(outs[0]));
      return;
    }
    if (auto it = kBinary.find(t); it != kBinary.end()) return lower_binary(n, it->second, args, outs[0]);
    if (t == "aten.rsub.Scalar") {
      // other - alpha * self
      uint32_t x = read(in(0));
      double alpha = *scalar_of(args[2]);
      if (alpha != 1) {
        uint32_t scaled = temp(dims(in(0)));
        binary(XType::XNNMultiply, x, scalar_constant(alpha), scaled);
        x = scaled;
      }
      binary(XType::XNNSubtract, scalar_constant(*scalar_of(args[1])), x, write(outs[0]));
      return;
    }
    if (t == "aten.pow.Tensor_Scalar") return lower_pow(in(0), *scalar_of(args[1]), outs[0]);
    if (t == "aten.relu.default") {
      uint32_t x = read(in(0));
      unary(XType::XNNClamp, x, write(outs[0]), std::pair{0.0f, std::numeric_limits<float>::infinity()});
      return;
    }
    if (t == "aten.clamp.default") {
      float lo = -std::numeric_limits<float>::infinity(), hi = std::numeric_limits<float>::infinity();
      if (auto v = scalar_of(args[1])) lo = static_cast<float>(*v);
      if (auto v = scalar_of(args[2])) hi = static_cast<float>(*v);
      uint32_t x = read(in(0));
      unary(XType::XNNClamp, x, write(outs[0]), std::pair{lo, hi});
      return;
    }
    if (t == "aten.gelu.default") {
      if (string_of(args[1], n.name) == "none") {
        uint32_t x = read(in(0));
        unary(XType::XNNGelu, x, write(outs[0]));
      } else {
        lower_gelu_tanh(in(0), outs[0]);
      }
      return;
    }
    if (t == "aten.elu.default" || t == "aten.leaky_relu.default")
      return lower_activation(t, args, in(0), outs[0]);
    if (t == "aten.addmm.default") return lower_matmul(in(1), in(2), in(0), outs[0]);
    if (t == "aten.mm.default") return lower_matmul(in(0), in(1), std::nullopt, outs[0]);
    if (t == "aten.bmm.default") {
      uint32_t a = read(in(0)), b = read(in(1));
      binary(XType::XNNBatchMatrixMultiply, a, b, write(outs[0]));
      return;
    }
    if (t == "aten.mean.dim" || t == "aten.sum.dim_IntList") {
      graph::ValueId x = in(0);
      auto rd = *reduction_dims(optional_ints_of(args[1], n.name), dims(x).size());
      reduce_trailing(x, rd.size(), t == "aten.mean.dim", outs[0]);
      return;
    }
    if (t == "aten.native_layer_norm.default") return lower_layer_norm(n, args);
    if (t == "aten.permute_copy.default") {
      graph::ValueId x = in(0);
      Dims perm;
      for (int64_t d : ints_of(args[1], n.name)) perm.push_back(static_cast<uint32_t>(*wrap_dim(d, dims(x).size())));
      Dims identity(perm.size());
      for (size_t i = 0; i < identity.size(); ++i) identity[i] = static_cast<uint32_t>(i);
      uint32_t xi = read(x);
      if (perm == identity) unary(XType::XNNCopy, xi, write(outs[0]));
      else transpose(perm, xi, write(outs[0]));
      return;
    }
    if (t == "aten.view_copy.default" || t == "aten.unsqueeze_copy.default" || t == "aten.squeeze_copy.dims" ||
        t == "aten.alias_copy.default" || t == "dim_order_ops._clone_dim_order.default" ||
        t == "dim_order_ops._to_dim_order_copy.default") {
      graph::ValueId x = in(0);
      uint32_t xi = read(x);
      reshape_or_copy(dims(x), dims(outs[0]), xi, write(outs[0]));
      return;
    }
    if (t == "aten.expand_copy.default") return lower_expand(in(0), outs[0]);
    if (t == "aten.slice_copy.Tensor") {
      graph::ValueId x = in(0);
      Dims xd = dims(x);
      size_t d = *wrap_dim(int_of(args[1], n.name), xd.size());
      int64_t size = xd[d];
      int64_t start = optional_int_of(args[2], n.name).value_or(0);
      if (start < 0) start += size;
      start = std::clamp<int64_t>(start, 0, size);
      Dims offsets(xd.size(), 0);
      offsets[d] = static_cast<uint32_t>(start);
      uint32_t xi = read(x);
      slice(offsets, dims(outs[0]), xi, write(outs[0]));
      return;
    }
    if (t == "aten.select_copy.int") {
      graph::ValueId x = in(0);
      Dims xd = dims(x);
      size_t d = *wrap_dim(int_of(args[1], n.name), xd.size());
      int64_t index = int_of(args[2], n.name);
      if (index < 0) index += xd[d];
      Dims offsets(xd.size(), 0), sizes = xd;
      offsets[d] = static_cast<uint32_t>(index);
      sizes[d] = 1;
      uint32_t xi = read(x);
      uint32_t s = temp(sizes);
      slice(offsets, sizes, xi, s);
      reshape(dims(outs[0]), s, write(outs[0]));
      return;
    }
    if (t == "aten.split_with_sizes_copy.default") {
      graph::ValueId x = in(0);
      Dims xd = dims(x);
      size_t d = *wrap_dim(int_of(args[2], n.name), xd.size());
      uint32_t xi = read(x);
      uint32_t offset = 0;
      for (graph::ValueId o : outs) {
        Dims od = dims(o);
        if (used(o)) {
          Dims offsets(xd.size(), 0);
          offsets[d] = offset;
          slice(offsets, od, xi, write(o));
        }
        offset += od[d];
      }
      return;
    }
    if (t == "aten.cat.default") {
      auto ts = tensors_of(args[0], n.name);
      uint32_t axis = static_cast<uint32_t>(*wrap_dim(int_of(args[1], n.name), dims(ts[0]).size()));
      std::vector<uint32_t> ids;
      std::vector<Dims> shapes;
      for (graph::ValueId v : ts) {
        ids.push_back(read(v));
        shapes.push_back(dims(v));
      }
      uint32_t out = write(outs[0]);
      if (ids.size() == 1) {
        unary(XType::XNNCopy, ids[0], out);
        return;
      }
      // Past five inputs: concatenate the first five into a temporary, repeat.
      while (ids.size() > 5) {
        Dims d = shapes[0];
        for (size_t i = 1; i < 5; ++i) d[axis] += shapes[i][axis];
        uint32_t part = temp(d);
        concatenate(axis, {ids.begin(), ids.begin() + 5}, part);
        ids.erase(ids.begin(), ids.begin() + 5);
        shapes.erase(shapes.begin(), shapes.begin() + 5);
        ids.insert(ids.begin(), part);
        shapes.insert(shapes.begin(), d);
      }
      concatenate(axis, ids, out);
      return;
    }
    if (t == "aten.constant_pad_nd.default") {
      graph::ValueId x = in(0);
      Dims xd = dims(x);
      auto pad = ints_of(args[1], n.name);
      Dims pre(xd.size(), 0), post(xd.size(), 0);
      for (size_t i = 0; i < pad.size() / 2; ++i) {
        size_t d = xd.size() - 1 - i;
        pre[d] = static_cast<uint32_t>(pad[2 * i]);
        post[d] = static_cast<uint32_t>(pad[2 * i + 1]);
      }
      uint32_t xi = read(x);
      auto p0 = fb_.CreateVector(pre);
      auto p1 = fb_.CreateVector(post);
      uint32_t out = write(outs[0]);
      add_node(XType::XNNStaticConstantPad,
               fbx::CreateXNNStaticConstantPad(fb_, p0, p1, static_cast<float>(*scalar_of(args[2])), xi, out, 0)
                   .Union());
      return;
    }
    if (t == "aten.convolution.default") {
      lower_convolution(n, args, outs[0]);
      return;
    }
    if (t == "aten.max_pool2d_with_indices.default" || t == "aten.avg_pool2d.default") {
      lower_pooling(n, args, outs);
      return;
    }
    if (t == "aten.upsample_bilinear2d.vec") {
      graph::ValueId x = in(0);
      Dims xd = dims(x), od = dims(outs[0]);
      uint32_t flags = bool_of(args[2], n.name) ? 0x00000008u : 0u;  // XNN_FLAG_ALIGN_CORNERS
      uint32_t t1 = to_nhwc(read(x), xd);
      uint32_t t2 = temp({od[0], od[2], od[3], od[1]});
      add_node(XType::XNNStaticResizeBilinear2D,
               fbx::CreateXNNStaticResizeBilinear2D(fb_, od[2], od[3], t1, t2, flags).Union());
      transpose({0, 3, 1, 2}, t2, write(outs[0]));
      return;
    }
    fail("internal: node '{}' ({}) passed the support check but has no lowering", n.name, t);
  }

  // ---- convolution and pooling: NCHW graph values, NHWC XNNPACK operators --------
  uint32_t to_nhwc(uint32_t id, const Dims& nchw) {
    uint32_t t = temp({nchw[0], nchw[2], nchw[3], nchw[1]});
    transpose({0, 2, 3, 1}, id, t);
    return t;
  }

  static std::vector<float> floats_of(const std::vector<std::byte>& bytes) {
    std::vector<float> f(bytes.size() / sizeof(float));
    std::memcpy(f.data(), bytes.data(), f.size() * sizeof(float));
    return f;
  }

  void lower_convolution(const graph::Node& n, const std::vector<Argument>& args, graph::ValueId out) {
    graph::ValueId x = tensor_of(args[0], n.name), w = tensor_of(args[1], n.name);
    auto b = optional_tensor_of(args[2], n.name);
    const bool transposed = bool_of(args[6], n.name);
    const auto groups = static_cast<uint32_t>(int_of(args[8], n.name));
    Dims xd = dims(x), wd = dims(w), od = dims(out);
    const bool one_d = xd.size() == 3;
    if (one_d) {  // [N, C, L] as [N, C, 1, L]
      xd.insert(xd.begin() + 2, 1);
      wd.insert(wd.begin() + 2, 1);
      od.insert(od.begin() + 2, 1);
    }
    auto pair = [&](const Argument& a, int64_t dflt) {
      auto v = ints_of(a, n.name);
      if (v.empty()) v.push_back(dflt);
      if (one_d) v.insert(v.begin(), dflt == 0 ? 0 : 1);
      if (v.size() == 1) v.push_back(v[0]);
      return std::make_pair(static_cast<uint32_t>(v[0]), static_cast<uint32_t>(v[1]));
    };
    auto [sh, sw] = pair(args[3], 1);
    auto [ph, pw] = pair(args[4], 0);
    auto [dh, dw] = pair(args[5], 1);
    auto [ah, aw] = pair(args[7], 0);
    const uint32_t kh = wd[2], kw = wd[3];
    check(constants_.contains(w) && (!b || constants_.contains(*b)), "convolution '{}': weights are not constants",
          n.name);
    std::vector<float> src = floats_of(collect(*constants_.at(w)));
    std::vector<float> filter(src.size());
    uint32_t oc, icg, ocg;
    if (!transposed) {  // [OC, ICg, kh, kw] -> [OC, kh, kw, ICg]
      oc = wd[0];
      icg = wd[1];
      ocg = oc / groups;
      for (uint32_t o = 0; o < oc; ++o)
        for (uint32_t i = 0; i < icg; ++i)
          for (uint32_t y = 0; y < kh; ++y)
            for (uint32_t z = 0; z < kw; ++z)
              filter[((size_t{o} * kh + y) * kw + z) * icg + i] = src[((size_t{o} * icg + i) * kh + y) * kw + z];
    } else {  // [IC, OCg, kh, kw] -> [G * OCg, kh, kw, ICg]
      icg = wd[0] / groups;
      ocg = wd[1];
      oc = ocg * groups;
      for (uint32_t gi = 0; gi < groups; ++gi)
        for (uint32_t i = 0; i < icg; ++i)
          for (uint32_t o = 0; o < ocg; ++o)
            for (uint32_t y = 0; y < kh; ++y)
              for (uint32_t z = 0; z < kw; ++z)
                filter[(((size_t{gi} * ocg + o) * kh + y) * kw + z) * icg + i] =
                    src[((((size_t{gi} * icg + i) * ocg + o) * kh + y) * kw) + z];
    }
    // depthwise (one input channel per group): XNNDepthwiseConv2d, filter [1, kh, kw, OC]
    const bool depthwise = !transposed && icg == 1 && groups > 1;
    if (depthwise) {
      for (uint32_t o = 0; o < oc; ++o)
        for (uint32_t y = 0; y < kh; ++y)
          for (uint32_t z = 0; z < kw; ++z) filter[(size_t{y} * kw + z) * oc + o] = src[(size_t{o} * kh + y) * kw + z];
    }
    uint32_t filter_id = depthwise ? made_constant(filter, {1, kh, kw, oc}) : made_constant(filter, {oc, kh, kw, icg});
    std::vector<float> bias = b ? floats_of(collect(*constants_.at(*b))) : std::vector<float>(oc, 0.0f);
    uint32_t bias_id = made_constant(bias, {oc});
    uint32_t xi = read(x);
    if (one_d) {
      uint32_t r = temp(xd);
      reshape(xd, xi, r);
      xi = r;
    }
    uint32_t t1 = to_nhwc(xi, xd);
    uint32_t t2 = temp({od[0], od[2], od[3], od[1]});
    add_node(transposed ? XType::XNNConvTranspose2d : depthwise ? XType::XNNDepthwiseConv2d : XType::XNNConv2d,
             fbx::Create_XNNNodeConv(fb_, ph, pw, ph, pw, kh, kw, sh, sw, dh, dw, icg, ocg, groups, ah, aw, t1,
                                     filter_id, bias_id, t2, 0)
                 .Union());
    if (!one_d) {
      transpose({0, 3, 1, 2}, t2, write(out));
      return;
    }
    uint32_t t3 = temp(od);
    transpose({0, 3, 1, 2}, t2, t3);
    reshape(dims(out), t3, write(out));
  }

  void lower_pooling(const graph::Node& n, const std::vector<Argument>& args, const std::vector<graph::ValueId>& outs) {
    const bool max = n.target == "aten.max_pool2d_with_indices.default";
    if (max)
      check(outs.size() < 2 || !used(outs[1]), "max pooling '{}': its indices are read, XNNPACK does not compute them",
            n.name);
    graph::ValueId x = tensor_of(args[0], n.name);
    Dims xd = dims(x), od = dims(outs[0]);
    auto pair = [&](const Argument& a, std::pair<uint32_t, uint32_t> dflt) {
      auto v = ints_of(a, n.name);
      if (v.empty()) return dflt;
      return std::make_pair(static_cast<uint32_t>(v[0]), static_cast<uint32_t>(v[v.size() - 1]));
    };
    auto [kh, kw] = pair(args[1], {1, 1});
    auto [sh, sw] = pair(args[2], {kh, kw});
    auto [ph, pw] = pair(args[3], {0, 0});
    auto [dh, dw] = max ? pair(args[4], {1, 1}) : std::make_pair(1u, 1u);
    // ceil_mode (max pooling): extra bottom/right padding (-inf) until the last window fits
    auto extra = [](uint32_t out, uint32_t in, uint32_t k, uint32_t s, uint32_t p, uint32_t d) {
      const int64_t need = (int64_t{out} - 1) * s + int64_t{d} * (k - 1) + 1 - (int64_t{in} + 2 * int64_t{p});
      return static_cast<uint32_t>(std::max<int64_t>(0, need));
    };
    const uint32_t pb = ph + extra(od[2], xd[2], kh, sh, ph, dh), pr = pw + extra(od[3], xd[3], kw, sw, pw, dw);
    uint32_t t1 = to_nhwc(read(x), xd);
    uint32_t t2 = temp({od[0], od[2], od[3], od[1]});
    add_node(max ? XType::XNNMaxPooling2d : XType::XNNAvgPooling2d,
             fbx::Create_XNNPooling2D(fb_, ph, pr, pb, pw, kh, kw, sh, sw, dh, dw, t1, t2, 0).Union());
    transpose({0, 3, 1, 2}, t2, write(outs[0]));
  }

  void lower_binary(const graph::Node& n, XType type, const std::vector<Argument>& args, graph::ValueId out) {
    bool scalar_overload = n.target.ends_with(".Scalar");
    double alpha = args.size() > 2 ? *scalar_of(args[2]) : 1.0;
    uint32_t a = read(tensor_of(args[0], n.name));
    uint32_t b = 0;
    if (scalar_overload || args[1].kind != Argument::Kind::Tensor) {
      b = scalar_constant(*scalar_of(args[1]) * alpha);  // self + alpha * other, other a number
    } else {
      graph::ValueId other = tensor_of(args[1], n.name);
      b = read(other);
      if (alpha != 1) {
        uint32_t scaled = temp(dims(other));
        binary(XType::XNNMultiply, b, scalar_constant(alpha), scaled);
        b = scaled;
      }
    }
    binary(type, a, b, write(out));
  }

  void lower_pow(graph::ValueId x, double e, graph::ValueId out) {
    uint32_t xi = read(x);
    if (e == 1) return unary(XType::XNNCopy, xi, write(out));
    if (e == 2) return unary(XType::XNNSquare, xi, write(out));
    if (e == 0.5) return unary(XType::XNNSquareRoot, xi, write(out));
    if (e == -0.5) return unary(XType::XNNReciprocalSquareRoot, xi, write(out));
    if (e == -1) return binary(XType::XNNDiv, scalar_constant(1.0), xi, write(out));
    uint32_t sq = temp(dims(x));  // e == 3
    unary(XType::XNNSquare, xi, sq);
    binary(XType::XNNMultiply, sq, xi, write(out));
  }

  // elu (scale = input_scale = 1) and leaky_relu: one node each
  void lower_activation(const std::string& t, const std::vector<Argument>& args, graph::ValueId x, graph::ValueId out) {
    uint32_t xi = read(x);
    if (t == "aten.elu.default") {
      auto alpha = static_cast<float>(*scalar_of(args[1]));
      return add_node(XType::XNNELU, fbx::CreateXNNELU(fb_, alpha, xi, write(out), 0).Union());
    }
    auto slope = static_cast<float>(*scalar_of(args[1]));
    add_node(XType::XNNLeakyReLU, fbx::CreateXNNLeakyReLU(fb_, slope, xi, write(out), 0).Union());
  }

  // 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
  void lower_gelu_tanh(graph::ValueId x, graph::ValueId out) {
    Dims d = dims(x);
    uint32_t xi = read(x);
    uint32_t x2 = temp(d), x3 = temp(d), t = temp(d), u = temp(d), v = temp(d), w = temp(d), z = temp(d), p = temp(d);
    unary(XType::XNNSquare, xi, x2);
    binary(XType::XNNMultiply, x2, xi, x3);
    binary(XType::XNNMultiply, x3, scalar_constant(0.044715), t);
    binary(XType::XNNAdd, xi, t, u);
    binary(XType::XNNMultiply, u, scalar_constant(std::sqrt(2.0 / std::numbers::pi)), v);
    unary(XType::XNNTanh, v, w);
    binary(XType::XNNAdd, w, scalar_constant(1.0), z);
    binary(XType::XNNMultiply, xi, z, p);
    binary(XType::XNNMultiply, p, scalar_constant(0.5), write(out));
  }

  // out = a @ b (+ bias) with a [M,K], b [K,N]; `bias` broadcasts to [M,N].
  void lower_matmul(graph::ValueId a, graph::ValueId b, std::optional<graph::ValueId> bias, graph::ValueId out) {
    Dims od = dims(out);
    // A constant [N] bias goes into a fully connected node; anything else is added after.
    auto fusable_bias = [&]() -> std::optional<uint32_t> {
      if (!bias || !constants_.contains(*bias)) return std::nullopt;
      const auto& bs = g_.value(*bias).meta.sizes;
      if (bs.size() != 1 || bs[0] != od[1]) return std::nullopt;
      return read(*bias);
    };
    // Runs `product(into)` so that `out` ends up holding product + bias.
    auto with_added_bias = [&](auto&& product) {
      if (!bias) return product(write(out));
      uint32_t b_id = read(*bias);
      uint32_t p = temp(od);
      product(p);
      binary(XType::XNNAdd, p, b_id, write(out));
    };
    // A fully connected node on `x` with a constant filter, bias fused when it can be.
    auto fc_with_bias = [&](uint32_t x, uint32_t filter, uint32_t flags) {
      if (auto fused = fusable_bias()) return fully_connected(x, filter, *fused, write(out), flags);
      with_added_bias([&](uint32_t into) { fully_connected(x, filter, kInvalidValueId, into, flags); });
    };

    if (auto w = weight_of_transpose_.find(b); w != weight_of_transpose_.end()) {
      if (quantized_fc(a, w->second, false, out, fusable_bias, with_added_bias)) return;
      uint32_t x = read(a);  // b = W^T with W [N,K] a constant: W is the filter as is
      return fc_with_bias(x, read(w->second), 0);
    }
    if (constants_.contains(b)) {
      if (quantized_fc(a, b, true, out, fusable_bias, with_added_bias)) return;
      uint32_t x = read(a);  // b a constant [K,N]: the filter, transposed by XNNPACK when it packs it
      return fc_with_bias(x, read(b), kFlagTransposeWeights);
    }
    if (constants_.contains(a)) {
      // a @ b = (b^T @ a^T)^T: a fully connected node on b^T with a [M,K] as the filter.
      // Quantized (the tied LM head's form) when b = x^T and out^T is what is read.
      if (auto x = tied_input_.find(node_index_), q = tied_output_.find(node_index_);
          x != tied_input_.end() && q != tied_output_.end()) {
        const graph::ValueId xin = x->second, qout = q->second;
        auto no_bias = [] { return std::optional<uint32_t>{}; };
        auto into_out = [&](auto&& product) { product(write(qout)); };
        if (quantized_fc(xin, a, false, qout, no_bias, into_out)) return;
      }
      uint32_t filter = read(a);
      uint32_t bt = 0;
      if (auto x = tied_input_.find(node_index_); x != tied_input_.end()) {
        bt = read(x->second);  // b = x^T: x itself
      } else {
        Dims bd = dims(b);
        uint32_t b_id = read(b);
        bt = temp({bd[1], bd[0]});
        transpose({1, 0}, b_id, bt);
      }
      if (auto q = tied_output_.find(node_index_); q != tied_output_.end()) {
        // out^T is what the permute_copy reading out computes: write that directly.
        return fully_connected(bt, filter, kInvalidValueId, write(q->second), 0);
      }
      return with_added_bias([&](uint32_t into) {
        uint32_t yt = temp({od[1], od[0]});
        fully_connected(bt, filter, kInvalidValueId, yt, 0);
        transpose({1, 0}, yt, into);
      });
    }
    uint32_t x = read(a), y = read(b);
    with_added_bias([&](uint32_t into) { binary(XType::XNNBatchMatrixMultiply, x, y, into); });
  }

  // a @ W as ExecuTorch's dynamically quantized fully connected (PayloadOptions):
  // XNNConvert of a to int8 rows (qdint8, one set of parameters per row), then
  // a fully connected node on W quantized now (qbint4 with bf16 group scales, or
  // qcint8 with fp32 channel scales, both named data). W is [N, K] (or [K, N]
  // when kn). False, emitting nothing, when the scheme does not apply.
  template <class FusableBias, class WithAddedBias>
  bool quantized_fc(graph::ValueId a, graph::ValueId wv, bool kn, graph::ValueId out, const FusableBias& fusable_bias,
                    const WithAddedBias& with_added_bias) {
    using Kind = QuantScheme::Kind;
    if (!constants_.contains(wv)) return false;
    const RegionConstant& wc = *constants_.at(wv);
    // A weight the .pt2 holds quantized (torchao's quantize_ before export): its own form, whatever --quantize says.
    QuantScheme q = opts_.quantize;
    if (wc.quantized) {
      check(!kn, "internal: a quantized weight reached its fully connected node transposed");
      q.kind = wc.quantized->bits == 4 ? Kind::Int4Groups : Kind::Int8Channels;
      q.group = wc.quantized->group;
    }
    if (q.kind == Kind::None) return false;
    const auto& meta = g_.value(wv).meta;
    if (meta.sizes.size() != 2 || meta.dtype != ScalarType::Float) return false;
    const int64_t n = kn ? meta.sizes[1] : meta.sizes[0], k = kn ? meta.sizes[0] : meta.sizes[1];
    const graph::Node& product = node(node_index_);
    if (!wc.quantized && opts_.keep_fp32 && opts_.keep_fp32(product, wv)) {
      ++stats_.kept_fp32_nodes;
      return false;
    }
    check(q.kind != Kind::Int4Groups || k % q.group == 0,
          "--quantize {}: linear layer '{}'{} has {} input features, not a multiple of the group size {} (a smaller "
          "group, or --quantize-skip to keep it fp32)",
          q.name(), product.module_path.empty() ? product.name : product.module_path,
          product.module_path.empty() ? "" : fmt::format(" (node {})", product.name), k, q.group);
    QuantizedWeights qw;
    if (wc.quantized) {
      qw.data = wc.quantized->data;
      qw.scales = wc.quantized->scales;
      ++stats_.prequantized_nodes;
      const int64_t bits = wc.quantized->bits, group = wc.quantized->group;
      if (stats_.prequantized_bits == 0) stats_.prequantized_bits = bits, stats_.prequantized_group = group;
      if (stats_.prequantized_bits != bits) stats_.prequantized_bits = -1;
      if (stats_.prequantized_group != group) stats_.prequantized_group = -1;
    } else {
      qw = kn ? quantize_transposed(wc, n, k, q) : quantize_streamed(wc, n, k, q);
    }
    const std::string scales_key = content_key(qw.scales), data_key = content_key(qw.data);
    const uint32_t scales_index = named_constant(scales_key, pte::DataBlob::from_bytes(std::move(qw.scales)));
    const uint32_t data_index = named_constant(data_key, pte::DataBlob::from_bytes(std::move(qw.data)));
    flatbuffers::Offset<void> params;
    fbx::XNNQuantParams ptype;
    fbx::XNNDatatype dtype;
    if (q.kind == Kind::Int4Groups) {
      fbx::PerChannelGroupQuantBuilder pb(fb_);
      pb.add_channel_dim(0);
      pb.add_group_size(static_cast<int32_t>(q.group));
      pb.add_scale_buffer_idx(scales_index);
      pb.add_num_scales(static_cast<uint32_t>(n * (k / q.group)));
      params = pb.Finish().Union();
      ptype = fbx::XNNQuantParams::PerChannelGroupQuant;
      dtype = fbx::XNNDatatype::xnn_datatype_qbint4;
    } else {
      fbx::PerChannelQuantBuilder pb(fb_);
      pb.add_channel_dim(0);
      pb.add_scale_buffer_idx(scales_index);
      pb.add_num_scales(static_cast<uint32_t>(n));
      params = pb.Finish().Union();
      ptype = fbx::XNNQuantParams::PerChannelQuant;
      dtype = fbx::XNNDatatype::xnn_datatype_qcint8;
    }
    const uint32_t filter = add_quantized_value({static_cast<uint32_t>(n), static_cast<uint32_t>(k)}, dtype, ptype, params, data_index);
    const uint32_t x = read(a);
    const uint32_t xq = add_quantized_value(dims(a), fbx::XNNDatatype::xnn_datatype_qdint8,
                                            fbx::XNNQuantParams::PerTokenDynamicQuant,
                                            fbx::CreatePerTokenDynamicQuant(fb_, 1).Union(), 0);
    unary(XType::XNNConvert, x, xq);
    if (auto fused = fusable_bias()) fully_connected(xq, filter, *fused, write(out), 0);
    else with_added_bias([&](uint32_t into) { fully_connected(xq, filter, kInvalidValueId, into, 0); });
    ++stats_.quantized_nodes;
    return true;
  }

  uint32_t add_quantized_value(const Dims& d, fbx::XNNDatatype dtype, fbx::XNNQuantParams ptype,
                               flatbuffers::Offset<void> params, uint32_t constant_index) {
    auto id = static_cast<uint32_t>(xvalues_.size());
    auto dims_vec = fb_.CreateVector(d);
    auto tv = fbx::CreateXNNTensorValue(fb_, dtype, static_cast<uint32_t>(d.size()), dims_vec, constant_index,
                                        kInvalidValueId, 0, id);
    auto qv = fbx::CreateXNNQuantizedTensorValue(fb_, tv, ptype, params);
    xvalues_.push_back(fbx::CreateXValue(fb_, fbx::XValueUnion::XNNQuantizedTensorValue, qv.Union()));
    return id;
  }

  // out = sum (or mean) of x over its last `count` dims, shaped as out.
  // A fully connected node against a [1, K] row of ones (or 1/K).
  uint32_t reduce_rows(uint32_t x, const Dims& xd, size_t count, bool mean, std::optional<uint32_t> into = {}) {
    size_t lead = xd.size() - count;
    uint64_t k = product(xd, lead);
    check(k <= (uint64_t{1} << 28), "reduction over {} elements is too large for a constant row", k);
    Dims rows(xd.begin(), xd.begin() + static_cast<std::ptrdiff_t>(lead));
    rows.push_back(static_cast<uint32_t>(k));
    uint32_t flat = x;
    if (count != 1) {
      flat = temp(rows);
      reshape(rows, x, flat);
    }
    Dims reduced = rows;
    reduced.back() = 1;
    uint32_t filter = made_constant(std::vector<float>(k, mean ? 1.0f / static_cast<float>(k) : 1.0f),
                                    {1, static_cast<uint32_t>(k)});
    uint32_t r = into ? *into : temp(reduced);
    fully_connected(flat, filter, kInvalidValueId, r, 0);
    return r;
  }

  void reduce_trailing(graph::ValueId x, size_t count, bool mean, graph::ValueId out) {
    Dims xd = dims(x);
    Dims rows(xd.begin(), xd.end() - static_cast<std::ptrdiff_t>(count));
    rows.push_back(1);
    uint32_t xi = read(x);
    if (rows == dims(out)) {
      reduce_rows(xi, xd, count, mean, write(out));
      return;
    }
    uint32_t r = reduce_rows(xi, xd, count, mean);
    reshape(dims(out), r, write(out));
  }

  void lower_layer_norm(const graph::Node& n, const std::vector<Argument>& args) {
    graph::ValueId x = tensor_of(args[0], n.name);
    size_t count = ints_of(args[1], n.name).size();
    auto weight = optional_tensor_of(args[2], n.name), bias = optional_tensor_of(args[3], n.name);
    double eps = *scalar_of(args[4]);
    auto out_y = output_at(n, 0), out_mean = output_at(n, 1), out_rstd = output_at(n, 2);
    auto wanted = [&](std::optional<graph::ValueId> v) { return v && used(*v); };
    Dims xd = dims(x);
    size_t lead = xd.size() - count;
    auto k = static_cast<uint32_t>(product(xd, lead));
    Dims rows(xd.begin(), xd.begin() + static_cast<std::ptrdiff_t>(lead));
    rows.push_back(k);
    Dims stat = rows;
    stat.back() = 1;

    uint32_t xi = read(x);
    uint32_t flat = xi;
    if (count != 1) {
      flat = temp(rows);
      reshape(rows, xi, flat);
    }
    // A statistic output: written directly when shaped [lead..., 1], else reshaped after.
    auto direct = [&](std::optional<graph::ValueId> v) -> std::optional<uint32_t> {
      if (wanted(v) && dims(*v) == stat) return write(*v);
      return std::nullopt;
    };
    auto finish_stat = [&](std::optional<graph::ValueId> v, uint32_t id, std::optional<uint32_t> was_direct) {
      if (wanted(v) && !was_direct) reshape(dims(*v), id, write(*v));
    };
    auto mean_direct = direct(out_mean);
    uint32_t mean = reduce_rows(flat, rows, 1, true, mean_direct);
    finish_stat(out_mean, mean, mean_direct);
    if (!wanted(out_y) && !wanted(out_rstd)) return;

    uint32_t centered = temp(rows), squares = temp(rows), var = temp(stat), shifted = temp(stat);
    binary(XType::XNNSubtract, flat, mean, centered);
    unary(XType::XNNSquare, centered, squares);
    reduce_rows(squares, rows, 1, true, var);
    binary(XType::XNNAdd, var, scalar_constant(eps), shifted);
    auto rstd_direct = direct(out_rstd);
    uint32_t rstd = rstd_direct ? *rstd_direct : temp(stat);
    unary(XType::XNNReciprocalSquareRoot, shifted, rstd);
    finish_stat(out_rstd, rstd, rstd_direct);
    if (!wanted(out_y)) return;

    // y = centered * rstd (* weight) (+ bias), in [lead..., K], reshaped back when K spans several dims.
    bool reshaped = count != 1;
    auto step_target = [&](bool last) { return last && !reshaped ? write(*out_y) : temp(rows); };
    uint32_t y = step_target(!weight && !bias);
    binary(XType::XNNMultiply, centered, rstd, y);
    if (weight) {
      uint32_t next = step_target(!bias);
      binary(XType::XNNMultiply, y, read_reshaped(*weight, {k}), next);
      y = next;
    }
    if (bias) {
      uint32_t next = step_target(true);
      binary(XType::XNNAdd, y, read_reshaped(*bias, {k}), next);
      y = next;
    }
    if (reshaped) reshape(xd, y, write(*out_y));
  }

  // Broadcast x to out's shape: x + zeros, the zeros shaped [.., out[d] where
  // x broadcasts along d, 1 elsewhere]; a reshape when nothing broadcasts.
  void lower_expand(graph::ValueId x, graph::ValueId out) {
    Dims xd = dims(x), od = dims(out);
    const auto& xs = g_.value(x).meta.sizes;
    Dims zero_shape(od.size(), 1);
    bool expands = false;
    for (size_t i = 0; i < od.size(); ++i) {
      size_t from_end = od.size() - 1 - i;
      int64_t in_size = from_end < xs.size() ? xs[xs.size() - 1 - from_end] : 1;
      if (in_size == 1 && od[i] != 1) {
        zero_shape[i] = od[i];
        expands = true;
      }
    }
    uint32_t xi = read(x);
    if (!expands) return reshape_or_copy(xd, od, xi, write(out));
    uint32_t zeros = made_constant(std::vector<float>(product(zero_shape), 0.0f), zero_shape);
    binary(XType::XNNAdd, xi, zeros, write(out));
  }

  // ---- the payload ------------------------------------------------------------
  Payload finish() {
    auto version = fb_.CreateString("0");
    auto nodes = fb_.CreateVector(xnodes_);
    auto values = fb_.CreateVector(xvalues_);
    auto inputs = fb_.CreateVector(input_ids_);
    auto outputs = fb_.CreateVector(output_ids_);
    auto constants = fb_.CreateVector(constant_data_);
    auto root = fbx::CreateXNNGraph(fb_, version, nodes, values,
                                    static_cast<uint32_t>(r_.inputs.size() + r_.outputs.size()), inputs, outputs,
                                    constants);
    fbx::FinishXNNGraphBuffer(fb_, root);

    uint64_t header_size = align_up(kHeaderLength, kPayloadAlignment);
    uint64_t fb_size = fb_.GetSize();
    uint64_t constants_offset = header_size + align_up(fb_size, kPayloadAlignment);
    check(constants_offset <= UINT32_MAX, "XNNPACK graph of {} bytes is too large", fb_size);
    Payload p;
    p.bytes.assign(constants_offset, std::byte{0});
    std::memcpy(p.bytes.data() + 4, kHeaderMagic, 4);
    put_le(p.bytes, 8, kHeaderLength, 2);
    put_le(p.bytes, 10, header_size, 4);
    put_le(p.bytes, 14, fb_size, 4);
    put_le(p.bytes, 18, constants_offset, 4);
    put_le(p.bytes, 22, 0, 8);  // no constant data in the payload: constants are named data
    std::memcpy(p.bytes.data() + header_size, fb_.GetBufferPointer(), fb_size);
    p.named_data = std::move(named_out_);
    stats_.xnodes = static_cast<int64_t>(xnodes_.size());
    stats_.xvalues = static_cast<int64_t>(xvalues_.size());
    p.stats = stats_;
    return p;
  }

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
  std::set<graph::ValueId> available_;
  int32_t node_index_ = 0;
  PayloadStats stats_;
  PayloadOptions opts_;
};

}  // namespace

Payload build_payload(const graph::Graph& graph, const Region& region, const PayloadOptions& options) {
  return PayloadBuilder(graph, region, options).build();
}

namespace {

const fbx::XNNGraph* payload_graph(const Payload& p) {
  uint32_t fb_off = 0;
  check(p.bytes.size() >= 30, "internal: payload too short");
  std::memcpy(&fb_off, p.bytes.data() + 10, 4);  // little-endian hosts only (as the writer)
  return fbx::GetXNNGraph(p.bytes.data() + fb_off);
}

// The dims of value `id` in a payload's graph (nullopt if the graph has no such value).
std::optional<std::vector<int64_t>> value_dims(const fbx::XNNGraph* g, uint32_t id) {
  if (!g->xvalues()) return std::nullopt;
  for (const fbx::XValue* v : *g->xvalues()) {
    const fbx::XNNTensorValue* t = v->xvalue_union_as_XNNTensorValue();
    if (!t)
      if (const auto* q = v->xvalue_union_as_XNNQuantizedTensorValue()) t = q->tensor_value();
    if (!t || t->id_out() != id) continue;
    std::vector<int64_t> d;
    if (t->dims()) d.assign(t->dims()->begin(), t->dims()->end());
    return d;
  }
  return std::nullopt;
}

template <class V>
bool same_vector(const V* a, const V* b) {
  if (!a || !b) return a == b;
  return a->size() == b->size() && std::equal(a->begin(), a->end(), b->begin());
}

}  // namespace

std::vector<int32_t> make_sizes_inferred(Payload& at_bounds, const Payload& elsewhere) {
  const fbx::XNNGraph* a = payload_graph(at_bounds);
  const fbx::XNNGraph* b = payload_graph(elsewhere);
  std::set<int32_t> bad;
  const auto* an = a->xnodes();
  const auto* bn = b->xnodes();
  const size_t na = an ? an->size() : 0, nb = bn ? bn->size() : 0;
  // Constants must not depend on the sizes. When one does (a constant the builder sized from a
  // symbolic dim), which node reads it is not traced here: the region's nodes all stay portable.
  std::map<uint32_t, std::vector<int64_t>> const_dims_a, const_dims_b;
  auto collect = [](const fbx::XNNGraph* g, std::map<uint32_t, std::vector<int64_t>>& out) {
    if (!g->xvalues()) return;
    for (const fbx::XValue* v : *g->xvalues()) {
      const fbx::XNNTensorValue* t = v->xvalue_union_as_XNNTensorValue();
      if (!t)
        if (const auto* q = v->xvalue_union_as_XNNQuantizedTensorValue()) t = q->tensor_value();
      if (!t || t->constant_buffer_idx() == 0) continue;
      std::vector<int64_t> d;
      if (t->dims()) d.assign(t->dims()->begin(), t->dims()->end());
      out[t->id_out()] = std::move(d);
    }
  };
  collect(a, const_dims_a);
  collect(b, const_dims_b);
  const bool constants_differ = const_dims_a != const_dims_b;
  for (size_t i = 0; i < std::min(na, nb); ++i) {
    const fbx::XNode* x = an->Get(static_cast<flatbuffers::uoffset_t>(i));
    const fbx::XNode* y = bn->Get(static_cast<flatbuffers::uoffset_t>(i));
    const auto handle = static_cast<int32_t>(x->debug_handle());
    if (x->xnode_union_type() != y->xnode_union_type() || x->debug_handle() != y->debug_handle()) {
      bad.insert(handle);
      break;  // the two payloads no longer line up
    }
    if (constants_differ) bad.insert(handle);
    switch (x->xnode_union_type()) {
      case XType::XNNStaticReshape: {
        const auto* p = x->xnode_union_as_XNNStaticReshape();
        const auto* q = y->xnode_union_as_XNNStaticReshape();
        if (!p->new_shape() || !q->new_shape() || p->new_shape()->size() != q->new_shape()->size()) {
          bad.insert(handle);
          break;
        }
        std::vector<uint32_t> differ;
        for (uint32_t k = 0; k < p->new_shape()->size(); ++k)
          if (p->new_shape()->Get(k) != q->new_shape()->Get(k)) differ.push_back(k);
        if (differ.size() > 1) {
          bad.insert(handle);
        } else if (differ.size() == 1) {  // the one size XNNPACK infers per call
          const auto* at = p->new_shape()->Data() + differ[0] * sizeof(uint32_t);
          const auto offset = static_cast<size_t>(at - reinterpret_cast<const uint8_t*>(at_bounds.bytes.data()));
          std::memset(at_bounds.bytes.data() + offset, 0, sizeof(uint32_t));
        }
        break;
      }
      case XType::XNNStaticSlice: {
        // A size that differs is allowed where the slice takes all of a dim that changes: it becomes
        // 0, "to the end" (XNNPACK's reshape of a slice, kiln's runtime).
        const auto *p = x->xnode_union_as_XNNStaticSlice(), *q = y->xnode_union_as_XNNStaticSlice();
        if (!same_vector(p->offsets(), q->offsets()) || !p->sizes() || !q->sizes() ||
            p->sizes()->size() != q->sizes()->size()) {
          bad.insert(handle);
          break;
        }
        const std::optional<std::vector<int64_t>> in_a = value_dims(a, p->input_id()), in_b = value_dims(b, q->input_id());
        for (uint32_t k = 0; k < p->sizes()->size(); ++k) {
          if (p->sizes()->Get(k) == q->sizes()->Get(k)) continue;
          const bool whole = in_a && in_b && k < in_a->size() && k < in_b->size() && p->offsets()->Get(k) == 0 &&
                             static_cast<int64_t>(p->sizes()->Get(k)) == (*in_a)[k] &&
                             static_cast<int64_t>(q->sizes()->Get(k)) == (*in_b)[k];
          if (!whole) {
            bad.insert(handle);
            break;
          }
          const auto* at = p->sizes()->Data() + k * sizeof(uint32_t);
          std::memset(at_bounds.bytes.data() + (at - reinterpret_cast<const uint8_t*>(at_bounds.bytes.data())), 0,
                      sizeof(uint32_t));
        }
        break;
      }
      case XType::XNNStaticTranspose:
        if (!same_vector(x->xnode_union_as_XNNStaticTranspose()->perm(), y->xnode_union_as_XNNStaticTranspose()->perm()))
          bad.insert(handle);
        break;
      case XType::XNNStaticConstantPad: {
        const auto *p = x->xnode_union_as_XNNStaticConstantPad(), *q = y->xnode_union_as_XNNStaticConstantPad();
        if (!same_vector(p->pre_paddings(), q->pre_paddings()) || !same_vector(p->post_paddings(), q->post_paddings()))
          bad.insert(handle);
        break;
      }
      case XType::XNNConcatenate2: case XType::XNNConcatenate3: case XType::XNNConcatenate4:
      case XType::XNNConcatenate5:
        if (static_cast<const fbx::_XNNCat*>(x->xnode_union())->axis() != static_cast<const fbx::_XNNCat*>(y->xnode_union())->axis())
          bad.insert(handle);
        break;
      case XType::XNNFullyConnected: case XType::XNNBatchMatrixMultiply: case XType::XNNAdd: case XType::XNNSubtract:
      case XType::XNNMultiply: case XType::XNNDiv: case XType::XNNMinimum: case XType::XNNMaximum:
      case XType::XNNSoftmax: case XType::XNNSigmoid: case XType::XNNClamp: case XType::XNNSquare:
      case XType::XNNSquareRoot: case XType::XNNNegate: case XType::XNNAbs: case XType::XNNFloor:
      case XType::XNNCeiling: case XType::XNNHardswish: case XType::XNNReciprocalSquareRoot: case XType::XNNGelu:
      case XType::XNNTanh: case XType::XNNExp: case XType::XNNLog: case XType::XNNSin: case XType::XNNCos:
      case XType::XNNCopy: case XType::XNNConvert: case XType::XNNELU: case XType::XNNLeakyReLU:
        break;  // sizes follow their inputs' (XNNPACK's reshape, kiln's runtime)
      default:
        bad.insert(handle);  // convolutions, pooling, resizing: static sizes only
        break;
    }
  }
  if (na != nb && na > 0) bad.insert(static_cast<int32_t>(an->Get(static_cast<flatbuffers::uoffset_t>(std::min(na, nb) == na ? na - 1 : std::min(na, nb)))->debug_handle()));
  return {bad.begin(), bad.end()};
}

size_t add_named_data(pte::Program& program, const std::vector<pte::NamedBlob>& blobs) {
  size_t added = 0;
  for (const auto& blob : blobs) {
    auto it = std::find_if(program.named_data.begin(), program.named_data.end(),
                           [&](const pte::NamedBlob& n) { return n.key == blob.key; });
    if (it != program.named_data.end()) {
      check(it->data.size == blob.data.size, "named data key '{}' holds {} bytes; another payload gives {}", blob.key,
            it->data.size, blob.data.size);
      continue;
    }
    program.named_data.push_back(blob);
    ++added;
  }
  return added;
}

int32_t add_delegate(pte::Program& program, size_t plan, Payload payload) {
  check(plan < program.plans.size(), "program has no plan {}", plan);
  add_named_data(program, payload.named_data);
  auto payload_index = static_cast<uint32_t>(program.delegate_payloads.size());
  program.delegate_payloads.push_back(pte::DataBlob::from_bytes(std::move(payload.bytes)));
  auto& delegates = program.plans[plan].delegates;
  delegates.push_back({std::string(kBackendId), payload_index, {}});
  return static_cast<int32_t>(delegates.size() - 1);
}

}  // namespace kiln::backends::xnnpack
