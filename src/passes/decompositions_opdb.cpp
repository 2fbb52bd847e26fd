// Decompositions the whole-op_db sweep found (bench/coverage/sweep.py --all-ops, 2026-12-05): operators of
// torch.export's default IR that ExecuTorch lowers and kiln refused, each a rewrite into operators kiln has,
// computed the way eager computes them (its formula, dtype promotion and edge cases: infinities, NaN, -0.0).
// Their rows are in kDecompositions (decompositions.cpp); declared in decompositions.h.
#include "decompositions.h"

#include <cmath>
#include <cstring>
#include <limits>

namespace kiln::passes::detail::decomp {

// ---- other names of operators kiln has

void identity(L& l, const Node& n) {  // positive, resolve_conj, resolve_neg, real: of a real tensor, itself
  ValueId x = l.tensor_in(n, "self");
  if (!is_float(l.meta_of(x).dtype) && n.target == "aten.positive.default" && l.meta_of(x).dtype == ScalarType::Bool)
    l.unsupported(n, "positive of a bool tensor");
  l.bind(n, x);
}

void view_as_output(L& l, const Node& n) {  // ravel, reshape_as, view_as, squeeze_copy, atleast_{1,2,3}d
  l.bind(n, l.view(l.tensor_in(n, "self"), l.out_meta(n).sizes));
}

void renamed(L& l, const Node& n) {  // another name of an operator the lowerer has, with the same arguments
  static constexpr std::pair<std::string_view, std::string_view> kNames[] = {
      {"aten.subtract.Tensor", "aten.sub.Tensor"}, {"aten.subtract.Scalar", "aten.sub.Scalar"},
      {"aten.multiply.Tensor", "aten.mul.Tensor"}, {"aten.multiply.Scalar", "aten.mul.Scalar"},
      {"aten.divide.Tensor", "aten.div.Tensor"}, {"aten.divide.Scalar", "aten.div.Scalar"},
      {"aten.divide.Tensor_mode", "aten.div.Tensor_mode"}, {"aten.greater.Tensor", "aten.gt.Tensor"},
      {"aten.greater.Scalar", "aten.gt.Scalar"}, {"aten.less.Tensor", "aten.lt.Tensor"},
      {"aten.less.Scalar", "aten.lt.Scalar"}, {"aten.greater_equal.Tensor", "aten.ge.Tensor"},
      {"aten.greater_equal.Scalar", "aten.ge.Scalar"}, {"aten.less_equal.Tensor", "aten.le.Tensor"},
      {"aten.less_equal.Scalar", "aten.le.Scalar"}, {"aten.not_equal.Tensor", "aten.ne.Tensor"},
      {"aten.not_equal.Scalar", "aten.ne.Scalar"}, {"aten.negative.default", "aten.neg.default"},
      {"aten.absolute.default", "aten.abs.default"}, {"aten.arccos.default", "aten.acos.default"},
      {"aten.arcsin.default", "aten.asin.default"}, {"aten.arctan.default", "aten.atan.default"},
      {"aten.arctan2.default", "aten.atan2.default"}, {"aten.clip.default", "aten.clamp.default"},
      {"aten.fix.default", "aten.trunc.default"}, {"aten.special_expit.default", "aten.sigmoid.default"},
      {"aten.special_expm1.default", "aten.expm1.default"}, {"aten.special_exp2.default", "aten.exp2.default"},
      {"aten.special_log1p.default", "aten.log1p.default"}, {"aten.special_erf.default", "aten.erf.default"},
      {"aten.special_round.default", "aten.round.default"}, {"aten.special_sinc.default", "aten.sinc.default"},
      {"aten.special_xlogy.default", "aten.xlogy.Tensor"}, {"aten.special_logit.default", "aten.logit.default"},
      {"aten.special_logsumexp.default", "aten.logsumexp.default"},
  };
  for (const auto& [from, to] : kNames)
    if (n.target == from) {
      as_op(l, n, std::string(to), n.inputs);
      return;
    }
  l.unsupported(n, "internal: no other name");
}

void conj_transpose(L& l, const Node& n) {  // mH / matrix_H of a real tensor: its last two dims swapped
  ValueId x = l.tensor_in(n, "self");
  const size_t r = l.meta_of(x).sizes.size();
  if (r < 2) l.unsupported(n, "mH needs a tensor of at least 2 dims");
  std::vector<int64_t> dims(r);
  std::iota(dims.begin(), dims.end(), 0);
  std::swap(dims[r - 1], dims[r - 2]);
  l.bind(n, l.permute(x, dims));
}

void t_copy(L& l, const Node& n) {
  ValueId x = l.tensor_in(n, "self");
  l.bind(n, l.meta_of(x).sizes.size() < 2 ? x : l.permute(x, {1, 0}));
}

void narrow(L& l, const Node& n) {  // slice(dim, start, start + length)
  ValueId x = l.tensor_in(n, "self");
  const auto s = l.meta_of(x).sizes;
  const int64_t dim = L::wrap_dim(l.int_in(n, "dim"), s.size());
  int64_t start = l.int_in(n, "start");
  if (start < 0) start += s.at(static_cast<size_t>(dim));
  as_op(l, n, "aten.slice.Tensor", {source_input(l, n, "self"), NA("dim", int_arg(dim)), NA("start", int_arg(start)),
                                    NA("end", int_arg(start + l.int_in(n, "length"))), NA("step", int_arg(1))});
}

void broadcast_to(L& l, const Node& n) {
  as_op(l, n, "aten.expand.default", {source_input(l, n, "self"), source_input(l, n, "size")});
}

void flip_one(L& l, const Node& n) {  // fliplr: flip(dims=[1]); flipud: flip(dims=[0])
  ValueId x = l.tensor_in(n, "self");
  const int64_t dim = n.target == "aten.fliplr.default" ? 1 : 0;
  l.bind(n, l.emit("aten.flip.default", {NA("self", tensor_arg(x)), NA("dims", ints_arg({dim}))}, l.out_meta(n)));
}

void movedim(L& l, const Node& n) {  // the permutation torch builds: sources to destinations, the rest in order
  ValueId x = l.tensor_in(n, "self");
  const size_t rank = l.meta_of(x).sizes.size();
  std::vector<int64_t> src = l.ints_in(n, "source"), dst = l.ints_in(n, "destination");
  if (src.size() != dst.size()) l.unsupported(n, "source and destination differ in length");
  if (rank < 2) {  // nothing moves (a 0-d tensor's dims 0 and -1 name no dim at all)
    l.bind(n, x);
    return;
  }
  std::vector<int64_t> perm(rank, -1);
  std::vector<bool> used(rank, false);
  for (size_t i = 0; i < src.size(); ++i) {
    const int64_t s = L::wrap_dim(src[i], rank), d = L::wrap_dim(dst[i], rank);
    perm.at(static_cast<size_t>(d)) = s;
    used.at(static_cast<size_t>(s)) = true;
  }
  size_t next = 0;
  for (auto& p : perm) {
    if (p >= 0) continue;
    while (used.at(next)) ++next;
    p = static_cast<int64_t>(next++);
  }
  l.bind(n, l.permute(x, perm));
}

void rot90(L& l, const Node& n) {  // torch's: k = 1 flip(dims[1]) then transpose, 2 flip both, 3 flip(dims[0]) then transpose
  ValueId x = l.tensor_in(n, "self");
  const auto xm = contiguous(l.meta_of(x));
  const size_t rank = xm.sizes.size();
  std::vector<int64_t> dims = l.opt(n, "dims") ? l.ints_in(n, "dims") : std::vector<int64_t>{0, 1};
  if (dims.size() != 2 || rank < 2) l.unsupported(n, "rot90 needs two dims of a tensor of at least 2 dims");
  const int64_t d0 = L::wrap_dim(dims[0], rank), d1 = L::wrap_dim(dims[1], rank);
  const int64_t k = ((l.int_in(n, "k", 1) % 4) + 4) % 4;
  auto flip = [&](ValueId v, std::vector<int64_t> ds) {
    return l.emit("aten.flip.default", {NA("self", tensor_arg(v)), NA("dims", ints_arg(std::move(ds)))},
                  contiguous(l.meta_of(v)), "flip");
  };
  std::vector<int64_t> swap(rank);
  std::iota(swap.begin(), swap.end(), 0);
  std::swap(swap[static_cast<size_t>(d0)], swap[static_cast<size_t>(d1)]);
  if (k == 0) l.bind(n, x);
  else if (k == 1) l.bind(n, l.permute(flip(x, {d1}), swap));
  else if (k == 2) l.bind(n, flip(x, {d0, d1}));
  else l.bind(n, l.permute(flip(x, {d0}), swap));
}

void tile(L& l, const Node& n) {  // repeat with the reps padded by leading ones to the rank
  ValueId x = l.tensor_in(n, "self");
  std::vector<int64_t> reps = l.ints_in(n, "dims");
  const size_t rank = l.meta_of(x).sizes.size();
  if (reps.size() < rank) reps.insert(reps.begin(), rank - reps.size(), 1);
  l.bind(n, l.emit("aten.repeat.default", {NA("self", tensor_arg(x)), NA("repeats", ints_arg(reps))}, l.out_meta(n)));
}

void split_pieces(L& l, const Node& n) {  // hsplit / vsplit / dsplit: the outputs say the sizes
  ValueId x = l.tensor_in(n, "self");
  const size_t rank = l.meta_of(x).sizes.size();
  const int64_t dim = n.target.starts_with("aten.hsplit") ? (rank == 1 ? 0 : 1)
                      : n.target.starts_with("aten.vsplit") ? 0 : 2;
  std::vector<TensorMeta> metas;
  std::vector<int64_t> sizes;
  for (size_t i = 0; i < l.source_outputs(n).size(); ++i) {
    metas.push_back(l.out_meta(n, i));
    sizes.push_back(metas.back().sizes.at(static_cast<size_t>(dim)));
  }
  if (metas.empty()) l.unsupported(n, "operator has no tensor outputs");
  l.bind_all(n, l.emit_raw("aten.split_with_sizes_copy.default",
                           {NA("self", tensor_arg(x)), NA("split_sizes", ints_arg(sizes)), NA("dim", int_arg(dim))},
                           metas));
}

void channel_shuffle(L& l, const Node& n) {  // [N, g, C/g, *] with g and C/g swapped
  ValueId x = l.tensor_in(n, "self");
  const auto s = l.meta_of(x).sizes;
  const int64_t g = l.int_in(n, "groups");
  if (s.size() < 2 || g <= 0 || s[1] % g != 0) l.unsupported(n, "channels do not divide into the groups");
  std::vector<int64_t> v{s[0], g, s[1] / g};
  v.insert(v.end(), s.begin() + 2, s.end());
  std::vector<int64_t> perm(v.size());
  std::iota(perm.begin(), perm.end(), 0);
  std::swap(perm[1], perm[2]);
  l.bind(n, l.view(l.permute(l.view(x, v), perm), s));
}

void meshgrid(L& l, const Node& n) {  // each input viewed along its axis and expanded ('xy' swaps the first two)
  const Argument ts = l.remap(l.arg(n, "tensors"));
  if (ts.kind != Argument::Kind::Tensors) l.unsupported(n, "argument 'tensors' is not a tensor list");
  const auto& xs = std::get<std::vector<ValueId>>(ts.payload);
  const Argument* ix = l.opt(n, "indexing");
  const bool xy = ix && ix->kind == Argument::Kind::String && std::get<std::string>(ix->payload) == "xy";
  std::vector<ValueId> outs;
  for (size_t i = 0; i < xs.size(); ++i) {
    const TensorMeta m = l.out_meta(n, i);
    size_t axis = i;
    if (xy && xs.size() >= 2 && i < 2) axis = 1 - i;
    std::vector<int64_t> v(m.sizes.size(), 1);
    v.at(axis) = l.meta_of(xs[i]).numel();
    outs.push_back(l.expand(l.view(xs[i], v), m.sizes));
  }
  l.bind_all(n, outs);
}

// ---- reductions

void logsumexp(L& l, const Node& n) {  // eager's: log(sum(exp(x - amax))) + amax, an infinite amax taken as 0
  const TensorMeta m = l.out_meta(n);
  ValueId x = l.convert(l.tensor_in(n, "self"), m.dtype);
  if (l.meta_of(x).sizes.empty()) x = l.view(x, {1});
  const auto xs = l.meta_of(x).sizes;
  const std::vector<int64_t> dims = dims_of(l, n, "dim", xs.size());
  const TensorMeta km = contiguous(m.dtype, kept_sizes(xs, dims));
  ValueId mx = l.emit("aten.amax.default", {NA("self", tensor_arg(x)), NA("dim", ints_arg(dims)),
                                            NA("keepdim", bool_arg(true))}, km, "max");
  ValueId inf = unary(l, "aten.isinf.default", mx, ScalarType::Bool, "max_inf");
  ValueId mz = select_where(l, inf, constant_of(l, 0.0, m.dtype), mx, m.dtype, "max_finite");
  ValueId e = unary(l, "aten.exp.default", binary(l, "aten.sub.Tensor", x, mx, m.dtype, "shifted"), m.dtype, "exp");
  ValueId lg = unary(l, "aten.log.default", sum_kept(l, e, dims, "sum"), m.dtype, "log");
  l.bind(n, l.view(binary(l, "aten.add.Tensor", lg, mz, m.dtype, "logsumexp"), m.sizes));
}

// The var overload of a std / var_mean / std_mean overload (the same arguments).
std::string var_overload(const Node& n) {
  if (n.target.ends_with(".correction")) return "aten.var.correction";
  if (n.target.ends_with(".dim")) return "aten.var.dim";
  return "aten.var.default";
}

void std_dev(L& l, const Node& n) {  // sqrt(var) with the same arguments
  as_op(l, n, var_overload(n), n.inputs);
  ValueId v = l.mapped(output_value(n, 0));
  l.bind(n, unary(l, "aten.sqrt.default", v, l.out_meta(n).dtype, "std"));
}

void var_mean(L& l, const Node& n) {  // (var or std, mean): var as its own node, mean over the same dims
  const bool correction = !n.target.ends_with(".default");  // .correction / .dim: over `dim`
  const bool sd = n.target.starts_with("aten.std_mean");
  as_op(l, n, var_overload(n), n.inputs, std::vector<Argument>{n.outputs.at(0)});
  ValueId x = l.tensor_in(n, "self");
  const auto xs = l.meta_of(x).sizes;
  const TensorMeta m1 = l.out_meta(n, 1);
  std::vector<int64_t> dims = correction ? dims_of(l, n, "dim", xs.size()) : dims_of(l, n, "(none)", xs.size());
  ValueId xf = l.convert(x, m1.dtype);
  ValueId mean = l.view(sum_kept(l, xf, dims, "sum"), m1.sizes);
  double count = 1;
  for (int64_t d : dims)
    if (static_cast<size_t>(d) < xs.size()) count *= static_cast<double>(xs[static_cast<size_t>(d)]);
  mean = with_scalar(l, "aten.div.Scalar", mean, count, m1.dtype, "mean");
  ValueId v = l.mapped(output_value(n, 0));
  if (sd) v = unary(l, "aten.sqrt.default", v, l.out_meta(n, 0).dtype, "std");
  l.bind_all(n, {v, mean});
}

void all_of(L& l, const Node& n) {  // not any(not x)
  ValueId x = l.tensor_in(n, "self");
  const TensorMeta m = l.out_meta(n);
  ValueId nx = unary(l, "aten.logical_not.default", x, ScalarType::Bool, "not");
  ValueId any;
  if (n.target == "aten.all.default") {
    any = l.emit("aten.any.default", {NA("self", tensor_arg(nx))}, contiguous(ScalarType::Bool, {}), "any");
  } else if (n.target == "aten.all.dim") {
    any = l.emit("aten.any.dim", {NA("self", tensor_arg(nx)), NA("dim", int_arg(l.int_in(n, "dim"))),
                                  NA("keepdim", bool_arg(l.int_in(n, "keepdim", 0) != 0))},
                 contiguous(ScalarType::Bool, m.sizes), "any");
  } else {
    const auto dims = dims_of(l, n, "dim", l.meta_of(x).sizes.size());
    if (l.meta_of(x).sizes.empty())
      any = l.emit("aten.any.default", {NA("self", tensor_arg(nx))}, contiguous(ScalarType::Bool, {}), "any");
    else
      any = l.emit("aten.any.dims", {NA("self", tensor_arg(nx)), NA("dim", ints_arg(dims)),
                                     NA("keepdim", bool_arg(l.int_in(n, "keepdim", 0) != 0))},
                   contiguous(ScalarType::Bool, m.sizes), "any");
  }
  ValueId r = unary(l, "aten.logical_not.default", any, ScalarType::Bool, "all");
  l.bind(n, m.dtype == ScalarType::Bool ? l.view(r, m.sizes) : l.convert(l.view(r, m.sizes), m.dtype));
}

void count_nonzero(L& l, const Node& n) {  // sum(x != 0) as int64
  ValueId x = l.tensor_in(n, "self");
  const auto xs = l.meta_of(x).sizes;
  std::vector<int64_t> dims;
  const Argument* d = l.opt(n, "dim");
  if (d && d->kind != Argument::Kind::None) dims = l.ints_in(n, "dim");
  if (dims.empty())
    for (size_t i = 0; i < xs.size(); ++i) dims.push_back(static_cast<int64_t>(i));
  for (auto& v : dims) v = L::wrap_dim(v, std::max<size_t>(xs.size(), 1));
  ValueId nz = l.convert(with_scalar(l, "aten.ne.Scalar", x, 0.0, ScalarType::Bool, "nonzero"), ScalarType::Long);
  l.bind(n, l.view(sum_kept(l, nz, dims, "count"), l.out_meta(n).sizes));
}

void nansum(L& l, const Node& n) {  // NaNs as 0; nanmean divides by the count of the others
  const TensorMeta m = l.out_meta(n);
  if (l.opt(n, "dtype") && l.opt(n, "dtype")->kind != Argument::Kind::None) l.unsupported(n, "nansum with a dtype");
  ValueId x = l.tensor_in(n, "self");
  const auto xs = l.meta_of(x).sizes;
  const auto dims = dims_of(l, n, "dim", xs.size());
  if (is_float(l.meta_of(x).dtype)) {
    ValueId nan = unary(l, "aten.isnan.default", x, ScalarType::Bool, "nan");
    x = select_where(l, nan, constant_of(l, 0.0, l.meta_of(x).dtype), x, l.meta_of(x).dtype, "nan_as_zero");
    ValueId s = l.view(sum_kept(l, x, dims, "nansum"), m.sizes);
    if (n.target == "aten.nanmean.default") {
      ValueId ok = l.convert(unary(l, "aten.logical_not.default", nan, ScalarType::Bool, "number"), m.dtype);
      s = binary(l, "aten.div.Tensor", s, l.view(sum_kept(l, ok, dims, "count"), m.sizes), m.dtype, "nanmean");
    }
    l.bind(n, s);
    return;
  }
  if (n.target == "aten.nanmean.default") l.unsupported(n, "nanmean of an integer tensor");
  l.bind(n, l.view(sum_kept(l, l.convert(x, m.dtype), dims, "nansum"), m.sizes));
}

void trace(L& l, const Node& n) {  // sum of the diagonal
  ValueId x = l.tensor_in(n, "self");
  const auto s = l.meta_of(x).sizes;
  if (s.size() != 2) l.unsupported(n, "trace of a tensor that is not a matrix");
  const TensorMeta m = l.out_meta(n);
  ValueId d = l.emit("aten.diagonal_copy.default", {NA("self", tensor_arg(x)), NA("offset", int_arg(0)),
                                                    NA("dim1", int_arg(0)), NA("dim2", int_arg(1))},
                     contiguous(l.meta_of(x).dtype, {std::min(s[0], s[1])}), "diagonal");
  l.bind(n, l.view(sum_kept(l, l.convert(d, m.dtype), {0}, "trace"), m.sizes));
}

// ---- products

void dot(L& l, const Node& n) {  // dot / vdot (real) / linalg_vecdot / inner: sum of the products over the last dim
  const TensorMeta m = l.out_meta(n);
  const bool vecdot = n.target == "aten.linalg_vecdot.default";
  ValueId a = l.convert(l.tensor_in(n, vecdot ? "x" : "self"), m.dtype);
  ValueId b = l.convert(l.tensor_in(n, vecdot ? "y" : n.target == "aten.dot.default" ? "tensor" : "other"), m.dtype);
  ValueId p = binary(l, "aten.mul.Tensor", a, b, m.dtype, "product");
  const auto ps = l.meta_of(p).sizes;
  const int64_t dim = vecdot ? L::wrap_dim(l.int_in(n, "dim", -1), ps.size()) : static_cast<int64_t>(ps.size()) - 1;
  l.bind(n, l.view(sum_kept(l, p, {dim}, "dot"), m.sizes));
}

void inner(L& l, const Node& n) {  // a [..., k] . b [..., k] -> a's leading dims then b's: one mm
  ValueId a = l.tensor_in(n, "self"), b = l.tensor_in(n, "other");
  const TensorMeta m = l.out_meta(n);
  const auto as = l.meta_of(a).sizes, bs = l.meta_of(b).sizes;
  if (as.empty() || bs.empty()) {
    l.bind(n, binary(l, "aten.mul.Tensor", l.convert(a, m.dtype), l.convert(b, m.dtype), m.dtype, "inner"));
    return;
  }
  if (as.size() == 1 && bs.size() == 1) {
    dot(l, n);
    return;
  }
  const int64_t k = as.back();
  const int64_t ra = l.meta_of(a).numel() / std::max<int64_t>(k, 1), rb = l.meta_of(b).numel() / std::max<int64_t>(k, 1);
  ValueId a2 = l.view(l.convert(a, m.dtype), {ra, k});
  ValueId bt = l.permute(l.view(l.convert(b, m.dtype), {rb, k}), {1, 0});
  ValueId p = l.emit("aten.mm.default", {NA("self", tensor_arg(a2)), NA("mat2", tensor_arg(bt))},
                     contiguous(m.dtype, {ra, rb}), "inner");
  l.bind(n, l.view(p, m.sizes));
}

void mv(L& l, const Node& n) {  // mat @ vec as an mm with a column
  ValueId a = l.tensor_in(n, "self"), v = l.tensor_in(n, "vec");
  const TensorMeta m = l.out_meta(n);
  const int64_t k = l.meta_of(v).sizes.at(0);
  ValueId p = l.emit("aten.mm.default", {NA("self", tensor_arg(a)), NA("mat2", tensor_arg(l.view(v, {k, 1})))},
                     contiguous(m.dtype, {m.sizes.at(0), 1}), "mv");
  l.bind(n, l.view(p, m.sizes));
}

void outer(L& l, const Node& n) {  // a[:, None] * b[None, :]
  ValueId a = l.tensor_in(n, "self"), b = l.tensor_in(n, "vec2");
  const TensorMeta m = l.out_meta(n);
  const int64_t r = l.meta_of(a).numel(), c = l.meta_of(b).numel();
  l.bind(n, l.emit("aten.mul.Tensor", {NA("self", tensor_arg(l.view(l.convert(a, m.dtype), {r, 1}))),
                                       NA("other", tensor_arg(l.view(l.convert(b, m.dtype), {1, c})))}, m));
}

void cross(L& l, const Node& n) {  // a[[1,2,0]] * b[[2,0,1]] - a[[2,0,1]] * b[[1,2,0]] along the dim of size 3
  const TensorMeta m = l.out_meta(n);
  ValueId a = l.expand(l.convert(l.tensor_in(n, "self"), m.dtype), m.sizes);
  ValueId b = l.expand(l.convert(l.tensor_in(n, "other"), m.dtype), m.sizes);
  int64_t dim = -1;
  const Argument* d = l.opt(n, "dim");
  if (d && d->kind != Argument::Kind::None) dim = L::wrap_dim(l.int_in(n, "dim"), m.sizes.size());
  else if (n.target == "aten.linalg_cross.default") dim = static_cast<int64_t>(m.sizes.size()) - 1;
  else
    for (size_t i = 0; i < m.sizes.size() && dim < 0; ++i)
      if (m.sizes[i] == 3) dim = static_cast<int64_t>(i);
  if (dim < 0 || m.sizes.at(static_cast<size_t>(dim)) != 3) l.unsupported(n, "cross product along a dim not of size 3");
  auto rolled = [&](ValueId x, std::vector<int64_t> order, const char* hint) {
    std::vector<std::byte> bytes(order.size() * 8);
    std::memcpy(bytes.data(), order.data(), bytes.size());
    ValueId idx = l.constant_tensor(ScalarType::Long, {3}, std::move(bytes), "cross_index");
    return l.emit("aten.index_select.default", {NA("self", tensor_arg(x)), NA("dim", int_arg(dim)),
                                                NA("index", tensor_arg(idx))}, contiguous(m.dtype, m.sizes), hint);
  };
  ValueId p = binary(l, "aten.mul.Tensor", rolled(a, {1, 2, 0}, "a1"), rolled(b, {2, 0, 1}, "b2"), m.dtype, "p");
  ValueId q = binary(l, "aten.mul.Tensor", rolled(a, {2, 0, 1}, "a2"), rolled(b, {1, 2, 0}, "b1"), m.dtype, "q");
  l.bind(n, binary(l, "aten.sub.Tensor", p, q, m.dtype, "cross"));
}

// ---- indexing

void take(L& l, const Node& n) {  // flattened self at the flattened index (negative from the end)
  ValueId x = l.tensor_in(n, "self"), i = l.tensor_in(n, "index");
  const TensorMeta m = l.out_meta(n);
  const int64_t numel = l.meta_of(x).numel(), k = l.meta_of(i).numel();
  ValueId fi = l.convert(l.view(i, {k}), ScalarType::Long);
  ValueId neg = with_scalar(l, "aten.lt.Scalar", fi, 0.0, ScalarType::Bool, "negative");
  ValueId wrapped = l.emit("aten.add.Scalar", {NA("self", tensor_arg(fi)), NA("other", int_arg(numel))},
                           contiguous(ScalarType::Long, {k}), "wrapped");
  fi = select_where(l, neg, wrapped, fi, ScalarType::Long, "index");
  ValueId r = l.emit("aten.index_select.default", {NA("self", tensor_arg(l.view(x, {numel}))), NA("dim", int_arg(0)),
                                                   NA("index", tensor_arg(fi))}, contiguous(m.dtype, {k}), "take");
  l.bind(n, l.view(r, m.sizes));
}

void take_along_dim(L& l, const Node& n) {  // gather, self and indices broadcast but along dim
  ValueId x = l.tensor_in(n, "self"), i = l.tensor_in(n, "indices");
  const TensorMeta m = l.out_meta(n);
  const Argument* d = l.opt(n, "dim");
  if (!d || d->kind == Argument::Kind::None) {
    x = l.view(x, {l.meta_of(x).numel()});
    i = l.view(i, {l.meta_of(i).numel()});
    l.bind(n, l.view(l.emit("aten.gather.default", {NA("self", tensor_arg(x)), NA("dim", int_arg(0)),
                                                    NA("index", tensor_arg(i))},
                            contiguous(m.dtype, {l.meta_of(i).numel()}), "take_along"), m.sizes));
    return;
  }
  const auto xs = l.meta_of(x).sizes, is = l.meta_of(i).sizes;
  if (xs.size() != is.size()) l.unsupported(n, "self and indices of different ranks");
  const int64_t dim = L::wrap_dim(l.int_in(n, "dim"), xs.size());
  std::vector<int64_t> bx = xs, bi = is;
  for (size_t k = 0; k < xs.size(); ++k) {
    if (static_cast<int64_t>(k) == dim) continue;
    bx[k] = bi[k] = std::max(xs[k], is[k]);
  }
  if (bx != xs) x = l.expand(x, bx);
  if (bi != is) i = l.expand(i, bi);
  l.bind(n, l.emit("aten.gather.default", {NA("self", tensor_arg(x)), NA("dim", int_arg(dim)),
                                           NA("index", tensor_arg(i))}, m));
}

// ---- elementwise

void logaddexp(L& l, const Node& n) {  // eager's: a if a is infinite and a == b, else max + log1p(exp(-|a - b|))
  const TensorMeta m = l.out_meta(n);
  const bool base2 = n.target == "aten.logaddexp2.default";
  ValueId a = l.convert(l.tensor_in(n, "self"), m.dtype), b = l.convert(l.tensor_in(n, "other"), m.dtype);
  ValueId mx = binary(l, "aten.maximum.default", a, b, m.dtype, "max");
  ValueId d = unary(l, "aten.abs.default", binary(l, "aten.sub.Tensor", a, b, m.dtype, "diff"), m.dtype, "absdiff");
  ValueId nd = with_scalar(l, "aten.mul.Scalar", d, base2 ? -std::log(2.0) : -1.0, m.dtype, "negdiff");
  ValueId t = unary(l, "aten.log1p.default", unary(l, "aten.exp.default", nd, m.dtype, "exp"), m.dtype, "log1p");
  if (base2) t = with_scalar(l, "aten.mul.Scalar", t, 1.0 / std::log(2.0), m.dtype, "log2");
  ValueId r = binary(l, "aten.add.Tensor", mx, t, m.dtype, "logaddexp");
  ValueId same_inf = binary(l, "aten.logical_and.default", unary(l, "aten.isinf.default", a, ScalarType::Bool, "inf"),
                            binary(l, "aten.eq.Tensor", a, b, ScalarType::Bool, "same"), ScalarType::Bool, "same_inf");
  l.bind(n, select_where(l, same_inf, a, r, m.dtype, "logaddexp"));
}

void round_decimals(L& l, const Node& n) {  // eager's: round(x * 10^d) / 10^d, or round(x / 10^-d) * 10^-d
  const TensorMeta m = l.out_meta(n);
  ValueId x = l.tensor_in(n, "self");
  const int64_t d = l.int_in(n, "decimals");
  const double p = std::pow(10.0, static_cast<double>(d < 0 ? -d : d));
  ValueId s = with_scalar(l, d < 0 ? "aten.div.Scalar" : "aten.mul.Scalar", x, p, m.dtype, "scaled");
  ValueId r = unary(l, "aten.round.default", s, m.dtype, "rounded");
  l.bind(n, with_scalar(l, d < 0 ? "aten.mul.Scalar" : "aten.div.Scalar", r, p, m.dtype, "round"));
}

void erfc(L& l, const Node& n) {  // 1 - erf(x)
  const TensorMeta m = l.out_meta(n);
  ValueId e = unary(l, "aten.erf.default", l.convert(l.tensor_in(n, "self"), m.dtype), m.dtype, "erf");
  l.bind(n, with_scalar(l, "aten.add.Scalar", with_scalar(l, "aten.mul.Scalar", e, -1.0, m.dtype, "neg"), 1.0,
                        m.dtype, "erfc"));
}

void special_ndtr(L& l, const Node& n) {  // (1 + erf(x / sqrt(2))) / 2
  const TensorMeta m = l.out_meta(n);
  ValueId x = l.convert(l.tensor_in(n, "self"), m.dtype);
  ValueId e = unary(l, "aten.erf.default", with_scalar(l, "aten.mul.Scalar", x, 1.0 / std::sqrt(2.0), m.dtype, "z"),
                    m.dtype, "erf");
  l.bind(n, with_scalar(l, "aten.mul.Scalar", with_scalar(l, "aten.add.Scalar", e, 1.0, m.dtype, "one_plus"), 0.5,
                        m.dtype, "ndtr"));
}

void hypot(L& l, const Node& n) {  // sqrt(a^2 + b^2)
  const TensorMeta m = l.out_meta(n);
  ValueId a = l.convert(l.tensor_in(n, "self"), m.dtype), b = l.convert(l.tensor_in(n, "other"), m.dtype);
  ValueId s = binary(l, "aten.add.Tensor", binary(l, "aten.mul.Tensor", a, a, m.dtype, "a2"),
                     binary(l, "aten.mul.Tensor", b, b, m.dtype, "b2"), m.dtype, "sum");
  l.bind(n, unary(l, "aten.sqrt.default", s, m.dtype, "hypot"));
}

void signbit(L& l, const Node& n) { l.bind(n, signbit_of(l, l.tensor_in(n, "self"))); }

void copysign(L& l, const Node& n) {  // |a| with b's sign bit
  const TensorMeta m = l.out_meta(n);
  ValueId a = unary(l, "aten.abs.default", l.convert(l.tensor_in(n, "self"), m.dtype), m.dtype, "magnitude");
  ValueId b = l.tensor_in(n, "other");
  ValueId na = unary(l, "aten.neg.default", a, m.dtype, "negative");
  l.bind(n, l.expand(select_where(l, signbit_of(l, b), na, a, m.dtype, "copysign"), m.sizes));
}

void fmax_fmin(L& l, const Node& n) {  // maximum/minimum that take the number over a NaN
  const TensorMeta m = l.out_meta(n);
  const bool mx = n.target == "aten.fmax.default";
  ValueId a = l.convert(l.tensor_in(n, "self"), m.dtype), b = l.convert(l.tensor_in(n, "other"), m.dtype);
  ValueId r = binary(l, mx ? "aten.maximum.default" : "aten.minimum.default", a, b, m.dtype, "extreme");
  if (is_float(m.dtype)) {
    r = select_where(l, unary(l, "aten.isnan.default", a, ScalarType::Bool, "a_nan"), b, r, m.dtype, "b_if_a_nan");
    r = select_where(l, unary(l, "aten.isnan.default", b, ScalarType::Bool, "b_nan"), a, r, m.dtype, "a_if_b_nan");
  }
  l.bind(n, l.expand(r, m.sizes));
}

void isfinite(L& l, const Node& n) {  // x - x == 0: NaN for infinities and NaNs; every integer is finite
  ValueId x = l.tensor_in(n, "self");
  const TensorMeta m = l.out_meta(n);
  if (!is_float(l.meta_of(x).dtype)) {
    l.bind(n, l.emit("aten.full.default", {NA("size", ints_arg(m.sizes)), NA("fill_value", bool_arg(true))}, m));
    return;
  }
  ValueId d = binary(l, "aten.sub.Tensor", x, x, l.meta_of(x).dtype, "self_minus_self");
  l.bind(n, with_scalar(l, "aten.eq.Scalar", d, 0.0, ScalarType::Bool, "isfinite"));
}

void isinf_signed(L& l, const Node& n) {  // isposinf / isneginf
  ValueId x = l.tensor_in(n, "self");
  const TensorMeta m = l.out_meta(n);
  if (!is_float(l.meta_of(x).dtype)) {
    l.bind(n, l.emit("aten.full.default", {NA("size", ints_arg(m.sizes)), NA("fill_value", bool_arg(false))}, m));
    return;
  }
  const double inf = std::numeric_limits<double>::infinity();
  l.bind(n, with_scalar(l, "aten.eq.Scalar", x, n.target == "aten.isposinf.default" ? inf : -inf, ScalarType::Bool,
                        "isinf"));
}

void isreal(L& l, const Node& n) {  // every element of a real tensor is real
  const TensorMeta m = l.out_meta(n);
  l.bind(n, l.emit("aten.full.default", {NA("size", ints_arg(m.sizes)), NA("fill_value", bool_arg(true))}, m));
}

void special_xlog1py(L& l, const Node& n) {  // eager's: NaN where y is, 0 where x is 0, else x * log1p(y)
  const TensorMeta m = l.out_meta(n);
  ValueId x = l.convert(l.tensor_in(n, "self"), m.dtype), y = l.convert(l.tensor_in(n, "other"), m.dtype);
  ValueId r = binary(l, "aten.mul.Tensor", x, unary(l, "aten.log1p.default", y, m.dtype, "log1p"), m.dtype, "xlog1py");
  r = select_where(l, with_scalar(l, "aten.eq.Scalar", x, 0.0, ScalarType::Bool, "x_zero"), constant_of(l, 0.0, m.dtype), r,
                   m.dtype, "zero_x");
  r = select_where(l, unary(l, "aten.isnan.default", y, ScalarType::Bool, "y_nan"), y, r, m.dtype, "nan_y");
  l.bind(n, l.expand(r, m.sizes));
}

void special_entr(L& l, const Node& n) {  // -x log x for x > 0, 0 at 0, -inf below, NaN for NaN
  const TensorMeta m = l.out_meta(n);
  ValueId x = l.convert(l.tensor_in(n, "self"), m.dtype);
  ValueId v = unary(l, "aten.neg.default", binary(l, "aten.mul.Tensor", x, unary(l, "aten.log.default", x, m.dtype, "log"),
                                                  m.dtype, "xlogx"), m.dtype, "entr");
  ValueId below = select_where(l, with_scalar(l, "aten.eq.Scalar", x, 0.0, ScalarType::Bool, "zero"),
                               constant_of(l, 0.0, m.dtype),
                               constant_of(l, -std::numeric_limits<double>::infinity(), m.dtype), m.dtype, "at_or_below");
  ValueId r = select_where(l, with_scalar(l, "aten.gt.Scalar", x, 0.0, ScalarType::Bool, "positive"), v, below, m.dtype,
                           "entr");
  r = select_where(l, unary(l, "aten.isnan.default", x, ScalarType::Bool, "nan"), x, r, m.dtype, "nan");
  l.bind(n, r);
}

void isclose(L& l, const Node& n) {  // eager's: a == b, or finite |a - b| <= atol + |rtol * b|; NaNs equal if asked
  const TensorMeta m = l.out_meta(n);
  ValueId a = l.tensor_in(n, "self"), b = l.tensor_in(n, "other");
  const ScalarType dt = l.meta_of(a).dtype;
  const double rtol = l.number_in(n, "rtol", 1e-5), atol = l.number_in(n, "atol", 1e-8);
  const bool equal_nan = l.int_in(n, "equal_nan", 0) != 0;
  ValueId close = binary(l, "aten.eq.Tensor", a, b, ScalarType::Bool, "equal");
  if (is_float(dt)) {
    if (equal_nan)
      close = binary(l, "aten.logical_or.default", close,
                     binary(l, "aten.logical_and.default", unary(l, "aten.isnan.default", a, ScalarType::Bool, "a_nan"),
                            unary(l, "aten.isnan.default", b, ScalarType::Bool, "b_nan"), ScalarType::Bool, "both_nan"),
                     ScalarType::Bool, "close");
    ValueId allowed = with_scalar(l, "aten.add.Scalar",
                                  unary(l, "aten.abs.default", with_scalar(l, "aten.mul.Scalar", b, rtol, dt, "rtol_b"), dt,
                                        "abs_rtol_b"), atol, dt, "allowed");
    ValueId actual = unary(l, "aten.abs.default", binary(l, "aten.sub.Tensor", a, b, dt, "diff"), dt, "actual");
    ValueId fin = with_scalar(l, "aten.eq.Scalar", binary(l, "aten.sub.Tensor", actual, actual, dt, "self_minus_self"),
                              0.0, ScalarType::Bool, "finite");
    ValueId within = binary(l, "aten.le.Tensor", actual, allowed, ScalarType::Bool, "within");
    close = binary(l, "aten.logical_or.default", close,
                   binary(l, "aten.logical_and.default", fin, within, ScalarType::Bool, "finite_within"),
                   ScalarType::Bool, "close");
  }
  l.bind(n, l.expand(close, m.sizes));
}

// ---- constants

void eye(L& l, const Node& n) {  // the identity matrix, made now
  const TensorMeta m = l.out_meta(n);
  if (m.sizes.size() != 2) l.unsupported(n, "eye of a shape that is not a matrix");
  const int64_t r = m.sizes[0], c = m.sizes[1];
  if (r < 0 || c < 0 || (c > 0 && r > (int64_t{1} << 28) / c))
    l.unsupported(n, "eye of more than 2^28 elements (it is stored in the program as a constant)");
  // 1 in the dtype's bytes (little-endian): an integer 1 of its width, or the float's bit pattern
  std::vector<std::byte> one;
  auto put = [&](const auto v) {
    one.resize(sizeof v);
    std::memcpy(one.data(), &v, sizeof v);
  };
  switch (m.dtype) {
    case ScalarType::Float: put(1.0f); break;
    case ScalarType::Double: put(1.0); break;
    case ScalarType::Half: put(uint16_t{0x3c00}); break;
    case ScalarType::BFloat16: put(uint16_t{0x3f80}); break;
    case ScalarType::Long: put(int64_t{1}); break;
    case ScalarType::Int: put(int32_t{1}); break;
    case ScalarType::Short: put(int16_t{1}); break;
    case ScalarType::Char: case ScalarType::Byte: case ScalarType::Bool: put(uint8_t{1}); break;
    default: l.unsupported(n, "eye of this dtype");
  }
  const size_t w = one.size();
  std::vector<std::byte> bytes(static_cast<size_t>(r * c) * w);
  for (int64_t i = 0; i < std::min(r, c); ++i)
    std::memcpy(bytes.data() + static_cast<size_t>(i * c + i) * w, one.data(), w);
  l.bind(n, l.constant_tensor(m.dtype, m.sizes, std::move(bytes), "eye"));
}

// The decomposition table's rows for the operators the whole-op_db sweep found (kDecompositions in
// decompositions.cpp consults them after its own): operator -> its rewrite.
struct OpdbDecomposition {
  std::string_view target;
  Rewrite rewrite;
};

constexpr OpdbDecomposition kOpdbDecompositions[] = {
    {"aten.mH.default", conj_transpose},
    {"aten.matrix_H.default", conj_transpose},
    {"aten.positive.default", identity},
    {"aten.resolve_conj.default", identity},
    {"aten.resolve_neg.default", identity},
    {"aten.real.default", identity},
    {"aten.ravel.default", view_as_output},
    {"aten.reshape_as.default", view_as_output},
    {"aten.view_as.default", view_as_output},
    {"aten.squeeze_copy.default", view_as_output},
    {"aten.atleast_1d.default", view_as_output},
    {"aten.atleast_2d.default", view_as_output},
    {"aten.atleast_3d.default", view_as_output},
    {"aten.t_copy.default", t_copy},
    {"aten.narrow.default", narrow},
    {"aten.narrow_copy.default", narrow},
    {"aten.broadcast_to.default", broadcast_to},
    {"aten.fliplr.default", flip_one},
    {"aten.flipud.default", flip_one},
    {"aten.movedim.intlist", movedim},
    {"aten.movedim.int", movedim},
    {"aten.rot90.default", rot90},
    {"aten.tile.default", tile},
    {"aten.hsplit.int", split_pieces},
    {"aten.vsplit.int", split_pieces},
    {"aten.dsplit.int", split_pieces},
    {"aten.hsplit.array", split_pieces},
    {"aten.vsplit.array", split_pieces},
    {"aten.dsplit.array", split_pieces},
    {"aten.channel_shuffle.default", channel_shuffle},
    {"aten.native_channel_shuffle.default", channel_shuffle},
    {"aten.meshgrid.indexing", meshgrid},
    {"aten.meshgrid.default", meshgrid},
    {"aten.logsumexp.default", logsumexp},
    {"aten.std.correction", std_dev},
    {"aten.std.default", std_dev},
    {"aten.std.dim", std_dev},
    {"aten.var_mean.dim", var_mean},
    {"aten.std_mean.dim", var_mean},
    {"aten.squeeze_copy.dim", view_as_output},
    {"aten.var_mean.correction", var_mean},
    {"aten.var_mean.default", var_mean},
    {"aten.std_mean.correction", var_mean},
    {"aten.std_mean.default", var_mean},
    {"aten.all.default", all_of},
    {"aten.all.dim", all_of},
    {"aten.all.dims", all_of},
    {"aten.count_nonzero.default", count_nonzero},
    {"aten.count_nonzero.dim_IntList", count_nonzero},
    {"aten.nansum.default", nansum},
    {"aten.nanmean.default", nansum},
    {"aten.trace.default", trace},
    {"aten.dot.default", dot},
    {"aten.vdot.default", dot},
    {"aten.linalg_vecdot.default", dot},
    {"aten.inner.default", inner},
    {"aten.mv.default", mv},
    {"aten.outer.default", outer},
    {"aten.ger.default", outer},
    {"aten.cross.default", cross},
    {"aten.linalg_cross.default", cross},
    {"aten.take.default", take},
    {"aten.take_along_dim.default", take_along_dim},
    {"aten.logaddexp.default", logaddexp},
    {"aten.logaddexp2.default", logaddexp},
    {"aten.round.decimals", round_decimals},
    {"aten.erfc.default", erfc},
    {"aten.special_erfc.default", erfc},
    {"aten.special_ndtr.default", special_ndtr},
    {"aten.hypot.default", hypot},
    {"aten.signbit.default", signbit},
    {"aten.copysign.Tensor", copysign},
    {"aten.fmax.default", fmax_fmin},
    {"aten.fmin.default", fmax_fmin},
    {"aten.isfinite.default", isfinite},
    {"aten.isposinf.default", isinf_signed},
    {"aten.isneginf.default", isinf_signed},
    {"aten.isreal.default", isreal},
    {"aten.special_xlog1py.default", special_xlog1py},
    {"aten.special_entr.default", special_entr},
    {"aten.isclose.default", isclose},
    {"aten.eye.default", eye},
    {"aten.eye.m", eye},
    {"aten.sum_to_size.default", sum_to_size},
    {"aten.aminmax.default", aminmax},
    {"aten.pairwise_distance.default", pairwise_distance},
    {"aten.triplet_margin_loss.default", triplet_margin_loss},
    {"aten.cosine_similarity.default", cosine_similarity},
    {"aten.isin.Tensor_Tensor", isin},
    {"aten.linspace.default", linspace},
    {"aten.linspace.Tensor_Tensor", linspace},
    {"aten.linspace.Tensor_Scalar", linspace},
    {"aten.linspace.Scalar_Tensor", linspace},
    {"aten.logspace.default", linspace},
    {"aten.logspace.Tensor_Tensor", linspace},
    {"aten.logspace.Tensor_Scalar", linspace},
    {"aten.logspace.Scalar_Tensor", linspace},
    {"aten.column_stack.default", column_stack},
    {"aten.block_diag.default", block_diag},
    {"aten.cartesian_prod.default", cartesian_prod},
    {"aten.diag_embed.default", diag_embed},
    {"aten.diag.default", diag},
    {"aten.diagflat.default", diag},
    {"aten.max_unpool2d.default", max_unpool},
    {"aten.max_unpool3d.default", max_unpool},
    {"aten.bucketize.Tensor", bucketize},
    {"aten.unfold_copy.default", unfold_copy},
    {"aten.kron.default", kron},
    {"aten.tensordot.default", tensordot},
    {"aten.trapz.x", trapezoid},
    {"aten.trapezoid.x", trapezoid},
    {"aten.cumulative_trapezoid.x", trapezoid},
    {"aten.trapz.dx", trapezoid_dx},
    {"aten.trapezoid.dx", trapezoid_dx},
    {"aten.cumulative_trapezoid.dx", trapezoid_dx},
    {"aten.grid_sampler.default", grid_sampler},
    {"aten.diff.default", diff},
    {"aten._unsafe_masked_index.default", unsafe_masked_index},
    {"aten._unsafe_masked_index_put_accumulate.default", unsafe_masked_index_put_accumulate},
    {"aten.argsort.default", argsort},
    {"aten.argsort.stable", argsort},
    {"aten.msort.default", argsort},
    {"aten.gradient.scalarint", gradient},
    {"aten.fft_fftshift.default", fftshift},
    {"aten.fft_ifftshift.default", fftshift},
    {"aten.linalg_multi_dot.default", multi_dot},
    {"aten.linalg_matrix_power.default", matrix_power},
    {"aten.linalg_norm.default", linalg_norm},
    {"aten.linalg_matrix_norm.default", linalg_norm},
    {"aten.linalg_matrix_norm.str_ord", linalg_norm},
    {"aten.float_power.Tensor_Tensor", float_power},
    {"aten.float_power.Tensor_Scalar", float_power},
    {"aten.float_power.Scalar", float_power},
    {"aten.subtract.Tensor", renamed},
    {"aten.subtract.Scalar", renamed},
    {"aten.multiply.Tensor", renamed},
    {"aten.multiply.Scalar", renamed},
    {"aten.divide.Tensor", renamed},
    {"aten.divide.Scalar", renamed},
    {"aten.divide.Tensor_mode", renamed},
    {"aten.greater.Tensor", renamed},
    {"aten.greater.Scalar", renamed},
    {"aten.less.Tensor", renamed},
    {"aten.less.Scalar", renamed},
    {"aten.greater_equal.Tensor", renamed},
    {"aten.greater_equal.Scalar", renamed},
    {"aten.less_equal.Tensor", renamed},
    {"aten.less_equal.Scalar", renamed},
    {"aten.not_equal.Tensor", renamed},
    {"aten.not_equal.Scalar", renamed},
    {"aten.negative.default", renamed},
    {"aten.absolute.default", renamed},
    {"aten.arccos.default", renamed},
    {"aten.arcsin.default", renamed},
    {"aten.arctan.default", renamed},
    {"aten.arctan2.default", renamed},
    {"aten.clip.default", renamed},
    {"aten.fix.default", renamed},
    {"aten.special_expit.default", renamed},
    {"aten.special_expm1.default", renamed},
    {"aten.special_exp2.default", renamed},
    {"aten.special_log1p.default", renamed},
    {"aten.special_erf.default", renamed},
    {"aten.special_round.default", renamed},
    {"aten.special_sinc.default", renamed},
    {"aten.special_xlogy.default", renamed},
    {"aten.special_logit.default", renamed},
    {"aten.special_logsumexp.default", renamed},
};

Rewrite opdb_rewrite(std::string_view target) {
  for (const auto& d : kOpdbDecompositions)
    if (d.target == target) return d.rewrite;
  return nullptr;
}

}  // namespace kiln::passes::detail::decomp
