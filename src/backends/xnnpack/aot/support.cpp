// The XNNPACK support table and the per-node check behind it.
#include "kiln/backends/xnnpack/support.h"

#include "node_args.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <optional>

namespace kiln::backends::xnnpack {
namespace {

using namespace detail;

constexpr std::array kRules{
    SupportRule{"aten.addmm.default", "XNNFullyConnected (+ XNNAdd for a bias that is not a constant [N])",
                "mat1, mat2 rank 2; beta = alpha = 1. mat2 a constant [K,N] (transpose-weights flag) or "
                "permute_copy(W,[1,0]) of a constant W [N,K] inside the region (W used as is); otherwise as mm"},
    SupportRule{"aten.mm.default", "XNNFullyConnected, or XNNBatchMatrixMultiply when neither operand is constant",
                "rank 2. A constant first operand A gives (x @ A^T)^T: XNNFullyConnected with A as filter, "
                "absorbing permute_copy([1,0]) nodes around it inside the region, else with XNNStaticTranspose"},
    SupportRule{"aten.bmm.default", "XNNBatchMatrixMultiply", "rank 3"},
    SupportRule{"aten.add.Tensor", "XNNAdd (+ XNNMultiply when alpha != 1)", "broadcasting operands"},
    SupportRule{"aten.sub.Tensor", "XNNSubtract (+ XNNMultiply when alpha != 1)", "broadcasting operands"},
    SupportRule{"aten.mul.Tensor", "XNNMultiply", "broadcasting operands"},
    SupportRule{"aten.div.Tensor", "XNNDiv", "broadcasting operands"},
    SupportRule{"aten.maximum.default", "XNNMaximum", "broadcasting operands"},
    SupportRule{"aten.minimum.default", "XNNMinimum", "broadcasting operands"},
    SupportRule{"aten.add.Scalar", "XNNAdd with a constant [1]", "number operand"},
    SupportRule{"aten.sub.Scalar", "XNNSubtract with a constant [1]", "number operand"},
    SupportRule{"aten.rsub.Scalar", "XNNSubtract from a constant [1]", "number operand"},
    SupportRule{"aten.mul.Scalar", "XNNMultiply by a constant [1]", "number operand"},
    SupportRule{"aten.div.Scalar", "XNNDiv by a constant [1]", "number operand"},
    SupportRule{"aten.pow.Tensor_Scalar", "XNNSquare / XNNSquareRoot / XNNCopy, or a short chain of them with "
                                          "XNNMultiply / XNNDiv (-0.5: 1 / XNNSquareRoot, so 0 gives inf)",
                "exponent in {1, 2, 3, 0.5, -0.5, -1}"},
    SupportRule{"aten.neg.default", "XNNNegate", ""},
    SupportRule{"aten.abs.default", "XNNAbs", ""},
    SupportRule{"aten.exp.default", "XNNExp", ""},
    SupportRule{"aten.log.default", "XNNLog", ""},
    SupportRule{"aten.sqrt.default", "XNNSquareRoot", ""},
    SupportRule{"aten.rsqrt.default", "XNNReciprocalSquareRoot", ""},
    SupportRule{"aten.tanh.default", "XNNTanh", ""},
    SupportRule{"aten.sigmoid.default", "XNNSigmoid", ""},
    SupportRule{"aten.sin.default", "XNNSin", ""},
    SupportRule{"aten.cos.default", "XNNCos", ""},
    SupportRule{"aten.relu.default", "XNNClamp [0, +inf)", ""},
    SupportRule{"aten.clamp.default", "XNNClamp", "min <= max when both are given"},
    SupportRule{"aten.gelu.default", "XNNGelu (approximate='none'); XNNTanh with elementwise nodes ('tanh')", ""},
    SupportRule{"aten._softmax.default", "XNNSoftmax", "dim = last; half_to_float = false"},
    SupportRule{"aten.mean.dim", "XNNFullyConnected against a constant 1/K row (+ XNNStaticReshape)",
                "reduced dims are the trailing dims; dtype None"},
    SupportRule{"aten.sum.dim_IntList", "XNNFullyConnected against a constant row of ones (+ XNNStaticReshape)",
                "reduced dims are the trailing dims; dtype None"},
    SupportRule{"aten.native_layer_norm.default",
                "XNNFullyConnected (means), XNNSubtract, XNNSquare, XNNAdd, XNNReciprocalSquareRoot, XNNMultiply",
                "normalized_shape = the input's trailing dims; weight and bias optional"},
    SupportRule{"aten.permute_copy.default", "XNNStaticTranspose", "dims a permutation"},
    SupportRule{"aten.view_copy.default", "XNNStaticReshape (XNNCopy when the shape is unchanged)", ""},
    SupportRule{"aten.unsqueeze_copy.default", "XNNStaticReshape", ""},
    SupportRule{"aten.squeeze_copy.dims", "XNNStaticReshape (XNNCopy when the shape is unchanged)", ""},
    SupportRule{"aten.alias_copy.default", "XNNCopy", ""},
    SupportRule{"dim_order_ops._clone_dim_order.default", "XNNCopy", "dim_order None or the identity"},
    SupportRule{"dim_order_ops._to_dim_order_copy.default", "XNNCopy",
                "float32 to float32; dim_order None or the identity"},
    SupportRule{"aten.expand_copy.default", "XNNAdd of a zero constant shaped like the expanded dims "
                                            "(XNNStaticReshape / XNNCopy when nothing expands)",
                "the output shape broadcasts the input"},
    SupportRule{"aten.slice_copy.Tensor", "XNNStaticSlice", "step = 1"},
    SupportRule{"aten.select_copy.int", "XNNStaticSlice + XNNStaticReshape", ""},
    SupportRule{"aten.split_with_sizes_copy.default", "one XNNStaticSlice per output read", ""},
    SupportRule{"aten.cat.default", "XNNConcatenate2..5 (chained past 5 inputs; XNNCopy for one)",
                "inputs of equal rank"},
    SupportRule{"aten.constant_pad_nd.default", "XNNStaticConstantPad", "no negative padding"},
    // activations
    SupportRule{"aten.elu.default", "XNNELU", "scale = input_scale = 1"},
    SupportRule{"aten.leaky_relu.default", "XNNLeakyReLU", "negative_slope a number"},
    // convolution and vision (NCHW tensors: XNNStaticTranspose to NHWC and back around each node)
    SupportRule{"aten.convolution.default",
                "XNNConv2d / XNNDepthwiseConv2d (one input channel per group) / XNNConvTranspose2d (1-D as 2-D "
                "with height 1)",
                "rank 3 or 4; weight and bias constants"},
    SupportRule{"aten.max_pool2d_with_indices.default", "XNNMaxPooling2d",
                "rank 4; indices unused (ceil_mode: extra bottom/right padding); input not made by an operator "
                "that turns finite values into NaN (see pooling_nan_source)"},
    SupportRule{"aten.avg_pool2d.default", "XNNAvgPooling2d",
                "rank 4; no padding; ceil_mode false; no divisor_override; input not made by an operator that "
                "turns finite values into NaN (see pooling_nan_source)"},
    SupportRule{"aten.upsample_bilinear2d.vec", "XNNStaticResizeBilinear2D",
                "rank 4; output size given or an integral scale of the input"},
};

bool is_binary(std::string_view t) {
  return t == "aten.add.Tensor" || t == "aten.sub.Tensor" || t == "aten.mul.Tensor" || t == "aten.div.Tensor" ||
         t == "aten.maximum.default" || t == "aten.minimum.default";
}

const SupportRule* find_rule(std::string_view target) {
  for (const auto& r : kRules)
    if (r.target == target) return &r;
  return nullptr;
}

// Common conditions on one tensor the node reads (`input`) or writes.
std::optional<std::string> check_tensor(const graph::Graph& g, graph::ValueId v, bool input, bool rank0_ok) {
  if (v < 0 || static_cast<size_t>(v) >= g.values.size()) return fmt::format("value id {} is out of range", v);
  const graph::Value& value = g.value(v);
  const graph::TensorMeta& m = value.meta;
  std::string_view role = input ? "input" : "output";
  if (m.dtype != ScalarType::Float)
    return fmt::format("{} '{}' is {}; XNNPACK regions are float32 only", role, value.name, dtype_name(m.dtype));
  if (m.sizes.size() > kMaxDims)
    return fmt::format("{} '{}' has {} dims; XNNPACK takes at most {}", role, value.name, m.sizes.size(), kMaxDims);
  if (m.sizes.empty() && !rank0_ok) return fmt::format("{} '{}' is rank 0", role, value.name);
  for (int64_t s : m.sizes)
    if (s <= 0 || s > INT32_MAX)
      return fmt::format("{} '{}' has size {} in a dimension", role, value.name, s);
  if (!m.is_contiguous()) return fmt::format("{} '{}' is not contiguous", role, value.name);
  return std::nullopt;
}

const std::vector<int64_t>& sizes_of(const graph::Graph& g, graph::ValueId v) { return g.value(v).meta.sizes; }

// XNNPACK's pooling kernels clamp every output with min/max instructions, which turn a NaN into the bound
// (-inf: average pooling) or skip it (max pooling), where torch's pooling propagates it. A NaN the program
// makes itself from finite numbers must reach the output as in eager, so a pooling whose input comes
// (through reshapes) from such an operator stays on the portable path: pow with a fractional or a tensor
// exponent (a negative base: LP pooling's avg_pool(x^p) with p = 1.5), sqrt and log (a negative input).
// NaNs in the program's inputs are not followed: XNNPACK's pooling is what ExecuTorch's XNNPACK files run too.
// The operator that makes the NaNs, or nullopt.
std::optional<std::string> pooling_nan_source(const graph::Graph& g, graph::ValueId v) {
  for (int hops = 0; hops < 8; ++hops) {
    int32_t p = g.value(v).producer;
    if (p < 0 || static_cast<size_t>(p) >= g.nodes.size()) return std::nullopt;
    const graph::Node& n = g.nodes[static_cast<size_t>(p)];
    std::vector<Argument> args = schema_arguments(n);
    const std::string& t = n.target;
    if (t == "aten.pow.Tensor_Scalar") {
      auto e = scalar_of(args[1]);
      if (!e || *e != std::floor(*e)) return fmt::format("pow(x, {})", e ? fmt::format("{}", *e) : "?");
      return std::nullopt;
    }
    if (t == "aten.pow.Tensor_Tensor") return std::string("pow(x, y)");  // a fractional y, known at run time
    if (t == "aten.sqrt.default" || t == "aten.log.default") return fmt::format("{}(x)", t.substr(5, t.size() - 13));
    if (t != "aten.view_copy.default" && t != "aten.unsqueeze_copy.default" && t != "aten.squeeze_copy.dims" &&
        t != "aten.alias_copy.default" && t != "aten.permute_copy.default")
      return std::nullopt;
    if (args.empty() || args[0].kind != Argument::Kind::Tensor) return std::nullopt;
    v = std::get<graph::ValueId>(args[0].payload);
  }
  return std::nullopt;
}

// The operator-specific conditions; nullopt when they hold.
std::optional<std::string> check_arguments(const graph::Graph& g, const graph::Node& n,
                                           const std::vector<Argument>& args) {
  const std::string& t = n.target;
  auto rank = [&](const Argument& a) { return sizes_of(g, tensor_of(a, n.name)).size(); };

  if (t == "aten.addmm.default") {
    auto beta = scalar_of(args[3]), alpha = scalar_of(args[4]);
    if (!beta || *beta != 1 || !alpha || *alpha != 1) return "addmm with beta or alpha other than 1";
    if (rank(args[1]) != 2 || rank(args[2]) != 2) return "addmm operands must be rank 2";
    return std::nullopt;
  }
  if (t == "aten.mm.default") {
    if (rank(args[0]) != 2 || rank(args[1]) != 2) return "mm operands must be rank 2";
    return std::nullopt;
  }
  if (t == "aten.bmm.default") {
    if (rank(args[0]) != 3 || rank(args[1]) != 3) return "bmm operands must be rank 3";
    return std::nullopt;
  }
  if (is_binary(t)) {
    for (size_t i = 0; i < 2; ++i)
      if (args[i].kind != Argument::Kind::Tensor && !scalar_of(args[i]))
        return fmt::format("operand {} is neither a tensor nor a number", i);
    if (args[0].kind != Argument::Kind::Tensor) return "first operand is not a tensor";
    if (args.size() > 2 && !scalar_of(args[2])) return "alpha is not a number";
    return std::nullopt;
  }
  if (t == "aten.add.Scalar" || t == "aten.sub.Scalar" || t == "aten.rsub.Scalar" || t == "aten.mul.Scalar" ||
      t == "aten.div.Scalar") {
    for (size_t i = 1; i < args.size(); ++i)
      if (!scalar_of(args[i])) return "scalar operand is not a number";
    return std::nullopt;
  }
  if (t == "aten.pow.Tensor_Scalar") {
    auto e = scalar_of(args[1]);
    if (!e || !supported_exponent(*e))
      return fmt::format("exponent {} is not one of 1, 2, 3, 0.5, -0.5, -1", e ? fmt::format("{}", *e) : "?");
    return std::nullopt;
  }
  if (t == "aten.gelu.default") {
    std::string approximate = string_of(args[1], n.name);
    if (approximate != "none" && approximate != "tanh") return fmt::format("gelu approximate='{}'", approximate);
    return std::nullopt;
  }
  if (t == "aten.clamp.default") {
    auto lo = scalar_of(args[1]), hi = scalar_of(args[2]);
    if ((!is_none(args[1]) && !lo) || (!is_none(args[2]) && !hi)) return "clamp bounds are not numbers";
    if (lo && hi && *lo > *hi) return "clamp with min > max";
    if ((lo && std::isnan(*lo)) || (hi && std::isnan(*hi))) return "clamp with a NaN bound";
    return std::nullopt;
  }
  if (t == "aten._softmax.default") {
    size_t r = rank(args[0]);
    auto d = wrap_dim(int_of(args[1], n.name), r);
    if (!d || *d + 1 != r) return "softmax over a dim other than the last";
    if (bool_of(args[2], n.name)) return "softmax with half_to_float";
    return std::nullopt;
  }
  if (t == "aten.mean.dim" || t == "aten.sum.dim_IntList") {
    if (!is_none(args[3])) return "reduction with a dtype";
    size_t r = rank(args[0]);
    auto dims = reduction_dims(optional_ints_of(args[1], n.name), r);
    if (!dims) return "reduction dims are out of range or repeated";
    for (size_t i = 0; i < dims->size(); ++i)
      if ((*dims)[i] != r - dims->size() + i) return "reduction over dims that are not the trailing dims";
    return std::nullopt;
  }
  if (t == "aten.native_layer_norm.default") {
    const auto& in = sizes_of(g, tensor_of(args[0], n.name));
    auto shape = ints_of(args[1], n.name);
    if (shape.empty() || shape.size() > in.size() ||
        !std::equal(shape.begin(), shape.end(), in.end() - static_cast<std::ptrdiff_t>(shape.size())))
      return "normalized_shape is not the input's trailing dims";
    for (size_t i : {size_t{2}, size_t{3}}) {
      auto w = optional_tensor_of(args[i], n.name);
      if (!w) continue;
      if (auto e = check_tensor(g, *w, true, false)) return e;
      if (sizes_of(g, *w) != shape) return "layer norm weight or bias shape differs from normalized_shape";
    }
    return std::nullopt;
  }
  if (t == "aten.permute_copy.default") {
    size_t r = rank(args[0]);
    auto dims = ints_of(args[1], n.name);
    if (dims.size() != r) return "permutation length differs from the rank";
    std::vector<bool> seen(r, false);
    for (int64_t d : dims) {
      auto w = wrap_dim(d, r);
      if (!w || seen[*w]) return "dims is not a permutation";
      seen[*w] = true;
    }
    return std::nullopt;
  }
  if (t == "dim_order_ops._clone_dim_order.default" || t == "dim_order_ops._to_dim_order_copy.default") {
    auto order = optional_ints_of(args[2], n.name);
    if (order) {
      for (size_t i = 0; i < order->size(); ++i)
        if ((*order)[i] != static_cast<int64_t>(i)) return "dim_order is not the identity";
    }
    return std::nullopt;
  }
  if (t == "aten.expand_copy.default") {
    const auto& in = sizes_of(g, tensor_of(args[0], n.name));
    const auto& out = n.output_ids().empty() ? in : sizes_of(g, n.output_ids()[0]);
    if (out.size() < in.size()) return "expand to fewer dims";
    for (size_t i = 0; i < in.size(); ++i) {
      int64_t a = in[in.size() - 1 - i], b = out[out.size() - 1 - i];
      if (a != b && a != 1) return "the output shape does not broadcast the input";
    }
    return std::nullopt;
  }
  if (t == "aten.slice_copy.Tensor") {
    if (int_of(args[4], n.name) != 1) return "slice with step other than 1";
    if (!wrap_dim(int_of(args[1], n.name), rank(args[0]))) return "slice dim out of range";
    return std::nullopt;
  }
  if (t == "aten.select_copy.int") {
    size_t r = rank(args[0]);
    auto d = wrap_dim(int_of(args[1], n.name), r);
    if (!d) return "select dim out of range";
    int64_t size = sizes_of(g, tensor_of(args[0], n.name))[*d];
    int64_t index = int_of(args[2], n.name);
    if (index < -size || index >= size) return "select index out of range";
    return std::nullopt;
  }
  if (t == "aten.split_with_sizes_copy.default") {
    size_t r = rank(args[0]);
    if (!wrap_dim(int_of(args[2], n.name), r)) return "split dim out of range";
    return std::nullopt;
  }
  if (t == "aten.cat.default") {
    auto ts = tensors_of(args[0], n.name);
    if (ts.empty()) return "cat of no tensors";
    size_t r = sizes_of(g, ts[0]).size();
    for (auto v : ts)
      if (sizes_of(g, v).size() != r) return "cat of tensors of different ranks";
    if (!wrap_dim(int_of(args[1], n.name), r)) return "cat dim out of range";
    return std::nullopt;
  }
  if (t == "aten.elu.default") {
    auto alpha = scalar_of(args[1]), scale = scalar_of(args[2]), input_scale = scalar_of(args[3]);
    if (!alpha || !scale || !input_scale) return "elu parameters are not numbers";
    if (*scale != 1 || *input_scale != 1) return "elu with scale or input_scale other than 1";
    return std::nullopt;
  }
  if (t == "aten.leaky_relu.default") {
    if (!scalar_of(args[1])) return "negative_slope is not a number";
    return std::nullopt;
  }
  if (t == "aten.constant_pad_nd.default") {
    auto pad = ints_of(args[1], n.name);
    if (pad.size() % 2 != 0 || pad.size() > 2 * rank(args[0])) return "pad list has an odd or too large length";
    for (int64_t p : pad)
      if (p < 0) return "negative padding";
    if (!scalar_of(args[2])) return "pad value is not a number";
    return std::nullopt;
  }
  if (t == "aten.convolution.default") {
    size_t r = rank(args[0]);
    if (r != 3 && r != 4) return "convolution of other than 1-D or 2-D images";
    for (int64_t p : ints_of(args[4], n.name))
      if (p < 0) return "negative padding";
    if (bool_of(args[6], n.name)) {
      // XNNPACK's deconvolution takes the output padding as an adjustment below the stride;
      // torch allows it up to the dilation too (XNNPACK's setup then fails)
      const auto stride = ints_of(args[3], n.name), out_pad = ints_of(args[7], n.name);
      for (size_t i = 0; i < out_pad.size(); ++i)
        if (out_pad[i] >= (i < stride.size() ? stride[i] : stride.empty() ? 1 : stride[0]))
          return "transposed convolution with an output padding not below its stride";
    }
    return std::nullopt;
  }
  if (t == "aten.max_pool2d_with_indices.default" || t == "aten.avg_pool2d.default") {
    if (rank(args[0]) != 4) return "pooling of a tensor of rank other than 4";
    if (auto src = pooling_nan_source(g, tensor_of(args[0], n.name)))
      return fmt::format("pooling of {}, which makes NaNs of finite inputs: eager's pooling keeps them, XNNPACK's "
                         "clamps them",
                         *src);
  }
  if (t == "aten.max_pool2d_with_indices.default") return std::nullopt;
  if (t == "aten.avg_pool2d.default") {
    for (int64_t p : ints_of(args[3], n.name))
      if (p != 0) return "average pooling with padding";
    if (bool_of(args[4], n.name)) return "average pooling with ceil_mode";
    if (!is_none(args[6])) return "average pooling with divisor_override";
    return std::nullopt;
  }
  if (t == "aten.upsample_bilinear2d.vec") {
    if (rank(args[0]) != 4) return "resize of a tensor of rank other than 4";
    auto sf = args[3].kind == Argument::Kind::Floats ? std::get<std::vector<double>>(args[3].payload)
                                                     : std::vector<double>{};
    const auto& in = sizes_of(g, tensor_of(args[0], n.name));
    for (size_t i = 0; i < sf.size() && i < 2; ++i)
      if (sf[i] * static_cast<double>(in[2 + i]) != std::floor(sf[i] * static_cast<double>(in[2 + i])))
        return "resize by a scale that does not give a whole output size";
    return std::nullopt;
  }
  return std::nullopt;
}

std::optional<std::string> check_node(const graph::Graph& g, const graph::Node& n) {
  if (!find_rule(n.target)) return fmt::format("operator '{}' has no XNNPACK lowering", n.target);
  std::vector<Argument> args = schema_arguments(n);
  bool binary_operands = is_binary(n.target);
  for (const auto& a : args)
    for (graph::ValueId v : a.tensor_ids())
      if (auto e = check_tensor(g, v, true, binary_operands)) return e;
  auto outs = n.output_ids();
  if (outs.empty()) return "node has no tensor outputs";
  if (n.target == "aten.max_pool2d_with_indices.default") outs.resize(1);  // the indices: checked by the payload
  for (graph::ValueId v : outs)
    if (auto e = check_tensor(g, v, false, false)) return e;
  return check_arguments(g, n, args);
}

}  // namespace

std::span<const SupportRule> xnnpack_support_table() { return kRules; }

bool xnnpack_supports(const graph::Graph& graph, const graph::Node& node, std::string* reason) {
  std::optional<std::string> why;
  try {
    why = check_node(graph, node);
  } catch (const Error& e) {
    why = e.what();
  }
  if (why && reason) *reason = *why;
  return !why.has_value();
}

}  // namespace kiln::backends::xnnpack
