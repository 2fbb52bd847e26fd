// The payload builder's convolution and pooling (payload_builder.h): NCHW
// graph values, NHWC XNNPACK operators.
#include "payload_builder.h"

#include <algorithm>
#include <cstring>

namespace kiln::backends::xnnpack::detail {

std::vector<float> PayloadBuilder::floats_of(const std::vector<std::byte>& bytes) {
  std::vector<float> f(bytes.size() / sizeof(float));
  std::memcpy(f.data(), bytes.data(), f.size() * sizeof(float));
  return f;
}

void PayloadBuilder::lower_convolution(const graph::Node& n, const std::vector<Argument>& args, graph::ValueId out) {
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

void PayloadBuilder::lower_pooling(const graph::Node& n, const std::vector<Argument>& args, const std::vector<graph::ValueId>& outs) {
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

}  // namespace kiln::backends::xnnpack::detail
