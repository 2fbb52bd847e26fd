// The payload builder's walk (payload_builder.h): one edge node at a time,
// elementwise operators, shape changes and data movement here; products,
// reductions and norms in payload_linear.cpp, convolution and pooling in
// payload_conv.cpp.
#include "payload_builder.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numbers>

namespace kiln::backends::xnnpack::detail {

void PayloadBuilder::lower(const graph::Node& n) {
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

void PayloadBuilder::lower_binary(const graph::Node& n, XType type, const std::vector<Argument>& args, graph::ValueId out) {
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

void PayloadBuilder::lower_pow(graph::ValueId x, double e, graph::ValueId out) {
  uint32_t xi = read(x);
  if (e == 1) return unary(XType::XNNCopy, xi, write(out));
  if (e == 2) return unary(XType::XNNSquare, xi, write(out));
  if (e == 0.5) return unary(XType::XNNSquareRoot, xi, write(out));
  if (e == -0.5) {  // 1 / sqrt(x): XNNPACK's own reciprocal square root (ExecuTorch's runtime) makes NaN of 0, not inf
    uint32_t r = temp(dims(x));
    unary(XType::XNNSquareRoot, xi, r);
    return binary(XType::XNNDiv, scalar_constant(1.0), r, write(out));
  }
  if (e == -1) return binary(XType::XNNDiv, scalar_constant(1.0), xi, write(out));
  uint32_t sq = temp(dims(x));  // e == 3
  unary(XType::XNNSquare, xi, sq);
  binary(XType::XNNMultiply, sq, xi, write(out));
}

void PayloadBuilder::lower_activation(const std::string& t, const std::vector<Argument>& args, graph::ValueId x, graph::ValueId out) {
  uint32_t xi = read(x);
  if (t == "aten.elu.default") {
    auto alpha = static_cast<float>(*scalar_of(args[1]));
    return add_node(XType::XNNELU, fbx::CreateXNNELU(fb_, alpha, xi, write(out), 0).Union());
  }
  auto slope = static_cast<float>(*scalar_of(args[1]));
  add_node(XType::XNNLeakyReLU, fbx::CreateXNNLeakyReLU(fb_, slope, xi, write(out), 0).Union());
}

void PayloadBuilder::lower_gelu_tanh(graph::ValueId x, graph::ValueId out) {
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

void PayloadBuilder::lower_expand(graph::ValueId x, graph::ValueId out) {
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

}  // namespace kiln::backends::xnnpack::detail
