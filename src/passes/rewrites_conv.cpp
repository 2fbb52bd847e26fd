// to_edge rewrites: convolutions, pooling, resizing, padding, batch/group/instance norm.
//
//   conv1d/2d/3d (int or 'same'/'valid' padding), conv_transpose1d/2d/3d -> aten.convolution
//     (an unbatched input gets a batch of one, dropped again after)
//   native_batch_norm (training=False) -> _native_batch_norm_legit_no_training
//   batch_norm / _native_batch_norm_legit_no_training in eval mode: folded into the
//     convolution that produces its input when that convolution's output feeds only the
//     norm and its weights are constants (w' = w * gamma / sqrt(var + eps), b' = (b - mean) *
//     gamma / sqrt(var + eps) + beta, as ExecuTorch's fusion pass does); otherwise the
//     x * scale + shift with per-channel constants (constant statistics), else the
//     _native_batch_norm_legit_no_training kernel
//   group_norm -> native_group_norm; instance_norm -> native_group_norm with one channel per group
//   max_pool2d -> max_pool2d_with_indices; max (with indices)/avg/adaptive-avg 1-D pooling -> the 2-D ops over [.., 1, L]; adaptive_avg_pool2d -> mean over H, W (global) or
//     _adaptive_avg_pool2d; adaptive_max_pool2d with divisible sizes -> max_pool2d_with_indices
//   upsample_{nearest,bilinear}2d.default -> their .vec forms; pixel_(un)shuffle -> view/permute/view
//   upsample_nearest{1,3}d, _upsample_nearest_exact{1,2,3}d, upsample_linear1d, upsample_bicubic2d,
//     upsample_trilinear3d -> per spatial dim, sum over taps of weight * index_select (constant indices
//     and weights from torch's coordinate rules: 1 tap nearest, 2 linear, 4 cubic)
//   im2col (unfold) -> constant_pad_nd, one index_select over the flattened padded plane, view
//   pad(mode=constant|reflect|replicate) -> constant_pad_nd / reflection_pad / replication_pad
//   prelu -> relu(x) - w * relu(-x); hardtanh (relu6) -> clamp; hardswish, hardsigmoid -> add, clamp, (mul), div
#include "lowerer.h"

#include <cmath>

namespace kiln::passes::detail {
namespace {

std::vector<int64_t> per_dim(std::vector<int64_t> v, size_t spatial, int64_t dflt) {
  if (v.empty()) v.push_back(dflt);
  if (v.size() == 1 && spatial > 1) v.assign(spatial, v[0]);
  return v;
}

// Resizing one dimension from `in` to `out` elements: out[i] = sum over taps k of w[k][i] * x[idx[k][i]],
// with torch's CPU coordinate rules (UpSample.h: float scales, 1/scale_factor when one is given).
enum class Resize { Nearest, NearestExact, Linear, Cubic };
struct ResizeTaps {
  std::vector<std::vector<int64_t>> idx;
  std::vector<std::vector<float>> w;  // empty for nearest
};

ResizeTaps resize_taps(Resize mode, int64_t in, int64_t out, std::optional<double> scale, bool align_corners) {
  const float given = scale && *scale > 0 ? static_cast<float>(1.0 / *scale) : static_cast<float>(in) / static_cast<float>(out);
  float ratio = given;  // input coordinates per output coordinate
  if (align_corners && (mode == Resize::Linear || mode == Resize::Cubic))
    ratio = out > 1 ? static_cast<float>(in - 1) / static_cast<float>(out - 1) : 0.0f;
  auto u = [](int64_t i) { return static_cast<size_t>(i); };
  ResizeTaps r;
  const int64_t taps = mode == Resize::Cubic ? 4 : mode == Resize::Linear ? 2 : 1;
  r.idx.assign(u(taps), std::vector<int64_t>(u(out)));
  if (mode == Resize::Linear || mode == Resize::Cubic) r.w.assign(u(taps), std::vector<float>(u(out)));
  for (int64_t i = 0; i < out; ++i) {
    if (mode == Resize::Nearest) {
      int64_t src = out == in ? i : out == 2 * in ? i >> 1
                                  : std::min(static_cast<int64_t>(std::floor(static_cast<float>(i) * ratio)), in - 1);
      r.idx[0][u(i)] = src;
      continue;
    }
    if (mode == Resize::NearestExact) {
      const float v = static_cast<float>((static_cast<double>(i) + 0.5) * static_cast<double>(ratio));
      r.idx[0][u(i)] = std::min(static_cast<int64_t>(std::floor(v)), in - 1);
      continue;
    }
    float src = align_corners ? ratio * static_cast<float>(i) : ratio * (static_cast<float>(i) + 0.5f) - 0.5f;
    if (mode == Resize::Linear) {
      if (!align_corners && src < 0) src = 0;
      int64_t i0 = i, i1 = i;
      float l1 = 0.0f;
      if (out != in) {
        i0 = std::min(static_cast<int64_t>(std::floor(src)), in - 1);
        l1 = std::min(std::max(src - static_cast<float>(i0), 0.0f), 1.0f);
        i1 = i0 + (i0 < in - 1 ? 1 : 0);
      }
      r.idx[0][u(i)] = i0;
      r.idx[1][u(i)] = i1;
      r.w[0][u(i)] = 1.0f - l1;
      r.w[1][u(i)] = l1;
      continue;
    }
    // cubic convolution, A = -0.75, indices clamped to the input
    const int64_t i0 = std::min(static_cast<int64_t>(std::floor(src)), in - 1);
    const float t = std::min(std::max(src - static_cast<float>(i0), 0.0f), 1.0f);
    constexpr float A = -0.75f;
    auto near = [&](float x) { return ((A + 2) * x - (A + 3)) * x * x + 1; };
    auto far = [&](float x) { return ((A * x - 5 * A) * x + 8 * A) * x - 4 * A; };
    const float c[4] = {far(t + 1.0f), near(t), near(1.0f - t), far(2.0f - t)};
    for (int64_t k = 0; k < 4; ++k) {
      r.idx[u(k)][u(i)] = std::max<int64_t>(std::min(i0 - 1 + k, in - 1), 0);
      r.w[u(k)][u(i)] = c[k];
    }
  }
  return r;
}

template <typename T>
std::vector<std::byte> as_bytes(const std::vector<T>& v) {
  std::vector<std::byte> b(v.size() * sizeof(T));
  if (!b.empty()) std::memcpy(b.data(), v.data(), b.size());
  return b;
}

}  // namespace

// A new constant value holding `bytes` (row-major).
ValueId Lowerer::constant_tensor(ScalarType dtype, std::vector<int64_t> sizes, std::vector<std::byte> bytes,
                                 std::string_view hint) {
  ValueId v = out_.graph.add_value(fresh_name(hint), contiguous(dtype, std::move(sizes)));
  out_.constants[v] = ConstantData{nullptr, std::make_shared<const std::vector<std::byte>>(std::move(bytes)),
                                   fmt::format("{} ({})", current_ ? current_->name : "kiln", hint)};
  return v;
}

// Resizes dim `dim` of x with the taps: index_select per tap, times the tap's weights (broadcast over
// the dims after `dim`), summed. Nothing when the taps are the identity.
ValueId Lowerer::resize_dim(ValueId x, size_t dim, const std::vector<std::vector<int64_t>>& idx,
                            const std::vector<std::vector<float>>& w) {
  const TensorMeta xm = meta_of(x);
  const int64_t out = static_cast<int64_t>(idx.at(0).size());
  std::vector<int64_t> sizes = xm.sizes;
  sizes[dim] = out;
  std::vector<size_t> live;
  for (size_t k = 0; k < idx.size(); ++k) {
    bool zero = !w.empty();
    if (!w.empty())
      for (float f : w[k]) zero = zero && f == 0.0f;
    if (!zero) live.push_back(k);
  }
  if (live.empty()) live.push_back(0);
  if (live.size() == 1 && out == xm.sizes[dim]) {
    bool identity = true;
    for (int64_t i = 0; i < out; ++i) identity = identity && idx[live[0]][static_cast<size_t>(i)] == i;
    if (!w.empty())
      for (float f : w[live[0]]) identity = identity && f == 1.0f;
    if (identity) return x;
  }
  std::vector<int64_t> wshape(xm.sizes.size() - dim, 1);
  wshape[0] = out;
  std::optional<ValueId> acc;
  for (size_t k : live) {
    ValueId iv = constant_tensor(ScalarType::Long, {out}, as_bytes(idx[k]), "resize_index");
    ValueId g = emit("aten.index_select.default",
                     {NA("self", tensor_arg(x)), NA("dim", int_arg(static_cast<int64_t>(dim))), NA("index", tensor_arg(iv))},
                     contiguous(xm.dtype, sizes), "resize_gather");
    if (!w.empty()) {
      bool ones = true;
      for (float f : w[k]) ones = ones && f == 1.0f;
      if (!ones) {
        ValueId wv = constant_tensor(ScalarType::Float, wshape, as_bytes(w[k]), "resize_weight");
        g = emit("aten.mul.Tensor", {NA("self", tensor_arg(g)), NA("other", tensor_arg(wv))}, contiguous(xm.dtype, sizes),
                 "resize_tap");
      }
    }
    acc = acc ? emit("aten.add.Tensor", {NA("self", tensor_arg(*acc)), NA("other", tensor_arg(g))},
                     contiguous(xm.dtype, sizes), "resize_sum")
              : g;
  }
  return *acc;
}

bool Lowerer::lower_conv(const Node& n) {
  const std::string& t = n.target;
  auto ints_or = [&](const char* name, std::vector<int64_t> dflt) {
    const Argument* a = opt(n, name);
    if (!a || a->kind == Argument::Kind::None) return dflt;
    return ints_in(n, name);
  };
  auto float_or = [&](const char* name, double dflt) { return number_in(n, name, dflt); };
  auto opt_tensor_arg = [](std::optional<ValueId> v) { return v ? tensor_arg(*v) : Argument::none(); };
  auto emit_conv = [&](ValueId x, ValueId w, std::optional<ValueId> b, std::vector<int64_t> stride,
                       std::vector<int64_t> padding, std::vector<int64_t> dilation, bool transposed,
                       std::vector<int64_t> output_padding, int64_t groups, const TensorMeta& m) -> ValueId {
    // A float16 / bfloat16 transposed convolution: written in float32 and rounded once (what torch's CPU kernel and
    // kiln's compute); ExecuTorch's float16 transposed-convolution kernel misses eager by more than float16's
    // tolerance (a 2-ulp error at |y| ~ 200 in the op_db sweep, on its own program too)
    if (transposed && (m.dtype == ScalarType::Half || m.dtype == ScalarType::BFloat16)) {
      TensorMeta wide = m;
      wide.dtype = ScalarType::Float;
      std::optional<ValueId> wb;
      if (b) wb = convert(*b, ScalarType::Float);
      ValueId y = emit("aten.convolution.default",
                       {NA("input", tensor_arg(convert(x, ScalarType::Float))),
                        NA("weight", tensor_arg(convert(w, ScalarType::Float))), NA("bias", opt_tensor_arg(wb)),
                        NA("stride", ints_arg(std::move(stride))), NA("padding", ints_arg(std::move(padding))),
                        NA("dilation", ints_arg(std::move(dilation))), NA("transposed", bool_arg(true)),
                        NA("output_padding", ints_arg(std::move(output_padding))), NA("groups", int_arg(groups))},
                       wide);
      return convert(y, m.dtype);
    }
    return emit("aten.convolution.default",
                {NA("input", tensor_arg(x)), NA("weight", tensor_arg(w)), NA("bias", opt_tensor_arg(b)),
                 NA("stride", ints_arg(std::move(stride))), NA("padding", ints_arg(std::move(padding))),
                 NA("dilation", ints_arg(std::move(dilation))), NA("transposed", bool_arg(transposed)),
                 NA("output_padding", ints_arg(std::move(output_padding))), NA("groups", int_arg(groups))},
                m);
  };
  // An unbatched input ([C, spatial...]) gets a batch of one; the result drops it again.
  auto batched = [&](ValueId& x, size_t spatial) {
    const auto& xm = meta_of(x);
    if (xm.sizes.size() == spatial + 2) return false;
    if (xm.sizes.size() != spatial + 1) unsupported(n, "convolution input of a rank other than the weight's (or one less)");
    std::vector<int64_t> sizes = xm.sizes;
    sizes.insert(sizes.begin(), 1);
    x = view(x, sizes);
    return true;
  };
  auto conv_meta = [&](bool unbatched) {
    TensorMeta m = out_meta(n);
    if (!unbatched) return m;
    std::vector<int64_t> sizes = m.sizes;
    sizes.insert(sizes.begin(), 1);
    return contiguous(m.dtype, sizes);
  };
  auto bind_conv = [&](ValueId y, bool unbatched) { bind(n, unbatched ? view(y, out_meta(n).sizes) : y); };

  // ---- convolutions
  if (t == "aten.conv1d.default" || t == "aten.conv2d.default" || t == "aten.conv3d.default" ||
      t == "aten.conv1d.padding" || t == "aten.conv2d.padding" || t == "aten.conv3d.padding") {
    ValueId x = tensor_in(n, "input");
    ValueId w = tensor_in(n, "weight");
    auto b = opt_tensor_in(n, "bias");
    const auto& wm = meta_of(w);
    if (wm.sizes.size() < 3) unsupported(n, "convolution weight of rank < 3");
    const size_t spatial = wm.sizes.size() - 2;
    const bool unbatched = batched(x, spatial);
    std::vector<int64_t> stride = per_dim(ints_or("stride", {1}), spatial, 1);
    std::vector<int64_t> dilation = per_dim(ints_or("dilation", {1}), spatial, 1);
    std::vector<int64_t> padding;
    const Argument* pa = opt(n, "padding");
    if (pa && pa->kind == Argument::Kind::String) {
      const std::string& mode = std::get<std::string>(pa->payload);
      if (mode == "valid") {
        padding.assign(spatial, 0);
      } else if (mode == "same") {
        // total padding d*(k-1) per dim; an odd total puts the extra element at the end (as torch)
        std::vector<int64_t> extra(spatial, 0);
        bool any_extra = false;
        for (size_t d = 0; d < spatial; ++d) {
          if (stride[d] != 1) unsupported(n, "padding='same' with a stride other than 1");
          const int64_t total = dilation[d] * (wm.sizes[2 + d] - 1);
          padding.push_back(total / 2);
          extra[d] = total % 2;
          any_extra = any_extra || extra[d] != 0;
        }
        if (any_extra) {
          std::vector<int64_t> pad;  // last dim first: (before, after) pairs
          std::vector<int64_t> sizes = meta_of(x).sizes;
          for (size_t d = spatial; d-- > 0;) {
            pad.push_back(0);
            pad.push_back(extra[d]);
            sizes[2 + d] += extra[d];
          }
          x = emit("aten.constant_pad_nd.default",
                   {NA("self", tensor_arg(x)), NA("pad", ints_arg(pad)), NA("value", float_arg(0.0))},
                   contiguous(meta_of(x).dtype, sizes), "same_pad");
        }
      } else {
        unsupported(n, fmt::format("convolution padding mode '{}'", mode));
      }
    } else {
      padding = per_dim(ints_or("padding", {0}), spatial, 0);
    }
    bind_conv(emit_conv(x, w, b, stride, padding, dilation, false, std::vector<int64_t>(spatial, 0),
                        int_in(n, "groups", 1), conv_meta(unbatched)),
              unbatched);
    return true;
  }
  if (t == "aten.conv_transpose1d.default" || t == "aten.conv_transpose2d.input" ||
      t == "aten.conv_transpose3d.input") {
    ValueId x = tensor_in(n, "input");
    ValueId w = tensor_in(n, "weight");
    auto b = opt_tensor_in(n, "bias");
    if (meta_of(w).sizes.size() < 3) unsupported(n, "convolution weight of rank < 3");
    const size_t spatial = meta_of(w).sizes.size() - 2;
    const bool unbatched = batched(x, spatial);
    bind_conv(emit_conv(x, w, b, per_dim(ints_or("stride", {1}), spatial, 1), per_dim(ints_or("padding", {0}), spatial, 0),
                        per_dim(ints_or("dilation", {1}), spatial, 1), true,
                        per_dim(ints_or("output_padding", {0}), spatial, 0), int_in(n, "groups", 1),
                        conv_meta(unbatched)),
              unbatched);
    return true;
  }
  if (t == "aten._convolution.default") {
    std::vector<NamedArgument> args;
    for (const char* name : {"input", "weight", "bias", "stride", "padding", "dilation", "transposed",
                             "output_padding", "groups"})
      args.push_back(NA(name, remap(arg(n, name))));
    bind(n, emit("aten.convolution.default", std::move(args), out_meta(n)));
    return true;
  }

  // ---- batch norm (eval): fold into the producing convolution, or the kernel
  if (t == "aten.batch_norm.default" || t == "aten._native_batch_norm_legit_no_training.default") {
    if (t == "aten.batch_norm.default" && int_in(n, "training", 0) != 0)
      unsupported(n, "batch norm in training mode; export the model in eval() mode");
    ValueId x = tensor_in(n, "input");
    auto gamma = opt_tensor_in(n, "weight");
    auto beta = opt_tensor_in(n, "bias");
    ValueId mean = tensor_in(n, "running_mean");
    ValueId var = tensor_in(n, "running_var");
    const double eps = float_or("eps", 1e-5);
    if (try_fold_batch_norm(n, x, gamma, beta, mean, var, eps)) return true;
    const TensorMeta xm = meta_of(x);  // a copy: batch_norm_scale_shift adds values (the graph's storage moves)
    if (auto ss = batch_norm_scale_shift(x, gamma, beta, mean, var, eps)) {  // x * scale + shift, per channel
      ValueId y = emit("aten.mul.Tensor", {NA("self", tensor_arg(x)), NA("other", tensor_arg(ss->first))},
                       contiguous(xm), "bn_scale");
      y = emit("aten.add.Tensor", {NA("self", tensor_arg(y)), NA("other", tensor_arg(ss->second))}, contiguous(xm));
      bind(n, y);
      return true;
    }
    auto outs = emit_raw("aten._native_batch_norm_legit_no_training.default",
                         {NA("input", tensor_arg(x)), NA("weight", opt_tensor_arg(gamma)),
                          NA("bias", opt_tensor_arg(beta)), NA("running_mean", tensor_arg(mean)),
                          NA("running_var", tensor_arg(var)), NA("momentum", float_arg(float_or("momentum", 0.1))),
                          NA("eps", float_arg(eps))},
                         {contiguous(xm), contiguous(xm.dtype, {0}), contiguous(xm.dtype, {0})}, "batch_norm");
    bind_all(n, outs);
    return true;
  }

  // native_batch_norm in eval (training=False): the no-training kernel, all three outputs (the saved
  // statistics are empty in eval, as eager's)
  // (and training=True without running statistics: the batch's statistics, _native_batch_norm_legit.no_stats)
  if (t == "aten.native_batch_norm.default") {
    ValueId x = tensor_in(n, "input");
    auto mean = opt_tensor_in(n, "running_mean");
    auto var = opt_tensor_in(n, "running_var");
    std::vector<TensorMeta> metas{out_meta(n)};
    for (size_t i = 1; i < source_outputs(n).size(); ++i) metas.push_back(out_meta(n, i));
    const bool training = int_in(n, "training", 0) != 0;
    if (training && !mean && !var) {
      const int64_t c = meta_of(x).sizes.size() > 1 ? meta_of(x).sizes[1] : 1;
      while (metas.size() < 3) metas.push_back(contiguous(meta_of(x).dtype, {c}));
      bind_all(n, emit_raw("aten._native_batch_norm_legit.no_stats",
                           {NA("input", tensor_arg(x)), NA("weight", opt_tensor_arg(opt_tensor_in(n, "weight"))),
                            NA("bias", opt_tensor_arg(opt_tensor_in(n, "bias"))), NA("training", bool_arg(true)),
                            NA("momentum", float_arg(float_or("momentum", 0.1))), NA("eps", float_arg(float_or("eps", 1e-5)))},
                           std::move(metas), "batch_norm"));
      return true;
    }
    if (training)
      unsupported(n, "batch norm in training mode with running statistics; export the model in eval() mode");
    if (!mean || !var) unsupported(n, "batch norm in eval mode without running statistics");
    while (metas.size() < 3) metas.push_back(contiguous(meta_of(x).dtype, {0}));
    auto outs = emit_raw("aten._native_batch_norm_legit_no_training.default",
                         {NA("input", tensor_arg(x)), NA("weight", opt_tensor_arg(opt_tensor_in(n, "weight"))),
                          NA("bias", opt_tensor_arg(opt_tensor_in(n, "bias"))), NA("running_mean", tensor_arg(*mean)),
                          NA("running_var", tensor_arg(*var)), NA("momentum", float_arg(float_or("momentum", 0.1))),
                          NA("eps", float_arg(float_or("eps", 1e-5)))},
                         std::move(metas), "batch_norm");
    bind_all(n, outs);
    return true;
  }

  // ---- group norm, instance norm
  if (t == "aten.group_norm.default" || t == "aten.instance_norm.default") {
    ValueId x = tensor_in(n, "input");
    const auto& xm = meta_of(x);
    if (xm.sizes.size() < 2) unsupported(n, "normalization of a tensor of rank < 2");
    const int64_t N = xm.sizes[0], C = xm.sizes[1];
    const int64_t HxW = xm.numel() / std::max<int64_t>(1, N * C);
    auto w = opt_tensor_in(n, "weight");
    auto b = opt_tensor_in(n, "bias");
    int64_t groups = C;
    if (t == "aten.group_norm.default") {
      groups = int_in(n, "num_groups");
    } else if (int_in(n, "use_input_stats", 1) == 0) {  // running statistics: a batch norm in eval
      ValueId mean = tensor_in(n, "running_mean");
      ValueId var = tensor_in(n, "running_var");
      auto outs = emit_raw("aten._native_batch_norm_legit_no_training.default",
                           {NA("input", tensor_arg(x)), NA("weight", opt_tensor_arg(w)), NA("bias", opt_tensor_arg(b)),
                            NA("running_mean", tensor_arg(mean)), NA("running_var", tensor_arg(var)),
                            NA("momentum", float_arg(0.1)), NA("eps", float_arg(float_or("eps", 1e-5)))},
                           {contiguous(xm), contiguous(xm.dtype, {0}), contiguous(xm.dtype, {0})}, "instance_norm");
      bind(n, outs[0]);
      return true;
    }
    if (groups < 1 || C % groups != 0) unsupported(n, "channels are not divisible by the number of groups");
    auto outs = emit_raw("aten.native_group_norm.default",
                         {NA("input", tensor_arg(x)), NA("weight", opt_tensor_arg(w)), NA("bias", opt_tensor_arg(b)),
                          NA("N", int_arg(N)), NA("C", int_arg(C)), NA("HxW", int_arg(HxW)), NA("group", int_arg(groups)),
                          NA("eps", float_arg(float_or("eps", 1e-5)))},
                         {contiguous(xm), contiguous(xm.dtype, {N, groups}), contiguous(xm.dtype, {N, groups})},
                         "group_norm");
    bind(n, outs[0]);
    return true;
  }

  // ---- pooling
  if (t == "aten.max_pool2d.default" || t == "aten.max_pool2d_with_indices.default") {
    ValueId x = tensor_in(n, "self");
    TensorMeta m = out_meta(n);
    TensorMeta im = m;
    im.dtype = ScalarType::Long;
    auto outs = emit_raw("aten.max_pool2d_with_indices.default",
                         {NA("self", tensor_arg(x)), NA("kernel_size", ints_arg(ints_in(n, "kernel_size"))),
                          NA("stride", ints_arg(ints_or("stride", {}))), NA("padding", ints_arg(ints_or("padding", {0}))),
                          NA("dilation", ints_arg(ints_or("dilation", {1}))),
                          NA("ceil_mode", bool_arg(int_in(n, "ceil_mode", 0) != 0))},
                         {m, im}, "max_pool");
    bind_all(n, outs);
    return true;
  }
  if (t == "aten.avg_pool2d.default") {  // int[2] arguments as lists (the schema's defaults are plain ints)
    Argument divisor = Argument::none();
    if (const Argument* a = opt(n, "divisor_override"); a && a->kind == Argument::Kind::Int) divisor = *a;
    bind(n, emit("aten.avg_pool2d.default",
                 {NA("self", tensor_arg(tensor_in(n, "self"))), NA("kernel_size", ints_arg(ints_in(n, "kernel_size"))),
                  NA("stride", ints_arg(ints_or("stride", {}))), NA("padding", ints_arg(ints_or("padding", {0}))),
                  NA("ceil_mode", bool_arg(int_in(n, "ceil_mode", 0) != 0)),
                  NA("count_include_pad", bool_arg(int_in(n, "count_include_pad", 1) != 0)),
                  NA("divisor_override", divisor)},
                 out_meta(n)));
    return true;
  }
  if (t == "aten.adaptive_avg_pool2d.default" || t == "aten._adaptive_avg_pool2d.default") {
    ValueId x = tensor_in(n, "self");
    TensorMeta m = out_meta(n);
    const size_t rank = meta_of(x).sizes.size();
    if (rank < 3) unsupported(n, "adaptive pooling of a tensor of rank < 3");
    if (m.sizes[rank - 1] == 1 && m.sizes[rank - 2] == 1) {  // global average pooling
      bind(n, emit("aten.mean.dim", {NA("self", tensor_arg(x)), NA("dim", ints_arg({-2, -1})),
                                     NA("keepdim", bool_arg(true))}, m));
      return true;
    }
    bind(n, emit("aten._adaptive_avg_pool2d.default",
                 {NA("self", tensor_arg(x)), NA("output_size", ints_arg({m.sizes[rank - 2], m.sizes[rank - 1]}))}, m));
    return true;
  }
  // 1-D pooling: the 2-D kernels over [.., 1, L]
  if (t == "aten.max_pool1d.default" || t == "aten.max_pool1d_with_indices.default" || t == "aten.avg_pool1d.default" ||
      t == "aten.adaptive_avg_pool1d.default") {
    ValueId x = tensor_in(n, "self");
    const auto& xm = meta_of(x);
    TensorMeta m = out_meta(n);
    if (xm.sizes.size() < 2) unsupported(n, "1-D pooling of a tensor of rank < 2");
    auto with_h = [](std::vector<int64_t> sizes) {
      sizes.insert(sizes.end() - 1, 1);
      return sizes;
    };
    ValueId x4 = view(x, with_h(xm.sizes));
    TensorMeta m4 = contiguous(m.dtype, with_h(m.sizes));
    auto first = [&](const char* name, int64_t dflt) {
      std::vector<int64_t> v = ints_or(name, {});
      return v.empty() ? dflt : v[0];
    };
    ValueId y;
    if (t == "aten.adaptive_avg_pool1d.default") {
      y = m.sizes.back() == 1
              ? emit("aten.mean.dim", {NA("self", tensor_arg(x4)), NA("dim", ints_arg({-1})), NA("keepdim", bool_arg(true))},
                     m4)
              : emit("aten._adaptive_avg_pool2d.default",
                     {NA("self", tensor_arg(x4)), NA("output_size", ints_arg({1, m.sizes.back()}))}, m4);
    } else {
      const int64_t k = first("kernel_size", 1);
      const int64_t stride = first("stride", k), pad = first("padding", 0);
      const bool ceil = int_in(n, "ceil_mode", 0) != 0;
      if (t == "aten.max_pool1d.default" || t == "aten.max_pool1d_with_indices.default") {
        TensorMeta im = m4;
        im.dtype = ScalarType::Long;
        auto outs = emit_raw("aten.max_pool2d_with_indices.default",
                             {NA("self", tensor_arg(x4)), NA("kernel_size", ints_arg({1, k})),
                              NA("stride", ints_arg({1, stride})), NA("padding", ints_arg({0, pad})),
                              NA("dilation", ints_arg({1, first("dilation", 1)})), NA("ceil_mode", bool_arg(ceil))},
                             {m4, im}, "max_pool");
        y = outs[0];
        // over [.., 1, L] the flat index h * L + w is the 1-D index
        if (t == "aten.max_pool1d_with_indices.default" && source_outputs(n).size() > 1)
          bind(n, view(outs[1], out_meta(n, 1).sizes), 1);
      } else {
        y = emit("aten.avg_pool2d.default",
                 {NA("self", tensor_arg(x4)), NA("kernel_size", ints_arg({1, k})), NA("stride", ints_arg({1, stride})),
                  NA("padding", ints_arg({0, pad})), NA("ceil_mode", bool_arg(ceil)),
                  NA("count_include_pad", bool_arg(int_in(n, "count_include_pad", 1) != 0)),
                  NA("divisor_override", Argument::none())},
                 m4);
      }
    }
    bind(n, view(y, m.sizes));
    return true;
  }
  if (t == "aten.adaptive_max_pool2d.default") {
    ValueId x = tensor_in(n, "self");
    const auto& xm = meta_of(x);
    TensorMeta m = out_meta(n);
    const size_t rank = xm.sizes.size();
    if (rank < 3) unsupported(n, "adaptive pooling of a tensor of rank < 3");
    std::vector<int64_t> k;
    for (size_t d = rank - 2; d < rank; ++d) {
      if (xm.sizes[d] % m.sizes[d] != 0)
        unsupported(n, "adaptive max pooling whose output size does not divide the input size");
      k.push_back(xm.sizes[d] / m.sizes[d]);
    }
    TensorMeta im = m;
    im.dtype = ScalarType::Long;
    auto outs = emit_raw("aten.max_pool2d_with_indices.default",
                         {NA("self", tensor_arg(x)), NA("kernel_size", ints_arg(k)), NA("stride", ints_arg(k)),
                          NA("padding", ints_arg({0})), NA("dilation", ints_arg({1})), NA("ceil_mode", bool_arg(false))},
                         {m, im}, "max_pool");
    bind_all(n, outs);
    return true;
  }

  // ---- resizing

  // Bilinear resizing of an integer tensor: eager's uint8 kernel computes with int16 fixed-point weights and
  // rounds between its two passes, which neither kiln's kernel nor ExecuTorch's reproduces (ExecuTorch's uint8
  // kernel gives other numbers, on its own program too), so kiln refuses it rather than write a wrong program.
  if ((t == "aten.upsample_bilinear2d.default" || t == "aten.upsample_bilinear2d.vec") &&
      !is_floating_type(meta_of(tensor_in(n, t.ends_with(".vec") ? "input" : "self")).dtype))
    unsupported(n, "bilinear resizing of an integer tensor (eager's uint8 kernel rounds int16 fixed-point weights "
                   "between its passes; no runtime kernel here reproduces it)");
  if (t == "aten.upsample_nearest2d.default" || t == "aten.upsample_bilinear2d.default") {
    ValueId x = tensor_in(n, "self");
    const bool bilinear = t == "aten.upsample_bilinear2d.default";
    const Argument* sh = opt(n, "scales_h");
    const Argument* sw = opt(n, "scales_w");
    std::vector<NamedArgument> args{NA("input", tensor_arg(x))};
    if (sh && sw && sh->kind == Argument::Kind::Float && sw->kind == Argument::Kind::Float) {
      args.push_back(NA("output_size", Argument::none()));
      if (bilinear) args.push_back(NA("align_corners", bool_arg(int_in(n, "align_corners") != 0)));
      args.push_back(NA("scale_factors", {Argument::Kind::Floats, std::vector<double>{std::get<double>(sh->payload),
                                                                                      std::get<double>(sw->payload)}}));
    } else {
      args.push_back(NA("output_size", ints_arg(ints_in(n, "output_size"))));
      if (bilinear) args.push_back(NA("align_corners", bool_arg(int_in(n, "align_corners") != 0)));
      args.push_back(NA("scale_factors", Argument::none()));
    }
    bind(n, emit(bilinear ? "aten.upsample_bilinear2d.vec" : "aten.upsample_nearest2d.vec", std::move(args), out_meta(n)));
    return true;
  }
  // nearest(-exact) 1-D/3-D and exact 2-D, linear, bicubic, trilinear: separable, one dim at a time
  // (index_select of constant indices, times constant weights, summed; what ExecuTorch decomposes them into)
  {
    static const std::map<std::string, std::pair<Resize, int>> kResize{
        {"upsample_nearest1d", {Resize::Nearest, 1}},          {"upsample_nearest3d", {Resize::Nearest, 3}},
        {"_upsample_nearest_exact1d", {Resize::NearestExact, 1}}, {"_upsample_nearest_exact2d", {Resize::NearestExact, 2}},
        {"_upsample_nearest_exact3d", {Resize::NearestExact, 3}}, {"upsample_linear1d", {Resize::Linear, 1}},
        {"upsample_bicubic2d", {Resize::Cubic, 2}},            {"upsample_trilinear3d", {Resize::Linear, 3}}};
    const std::string base = t.starts_with("aten.") ? t.substr(5, t.rfind('.') - 5) : std::string();
    const bool vec = t.ends_with(".vec");
    auto it = kResize.find(base);
    if (it != kResize.end() && (vec || t.ends_with(".default"))) {
      const auto [mode, spatial] = it->second;
      ValueId x = tensor_in(n, vec ? "input" : "self");
      const TensorMeta xm = meta_of(x);
      TensorMeta m = out_meta(n);
      const size_t rank = xm.sizes.size();
      if (rank < static_cast<size_t>(spatial) + 1 || m.sizes.size() != rank)
        unsupported(n, "resize input of too small a rank");
      // float16 / bfloat16 linear and cubic resizing: the taps weighted and summed in float32, rounded once (as
      // eager's CPU kernels compute them); nearest modes only select
      const bool interpolates = mode == Resize::Linear || mode == Resize::Cubic;
      const bool half = xm.dtype == ScalarType::Half || xm.dtype == ScalarType::BFloat16;
      if (interpolates && xm.dtype != ScalarType::Float && !half)
        unsupported(n, "linear/cubic resizing of a tensor other than float32, float16 or bfloat16 (its tap weights are "
                       "float32: a float64 resize would lose its precision)");
      bool align = false;
      if (const Argument* a = opt(n, "align_corners"); a && a->kind == Argument::Kind::Bool)
        align = std::get<bool>(a->payload);
      std::vector<std::optional<double>> scales(static_cast<size_t>(spatial));
      if (vec) {
        if (const Argument* a = opt(n, "scale_factors"); a && a->kind == Argument::Kind::Floats) {
          const auto& f = std::get<std::vector<double>>(a->payload);
          for (size_t d = 0; d < scales.size() && d < f.size(); ++d) scales[d] = f[f.size() == 1 ? 0 : d];
        }
      } else {
        static const char* k1[] = {"scales"};
        static const char* k2[] = {"scales_h", "scales_w"};
        static const char* k3[] = {"scales_d", "scales_h", "scales_w"};
        const char** names = spatial == 1 ? k1 : spatial == 2 ? k2 : k3;
        for (size_t d = 0; d < scales.size(); ++d)
          if (const Argument* a = opt(n, names[d]); a && a->kind == Argument::Kind::Float) scales[d] = std::get<double>(a->payload);
      }
      ValueId y = interpolates && half ? convert(x, ScalarType::Float) : x;
      for (size_t d = 0; d < static_cast<size_t>(spatial); ++d) {
        const size_t dim = rank - static_cast<size_t>(spatial) + d;
        ResizeTaps taps = resize_taps(mode, xm.sizes[dim], m.sizes[dim], scales[d], align);
        y = resize_dim(y, dim, taps.idx, taps.w);
      }
      bind(n, interpolates && half ? convert(y, xm.dtype) : y);
      return true;
    }
  }
  // unfold (im2col): pad, then one index_select of the window elements over the flattened padded plane
  if (t == "aten.im2col.default") {
    ValueId x = tensor_in(n, "self");
    const TensorMeta xm = meta_of(x);
    const size_t rank = xm.sizes.size();
    if (rank != 3 && rank != 4) unsupported(n, "im2col of a tensor of rank other than 3 or 4");
    auto two = [&](const char* name) {
      std::vector<int64_t> v = ints_in(n, name);
      if (v.size() == 1) v.push_back(v[0]);
      if (v.size() != 2) unsupported(n, fmt::format("im2col argument '{}' is not two ints", name));
      return v;
    };
    const auto k = two("kernel_size"), dil = two("dilation"), pad = two("padding"), st = two("stride");
    const int64_t H = xm.sizes[rank - 2], W = xm.sizes[rank - 1];
    const int64_t Hp = H + 2 * pad[0], Wp = W + 2 * pad[1];
    const int64_t OH = (Hp - dil[0] * (k[0] - 1) - 1) / st[0] + 1, OW = (Wp - dil[1] * (k[1] - 1) - 1) / st[1] + 1;
    if (OH < 1 || OW < 1) unsupported(n, "im2col with no output positions");
    ValueId p = x;
    std::vector<int64_t> lead(xm.sizes.begin(), xm.sizes.end() - 2);
    if (pad[0] != 0 || pad[1] != 0) {
      std::vector<int64_t> ps = lead;
      ps.push_back(Hp);
      ps.push_back(Wp);
      p = emit("aten.constant_pad_nd.default",
               {NA("self", tensor_arg(x)), NA("pad", ints_arg({pad[1], pad[1], pad[0], pad[0]})), NA("value", float_arg(0.0))},
               contiguous(xm.dtype, ps), "im2col_pad");
    }
    std::vector<int64_t> flat = lead;
    flat.push_back(Hp * Wp);
    p = view(p, flat);
    std::vector<int64_t> idx;
    idx.reserve(static_cast<size_t>(k[0] * k[1] * OH * OW));
    for (int64_t ki = 0; ki < k[0]; ++ki)
      for (int64_t kj = 0; kj < k[1]; ++kj)
        for (int64_t oh = 0; oh < OH; ++oh)
          for (int64_t ow = 0; ow < OW; ++ow) idx.push_back((oh * st[0] + ki * dil[0]) * Wp + ow * st[1] + kj * dil[1]);
    const int64_t count = static_cast<int64_t>(idx.size());
    ValueId iv = constant_tensor(ScalarType::Long, {count}, as_bytes(idx), "im2col_index");
    std::vector<int64_t> gs = lead;
    gs.push_back(count);
    ValueId g = emit("aten.index_select.default",
                     {NA("self", tensor_arg(p)), NA("dim", int_arg(static_cast<int64_t>(lead.size()))),
                      NA("index", tensor_arg(iv))},
                     contiguous(xm.dtype, gs), "im2col_gather");
    bind(n, view(g, out_meta(n).sizes));
    return true;
  }
  if (t == "aten.pixel_shuffle.default") {  // view, permute, view (as ExecuTorch decomposes it)
    ValueId x = tensor_in(n, "self");
    const auto& xm = meta_of(x);
    const int64_t r = int_in(n, "upscale_factor");
    if (xm.sizes.size() != 4 || r < 1) unsupported(n, "pixel_shuffle of a tensor of rank other than 4");
    const int64_t B = xm.sizes[0], C = xm.sizes[1], H = xm.sizes[2], W = xm.sizes[3];
    ValueId v = view(x, {B, C / (r * r), r, r, H, W});
    ValueId p = permute(v, {0, 1, 4, 2, 5, 3});
    bind(n, view(p, out_meta(n).sizes));
    return true;
  }
  if (t == "aten.pixel_unshuffle.default") {
    ValueId x = tensor_in(n, "self");
    const auto& xm = meta_of(x);
    const int64_t r = int_in(n, "downscale_factor");
    if (xm.sizes.size() != 4) unsupported(n, "pixel_unshuffle of a tensor of rank other than 4");
    const int64_t B = xm.sizes[0], C = xm.sizes[1], H = xm.sizes[2], W = xm.sizes[3];
    ValueId v = view(x, {B, C, H / r, r, W / r, r});
    ValueId p = permute(v, {0, 1, 3, 5, 2, 4});
    bind(n, view(p, out_meta(n).sizes));
    return true;
  }

  // ---- padding
  if (t == "aten.pad.default") {
    ValueId x = tensor_in(n, "self");
    std::vector<int64_t> pad = ints_in(n, "pad");
    std::string mode = "constant";
    if (const Argument* a = opt(n, "mode"); a && a->kind == Argument::Kind::String) mode = std::get<std::string>(a->payload);
    TensorMeta m = out_meta(n);
    if (mode == "constant") {
      Argument value = float_arg(0.0);
      if (const Argument* a = opt(n, "value"); a && a->kind != Argument::Kind::None) value = *a;
      bind(n, emit("aten.constant_pad_nd.default", {NA("self", tensor_arg(x)), NA("pad", ints_arg(pad)),
                                                    NA("value", value)}, m));
      return true;
    }
    if (mode != "reflect" && mode != "replicate")
      unsupported(n, fmt::format("pad mode '{}' (kiln runs constant, reflect and replicate)", mode));
    if (pad.empty() || pad.size() % 2 != 0 || pad.size() / 2 > meta_of(x).sizes.size())
      unsupported(n, fmt::format("{} padding of {} values for a tensor of rank {}", mode, pad.size(),
                                 meta_of(x).sizes.size()));
    // the last one or two dims by the kernels both runtimes have; each dim before them (ReflectionPad3d and the
    // like) by an index_select of the padded dim with constant indices: src = i - before, reflected about the
    // ends (reflect) or clamped to them (replicate)
    const size_t kernel_dims = std::min<size_t>(pad.size() / 2, 2);
    std::vector<int64_t> kpad(pad.begin(), pad.begin() + static_cast<std::ptrdiff_t>(2 * kernel_dims));
    std::vector<int64_t> sizes = meta_of(x).sizes;
    const size_t rank = sizes.size();
    for (size_t j = 0; j < kernel_dims; ++j) sizes[rank - 1 - j] += kpad[2 * j] + kpad[2 * j + 1];
    std::string target = fmt::format("aten.{}_pad{}d.default", mode == "reflect" ? "reflection" : "replication",
                                     kernel_dims);
    if (kernel_dims == pad.size() / 2) {
      bind(n, emit(target, {NA("self", tensor_arg(x)), NA("padding", ints_arg(kpad))}, m));
      return true;
    }
    {  // as a batch of [H, W] planes (the kernels take rank 3 or 4), then viewed back
      int64_t planes = 1;
      for (size_t d = 0; d + 2 < rank; ++d) planes *= sizes[d];
      const std::vector<int64_t> in = meta_of(x).sizes;
      x = emit(target, {NA("self", tensor_arg(view(x, {planes, in[rank - 2], in[rank - 1]}))),
                        NA("padding", ints_arg(kpad))},
               contiguous(m.dtype, {planes, sizes[rank - 2], sizes[rank - 1]}), "pad");
      x = view(x, sizes);
    }
    for (size_t j = kernel_dims; j < pad.size() / 2; ++j) {
      const size_t d = rank - 1 - j;
      const int64_t D = sizes[d], before = pad[2 * j], len = D + before + pad[2 * j + 1];
      if (mode == "reflect" && (pad[2 * j] >= D || pad[2 * j + 1] >= D))
        unsupported(n, "reflect padding as large as the dim it pads");
      std::vector<std::byte> bytes(static_cast<size_t>(std::max<int64_t>(len, 0)) * sizeof(int64_t));
      for (int64_t i = 0; i < len; ++i) {
        int64_t src = i - before;
        if (mode == "reflect") src = src < 0 ? -src : src >= D ? 2 * (D - 1) - src : src;
        else src = std::clamp<int64_t>(src, 0, D - 1);
        std::memcpy(bytes.data() + i * 8, &src, 8);
      }
      ValueId idx = constant_tensor(ScalarType::Long, {len}, std::move(bytes), "pad_index");
      sizes[d] = len;
      x = emit("aten.index_select.default", {NA("self", tensor_arg(x)), NA("dim", int_arg(static_cast<int64_t>(d))),
                                             NA("index", tensor_arg(idx))},
               j + 1 == pad.size() / 2 ? m : contiguous(m.dtype, sizes), "pad");
    }
    bind(n, x);
    return true;
  }

  // ---- activations of CNNs
  if (t == "aten.hardswish.default" || t == "aten.hardsigmoid.default") {
    // relu6(x + 3) / 6 (times x): ops every runtime has (ExecuTorch's portable library has no
    // hardswish/hardsigmoid kernels; the XNNPACK partitioner delegates the pieces)
    ValueId x = tensor_in(n, "self");
    TensorMeta m = out_meta(n);
    ValueId s = emit("aten.add.Scalar", {NA("self", tensor_arg(x)), NA("other", float_arg(3.0))}, m, "plus3");
    s = emit("aten.clamp.default", {NA("self", tensor_arg(s)), NA("min", float_arg(0.0)), NA("max", float_arg(6.0))}, m,
             "relu6");
    if (t == "aten.hardswish.default") s = emit("aten.mul.Tensor", {NA("self", tensor_arg(x)), NA("other", tensor_arg(s))}, m, "times_x");
    bind(n, emit("aten.div.Scalar", {NA("self", tensor_arg(s)), NA("other", float_arg(6.0))}, m));
    return true;
  }
  if (t == "aten.prelu.default") {  // relu(x) - w * relu(-x), w per channel (dim 1) or one value
    ValueId x = tensor_in(n, "self");
    ValueId w = tensor_in(n, "weight");
    TensorMeta m = out_meta(n);
    const auto& xm = meta_of(x);
    const int64_t nw = meta_of(w).numel();
    // a 0-d input with a 1-D weight broadcasts to [1] (the result is 0-d); read before emit() adds values
    const bool scalar = xm.sizes.empty() && meta_of(w).sizes.size() == 1;
    if (nw != 1) {
      if (xm.sizes.size() < 2 || xm.sizes[1] != nw) unsupported(n, "prelu weight does not match the channels");
      std::vector<int64_t> shape(xm.sizes.size() - 1, 1);
      shape[0] = nw;
      w = view(w, shape);
    }
    ValueId pos = emit("aten.relu.default", {NA("self", tensor_arg(x))}, m, "pos");
    ValueId neg = emit("aten.neg.default", {NA("self", tensor_arg(x))}, m, "negx");
    neg = emit("aten.relu.default", {NA("self", tensor_arg(neg))}, m, "neg");
    if (scalar) {
      TensorMeta one = contiguous(m.dtype, {1});
      neg = emit("aten.mul.Tensor", {NA("self", tensor_arg(neg)), NA("other", tensor_arg(w))}, one, "scaled");
      ValueId y = emit("aten.sub.Tensor", {NA("self", tensor_arg(pos)), NA("other", tensor_arg(neg))}, one);
      bind(n, view(y, {}));
      return true;
    }
    neg = emit("aten.mul.Tensor", {NA("self", tensor_arg(neg)), NA("other", tensor_arg(w))}, m, "scaled");
    bind(n, emit("aten.sub.Tensor", {NA("self", tensor_arg(pos)), NA("other", tensor_arg(neg))}, m));
    return true;
  }
  if (t == "aten.hardtanh.default" || t == "aten.relu6.default") {
    ValueId x = tensor_in(n, "self");
    double lo = t == "aten.relu6.default" ? 0.0 : float_or("min_val", -1.0);
    double hi = t == "aten.relu6.default" ? 6.0 : float_or("max_val", 1.0);
    bind(n, emit("aten.clamp.default", {NA("self", tensor_arg(x)), NA("min", float_arg(lo)), NA("max", float_arg(hi))},
                 out_meta(n)));
    return true;
  }
  return false;
}

// A standalone batch norm with constant statistics as two per-channel constants shaped
// [C, 1, ...] (broadcasting over the spatial dims): scale = gamma / sqrt(var + eps),
// shift = beta - mean * scale. Nullopt unless every operand is a float32 constant.
std::optional<std::pair<ValueId, ValueId>> Lowerer::batch_norm_scale_shift(ValueId x, std::optional<ValueId> gamma,
                                                                          std::optional<ValueId> beta, ValueId mean,
                                                                          ValueId var, double eps) {
  const auto& xm = meta_of(x);
  if (xm.dtype != ScalarType::Float || xm.sizes.size() < 2) return std::nullopt;
  std::vector<ValueId> operands{mean, var};
  for (auto v : {gamma, beta})
    if (v) operands.push_back(*v);
  for (ValueId v : operands)
    if (!out_.is_constant(v) || meta_of(v).dtype != ScalarType::Float) return std::nullopt;
  const int64_t c = xm.sizes[1];
  auto floats = [&](std::optional<ValueId> v, float dflt) {
    std::vector<float> f(static_cast<size_t>(c), dflt);
    if (!v) return f;
    auto bytes = out_.constant_bytes(*v);
    if (bytes.size() != f.size() * sizeof(float)) return std::vector<float>{};
    std::memcpy(f.data(), bytes.data(), bytes.size());
    return f;
  };
  std::vector<float> M = floats(mean, 0), V = floats(var, 1), G = floats(gamma, 1), B = floats(beta, 0);
  if (M.empty() || V.empty() || G.empty() || B.empty()) return std::nullopt;
  auto scale = std::make_shared<std::vector<std::byte>>(static_cast<size_t>(c) * sizeof(float));
  auto shift = std::make_shared<std::vector<std::byte>>(static_cast<size_t>(c) * sizeof(float));
  auto* ps = reinterpret_cast<float*>(scale->data());
  auto* pt = reinterpret_cast<float*>(shift->data());
  for (int64_t i = 0; i < c; ++i) {
    const double s = static_cast<double>(G[i]) / std::sqrt(static_cast<double>(V[i]) + eps);
    ps[i] = static_cast<float>(s);
    pt[i] = static_cast<float>(B[i] - M[i] * s);
  }
  std::vector<int64_t> shape(xm.sizes.size() - 1, 1);
  shape[0] = c;
  ValueId vs = out_.graph.add_value(fresh_name("bn_scale_const"), contiguous(ScalarType::Float, shape));
  out_.constants[vs] = ConstantData{nullptr, scale, "batch norm scale (folded)"};
  ValueId vt = out_.graph.add_value(fresh_name("bn_shift_const"), contiguous(ScalarType::Float, shape));
  out_.constants[vt] = ConstantData{nullptr, shift, "batch norm shift (folded)"};
  folded_ += 2;
  return std::make_pair(vs, vt);
}

// Batch norm (eval) after a convolution whose output only it reads: the convolution's weight
// and bias absorb the normalization; the norm's output is the convolution's.
bool Lowerer::try_fold_batch_norm(const Node& n, ValueId x, std::optional<ValueId> gamma, std::optional<ValueId> beta,
                                  ValueId mean, ValueId var, double eps) {
  const auto& xv = out_.graph.value(x);
  if (xv.producer < 0) return false;
  Node& conv = out_.graph.nodes[static_cast<size_t>(xv.producer)];
  if (conv.target != "aten.convolution.default" || conv.output_ids().size() != 1 || conv.output_ids()[0] != x)
    return false;
  auto input_of = [&](const char* name) -> NamedArgument* {
    for (auto& in : conv.inputs)
      if (in.name == name) return &in;
    return nullptr;
  };
  NamedArgument* w_arg = input_of("weight");
  NamedArgument* b_arg = input_of("bias");
  NamedArgument* tr_arg = input_of("transposed");
  if (!w_arg || w_arg->arg.kind != Argument::Kind::Tensor) return false;
  if (tr_arg && tr_arg->arg.kind == Argument::Kind::Bool && std::get<bool>(tr_arg->arg.payload)) return false;
  ValueId w = std::get<ValueId>(w_arg->arg.payload);
  std::optional<ValueId> b;
  if (b_arg && b_arg->arg.kind == Argument::Kind::Tensor) b = std::get<ValueId>(b_arg->arg.payload);
  // every operand a float32 constant read only here
  std::vector<ValueId> operands{w, mean, var};
  for (auto v : {b, gamma, beta})
    if (v) operands.push_back(*v);
  for (ValueId v : operands)
    if (!out_.is_constant(v) || meta_of(v).dtype != ScalarType::Float) return false;
  if (is_shared_weight(w)) return false;
  // the convolution's output has no reader but this norm: no edge node reads it yet, and its
  // source value is read once
  for (const Node& e : out_.graph.nodes)
    for (const auto& in : e.inputs)
      for (ValueId v : in.arg.tensor_ids())
        if (v == x) return false;
  for (ValueId v : out_.outputs)
    if (v == x) return false;
  int64_t source_uses = 0;
  for (size_t s = 0; s < vmap_.size(); ++s) {
    if (!vmap_[s] || *vmap_[s] != x) continue;
    for (const Node& sn : ep_.graph.nodes)
      for (const auto& in : sn.inputs)
        for (ValueId v : in.arg.tensor_ids()) source_uses += static_cast<size_t>(v) == s;
    for (const Argument& o : ep_.graph.outputs)
      for (ValueId v : o.tensor_ids()) source_uses += static_cast<size_t>(v) == s;
  }
  if (source_uses != 1) return false;

  const auto& wm = meta_of(w);
  const int64_t oc = wm.sizes.at(0);
  const int64_t per = wm.numel() / std::max<int64_t>(1, oc);
  auto floats = [&](ValueId v) {
    auto bytes = out_.constant_bytes(v);
    std::vector<float> f(bytes.size() / sizeof(float));
    std::memcpy(f.data(), bytes.data(), f.size() * sizeof(float));
    return f;
  };
  std::vector<float> W = floats(w), M = floats(mean), V = floats(var);
  std::vector<float> B = b ? floats(*b) : std::vector<float>(static_cast<size_t>(oc), 0.0f);
  std::vector<float> G = gamma ? floats(*gamma) : std::vector<float>(static_cast<size_t>(oc), 1.0f);
  std::vector<float> Be = beta ? floats(*beta) : std::vector<float>(static_cast<size_t>(oc), 0.0f);
  for (const auto* vec : {&M, &V, &B, &G, &Be})
    if (static_cast<int64_t>(vec->size()) != oc) return false;
  auto new_w = std::make_shared<std::vector<std::byte>>(W.size() * sizeof(float));
  auto new_b = std::make_shared<std::vector<std::byte>>(static_cast<size_t>(oc) * sizeof(float));
  auto* nw = reinterpret_cast<float*>(new_w->data());
  auto* nb = reinterpret_cast<float*>(new_b->data());
  for (int64_t o = 0; o < oc; ++o) {
    const double scale = static_cast<double>(G[o]) / std::sqrt(static_cast<double>(V[o]) + eps);
    for (int64_t i = 0; i < per; ++i) nw[o * per + i] = static_cast<float>(W[o * per + i] * scale);
    nb[o] = static_cast<float>((static_cast<double>(B[o]) - M[o]) * scale + Be[o]);
  }
  ValueId fw = out_.graph.add_value(fresh_name("bn_folded_weight"), contiguous(wm));
  out_.constants[fw] = ConstantData{nullptr, new_w, fmt::format("{} (batch norm folded)", n.name)};
  ValueId fb = out_.graph.add_value(fresh_name("bn_folded_bias"), contiguous(ScalarType::Float, {oc}));
  out_.constants[fb] = ConstantData{nullptr, new_b, fmt::format("{} (batch norm folded)", n.name)};
  // re-fetch: add_value may have moved the values, not the nodes
  Node& c2 = out_.graph.nodes[static_cast<size_t>(out_.graph.value(x).producer)];
  bool has_bias = false;
  for (auto& in : c2.inputs) {
    if (in.name == "weight") in.arg = tensor_arg(fw);
    if (in.name == "bias") {
      in.arg = tensor_arg(fb);
      has_bias = true;
    }
  }
  if (!has_bias) c2.inputs.push_back(NA("bias", tensor_arg(fb)));
  ++folded_;
  bind(n, x);
  return true;
}

}  // namespace kiln::passes::detail
