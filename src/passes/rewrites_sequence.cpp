// to_edge rewrites: RNNs, einsum, sort/topk, scatter/gather, index ops.
#include "lowerer.h"

#include <cctype>

namespace kiln::passes::detail {
namespace {

enum class Cell { Lstm, Gru, RnnTanh, RnnRelu };

int64_t gate_count(Cell c) { return c == Cell::Lstm ? 4 : c == Cell::Gru ? 3 : 1; }

}  // namespace

// aten.lstm.input / gru.input / rnn_tanh.input / rnn_relu.input, unrolled over the
// static sequence length. Per layer and direction: the input projection of every
// time step is one addmm ([T*B, I] x [I, G*H]); each step adds one mm of the
// hidden state and the cell's elementwise gates; the outputs are concatenated.
// LSTM and plain RNN fold b_hh into the projection's bias; GRU keeps it with
// the hidden product (its candidate gate multiplies r by W_hn h + b_hn).
bool Lowerer::lower_sequence(const Node& n) {
  const std::string& t = n.target;
  const Cell cells[] = {Cell::Lstm, Cell::Gru, Cell::RnnTanh, Cell::RnnRelu};
  const char* rnns[] = {"aten.lstm.input", "aten.gru.input", "aten.rnn_tanh.input", "aten.rnn_relu.input"};
  for (int i = 0; i < 4; ++i)
    if (t == rnns[i]) {
      lower_rnn(n, static_cast<int>(cells[i]));
      return true;
    }
  if (t == "aten.einsum.default") {
    lower_einsum(n);
    return true;
  }
  if (t == "aten.unfold.default") {  // a view in the default IR; a copy in the edge dialect
    const ValueId self = tensor_in(n, "self");
    if (meta_of(self).sizes.empty() && out_meta(n).numel() == 1) {
      // a 0-d tensor's one window is the element itself (ExecuTorch's unfold_copy kernel
      // aborts on a 0-d input, so its runtime needs the view)
      bind(n, emit("aten.view_copy.default", {NA("self", tensor_arg(self)), NA("size", ints_arg(out_meta(n).sizes))},
                   out_meta(n)));
      return true;
    }
    bind(n, emit("aten.unfold_copy.default", {NA("self", tensor_arg(tensor_in(n, "self"))),
                                              NA("dimension", int_arg(int_in(n, "dimension"))),
                                              NA("size", int_arg(int_in(n, "size"))), NA("step", int_arg(int_in(n, "step")))},
                 out_meta(n)));
    return true;
  }
  if (t == "aten.sort.default" || t == "aten.sort.stable") {
    // topk of every element, in order: one kernel both runtimes have (ExecuTorch's
    // portable library has no sort). kiln's topk orders ties by index (a stable sort).
    ValueId x = tensor_in(n, "self");
    const auto& xm = meta_of(x);
    int64_t dim = wrap_dim(int_in(n, "dim", -1), xm.sizes.size());
    int64_t k = xm.sizes.empty() ? 1 : xm.sizes[static_cast<size_t>(dim)];
    // bool as uint8 (ExecuTorch's topk kernel takes no bool; false < true either way), the values cast back
    const bool as_byte = xm.dtype == ScalarType::Bool;
    TensorMeta vm = out_meta(n, 0);
    if (as_byte) {
      x = convert(x, ScalarType::Byte);
      vm.dtype = ScalarType::Byte;
    }
    auto outs = emit_raw("aten.topk.default", {NA("self", tensor_arg(x)), NA("k", int_arg(k)), NA("dim", int_arg(dim)),
                                               NA("largest", bool_arg(int_in(n, "descending", 0) != 0)),
                                               NA("sorted", bool_arg(true))},
                         {vm, out_meta(n, 1)}, "topk");
    if (as_byte) outs[0] = convert(outs[0], ScalarType::Bool);
    bind_all(n, outs);
    return true;
  }
  if (t == "aten.max.other" || t == "aten.min.other") {  // elementwise torch.max(a, b)
    bind(n, emit(t == "aten.max.other" ? "aten.maximum.default" : "aten.minimum.default",
                 {NA("self", tensor_arg(tensor_in(n, "self"))), NA("other", tensor_arg(tensor_in(n, "other")))},
                 out_meta(n)));
    return true;
  }
  if (t == "aten.clamp_min.default" || t == "aten.clamp_max.default") {  // clamp with one bound (both runtimes have it)
    bool lo = t == "aten.clamp_min.default";
    bind(n, emit("aten.clamp.default", {NA("self", tensor_arg(tensor_in(n, "self"))),
                                        NA(lo ? "min" : "max", arg(n, lo ? "min" : "max"))}, out_meta(n)));
    return true;
  }
  if (t == "aten.clamp_min.Tensor" || t == "aten.clamp_max.Tensor") {  // a tensor bound: maximum / minimum (NaN
    // propagates in both, as in clamp)
    const bool lo = t == "aten.clamp_min.Tensor";
    bind(n, emit(lo ? "aten.maximum.default" : "aten.minimum.default",
                 {NA("self", tensor_arg(tensor_in(n, "self"))), NA("other", tensor_arg(tensor_in(n, lo ? "min" : "max")))},
                 out_meta(n)));
    return true;
  }
  if (t == "aten.index_copy.default") {  // of an ordinary tensor (state is rewrites_state's): index_put along dim
    const ValueId self = tensor_in(n, "self");
    if (meta_of(self).sizes.empty()) {  // a 0-d tensor: its one element is the source's
      const ValueId src = tensor_in(n, "source");
      bind(n, emit("aten.view_copy.default", {NA("self", tensor_arg(src)), NA("size", ints_arg({}))}, out_meta(n)));
      return true;
    }
    const int64_t dim = wrap_dim(int_in(n, "dim"), meta_of(self).sizes.size());
    std::vector<std::optional<ValueId>> idx(static_cast<size_t>(dim), std::nullopt);
    idx.emplace_back(tensor_in(n, "index"));
    bind(n, emit("aten.index_put.default",
                 {NA("self", tensor_arg(self)), NA("indices", {Argument::Kind::OptionalTensors, std::move(idx)}),
                  NA("values", tensor_arg(tensor_in(n, "source"))), NA("accumulate", bool_arg(false))},
                 out_meta(n)));
    return true;
  }
  if (t == "aten.var.dim" || t == "aten.var.correction" || t == "aten.var.default") {
    // sum((x - mean)^2) / (N - correction) over the reduced dims (correction: 1 unbiased, 0 population)
    ValueId x = tensor_in(n, "self");
    // float16 / bfloat16: computed in float32 and rounded once, as eager's CPU kernel does; float64 in float64
    const ScalarType want = meta_of(x).dtype;
    if (want == ScalarType::Half || want == ScalarType::BFloat16) x = convert(x, ScalarType::Float);
    else if (want != ScalarType::Float && want != ScalarType::Double)
      unsupported(n, "var of a tensor that is not floating point");
    const ScalarType ct = meta_of(x).dtype;
    const TensorMeta xm = meta_of(x);  // a copy: emit() adds values
    std::vector<int64_t> dims;
    if (const Argument* d = opt(n, "dim"); d && d->kind != Argument::Kind::None) dims = ints_in(n, "dim");
    if (dims.empty())
      for (size_t i = 0; i < xm.sizes.size(); ++i) dims.push_back(static_cast<int64_t>(i));
    int64_t count = 1;
    for (int64_t& d : dims) {
      d = wrap_dim(d, xm.sizes.size());
      if (!xm.sizes.empty()) count *= xm.sizes.at(static_cast<size_t>(d));  // a 0-d tensor: its one element
    }
    double correction = 1.0;
    if (t == "aten.var.correction") {
      if (const Argument* c = opt(n, "correction"); c && c->kind != Argument::Kind::None)
        correction = c->kind == Argument::Kind::Int ? static_cast<double>(std::get<int64_t>(c->payload))
                                                    : std::get<double>(c->payload);
    } else if (int_in(n, "unbiased", 1) == 0) {
      correction = 0.0;
    }
    const bool keepdim = int_in(n, "keepdim", 0) != 0;
    TensorMeta kept = xm;
    if (!xm.sizes.empty())
      for (int64_t d : dims) kept.sizes.at(static_cast<size_t>(d)) = 1;
    kept = contiguous(kept);
    const ValueId mean = emit("aten.mean.dim", {NA("self", tensor_arg(x)), NA("dim", ints_arg(dims)),
                                                NA("keepdim", bool_arg(true))}, kept, "mean");
    const ValueId dev = emit("aten.sub.Tensor", {NA("self", tensor_arg(x)), NA("other", tensor_arg(mean))},
                             contiguous(xm), "deviation");
    const ValueId sq = emit("aten.mul.Tensor", {NA("self", tensor_arg(dev)), NA("other", tensor_arg(dev))},
                            contiguous(xm), "square");
    TensorMeta om = out_meta(n);
    om.dtype = ct;
    const ValueId sum = emit("aten.sum.dim_IntList", {NA("self", tensor_arg(sq)), NA("dim", ints_arg(dims)),
                                                      NA("keepdim", bool_arg(keepdim))}, om, "sum");
    // torch divides by max(N - correction, 0): inf or nan when that is 0 (x / 0, 0 / 0; an empty input too)
    const double divisor = std::max(static_cast<double>(count) - correction, 0.0);
    const ValueId var = emit("aten.div.Scalar", {NA("self", tensor_arg(sum)), NA("other", float_arg(divisor))}, om, "var");
    bind(n, want == ct ? var : convert(var, want));
    return true;
  }
  if (t == "aten.fill.Scalar") {  // a tensor of self's shape and dtype, every element the value
    const TensorMeta m = out_meta(n);
    bind(n, emit("aten.full.default", {NA("size", ints_arg(m.sizes)), NA("fill_value", arg(n, "value"))}, m));
    return true;
  }
  if (t == "aten.detach_.default") {  // in-place detach of a lifted constant: no-op in inference
    bind(n, tensor_in(n, "self"));
    return true;
  }
  if (t == "aten.floor_divide.default" || t == "aten.div.Tensor_mode") {
    // a Python number as `other`: a 0-d tensor (both runtimes' kernels take a Tensor)
    const Argument& other = arg(n, "other");
    if (other.kind == Argument::Kind::Tensor) return false;
    TensorMeta m = out_meta(n);
    std::vector<NamedArgument> args{NA("self", tensor_arg(tensor_in(n, "self"))),
                                    NA("other", tensor_arg(scalar_tensor(other, m.dtype)))};
    if (const Argument* mode = opt(n, "rounding_mode")) args.push_back(NA("rounding_mode", *mode));
    bind(n, emit(t, std::move(args), m));
    return true;
  }
  if (t == "aten.masked_fill.Tensor") {  // a 0-d value tensor: where(mask, value, self)
    ValueId x = tensor_in(n, "self");
    TensorMeta m = out_meta(n);
    ValueId v = convert(tensor_in(n, "value"), m.dtype);
    bind(n, emit("aten.where.self", {NA("condition", tensor_arg(tensor_in(n, "mask"))), NA("self", tensor_arg(v)),
                                     NA("other", tensor_arg(x))}, m));
    return true;
  }
  return false;
}

void Lowerer::lower_rnn(const Node& n, int cell_kind) {
  const Cell cell = static_cast<Cell>(cell_kind);
  auto tensors = [&](std::string_view name) {
    const Argument& a = arg(n, name);
    std::vector<ValueId> out;
    if (a.kind == Argument::Kind::Tensor) {
      out.push_back(mapped(std::get<ValueId>(a.payload)));
    } else if (a.kind == Argument::Kind::Tensors) {
      for (ValueId v : std::get<std::vector<ValueId>>(a.payload)) out.push_back(mapped(v));
    } else {
      unsupported(n, fmt::format("argument '{}' is not a tensor list", name));
    }
    return out;
  };
  ValueId input = tensor_in(n, "input");
  std::vector<ValueId> hx = tensors("hx");
  std::vector<ValueId> params = tensors("params");
  const bool has_biases = int_in(n, "has_biases") != 0;
  const int64_t layers = int_in(n, "num_layers");
  const bool train = int_in(n, "train") != 0;
  const bool bidirectional = int_in(n, "bidirectional") != 0;
  const bool batch_first = int_in(n, "batch_first") != 0;
  double dropout = 0;
  if (const Argument* d = opt(n, "dropout"); d && d->kind == Argument::Kind::Float) dropout = std::get<double>(d->payload);
  if (train && dropout != 0.0) unsupported(n, "RNN dropout in training mode; export the model in eval() mode");
  const int64_t dirs = bidirectional ? 2 : 1;
  const int64_t per = has_biases ? 4 : 2;
  if (layers < 1 || static_cast<int64_t>(params.size()) != layers * dirs * per)
    unsupported(n, fmt::format("expected {} weights ({} layers x {} directions x {}), got {} (proj_size is not "
                               "supported)", layers * dirs * per, layers, dirs, per, params.size()));
  const size_t want_hx = cell == Cell::Lstm ? 2 : 1;
  if (hx.size() != want_hx) unsupported(n, fmt::format("expected {} initial state tensors, got {}", want_hx, hx.size()));
  const auto& im = meta_of(input);
  if (im.sizes.size() != 3) unsupported(n, "RNN input must be 3-D (batched)");
  if (im.dtype != ScalarType::Float && im.dtype != ScalarType::Double) unsupported(n, "RNN input must be float32 or float64");
  const ScalarType dt = im.dtype;
  // time-major [T, B, I]
  ValueId x = batch_first ? permute(input, {1, 0, 2}, "time_major") : input;
  const int64_t T = meta_of(x).sizes[0], B = meta_of(x).sizes[1];
  const int64_t G = gate_count(cell);
  const int64_t H = meta_of(params[1]).sizes.at(1);  // w_hh: [G*H, H]

  auto add = [&](ValueId a, ValueId b, std::string_view hint) {
    std::vector<int64_t> s = meta_of(a).sizes.size() >= meta_of(b).sizes.size() ? meta_of(a).sizes : meta_of(b).sizes;
    return emit("aten.add.Tensor", {NA("self", tensor_arg(a)), NA("other", tensor_arg(b))}, contiguous(dt, s), hint);
  };
  auto mul = [&](ValueId a, ValueId b, std::string_view hint) {
    return emit("aten.mul.Tensor", {NA("self", tensor_arg(a)), NA("other", tensor_arg(b))}, contiguous(meta_of(a)), hint);
  };
  auto sub = [&](ValueId a, ValueId b, std::string_view hint) {
    return emit("aten.sub.Tensor", {NA("self", tensor_arg(a)), NA("other", tensor_arg(b))}, contiguous(meta_of(a)), hint);
  };
  auto unary = [&](const char* target, ValueId a, std::string_view hint) {
    return emit(target, {NA("self", tensor_arg(a))}, contiguous(meta_of(a)), hint);
  };
  auto split = [&](ValueId a, int64_t parts, std::string_view hint) {
    const auto& s = meta_of(a).sizes;  // [B, parts*H]
    std::vector<TensorMeta> metas(static_cast<size_t>(parts), contiguous(dt, {s[0], s[1] / parts}));
    std::vector<int64_t> sizes(static_cast<size_t>(parts), s[1] / parts);
    return emit_raw("aten.split_with_sizes_copy.default",
                    {NA("self", tensor_arg(a)), NA("split_sizes", ints_arg(sizes)), NA("dim", int_arg(1))}, metas, hint);
  };
  auto rows = [&](ValueId a, int64_t start, int64_t end, std::string_view hint) {
    auto s = meta_of(a).sizes;
    if (start == 0 && end == s[0]) return a;
    s[0] = end - start;
    return emit("aten.slice_copy.Tensor", {NA("self", tensor_arg(a)), NA("dim", int_arg(0)), NA("start", int_arg(start)),
                                           NA("end", int_arg(end)), NA("step", int_arg(1))},
                contiguous(dt, s), hint);
  };
  auto cat = [&](const std::vector<ValueId>& parts, int64_t dim, std::string_view hint) {
    if (parts.size() == 1) return parts[0];
    auto s = meta_of(parts[0]).sizes;
    s[static_cast<size_t>(dim)] = 0;
    for (ValueId v : parts) s[static_cast<size_t>(dim)] += meta_of(v).sizes[static_cast<size_t>(dim)];
    return emit("aten.cat.default", {NA("tensors", {Argument::Kind::Tensors, parts}), NA("dim", int_arg(dim))},
                contiguous(dt, s), hint);
  };
  auto state_of = [&](ValueId h, int64_t k) {  // [L*D, B, H] -> [B, H]
    return emit("aten.select_copy.int", {NA("self", tensor_arg(h)), NA("dim", int_arg(0)), NA("index", int_arg(k))},
                contiguous(dt, {B, H}), "h0");
  };
  // y = a @ wt (+ bias), wt = w^T
  auto linear = [&](ValueId a, ValueId wt, std::optional<ValueId> bias, std::string_view hint) {
    TensorMeta m = contiguous(dt, {meta_of(a).sizes[0], meta_of(wt).sizes[1]});
    if (bias)
      return emit("aten.addmm.default", {NA("self", tensor_arg(*bias)), NA("mat1", tensor_arg(a)),
                                         NA("mat2", tensor_arg(wt))}, m, hint);
    return emit("aten.mm.default", {NA("self", tensor_arg(a)), NA("mat2", tensor_arg(wt))}, m, hint);
  };

  std::vector<ValueId> h_n, c_n;
  for (int64_t l = 0; l < layers; ++l) {
    const int64_t I = meta_of(x).sizes[2];
    ValueId x2 = view(x, {T * B, I});
    std::vector<ValueId> dir_out;
    for (int64_t d = 0; d < dirs; ++d) {
      const size_t base = static_cast<size_t>((l * dirs + d) * per);
      ValueId w_ih = params[base], w_hh = params[base + 1];
      if (meta_of(w_ih).sizes != std::vector<int64_t>{G * H, I} || meta_of(w_hh).sizes != std::vector<int64_t>{G * H, H})
        unsupported(n, fmt::format("layer {} weights have unexpected shapes", l));
      std::optional<ValueId> b_ih, b_hh;
      if (has_biases) {
        b_ih = params[base + 2];
        b_hh = params[base + 3];
      }
      std::optional<ValueId> proj_bias = b_ih, hid_bias;
      if (has_biases) {
        if (cell == Cell::Gru) hid_bias = b_hh;
        else proj_bias = add(*b_ih, *b_hh, "bias");
      }
      ValueId proj = linear(x2, transposed_weight(w_ih), proj_bias, "x_proj");  // [T*B, G*H]
      ValueId w_hh_t = transposed_weight(w_hh);
      const int64_t k = l * dirs + d;
      ValueId h = state_of(hx[0], k);
      ValueId c = cell == Cell::Lstm ? state_of(hx[1], k) : h;
      std::vector<ValueId> outs(static_cast<size_t>(T));
      for (int64_t s = 0; s < T; ++s) {
        const int64_t step = d == 0 ? s : T - 1 - s;
        ValueId xt = rows(proj, step * B, (step + 1) * B, "x_t");
        ValueId hh = linear(h, w_hh_t, hid_bias, "h_proj");
        switch (cell) {
          case Cell::Lstm: {
            auto g = split(add(xt, hh, "gates"), 4, "gate");
            ValueId i = unary("aten.sigmoid.default", g[0], "i");
            ValueId f = unary("aten.sigmoid.default", g[1], "f");
            ValueId gg = unary("aten.tanh.default", g[2], "g");
            ValueId o = unary("aten.sigmoid.default", g[3], "o");
            c = add(mul(f, c, "fc"), mul(i, gg, "ig"), "c");
            h = mul(o, unary("aten.tanh.default", c, "tanh_c"), "h");
            break;
          }
          case Cell::Gru: {
            auto xg = split(xt, 3, "x_gate");
            auto hg = split(hh, 3, "h_gate");
            ValueId r = unary("aten.sigmoid.default", add(xg[0], hg[0], "r_in"), "r");
            ValueId z = unary("aten.sigmoid.default", add(xg[1], hg[1], "z_in"), "z");
            ValueId nn = unary("aten.tanh.default", add(xg[2], mul(r, hg[2], "r_hn"), "n_in"), "n");
            h = add(nn, mul(z, sub(h, nn, "h_minus_n"), "z_h"), "h");  // (1 - z) n + z h
            break;
          }
          case Cell::RnnTanh: h = unary("aten.tanh.default", add(xt, hh, "pre"), "h"); break;
          case Cell::RnnRelu: h = unary("aten.relu.default", add(xt, hh, "pre"), "h"); break;
        }
        outs[static_cast<size_t>(step)] = view(h, {1, B, H});
      }
      h_n.push_back(view(h, {1, B, H}));
      if (cell == Cell::Lstm) c_n.push_back(view(c, {1, B, H}));
      dir_out.push_back(cat(outs, 0, "seq"));
    }
    x = cat(dir_out, 2, "bidir");
  }
  ValueId y = batch_first ? permute(x, {1, 0, 2}, "batch_major") : x;
  std::vector<ValueId> results{y, cat(h_n, 0, "h_n")};
  if (cell == Cell::Lstm) results.push_back(cat(c_n, 0, "c_n"));
  bind_all(n, results);
}

// einsum: operands' labels are permuted into [batch..., free..., contracted...]
// and multiplied as a bmm; labels of one operand only that the output drops are summed first.
void Lowerer::lower_einsum(const Node& n) {
  const Argument& eq_arg = arg(n, "equation");
  if (eq_arg.kind != Argument::Kind::String) unsupported(n, "einsum equation is not a string");
  std::string eq;
  for (char ch : std::get<std::string>(eq_arg.payload))
    if (ch != ' ') eq += ch;
  const Argument& ops_arg = arg(n, "tensors");
  if (ops_arg.kind != Argument::Kind::Tensors) unsupported(n, "einsum operands are not a tensor list");
  std::vector<ValueId> ops;
  for (ValueId v : std::get<std::vector<ValueId>>(ops_arg.payload)) ops.push_back(mapped(v));
  auto arrow = eq.find("->");
  std::string lhs = eq.substr(0, arrow);
  std::vector<std::string> terms;
  for (size_t p = 0;;) {
    auto c = lhs.find(',', p);
    terms.push_back(lhs.substr(p, c == std::string::npos ? std::string::npos : c - p));
    if (c == std::string::npos) break;
    p = c + 1;
  }
  if (terms.size() != ops.size() || ops.empty() || ops.size() > 2)
    unsupported(n, fmt::format("einsum with {} operands (kiln lowers one or two)", ops.size()));
  // '...' becomes fresh labels, right-aligned across operands (broadcast like numpy)
  std::string fresh;
  for (char ch = 'A'; ch <= 'Z'; ++ch)
    if (eq.find(ch) == std::string::npos) fresh += ch;
  size_t ell_rank = 0;
  std::vector<size_t> ell_of(terms.size(), 0);
  for (size_t i = 0; i < terms.size(); ++i)
    if (auto e = terms[i].find("..."); e != std::string::npos) {
      size_t named = terms[i].size() - 3;
      size_t rank = meta_of(ops[i]).sizes.size();
      if (rank < named) unsupported(n, fmt::format("einsum term '{}' has more labels than its operand's rank", terms[i]));
      ell_of[i] = rank - named;
      ell_rank = std::max(ell_rank, ell_of[i]);
    }
  if (ell_rank > fresh.size()) unsupported(n, "einsum '...' covers too many dims");
  const std::string ell = fresh.substr(0, ell_rank);
  for (size_t i = 0; i < terms.size(); ++i)
    if (auto e = terms[i].find("..."); e != std::string::npos)
      terms[i] = terms[i].substr(0, e) + ell.substr(ell_rank - ell_of[i]) + terms[i].substr(e + 3);
  std::string out_labels;
  if (arrow != std::string::npos) {
    out_labels = eq.substr(arrow + 2);
    if (auto e = out_labels.find("..."); e != std::string::npos)
      out_labels = out_labels.substr(0, e) + ell + out_labels.substr(e + 3);
  } else {  // implicit: the '...' dims, then labels that appear once, sorted
    std::map<char, int> count;
    for (const auto& tm : terms)
      for (char ch : tm)
        if (ell.find(ch) == std::string::npos) ++count[ch];
    out_labels = ell;
    for (auto [ch, k] : count)
      if (k == 1) out_labels += ch;
  }
  const TensorMeta m = out_meta(n);
  const ScalarType dt = m.dtype;
  std::map<char, int64_t> size_of;
  for (size_t i = 0; i < ops.size(); ++i) {
    const auto& s = meta_of(ops[i]).sizes;
    if (s.size() != terms[i].size()) unsupported(n, fmt::format("einsum term '{}' does not match its operand's rank", terms[i]));
    for (size_t k = 0; k < s.size(); ++k) {
      char ch = terms[i][k];
      if (!std::isalpha(static_cast<unsigned char>(ch))) unsupported(n, "einsum label is not a letter");
      auto [it, added] = size_of.emplace(ch, s[k]);
      if (!added && it->second != s[k]) {
        if (it->second == 1) it->second = s[k];
        else if (s[k] != 1) unsupported(n, fmt::format("einsum label '{}' has sizes {} and {}", ch, it->second, s[k]));
      }
    }
  }
  // Reduce an operand over the labels in `drop` (and take repeated labels' diagonal: unsupported).
  auto reduce = [&](ValueId v, std::string& term, const std::string& keep) {
    std::set<char> seen;
    for (char ch : term)
      if (!seen.insert(ch).second) unsupported(n, "einsum with a repeated label in one operand (diagonal)");
    std::vector<int64_t> dims;
    std::string kept;
    for (size_t k = 0; k < term.size(); ++k)
      if (keep.find(term[k]) == std::string::npos) dims.push_back(static_cast<int64_t>(k));
      else kept += term[k];
    if (dims.empty()) return v;
    std::vector<int64_t> sizes;
    for (size_t k = 0; k < term.size(); ++k)
      if (keep.find(term[k]) != std::string::npos) sizes.push_back(meta_of(v).sizes[k]);
    term = kept;
    return emit("aten.sum.dim_IntList", {NA("self", tensor_arg(v)), NA("dim", ints_arg(dims)),
                                         NA("keepdim", bool_arg(false))}, contiguous(dt, sizes), "sum");
  };
  // labels in [order] of term: permute + view
  auto arrange = [&](ValueId v, const std::string& term, const std::string& order) {
    std::vector<int64_t> perm;
    for (char ch : order) perm.push_back(static_cast<int64_t>(term.find(ch)));
    return permute(v, perm, "einsum_permute");
  };
  ValueId result;
  std::string res_term;
  if (ops.size() == 1) {
    std::string term = terms[0];
    result = reduce(ops[0], term, out_labels);
    res_term = term;
  } else {
    std::string ta = terms[0], tb = terms[1];
    // an operand's label found in neither the other operand nor the output is summed away
    ValueId a = reduce(ops[0], ta, tb + out_labels);
    ValueId b = reduce(ops[1], tb, ta + out_labels);
    std::string batch, fa, fb, contr;
    for (char ch : ta) {
      bool in_b = tb.find(ch) != std::string::npos, in_out = out_labels.find(ch) != std::string::npos;
      if (in_b && in_out) batch += ch;
      else if (in_b) contr += ch;
      else fa += ch;
    }
    for (char ch : tb)
      if (ta.find(ch) == std::string::npos) fb += ch;
    auto prod = [&](const std::string& ls) {
      int64_t p = 1;
      for (char ch : ls) p *= size_of.at(ch);
      return p;
    };
    auto arranged = [&](ValueId v, const std::string& term, const std::string& order) {
      // expand size-1 (broadcast) dims to the label's size
      ValueId r = arrange(v, term, order);
      std::vector<int64_t> full;
      for (char ch : order) full.push_back(size_of.at(ch));
      return expand(r, full);
    };
    const int64_t Bn = prod(batch), M = prod(fa), N = prod(fb), K = prod(contr);
    ValueId a3 = view(arranged(a, ta, batch + fa + contr), {Bn, M, K});
    ValueId b3 = view(arranged(b, tb, batch + contr + fb), {Bn, K, N});
    ValueId y;
    if (K == 1 && contr.empty()) {  // outer product per batch: a broadcast multiply
      y = emit("aten.mul.Tensor", {NA("self", tensor_arg(view(a3, {Bn, M, 1}))), NA("other", tensor_arg(view(b3, {Bn, 1, N})))},
               contiguous(dt, {Bn, M, N}), "outer");
    } else {
      y = emit("aten.bmm.default", {NA("self", tensor_arg(a3)), NA("mat2", tensor_arg(b3))}, contiguous(dt, {Bn, M, N}),
               "bmm");
    }
    std::vector<int64_t> sizes;
    res_term = batch + fa + fb;
    for (char ch : res_term) sizes.push_back(size_of.at(ch));
    result = view(y, sizes);
  }
  for (char ch : out_labels)
    if (res_term.find(ch) == std::string::npos) unsupported(n, fmt::format("einsum output label '{}' is in no operand", ch));
  result = arrange(result, res_term, out_labels);
  bind(n, view(result, m.sizes));
}

}  // namespace kiln::passes::detail
