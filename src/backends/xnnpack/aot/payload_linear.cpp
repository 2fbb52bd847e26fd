// The payload builder's products (payload_builder.h): fully connected nodes
// (fp32 or dynamically quantized), batch matrix products, reductions as
// products against a constant row, layer norm.
#include "payload_builder.h"

#include "kiln/backends/xnnpack/quantize.h"

#include <optional>

namespace kiln::backends::xnnpack::detail {

template <class FusableBias, class WithAddedBias>
bool PayloadBuilder::quantized_fc(graph::ValueId a, graph::ValueId wv, bool kn, graph::ValueId out, const FusableBias& fusable_bias,
                  const WithAddedBias& with_added_bias) {
  using Kind = QuantScheme::Kind;
  if (!constants_.contains(wv)) return false;
  const RegionConstant& wc = *constants_.at(wv);
  // A weight the .pt2 holds quantized (torchao's quantize_ before export): its own form, whatever --quantize says.
  QuantScheme q = opts_.quantize;
  if (auto it = opts_.per_weight.find(wv); it != opts_.per_weight.end()) q = it->second;  // --quantize auto
  const auto fixed = opts_.precomputed.find(wv);  // --calibrate's GPTQ
  if (fixed != opts_.precomputed.end()) q = fixed->second.first;
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
    if (!shapes_only_) qw.data = wc.quantized->data, qw.scales = wc.quantized->scales;
    ++stats_.prequantized_nodes;
    const int64_t bits = wc.quantized->bits, group = wc.quantized->group;
    if (stats_.prequantized_bits == 0) stats_.prequantized_bits = bits, stats_.prequantized_group = group;
    if (stats_.prequantized_bits != bits) stats_.prequantized_bits = -1;
    if (stats_.prequantized_group != group) stats_.prequantized_group = -1;
  } else if (fixed != opts_.precomputed.end()) {
    check(fixed->second.second.data.size() == static_cast<size_t>(q.kind == Kind::Int4Groups ? n * (k / 2) : n * k),
          "internal: the precomputed quantization of '{}' has the wrong size", name(wv));
    if (!shapes_only_) qw = fixed->second.second;
  } else if (!shapes_only_) {
    qw = kn ? quantize_transposed(wc, n, k, q) : quantize_streamed(wc, n, k, q);
  }  // (shapes only: empty bytes; the graph is the same)
  // --quantize-scales asym: the int4 grid's offsets, applied beside the int4 product (quantize.h)
  const bool affine = !wc.quantized && has_offsets(q);  // (GPTQ's precomputed weights carry their offsets too)
  std::vector<std::byte> offsets = std::move(qw.offsets);
  check(!affine || shapes_only_ || offsets.size() == static_cast<size_t>(n * (k / q.group)) * 4,
        "internal: the offsets of '{}' have the wrong size", name(wv));
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
  // The input's int8 rows: one convert per input, shared by the layers that read the same values (q/k/v, gate/up),
  // each of which reads them through a view of its own. Per weight kind: kiln's engine lays the rows out for the
  // int4 or the int8 kernel (a mixed plan's q/k/v may be both).
  const std::pair<graph::ValueId, Dims> source{view_root(a), dims(a)};
  const std::pair<std::pair<graph::ValueId, Dims>, bool> rows_key{source, q.kind == Kind::Int4Groups};
  uint32_t xq = 0;
  if (auto it = quantized_inputs_.find(rows_key); it != quantized_inputs_.end()) {
    xq = it->second;
  } else {
    xq = add_quantized_value(dims(a), fbx::XNNDatatype::xnn_datatype_qdint8, fbx::XNNQuantParams::PerTokenDynamicQuant,
                             fbx::CreatePerTokenDynamicQuant(fb_, 1).Union(), 0);
    unary(XType::XNNConvert, x, xq);
    quantized_inputs_[rows_key] = xq;
  }
  if (affine) {
    // y = Q(x) (scale q)^T + S C^T (+ bias), S = x G^T the input's group sums (G [K/G, K]: ones on each group's
    // inputs; one node per input and group size, shared by the layers reading the same x), C [N, K/G] the offsets.
    // Both fp32 fully connected nodes: ExecuTorch's runtime runs them as any other.
    const auto groups = static_cast<uint32_t>(k / q.group);
    uint32_t sums = 0;
    const std::pair<std::pair<graph::ValueId, Dims>, int64_t> sums_key{source, q.group};
    if (auto it = group_sums_.find(sums_key); it != group_sums_.end()) {
      sums = it->second;
    } else {
      std::vector<float> ones(static_cast<size_t>(groups) * static_cast<size_t>(k), 0.0f);
      for (uint32_t gi = 0; gi < groups; ++gi)
        for (int64_t i = 0; i < q.group; ++i)
          ones[static_cast<size_t>(gi) * static_cast<size_t>(k) + static_cast<size_t>(gi * q.group + i)] = 1.0f;
      const uint32_t gsum = made_constant(ones, {groups, static_cast<uint32_t>(k)});
      Dims sd = dims(a);
      sd.back() = groups;
      sums = temp(sd);
      fully_connected(x, gsum, kInvalidValueId, sums, 0);
      group_sums_[sums_key] = sums;
    }
    const std::string offsets_key = content_key(offsets);
    const uint32_t offsets_index = named_constant(offsets_key, pte::DataBlob::from_bytes(std::move(offsets)));
    const uint32_t c = add_value({static_cast<uint32_t>(n), groups}, offsets_index, kInvalidValueId, 0);
    const Dims od = dims(out);
    auto both = [&](uint32_t bias, uint32_t into) {
      const uint32_t p = temp(od), o = temp(od);
      fully_connected(xq, filter, kInvalidValueId, p, 0);
      fully_connected(sums, c, bias, o, 0);
      binary(XType::XNNAdd, p, o, into);
    };
    if (auto fused = fusable_bias()) both(*fused, write(out));
    else with_added_bias([&](uint32_t into) { both(kInvalidValueId, into); });
    ++stats_.affine_nodes;
  } else if (auto fused = fusable_bias()) {
    fully_connected(xq, filter, *fused, write(out), 0);
  } else {
    with_added_bias([&](uint32_t into) { fully_connected(xq, filter, kInvalidValueId, into, 0); });
  }
  ++stats_.quantized_nodes;
  return true;
}

void PayloadBuilder::lower_matmul(graph::ValueId a, graph::ValueId b, std::optional<graph::ValueId> bias, graph::ValueId out) {
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

uint32_t PayloadBuilder::reduce_rows(uint32_t x, const Dims& xd, size_t count, bool mean, std::optional<uint32_t> into) {
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

void PayloadBuilder::reduce_trailing(graph::ValueId x, size_t count, bool mean, graph::ValueId out) {
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

void PayloadBuilder::lower_layer_norm(const graph::Node& n, const std::vector<Argument>& args) {
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

}  // namespace kiln::backends::xnnpack::detail
