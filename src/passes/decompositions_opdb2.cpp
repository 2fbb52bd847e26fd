// Decompositions the whole-op_db sweep found, second file (decompositions_opdb.cpp has the first): distances,
// ranges, joins, diagonals, unpooling, bucketize, products, trapezoids, diff, masked indexing. Each computes
// what eager computes (its formula, dtypes and edge cases); rows in kDecompositions (decompositions.cpp).
#include "decompositions.h"

#include <cmath>
#include <cstring>
#include <limits>

namespace kiln::passes::detail::decomp {

// ---- batch 2

void sum_to_size(L& l, const Node& n) {  // sum over the leading dims and the dims `size` has as 1
  ValueId x = l.tensor_in(n, "self");
  const TensorMeta m = l.out_meta(n);
  const auto xs = l.meta_of(x).sizes;
  const size_t lead = xs.size() - std::min(xs.size(), m.sizes.size());
  std::vector<int64_t> dims;
  for (size_t i = 0; i < xs.size(); ++i)
    if (i < lead || (m.sizes[i - lead] == 1 && xs[i] != 1)) dims.push_back(static_cast<int64_t>(i));
  // in eager's out dtype: a sum promotes ints and bools to int64, and eager sums a 0-d tensor to () too
  l.bind(n, l.convert(dims.empty() ? l.view(x, m.sizes) : l.view(sum_kept(l, x, dims, "sum_to_size"), m.sizes),
                      m.dtype));
}

void aminmax(L& l, const Node& n) {  // (amin, amax) over dim (None: all)
  ValueId x = l.tensor_in(n, "self");
  if (l.meta_of(x).sizes.empty()) x = l.view(x, {1});
  const auto xs = l.meta_of(x).sizes;
  std::vector<int64_t> dims;
  const Argument* d = l.opt(n, "dim");
  if (d && d->kind != Argument::Kind::None) dims = {L::wrap_dim(l.int_in(n, "dim"), xs.size())};
  else
    for (size_t i = 0; i < xs.size(); ++i) dims.push_back(static_cast<int64_t>(i));
  const TensorMeta km = contiguous(l.meta_of(x).dtype, kept_sizes(xs, dims));
  std::vector<ValueId> outs;
  for (const char* op : {"aten.amin.default", "aten.amax.default"})
    outs.push_back(l.view(l.emit(op, {NA("self", tensor_arg(x)), NA("dim", ints_arg(dims)), NA("keepdim", bool_arg(true))},
                                 km, op[5] == 'm' && op[6] == 'i' ? "amin" : "amax"),
                          l.out_meta(n, outs.size()).sizes));
  l.bind_all(n, outs);
}

namespace {
// ||x||_p over `dim` (kept), torch's vector norm: p = 2 sqrt(sum x^2), 1 sum |x|, inf max |x|, 0 count of nonzeros,
// else sum(|x|^p)^(1/p).
ValueId vector_norm_kept(L& l, ValueId x, int64_t dim, double p) {
  const ScalarType dt = l.meta_of(x).dtype;
  ValueId a = unary(l, "aten.abs.default", x, dt, "abs");
  if (p == 2.0) return unary(l, "aten.sqrt.default", sum_kept(l, binary(l, "aten.mul.Tensor", x, x, dt, "sq"), {dim}, "sum"),
                             dt, "norm");
  if (p == 1.0) return sum_kept(l, a, {dim}, "norm");
  if (std::isinf(p)) {
    const auto ks = kept_sizes(l.meta_of(a).sizes, {dim});
    return l.emit(p > 0 ? "aten.amax.default" : "aten.amin.default",
                  {NA("self", tensor_arg(a)), NA("dim", ints_arg({dim})), NA("keepdim", bool_arg(true))},
                  contiguous(dt, ks), "norm");
  }
  if (p == 0.0)
    return sum_kept(l, l.convert(with_scalar(l, "aten.ne.Scalar", x, 0.0, ScalarType::Bool, "nonzero"), dt), {dim}, "norm");
  ValueId pw = l.emit("aten.pow.Tensor_Scalar", {NA("self", tensor_arg(a)), NA("exponent", float_arg(p))},
                      contiguous(dt, l.meta_of(a).sizes), "pow");
  ValueId s = sum_kept(l, pw, {dim}, "sum");
  return l.emit("aten.pow.Tensor_Scalar", {NA("self", tensor_arg(s)), NA("exponent", float_arg(1.0 / p))},
                contiguous(dt, l.meta_of(s).sizes), "norm");
}

// pairwise_distance's: ||x1 - x2 + eps||_p over the last dim of the broadcast (kept)
// (x1 - x2 in the inputs' promoted type, as eager computes it: integers wrap there)
ValueId pairwise_kept(L& l, ValueId a, ValueId b, double p, double eps, ScalarType dt) {
  const ScalarType pt = promote_types(l.meta_of(a).dtype, l.meta_of(b).dtype);
  ValueId d = l.convert(binary(l, "aten.sub.Tensor", a, b, pt, "diff"), dt);
  d = with_scalar(l, "aten.add.Scalar", d, eps, dt, "diff_eps");
  if (l.meta_of(d).sizes.empty()) d = l.view(d, {1});
  return vector_norm_kept(l, d, static_cast<int64_t>(l.meta_of(d).sizes.size()) - 1, p);
}
}  // namespace

void pairwise_distance(L& l, const Node& n) {
  const TensorMeta m = l.out_meta(n);
  ValueId a = l.tensor_in(n, "x1"), b = l.tensor_in(n, "x2");
  l.bind(n, l.view(pairwise_kept(l, a, b, l.number_in(n, "p", 2.0), l.number_in(n, "eps", 1e-6), m.dtype), m.sizes));
}

void triplet_margin_loss(L& l, const Node& n) {  // max(margin + d(a, p) - d(a, n), 0), d(a, n) = min(d(a, n), d(p, n)) with swap
  const TensorMeta m = l.out_meta(n);
  const ScalarType dt = m.dtype;
  ValueId a = l.tensor_in(n, "anchor"), po = l.tensor_in(n, "positive"), ne = l.tensor_in(n, "negative");
  const double p = l.number_in(n, "p", 2.0), eps = l.number_in(n, "eps", 1e-6), margin = l.number_in(n, "margin", 1.0);
  ValueId dap = pairwise_kept(l, a, po, p, eps, dt), dan = pairwise_kept(l, a, ne, p, eps, dt);
  if (l.int_in(n, "swap", 0) != 0)
    dan = binary(l, "aten.minimum.default", dan, pairwise_kept(l, po, ne, p, eps, dt), dt, "d_neg");
  ValueId v = with_scalar(l, "aten.add.Scalar", binary(l, "aten.sub.Tensor", dap, dan, dt, "gap"), margin, dt, "margin");
  v = l.emit("aten.clamp.default", {NA("self", tensor_arg(v)), NA("min", float_arg(0.0))}, contiguous(l.meta_of(v)), "loss");
  const int64_t reduction = l.int_in(n, "reduction", 1);  // 0 none, 1 mean, 2 sum
  if (reduction == 0) {
    l.bind(n, l.view(v, m.sizes));
    return;
  }
  const auto vs = l.meta_of(v).sizes;
  std::vector<int64_t> all(vs.size());
  std::iota(all.begin(), all.end(), 0);
  ValueId s = sum_kept(l, v, all, "sum");
  if (reduction == 1) s = with_scalar(l, "aten.div.Scalar", s, static_cast<double>(l.meta_of(v).numel()), dt, "mean");
  l.bind(n, l.view(s, m.sizes));
}

void cosine_similarity(L& l, const Node& n) {  // torch's: sum((x1 / max(||x1||, eps)) * (x2 / max(||x2||, eps)), dim)
  const TensorMeta m = l.out_meta(n);
  ValueId a = l.convert(l.tensor_in(n, "x1"), m.dtype), b = l.convert(l.tensor_in(n, "x2"), m.dtype);
  const auto bs = broadcast_sizes(l.meta_of(a).sizes, l.meta_of(b).sizes);
  a = l.expand(a, bs);
  b = l.expand(b, bs);
  const int64_t dim = L::wrap_dim(l.int_in(n, "dim", 1), bs.size());
  const double eps = l.number_in(n, "eps", 1e-8);
  auto unit = [&](ValueId x, const char* hint) {
    ValueId nm = vector_norm_kept(l, x, dim, 2.0);
    nm = l.emit("aten.clamp.default", {NA("self", tensor_arg(nm)), NA("min", float_arg(eps))}, contiguous(l.meta_of(nm)),
                "norm_eps");
    return binary(l, "aten.div.Tensor", x, nm, m.dtype, hint);
  };
  ValueId pr = binary(l, "aten.mul.Tensor", unit(a, "x1_unit"), unit(b, "x2_unit"), m.dtype, "product");
  l.bind(n, l.view(sum_kept(l, pr, {dim}, "cosine_similarity"), m.sizes));
}

void isin(L& l, const Node& n) {  // any(elements[:, None] == test[None, :]), inverted if asked
  const TensorMeta m = l.out_meta(n);
  ValueId e = l.tensor_in(n, "elements"), t = l.tensor_in(n, "test_elements");
  const int64_t ne = l.meta_of(e).numel(), nt = l.meta_of(t).numel();
  ValueId eq = binary(l, "aten.eq.Tensor", l.view(e, {ne, 1}), l.view(t, {1, nt}), ScalarType::Bool, "equal");
  ValueId r = l.emit("aten.any.dim", {NA("self", tensor_arg(eq)), NA("dim", int_arg(1)), NA("keepdim", bool_arg(false))},
                     contiguous(ScalarType::Bool, {ne}), "isin");
  if (l.int_in(n, "invert", 0) != 0) r = unary(l, "aten.logical_not.default", r, ScalarType::Bool, "not_in");
  l.bind(n, l.view(r, m.sizes));
}

// linspace / logspace as eager computes them (float32): step = (end - start) / (steps - 1); the first half
// start + i * step, the second end - (steps - 1 - i) * step; logspace base to those powers.
void linspace(L& l, const Node& n) {
  // float16 / bfloat16: computed in float32 and rounded once at the end; float64 in float64
  // integer types as eager's kernel computes them: start and end converted to the type (truncated), the steps in
  // float64, each value truncated
  TensorMeta m = l.out_meta(n);
  const ScalarType want = m.dtype;
  const bool integral = want == ScalarType::Long || want == ScalarType::Int || want == ScalarType::Short ||
                        want == ScalarType::Char || want == ScalarType::Byte;
  if (!is_float(want) && !integral) l.unsupported(n, "linspace / logspace of a dtype that is neither floating point nor an integer");
  m.dtype = integral || want == ScalarType::Double ? ScalarType::Double : ScalarType::Float;
  auto done = [&](ValueId r) { l.bind(n, l.convert(r, want)); };
  const int64_t steps = l.int_in(n, "steps");
  auto bound = [&](const char* name) {
    const Argument& a = l.arg(n, name);
    if (a.kind == Argument::Kind::Tensor) {
      ValueId t = l.tensor_in(n, name);
      if (integral) t = l.convert(t, want);
      return l.view(l.convert(t, m.dtype), {1});
    }
    Argument v = a;
    if (integral && v.kind == Argument::Kind::Float) {
      const double d = std::trunc(std::get<double>(v.payload));
      if (!(d >= -9.2e18 && d <= 9.2e18)) l.unsupported(n, "linspace / logspace bound out of int64's range");
      v = int_arg(static_cast<int64_t>(d));
    }
    return l.view(l.scalar_tensor(v, m.dtype), {1});
  };
  if (steps <= 0) {  // empty
    l.bind(n, l.emit("aten.full.default", {NA("size", ints_arg({0})), NA("fill_value", int_arg(0))}, l.out_meta(n),
                     "empty"));
    return;
  }
  ValueId start = bound("start"), end = bound("end");
  if (steps == 1) {
    ValueId r = start;
    if (n.target.starts_with("aten.logspace")) {
      ValueId b = l.scalar_tensor(float_arg(l.number_in(n, "base", 10.0)), m.dtype);
      r = l.emit("aten.pow.Tensor_Tensor", {NA("self", tensor_arg(b)), NA("exponent", tensor_arg(start))}, m, "logspace");
    }
    done(r);
    return;
  }
  ValueId step = with_scalar(l, "aten.div.Scalar", binary(l, "aten.sub.Tensor", end, start, m.dtype, "span"),
                             static_cast<double>(steps - 1), m.dtype, "step");
  ValueId i = l.convert(iota_constant(l, steps, ScalarType::Float, "linspace_index"), m.dtype);
  std::vector<std::byte> rb(static_cast<size_t>(steps) * 4);
  for (int64_t k = 0; k < steps; ++k) {
    const float v = static_cast<float>(steps - 1 - k);
    std::memcpy(rb.data() + k * 4, &v, 4);
  }
  ValueId ri = l.convert(l.constant_tensor(ScalarType::Float, {steps}, std::move(rb), "linspace_rindex"), m.dtype);
  ValueId lo = binary(l, "aten.add.Tensor", start, binary(l, "aten.mul.Tensor", i, step, m.dtype, "i_step"), m.dtype, "lo");
  ValueId hi = binary(l, "aten.sub.Tensor", end, binary(l, "aten.mul.Tensor", ri, step, m.dtype, "ri_step"), m.dtype, "hi");
  ValueId first = with_scalar(l, "aten.lt.Scalar", i, static_cast<double>(steps / 2), ScalarType::Bool, "first_half");
  ValueId r = select_where(l, first, lo, hi, m.dtype, "linspace");
  if (n.target.starts_with("aten.logspace")) {
    ValueId b = l.scalar_tensor(float_arg(l.number_in(n, "base", 10.0)), m.dtype);
    r = l.emit("aten.pow.Tensor_Tensor", {NA("self", tensor_arg(b)), NA("exponent", tensor_arg(r))}, m, "logspace");
  }
  done(r);
}

namespace {
std::vector<ValueId> tensor_list(L& l, const Node& n, const char* name) {
  const Argument ts = l.remap(l.arg(n, name));
  if (ts.kind != Argument::Kind::Tensors) l.unsupported(n, fmt::format("argument '{}' is not a tensor list", name));
  return std::get<std::vector<ValueId>>(ts.payload);
}

ValueId cat(L& l, const std::vector<ValueId>& parts, int64_t dim, const TensorMeta& m, const char* hint) {
  return l.emit("aten.cat.default", {NA("tensors", {Argument::Kind::Tensors, parts}), NA("dim", int_arg(dim))}, m, hint);
}
}  // namespace

void column_stack(L& l, const Node& n) {  // 0-d and 1-D inputs as columns, then cat along dim 1
  const TensorMeta m = l.out_meta(n);
  std::vector<ValueId> parts;
  for (ValueId x : tensor_list(l, n, "tensors")) {
    const auto s = l.meta_of(x).sizes;
    x = l.convert(x, m.dtype);
    parts.push_back(s.size() <= 1 ? l.view(x, {l.meta_of(x).numel(), 1}) : x);
  }
  if (parts.empty()) l.unsupported(n, "no tensors to join");
  l.bind(n, cat(l, parts, 1, m, "column_stack"));
}

void block_diag(L& l, const Node& n) {  // each block padded with zeros to the full width, then cat along dim 0
  const TensorMeta m = l.out_meta(n);
  const auto xs = tensor_list(l, n, "tensors");
  int64_t left = 0;
  std::vector<ValueId> rows;
  for (ValueId x : xs) {
    const auto s = l.meta_of(x).sizes;
    x = l.convert(x, m.dtype);
    if (s.size() == 0) x = l.view(x, {1, 1});
    else if (s.size() == 1) x = l.view(x, {1, s[0]});
    const auto bs = l.meta_of(x).sizes;
    const int64_t right = m.sizes.at(1) - left - bs[1];
    if (bs[0] > 0)
      rows.push_back(l.emit("aten.constant_pad_nd.default", {NA("self", tensor_arg(x)), NA("pad", ints_arg({left, right})),
                                                             NA("value", float_arg(0.0))},
                            contiguous(m.dtype, {bs[0], m.sizes.at(1)}), "block"));
    left += bs[1];
  }
  if (rows.empty()) l.unsupported(n, "no non-empty blocks");
  l.bind(n, rows.size() == 1 ? rows[0] : cat(l, rows, 0, m, "block_diag"));
}

void cartesian_prod(L& l, const Node& n) {  // meshgrid ('ij') of the inputs, each flattened, as columns
  const TensorMeta m = l.out_meta(n);
  const auto xs = tensor_list(l, n, "tensors");
  if (xs.size() == 1) {
    l.bind(n, l.view(xs[0], m.sizes));
    return;
  }
  std::vector<int64_t> grid;
  for (ValueId x : xs) grid.push_back(l.meta_of(x).numel());
  const int64_t total = m.sizes.at(0);
  std::vector<ValueId> cols;
  for (size_t i = 0; i < xs.size(); ++i) {
    std::vector<int64_t> v(xs.size(), 1);
    v[i] = grid[i];
    cols.push_back(l.view(l.expand(l.view(l.convert(xs[i], m.dtype), v), grid), {total, 1}));
  }
  l.bind(n, cat(l, cols, 1, m, "cartesian_prod"));
}

namespace {
// x [..., N] on the diagonal `offset` of the last two dims of [..., M, M] (M = N + |offset|), zeros elsewhere.
ValueId diagonal_embedded(L& l, ValueId x, int64_t offset, ScalarType dt) {
  const auto xs = l.meta_of(x).sizes;
  const int64_t nn = xs.back(), k = offset < 0 ? -offset : offset, mm = nn + k;
  std::vector<int64_t> batch(xs.begin(), xs.end() - 1);
  std::vector<int64_t> out = batch;
  out.push_back(mm);
  out.push_back(mm);
  std::vector<int64_t> pad{0, k};  // x padded to length M at its end
  std::vector<int64_t> padded = batch;
  padded.push_back(mm);
  ValueId xp = k == 0 ? x : l.emit("aten.constant_pad_nd.default", {NA("self", tensor_arg(x)), NA("pad", ints_arg(pad)),
                                                                    NA("value", float_arg(0.0))}, contiguous(dt, padded), "padded");
  // offset >= 0: out[i, i + k] = x[i] (x along rows); offset < 0: out[j + k, j] = x[j] (x along columns)
  std::vector<int64_t> v = batch;
  if (offset >= 0) {
    v.push_back(mm);
    v.push_back(1);
  } else {
    v.push_back(1);
    v.push_back(mm);
  }
  ValueId xe = l.expand(l.view(xp, v), out);
  std::vector<std::byte> mask(static_cast<size_t>(mm * mm));
  for (int64_t i = 0; i < mm; ++i)
    for (int64_t j = 0; j < mm; ++j) mask[static_cast<size_t>(i * mm + j)] = std::byte{j - i == offset};
  ValueId mk = l.constant_tensor(ScalarType::Bool, {mm, mm}, std::move(mask), "diagonal_mask");
  return select_where(l, mk, xe, constant_of(l, 0.0, dt), dt, "diag_embed");
}
}  // namespace

void diag_embed(L& l, const Node& n) {  // the last dim on the offset diagonal of two new last dims
  const TensorMeta m = l.out_meta(n);
  ValueId x = l.tensor_in(n, "self");
  const int64_t rank = static_cast<int64_t>(m.sizes.size());
  const int64_t d1 = L::wrap_dim(l.int_in(n, "dim1", -2), static_cast<size_t>(rank));
  const int64_t d2 = L::wrap_dim(l.int_in(n, "dim2", -1), static_cast<size_t>(rank));
  if (d1 != rank - 2 || d2 != rank - 1) l.unsupported(n, "diag_embed into dims other than the last two");
  if (l.meta_of(x).sizes.empty()) l.unsupported(n, "diag_embed of a 0-d tensor");
  l.bind(n, l.view(diagonal_embedded(l, x, l.int_in(n, "offset", 0), m.dtype), m.sizes));
}

void diag(L& l, const Node& n) {  // 1-D: the matrix with it on a diagonal; 2-D: the diagonal (diagflat: of the flattened input)
  const TensorMeta m = l.out_meta(n);
  ValueId x = l.tensor_in(n, "self");
  const int64_t k = l.int_in(n, n.target == "aten.diagflat.default" ? "offset" : "diagonal", 0);
  const auto s = l.meta_of(x).sizes;
  if (n.target == "aten.diagflat.default" || s.size() <= 1) {
    l.bind(n, l.view(diagonal_embedded(l, l.view(x, {l.meta_of(x).numel()}), k, m.dtype), m.sizes));
    return;
  }
  if (s.size() != 2) l.unsupported(n, "diag of a tensor of more than 2 dims");
  l.bind(n, l.emit("aten.diagonal_copy.default", {NA("self", tensor_arg(x)), NA("offset", int_arg(k)), NA("dim1", int_arg(0)),
                                                  NA("dim2", int_arg(1))}, m));
}

void max_unpool(L& l, const Node& n) {  // zeros with the values scattered to their flat indices per (N, C) plane
  const TensorMeta m = l.out_meta(n);
  ValueId x = l.tensor_in(n, "self"), idx = l.tensor_in(n, "indices");
  const auto xs = l.meta_of(x).sizes;
  const size_t spatial = n.target == "aten.max_unpool3d.default" ? 3 : 2;
  if (xs.size() != spatial + 1 && xs.size() != spatial + 2) l.unsupported(n, "max_unpool of an input of another rank");
  const int64_t planes = xs.size() == spatial + 2 ? xs[0] * xs[1] : xs[0];
  const int64_t in_plane = l.meta_of(x).numel() / std::max<int64_t>(planes, 1);
  const int64_t out_plane = m.numel() / std::max<int64_t>(planes, 1);
  ValueId zeros = l.emit("aten.full.default", {NA("size", ints_arg({planes, out_plane})), NA("fill_value", int_arg(0))},
                         contiguous(m.dtype, {planes, out_plane}), "zeros");
  ValueId r = l.emit("aten.scatter.src", {NA("self", tensor_arg(zeros)), NA("dim", int_arg(1)),
                                          NA("index", tensor_arg(l.view(idx, {planes, in_plane}))),
                                          NA("src", tensor_arg(l.view(x, {planes, in_plane})))},
                     contiguous(m.dtype, {planes, out_plane}), "unpool");
  l.bind(n, l.view(r, m.sizes));
}

// ---- kiln programs ExecuTorch's runtime could not run (the sweep's kiln bugs)

// bucketize as comparisons (ExecuTorch's portable library has no bucketize kernel: its runtime could not load
// kiln's program): the count of boundaries below x (right: at or below), NaN past the last, as torch's search.
void bucketize(L& l, const Node& n) {
  const TensorMeta m = l.out_meta(n);
  ValueId x = l.tensor_in(n, "self"), b = l.tensor_in(n, "boundaries");
  if (l.meta_of(b).sizes.size() != 1) l.unsupported(n, "boundaries of more than one dim");
  const int64_t nb = l.meta_of(b).sizes[0], nx = l.meta_of(x).numel();
  if (l.meta_of(x).dtype != l.meta_of(b).dtype) {
    const bool fl = is_float(l.meta_of(x).dtype) || is_float(l.meta_of(b).dtype);
    const ScalarType common = fl ? ScalarType::Float : ScalarType::Long;
    x = l.convert(x, common);
    b = l.convert(b, common);
  }
  ValueId xv = l.view(x, {nx, 1}), bv = l.view(b, {1, nb});
  const bool right = l.int_in(n, "right", 0) != 0;
  ValueId below = binary(l, right ? "aten.le.Tensor" : "aten.lt.Tensor", bv, xv, ScalarType::Bool, "below");
  ValueId count = l.view(sum_kept(l, l.convert(below, ScalarType::Long), {1}, "count"), {nx});
  if (is_float(l.meta_of(x).dtype)) {
    ValueId nan = unary(l, "aten.isnan.default", l.view(x, {nx}), ScalarType::Bool, "nan");
    count = select_where(l, nan, constant_of(l, static_cast<double>(nb), ScalarType::Long), count, ScalarType::Long,
                         "bucket");
  }
  l.bind(n, l.view(l.convert(count, m.dtype), m.sizes));
}

// unfold_copy as unfold (a view kiln lowers itself; ExecuTorch's unfold_copy kernel aborts its runtime on a 0-d input)
void unfold_copy(L& l, const Node& n) { as_op(l, n, "aten.unfold.default", n.inputs); }

// ---- batch 3

void kron(L& l, const Node& n) {  // a [a0, 1, a1, 1, ...] * b [1, b0, 1, b1, ...] viewed as [a0 b0, a1 b1, ...]
  const TensorMeta m = l.out_meta(n);
  ValueId a = l.convert(l.tensor_in(n, "self"), m.dtype), b = l.convert(l.tensor_in(n, "other"), m.dtype);
  auto as = l.meta_of(a).sizes, bs = l.meta_of(b).sizes;
  const size_t r = std::max(as.size(), bs.size());
  as.insert(as.begin(), r - as.size(), 1);
  bs.insert(bs.begin(), r - bs.size(), 1);
  std::vector<int64_t> av, bv;
  for (size_t i = 0; i < r; ++i) {
    av.insert(av.end(), {as[i], 1});
    bv.insert(bv.end(), {1, bs[i]});
  }
  l.bind(n, l.view(binary(l, "aten.mul.Tensor", l.view(a, av), l.view(b, bv), m.dtype, "kron"), m.sizes));
}

void tensordot(L& l, const Node& n) {  // a's free dims x contracted, b's contracted x free: one mm
  const TensorMeta m = l.out_meta(n);
  ValueId a = l.convert(l.tensor_in(n, "self"), m.dtype), b = l.convert(l.tensor_in(n, "other"), m.dtype);
  const auto as = l.meta_of(a).sizes, bs = l.meta_of(b).sizes;
  std::vector<int64_t> da = l.ints_in(n, "dims_self"), db = l.ints_in(n, "dims_other");
  if (da.size() != db.size()) l.unsupported(n, "contracted dims of different counts");
  for (auto& d : da) d = L::wrap_dim(d, as.size());
  for (auto& d : db) d = L::wrap_dim(d, bs.size());
  {  // a contracted pair of sizes n and 1 broadcasts (torch's tensordot): the 1 expanded
    auto ea = as, eb = bs;
    for (size_t i = 0; i < da.size(); ++i) {
      int64_t& sa = ea[static_cast<size_t>(da[i])];
      int64_t& sb = eb[static_cast<size_t>(db[i])];
      if (sa != sb && sa != 1 && sb != 1) l.unsupported(n, "contracted dims of different sizes");
      sa = sb = std::max(sa, sb);
    }
    if (ea != as) a = l.expand(a, ea);
    if (eb != bs) b = l.expand(b, eb);
  }
  const auto as2 = l.meta_of(a).sizes;
  const auto bs2 = l.meta_of(b).sizes;
  std::vector<int64_t> pa, pb;
  int64_t fa = 1, fb = 1, k = 1;
  for (size_t i = 0; i < as2.size(); ++i)
    if (std::find(da.begin(), da.end(), static_cast<int64_t>(i)) == da.end()) {
      pa.push_back(static_cast<int64_t>(i));
      fa *= as2[i];
    }
  for (int64_t d : da) {
    pa.push_back(d);
    k *= as2[static_cast<size_t>(d)];
  }
  pb = db;
  for (size_t i = 0; i < bs2.size(); ++i)
    if (std::find(db.begin(), db.end(), static_cast<int64_t>(i)) == db.end()) {
      pb.push_back(static_cast<int64_t>(i));
      fb *= bs2[i];
    }
  auto ordered = [&](ValueId x, const std::vector<int64_t>& perm) {
    bool id = true;
    for (size_t i = 0; i < perm.size(); ++i) id = id && perm[i] == static_cast<int64_t>(i);
    return id || perm.size() < 2 ? x : l.permute(x, perm);
  };
  ValueId a2 = l.view(ordered(a, pa), {fa, k}), b2 = l.view(ordered(b, pb), {k, fb});
  ValueId p = l.emit("aten.mm.default", {NA("self", tensor_arg(a2)), NA("mat2", tensor_arg(b2))}, contiguous(m.dtype, {fa, fb}),
                     "tensordot");
  l.bind(n, l.view(p, m.sizes));
}

namespace {
ValueId slice_of(L& l, ValueId x, int64_t dim, int64_t start, int64_t end, const char* hint) {
  auto s = l.meta_of(x).sizes;
  s[static_cast<size_t>(dim)] = end - start;
  return l.emit("aten.slice_copy.Tensor", {NA("self", tensor_arg(x)), NA("dim", int_arg(dim)), NA("start", int_arg(start)),
                                           NA("end", int_arg(end)), NA("step", int_arg(1))},
                contiguous(l.meta_of(x).dtype, s), hint);
}
}  // namespace

// trapz / trapezoid / cumulative_trapezoid with sample points x, eager's: ((y[1:] + y[:-1]) * dx).sum(dim) / 2
// (cumsum for the cumulative one), dx = diff(x) (a 1-D x along dim). Each step in eager's type: the sides in y's,
// dx in x's, their product in the promotion of both (integers wrap there), the sum or cumsum of integers in int64;
// only the division by 2 makes the result floating.
void trapezoid(L& l, const Node& n) {
  const TensorMeta m = l.out_meta(n);
  ValueId y = l.tensor_in(n, "y"), x = l.tensor_in(n, "x");
  const ScalarType yt = l.meta_of(y).dtype, xt = l.meta_of(x).dtype;
  const auto ys = l.meta_of(y).sizes;
  if (ys.empty()) l.unsupported(n, "trapezoid of a 0-d tensor");
  const int64_t dim = L::wrap_dim(l.int_in(n, "dim", -1), ys.size());
  const int64_t len = ys[static_cast<size_t>(dim)];
  if (len < 2) l.unsupported(n, "trapezoid over fewer than two points");
  ValueId dx;
  if (l.meta_of(x).sizes.size() == 1) {
    const int64_t nx = l.meta_of(x).sizes[0];
    dx = binary(l, "aten.sub.Tensor", slice_of(l, x, 0, 1, nx, "x_hi"), slice_of(l, x, 0, 0, nx - 1, "x_lo"), xt, "dx");
    std::vector<int64_t> v(ys.size(), 1);
    v[static_cast<size_t>(dim)] = nx - 1;
    dx = l.view(dx, v);
  } else {
    const auto xs = l.meta_of(x).sizes;
    const int64_t xd = L::wrap_dim(l.int_in(n, "dim", -1), xs.size());
    const int64_t nx = xs[static_cast<size_t>(xd)];
    dx = binary(l, "aten.sub.Tensor", slice_of(l, x, xd, 1, nx, "x_hi"), slice_of(l, x, xd, 0, nx - 1, "x_lo"), xt, "dx");
  }
  ValueId sides = binary(l, "aten.add.Tensor", slice_of(l, y, dim, 1, len, "y_hi"), slice_of(l, y, dim, 0, len - 1, "y_lo"),
                         yt, "sides");
  ValueId areas = binary(l, "aten.mul.Tensor", sides, dx, promote_types(yt, xt), "areas");
  if (!is_float(l.meta_of(areas).dtype)) areas = l.convert(areas, ScalarType::Long);
  ValueId r;
  if (n.target == "aten.cumulative_trapezoid.x") {
    r = l.emit("aten.cumsum.default", {NA("self", tensor_arg(areas)), NA("dim", int_arg(dim))},
               contiguous(l.meta_of(areas)), "cumsum");
  } else {
    r = sum_kept(l, areas, {dim}, "sum");
  }
  l.bind(n, l.view(with_scalar(l, "aten.div.Scalar", l.convert(r, m.dtype), 2.0, m.dtype, "trapezoid"), m.sizes));
}

// trapz / trapezoid with a spacing dx, eager's: (sum(y) - (y[0] + y[-1]) * 0.5) * dx; cumulative_trapezoid:
// cumsum(dx / 2 * (y[1:] + y[:-1])). The sums of two points in y's type (integers wrap there), the whole sum
// of integers in int64.
void trapezoid_dx(L& l, const Node& n) {
  const TensorMeta m = l.out_meta(n);
  ValueId y = l.tensor_in(n, "y");
  const ScalarType yt = l.meta_of(y).dtype;
  const auto ys = l.meta_of(y).sizes;
  if (ys.empty()) l.unsupported(n, "trapezoid of a 0-d tensor");
  const int64_t dim = L::wrap_dim(l.int_in(n, "dim", -1), ys.size());
  const int64_t len = ys[static_cast<size_t>(dim)];
  const double dx = l.number_in(n, "dx", 1.0);
  if (len < 1) l.unsupported(n, "trapezoid over no points");
  if (n.target == "aten.cumulative_trapezoid.dx") {
    if (len < 2) l.unsupported(n, "cumulative trapezoid over fewer than two points");
    ValueId sides = binary(l, "aten.add.Tensor", slice_of(l, y, dim, 1, len, "y_hi"), slice_of(l, y, dim, 0, len - 1, "y_lo"),
                           yt, "sides");
    ValueId areas = with_scalar(l, "aten.mul.Scalar", l.convert(sides, m.dtype), dx / 2.0, m.dtype, "areas");
    l.bind(n, l.emit("aten.cumsum.default", {NA("self", tensor_arg(areas)), NA("dim", int_arg(dim))}, m, "cumsum"));
    return;
  }
  ValueId total = l.convert(sum_kept(l, is_float(yt) ? y : l.convert(y, ScalarType::Long), {dim}, "sum"), m.dtype);
  ValueId ends = binary(l, "aten.add.Tensor", slice_of(l, y, dim, 0, 1, "first"), slice_of(l, y, dim, len - 1, len, "last"),
                        yt, "ends");
  ValueId r = binary(l, "aten.sub.Tensor", total,
                     with_scalar(l, "aten.mul.Scalar", l.convert(ends, m.dtype), 0.5, m.dtype, "half_ends"), m.dtype, "inner");
  l.bind(n, l.view(with_scalar(l, "aten.mul.Scalar", r, dx, m.dtype, "trapezoid"), m.sizes));
}

void grid_sampler(L& l, const Node& n) {  // of a 4-d input: grid_sampler_2d
  if (l.meta_of(l.tensor_in(n, "input")).sizes.size() != 4) l.unsupported(n, "grid_sampler of an input that is not 4-d");
  as_op(l, n, "aten.grid_sampler_2d.default", n.inputs);
}

// diff of any order (eager's: cat(prepend, x, append) along dim, then n times x[1:] - x[:-1], != for bools;
// n = 0 the input itself, prepend and append ignored)
void diff(L& l, const Node& n) {
  const TensorMeta m = l.out_meta(n);
  ValueId x = l.tensor_in(n, "self");
  const size_t rank = l.meta_of(x).sizes.size();
  if (rank == 0) l.unsupported(n, "diff of a 0-d tensor");
  const int64_t dim = L::wrap_dim(l.int_in(n, "dim", -1), rank);
  const int64_t order = l.int_in(n, "n", 1);
  if (order < 0) l.unsupported(n, "diff of a negative order");
  if (order == 0) {  // eager returns the input itself, without prepend / append
    l.bind(n, x);
    return;
  }
  auto pre = l.opt_tensor_in(n, "prepend");
  auto post = l.opt_tensor_in(n, "append");
  if (pre || post) {
    std::vector<ValueId> parts;
    if (pre) parts.push_back(*pre);
    parts.push_back(x);
    if (post) parts.push_back(*post);
    std::vector<int64_t> sizes = l.meta_of(x).sizes;
    sizes[static_cast<size_t>(dim)] = 0;
    for (ValueId v : parts) sizes[static_cast<size_t>(dim)] += l.meta_of(v).sizes.at(static_cast<size_t>(dim));
    x = l.emit("aten.cat.default", {NA("tensors", {Argument::Kind::Tensors, parts}), NA("dim", int_arg(dim))},
               contiguous(l.meta_of(x).dtype, sizes), "cat");
  }
  const bool boolean = l.meta_of(x).dtype == ScalarType::Bool;
  for (int64_t k = 0; k < order; ++k) {
    const int64_t len = l.meta_of(x).sizes[static_cast<size_t>(dim)];
    if (len <= 1) {  // nothing left: the empty result
      l.bind(n, l.emit("aten.full.default", {NA("size", ints_arg(m.sizes)), NA("fill_value", int_arg(0))}, m, "empty"));
      return;
    }
    x = binary(l, boolean ? "aten.ne.Tensor" : "aten.sub.Tensor", slice_of(l, x, dim, 1, len, "hi"),
               slice_of(l, x, dim, 0, len - 1, "lo"), l.meta_of(x).dtype, "diff");
  }
  l.bind(n, l.view(x, m.sizes));
}

namespace {
// The indices of an index argument, each clamped to [-size, size - 1] of its dim (torch's _unsafe_masked_index*
// decompositions: the masked-off positions may hold any index).
Argument clamped_indices(L& l, const Node& n, ValueId x) {
  const Argument a = l.remap(l.arg(n, "indices"));
  std::vector<std::optional<ValueId>> idx;
  if (a.kind == Argument::Kind::OptionalTensors) idx = std::get<std::vector<std::optional<ValueId>>>(a.payload);
  else if (a.kind == Argument::Kind::Tensors)
    for (ValueId v : std::get<std::vector<ValueId>>(a.payload)) idx.emplace_back(v);
  else
    l.unsupported(n, "argument 'indices' is not a tensor list");
  const auto xs = l.meta_of(x).sizes;
  for (size_t i = 0; i < idx.size(); ++i) {
    if (!idx[i]) continue;
    if (i >= xs.size()) l.unsupported(n, "more indices than dims");
    const TensorMeta im = contiguous(l.meta_of(*idx[i]));
    idx[i] = l.emit("aten.clamp.default", {NA("self", tensor_arg(*idx[i])), NA("min", int_arg(-xs[i])),
                                           NA("max", int_arg(xs[i] - 1))}, im, "index_clamped");
  }
  return {Argument::Kind::OptionalTensors, std::move(idx)};
}
}  // namespace

void unsafe_masked_index(L& l, const Node& n) {  // x[clamped indices] where mask, else fill
  const TensorMeta m = l.out_meta(n);
  ValueId x = l.tensor_in(n, "self"), mask = l.tensor_in(n, "mask");
  ValueId r = l.emit("aten.index.Tensor", {NA("self", tensor_arg(x)), NA("indices", clamped_indices(l, n, x))}, m, "index");
  ValueId fill = l.scalar_tensor(l.arg(n, "fill"), m.dtype);
  l.bind(n, l.expand(select_where(l, mask, r, fill, m.dtype, "masked_index"), m.sizes));
}

void unsafe_masked_index_put_accumulate(L& l, const Node& n) {  // index_put(accumulate) of the values where mask, else 0
  const TensorMeta m = l.out_meta(n);
  ValueId x = l.tensor_in(n, "self"), mask = l.tensor_in(n, "mask"), v = l.tensor_in(n, "values");
  ValueId mv = select_where(l, mask, v, constant_of(l, 0.0, l.meta_of(v).dtype), l.meta_of(v).dtype, "masked_values");
  l.bind(n, l.emit("aten.index_put.default", {NA("self", tensor_arg(x)), NA("indices", clamped_indices(l, n, x)),
                                              NA("values", tensor_arg(mv)), NA("accumulate", bool_arg(true))}, m));
}

// argsort / msort as the sort rewrite (decompose.cpp): a topk of every element in order (ExecuTorch's portable
// library has no sort); argsort keeps the indices, msort (along dim 0) the values. kiln's topk orders ties by index.
void argsort(L& l, const Node& n) {
  ValueId x = l.tensor_in(n, "self");
  const bool as_byte = l.meta_of(x).dtype == ScalarType::Bool;  // as sort's rewrite: ExecuTorch's topk takes no bool
  if (as_byte) x = l.convert(x, ScalarType::Byte);
  const TensorMeta xm = contiguous(l.meta_of(x));
  const bool values = n.target == "aten.msort.default";
  const int64_t dim = values ? 0 : L::wrap_dim(l.int_in(n, "dim", -1), xm.sizes.size());
  const int64_t k = xm.sizes.empty() ? 1 : xm.sizes.at(static_cast<size_t>(dim));
  const bool descending = !values && l.int_in(n, "descending", 0) != 0;
  auto outs = l.emit_raw("aten.topk.default", {NA("self", tensor_arg(x)), NA("k", int_arg(k)), NA("dim", int_arg(dim)),
                                               NA("largest", bool_arg(descending)), NA("sorted", bool_arg(true))},
                         {xm, contiguous(ScalarType::Long, xm.sizes)}, "sort");
  l.bind(n, values && as_byte ? l.convert(outs[0], ScalarType::Bool) : outs[values ? 0 : 1]);
}

// torch.gradient with one uniform spacing h and edge_order 1, per dim: (x[2:] - x[:-2]) / 2h inside, one-sided
// differences / h at the two ends.
void gradient(L& l, const Node& n) {
  ValueId x = l.tensor_in(n, "self");
  const auto xs = l.meta_of(x).sizes;
  if (l.int_in(n, "edge_order", 1) != 1) l.unsupported(n, "gradient with edge_order 2");
  const double h = l.number_in(n, "spacing", 1.0);
  std::vector<int64_t> dims;
  const Argument* d = l.opt(n, "dim");
  if (d && d->kind != Argument::Kind::None) dims = {L::wrap_dim(l.int_in(n, "dim"), xs.size())};
  else
    for (size_t i = 0; i < xs.size(); ++i) dims.push_back(static_cast<int64_t>(i));
  std::vector<ValueId> outs;
  for (size_t i = 0; i < dims.size(); ++i) {
    const TensorMeta m = l.out_meta(n, i);
    const int64_t dim = dims[i], len = xs.at(static_cast<size_t>(dim));
    if (len < 2) l.unsupported(n, "gradient along a dim of fewer than 2 points");
    ValueId xf = l.convert(x, m.dtype);
    auto step = [&](int64_t hi, int64_t lo, int64_t count, double div, const char* hint) {
      ValueId dd = binary(l, "aten.sub.Tensor", slice_of(l, xf, dim, hi, hi + count, "hi"),
                          slice_of(l, xf, dim, lo, lo + count, "lo"), m.dtype, "difference");
      return with_scalar(l, "aten.div.Scalar", dd, div, m.dtype, hint);
    };
    std::vector<ValueId> parts{step(1, 0, 1, h, "first")};
    if (len > 2) parts.push_back(step(2, 0, len - 2, 2.0 * h, "inner"));
    parts.push_back(step(len - 1, len - 2, 1, h, "last"));
    outs.push_back(l.emit("aten.cat.default", {NA("tensors", {Argument::Kind::Tensors, parts}), NA("dim", int_arg(dim))},
                          m, "gradient"));
  }
  l.bind_all(n, outs);
}

// fftshift / ifftshift of a real tensor: a roll by size / 2 (ifftshift: back) along the dims (None: all)
void fftshift(L& l, const Node& n) {
  ValueId x = l.tensor_in(n, "self");
  const auto xs = l.meta_of(x).sizes;
  const bool inverse = n.target == "aten.fft_ifftshift.default";
  std::vector<int64_t> dims = dims_of(l, n, "dim", xs.size()), shifts;
  if (xs.empty()) {
    l.bind(n, x);
    return;
  }
  for (int64_t d : dims) {
    const int64_t h = xs.at(static_cast<size_t>(d)) / 2;
    shifts.push_back(inverse ? -h : h);
  }
  l.bind(n, l.emit("aten.roll.default", {NA("self", tensor_arg(x)), NA("shifts", ints_arg(shifts)), NA("dims", ints_arg(dims))},
                   l.out_meta(n)));
}

namespace {
ValueId matmul2(L& l, ValueId a, ValueId b, ScalarType dt, const char* hint) {  // [.., m, k] @ [.., k, n]: mm or bmm
  const auto as = l.meta_of(a).sizes, bs = l.meta_of(b).sizes;
  if (as.size() == 2) return l.emit("aten.mm.default", {NA("self", tensor_arg(a)), NA("mat2", tensor_arg(b))},
                                    contiguous(dt, {as[0], bs[1]}), hint);
  return l.emit("aten.bmm.default", {NA("self", tensor_arg(a)), NA("mat2", tensor_arg(b))},
                contiguous(dt, {as[0], as[1], bs[2]}), hint);
}
}  // namespace

void multi_dot(L& l, const Node& n) {  // the chain of matrix products, left to right (a 1-D first/last as a row/column)
  const TensorMeta m = l.out_meta(n);
  auto xs = tensor_list(l, n, "tensors");
  if (xs.size() < 2) l.unsupported(n, "multi_dot of fewer than two tensors");
  if (l.meta_of(xs.front()).sizes.size() == 1) xs.front() = l.view(xs.front(), {1, l.meta_of(xs.front()).numel()});
  if (l.meta_of(xs.back()).sizes.size() == 1) xs.back() = l.view(xs.back(), {l.meta_of(xs.back()).numel(), 1});
  ValueId r = l.convert(xs[0], m.dtype);
  for (size_t i = 1; i < xs.size(); ++i) {
    if (l.meta_of(xs[i]).sizes.size() != 2) l.unsupported(n, "multi_dot of a tensor that is not a matrix");
    r = matmul2(l, r, l.convert(xs[i], m.dtype), m.dtype, "multi_dot");
  }
  l.bind(n, l.view(r, m.sizes));
}

void matrix_power(L& l, const Node& n) {  // n >= 0: the identity, or products by squaring
  const TensorMeta m = l.out_meta(n);
  ValueId a = l.tensor_in(n, "self");
  const auto as = l.meta_of(a).sizes;
  int64_t e = l.int_in(n, "n");
  if (e < 0) l.unsupported(n, "matrix_power of a negative power (an inverse)");
  if (as.size() < 2 || as[as.size() - 1] != as[as.size() - 2]) l.unsupported(n, "matrix_power of non-square matrices");
  const int64_t k = as.back();
  if (e == 0) {
    std::vector<std::byte> mask(static_cast<size_t>(k * k));
    for (int64_t i = 0; i < k; ++i) mask[static_cast<size_t>(i * k + i)] = std::byte{1};
    ValueId eye = l.constant_tensor(ScalarType::Bool, {k, k}, std::move(mask), "identity");
    ValueId one = select_where(l, eye, constant_of(l, 1.0, m.dtype), constant_of(l, 0.0, m.dtype), m.dtype, "identity");
    l.bind(n, l.expand(one, m.sizes));
    return;
  }
  int64_t batch = 1;
  for (size_t i = 0; i + 2 < as.size(); ++i) batch *= as[i];
  ValueId base = as.size() == 2 ? a : l.view(a, {batch, k, k});
  std::optional<ValueId> r;
  while (e > 0) {
    if (e & 1) r = r ? matmul2(l, *r, base, m.dtype, "power") : base;
    e >>= 1;
    if (e) base = matmul2(l, base, base, m.dtype, "square");
  }
  l.bind(n, l.view(*r, m.sizes));
}

// linalg_norm / linalg_matrix_norm: vector norms (one dim, or a flattened tensor with ord None) as vector_norm;
// the Frobenius norm and the 1 / inf matrix norms (max of column / row sums of |x|). Spectral and nuclear: SVD.
void linalg_norm(L& l, const Node& n) {
  const TensorMeta m = l.out_meta(n);
  if (l.opt(n, "dtype") && l.opt(n, "dtype")->kind != Argument::Kind::None) l.unsupported(n, "a norm with a dtype");
  ValueId x = l.convert(l.tensor_in(n, "self"), m.dtype);
  const auto xs = l.meta_of(x).sizes;
  const Argument* ord = l.opt(n, "ord");
  const bool none = !ord || ord->kind == Argument::Kind::None;
  const Argument* d = l.opt(n, "dim");
  std::vector<int64_t> dims;
  if (d && d->kind != Argument::Kind::None) dims = l.ints_in(n, "dim");
  for (auto& v : dims) v = L::wrap_dim(v, xs.size());
  const bool matrix_op = n.target.starts_with("aten.linalg_matrix_norm");
  if (matrix_op && dims.empty()) dims = {static_cast<int64_t>(xs.size()) - 2, static_cast<int64_t>(xs.size()) - 1};
  std::string sord = ord && ord->kind == Argument::Kind::String ? std::get<std::string>(ord->payload) : "";
  if (!matrix_op && (dims.size() == 1 || (dims.empty() && (none || xs.size() <= 1)))) {  // linalg_vector_norm's
    std::vector<NamedArgument> in{source_input(l, n, "self"), none ? NA("ord", float_arg(2.0)) : source_input(l, n, "ord")};
    if (d) in.push_back(source_input(l, n, "dim"));
    if (l.opt(n, "keepdim")) in.push_back(source_input(l, n, "keepdim"));
    as_op(l, n, "aten.linalg_vector_norm.default", std::move(in));
    return;
  }
  if (dims.empty() && xs.size() == 2) dims = {0, 1};
  if (dims.size() != 2) l.unsupported(n, "a matrix norm needs two dims");
  if (none || sord == "fro") {
    ValueId sq = binary(l, "aten.mul.Tensor", x, x, m.dtype, "sq");
    l.bind(n, l.view(unary(l, "aten.sqrt.default", sum_kept(l, sq, dims, "sum"), m.dtype, "fro"), m.sizes));
    return;
  }
  if (!sord.empty()) l.unsupported(n, fmt::format("the '{}' matrix norm (singular values)", sord));
  const double p = l.number_in(n, "ord", 2.0);
  if (std::abs(p) != 1.0 && !std::isinf(p)) l.unsupported(n, "a matrix norm of order +-2 (singular values)");
  // ord +-1: over the columns (dims[1]) the sum over rows (dims[0]); ord +-inf: the other way round
  const int64_t summed = std::abs(p) == 1.0 ? dims[0] : dims[1], reduced = std::abs(p) == 1.0 ? dims[1] : dims[0];
  ValueId sums = sum_kept(l, unary(l, "aten.abs.default", x, m.dtype, "abs"), {summed}, "sums");
  ValueId r = l.emit(p > 0 ? "aten.amax.default" : "aten.amin.default",
                     {NA("self", tensor_arg(sums)), NA("dim", ints_arg({reduced})), NA("keepdim", bool_arg(true))},
                     contiguous(m.dtype, kept_sizes(l.meta_of(sums).sizes, {reduced})), "matrix_norm");
  l.bind(n, l.view(r, m.sizes));
}

// float_power: pow in float64 (eager promotes both operands to double; a number operand is a 0-d double)
void float_power(L& l, const Node& n) {
  const TensorMeta m = l.out_meta(n);
  auto operand = [&](const char* name) {
    const Argument& a = l.arg(n, name);
    return a.kind == Argument::Kind::Tensor ? l.convert(l.tensor_in(n, name), m.dtype) : l.scalar_tensor(a, m.dtype);
  };
  ValueId a = operand("self"), b = operand("exponent");
  l.bind(n, l.expand(l.emit("aten.pow.Tensor_Tensor", {NA("self", tensor_arg(a)), NA("exponent", tensor_arg(b))},
                            contiguous(m.dtype, broadcast_sizes(l.meta_of(a).sizes, l.meta_of(b).sizes)), "float_power"),
                     m.sizes));
}

}  // namespace kiln::passes::detail::decomp
