// The payload builder's frame (payload_builder.h): the region (who reads and
// writes what, nodes folded into their readers), values and constants, the
// framed payload.
#include "payload_builder.h"

#include "kiln/backends/xnnpack/support.h"

#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <set>
#include <span>

namespace kiln::backends::xnnpack::detail {

namespace {

std::vector<std::byte> float_bytes(const std::vector<float>& v) {
  std::vector<std::byte> b(v.size() * sizeof(float));
  if (!b.empty()) std::memcpy(b.data(), v.data(), b.size());
  return b;
}

void put_le(std::vector<std::byte>& out, size_t at, uint64_t v, size_t n) {
  for (size_t i = 0; i < n; ++i) out[at + i] = static_cast<std::byte>((v >> (8 * i)) & 0xFF);
}

}  // namespace

std::string content_key(const std::vector<std::byte>& bytes) {
  XXH128_hash_t h = XXH3_128bits_withSeed(bytes.data(), bytes.size(), bytes.size());
  return fmt::format("xnnpack/const/{:016x}{:016x}", h.high64, h.low64);
}

Payload PayloadBuilder::build() {
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

void PayloadBuilder::index_region() {
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

void PayloadBuilder::validate_region() {
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
  // (once per region over the whole graph: no allocation per read, the message only on failure)
  auto read_outside = [&](graph::ValueId v, const graph::Node* by) {
    if (producer_.contains(v) && !outputs.contains(v))
      fail("value '{}' computed in the region is read by {} outside it but is not a region output", name(v),
           by ? fmt::format("node '{}'", by->name) : std::string("the graph output"));
  };
  for (size_t i = 0; i < g_.nodes.size(); ++i) {
    if (in_region_.contains(static_cast<int32_t>(i))) continue;
    for (const auto& in : g_.nodes[i].inputs)
      in.arg.for_each_tensor_id([&](graph::ValueId v) { read_outside(v, &g_.nodes[i]); });
  }
  for (const auto& out : g_.outputs) out.for_each_tensor_id([&](graph::ValueId v) { read_outside(v, nullptr); });
}

void PayloadBuilder::check_boundary_tensor(graph::ValueId v, std::string_view role) {
  const auto& m = g_.value(v).meta;
  check(m.dtype == ScalarType::Float, "region {} '{}' is {}, not float32", role, name(v), dtype_name(m.dtype));
  check(!m.sizes.empty() && m.sizes.size() <= kMaxDims, "region {} '{}' has rank {}; XNNPACK takes 1 to {}", role,
        name(v), m.sizes.size(), kMaxDims);
}

const graph::Node* PayloadBuilder::producer_node(graph::ValueId v) const {
  auto it = producer_.find(v);
  return it == producer_.end() ? nullptr : &node(it->second);
}

graph::ValueId PayloadBuilder::view_root(graph::ValueId v) const {
  for (int hops = 0; hops < 64; ++hops) {
    const graph::Node* p = producer_node(v);
    if (!p || (p->target != "aten.view_copy.default" && p->target != "aten.unsqueeze_copy.default" &&
               p->target != "aten.squeeze_copy.dims" && p->target != "aten.alias_copy.default"))
      return v;
    const std::vector<graph::ValueId> in = reads_of(*p);
    if (in.empty() || product(dims(in[0])) != product(dims(v))) return v;
    v = in[0];
  }
  return v;
}

std::optional<graph::ValueId> PayloadBuilder::transpose_input(graph::ValueId v) const {
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

void PayloadBuilder::plan_absorptions() {
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

uint32_t PayloadBuilder::add_value(const Dims& d, uint32_t constant_index, uint32_t external_id, uint32_t flags) {
  auto id = static_cast<uint32_t>(xvalues_.size());
  auto dims_vec = fb_.CreateVector(d);
  auto tv = fbx::CreateXNNTensorValue(fb_, fbx::XNNDatatype::xnn_datatype_fp32, static_cast<uint32_t>(d.size()),
                                      dims_vec, constant_index, external_id, flags, id);
  xvalues_.push_back(fbx::CreateXValue(fb_, fbx::XValueUnion::XNNTensorValue, tv.Union()));
  return id;
}

void PayloadBuilder::define_externals() {
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

uint32_t PayloadBuilder::constant_value(graph::ValueId v, const Dims& d) {
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

std::vector<std::byte> PayloadBuilder::collect(const RegionConstant& c) {
  std::vector<std::byte> bytes;
  bytes.reserve(c.data.size);
  if (c.data.write)
    c.data.write([&](std::span<const std::byte> s) { bytes.insert(bytes.end(), s.begin(), s.end()); });
  check(bytes.size() == c.data.size, "constant data streamed {} bytes, declared {}", bytes.size(), c.data.size);
  return bytes;
}

QuantizedWeights PayloadBuilder::quantize_transposed(const RegionConstant& c, int64_t n, int64_t k, const QuantScheme& q) {
  std::vector<std::byte> raw = collect(c);
  std::vector<float> w(static_cast<size_t>(n * k));
  const auto* src = reinterpret_cast<const float*>(raw.data());
  for (int64_t j = 0; j < n; ++j)
    for (int64_t i = 0; i < k; ++i) w[static_cast<size_t>(j * k + i)] = src[i * n + j];
  return quantize_weights(w.data(), n, k, q);
}

QuantizedWeights PayloadBuilder::quantize_streamed(const RegionConstant& c, int64_t n, int64_t k, const QuantScheme& q) {
  const size_t row_bytes = static_cast<size_t>(k) * sizeof(float);
  // blocks of ~4 MB of fp32 rows, quantized on worker threads while the next block streams in
  StreamingQuantizer sq(n, k, q, std::max<int64_t>(1, lower_block_bytes(int64_t{4} << 20) / static_cast<int64_t>(row_bytes)));
  const size_t block_bytes = static_cast<size_t>(sq.block_rows()) * row_bytes;
  std::byte* block = nullptr;
  size_t filled = 0;
  int64_t rows_done = 0;
  auto flush = [&](int64_t rows) {
    check(rows_done + rows <= n, "constant data streamed more than its {} rows", n);
    sq.submit(rows);
    block = nullptr;
    rows_done += rows;
  };
  if (c.data.write)
    c.data.write([&](std::span<const std::byte> s) {
      while (!s.empty()) {
        if (!block) block = reinterpret_cast<std::byte*>(sq.block());
        const size_t take = std::min(s.size(), block_bytes - filled);
        std::memcpy(block + filled, s.data(), take);
        filled += take;
        s = s.subspan(take);
        if (filled == block_bytes) {
          flush(sq.block_rows());
          filled = 0;
        }
      }
    });
  check(filled % row_bytes == 0, "constant data streamed a partial row");
  if (filled) flush(static_cast<int64_t>(filled / row_bytes));
  check(rows_done == n, "constant data streamed {} rows, declared {}", rows_done, n);
  return sq.finish();
}

uint32_t PayloadBuilder::named_constant(const std::string& key, const pte::DataBlob& data) {
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

uint32_t PayloadBuilder::made_constant(const std::vector<float>& values, const Dims& d) {
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

uint32_t PayloadBuilder::read_as(graph::ValueId v, const Dims& d) {
  if (constants_.contains(v)) return constant_value(v, d);
  const graph::Node& n = node(node_index_);
  check(available_.contains(v),
        "node '{}' reads '{}', which is not a region input, a region constant, or computed earlier in the region",
        n.name, name(v));
  check(d == dims(v), "internal: '{}' read with another shape", name(v));
  return ids_.at(v);
}

uint32_t PayloadBuilder::read_reshaped(graph::ValueId v, const Dims& d) {
  if (constants_.contains(v) || dims(v) == d) return read_as(v, d);
  uint32_t r = temp(d);
  reshape(d, read(v), r);
  return r;
}

uint32_t PayloadBuilder::write(graph::ValueId v) {
  check(!available_.contains(v) && !constants_.contains(v), "value '{}' is written twice", name(v));
  available_.insert(v);
  if (auto it = ids_.find(v); it != ids_.end()) return it->second;  // a region output
  uint32_t id = temp(dims(v));
  ids_[v] = id;
  return id;
}

uint32_t PayloadBuilder::add_quantized_value(const Dims& d, fbx::XNNDatatype dtype, fbx::XNNQuantParams ptype,
                             flatbuffers::Offset<void> params, uint32_t constant_index) {
  auto id = static_cast<uint32_t>(xvalues_.size());
  auto dims_vec = fb_.CreateVector(d);
  auto tv = fbx::CreateXNNTensorValue(fb_, dtype, static_cast<uint32_t>(d.size()), dims_vec, constant_index,
                                      kInvalidValueId, 0, id);
  auto qv = fbx::CreateXNNQuantizedTensorValue(fb_, tv, ptype, params);
  xvalues_.push_back(fbx::CreateXValue(fb_, fbx::XValueUnion::XNNQuantizedTensorValue, qv.Union()));
  return id;
}

Payload PayloadBuilder::finish() {
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

}  // namespace kiln::backends::xnnpack::detail
