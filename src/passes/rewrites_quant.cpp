// to_edge rewrites: programs quantized before torch.export (the seed's route: torchao's quantize_
// with Int8DynamicActivationIntxWeightConfig, 8da4w or 8da8w, then torch.export).
//
// Such a graph computes each linear layer as torchao's eager model does:
//
//   s, zp = choose_qparams_affine(x, "ASYMMETRIC", [1, .., K], int8)   per-token int8 parameters
//   x'    = dequantize_affine(quantize_affine(x, ..., s, zp), ..., s, zp)
//   W'    = dequantize_affine(Wq, [1, G], scale, zero_point, int8, -8, 7)   (or [1, K], -128, 127)
//   y     = linear(x', W', b)
//
// kiln lowers that as ExecuTorch's XNNPACK partitioner does: the weight becomes one constant W that
// keeps its quantized form (QuantizedConstant: int4 pairs with bf16 group scales, or int8 with fp32
// channel scales; W's bytes hold it dequantized for any other reader), the activation's
// quantize/dequantize pair disappears, and the payload builder turns linear(x, W) into XNNPACK's
// dynamically quantized fully connected node (convert to qdint8 per token, then qb4w / qc8w), which
// computes the same product. Ops of the `torchao` namespace and of older torchao's `quant` namespace
// (same arguments) are read, and PT2E's `quantized_decomposed` ops (prepare_pt2e / convert_pt2e with
// XNNPACKQuantizer's dynamic per-channel config): choose_qparams.tensor + quantize_per_tensor.tensor +
// dequantize_per_tensor.tensor on the activation, dequantize_per_channel (axis 0) on an int8 weight.
// Those parameters are per tensor in eager; ExecuTorch lowers them to the same qdint8 conversion, which
// XNNPACK computes per row, and so does kiln (identical for one row, one rounding step apart otherwise).
// Anything else quantized is one clear error naming the node.
#include "lowerer.h"

#include <cmath>

namespace kiln::passes::detail {
namespace {

// "torchao.quantize_affine.default" or "quant.quantize_affine.default" -> true for op "quantize_affine".
bool is_affine_op(const std::string& target, std::string_view op) {
  for (std::string_view ns : {"torchao.", "quant."}) {
    if (target.size() < ns.size() + op.size() || target.compare(0, ns.size(), ns) != 0) continue;
    if (target.compare(ns.size(), op.size(), op) != 0) continue;
    const std::string_view rest = std::string_view(target).substr(ns.size() + op.size());
    if (rest.empty() || rest == ".default") return true;
  }
  return false;
}

bool is_any_affine_op(const std::string& t) {
  return is_affine_op(t, "choose_qparams_affine") || is_affine_op(t, "quantize_affine") ||
         is_affine_op(t, "dequantize_affine") || t.starts_with("quantized_decomposed.");
}

bool per_token_block(const std::vector<int64_t>& block, const std::vector<int64_t>& sizes) {
  if (block.size() != sizes.size() || block.empty()) return false;
  for (size_t i = 0; i + 1 < block.size(); ++i)
    if (block[i] != 1) return false;
  return block.back() == sizes.back();
}

uint16_t to_bf16(float f) {  // round to nearest even, as torch's .to(bfloat16) (and ExecuTorch's serializer)
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // NaN stays NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

float load_float(const std::vector<std::byte>& bytes, ScalarType dtype, size_t i) {
  if (dtype == ScalarType::Float) {
    float f;
    std::memcpy(&f, bytes.data() + i * 4, 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, bytes.data() + i * 2, 2);
  if (dtype == ScalarType::BFloat16) {
    const uint32_t u = static_cast<uint32_t>(h) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
  // Half
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  float f;
  if (exp == 0) f = std::ldexp(static_cast<float>(man), -24);
  else if (exp == 31) f = man ? std::numeric_limits<float>::quiet_NaN() : std::numeric_limits<float>::infinity();
  else f = std::ldexp(static_cast<float>(man | 0x400u), static_cast<int>(exp) - 25);
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u |= sign;
  std::memcpy(&f, &u, 4);
  return f;
}

}  // namespace

bool Lowerer::lower_quant(const Node& n) {
  const std::string& t = n.target;
  const bool linear = t == "aten.linear.default";
  // A per-token quantized activation is read by the linear layer it was quantized for, nothing else.
  if (!fake_quant_src_.empty() && !is_any_affine_op(t)) {
    for (const auto& in : n.inputs)
      for (ValueId v : in.arg.tensor_ids()) {
        if (!fake_quant_src_.contains(v)) continue;
        const Argument* w = opt(n, "weight");
        const bool quantized_linear = linear && in.name == "input" && w && w->kind == Argument::Kind::Tensor &&
                                      quantized_weight_src_.contains(std::get<ValueId>(w->payload));
        if (!quantized_linear)
          unsupported(n, "reads an activation quantized per token (torchao's quantize_affine / dequantize_affine); "
                         "kiln lowers that only into a linear layer whose weight is quantized too (8da4w, 8da8w)");
      }
  }
  if (linear) {
    const Argument& w = arg(n, "weight");
    if (w.kind != Argument::Kind::Tensor || !quantized_weight_src_.contains(std::get<ValueId>(w.payload))) return false;
    const Argument& x = arg(n, "input");
    const bool dynamic = x.kind == Argument::Kind::Tensor && fake_quant_src_.contains(std::get<ValueId>(x.payload));
    if (!dynamic) {
      // Weight-only quantization: x @ dequantized W, exactly what the graph computes, in fp32.
      const ValueId wq = tensor_in(n, "weight");
      ConstantData plain = out_.constants.at(wq);
      plain.quantized = nullptr;
      const ValueId wf = out_.graph.add_value(fresh_name("weight_fp32"), meta_of(wq));
      out_.constants[wf] = std::move(plain);
      vmap_[static_cast<size_t>(std::get<ValueId>(w.payload))] = wf;
      return false;
    }
    if (stats_) ++stats_->prequantized_linears;
    return false;  // the usual linear lowering, on W (transposed_weight keeps W as it is)
  }
  if (!is_any_affine_op(t)) return false;
  if (t.starts_with("quantized_decomposed.")) return lower_decomposed_quant(n);

  auto dtype_or = [&](const char* name, ScalarType dflt) { return dtype_in(n, name).value_or(dflt); };
  auto src_in = [&](const char* name) -> std::optional<ValueId> {
    const Argument* a = opt(n, name);
    if (!a || a->kind == Argument::Kind::None) return std::nullopt;
    if (a->kind != Argument::Kind::Tensor) unsupported(n, fmt::format("argument '{}' is not a tensor", name));
    return std::get<ValueId>(a->payload);
  };
  auto range = [&](int64_t lo, int64_t hi) { return std::pair{int_in(n, "quant_min", lo), int_in(n, "quant_max", hi)}; };
  auto string_in = [&](const char* name) -> std::string {
    const Argument* a = opt(n, name);
    if (!a || a->kind != Argument::Kind::String) return {};
    return std::get<std::string>(a->payload);
  };
  auto integer_zero_domain = [&]() {  // older torchao (quant.*): zero_point_domain must be the integer one
    const std::string d = string_in("zero_point_domain");
    if (!d.empty() && d != "INT" && d != "ZeroPointDomain.INT")
      unsupported(n, fmt::format("zero_point_domain '{}': kiln lowers integer zero points only", d));
  };
  const auto outs = source_outputs(n);

  if (is_affine_op(t, "choose_qparams_affine")) {
    const auto x = src_in("input");
    const std::string mapping = string_in("mapping_type");
    if (!x) unsupported(n, "choose_qparams_affine without an input");
    const auto block = ints_in(n, "block_size");
    const auto& xs = ep_.graph.value(*x).meta.sizes;
    if (mapping != "ASYMMETRIC" && mapping != "MappingType.ASYMMETRIC")
      unsupported(n, fmt::format("activation quantization with mapping '{}': kiln lowers torchao's dynamic int8 "
                                 "activations (ASYMMETRIC, per token), as XNNPACK's qdint8 computes them",
                                 mapping));
    if (!per_token_block(block, xs) || dtype_or("target_dtype", ScalarType::Char) != ScalarType::Char ||
        range(-128, 127) != std::pair<int64_t, int64_t>{-128, 127})
      unsupported(n, fmt::format("activation quantization over blocks [{}] of a [{}] tensor: kiln lowers int8 "
                                 "[-128, 127] per token only (block_size [1, ..., 1, K])",
                                 fmt::join(block, ", "), fmt::join(xs, ", ")));
    integer_zero_domain();
    if (outs.size() != 2) unsupported(n, "choose_qparams_affine without its scale and zero point outputs");
    for (ValueId o : outs) act_qparams_[o] = {*x, block};
    return true;
  }

  const auto input = src_in("input");
  const auto scale = src_in("scale");
  const auto zero_point = src_in("zero_point");
  if (!input || !scale) unsupported(n, "missing input or scale");
  const auto block = ints_in(n, "block_size");
  integer_zero_domain();
  auto same_params = [&](const ActQuant& a) {
    auto s = act_qparams_.find(*scale);
    auto z = zero_point ? act_qparams_.find(*zero_point) : act_qparams_.end();
    return s != act_qparams_.end() && z != act_qparams_.end() && s->second.x == a.x && z->second.x == a.x &&
           s->second.block == block && a.block == block;
  };

  if (is_affine_op(t, "quantize_affine")) {
    const ActQuant a{*input, block};
    if (!same_params(a) || dtype_or("output_dtype", ScalarType::Char) != ScalarType::Char ||
        range(-128, 127) != std::pair<int64_t, int64_t>{-128, 127})
      unsupported(n, "quantize_affine that is not torchao's per-token int8 activation quantization (its scale and "
                     "zero point from choose_qparams_affine of the same tensor): kiln does not lower it");
    act_quantized_[outs.at(0)] = a;
    return true;
  }

  // dequantize_affine: an activation's (back to fp32) or a weight's.
  if (dtype_or("output_dtype", ScalarType::Float) != ScalarType::Float)
    unsupported(n, "dequantize_affine to a dtype other than float32: kiln lowers float32 programs");
  if (auto a = act_quantized_.find(*input); a != act_quantized_.end()) {
    if (!same_params(a->second) || dtype_or("input_dtype", ScalarType::Char) != ScalarType::Char ||
        range(-128, 127) != std::pair<int64_t, int64_t>{-128, 127})
      unsupported(n, "dequantize_affine of an activation with other parameters than its quantize_affine's");
    bind(n, mapped(a->second.x));  // the fully connected node quantizes x itself
    fake_quant_src_.insert(outs.at(0));
    return true;
  }
  const ValueId q = mapped(*input), s = mapped(*scale);
  const std::optional<ValueId> z = zero_point ? std::optional<ValueId>(mapped(*zero_point)) : std::nullopt;
  if (dtype_or("input_dtype", ScalarType::Char) != ScalarType::Char)
    unsupported(n, "dequantize_affine of a weight not stored as int8: kiln lowers int8 storage of int4 / int8 weights");
  if (block.size() != 2 || block[0] != 1)
    unsupported(n, fmt::format("weight blocks [{}]: kiln lowers groups along the input channels ([1, G])",
                               fmt::join(block, ", ")));
  const auto [qmin, qmax] = range(-128, 127);
  bind_quantized_weight(n, q, s, z, qmin, qmax, block[1]);
  quantized_weight_src_.insert(outs.at(0));
  return true;
}

// The weight of a linear layer, quantized in the file: int8 storage q [N, K] (int4 values in [-8, 7] or int8),
// scales s (and zero points z, which must be 0) per row and group of G input channels (G = K: per channel).
// Binds n's output to one constant holding W dequantized (fp32, for any other reader) and its quantized form.
void Lowerer::bind_quantized_weight(const Node& n, ValueId q, ValueId s, std::optional<ValueId> z, int64_t qmin,
                                    int64_t qmax, int64_t G) {
  if (!out_.is_constant(q) || !out_.is_constant(s) || (z && !out_.is_constant(*z)))
    unsupported(n, "dequantization of a tensor that is neither a quantized weight (constant data, scale and zero "
                   "point) nor an activation quantized per token: kiln does not lower it");
  const TensorMeta& qm = meta_of(q);
  const TensorMeta& sm = meta_of(s);
  if (qm.sizes.size() != 2 || qm.dtype != ScalarType::Char)
    unsupported(n, fmt::format("quantized weight of shape [{}] and dtype {}: kiln lowers int8 storage of 2-D "
                               "(linear layer) weights", fmt::join(qm.sizes, ", "), dtype_name(qm.dtype)));
  if (sm.dtype != ScalarType::Float && sm.dtype != ScalarType::BFloat16 && sm.dtype != ScalarType::Half)
    unsupported(n, "weight scales that are not floating point");
  const int64_t N = qm.sizes[0], K = qm.sizes[1];
  int bits = 0;
  if (qmin == -8 && qmax == 7) bits = 4;
  else if ((qmin == -128 || qmin == -127) && qmax == 127) bits = 8;
  else
    unsupported(n, fmt::format("weights quantized to [{}, {}]: kiln lowers int4 [-8, 7] and int8 [-128, 127]", qmin, qmax));
  if (bits == 8 && G != K)
    unsupported(n, fmt::format("int8 weights in groups of {} (of {} input channels): kiln lowers int8 weights per "
                               "output channel (PerAxis(0))", G, K));
  if (bits == 4 && (G != 32 && G != 64 && G != 128 && G != 256))
    unsupported(n, fmt::format("int4 weights in groups of {}: kiln lowers groups of 32, 64, 128 or 256", G));
  if (K % G != 0) unsupported(n, fmt::format("group size {} does not divide the {} input channels", G, K));
  const int64_t groups = K / G;
  if (sm.numel() != N * groups) unsupported(n, fmt::format("{} scales for {} rows of {} groups", sm.numel(), N, groups));
  if (z && meta_of(*z).numel() != N * groups)
    unsupported(n, fmt::format("{} zero points for {} rows of {} groups", meta_of(*z).numel(), N, groups));

  const std::vector<std::byte> qb = out_.constant_bytes(q), sb = out_.constant_bytes(s);
  std::vector<std::byte> zb;
  ScalarType zt = ScalarType::Char;
  if (z) {
    zb = out_.constant_bytes(*z);
    zt = meta_of(*z).dtype;
  }
  auto zero_at = [&](size_t i) -> int64_t {
    if (!z) return 0;
    switch (zt) {
      case ScalarType::Char: return static_cast<int8_t>(zb[i]);
      case ScalarType::Byte: return static_cast<uint8_t>(zb[i]);
      case ScalarType::Int: {
        int32_t v;
        std::memcpy(&v, zb.data() + i * 4, 4);
        return v;
      }
      case ScalarType::Long: {
        int64_t v;
        std::memcpy(&v, zb.data() + i * 8, 8);
        return v;
      }
      default: return static_cast<int64_t>(load_float(zb, zt, i));
    }
  };
  auto qc = std::make_shared<QuantizedConstant>();
  qc->bits = bits;
  qc->group = bits == 4 ? G : 0;
  qc->rows = N;
  qc->cols = K;
  qc->data.assign(static_cast<size_t>(bits == 4 ? N * (K / 2) : N * K), std::byte{0});
  qc->scales.resize(static_cast<size_t>(bits == 4 ? N * groups * 2 : N * 4));
  auto dequantized = std::make_shared<std::vector<std::byte>>(static_cast<size_t>(N * K) * 4);
  auto* w = reinterpret_cast<float*>(dequantized->data());
  const auto* qv = reinterpret_cast<const int8_t*>(qb.data());
  auto* packed = reinterpret_cast<uint8_t*>(qc->data.data());
  for (int64_t r = 0; r < N; ++r)
    for (int64_t g = 0; g < groups; ++g) {
      const size_t gi = static_cast<size_t>(r * groups + g);
      if (zero_at(gi) != 0)
        unsupported(n, fmt::format("weight row {} has zero point {}: kiln lowers symmetric weights (zero points 0), as "
                                   "XNNPACK's qb4w / qc8w store them", r, zero_at(gi)));
      const float sc = load_float(sb, sm.dtype, gi);
      if (bits == 4) {
        const uint16_t s16 = to_bf16(sc);
        std::memcpy(qc->scales.data() + gi * 2, &s16, 2);
      } else {
        std::memcpy(qc->scales.data() + gi * 4, &sc, 4);
      }
      for (int64_t c = g * G; c < (g + 1) * G; ++c) {
        const int8_t v = qv[r * K + c];
        if (v < qmin || v > qmax)
          unsupported(n, fmt::format("weight value {} at [{}, {}] is outside [{}, {}]", v, r, c, qmin, qmax));
        w[r * K + c] = static_cast<float>(v) * sc;  // torchao's dequantize_affine: (q - zero_point) * scale
        if (bits == 4) packed[r * (K / 2) + c / 2] |= static_cast<uint8_t>((v + 8) << ((c & 1) ? 4 : 0));
        else packed[r * K + c] = static_cast<uint8_t>(v);
      }
    }
  const ValueId wv = out_.graph.add_value(fresh_name("weight"), contiguous(ScalarType::Float, {N, K}));
  std::string name = out_.constants.at(q).name;
  if (name.size() > 6 && name.ends_with(".qdata")) name.resize(name.size() - 6);
  out_.constants[wv] = ConstantData{nullptr, std::move(dequantized), fmt::format("{} (int{})", name, bits), std::move(qc)};
  bind(n, wv);
}

// PT2E's ops (torch.ao / torchao pt2e convert_pt2e): the dynamic per-channel config of XNNPACKQuantizer.
bool Lowerer::lower_decomposed_quant(const Node& n) {
  const std::string& t = n.target;
  const auto outs = source_outputs(n);
  auto src_in = [&](const char* name) -> ValueId {
    const Argument& a = arg(n, name);
    if (a.kind != Argument::Kind::Tensor) unsupported(n, fmt::format("argument '{}' is not a tensor", name));
    return std::get<ValueId>(a.payload);
  };
  auto int8_range = [&]() {
    return int_in(n, "quant_min") == -128 && int_in(n, "quant_max") == 127 &&
           dtype_in(n).value_or(ScalarType::Char) == ScalarType::Char;
  };
  auto float_out = [&]() {
    if (dtype_in(n, "out_dtype").value_or(ScalarType::Float) != ScalarType::Float)
      unsupported(n, "dequantization to a dtype other than float32: kiln lowers float32 programs");
  };
  auto same_params = [&](ValueId x) {
    auto s = act_qparams_.find(src_in("scale"));
    auto z = act_qparams_.find(src_in("zero_point"));
    return s != act_qparams_.end() && z != act_qparams_.end() && s->second.x == x && z->second.x == x;
  };
  if (t == "quantized_decomposed.choose_qparams.tensor") {
    const ValueId x = src_in("input");
    if (!int8_range())
      unsupported(n, "dynamic activation quantization other than int8 [-128, 127]: kiln lowers qdint8 only");
    if (outs.size() != 2) unsupported(n, "choose_qparams without its scale and zero point outputs");
    const auto& xs = ep_.graph.value(x).meta.sizes;
    std::vector<int64_t> block(xs.size(), 1);
    if (!xs.empty()) block.back() = xs.back();
    for (ValueId o : outs) act_qparams_[o] = {x, block};  // per tensor in eager; per row in XNNPACK's qdint8
    return true;
  }
  if (t == "quantized_decomposed.quantize_per_tensor.tensor") {
    const ValueId x = src_in("input");
    if (!same_params(x) || !int8_range())
      unsupported(n, "quantize_per_tensor whose scale and zero point are not choose_qparams of the same tensor "
                     "(int8 [-128, 127]): kiln lowers dynamically quantized activations only");
    act_quantized_[outs.at(0)] = act_qparams_.at(src_in("scale"));
    return true;
  }
  if (t == "quantized_decomposed.dequantize_per_tensor.tensor") {
    float_out();
    auto a = act_quantized_.find(src_in("input"));
    if (a == act_quantized_.end() || !same_params(a->second.x) || !int8_range())
      unsupported(n, "dequantize_per_tensor of a tensor other than an activation quantized dynamically "
                     "(choose_qparams + quantize_per_tensor): kiln does not lower it");
    bind(n, mapped(a->second.x));  // the fully connected node quantizes x itself
    fake_quant_src_.insert(outs.at(0));
    return true;
  }
  if (t == "quantized_decomposed.dequantize_per_channel.default") {
    float_out();
    if (dtype_in(n).value_or(ScalarType::Char) != ScalarType::Char)
      unsupported(n, "dequantize_per_channel of weights not stored as int8");
    const ValueId q = mapped(src_in("input"));
    if (int_in(n, "axis") != 0 || meta_of(q).sizes.size() != 2)
      unsupported(n, fmt::format("dequantize_per_channel along axis {}: kiln lowers linear weights quantized per "
                                 "output channel (axis 0)", int_in(n, "axis")));
    const Argument* z = opt(n, "zero_points");
    std::optional<ValueId> zv;
    if (z && z->kind == Argument::Kind::Tensor) zv = mapped(std::get<ValueId>(z->payload));
    bind_quantized_weight(n, q, mapped(src_in("scales")), zv, int_in(n, "quant_min"), int_in(n, "quant_max"),
                          meta_of(q).sizes[1]);
    quantized_weight_src_.insert(outs.at(0));
    return true;
  }
  unsupported(n, "quantized_decomposed operator kiln does not lower: kiln lowers PT2E's dynamically quantized "
                 "linear layers (XNNPACKQuantizer's dynamic per-channel config: choose_qparams.tensor, "
                 "quantize/dequantize_per_tensor.tensor, dequantize_per_channel); static int8 quantization is not "
                 "supported, quantize with torchao's Int8DynamicActivationIntxWeightConfig or kiln lower --quantize");
}

}  // namespace kiln::passes::detail
