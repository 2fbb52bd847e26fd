// Decompositions of nn modules' operators, each in torch's own formula (torch/_refs/nn/functional, torch/_decomp,
// aten/src/ATen/native) so that rounding follows eager's: losses, shrinks, RNN cells, 3-d pooling. The table that
// names them is decompositions.cpp's.
#include "decompositions.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>

namespace kiln::passes::detail::decomp {

// Losses (reduction 0 none, 1 mean, 2 sum) from the elementwise difference d = self - target.
void reduce_loss(L& l, const Node& n, ValueId e) {
  const TensorMeta m = l.out_meta(n);
  const int64_t reduction = l.int_in(n, "reduction", 1);
  if (reduction == 0) {
    l.bind(n, e);
    return;
  }
  std::vector<int64_t> dims(l.meta_of(e).sizes.size());
  std::iota(dims.begin(), dims.end(), 0);
  l.bind(n, l.emit(reduction == 1 ? "aten.mean.dim" : "aten.sum.dim_IntList",
                   {NA("self", tensor_arg(e)), NA("dim", ints_arg(dims)), NA("keepdim", bool_arg(false))}, m));
}

ValueId loss_diff(L& l, const Node& n, bool absolute) {
  ValueId x = l.tensor_in(n, "self"), y = l.tensor_in(n, "target");
  std::vector<int64_t> s = l.meta_of(x).sizes;  // the broadcast shape of the two
  const auto& ys = l.meta_of(y).sizes;
  if (ys.size() > s.size()) s.insert(s.begin(), ys.size() - s.size(), 1);
  for (size_t i = 0; i < ys.size(); ++i) {
    int64_t& d = s[s.size() - ys.size() + i];
    d = d == 1 ? ys[i] : d;
  }
  const TensorMeta em = contiguous(l.out_meta(n).dtype, s);
  ValueId d = l.emit("aten.sub.Tensor", {NA("self", tensor_arg(x)), NA("other", tensor_arg(y))}, em, "diff");
  return absolute ? l.emit("aten.abs.default", {NA("self", tensor_arg(d))}, em, "abs_diff") : d;
}

void l1_loss(L& l, const Node& n) { reduce_loss(l, n, loss_diff(l, n, true)); }

void mse_loss(L& l, const Node& n) {
  ValueId d = loss_diff(l, n, false);
  reduce_loss(l, n, l.emit("aten.mul.Tensor", {NA("self", tensor_arg(d)), NA("other", tensor_arg(d))},
                           contiguous(l.meta_of(d)), "sq_diff"));
}

// smooth_l1_loss(beta) / huber_loss(delta): |d| < beta ? 0.5 d^2 / beta : |d| - 0.5 beta (huber: times delta).
void smooth_l1(L& l, const Node& n, double beta, double scale) {
  ValueId a = loss_diff(l, n, true);
  const TensorMeta em = contiguous(l.meta_of(a));
  if (beta == 0.0) {
    reduce_loss(l, n, a);
    return;
  }
  ValueId sq = l.emit("aten.mul.Tensor", {NA("self", tensor_arg(a)), NA("other", tensor_arg(a))}, em, "sq");
  sq = l.emit("aten.mul.Scalar", {NA("self", tensor_arg(sq)), NA("other", float_arg(0.5 * scale / beta))}, em, "quad");
  ValueId lin = l.emit("aten.sub.Scalar", {NA("self", tensor_arg(a)), NA("other", float_arg(0.5 * beta))}, em, "lin");
  if (scale != 1.0)
    lin = l.emit("aten.mul.Scalar", {NA("self", tensor_arg(lin)), NA("other", float_arg(scale))}, em, "lin");
  ValueId small = l.emit("aten.lt.Scalar", {NA("self", tensor_arg(a)), NA("other", float_arg(beta))},
                         contiguous(ScalarType::Bool, em.sizes), "small");
  reduce_loss(l, n, l.emit("aten.where.self", {NA("condition", tensor_arg(small)), NA("self", tensor_arg(sq)),
                                               NA("other", tensor_arg(lin))}, em, "elementwise"));
}

void smooth_l1_loss(L& l, const Node& n) { smooth_l1(l, n, l.number_in(n, "beta", 1.0), 1.0); }
void huber_loss(L& l, const Node& n) {
  const double delta = l.number_in(n, "delta", 1.0);
  smooth_l1(l, n, delta, delta);
}

// ---- more losses and shrinks (the module sweep's nn.*Loss, nn.Hardshrink/Softshrink), each in torch's own formula
// (torch/_refs/nn/functional and torch/_decomp) so that rounding follows eager's.


void kl_div(L& l, const Node& n) {  // log_target: e^t (t - x); else xlogy(t, t) - t x
  Ops o = ops_of(l, n);
  ValueId x = l.tensor_in(n, "self"), t = l.tensor_in(n, "target");
  if (l.int_in(n, "log_target", 0)) {
    reduce_loss(l, n, o.bin("aten.mul.Tensor", o.un("aten.exp.default", t, "exp_t"),
                            o.bin("aten.sub.Tensor", t, x, "diff"), "elementwise"));
    return;
  }
  ValueId tlogt = o.bin("aten.mul.Tensor", t, o.un("aten.log.default", t, "log_t"), "tlogt");
  ValueId xlogy = o.where(o.cmp("aten.eq.Scalar", t, 0.0, "t_zero"), o.zero(), tlogt, "xlogy");
  reduce_loss(l, n, o.bin("aten.sub.Tensor", xlogy, o.bin("aten.mul.Tensor", t, x, "tx"), "elementwise"));
}

void margin_ranking_loss(L& l, const Node& n) {  // max(0, -y (x1 - x2) + margin)
  Ops o = ops_of(l, n);
  ValueId a = l.tensor_in(n, "input1"), b = l.tensor_in(n, "input2"), y = l.tensor_in(n, "target");
  // -y (x1 - x2) in the tensors' own promoted type, as eager computes it (integers wrap there); the float margin
  // then promotes to the result's type
  Ops t{l, promote_types(promote_types(l.meta_of(a).dtype, l.meta_of(b).dtype), l.meta_of(y).dtype)};
  ValueId e = l.convert(t.bin("aten.mul.Tensor", t.un("aten.neg.default", y, "neg_y"), t.bin("aten.sub.Tensor", a, b, "diff"),
                              "scaled"),
                        o.dt);
  e = o.scal("aten.add.Scalar", e, l.number_in(n, "margin", 0.0), "shifted");
  reduce_loss(l, n, o.clamp(e, 0.0, std::nullopt, "elementwise"));
}

void soft_margin_loss(L& l, const Node& n) {  // log1p(exp(-x y))
  Ops o = ops_of(l, n);
  ValueId x = l.tensor_in(n, "self"), y = l.convert(l.tensor_in(n, "target"), o.dt);
  ValueId e = o.bin("aten.mul.Tensor", o.un("aten.neg.default", x, "neg_x"), y, "margin");
  reduce_loss(l, n, o.un("aten.log1p.default", o.un("aten.exp.default", e, "exp"), "elementwise"));
}

void binary_cross_entropy(L& l, const Node& n) {  // (t - 1) max(log1p(-x), -100) - t max(log x, -100), times weight
  Ops o = ops_of(l, n);
  ValueId x = l.tensor_in(n, "self"), t = l.tensor_in(n, "target");
  ValueId lo = o.clamp(o.un("aten.log1p.default", o.un("aten.neg.default", x, "neg_x"), "log1m_x"), -100.0,
                       std::nullopt, "log1m_x");
  ValueId lx = o.clamp(o.un("aten.log.default", x, "log_x"), -100.0, std::nullopt, "log_x");
  ValueId e = o.bin("aten.sub.Tensor", o.bin("aten.mul.Tensor", o.scal("aten.sub.Scalar", t, 1.0, "t_1"), lo, "a"),
                    o.bin("aten.mul.Tensor", t, lx, "b"), "elementwise");
  if (auto w = l.opt_tensor_in(n, "weight")) e = o.bin("aten.mul.Tensor", e, *w, "weighted");
  reduce_loss(l, n, e);
}

// (1 - t) x - lw log_sigmoid(x), lw = 1 + (pos_weight - 1) t; times weight. log_sigmoid(x) = min(x, 0) - log1p(e^-|x|).
void binary_cross_entropy_with_logits(L& l, const Node& n) {
  Ops o = ops_of(l, n);
  ValueId x = l.tensor_in(n, "self"), t = l.tensor_in(n, "target");
  ValueId ls = o.bin("aten.sub.Tensor", o.clamp(x, std::nullopt, 0.0, "min_x_0"),
                     o.un("aten.log1p.default",
                          o.un("aten.exp.default", o.un("aten.neg.default", o.un("aten.abs.default", x, "abs"), "neg"),
                               "exp"), "log1p"), "log_sigmoid");
  if (auto pw = l.opt_tensor_in(n, "pos_weight"))
    ls = o.bin("aten.mul.Tensor",
               o.scal("aten.add.Scalar", o.bin("aten.mul.Tensor", o.scal("aten.sub.Scalar", *pw, 1.0, "pw_1"), t, "lw"),
                      1.0, "log_weight"), ls, "weighted_log_sigmoid");
  ValueId e = o.bin("aten.sub.Tensor",
                    o.bin("aten.mul.Tensor",
                          l.emit("aten.rsub.Scalar", {NA("self", tensor_arg(t)), NA("other", float_arg(1.0))},
                                 contiguous(l.meta_of(t)), "one_minus_t"), x, "a"), ls, "elementwise");
  if (auto w = l.opt_tensor_in(n, "weight")) e = o.bin("aten.mul.Tensor", e, *w, "weighted");
  reduce_loss(l, n, e);
}

void poisson_nll_loss(L& l, const Node& n) {  // log_input: e^x - t x; else x - t log(x + eps); full: + Stirling (t > 1)
  constexpr double kPi = 3.14159265358979323846;
  Ops o = ops_of(l, n);
  // integer input and target: the loss is float (the steps in the result's type, as exp and log promote them)
  ValueId x = l.convert(l.tensor_in(n, "input"), o.dt), t = l.convert(l.tensor_in(n, "target"), o.dt);
  ValueId e = l.int_in(n, "log_input", 1)
                  ? o.bin("aten.sub.Tensor", o.un("aten.exp.default", x, "exp_x"), o.bin("aten.mul.Tensor", t, x, "tx"),
                          "elementwise")
                  : o.bin("aten.sub.Tensor", x,
                          o.bin("aten.mul.Tensor", t,
                                o.un("aten.log.default", o.scal("aten.add.Scalar", x, l.number_in(n, "eps", 1e-8), "x_eps"),
                                     "log"), "tlog"), "elementwise");
  if (l.int_in(n, "full", 0)) {
    ValueId st = o.bin("aten.sub.Tensor", o.bin("aten.mul.Tensor", t, o.un("aten.log.default", t, "log_t"), "tlogt"), t,
                       "st");
    st = o.bin("aten.add.Tensor", st,
               o.scal("aten.mul.Scalar", o.un("aten.log.default", o.scal("aten.mul.Scalar", t, 2 * kPi, "two_pi_t"),
                                              "log_two_pi_t"), 0.5, "half_log"), "stirling");
    st = o.where(o.cmp("aten.le.Scalar", t, 1.0, "small_t"), o.zero(), st, "stirling");
    e = o.bin("aten.add.Tensor", e, st, "elementwise");
  }
  reduce_loss(l, n, e);
}

// The mean of nll-type losses: the sum divided by the sum of the picked weights (reduce_loss's mean divides by the
// count).
void reduce_weighted(L& l, const Node& n, Ops& o, ValueId e, ValueId wsum) {
  const int64_t reduction = l.int_in(n, "reduction", 1);
  const TensorMeta m = l.out_meta(n);
  if (reduction == 0) {
    l.bind(n, l.view(e, m.sizes));
    return;
  }
  ValueId s = o.sum_all(e, "sum");
  l.bind(n, reduction == 2 ? s : l.emit("aten.div.Tensor", {NA("self", tensor_arg(s)), NA("other", tensor_arg(wsum))},
                                         m, "mean"));
}

// nll_loss_nd / cross_entropy_loss with class indices: x [N, C, d...] (or [C]) of log-probabilities, t [N, d...]:
// -w[t] x[n, t, ...] where t != ignore_index, else 0; label smoothing (cross entropy) as torch's
// _cross_entropy_loss_label_smoothing: (1 - ls) nll + ls / C * (-sum_c w_c x_c), the mean divided by sum w[t] too.
void nll_of(L& l, const Node& n, Ops& o, ValueId x, ValueId t, double smoothing) {
  if (l.meta_of(x).sizes.size() == 1) {  // one sample: [C] and a 0-d target
    x = l.view(x, {1, l.meta_of(x).sizes[0]});
    t = l.view(t, {1});
  }
  const std::vector<int64_t> xs = l.meta_of(x).sizes, ts = l.meta_of(t).sizes;
  const int64_t C = xs[1];
  if (ts.size() + 1 != xs.size()) l.unsupported(n, "target's rank is not input's rank - 1");
  const int64_t ignore = l.int_in(n, "ignore_index", -100);
  ValueId valid = l.emit("aten.ne.Scalar", {NA("self", tensor_arg(t)), NA("other", int_arg(ignore))},
                         contiguous(ScalarType::Bool, ts), "valid");
  ValueId safe = l.emit("aten.where.self", {NA("condition", tensor_arg(valid)), NA("self", tensor_arg(t)),
                                            NA("other", tensor_arg(l.scalar_tensor(int_arg(0), l.meta_of(t).dtype)))},
                        contiguous(l.meta_of(t)), "safe_target");
  std::vector<int64_t> is = ts;
  is.insert(is.begin() + 1, 1);
  ValueId picked = l.emit("aten.gather.default", {NA("self", tensor_arg(x)), NA("dim", int_arg(1)),
                                                  NA("index", tensor_arg(l.view(safe, is)))}, contiguous(o.dt, is),
                          "picked");
  picked = l.view(picked, ts);
  auto w = l.opt_tensor_in(n, "weight");
  ValueId wt;
  if (w) {
    int64_t numel = 1;
    for (int64_t d : ts) numel *= d;
    wt = l.view(l.emit("aten.index_select.default", {NA("self", tensor_arg(*w)), NA("dim", int_arg(0)),
                                                     NA("index", tensor_arg(l.view(safe, {numel})))},
                       contiguous(o.dt, {numel}), "weight_of_target"), ts);
    wt = o.where(valid, wt, o.zero(), "weight_of_target");
  } else {
    wt = l.convert(valid, o.dt);
  }
  ValueId e = o.where(valid, o.un("aten.neg.default", o.bin("aten.mul.Tensor", picked, wt, "weighted"), "nll"),
                      o.zero(), "nll");
  const int64_t reduction = l.int_in(n, "reduction", 1);
  ValueId wsum = reduction == 1 ? o.sum_all(wt, "weight_sum") : e;
  if (smoothing > 0.0) {
    ValueId xw = x;
    if (w) {
      std::vector<int64_t> ws(xs.size(), 1);
      ws[1] = C;
      xw = o.bin("aten.mul.Tensor", x, l.view(*w, ws), "weighted_x");
    }
    ValueId sm = o.where(valid, o.un("aten.neg.default", o.sum_dim(xw, 1, "class_sum"), "smooth"), o.zero(), "smooth");
    if (reduction == 0) {
      e = o.bin("aten.add.Tensor", o.scal("aten.mul.Scalar", e, 1.0 - smoothing, "nll_part"),
                o.scal("aten.mul.Scalar", sm, smoothing / static_cast<double>(C), "smooth_part"), "loss");
    } else {
      ValueId a = o.sum_all(e, "nll_sum"), b = o.sum_all(sm, "smooth_sum");
      if (reduction == 1) {
        a = o.bin("aten.div.Tensor", a, wsum, "nll_mean");
        b = o.bin("aten.div.Tensor", b, wsum, "smooth_mean");
      }
      l.bind(n, o.bin("aten.add.Tensor", o.scal("aten.mul.Scalar", a, 1.0 - smoothing, "nll_part"),
                      o.scal("aten.mul.Scalar", b, smoothing / static_cast<double>(C), "smooth_part"), "loss"));
      return;
    }
  }
  reduce_weighted(l, n, o, e, wsum);
}

void nll_loss(L& l, const Node& n) {
  Ops o = ops_of(l, n);
  nll_of(l, n, o, l.tensor_in(n, "self"), l.tensor_in(n, "target"), 0.0);
}

// log_softmax over the class dim (1; 0 for one sample), then nll on class indices; class probabilities (a float
// target of the input's shape): -sum_c w_c t_c log p_c per sample (t smoothed to t (1 - ls) + ls / C), the mean over
// the samples.
void cross_entropy_loss(L& l, const Node& n) {
  Ops o = ops_of(l, n);
  ValueId x = l.tensor_in(n, "self"), t = l.tensor_in(n, "target");
  const auto xs = l.meta_of(x).sizes;
  const int64_t cdim = xs.size() >= 2 ? 1 : 0;
  const double ls = l.number_in(n, "label_smoothing", 0.0);
  ValueId lsm = l.emit("aten._log_softmax.default", {NA("self", tensor_arg(x)), NA("dim", int_arg(cdim)),
                                                     NA("half_to_float", bool_arg(false))}, contiguous(l.meta_of(x)),
                       "log_softmax");
  const ScalarType tdt = l.meta_of(t).dtype;
  if (tdt == ScalarType::Long || tdt == ScalarType::Int) {
    nll_of(l, n, o, lsm, t, ls);
    return;
  }
  if (l.meta_of(t).sizes != xs) l.unsupported(n, "class probabilities of a shape other than the input's");
  if (l.int_in(n, "ignore_index", -100) != -100) l.unsupported(n, "ignore_index with class probabilities");
  const int64_t C = xs[static_cast<size_t>(cdim)];
  if (ls > 0.0)
    t = o.scal("aten.add.Scalar", o.scal("aten.mul.Scalar", t, 1.0 - ls, "kept"), ls / static_cast<double>(C), "smoothed");
  ValueId p = o.bin("aten.mul.Tensor", lsm, t, "tlogp");
  if (auto w = l.opt_tensor_in(n, "weight")) {
    std::vector<int64_t> ws(xs.size(), 1);
    ws[static_cast<size_t>(cdim)] = C;
    p = o.bin("aten.mul.Tensor", p, l.view(*w, ws), "weighted");
  }
  ValueId e = o.un("aten.neg.default", o.sum_dim(p, cdim, "class_sum"), "per_sample");
  reduce_loss(l, n, e);
}

// multi_margin_loss: per sample sum_{i != y} max(0, margin - x_y + x_i)^p (times w_y) / C.
void multi_margin_loss(L& l, const Node& n) {
  Ops o = ops_of(l, n);
  ValueId x = l.tensor_in(n, "self"), t = l.tensor_in(n, "target");
  if (l.meta_of(x).sizes.size() <= 1) {  // one sample ([C], or a 0-d input: C = 1)
    x = l.view(x, {1, l.meta_of(x).numel()});
    t = l.view(t, {1});
  }
  const auto xs = l.meta_of(x).sizes;
  if (xs.size() != 2) l.unsupported(n, "input must be 1-d or 2-d");
  const int64_t N = xs[0], C = xs[1];
  const int64_t p = l.int_in(n, "p", 1);
  if (p != 1 && p != 2) l.unsupported(n, "p must be 1 or 2");
  ValueId tc = l.view(t, {N, 1});
  ValueId xy = l.emit("aten.gather.default", {NA("self", tensor_arg(x)), NA("dim", int_arg(1)),
                                              NA("index", tensor_arg(tc))}, contiguous(o.dt, {N, 1}), "x_target");
  ValueId z = o.bin("aten.add.Tensor", l.emit("aten.rsub.Scalar", {NA("self", tensor_arg(xy)),
                                                                  NA("other", float_arg(l.number_in(n, "margin", 1.0)))},
                                              contiguous(o.dt, {N, 1}), "margin_minus_xy"), x, "z");
  z = o.clamp(z, 0.0, std::nullopt, "hinge");
  if (p == 2) z = o.bin("aten.mul.Tensor", z, z, "squared");
  if (auto w = l.opt_tensor_in(n, "weight"))
    z = o.bin("aten.mul.Tensor", z, l.view(l.emit("aten.index_select.default",
                                                  {NA("self", tensor_arg(*w)), NA("dim", int_arg(0)),
                                                   NA("index", tensor_arg(l.view(t, {N})))}, contiguous(o.dt, {N}),
                                                  "w_target"), {N, 1}), "weighted");
  ValueId is_y = l.emit("aten.eq.Tensor", {NA("self", tensor_arg(l.view(iota_constant(l, C, ScalarType::Long, "classes"),
                                                                       {1, C}))),
                                           NA("other", tensor_arg(tc))}, contiguous(ScalarType::Bool, {N, C}), "is_y");
  z = o.where(is_y, o.zero(), z, "others");
  ValueId e = o.scal("aten.div.Scalar", o.sum_dim(z, 1, "sum"), static_cast<double>(C), "per_sample");
  const TensorMeta m = l.out_meta(n);
  if (l.int_in(n, "reduction", 1) == 0) {
    l.bind(n, l.view(e, m.sizes));
    return;
  }
  reduce_loss(l, n, e);
}

// multilabel_margin_loss: per sample, the targets are t's entries before the first -1; the loss is
// sum_{j target} sum_{i not a target} max(0, 1 - (x_j - x_i)) / C.
void multilabel_margin_loss(L& l, const Node& n) {
  Ops o = ops_of(l, n);
  ValueId x = l.tensor_in(n, "self"), t = l.convert(l.tensor_in(n, "target"), ScalarType::Long);
  const bool one = l.meta_of(x).sizes.size() <= 1;  // one sample ([C], or 0-d: C = 1): eager's unreduced loss is 0-d
  if (one) {
    x = l.view(x, {1, l.meta_of(x).numel()});
    t = l.view(t, {1, l.meta_of(t).numel()});
  }
  const auto xs = l.meta_of(x).sizes;
  if (xs.size() != 2 || l.meta_of(t).sizes != xs) l.unsupported(n, "input and target must be [C] or [N, C] alike");
  const int64_t N = xs[0], C = xs[1];
  const TensorMeta lb = contiguous(ScalarType::Long, {N, C});
  ValueId ends = l.convert(l.emit("aten.eq.Scalar", {NA("self", tensor_arg(t)), NA("other", int_arg(-1))},
                                  contiguous(ScalarType::Bool, {N, C}), "end"), ScalarType::Long);
  ValueId past = l.emit("aten.cumsum.default", {NA("self", tensor_arg(ends)), NA("dim", int_arg(1))}, lb, "ends_so_far");
  ValueId valid = l.emit("aten.eq.Scalar", {NA("self", tensor_arg(past)), NA("other", int_arg(0))},
                         contiguous(ScalarType::Bool, {N, C}), "valid");  // [N, k]
  ValueId safe = l.emit("aten.clamp.default", {NA("self", tensor_arg(t)), NA("min", int_arg(0))}, lb, "safe_target");
  // is_target[n, i]: some valid k has t[n, k] == i
  ValueId hot = l.emit("aten.eq.Tensor", {NA("self", tensor_arg(l.view(safe, {N, C, 1}))),
                                          NA("other", tensor_arg(l.view(iota_constant(l, C, ScalarType::Long, "classes"),
                                                                        {1, 1, C})))},
                       contiguous(ScalarType::Bool, {N, C, C}), "hot");
  hot = l.emit("aten.logical_and.default", {NA("self", tensor_arg(hot)), NA("other", tensor_arg(l.view(valid, {N, C, 1})))},
               contiguous(ScalarType::Bool, {N, C, C}), "hot");
  ValueId is_t = l.emit("aten.any.dim", {NA("self", tensor_arg(hot)), NA("dim", int_arg(1)), NA("keepdim", bool_arg(true))},
                        contiguous(ScalarType::Bool, {N, 1, C}), "is_target");
  ValueId xj = l.emit("aten.gather.default", {NA("self", tensor_arg(x)), NA("dim", int_arg(1)),
                                              NA("index", tensor_arg(safe))}, contiguous(o.dt, {N, C}), "x_target");
  ValueId d = o.bin("aten.sub.Tensor", l.view(xj, {N, C, 1}), l.view(x, {N, 1, C}), "diff");
  ValueId h = o.clamp(l.emit("aten.rsub.Scalar", {NA("self", tensor_arg(d)), NA("other", float_arg(1.0))},
                             contiguous(o.dt, {N, C, C}), "one_minus"), 0.0, std::nullopt, "hinge");
  ValueId keep = l.emit("aten.logical_and.default",
                        {NA("self", tensor_arg(l.view(valid, {N, C, 1}))),
                         NA("other", tensor_arg(l.emit("aten.logical_not.default", {NA("self", tensor_arg(is_t))},
                                                       contiguous(ScalarType::Bool, {N, 1, C}), "not_target")))},
                        contiguous(ScalarType::Bool, {N, C, C}), "pairs");
  h = o.where(keep, h, o.zero(), "counted");
  ValueId e = o.scal("aten.div.Scalar", l.emit("aten.sum.dim_IntList", {NA("self", tensor_arg(h)), NA("dim", ints_arg({1, 2})),
                                                                        NA("keepdim", bool_arg(false))},
                                               contiguous(o.dt, {N}), "sum"), static_cast<double>(C), "per_sample");
  if (l.int_in(n, "reduction", 1) == 0) {
    l.bind(n, one ? l.view(e, {}) : e);
    return;
  }
  reduce_loss(l, n, e);
}

void hardshrink(L& l, const Node& n) {  // where(|x| <= lambd, 0, x)
  Ops o = ops_of(l, n);
  ValueId x = l.tensor_in(n, "self");
  ValueId small = o.cmp("aten.le.Scalar", o.un("aten.abs.default", x, "abs"), l.number_in(n, "lambd", 0.5), "small");
  l.bind(n, o.where(small, o.zero(), x, "hardshrink"));
}

void softshrink(L& l, const Node& n) {  // where(|x| > lambd, x - sign(x) lambd, 0)
  Ops o = ops_of(l, n);
  ValueId x = l.tensor_in(n, "self");
  const double lambd = l.number_in(n, "lambd", 0.5);
  ValueId big = o.cmp("aten.gt.Scalar", o.un("aten.abs.default", x, "abs"), lambd, "big");
  ValueId shifted = o.bin("aten.sub.Tensor", x, o.scal("aten.mul.Scalar", o.un("aten.sign.default", x, "sign"), lambd,
                                                      "shift"), "shifted");
  l.bind(n, o.where(big, shifted, o.zero(), "softshrink"));
}

void threshold(L& l, const Node& n) {  // where(x <= threshold, value, x)
  Ops o = ops_of(l, n);
  ValueId x = l.tensor_in(n, "self");
  ValueId below = o.cmp("aten.le.Scalar", x, l.number_in(n, "threshold", 0.0), "below");
  l.bind(n, o.where(below, l.scalar_tensor(l.arg(n, "value"), o.dt), x, "threshold"));
}

// hinge_embedding_loss: where(t != 1, max(margin - x, 0), 0) + where(t != -1, x, 0)
void hinge_embedding_loss(L& l, const Node& n) {
  Ops o = ops_of(l, n);
  ValueId x = l.tensor_in(n, "self"), t = l.tensor_in(n, "target");
  ValueId mc = o.clamp(l.emit("aten.rsub.Scalar", {NA("self", tensor_arg(x)),
                                                   NA("other", float_arg(l.number_in(n, "margin", 1.0)))},
                              contiguous(l.meta_of(x)), "margin_minus_x"), 0.0, std::nullopt, "margin_clamp");
  ValueId a = o.where(o.cmp("aten.ne.Scalar", t, 1.0, "not_pos"), mc, o.zero(), "output_margin");
  ValueId b = o.where(o.cmp("aten.ne.Scalar", t, -1.0, "not_neg"), x, o.zero(), "output_self");
  reduce_loss(l, n, o.bin("aten.add.Tensor", a, b, "elementwise"));
}

// cosine_embedding_loss: cos = sum(x1 x2) / sqrt((sum(x1^2) + eps) (sum(x2^2) + eps)) over the last dim (eps 1e-12);
// where(t == 1, 1 - cos, 0) + where(t == -1, max(cos - margin, 0), 0)
void cosine_embedding_loss(L& l, const Node& n) {
  Ops o = ops_of(l, n);
  ValueId a = l.tensor_in(n, "input1"), b = l.tensor_in(n, "input2"), t = l.tensor_in(n, "target");
  const int64_t d = static_cast<int64_t>(l.meta_of(a).sizes.size()) - 1;
  if (d < 0) l.unsupported(n, "0-d inputs");
  ValueId prod = o.sum_dim(o.bin("aten.mul.Tensor", a, b, "prod"), d, "prod_sum");
  ValueId m1 = o.scal("aten.add.Scalar", o.sum_dim(o.bin("aten.mul.Tensor", a, a, "sq1"), d, "mag1"), 1e-12, "mag1");
  ValueId m2 = o.scal("aten.add.Scalar", o.sum_dim(o.bin("aten.mul.Tensor", b, b, "sq2"), d, "mag2"), 1e-12, "mag2");
  ValueId cos = o.bin("aten.div.Tensor", prod, o.un("aten.sqrt.default", o.bin("aten.mul.Tensor", m1, m2, "mags"),
                                                    "denom"), "cos");
  ValueId pos = l.emit("aten.rsub.Scalar", {NA("self", tensor_arg(cos)), NA("other", float_arg(1.0))},
                       contiguous(l.meta_of(cos)), "pos");
  ValueId neg = o.clamp(o.scal("aten.sub.Scalar", cos, l.number_in(n, "margin", 0.0), "neg"), 0.0, std::nullopt, "neg");
  ValueId e = o.bin("aten.add.Tensor", o.where(o.cmp("aten.eq.Scalar", t, 1.0, "is_pos"), pos, o.zero(), "output_pos"),
                    o.where(o.cmp("aten.eq.Scalar", t, -1.0, "is_neg"), neg, o.zero(), "output_neg"), "elementwise");
  reduce_loss(l, n, e);
}

// ---- RNN cells (nn.RNNCell / GRUCell / LSTMCell): one step, torch's formulas (aten/src/ATen/native/RNN.cpp)

// x @ W^T (+ b): [B, G]
ValueId cell_linear(L& l, const Node& n, ValueId x, const char* w, const char* b, const char* hint) {
  ValueId wv = l.tensor_in(n, w);
  const auto& wm = l.meta_of(wv);
  if (wm.sizes.size() != 2) l.unsupported(n, fmt::format("'{}' is not a matrix", w));
  const TensorMeta m = contiguous(wm.dtype, {l.meta_of(x).sizes[0], wm.sizes[0]});
  ValueId wt = l.transposed_weight(wv);
  if (auto bv = l.opt_tensor_in(n, b))
    return l.emit("aten.addmm.default", {NA("self", tensor_arg(*bv)), NA("mat1", tensor_arg(x)),
                                         NA("mat2", tensor_arg(wt))}, m, hint);
  return l.emit("aten.mm.default", {NA("self", tensor_arg(x)), NA("mat2", tensor_arg(wt))}, m, hint);
}

// The cell's input and hidden state as [B, I], [B, H] (one sample: [I], [H] viewed as a batch of one).
ValueId as_batch(L& l, ValueId v) {
  const auto s = l.meta_of(v).sizes;
  return s.size() == 1 ? l.view(v, {1, s[0]}) : v;
}

std::vector<ValueId> gate_pieces(L& l, ValueId g, int64_t count, const char* hint) {
  const auto s = l.meta_of(g).sizes;
  const int64_t H = s[1] / count;
  const TensorMeta pm = contiguous(l.meta_of(g).dtype, {s[0], H});
  return l.emit_raw("aten.split_with_sizes_copy.default",
                    {NA("self", tensor_arg(g)), NA("split_sizes", ints_arg(std::vector<int64_t>(static_cast<size_t>(count), H))),
                     NA("dim", int_arg(1))}, std::vector<TensorMeta>(static_cast<size_t>(count), pm), hint);
}

void rnn_cell(L& l, const Node& n, const char* act) {  // act(x W_ih^T + b_ih + h W_hh^T + b_hh)
  Ops o = ops_of(l, n);
  ValueId x = as_batch(l, l.tensor_in(n, "input")), h = as_batch(l, l.tensor_in(n, "hx"));
  ValueId s = o.bin("aten.add.Tensor", cell_linear(l, n, x, "w_ih", "b_ih", "input_gates"),
                    cell_linear(l, n, h, "w_hh", "b_hh", "hidden_gates"), "gates");
  l.bind(n, l.view(o.un(act, s, "hy"), l.out_meta(n).sizes));
}

void rnn_tanh_cell(L& l, const Node& n) { rnn_cell(l, n, "aten.tanh.default"); }
void rnn_relu_cell(L& l, const Node& n) { rnn_cell(l, n, "aten.relu.default"); }

void gru_cell(L& l, const Node& n) {  // r, z = sigmoid(i_r + h_r), sigmoid(i_z + h_z); c = tanh(i_n + r h_n); c + z (h - c)
  Ops o = ops_of(l, n);
  ValueId x = as_batch(l, l.tensor_in(n, "input")), h = as_batch(l, l.tensor_in(n, "hx"));
  auto gi = gate_pieces(l, cell_linear(l, n, x, "w_ih", "b_ih", "input_gates"), 3, "input_gate");
  auto gh = gate_pieces(l, cell_linear(l, n, h, "w_hh", "b_hh", "hidden_gates"), 3, "hidden_gate");
  ValueId r = o.un("aten.sigmoid.default", o.bin("aten.add.Tensor", gi[0], gh[0], "r"), "reset");
  ValueId z = o.un("aten.sigmoid.default", o.bin("aten.add.Tensor", gi[1], gh[1], "z"), "update");
  ValueId c = o.un("aten.tanh.default", o.bin("aten.add.Tensor", gi[2], o.bin("aten.mul.Tensor", r, gh[2], "r_hn"), "c"),
                   "new");
  ValueId hy = o.bin("aten.add.Tensor", c, o.bin("aten.mul.Tensor", z, o.bin("aten.sub.Tensor", h, c, "h_c"), "zh"), "hy");
  l.bind(n, l.view(hy, l.out_meta(n).sizes));
}

void lstm_cell(L& l, const Node& n) {  // c' = sigmoid(f) c + sigmoid(i) tanh(g); h' = sigmoid(o) tanh(c')
  Ops o = ops_of(l, n);
  const Argument hx = l.remap(l.arg(n, "hx"));
  if (hx.kind != Argument::Kind::Tensors || std::get<std::vector<ValueId>>(hx.payload).size() != 2)
    l.unsupported(n, "hx must be two tensors (h, c)");
  const auto& hc = std::get<std::vector<ValueId>>(hx.payload);
  ValueId x = as_batch(l, l.tensor_in(n, "input")), h = as_batch(l, hc[0]), c = as_batch(l, hc[1]);
  ValueId gates = o.bin("aten.add.Tensor", cell_linear(l, n, x, "w_ih", "b_ih", "input_gates"),
                        cell_linear(l, n, h, "w_hh", "b_hh", "hidden_gates"), "gates");
  auto g = gate_pieces(l, gates, 4, "gate");
  ValueId ig = o.un("aten.sigmoid.default", g[0], "ingate"), fg = o.un("aten.sigmoid.default", g[1], "forgetgate");
  ValueId cg = o.un("aten.tanh.default", g[2], "cellgate"), og = o.un("aten.sigmoid.default", g[3], "outgate");
  ValueId cy = o.bin("aten.add.Tensor", o.bin("aten.mul.Tensor", fg, c, "fc"), o.bin("aten.mul.Tensor", ig, cg, "ig"), "cy");
  ValueId hy = o.bin("aten.mul.Tensor", og, o.un("aten.tanh.default", cy, "tanh_cy"), "hy");
  l.bind_all(n, {l.view(hy, l.out_meta(n, 0).sizes), l.view(cy, l.out_meta(n, 1).sizes)});
}

// 3-D pooling as two 2-D poolings (ExecuTorch's portable library has no 3-D pooling kernel, its runtime cannot
// load a program with one): a box window is separable. Over x viewed [B, 1, D, H*W], the 2-D operator with
// window (kd, 1) pools the depth; over that viewed [B, Do, H, W], window (kh, kw) pools the plane. Max of maxes
// is the max; an average's divisor is the product of its per-dimension counts (the window's extent clipped to
// the padded input, or to the input when count_include_pad is false, the adaptive window's length), so the
// average of averages is the average; divisor_override: a sum over depth (divisor 1), then the override.
// max_pool3d with its indices: the plane first (ties as eager breaks them), each depth's plane index plus
// d*H*W, the depth pass's index picking which of them.
std::vector<int64_t> triple(L& l, const Node& n, const char* name, std::vector<int64_t> dflt) {
  const Argument* a = l.opt(n, name);
  std::vector<int64_t> v = !a || a->kind == Argument::Kind::None ? dflt : l.ints_in(n, name);
  if (v.empty()) v = dflt;
  if (v.size() == 1) v.assign(3, v[0]);
  if (v.size() != 3) l.unsupported(n, fmt::format("argument '{}' has {} values, 3-D pooling takes 1 or 3", name, v.size()));
  return v;
}

// A pooling window of one element (its padding is then 0, torch requires padding <= window / 2) picks every
// stride-th element: a strided slice (XNNPACK rejects 1x1 pooling windows).
ValueId subsample(L& l, ValueId v, int64_t dim, int64_t step) {
  if (step == 1) return v;
  auto sizes = l.meta_of(v).sizes;
  const int64_t len = sizes[static_cast<size_t>(dim)];
  sizes[static_cast<size_t>(dim)] = (len + step - 1) / step;
  return l.emit("aten.slice_copy.Tensor", {NA("self", tensor_arg(v)), NA("dim", int_arg(dim)), NA("start", int_arg(0)),
                                           NA("end", int_arg(len)), NA("step", int_arg(step))},
                contiguous(l.meta_of(v).dtype, sizes), "pool_subsample");
}

// Whether the program reads output i of source node n (max pooling's indices usually are not).
bool output_read(const L& l, const Node& n, size_t i) {
  const auto outs = l.source_outputs(n);
  if (i >= outs.size()) return false;
  const ValueId v = outs[i];
  for (const Node& u : l.ep_.graph.nodes)
    for (const auto& in : u.inputs)
      for (ValueId r : in.arg.tensor_ids())
        if (r == v) return true;
  for (const auto& o : l.ep_.graph.outputs)
    for (ValueId r : o.tensor_ids())
      if (r == v) return true;
  return false;
}

void pool3d(L& l, const Node& n) {
  const std::string_view t = n.target;
  const bool max = t.find("max_pool3d") != std::string_view::npos;
  const bool adaptive = t.starts_with("aten.adaptive_") || t.starts_with("aten._adaptive_");
  ValueId x = l.tensor_in(n, "self");
  const auto& xm = l.meta_of(x);
  const TensorMeta m = l.out_meta(n);
  const size_t rank = xm.sizes.size();
  if (rank < 4 || m.sizes.size() != rank) l.unsupported(n, "3-D pooling of a tensor of rank < 4");
  int64_t B = 1;
  for (size_t i = 0; i + 3 < rank; ++i) B *= xm.sizes[i];
  const int64_t D = xm.sizes[rank - 3], H = xm.sizes[rank - 2], W = xm.sizes[rank - 1];
  const int64_t Do = m.sizes[rank - 3], Ho = m.sizes[rank - 2], Wo = m.sizes[rank - 1];
  const TensorMeta depth_m = contiguous(m.dtype, {B, 1, Do, H * W}), plane_m = contiguous(m.dtype, {B, Do, Ho, Wo});
  ValueId xd = l.view(x, {B, 1, D, H * W});
  if (adaptive && max) {  // adaptive max pooling with sizes that divide: a max pooling with window = stride
    if (D % Do || H % Ho || W % Wo) l.unsupported(n, "adaptive max pooling whose output size does not divide the input size");
  }
  if (adaptive && !max) {
    ValueId y = l.emit("aten._adaptive_avg_pool2d.default",
                       {NA("self", tensor_arg(xd)), NA("output_size", ints_arg({Do, H * W}))}, depth_m, "pool_depth");
    y = l.emit("aten._adaptive_avg_pool2d.default",
               {NA("self", tensor_arg(l.view(y, {B, Do, H, W}))), NA("output_size", ints_arg({Ho, Wo}))}, plane_m,
               "pool_plane");
    l.bind(n, l.view(y, m.sizes));
    return;
  }
  std::vector<int64_t> k, stride, pad{0, 0, 0}, dil{1, 1, 1};
  bool ceil = false;
  if (adaptive) {
    k = {D / Do, H / Ho, W / Wo};
    stride = k;
  } else {
    k = triple(l, n, "kernel_size", {});
    stride = triple(l, n, "stride", k);
    pad = triple(l, n, "padding", {0});
    if (max) dil = triple(l, n, "dilation", {1});
    ceil = l.int_in(n, "ceil_mode", 0) != 0;
  }
  const bool depth_one = k[0] == 1, plane_one = k[1] == 1 && k[2] == 1;
  const bool indices = max && output_read(l, n, 1);
  if (max && !indices && (depth_one || plane_one)) {
    ValueId y = xd;
    if (depth_one)
      y = subsample(l, xd, 2, stride[0]);
    else
      y = l.emit_raw("aten.max_pool2d_with_indices.default",
                     {NA("self", tensor_arg(xd)), NA("kernel_size", ints_arg({k[0], 1})),
                      NA("stride", ints_arg({stride[0], 1})), NA("padding", ints_arg({pad[0], 0})),
                      NA("dilation", ints_arg({dil[0], 1})), NA("ceil_mode", bool_arg(ceil))},
                     {depth_m, contiguous(ScalarType::Long, depth_m.sizes)}, "pool_depth")[0];
    y = l.view(y, {B, Do, H, W});
    if (plane_one) {
      y = subsample(l, subsample(l, y, 2, stride[1]), 3, stride[2]);
    } else {
      y = l.emit_raw("aten.max_pool2d_with_indices.default",
                     {NA("self", tensor_arg(y)), NA("kernel_size", ints_arg({k[1], k[2]})),
                      NA("stride", ints_arg({stride[1], stride[2]})), NA("padding", ints_arg({pad[1], pad[2]})),
                      NA("dilation", ints_arg({dil[1], dil[2]})), NA("ceil_mode", bool_arg(ceil))},
                     {plane_m, contiguous(ScalarType::Long, plane_m.sizes)}, "pool_plane")[0];
    }
    l.bind(n, l.view(y, m.sizes));
    return;
  }
  if (max) {
    // With the indices: the plane first, then the depth, so that of equal maxima the first in torch's scan order
    // (depth, then row, then column) wins, as in eager (depth first would prefer the earliest row and column).
    // The plane pass's indices (h * W + w per depth) plus d * H * W are 3-D flat indices; the depth pass's own
    // index over (D, Ho * Wo) picks which of them.
    const TensorMeta plane_first = contiguous(m.dtype, {B, D, Ho, Wo}), depth_last = contiguous(m.dtype, {B, 1, Do, Ho * Wo});
    TensorMeta pi = plane_first, di = depth_last;
    pi.dtype = di.dtype = ScalarType::Long;
    auto plane = l.emit_raw("aten.max_pool2d_with_indices.default",
                            {NA("self", tensor_arg(l.view(x, {B, D, H, W}))), NA("kernel_size", ints_arg({k[1], k[2]})),
                             NA("stride", ints_arg({stride[1], stride[2]})), NA("padding", ints_arg({pad[1], pad[2]})),
                             NA("dilation", ints_arg({dil[1], dil[2]})), NA("ceil_mode", bool_arg(ceil))},
                            {plane_first, pi}, "pool_plane");
    auto depth = l.emit_raw("aten.max_pool2d_with_indices.default",
                            {NA("self", tensor_arg(l.view(plane[0], {B, 1, D, Ho * Wo}))),
                             NA("kernel_size", ints_arg({k[0], 1})), NA("stride", ints_arg({stride[0], 1})),
                             NA("padding", ints_arg({pad[0], 0})), NA("dilation", ints_arg({dil[0], 1})),
                             NA("ceil_mode", bool_arg(ceil))},
                            {depth_last, di}, "pool_depth");
    l.bind(n, l.view(depth[0], m.sizes));
    if (indices) {
      std::vector<int64_t> base(static_cast<size_t>(D));
      for (int64_t d = 0; d < D; ++d) base[static_cast<size_t>(d)] = d * H * W;
      std::vector<std::byte> bytes(base.size() * sizeof(int64_t));
      std::memcpy(bytes.data(), base.data(), bytes.size());
      ValueId off = l.constant_tensor(ScalarType::Long, {1, D, 1, 1}, std::move(bytes), "pool_depth_offset");
      ValueId flat = l.emit("aten.add.Tensor", {NA("self", tensor_arg(plane[1])), NA("other", tensor_arg(off))}, pi,
                            "pool_flat");
      TensorMeta im = contiguous(ScalarType::Long, {B, Do * Ho * Wo});
      ValueId idx = l.emit("aten.gather.default",
                           {NA("self", tensor_arg(l.view(flat, {B, D * Ho * Wo}))), NA("dim", int_arg(1)),
                            NA("index", tensor_arg(l.view(depth[1], {B, Do * Ho * Wo}))),
                            NA("sparse_grad", bool_arg(false))},
                           im, "pool_indices");
      l.bind(n, l.view(idx, l.out_meta(n, 1).sizes), 1);
    }
    return;
  }
  const bool include_pad = l.int_in(n, "count_include_pad", 1) != 0;
  Argument divisor = Argument::none(), depth_divisor = Argument::none();
  if (const Argument* a = l.opt(n, "divisor_override"); a && a->kind == Argument::Kind::Int) {
    divisor = *a;
    depth_divisor = int_arg(1);
  }
  // An integer average is the window's sum divided once, truncating (eager's): an average of averages would
  // truncate twice. Both passes then sum, and the sums are divided by each window's divisor, a constant of the
  // shapes (the product of its per-dimension counts, as avg_pool2d's kernel counts them).
  const bool integral = m.dtype == ScalarType::Long || m.dtype == ScalarType::Int || m.dtype == ScalarType::Short ||
                        m.dtype == ScalarType::Char || m.dtype == ScalarType::Byte;
  const bool divide_after = integral && !depth_one && !plane_one && divisor.kind == Argument::Kind::None;
  if (divide_after) divisor = depth_divisor = int_arg(1);
  ValueId y = depth_one ? subsample(l, xd, 2, stride[0])  // (a divisor override applies in the plane pass)
                       : l.emit("aten.avg_pool2d.default",
                                {NA("self", tensor_arg(xd)), NA("kernel_size", ints_arg({k[0], 1})),
                                 NA("stride", ints_arg({stride[0], 1})), NA("padding", ints_arg({pad[0], 0})),
                                 NA("ceil_mode", bool_arg(ceil)), NA("count_include_pad", bool_arg(include_pad)),
                                 NA("divisor_override", depth_divisor)},
                                depth_m, "pool_depth");
  if (plane_one && divisor.kind == Argument::Kind::None) {
    l.bind(n, l.view(subsample(l, subsample(l, l.view(y, {B, Do, H, W}), 2, stride[1]), 3, stride[2]), m.sizes));
    return;
  }
  y = l.emit("aten.avg_pool2d.default",
             {NA("self", tensor_arg(l.view(y, {B, Do, H, W}))), NA("kernel_size", ints_arg({k[1], k[2]})),
              NA("stride", ints_arg({stride[1], stride[2]})), NA("padding", ints_arg({pad[1], pad[2]})),
              NA("ceil_mode", bool_arg(ceil)), NA("count_include_pad", bool_arg(include_pad)),
              NA("divisor_override", divisor)},
             plane_m, "pool_plane");
  if (divide_after) {
    const int64_t in[3] = {D, H, W}, out[3] = {Do, Ho, Wo};
    std::vector<int64_t> counts[3];
    for (int d = 0; d < 3; ++d)
      for (int64_t o = 0; o < out[d]; ++o) {
        const int64_t start = o * stride[static_cast<size_t>(d)] - pad[static_cast<size_t>(d)];
        const int64_t end = std::min(start + k[static_cast<size_t>(d)], in[d] + pad[static_cast<size_t>(d)]);
        counts[d].push_back(include_pad ? end - start : std::min(end, in[d]) - std::max<int64_t>(start, 0));
      }
    std::vector<int64_t> div;
    div.reserve(static_cast<size_t>(Do * Ho * Wo));
    for (int64_t a : counts[0])
      for (int64_t b : counts[1])
        for (int64_t c : counts[2]) div.push_back(std::max<int64_t>(a * b * c, 1));
    std::vector<std::byte> bytes(div.size() * sizeof(int64_t));
    std::memcpy(bytes.data(), div.data(), bytes.size());
    ValueId dv = l.convert(l.constant_tensor(ScalarType::Long, {1, Do, Ho, Wo}, std::move(bytes), "pool_divisor"), m.dtype);
    y = l.emit("aten.div.Tensor_mode", {NA("self", tensor_arg(y)), NA("other", tensor_arg(dv)),
                                        NA("rounding_mode", {Argument::Kind::String, std::string("trunc")})},
               plane_m, "pool_average");
  }
  l.bind(n, l.view(y, m.sizes));
}

}  // namespace kiln::passes::detail::decomp
