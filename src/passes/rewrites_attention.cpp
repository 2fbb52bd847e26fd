// to_edge rewrites: SDPA, normalisations, activations.
//
// scaled_dot_product_attention (and the core-ATen forms a decomposition may
// leave: _scaled_dot_product_flash_attention_for_cpu, the math variant) becomes
//
//   scores = bmm(q, k^T) * scale (+ additive mask) ; p = softmax(scores) ; bmm(p, v)
//
// Boolean masks become additive ones (where(mask, 0, -inf)); a constant mask
// (a causal mask of a static length, or one the graph computes from constants)
// folds to one constant at lowering time, so the XNNPACK partitioner sees only
// bmm/mul/add/softmax between the projections. Grouped-query attention
// (enable_gqa: K/V with fewer heads) folds each group of query heads into the
// rows of one bmm against its K/V head: nothing repeats K or V.
//
// The decomposed form's "safe softmax" (where(all(x == -inf, dim), 0, softmax(x)))
// becomes a plain softmax when no row of x can be entirely -inf: x is a matmul
// result, or one plus a constant mask with a finite entry in every row.
//
// Norms and activations: rms_norm becomes pow/mean/add/rsqrt/mul; hardswish,
// hardsigmoid and mish become elementwise ops (ExecuTorch's portable library
// has no kernel for them, XNNPACK runs the pieces); hardtanh and relu6 a clamp.
#include "lowerer.h"

#include <functional>
#include <cmath>

namespace kiln::passes::detail {
namespace {

std::vector<int64_t> prefix(const std::vector<int64_t>& v, size_t n) { return {v.begin(), v.begin() + n}; }

std::vector<int64_t> concat(std::vector<int64_t> a, std::initializer_list<int64_t> b) {
  a.insert(a.end(), b);
  return a;
}

int64_t product(const std::vector<int64_t>& v) {
  return std::accumulate(v.begin(), v.end(), int64_t{1}, std::multiplies<>());
}

// A new constant value holding `bytes` (row-major, `meta` contiguous).
ValueId add_constant(Lowerer& L, const TensorMeta& meta, std::vector<std::byte> bytes, std::string_view hint,
                     std::string desc) {
  ValueId v = L.out_.graph.add_value(L.fresh_name(hint), meta);
  L.out_.constants[v] = ConstantData{nullptr, std::make_shared<const std::vector<std::byte>>(std::move(bytes)),
                                     std::move(desc)};
  return v;
}

// tril(ones(L, S)) as an additive float mask: 0 where key j <= query i, -inf above.
ValueId causal_mask(Lowerer& L, ScalarType dtype, int64_t rows, int64_t cols) {
  std::vector<float> m(static_cast<size_t>(rows * cols));
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j)
      m[static_cast<size_t>(i * cols + j)] = j <= i ? 0.0f : -std::numeric_limits<float>::infinity();
  std::vector<std::byte> bytes(m.size() * sizeof(float));
  std::memcpy(bytes.data(), m.data(), bytes.size());
  ValueId v = add_constant(L, contiguous(ScalarType::Float, {rows, cols}), std::move(bytes), "causal_mask",
                           fmt::format("causal mask {}x{} (folded)", rows, cols));
  return L.convert(v, dtype);
}

struct Attention {
  ValueId q, k, v;
  std::optional<ValueId> mask;
  bool causal = false;
  std::optional<double> scale;
  bool gqa = false;
};

bool rows_have_finite_entry(const Lowerer& L, ValueId v);

// out [..., L, Ev] = softmax(q k^T * scale + mask) v, shapes as SDPA broadcasts them.
ValueId lower_sdpa(Lowerer& L, const Node& n, const Attention& a, const TensorMeta& out) {
  const TensorMeta qm = L.meta_of(a.q);
  const TensorMeta km = L.meta_of(a.k);
  const TensorMeta vm = L.meta_of(a.v);
  size_t r = qm.sizes.size();
  if (r < 2 || km.sizes.size() != r || vm.sizes.size() != r || out.sizes.size() != r)
    L.unsupported(n, "attention with query, key, value and output of different ranks or rank < 2");
  const bool half = qm.dtype == ScalarType::Half || qm.dtype == ScalarType::BFloat16;
  if (half && km.dtype == qm.dtype && vm.dtype == qm.dtype && out.dtype == qm.dtype) {
    // float16 / bfloat16: computed as eager's CPU attention computes it, in float32 (products, softmax and the
    // weighted sum), the output rounded once
    Attention w = a;
    w.q = L.convert(a.q, ScalarType::Float);
    w.k = L.convert(a.k, ScalarType::Float);
    w.v = L.convert(a.v, ScalarType::Float);
    if (a.mask && L.meta_of(*a.mask).dtype != ScalarType::Bool) w.mask = L.convert(*a.mask, ScalarType::Float);
    TensorMeta wide = out;
    wide.dtype = ScalarType::Float;
    return L.convert(lower_sdpa(L, n, w, wide), out.dtype);
  }
  if (qm.dtype != ScalarType::Float || km.dtype != qm.dtype || vm.dtype != qm.dtype)
    L.unsupported(n, "attention over tensors that are not all float32, float16 or bfloat16 alike (float64 attention "
                     "is not computed: kiln would compute it in float32)");
  int64_t Lq = qm.sizes[r - 2], E = qm.sizes[r - 1];
  int64_t S = km.sizes[r - 2], Ev = vm.sizes[r - 1];
  if (km.sizes[r - 1] != E || vm.sizes[r - 2] != S) L.unsupported(n, "attention with mismatched key/value shapes");
  std::vector<int64_t> batch = prefix(out.sizes, r - 2);  // the broadcast batch dims (heads last)
  int64_t G = 1;
  if (a.gqa && r >= 3 && km.sizes[r - 3] != qm.sizes[r - 3]) {
    int64_t hq = qm.sizes[r - 3], hk = km.sizes[r - 3];
    if (hk <= 0 || hq % hk != 0 || vm.sizes[r - 3] != hk)
      L.unsupported(n, fmt::format("enable_gqa with {} query heads and {} key/value heads", hq, hk));
    G = hq / hk;
  }
  // Key/value batch dims: the query's with heads / G.
  std::vector<int64_t> kv_batch = batch;
  if (G > 1) kv_batch.back() /= G;
  int64_t B = product(kv_batch);
  ScalarType dt = qm.dtype;

  // [*kv_batch, G, L, E] rows grouped per K/V head: q heads hk*G .. hk*G+G-1 read K/V head hk.
  ValueId q3 = L.view(L.expand(a.q, concat(batch, {Lq, E})), {B, G * Lq, E});
  ValueId k3 = L.view(L.expand(a.k, concat(kv_batch, {S, E})), {B, S, E});
  ValueId v3 = L.view(L.expand(a.v, concat(kv_batch, {S, Ev})), {B, S, Ev});
  ValueId kt = L.permute(k3, {0, 2, 1}, "k_t");
  ValueId s = L.emit("aten.bmm.default", {NA("self", tensor_arg(q3)), NA("mat2", tensor_arg(kt))},
                     contiguous(dt, {B, G * Lq, S}), "scores");
  double scale = a.scale ? *a.scale : 1.0 / std::sqrt(static_cast<double>(E));
  // The scores as [*batch, L, S] (G == 1) or [*kv_batch, G, L, S]: either broadcasts the mask.
  std::vector<int64_t> full = G > 1 ? concat(concat(kv_batch, {G}), {Lq, S}) : concat(batch, {Lq, S});
  s = L.view(s, full);
  if (scale != 1.0)
    s = L.emit("aten.mul.Scalar", {NA("self", tensor_arg(s)), NA("other", float_arg(scale))}, contiguous(dt, full),
               "scaled");

  std::optional<ValueId> add, keep;
  if (a.causal) add = causal_mask(L, dt, Lq, S);
  if (a.mask) {
    ValueId m = *a.mask;
    const TensorMeta mm = L.meta_of(m);
    if (mm.sizes.size() > r) L.unsupported(n, "attention mask of higher rank than the query");
    // Rows with no key left: eager SDPA gives 0 there, a softmax over -inf NaN. Unless the
    // mask is a constant with a finite entry in every row, masked entries get the lowest
    // finite value instead of -inf (same probabilities elsewhere) and `keep` (0 for such
    // rows, 1 otherwise; from the mask alone, so computed ahead of any delegate) zeroes them.
    const double lowest = -static_cast<double>(std::numeric_limits<float>::max());
    auto rows_kept = [&](ValueId any_of) {  // [..., L', S'] bool -> [..., L', 1] float
      std::vector<int64_t> rs = mm.sizes;
      if (rs.empty()) return any_of;
      rs.back() = 1;
      ValueId any = L.emit("aten.any.dim", {NA("self", tensor_arg(any_of)), NA("dim", int_arg(-1)),
                                            NA("keepdim", bool_arg(true))}, contiguous(ScalarType::Bool, rs), "row_kept");
      return L.convert(any, dt);
    };
    if (mm.dtype == ScalarType::Bool) {
      ValueId zero = L.scalar_tensor(float_arg(0.0), dt);
      ValueId ninf = L.scalar_tensor(float_arg(-std::numeric_limits<double>::infinity()), dt);
      ValueId additive = L.emit("aten.where.self", {NA("condition", tensor_arg(m)), NA("self", tensor_arg(zero)),
                                                    NA("other", tensor_arg(ninf))}, contiguous(dt, mm.sizes), "additive_mask");
      if (!L.out_.is_constant(additive) || !rows_have_finite_entry(L, additive)) {
        ValueId low = L.scalar_tensor(float_arg(lowest), dt);
        additive = L.emit("aten.where.self", {NA("condition", tensor_arg(m)), NA("self", tensor_arg(zero)),
                                              NA("other", tensor_arg(low))}, contiguous(dt, mm.sizes), "additive_mask");
        if (!mm.sizes.empty()) keep = rows_kept(m);
      }
      m = additive;
    } else {
      if (mm.dtype != dt) m = L.convert(m, dt);
      if (!L.out_.is_constant(m) || !rows_have_finite_entry(L, m)) {
        ValueId masked = L.emit("aten.eq.Scalar", {NA("self", tensor_arg(m)),
                                                   NA("other", float_arg(-std::numeric_limits<double>::infinity()))},
                                contiguous(ScalarType::Bool, mm.sizes), "masked_out");
        ValueId open = L.emit("aten.logical_not.default", {NA("self", tensor_arg(masked))},
                              contiguous(ScalarType::Bool, mm.sizes), "open");
        if (!mm.sizes.empty()) keep = rows_kept(open);
        m = L.emit("aten.clamp.default", {NA("self", tensor_arg(m)), NA("min", float_arg(lowest)),
                                          NA("max", Argument{})}, contiguous(dt, mm.sizes), "finite_mask");
      }
    }
    if (G > 1) {
      // [..., Hm, L', S'] with Hm in {1, Hq}: split the head dim like the scores'.
      std::vector<int64_t> ms(r - mm.sizes.size(), 1);
      ms.insert(ms.end(), mm.sizes.begin(), mm.sizes.end());
      int64_t hm = ms[r - 3];
      std::vector<int64_t> split = prefix(ms, r - 3);
      if (hm == 1) split.push_back(1), split.push_back(1);
      else if (hm == batch.back()) split.push_back(hm / G), split.push_back(G);
      else L.unsupported(n, fmt::format("attention mask with {} heads for {} query heads", hm, batch.back()));
      split.push_back(ms[r - 2]);
      split.push_back(ms[r - 1]);
      m = L.view(m, split);
    }
    add = m;
  }
  if (add) s = L.emit("aten.add.Tensor", {NA("self", tensor_arg(s)), NA("other", tensor_arg(*add))},
                      contiguous(dt, full), "masked");
  ValueId p = L.emit("aten._softmax.default",
                     {NA("self", tensor_arg(s)), NA("dim", int_arg(-1)), NA("half_to_float", bool_arg(false))},
                     contiguous(dt, full), "probs");
  ValueId y = L.emit("aten.bmm.default", {NA("self", tensor_arg(L.view(p, {B, G * Lq, S}))), NA("mat2", tensor_arg(v3))},
                     contiguous(dt, {B, G * Lq, Ev}), "attn");
  y = L.view(y, out.sizes);
  if (keep) y = L.emit("aten.mul.Tensor", {NA("self", tensor_arg(y)), NA("other", tensor_arg(*keep))}, contiguous(out),
                       "rows_kept");
  return y;
}

double float_value(const Lowerer& L, const Node& n, const char* name, double dflt) {
  const Argument* a = L.opt(n, name);
  if (!a || a->kind == Argument::Kind::None) return dflt;
  if (a->kind == Argument::Kind::Float) return std::get<double>(a->payload);
  if (a->kind == Argument::Kind::Int) return static_cast<double>(std::get<int64_t>(a->payload));
  L.unsupported(n, fmt::format("argument '{}' is not a number", name));
}

Attention attention_args(Lowerer& L, const Node& n) {
  Attention a{L.tensor_in(n, "query"), L.tensor_in(n, "key"), L.tensor_in(n, "value"), L.opt_tensor_in(n, "attn_mask"),
              L.int_in(n, "is_causal", 0) != 0, std::nullopt, L.int_in(n, "enable_gqa", 0) != 0};
  if (const Argument* s = L.opt(n, "scale"); s && s->kind != Argument::Kind::None) a.scale = float_value(L, n, "scale", 0);
  double p = float_value(L, n, "dropout_p", 0.0);
  if (p != 0.0)
    L.unsupported(n, fmt::format("attention with dropout_p={} (training); export the model in eval() mode so "
                                 "dropout_p is 0", p));
  if (a.causal && a.mask) L.unsupported(n, "attention with both is_causal and an explicit attn_mask");
  return a;
}

// ---- the safe softmax of SDPA's decomposition ---------------------------------

const Node* producer(const Lowerer& L, const Argument* a) {
  if (!a || a->kind != Argument::Kind::Tensor) return nullptr;
  int32_t p = L.ep_.graph.value(std::get<ValueId>(a->payload)).producer;
  return p < 0 ? nullptr : &L.ep_.graph.nodes[static_cast<size_t>(p)];
}

bool is_scalar(const Argument* a, double want) {
  if (!a) return false;
  if (a->kind == Argument::Kind::Float) return std::get<double>(a->payload) == want;
  if (a->kind == Argument::Kind::Int) return static_cast<double>(std::get<int64_t>(a->payload)) == want;
  return false;
}

bool same_tensor(const Argument* a, const Argument* b) {
  return a && b && a->kind == Argument::Kind::Tensor && b->kind == Argument::Kind::Tensor &&
         std::get<ValueId>(a->payload) == std::get<ValueId>(b->payload);
}

// Edge value `v` is computed by arithmetic on matmul results: finite unless it overflows.
bool computed_finite(const Lowerer& L, ValueId v, int depth = 0) {
  if (L.out_.is_constant(v) || depth > 8) return false;
  int32_t p = L.out_.graph.value(v).producer;
  if (p < 0) return false;
  const Node& e = L.out_.graph.nodes[static_cast<size_t>(p)];
  const std::string& t = e.target;
  if (t == "aten.bmm.default" || t == "aten.mm.default" || t == "aten.addmm.default") return true;
  if (t == "aten.view_copy.default" || t == "aten.expand_copy.default" || t == "aten.permute_copy.default" ||
      t == "aten.mul.Scalar" || t == "aten.div.Scalar")
    return computed_finite(L, e.inputs.at(0).arg.tensor_ids().at(0), depth + 1);
  return false;
}

// Every row (last dim) of constant `v` has an entry above -inf.
bool rows_have_finite_entry(const Lowerer& L, ValueId v) {
  const auto& m = L.meta_of(v);
  if (m.dtype != ScalarType::Float || m.numel() == 0) return false;
  std::vector<std::byte> bytes = L.out_.constant_bytes(v);
  int64_t cols = m.sizes.empty() ? 1 : m.sizes.back();
  const float* f = reinterpret_cast<const float*>(bytes.data());
  for (int64_t row = 0; row < m.numel() / cols; ++row) {
    bool ok = false;
    for (int64_t j = 0; j < cols && !ok; ++j) ok = f[row * cols + j] > -std::numeric_limits<float>::infinity();
    if (!ok) return false;
  }
  return true;
}

// No row of edge value `x` (softmax over its last dim) is entirely -inf.
bool no_row_all_neg_inf(const Lowerer& L, ValueId x) {
  if (computed_finite(L, x)) return true;
  if (L.out_.is_constant(x)) return rows_have_finite_entry(L, x);
  int32_t p = L.out_.graph.value(x).producer;
  if (p < 0) return false;
  const Node& e = L.out_.graph.nodes[static_cast<size_t>(p)];
  if (e.target != "aten.add.Tensor" || e.inputs.size() < 2 || e.inputs[1].arg.kind != Argument::Kind::Tensor)
    return false;
  if (const Argument* alpha = e.input("alpha") ? &e.input("alpha")->arg : nullptr; alpha && !is_scalar(alpha, 1.0))
    return false;
  ValueId a = e.inputs[0].arg.tensor_ids().at(0), b = e.inputs[1].arg.tensor_ids().at(0);
  const auto& xm = L.meta_of(x);
  auto finite_mask = [&](ValueId c) {
    const auto& cm = L.meta_of(c);
    return L.out_.is_constant(c) && !cm.sizes.empty() && (cm.sizes.back() == xm.sizes.back() || cm.sizes.back() == 1) &&
           rows_have_finite_entry(L, c);
  };
  return (computed_finite(L, a) && finite_mask(b)) || (computed_finite(L, b) && finite_mask(a));
}

// where(logical_not(any(logical_not(x == -inf), dim, keepdim)), zeros, softmax(x, dim)) with x's
// rows never all -inf: the softmax itself. Returns the edge softmax value, or nullopt.
std::optional<ValueId> safe_softmax(const Lowerer& L, const Node& n) {
  const Node* sm = producer(L, L.opt(n, "other"));
  const Node* zeros = producer(L, L.opt(n, "self"));
  const Node* not1 = producer(L, L.opt(n, "condition"));
  if (!sm || !zeros || !not1 || sm->target != "aten._softmax.default" || not1->target != "aten.logical_not.default")
    return std::nullopt;
  if (!(zeros->target == "aten.full_like.default" || zeros->target == "aten.zeros_like.default") ||
      (zeros->target == "aten.full_like.default" && !is_scalar(L.opt(*zeros, "fill_value"), 0.0)))
    return std::nullopt;
  const Node* any = producer(L, L.opt(*not1, "self"));
  if (!any || (any->target != "aten.any.dim" && any->target != "aten.any.dims")) return std::nullopt;
  const Node* not0 = producer(L, L.opt(*any, "self"));
  if (!not0 || not0->target != "aten.logical_not.default") return std::nullopt;
  const Node* eq = producer(L, L.opt(*not0, "self"));
  if (!eq || eq->target != "aten.eq.Scalar" || !is_scalar(L.opt(*eq, "other"), -std::numeric_limits<double>::infinity()))
    return std::nullopt;
  if (!same_tensor(L.opt(*eq, "self"), L.opt(*sm, "self"))) return std::nullopt;
  // The same (last) dim for the softmax and the row test.
  ValueId x = L.mapped(std::get<ValueId>(L.opt(*sm, "self")->payload));
  size_t rank = L.meta_of(x).sizes.size();
  if (rank == 0) return std::nullopt;
  auto last = [&](int64_t d) { return Lowerer::wrap_dim(d, rank) == static_cast<int64_t>(rank) - 1; };
  if (!last(L.int_in(*sm, "dim"))) return std::nullopt;
  const Argument* d = L.opt(*any, "dim");
  if (!d) return std::nullopt;
  if (d->kind == Argument::Kind::Int) {
    if (!last(std::get<int64_t>(d->payload))) return std::nullopt;
  } else if (d->kind == Argument::Kind::Ints) {
    const auto& ds = std::get<std::vector<int64_t>>(d->payload);
    if (ds.size() != 1 || !last(ds[0])) return std::nullopt;
  } else {
    return std::nullopt;
  }
  if (!no_row_all_neg_inf(L, x)) return std::nullopt;
  return L.mapped(std::get<ValueId>(L.opt(n, "other")->payload));
}

// rms_norm(x, shape, w, eps) = x * rsqrt(mean(x^2 over the trailing dims) + eps) (* w)
ValueId lower_rms_norm(Lowerer& L, const Node& n) {
  ValueId x = L.tensor_in(n, "input");
  const TensorMeta xm = L.meta_of(x);
  std::vector<int64_t> shape = L.ints_in(n, "normalized_shape");
  size_t r = xm.sizes.size();
  if (shape.empty() || shape.size() > r || !std::equal(shape.begin(), shape.end(), xm.sizes.end() - static_cast<std::ptrdiff_t>(shape.size())))
    L.unsupported(n, "rms_norm whose normalized_shape is not the input's trailing dims");
  // float16 / bfloat16: computed in float32 (the weight too) and rounded once, as torch's rms_norm does; float64
  // in float64 (its eps default float64's epsilon)
  const ScalarType want = xm.dtype;
  if (want != ScalarType::Float && want != ScalarType::Double && want != ScalarType::Half && want != ScalarType::BFloat16)
    L.unsupported(n, "rms_norm of a tensor that is not floating point");
  const ScalarType ct = want == ScalarType::Double ? ScalarType::Double : ScalarType::Float;
  if (want != ct) x = L.convert(x, ct);
  double eps = float_value(L, n, "eps", ct == ScalarType::Double ? std::numeric_limits<double>::epsilon()
                                                                 : static_cast<double>(std::numeric_limits<float>::epsilon()));
  std::vector<int64_t> dims, stat = xm.sizes;
  for (size_t i = r - shape.size(); i < r; ++i) dims.push_back(static_cast<int64_t>(i)), stat[i] = 1;
  TensorMeta m = contiguous(xm), sm = contiguous(ct, stat);
  m.dtype = ct;
  ValueId sq = L.emit("aten.pow.Tensor_Scalar", {NA("self", tensor_arg(x)), NA("exponent", int_arg(2))}, m, "square");
  ValueId ms = L.emit("aten.mean.dim", {NA("self", tensor_arg(sq)), NA("dim", ints_arg(dims)), NA("keepdim", bool_arg(true))},
                      sm, "mean_square");
  ValueId shifted = L.emit("aten.add.Scalar", {NA("self", tensor_arg(ms)), NA("other", float_arg(eps))}, sm, "eps");
  ValueId inv = L.emit("aten.rsqrt.default", {NA("self", tensor_arg(shifted))}, sm, "rstd");
  ValueId y = L.emit("aten.mul.Tensor", {NA("self", tensor_arg(x)), NA("other", tensor_arg(inv))}, m, "normed");
  if (auto w = L.opt_tensor_in(n, "weight")) {
    TensorMeta ym = L.out_meta(n);
    const ScalarType wt = L.meta_of(*w).dtype;
    ym.dtype = ct;
    const ValueId wf = wt == ct ? *w : L.convert(*w, ct);
    y = L.emit("aten.mul.Tensor", {NA("self", tensor_arg(y)), NA("other", tensor_arg(wf))}, ym, "scaled");
  }
  const ScalarType out = L.out_meta(n).dtype;
  return out == ct ? y : L.convert(y, out);
}

// hardsigmoid(x) = clamp(x + 3, 0, 6) / 6; hardswish(x) = x * clamp(x + 3, 0, 6) / 6;
// mish(x) = x * tanh(log(1 + e^x)) (e^x overflowing to inf still gives x).
// A float16 / bfloat16 activation is computed as eager's CPU kernels compute it: the input widened, the steps in
// float32, the result rounded once (its decomposition in 16-bit steps would round at each). `x` and `m` become
// the float32 input and meta; the returned function rounds a float32 result back.
std::function<ValueId(ValueId)> in_float32(Lowerer& L, const Node& n, ValueId& x, TensorMeta& m) {
  const ScalarType want = m.dtype;
  if (want == ScalarType::Float || want == ScalarType::Double) return [](ValueId r) { return r; };  // in its own type
  if (want != ScalarType::Half && want != ScalarType::BFloat16)
    L.unsupported(n, "activation of a tensor that is not floating point");
  x = L.convert(x, ScalarType::Float);
  m.dtype = ScalarType::Float;
  return [&L, want](ValueId r) { return L.convert(r, want); };
}

ValueId lower_hard_activation(Lowerer& L, const Node& n) {
  ValueId x = L.tensor_in(n, "self");
  TensorMeta m = L.out_meta(n);
  const auto narrow = in_float32(L, n, x, m);
  auto compute = [&]() -> ValueId {
  const std::string& t = n.target;
  auto op = [&](std::string_view target, std::vector<NamedArgument> args, std::string_view hint) {
    return L.emit(target, std::move(args), m, hint);
  };
  if (t == "aten.mish.default") {
    ValueId e = op("aten.exp.default", {NA("self", tensor_arg(x))}, "exp");
    ValueId p = op("aten.add.Scalar", {NA("self", tensor_arg(e)), NA("other", float_arg(1.0))}, "one_plus");
    ValueId sp = op("aten.log.default", {NA("self", tensor_arg(p))}, "softplus");
    ValueId th = op("aten.tanh.default", {NA("self", tensor_arg(sp))}, "tanh");
    return op("aten.mul.Tensor", {NA("self", tensor_arg(x)), NA("other", tensor_arg(th))}, "mish");
  }
  ValueId s = op("aten.add.Scalar", {NA("self", tensor_arg(x)), NA("other", float_arg(3.0))}, "plus3");
  ValueId c = op("aten.clamp.default", {NA("self", tensor_arg(s)), NA("min", float_arg(0.0)), NA("max", float_arg(6.0))},
                 "relu6");
  if (t == "aten.hardswish.default") c = op("aten.mul.Tensor", {NA("self", tensor_arg(x)), NA("other", tensor_arg(c))}, "gated");
  return op("aten.div.Scalar", {NA("self", tensor_arg(c)), NA("other", float_arg(6.0))}, "sixth");
  };
  return narrow(compute());
}

}  // namespace

bool Lowerer::lower_attention(const Node& n) {
  const std::string& t = n.target;
  if (t == "aten.rms_norm.default") {
    bind(n, lower_rms_norm(*this, n));
    return true;
  }
  // hardswish, hardsigmoid, mish: elementwise ops both ExecuTorch's portable library and
  // XNNPACK have (neither runs these three as one kernel in a portable program).
  if (t == "aten.hardswish.default" || t == "aten.hardsigmoid.default" || t == "aten.mish.default") {
    bind(n, lower_hard_activation(*this, n));
    return true;
  }
  // selu and celu: elu with its scale parameters (selu's constants as torch defines them)
  if (t == "aten.selu.default" || t == "aten.celu.default") {
    const bool selu = t == "aten.selu.default";
    const double alpha = selu ? 1.6732632423543772848170429916717 : float_value(*this, n, "alpha", 1.0);
    if (!selu && alpha == 0.0) unsupported(n, "celu with alpha 0");
    bind(n, emit("aten.elu.default",
                 {NA("self", tensor_arg(tensor_in(n, "self"))), NA("alpha", float_arg(alpha)),
                  NA("scale", float_arg(selu ? 1.0507009873554804934193349852946 : 1.0)),
                  NA("input_scale", float_arg(selu ? 1.0 : 1.0 / alpha))},
                 out_meta(n)));
    return true;
  }
  // softplus(x) = x where beta * x > threshold, else log1p(e^(beta * x)) / beta;
  // log_sigmoid(x) = min(x, 0) - log1p(e^-|x|) (no overflow for either sign)
  if (t == "aten.softplus.default" || t == "aten.log_sigmoid.default") {
    ValueId x = tensor_in(n, "self");
    TensorMeta m = out_meta(n);
    const auto narrow = in_float32(*this, n, x, m);
    auto op = [&](std::string_view target, std::vector<NamedArgument> args, std::string_view hint) {
      return emit(target, std::move(args), m, hint);
    };
    if (t == "aten.softplus.default") {
      const double beta = float_value(*this, n, "beta", 1.0), threshold = float_value(*this, n, "threshold", 20.0);
      if (beta == 0.0) unsupported(n, "softplus with beta 0");
      ValueId bx = op("aten.mul.Scalar", {NA("self", tensor_arg(x)), NA("other", float_arg(beta))}, "beta_x");
      ValueId e = op("aten.exp.default", {NA("self", tensor_arg(bx))}, "exp");
      ValueId l = op("aten.log1p.default", {NA("self", tensor_arg(e))}, "log1p");
      ValueId r = op("aten.div.Scalar", {NA("self", tensor_arg(l)), NA("other", float_arg(beta))}, "over_beta");
      TensorMeta bm = m;
      bm.dtype = ScalarType::Bool;
      ValueId c = emit("aten.gt.Scalar", {NA("self", tensor_arg(bx)), NA("other", float_arg(threshold))}, bm, "linear");
      bind(n, narrow(op("aten.where.self", {NA("condition", tensor_arg(c)), NA("self", tensor_arg(x)),
                                            NA("other", tensor_arg(r))}, "softplus")));
      return true;
    }
    ValueId lo = op("aten.clamp.default", {NA("self", tensor_arg(x)), NA("max", float_arg(0.0))}, "min0");
    ValueId a = op("aten.abs.default", {NA("self", tensor_arg(x))}, "abs");
    ValueId na = op("aten.neg.default", {NA("self", tensor_arg(a))}, "neg_abs");
    ValueId e = op("aten.exp.default", {NA("self", tensor_arg(na))}, "exp");
    ValueId l = op("aten.log1p.default", {NA("self", tensor_arg(e))}, "log1p");
    bind(n, narrow(op("aten.sub.Tensor", {NA("self", tensor_arg(lo)), NA("other", tensor_arg(l))}, "log_sigmoid")));
    return true;
  }
  // hardtanh / relu6: a clamp (the partitioner delegates it as XNNClamp).
  if (t == "aten.hardtanh.default" || t == "aten.relu6.default") {
    Argument lo = float_arg(t == "aten.relu6.default" ? 0.0 : -1.0), hi = float_arg(t == "aten.relu6.default" ? 6.0 : 1.0);
    if (const Argument* a = opt(n, "min_val")) lo = *a;
    if (const Argument* a = opt(n, "max_val")) hi = *a;
    const ScalarType dt = out_meta(n).dtype;
    if (dt != ScalarType::Float && dt != ScalarType::Double && dt != ScalarType::Half && dt != ScalarType::BFloat16 &&
        dt != ScalarType::Bool) {
      // an integer tensor: eager clamps to the bounds converted to its type (truncated: hardtanh(x, -0.5, 0.5) is 0),
      // and the result keeps the type (a float bound would promote clamp's result to float32)
      for (Argument* b : {&lo, &hi})
        if (b->kind == Argument::Kind::Float) {
          const double v = std::trunc(std::get<double>(b->payload));
          if (!(v >= -9.2e18 && v <= 9.2e18)) unsupported(n, "hardtanh of an integer tensor with a bound out of int64's range");
          *b = int_arg(static_cast<int64_t>(v));
        }
    }
    bind(n, emit("aten.clamp.default", {NA("self", tensor_arg(tensor_in(n, "self"))), NA("min", lo), NA("max", hi)},
                 out_meta(n)));
    return true;
  }
  if (t == "aten.scaled_dot_product_attention.default") {
    bind(n, lower_sdpa(*this, n, attention_args(*this, n), out_meta(n)));
    return true;
  }
  if (t == "aten._scaled_dot_product_flash_attention_for_cpu.default" ||
      t == "aten._scaled_dot_product_attention_math.default") {
    // Tuple results: (output, logsumexp) or (output, attention weights); only the output is computed.
    auto outs = source_outputs(n);
    for (size_t i = 1; i < outs.size(); ++i)
      for (const Node& user : ep_.graph.nodes)
        for (const auto& in : user.inputs)
          for (ValueId v : in.arg.tensor_ids())
            if (v == outs[i]) unsupported(n, "attention whose second result (logsumexp/weights) is used");
    Attention a = attention_args(*this, n);
    if (t == "aten._scaled_dot_product_attention_math.default" && opt_tensor_in(n, "dropout_mask"))
      unsupported(n, "attention with a dropout mask");
    bind(n, lower_sdpa(*this, n, a, out_meta(n, 0)));
    return true;
  }
  if (t == "aten._safe_softmax.default") {
    // softmax, with 0 for rows that are all -inf (a plain softmax when none can be)
    ValueId x = tensor_in(n, "self");
    if (auto dt = dtype_in(n)) x = convert(x, *dt);
    const TensorMeta xm = meta_of(x);
    int64_t dim = wrap_dim(int_in(n, "dim"), xm.sizes.size());
    TensorMeta m = out_meta(n);
    ValueId sm = emit("aten._softmax.default", {NA("self", tensor_arg(x)), NA("dim", int_arg(dim)),
                                                NA("half_to_float", bool_arg(false))}, m, "softmax");
    if (dim + 1 == static_cast<int64_t>(xm.sizes.size()) && no_row_all_neg_inf(*this, x)) {
      bind(n, sm);
      return true;
    }
    TensorMeta bm = contiguous(ScalarType::Bool, xm.sizes);
    std::vector<int64_t> row = xm.sizes;
    row[static_cast<size_t>(dim)] = 1;
    TensorMeta rm = contiguous(ScalarType::Bool, row);
    ValueId inf = emit("aten.eq.Scalar", {NA("self", tensor_arg(x)),
                                          NA("other", float_arg(-std::numeric_limits<double>::infinity()))}, bm, "is_ninf");
    ValueId fin = emit("aten.logical_not.default", {NA("self", tensor_arg(inf))}, bm, "finite");
    ValueId any = emit("aten.any.dim", {NA("self", tensor_arg(fin)), NA("dim", int_arg(dim)), NA("keepdim", bool_arg(true))},
                       rm, "row_finite");
    ValueId dead = emit("aten.logical_not.default", {NA("self", tensor_arg(any))}, rm, "row_masked");
    ValueId zero = scalar_tensor(float_arg(0.0), m.dtype);
    bind(n, emit("aten.where.self", {NA("condition", tensor_arg(dead)), NA("self", tensor_arg(zero)),
                                     NA("other", tensor_arg(sm))}, m));
    return true;
  }
  if (t == "aten.where.self") {
    if (auto sm = safe_softmax(*this, n)) {
      bind(n, *sm);
      return true;
    }
    return false;
  }
  return false;
}

}  // namespace kiln::passes::detail
