// Decompositions as data: one table, keyed by operator target, of rewrites of a
// (non-core) operator into operators kiln already has. Lowerer::lower consults
// it by the node's target before its families; the functional variants that
// functionalization (functionalize.cpp) produces and the op table lacks
// (aten.zero, aten.fill.Tensor) live here too.
//
// A new decomposition is one function below and one row in kDecompositions.
#include "lowerer.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>

namespace kiln::passes::detail {
namespace {

using L = Lowerer;

// The pieces of a split along `dim` whose sizes are the node's outputs' (chunk, tensor_split, unsafe_split).
void split_as_outputs(L& l, const Node& n, ValueId x, int64_t dim) {
  std::vector<TensorMeta> metas;
  std::vector<int64_t> sizes;
  for (size_t i = 0; i < l.source_outputs(n).size(); ++i) {
    metas.push_back(l.out_meta(n, i));
    if (static_cast<size_t>(dim) >= metas.back().sizes.size()) l.unsupported(n, "piece of a different rank");
    sizes.push_back(metas.back().sizes[static_cast<size_t>(dim)]);
  }
  if (metas.empty()) l.unsupported(n, "operator has no tensor outputs");
  l.bind_all(n, l.emit_raw("aten.split_with_sizes_copy.default",
                           {NA("self", tensor_arg(x)), NA("split_sizes", ints_arg(sizes)), NA("dim", int_arg(dim))},
                           metas));
}

void pieces(L& l, const Node& n) {  // aten.chunk / tensor_split / unsafe_split: the outputs say the sizes
  ValueId x = l.tensor_in(n, "self");
  split_as_outputs(l, n, x, L::wrap_dim(l.int_in(n, "dim", 0), l.meta_of(x).sizes.size()));
}

void unbind(L& l, const Node& n) {  // pieces of size 1, each viewed without the dim
  ValueId x = l.tensor_in(n, "self");
  const auto& xm = l.meta_of(x);
  const int64_t dim = L::wrap_dim(l.int_in(n, "dim", 0), xm.sizes.size());
  std::vector<int64_t> sizes(static_cast<size_t>(xm.sizes.at(static_cast<size_t>(dim))), 1);
  std::vector<TensorMeta> metas;
  std::vector<int64_t> piece = xm.sizes;
  piece[static_cast<size_t>(dim)] = 1;
  for (size_t i = 0; i < sizes.size(); ++i) metas.push_back(contiguous(xm.dtype, piece));
  auto parts = l.emit_raw("aten.split_with_sizes_copy.default",
                          {NA("self", tensor_arg(x)), NA("split_sizes", ints_arg(sizes)), NA("dim", int_arg(dim))}, metas);
  std::vector<ValueId> outs;
  for (size_t i = 0; i < parts.size(); ++i) outs.push_back(l.view(parts[i], l.out_meta(n, i).sizes));
  l.bind_all(n, outs);
}

// repeat_interleave of x along dim (None: flattened) by `repeats` per element: each slice repeated in turn.
void repeat_interleave_by(L& l, const Node& n, ValueId x, const std::vector<int64_t>& repeats) {
  const TensorMeta m = l.out_meta(n);
  const Argument* d = l.opt(n, "dim");
  int64_t dim = 0;
  if (!d || d->kind == Argument::Kind::None) x = l.view(x, {l.meta_of(x).numel()});
  else dim = L::wrap_dim(l.int_in(n, "dim"), l.meta_of(x).sizes.size());
  std::vector<int64_t> s = l.meta_of(x).sizes;
  const auto at = static_cast<size_t>(dim);
  if (std::all_of(repeats.begin(), repeats.end(), [&](int64_t r) { return r == repeats[0]; })) {
    // x.unsqueeze(dim + 1).expand(..., r, ...).reshape: one copy
    std::vector<int64_t> u = s, e = s;
    u.insert(u.begin() + static_cast<std::ptrdiff_t>(at) + 1, 1);
    e.insert(e.begin() + static_cast<std::ptrdiff_t>(at) + 1, repeats.empty() ? 0 : repeats[0]);
    l.bind(n, l.view(l.expand(l.view(x, u), e), m.sizes));
    return;
  }
  if (static_cast<int64_t>(repeats.size()) != s[at]) l.unsupported(n, "repeats do not match the dim's size");
  std::vector<int64_t> idx;
  for (size_t i = 0; i < repeats.size(); ++i) idx.insert(idx.end(), static_cast<size_t>(repeats[i]), static_cast<int64_t>(i));
  std::vector<std::byte> bytes(idx.size() * sizeof(int64_t));
  if (!idx.empty()) std::memcpy(bytes.data(), idx.data(), bytes.size());
  ValueId iv = l.constant_tensor(ScalarType::Long, {static_cast<int64_t>(idx.size())}, std::move(bytes), "repeat_index");
  l.bind(n, l.emit("aten.index_select.default", {NA("self", tensor_arg(x)), NA("dim", int_arg(dim)),
                                                 NA("index", tensor_arg(iv))}, m));
}

void repeat_interleave_int(L& l, const Node& n) {
  repeat_interleave_by(l, n, l.tensor_in(n, "self"), {l.int_in(n, "repeats")});
}

void repeat_interleave_tensor(L& l, const Node& n) {  // repeats a constant tensor (its values known now)
  ValueId x = l.tensor_in(n, "self");
  ValueId r = l.tensor_in(n, "repeats");
  const auto& rm = l.meta_of(r);
  if (!l.out_.is_constant(r) || (rm.dtype != ScalarType::Long && rm.dtype != ScalarType::Int))
    l.unsupported(n, "repeats must be a constant integer tensor (a computed one gives a data-dependent size)");
  auto bytes = l.out_.constant_bytes(r);
  std::vector<int64_t> reps(static_cast<size_t>(rm.numel()));
  for (size_t i = 0; i < reps.size(); ++i) {
    if (rm.dtype == ScalarType::Long) std::memcpy(&reps[i], bytes.data() + i * 8, 8);
    else {
      int32_t v;
      std::memcpy(&v, bytes.data() + i * 4, 4);
      reps[i] = v;
    }
  }
  repeat_interleave_by(l, n, x, reps);
}

// torch._weight_norm(v, g, dim): v * g / ||v||, the norm over every dim but `dim` (dim -1: over all of v).
void weight_norm(L& l, const Node& n) {
  ValueId v = l.tensor_in(n, "v");
  ValueId g = l.tensor_in(n, "g");
  const TensorMeta vm = l.meta_of(v);
  const int64_t dim = l.int_in(n, "dim", 0);
  std::vector<int64_t> dims, kept = vm.sizes;
  for (int64_t d = 0; d < static_cast<int64_t>(vm.sizes.size()); ++d)
    if (dim == -1 || d != dim) {
      dims.push_back(d);
      kept[static_cast<size_t>(d)] = 1;
    }
  const TensorMeta km = contiguous(vm.dtype, kept);
  ValueId sq = l.emit("aten.mul.Tensor", {NA("self", tensor_arg(v)), NA("other", tensor_arg(v))}, contiguous(vm), "sq");
  ValueId s = l.emit("aten.sum.dim_IntList", {NA("self", tensor_arg(sq)), NA("dim", ints_arg(dims)),
                                              NA("keepdim", bool_arg(true))}, km, "sum");
  ValueId norm = l.emit("aten.sqrt.default", {NA("self", tensor_arg(s))}, km, "norm");
  ValueId scale = l.emit("aten.div.Tensor", {NA("self", tensor_arg(g)), NA("other", tensor_arg(norm))},
                         contiguous(vm.dtype, l.meta_of(g).sizes.size() == kept.size() ? l.meta_of(g).sizes : kept),
                         "scale");
  l.bind(n, l.emit("aten.mul.Tensor", {NA("self", tensor_arg(v)), NA("other", tensor_arg(scale))}, l.out_meta(n)));
}

void zero(L& l, const Node& n) {  // functional zero_ (and empty): zeros of the output's shape and dtype
  const TensorMeta m = l.out_meta(n);
  l.bind(n, l.emit("aten.full.default", {NA("size", ints_arg(m.sizes)), NA("fill_value", int_arg(0))}, m));
}

void fill_tensor(L& l, const Node& n) {  // functional fill_(Tensor): the 0-d value everywhere
  const TensorMeta m = l.out_meta(n);
  ValueId v = l.convert(l.tensor_in(n, "value"), m.dtype);
  if (l.meta_of(v).sizes.size() != m.sizes.size()) v = l.view(v, std::vector<int64_t>(m.sizes.size(), 1));
  ValueId e = l.expand(v, m.sizes);
  if (e == v) e = l.emit("aten.mul.Scalar", {NA("self", tensor_arg(v)), NA("other", int_arg(1))}, m, "fill");
  l.bind(n, e);
}

void silu(L& l, const Node& n) {  // x * sigmoid(x)
  ValueId x = l.tensor_in(n, "self");
  const TensorMeta m = l.out_meta(n);
  ValueId s = l.emit("aten.sigmoid.default", {NA("self", tensor_arg(x))}, m, "sigmoid");
  l.bind(n, l.emit("aten.mul.Tensor", {NA("self", tensor_arg(x)), NA("other", tensor_arg(s))}, m));
}

void rsub_tensor(L& l, const Node& n) {  // other - alpha * self
  ValueId x = l.tensor_in(n, "self");
  const Argument& o = l.arg(n, "other");
  ValueId other = o.kind == Argument::Kind::Tensor ? l.tensor_in(n, "other") : l.scalar_tensor(o, l.out_meta(n).dtype);
  std::vector<NamedArgument> args{NA("self", tensor_arg(other)), NA("other", tensor_arg(x))};
  if (const auto* a = l.opt(n, "alpha")) args.push_back(NA("alpha", *a));
  l.bind(n, l.emit("aten.sub.Tensor", std::move(args), l.out_meta(n)));
}

// beta * self + alpha * (batch1 @ batch2) (baddbmm: BLOOM's ALiBi scores); beta 0 ignores self, as torch does.
void scaled_sum_with(L& l, const Node& n, ValueId prod) {
  const TensorMeta m = l.out_meta(n);
  const double alpha = l.number_in(n, "alpha", 1.0), beta = l.number_in(n, "beta", 1.0);
  if (alpha != 1.0)
    prod = l.emit("aten.mul.Scalar", {NA("self", tensor_arg(prod)), NA("other", float_arg(alpha))}, m, "alpha");
  if (beta == 0.0) {
    l.bind(n, prod);
    return;
  }
  ValueId self = l.tensor_in(n, "self");
  if (beta != 1.0)
    self = l.emit("aten.mul.Scalar", {NA("self", tensor_arg(self)), NA("other", float_arg(beta))},
                  contiguous(l.meta_of(self)), "beta");
  l.bind(n, l.emit("aten.add.Tensor", {NA("self", tensor_arg(self)), NA("other", tensor_arg(prod))}, m));
}

void baddbmm(L& l, const Node& n) {
  ValueId a = l.tensor_in(n, "batch1"), b = l.tensor_in(n, "batch2");
  scaled_sum_with(l, n, l.emit("aten.bmm.default", {NA("self", tensor_arg(a)), NA("mat2", tensor_arg(b))},
                               l.out_meta(n), "bmm"));
}

void addbmm(L& l, const Node& n) {  // the batch's products summed
  ValueId a = l.tensor_in(n, "batch1"), b = l.tensor_in(n, "batch2");
  const TensorMeta m = l.out_meta(n);
  const auto& am = l.meta_of(a);
  const auto& bm = l.meta_of(b);
  if (am.sizes.size() != 3 || bm.sizes.size() != 3) l.unsupported(n, "batch1 and batch2 must be 3-d");
  ValueId p = l.emit("aten.bmm.default", {NA("self", tensor_arg(a)), NA("mat2", tensor_arg(b))},
                     contiguous(m.dtype, {am.sizes[0], am.sizes[1], bm.sizes[2]}), "bmm");
  scaled_sum_with(l, n, l.emit("aten.sum.dim_IntList", {NA("self", tensor_arg(p)), NA("dim", ints_arg({0})),
                                                        NA("keepdim", bool_arg(false))}, m, "sum"));
}

void addmv(L& l, const Node& n) {  // mat @ vec as an mm with a column
  ValueId a = l.tensor_in(n, "mat"), v = l.tensor_in(n, "vec");
  const TensorMeta m = l.out_meta(n);
  const int64_t k = l.meta_of(v).sizes.at(0);
  ValueId p = l.emit("aten.mm.default", {NA("self", tensor_arg(a)), NA("mat2", tensor_arg(l.view(v, {k, 1})))},
                     contiguous(m.dtype, {m.sizes.at(0), 1}), "mv");
  scaled_sum_with(l, n, l.view(p, m.sizes));
}

void addr(L& l, const Node& n) {  // outer product vec1 (x) vec2
  ValueId a = l.tensor_in(n, "vec1"), b = l.tensor_in(n, "vec2");
  const TensorMeta m = l.out_meta(n);
  const int64_t r = l.meta_of(a).sizes.at(0), c = l.meta_of(b).sizes.at(0);
  scaled_sum_with(l, n, l.emit("aten.mul.Tensor", {NA("self", tensor_arg(l.view(a, {r, 1}))),
                                                   NA("other", tensor_arg(l.view(b, {1, c})))}, m, "outer"));
}

// numpy_T (x.T): every dim reversed; mT / adjoint of a real tensor: the last two swapped.
void reverse_dims(L& l, const Node& n) {
  ValueId x = l.tensor_in(n, "self");
  std::vector<int64_t> dims(l.meta_of(x).sizes.size());
  std::iota(dims.rbegin(), dims.rend(), 0);
  l.bind(n, dims.size() < 2 ? x : l.permute(x, dims));
}

void swap_last_two(L& l, const Node& n) {
  ValueId x = l.tensor_in(n, "self");
  std::vector<int64_t> dims(l.meta_of(x).sizes.size());
  if (dims.size() < 2) l.unsupported(n, "needs a tensor of at least 2 dims");
  std::iota(dims.begin(), dims.end(), 0);
  std::swap(dims[dims.size() - 1], dims[dims.size() - 2]);
  l.bind(n, l.permute(x, dims));
}

// A constant int64 vector 0..n-1 (or float when `as_float`).
ValueId iota_constant(L& l, int64_t n, ScalarType dt, const char* hint) {
  std::vector<std::byte> bytes(static_cast<size_t>(n) * (dt == ScalarType::Float ? 4 : 8));
  for (int64_t i = 0; i < n; ++i) {
    if (dt == ScalarType::Float) {
      const float f = static_cast<float>(i);
      std::memcpy(bytes.data() + i * 4, &f, 4);
    } else {
      std::memcpy(bytes.data() + i * 8, &i, 8);
    }
  }
  return l.constant_tensor(dt, {n}, std::move(bytes), hint);
}

// histc(x, bins, min, max) with min < max (Mixtral's tokens per expert): torch's bin of x is
// trunc((x - min) * bins / (max - min)), the last edge counted in the last bin, x outside [min, max] not
// counted; here each bin compares every element (a one-hot sum, bins x numel).
void histc(L& l, const Node& n) {
  ValueId x = l.tensor_in(n, "self");
  const TensorMeta m = l.out_meta(n);
  const auto& xm = l.meta_of(x);
  if (xm.dtype != ScalarType::Float) l.unsupported(n, "histc of a non-float32 tensor");
  const int64_t bins = l.int_in(n, "bins", 100);
  const double mn = l.number_in(n, "min", 0.0), mx = l.number_in(n, "max", 0.0);
  if (!(mn < mx)) l.unsupported(n, "histc with min >= max takes its range from the data (a data-dependent range)");
  const int64_t N = xm.numel();
  const TensorMeta col = contiguous(ScalarType::Float, {N, 1});
  const TensorMeta colb = contiguous(ScalarType::Bool, {N, 1});
  x = l.view(x, {N, 1});
  const auto width = static_cast<double>(static_cast<float>(mx) - static_cast<float>(mn));
  ValueId p = l.emit("aten.sub.Scalar", {NA("self", tensor_arg(x)), NA("other", float_arg(mn))}, col, "shifted");
  p = l.emit("aten.mul.Scalar", {NA("self", tensor_arg(p)), NA("other", int_arg(bins))}, col, "scaled");
  p = l.emit("aten.div.Scalar", {NA("self", tensor_arg(p)), NA("other", float_arg(width))}, col, "pos");
  p = l.emit("aten.floor.default", {NA("self", tensor_arg(p))}, col, "bin");  // >= 0 where counted: trunc
  p = l.emit("aten.clamp.default", {NA("self", tensor_arg(p)), NA("max", int_arg(bins - 1))}, col, "bin");
  ValueId lo = l.emit("aten.ge.Scalar", {NA("self", tensor_arg(x)), NA("other", float_arg(mn))}, colb, "in_lo");
  ValueId hi = l.emit("aten.le.Scalar", {NA("self", tensor_arg(x)), NA("other", float_arg(mx))}, colb, "in_hi");
  ValueId in =
      l.emit("aten.logical_and.default", {NA("self", tensor_arg(lo)), NA("other", tensor_arg(hi))}, colb, "in");
  ValueId edges = l.view(iota_constant(l, bins, ScalarType::Float, "bins"), {1, bins});
  const TensorMeta hot = contiguous(ScalarType::Bool, {N, bins});
  ValueId h = l.emit("aten.eq.Tensor", {NA("self", tensor_arg(p)), NA("other", tensor_arg(edges))}, hot, "onehot");
  h = l.emit("aten.logical_and.default", {NA("self", tensor_arg(h)), NA("other", tensor_arg(in))}, hot, "counted");
  ValueId hf = l.convert(h, m.dtype);
  l.bind(n, l.emit("aten.sum.dim_IntList", {NA("self", tensor_arg(hf)), NA("dim", ints_arg({0})),
                                            NA("keepdim", bool_arg(false))}, m));
}

// transformers' grouped_mm fallback (its MoE experts by default): rows [offs[e-1], offs[e]) of input times
// weight[e]; rows from offs[-1] on are zero. Every row times every expert (one mm against the experts side
// by side), then each row's expert gathered: the row's expert is the count of offsets <= its index.
void grouped_mm(L& l, const Node& n) {
  ValueId x = l.tensor_in(n, "input"), w = l.tensor_in(n, "weight"), offs = l.tensor_in(n, "offs");
  const TensorMeta m = l.out_meta(n);
  const auto& xm = l.meta_of(x);
  const auto& wm = l.meta_of(w);
  if (xm.sizes.size() != 2 || wm.sizes.size() != 3 || l.meta_of(offs).sizes.size() != 1)
    l.unsupported(n, "expects input [S, K], weight [E, K, M], offs [E]");
  const int64_t S = xm.sizes[0], E = wm.sizes[0], K = wm.sizes[1], M = wm.sizes[2];
  const ScalarType dt = m.dtype;
  ValueId wk = l.view(l.permute(w, {1, 0, 2}, "experts_side_by_side"), {K, E * M});
  ValueId all = l.emit("aten.mm.default", {NA("self", tensor_arg(x)), NA("mat2", tensor_arg(wk))},
                       contiguous(dt, {S, E * M}), "every_expert");
  ValueId rows = l.view(iota_constant(l, S, ScalarType::Long, "rows"), {S, 1});
  ValueId ends = l.view(l.convert(offs, ScalarType::Long), {1, E});
  ValueId past = l.emit("aten.le.Tensor", {NA("self", tensor_arg(ends)), NA("other", tensor_arg(rows))},
                        contiguous(ScalarType::Bool, {S, E}), "past");
  ValueId e = l.emit("aten.sum.dim_IntList", {NA("self", tensor_arg(past)), NA("dim", ints_arg({1})),
                                              NA("keepdim", bool_arg(true))}, contiguous(ScalarType::Long, {S, 1}),
                     "expert");
  ValueId valid = l.emit("aten.lt.Scalar", {NA("self", tensor_arg(e)), NA("other", int_arg(E))},
                         contiguous(ScalarType::Bool, {S, 1}), "valid");
  ValueId ec = l.emit("aten.clamp.default", {NA("self", tensor_arg(e)), NA("max", int_arg(E - 1))},
                      contiguous(ScalarType::Long, {S, 1}), "expert");
  ValueId idx = l.expand(l.view(ec, {S, 1, 1}), {S, 1, M});
  ValueId y = l.emit("aten.gather.default", {NA("self", tensor_arg(l.view(all, {S, E, M}))), NA("dim", int_arg(1)),
                                             NA("index", tensor_arg(idx))}, contiguous(dt, {S, 1, M}), "row_expert");
  ValueId zero = l.scalar_tensor(float_arg(0.0), dt);
  l.bind(n, l.emit("aten.where.self", {NA("condition", tensor_arg(valid)), NA("self", tensor_arg(l.view(y, {S, M}))),
                                       NA("other", tensor_arg(zero))}, m));
}

// One cat of the node's tensors, each first converted to the output's dtype and viewed as `shape_of` says.
template <typename Shape>
void cat_of(L& l, const Node& n, int64_t dim, Shape shape_of) {
  const Argument ts = l.remap(l.arg(n, "tensors"));
  if (ts.kind != Argument::Kind::Tensors) l.unsupported(n, "argument 'tensors' is not a tensor list");
  const TensorMeta m = l.out_meta(n);
  std::vector<ValueId> parts;
  for (ValueId x : std::get<std::vector<ValueId>>(ts.payload))
    parts.push_back(l.view(l.convert(x, m.dtype), shape_of(l.meta_of(x).sizes)));
  if (parts.empty()) l.unsupported(n, "no tensors to join");
  l.bind(n, l.emit("aten.cat.default", {NA("tensors", {Argument::Kind::Tensors, parts}), NA("dim", int_arg(dim))}, m));
}

void stack(L& l, const Node& n) {  // each unsqueezed at dim (torch's own definition)
  const int64_t dim = L::wrap_dim(l.int_in(n, "dim", 0), l.out_meta(n).sizes.size());
  cat_of(l, n, dim, [&](std::vector<int64_t> s) {
    s.insert(s.begin() + dim, 1);
    return s;
  });
}

// hstack / vstack / dstack: atleast_1d/2d/3d, then cat along 0 (1-D inputs of hstack) or 1, 0, 2.
std::vector<int64_t> at_least(std::vector<int64_t> s, size_t rank) {
  if (s.size() >= rank) return s;
  if (s.empty()) return std::vector<int64_t>(rank, 1);
  if (s.size() == 1) return rank == 2 ? std::vector<int64_t>{1, s[0]} : std::vector<int64_t>{1, s[0], 1};
  s.push_back(1);  // 2-d to 3-d
  return s;
}

void hstack(L& l, const Node& n) {
  const bool rows = l.out_meta(n).sizes.size() == 1;
  cat_of(l, n, rows ? 0 : 1, [](const std::vector<int64_t>& s) { return at_least(s, 1); });
}

void vstack(L& l, const Node& n) {
  cat_of(l, n, 0, [](const std::vector<int64_t>& s) { return at_least(s, 2); });
}

void dstack(L& l, const Node& n) {
  cat_of(l, n, 2, [](const std::vector<int64_t>& s) { return at_least(s, 3); });
}

// addcmul / addcdiv: self + value * tensor1 * tensor2 (/ tensor2), in torch's order.
void addc(L& l, const Node& n, const char* op) {
  const TensorMeta m = l.out_meta(n);
  ValueId t1 = l.tensor_in(n, "tensor1"), t2 = l.tensor_in(n, "tensor2");
  const double value = l.number_in(n, "value", 1.0);
  if (value != 1.0)
    t1 = l.emit("aten.mul.Scalar", {NA("self", tensor_arg(t1)), NA("other", float_arg(value))},
                contiguous(l.meta_of(t1)), "scaled");
  ValueId p = l.emit(op, {NA("self", tensor_arg(t1)), NA("other", tensor_arg(t2))}, m, "term");
  l.bind(n, l.emit("aten.add.Tensor", {NA("self", tensor_arg(l.tensor_in(n, "self"))), NA("other", tensor_arg(p))}, m));
}

void addcmul(L& l, const Node& n) { addc(l, n, "aten.mul.Tensor"); }
void addcdiv(L& l, const Node& n) { addc(l, n, "aten.div.Tensor"); }

void broadcast_tensors(L& l, const Node& n) {  // each expanded to its output's shape (nn.L1Loss and the like)
  const Argument ts = l.remap(l.arg(n, "tensors"));
  if (ts.kind != Argument::Kind::Tensors) l.unsupported(n, "argument 'tensors' is not a tensor list");
  const auto& xs = std::get<std::vector<ValueId>>(ts.payload);
  std::vector<ValueId> outs;
  for (size_t i = 0; i < xs.size(); ++i) {
    const std::vector<int64_t> sizes = l.out_meta(n, i).sizes;
    ValueId x = xs[i];
    if (l.meta_of(x).sizes.size() < sizes.size()) {  // leading 1s first, as broadcasting reads them
      std::vector<int64_t> s = l.meta_of(x).sizes;
      s.insert(s.begin(), sizes.size() - s.size(), 1);
      x = l.view(x, s);
    }
    outs.push_back(l.expand(x, sizes));
  }
  l.bind_all(n, outs);
}

void conj_physical(L& l, const Node& n) {  // of a real tensor (kiln has no complex dtypes): itself
  l.bind(n, l.tensor_in(n, "self"));
}

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

// `other` as the rewrite's argument: the remapped tensor, or the Python number as it is (emit makes a 0-d
// tensor of it where the schema wants a Tensor).
Argument other_arg(L& l, const Node& n) {
  const Argument& o = l.arg(n, "other");
  return o.kind == Argument::Kind::Tensor ? tensor_arg(l.tensor_in(n, "other")) : o;
}

void true_divide(L& l, const Node& n) {  // the functional form of true_divide_: div
  l.bind(n, l.emit("aten.div.Tensor", {NA("self", tensor_arg(l.tensor_in(n, "self"))), NA("other", other_arg(l, n))},
                   l.out_meta(n)));
}

void floor_divide(L& l, const Node& n) {  // floor_divide_.Tensor's functional name: floor_divide
  const TensorMeta m = l.out_meta(n);
  const Argument& o = l.arg(n, "other");
  ValueId other = o.kind == Argument::Kind::Tensor ? l.tensor_in(n, "other") : l.scalar_tensor(o, m.dtype);
  l.bind(n, l.emit("aten.floor_divide.default", {NA("self", tensor_arg(l.tensor_in(n, "self"))),
                                                 NA("other", tensor_arg(other))}, m));
}

void deg2rad(L& l, const Node& n) {
  constexpr double kPi = 3.14159265358979323846;
  l.bind(n, l.emit("aten.mul.Scalar", {NA("self", tensor_arg(l.tensor_in(n, "self"))),
                                       NA("other", float_arg(kPi / 180.0))}, l.out_meta(n)));
}

void frac(L& l, const Node& n) {  // x - trunc(x)
  ValueId x = l.tensor_in(n, "self");
  const TensorMeta m = l.out_meta(n);
  ValueId t = l.emit("aten.trunc.default", {NA("self", tensor_arg(x))}, m, "trunc");
  l.bind(n, l.emit("aten.sub.Tensor", {NA("self", tensor_arg(x)), NA("other", tensor_arg(t))}, m));
}

void glu(L& l, const Node& n) {  // a * sigmoid(b), a and b the halves along dim
  ValueId x = l.tensor_in(n, "self");
  const TensorMeta m = l.out_meta(n);
  std::vector<int64_t> sizes = l.meta_of(x).sizes;
  const int64_t dim = L::wrap_dim(l.int_in(n, "dim", -1), sizes.size());
  const int64_t half = sizes[static_cast<size_t>(dim)] / 2;
  auto parts = l.emit_raw("aten.split_with_sizes_copy.default",
                          {NA("self", tensor_arg(x)), NA("split_sizes", ints_arg({half, half})), NA("dim", int_arg(dim))},
                          {m, m});
  ValueId g = l.emit("aten.sigmoid.default", {NA("self", tensor_arg(parts[1]))}, m, "gate");
  l.bind(n, l.emit("aten.mul.Tensor", {NA("self", tensor_arg(parts[0])), NA("other", tensor_arg(g))}, m));
}

// triu(x, d) = tril(x^T, -d)^T over the last two dims: ExecuTorch's portable library has a tril kernel and no
// triu one, so kiln emits tril only (every value kept as it is, infinities and NaNs included).
void triu(L& l, const Node& n) {
  ValueId x = l.tensor_in(n, "self");
  std::vector<int64_t> dims(l.meta_of(x).sizes.size());
  if (dims.size() < 2) l.unsupported(n, "triu needs a tensor of at least 2 dims");
  std::iota(dims.begin(), dims.end(), 0);
  std::swap(dims[dims.size() - 1], dims[dims.size() - 2]);
  ValueId t = l.permute(x, dims, "transposed");
  ValueId r = l.emit("aten.tril.default", {NA("self", tensor_arg(t)), NA("diagonal", int_arg(-l.int_in(n, "diagonal", 0)))},
                     contiguous(l.meta_of(t)), "tril");
  l.bind(n, l.permute(r, dims));
}

// ---- more losses and shrinks (the module sweep's nn.*Loss, nn.Hardshrink/Softshrink), each in torch's own formula
// (torch/_refs/nn/functional and torch/_decomp) so that rounding follows eager's.

// The broadcast shape of a and b.
std::vector<int64_t> broadcast_sizes(std::vector<int64_t> s, const std::vector<int64_t>& t) {
  if (t.size() > s.size()) s.insert(s.begin(), t.size() - s.size(), 1);
  for (size_t i = 0; i < t.size(); ++i) {
    int64_t& d = s[s.size() - t.size() + i];
    d = d == 1 ? t[i] : d;
  }
  return s;
}

struct Ops {  // small emitters over contiguous float values
  L& l;
  ScalarType dt;
  ValueId un(const char* op, ValueId x, const char* hint) {
    return l.emit(op, {NA("self", tensor_arg(x))}, contiguous(l.meta_of(x)), hint);
  }
  ValueId bin(const char* op, ValueId a, ValueId b, const char* hint) {
    const TensorMeta m = contiguous(dt, broadcast_sizes(l.meta_of(a).sizes, l.meta_of(b).sizes));
    return l.emit(op, {NA("self", tensor_arg(a)), NA("other", tensor_arg(b))}, m, hint);
  }
  ValueId scal(const char* op, ValueId a, double v, const char* hint) {
    return l.emit(op, {NA("self", tensor_arg(a)), NA("other", float_arg(v))}, contiguous(dt, l.meta_of(a).sizes),
                  hint);
  }
  ValueId cmp(const char* op, ValueId a, double v, const char* hint) {
    return l.emit(op, {NA("self", tensor_arg(a)), NA("other", float_arg(v))},
                  contiguous(ScalarType::Bool, l.meta_of(a).sizes), hint);
  }
  ValueId clamp(ValueId a, std::optional<double> lo, std::optional<double> hi, const char* hint) {
    std::vector<NamedArgument> args{NA("self", tensor_arg(a))};
    if (lo) args.push_back(NA("min", float_arg(*lo)));
    if (hi) args.push_back(NA("max", float_arg(*hi)));
    return l.emit("aten.clamp.default", std::move(args), contiguous(l.meta_of(a)), hint);
  }
  ValueId where(ValueId c, ValueId a, ValueId b, const char* hint) {
    const TensorMeta m = contiguous(dt, broadcast_sizes(broadcast_sizes(l.meta_of(c).sizes, l.meta_of(a).sizes),
                                                        l.meta_of(b).sizes));
    return l.emit("aten.where.self", {NA("condition", tensor_arg(c)), NA("self", tensor_arg(a)),
                                      NA("other", tensor_arg(b))}, m, hint);
  }
  ValueId zero() { return l.scalar_tensor(float_arg(0.0), dt); }
  ValueId sum_all(ValueId x, const char* hint) {
    std::vector<int64_t> dims(l.meta_of(x).sizes.size());
    std::iota(dims.begin(), dims.end(), 0);
    return l.emit("aten.sum.dim_IntList", {NA("self", tensor_arg(x)), NA("dim", ints_arg(dims)),
                                           NA("keepdim", bool_arg(false))}, contiguous(l.meta_of(x).dtype, {}), hint);
  }
  ValueId sum_dim(ValueId x, int64_t dim, const char* hint) {
    std::vector<int64_t> s = l.meta_of(x).sizes;
    s.erase(s.begin() + dim);
    return l.emit("aten.sum.dim_IntList", {NA("self", tensor_arg(x)), NA("dim", ints_arg({dim})),
                                           NA("keepdim", bool_arg(false))}, contiguous(l.meta_of(x).dtype, s), hint);
  }
};

Ops ops_of(L& l, const Node& n) { return Ops{l, l.out_meta(n).dtype}; }

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
  ValueId a = l.tensor_in(n, "input1"), b = l.tensor_in(n, "input2");
  ValueId y = l.convert(l.tensor_in(n, "target"), o.dt);
  ValueId e = o.bin("aten.mul.Tensor", o.un("aten.neg.default", y, "neg_y"), o.bin("aten.sub.Tensor", a, b, "diff"),
                    "scaled");
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
  ValueId x = l.tensor_in(n, "input"), t = l.tensor_in(n, "target");
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
  if (l.meta_of(x).sizes.size() == 1) {
    x = l.view(x, {1, l.meta_of(x).sizes[0]});
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
  const bool one = l.meta_of(x).sizes.size() == 1;  // one sample: eager's unreduced loss is 0-d (export says [1])
  if (one) {
    x = l.view(x, {1, l.meta_of(x).sizes[0]});
    t = l.view(t, {1, l.meta_of(t).sizes[0]});
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

// ---- functional forms of in-place operators the in-place sweep found (pow_, rad2deg_, heaviside_, sinc_, sgn_,
// nan_to_num_)

// pow_.Tensor / pow_.Scalar functionalized: aten.pow.Tensor (no such overload: pow.Tensor_Tensor) and aten.pow.Scalar
// with a tensor self (pow.Tensor_Scalar); the real pow.Scalar (a number to a tensor's powers) too.
void pow_by_kinds(L& l, const Node& n) {
  const TensorMeta m = l.out_meta(n);
  const Argument& self = l.arg(n, "self");
  const Argument& e = l.arg(n, "exponent");
  if (self.kind == Argument::Kind::Tensor && e.kind == Argument::Kind::Tensor) {
    l.bind(n, l.emit("aten.pow.Tensor_Tensor", {NA("self", tensor_arg(l.tensor_in(n, "self"))),
                                                NA("exponent", tensor_arg(l.tensor_in(n, "exponent")))}, m));
  } else if (self.kind == Argument::Kind::Tensor) {
    l.bind(n, l.emit("aten.pow.Tensor_Scalar", {NA("self", tensor_arg(l.tensor_in(n, "self"))), NA("exponent", e)}, m));
  } else {
    l.bind(n, l.emit("aten.pow.Tensor_Tensor", {NA("self", tensor_arg(l.scalar_tensor(self, m.dtype))),
                                                NA("exponent", tensor_arg(l.tensor_in(n, "exponent")))}, m));
  }
}

void rad2deg(L& l, const Node& n) {
  constexpr double kPi = 3.14159265358979323846;
  l.bind(n, l.emit("aten.mul.Scalar", {NA("self", tensor_arg(l.tensor_in(n, "self"))),
                                       NA("other", float_arg(180.0 / kPi))}, l.out_meta(n)));
}

void heaviside(L& l, const Node& n) {  // where(x == 0, values, x > 0)
  Ops o = ops_of(l, n);
  ValueId x = l.tensor_in(n, "self");
  ValueId pos = l.convert(o.cmp("aten.gt.Scalar", x, 0.0, "positive"), o.dt);
  l.bind(n, o.where(o.cmp("aten.eq.Scalar", x, 0.0, "zero"), l.convert(l.tensor_in(n, "values"), o.dt), pos,
                    "heaviside"));
}

void sinc(L& l, const Node& n) {  // where(pi x == 0, 1, sin(pi x) / (pi x))
  constexpr double kPi = 3.14159265358979323846;
  Ops o = ops_of(l, n);
  ValueId a = o.scal("aten.mul.Scalar", l.convert(l.tensor_in(n, "self"), o.dt), kPi, "pi_x");
  ValueId q = o.bin("aten.div.Tensor", o.un("aten.sin.default", a, "sin"), a, "ratio");
  l.bind(n, o.where(o.cmp("aten.eq.Scalar", a, 0.0, "zero"), l.scalar_tensor(float_arg(1.0), o.dt), q, "sinc"));
}

void sgn(L& l, const Node& n) {  // of a real tensor: sign
  l.bind(n, l.emit("aten.sign.default", {NA("self", tensor_arg(l.tensor_in(n, "self")))}, l.out_meta(n)));
}

// nan_to_num: NaN -> nan (0), +inf -> posinf (the dtype's max), -inf -> neginf (its lowest); float32 only
void nan_to_num(L& l, const Node& n) {
  Ops o = ops_of(l, n);
  ValueId x = l.tensor_in(n, "self");
  if (o.dt == ScalarType::Long || o.dt == ScalarType::Int || o.dt == ScalarType::Short || o.dt == ScalarType::Char ||
      o.dt == ScalarType::Byte || o.dt == ScalarType::Bool) {
    l.bind(n, x);  // integers and bools have no NaN or infinity
    return;
  }
  if (o.dt != ScalarType::Float) l.unsupported(n, "nan_to_num of a float type other than float32");
  auto value = [&](const char* name, double dflt) {
    const Argument* a = l.opt(n, name);
    return a && a->kind != Argument::Kind::None ? l.number_in(n, name, dflt) : dflt;
  };
  constexpr double kMax = 3.4028234663852886e38;
  const TensorMeta bm = contiguous(ScalarType::Bool, l.meta_of(x).sizes);
  ValueId inf = l.emit("aten.isinf.default", {NA("self", tensor_arg(x))}, bm, "inf");
  ValueId pos = l.emit("aten.logical_and.default", {NA("self", tensor_arg(inf)),
                                                    NA("other", tensor_arg(o.cmp("aten.gt.Scalar", x, 0.0, "gt0")))},
                       bm, "posinf");
  ValueId neg = l.emit("aten.logical_and.default", {NA("self", tensor_arg(inf)),
                                                    NA("other", tensor_arg(o.cmp("aten.lt.Scalar", x, 0.0, "lt0")))},
                       bm, "neginf");
  ValueId nan = l.emit("aten.isnan.default", {NA("self", tensor_arg(x))}, bm, "nan");
  ValueId y = o.where(nan, l.scalar_tensor(float_arg(value("nan", 0.0)), o.dt), x, "no_nan");
  y = o.where(pos, l.scalar_tensor(float_arg(value("posinf", kMax)), o.dt), y, "no_posinf");
  l.bind(n, o.where(neg, l.scalar_tensor(float_arg(value("neginf", -kMax)), o.dt), y, "nan_to_num"));
}

void square(L& l, const Node& n) {  // x * x
  ValueId x = l.tensor_in(n, "self");
  const TensorMeta m = l.out_meta(n);
  x = l.convert(x, m.dtype);
  l.bind(n, l.emit("aten.mul.Tensor", {NA("self", tensor_arg(x)), NA("other", tensor_arg(x))}, m));
}

// lerp as torch computes it: |w| < 0.5 ? self + w (end - self) : end - (end - self) (1 - w)
void lerp(L& l, const Node& n) {
  Ops o = ops_of(l, n);
  ValueId a = l.tensor_in(n, "self"), b = l.tensor_in(n, "end");
  const Argument& wa = l.arg(n, "weight");
  ValueId d = o.bin("aten.sub.Tensor", b, a, "diff");
  if (wa.kind != Argument::Kind::Tensor) {
    const double w = l.number_in(n, "weight", 0.0);
    if (std::abs(w) < 0.5) {
      l.bind(n, o.bin("aten.add.Tensor", a, o.scal("aten.mul.Scalar", d, w, "step"), "lerp"));
    } else {
      l.bind(n, o.bin("aten.sub.Tensor", b, o.scal("aten.mul.Scalar", d, 1.0 - w, "step"), "lerp"));
    }
    return;
  }
  ValueId w = l.tensor_in(n, "weight");
  ValueId lo = o.bin("aten.add.Tensor", a, o.bin("aten.mul.Tensor", w, d, "step_lo"), "lerp_lo");
  ValueId one_minus = l.emit("aten.rsub.Scalar", {NA("self", tensor_arg(w)), NA("other", float_arg(1.0))},
                             contiguous(l.meta_of(w)), "one_minus_w");
  ValueId hi = o.bin("aten.sub.Tensor", b, o.bin("aten.mul.Tensor", d, one_minus, "step_hi"), "lerp_hi");
  ValueId small = o.cmp("aten.lt.Scalar", o.un("aten.abs.default", w, "abs_w"), 0.5, "small");
  l.bind(n, o.where(small, lo, hi, "lerp"));
}

// xlogy(x, y): NaN where y is NaN, else 0 where x == 0, else x log y
void xlogy(L& l, const Node& n) {
  Ops o = ops_of(l, n);
  const Argument& sa = l.arg(n, "self");
  const Argument& oa = l.arg(n, "other");
  ValueId x = sa.kind == Argument::Kind::Tensor ? l.convert(l.tensor_in(n, "self"), o.dt) : l.scalar_tensor(sa, o.dt);
  ValueId y = oa.kind == Argument::Kind::Tensor ? l.convert(l.tensor_in(n, "other"), o.dt) : l.scalar_tensor(oa, o.dt);
  ValueId p = o.bin("aten.mul.Tensor", x, o.un("aten.log.default", y, "log_y"), "x_log_y");
  ValueId z = o.where(o.cmp("aten.eq.Scalar", x, 0.0, "x_zero"), o.zero(), p, "xlogy");
  ValueId nan = l.emit("aten.isnan.default", {NA("self", tensor_arg(y))}, contiguous(ScalarType::Bool, l.meta_of(y).sizes),
                       "y_nan");
  l.bind(n, o.where(nan, y, z, "xlogy"));
}

void logit(L& l, const Node& n) {  // log(x / (1 - x)), x clamped to [eps, 1 - eps] when eps is given
  Ops o = ops_of(l, n);
  ValueId x = l.convert(l.tensor_in(n, "self"), o.dt);
  if (const Argument* e = l.opt(n, "eps"); e && e->kind != Argument::Kind::None) {
    const double eps = l.number_in(n, "eps", 0.0);
    x = o.clamp(x, eps, 1.0 - eps, "clamped");
  }
  ValueId one_minus = l.emit("aten.rsub.Scalar", {NA("self", tensor_arg(x)), NA("other", float_arg(1.0))},
                             contiguous(l.meta_of(x)), "one_minus_x");
  l.bind(n, o.un("aten.log.default", o.bin("aten.div.Tensor", x, one_minus, "odds"), "logit"));
}

// renorm(x, p, dim, maxnorm): each slice along dim whose p-norm exceeds maxnorm scaled by maxnorm / (norm + 1e-7)
void renorm(L& l, const Node& n) {
  Ops o = ops_of(l, n);
  ValueId x = l.tensor_in(n, "self");
  const auto xs = l.meta_of(x).sizes;
  const int64_t dim = L::wrap_dim(l.int_in(n, "dim"), xs.size());
  const double p = l.number_in(n, "p", 2.0), maxnorm = l.number_in(n, "maxnorm", 1.0);
  std::vector<int64_t> dims, kept = xs;
  for (int64_t d = 0; d < static_cast<int64_t>(xs.size()); ++d)
    if (d != dim) {
      dims.push_back(d);
      kept[static_cast<size_t>(d)] = 1;
    }
  ValueId a = o.un("aten.abs.default", x, "abs");
  ValueId pw = p == 2.0 ? o.bin("aten.mul.Tensor", a, a, "pow")
                        : l.emit("aten.pow.Tensor_Scalar", {NA("self", tensor_arg(a)), NA("exponent", float_arg(p))},
                                 contiguous(l.meta_of(a)), "pow");
  ValueId s = l.emit("aten.sum.dim_IntList", {NA("self", tensor_arg(pw)), NA("dim", ints_arg(dims)),
                                              NA("keepdim", bool_arg(true))}, contiguous(o.dt, kept), "sum");
  ValueId norm = p == 2.0 ? o.un("aten.sqrt.default", s, "norm")
                          : l.emit("aten.pow.Tensor_Scalar", {NA("self", tensor_arg(s)), NA("exponent", float_arg(1.0 / p))},
                                   contiguous(o.dt, kept), "norm");
  ValueId factor = l.emit("aten.div.Tensor", {NA("self", tensor_arg(l.scalar_tensor(float_arg(maxnorm), o.dt))),
                                              NA("other", tensor_arg(o.scal("aten.add.Scalar", norm, 1e-7, "norm_eps")))},
                          contiguous(o.dt, kept), "factor");
  factor = o.where(o.cmp("aten.gt.Scalar", norm, maxnorm, "over"), factor, l.scalar_tensor(float_arg(1.0), o.dt), "factor");
  l.bind(n, o.bin("aten.mul.Tensor", x, factor, "renorm"));
}

// alpha_dropout / feature_dropout / feature_alpha_dropout: the identity in eval (train=False) or with p = 0
void eval_dropout(L& l, const Node& n) {
  if (l.int_in(n, "train", 0) != 0 && l.number_in(n, "p", 0.0) != 0.0)
    l.unsupported(n, "dropout in training mode (random output); export the model in eval() mode");
  l.bind(n, l.tensor_in(n, l.opt(n, "input") ? "input" : "self"));  // the in-place form's functional name: self
}

// scatter_reduce 'prod', 'amax', 'amin' without a scatter_reduce kernel (ExecuTorch's portable library has none, its
// runtime cannot load a program with one): densely. Over the index's region R (the index's shape), mask[.., k, .., j]
// = index[.., k, ..] == j for every position j along dim; the source values where the mask holds (the reduction's
// identity elsewhere: 1, -inf, +inf) reduced over k give each position's reduction, moved back to dim; positions
// no index reaches (count 0) keep self, the others get it combined with self when include_self. Costs
// index.numel() x self.size(dim) elements: scatter's tables are small where the default IR has this operator.
void scatter_reduce_dense(L& l, const Node& n, const std::string& reduce) {
  const TensorMeta m = l.out_meta(n);
  ValueId self = l.tensor_in(n, "self"), index = l.tensor_in(n, "index"), src = l.tensor_in(n, "src");
  const size_t rank = m.sizes.size();
  auto is = l.meta_of(index).sizes;
  if (rank == 0 || is.size() != rank || l.meta_of(src).sizes.size() != rank)
    l.unsupported(n, "scatter_reduce of a 0-d tensor or with an index of another rank");
  const int64_t dim = L::wrap_dim(l.int_in(n, "dim"), rank);
  const auto d = static_cast<size_t>(dim);
  const int64_t Sd = m.sizes[d];
  const bool include_self = l.int_in(n, "include_self", 1) != 0;
  const bool floating = m.dtype == ScalarType::Float || m.dtype == ScalarType::Double || m.dtype == ScalarType::Half ||
                        m.dtype == ScalarType::BFloat16;
  if (!floating && m.dtype != ScalarType::Long && m.dtype != ScalarType::Int)
    l.unsupported(n, "scatter_reduce 'prod'/'amax'/'amin' of a tensor that is neither floating point, int32 nor int64");
  for (int64_t s : is)
    if (s == 0) {  // no index: self
      l.bind(n, self);
      return;
    }
  // the source's values in the index's region
  ValueId sv = src;
  for (size_t i = 0; i < rank; ++i)
    if (l.meta_of(sv).sizes[i] != is[i]) {
      auto sizes = l.meta_of(sv).sizes;
      sizes[i] = is[i];
      sv = l.emit("aten.slice_copy.Tensor", {NA("self", tensor_arg(sv)), NA("dim", int_arg(static_cast<int64_t>(i))),
                                             NA("start", int_arg(0)), NA("end", int_arg(is[i])), NA("step", int_arg(1))},
                  contiguous(m.dtype, sizes), "src_region");
    }
  std::vector<int64_t> ext = is;
  ext.push_back(1);
  std::vector<int64_t> full = is;
  full.push_back(Sd);
  std::vector<int64_t> positions(static_cast<size_t>(Sd));
  std::iota(positions.begin(), positions.end(), 0);
  std::vector<std::byte> bytes(positions.size() * sizeof(int64_t));
  std::memcpy(bytes.data(), positions.data(), bytes.size());
  ValueId j = l.constant_tensor(ScalarType::Long, {Sd}, std::move(bytes), "scatter_positions");
  ValueId idx = l.convert(index, ScalarType::Long);
  ValueId mask = l.emit("aten.eq.Tensor", {NA("self", tensor_arg(l.view(idx, ext))), NA("other", tensor_arg(j))},
                        contiguous(ScalarType::Bool, full), "scatter_mask");
  Argument identity = float_arg(1.0);
  if (reduce != "prod") {
    const bool lo = reduce == "amax";
    if (floating) identity = float_arg(lo ? -INFINITY : INFINITY);
    else if (m.dtype == ScalarType::Int)
      identity = int_arg(lo ? std::numeric_limits<int32_t>::min() : std::numeric_limits<int32_t>::max());
    else identity = int_arg(lo ? std::numeric_limits<int64_t>::min() : std::numeric_limits<int64_t>::max());
  }
  Ops o{l, m.dtype};
  ValueId vals = o.where(mask, l.view(sv, ext), l.scalar_tensor(identity, m.dtype), "scatter_values");
  std::vector<int64_t> reduced = full;  // without dim
  reduced.erase(reduced.begin() + dim);
  ValueId red;
  if (reduce == "prod")
    red = l.emit("aten.prod.dim_int", {NA("self", tensor_arg(vals)), NA("dim", int_arg(dim)), NA("keepdim", bool_arg(false)),
                                       NA("dtype", Argument::none())}, contiguous(m.dtype, reduced), "scatter_prod");
  else
    red = l.emit(reduce == "amax" ? "aten.amax.default" : "aten.amin.default",
                 {NA("self", tensor_arg(vals)), NA("dim", ints_arg({dim})), NA("keepdim", bool_arg(false))},
                 contiguous(m.dtype, reduced), "scatter_extreme");
  Ops of{l, ScalarType::Float};
  ValueId hits = of.where(mask, l.scalar_tensor(float_arg(1.0), ScalarType::Float), of.zero(), "scatter_hits");
  ValueId count = l.emit("aten.sum.dim_IntList", {NA("self", tensor_arg(hits)), NA("dim", ints_arg({dim})),
                                                  NA("keepdim", bool_arg(false)), NA("dtype", Argument::none())},
                         contiguous(ScalarType::Float, reduced), "scatter_count");
  // the last axis (positions along dim) back to dim: sizes = the index's with dim's = self's
  std::vector<int64_t> order;
  for (int64_t i = 0; i < dim; ++i) order.push_back(i);
  order.push_back(static_cast<int64_t>(rank) - 1);
  for (int64_t i = dim; i + 1 < static_cast<int64_t>(rank); ++i) order.push_back(i);
  red = l.permute(red, order, "scatter_reduced");
  count = l.permute(count, order, "scatter_count");
  std::vector<int64_t> region = is;
  region[d] = Sd;
  ValueId self_r = self;
  for (size_t i = 0; i < rank; ++i)
    if (l.meta_of(self_r).sizes[i] != region[i]) {
      auto sizes = l.meta_of(self_r).sizes;
      sizes[i] = region[i];
      self_r = l.emit("aten.slice_copy.Tensor", {NA("self", tensor_arg(self_r)), NA("dim", int_arg(static_cast<int64_t>(i))),
                                                 NA("start", int_arg(0)), NA("end", int_arg(region[i])), NA("step", int_arg(1))},
                      contiguous(m.dtype, sizes), "self_region");
    }
  if (include_self)
    red = o.bin(reduce == "prod" ? "aten.mul.Tensor" : reduce == "amax" ? "aten.maximum.default" : "aten.minimum.default",
                self_r, red, "scatter_with_self");
  if (region != m.sizes) {  // the region's values and counts padded to self's shape (count 0: self stays)
    std::vector<int64_t> pad;
    for (size_t i = rank; i-- > 0;) {
      pad.push_back(0);
      pad.push_back(m.sizes[i] - region[i]);
    }
    red = l.emit("aten.constant_pad_nd.default", {NA("self", tensor_arg(red)), NA("pad", ints_arg(pad)),
                                                  NA("value", float_arg(0.0))}, contiguous(m.dtype, m.sizes), "scatter_pad");
    count = l.emit("aten.constant_pad_nd.default", {NA("self", tensor_arg(count)), NA("pad", ints_arg(pad)),
                                                    NA("value", float_arg(0.0))},
                   contiguous(ScalarType::Float, m.sizes), "scatter_pad");
  }
  l.bind(n, o.where(of.cmp("aten.gt.Scalar", count, 0.0, "scatter_reached"), red, self, "scatter_reduce"));
}

// scatter_reduce 'sum' and 'mean' by scatter_add, which ExecuTorch's portable library has (it has no scatter_reduce):
// the positions no index reaches keep self; include_self=False restarts the reached ones from 0; 'mean' divides by
// the count of values each position got (plus one for self when include_self). prod/amax/amin: densely, above.
void scatter_reduce(L& l, const Node& n) {
  const TensorMeta m = l.out_meta(n);
  const Argument& r = l.arg(n, "reduce");
  const std::string reduce = r.kind == Argument::Kind::String ? std::get<std::string>(r.payload) : "";
  if (reduce == "prod" || reduce == "amax" || reduce == "amin") {
    scatter_reduce_dense(l, n, reduce);
    return;
  }
  if (reduce != "sum" && reduce != "mean") l.unsupported(n, fmt::format("scatter_reduce '{}'", reduce));
  if (reduce == "mean" && m.dtype != ScalarType::Float) l.unsupported(n, "scatter_reduce 'mean' of a non-float32 tensor");
  Ops o{l, m.dtype};
  ValueId self = l.tensor_in(n, "self"), index = l.tensor_in(n, "index"), src = l.tensor_in(n, "src");
  const int64_t dim = L::wrap_dim(l.int_in(n, "dim"), m.sizes.size());
  const bool include_self = l.int_in(n, "include_self", 1) != 0;
  auto scatter_add = [&](ValueId base, ValueId values, const char* hint) {
    return l.emit("aten.scatter_add.default", {NA("self", tensor_arg(base)), NA("dim", int_arg(dim)),
                                                NA("index", tensor_arg(index)), NA("src", tensor_arg(values))}, m, hint);
  };
  auto full = [&](const std::vector<int64_t>& sizes, int64_t v, const char* hint) {
    return l.emit("aten.full.default", {NA("size", ints_arg(sizes)), NA("fill_value", int_arg(v))},
                  contiguous(m.dtype, sizes), hint);
  };
  ValueId count = self;  // (replaced below whenever it is read)
  const bool need_count = reduce == "mean" || !include_self;
  if (need_count)
    count = scatter_add(full(m.sizes, 0, "zeros"), full(l.meta_of(index).sizes, 1, "ones"), "count");
  ValueId base = self;
  if (!include_self)  // reached positions start from 0
    base = o.where(o.cmp("aten.gt.Scalar", count, 0.0, "reached"), o.zero(), self, "base");
  ValueId sum = scatter_add(base, src, "sum");
  if (reduce == "sum") {
    l.bind(n, sum);
    return;
  }
  ValueId total = include_self ? o.scal("aten.add.Scalar", count, 1.0, "count_self") : count;
  ValueId mean = o.bin("aten.div.Tensor", sum, total, "mean");
  l.bind(n, o.where(o.cmp("aten.eq.Scalar", count, 0.0, "untouched"), self, mean, "scatter_mean"));
}

// exp2(x) = pow(2, x): ExecuTorch's portable library has no exp2 kernel (its runtime cannot load a program with it)
void exp2(L& l, const Node& n) {
  const TensorMeta m = l.out_meta(n);
  ValueId x = l.convert(l.tensor_in(n, "self"), m.dtype);
  l.bind(n, l.emit("aten.pow.Tensor_Tensor", {NA("self", tensor_arg(l.scalar_tensor(float_arg(2.0), m.dtype))),
                                              NA("exponent", tensor_arg(x))}, m));
}

// 3-D pooling as two 2-D poolings (ExecuTorch's portable library has no 3-D pooling kernel, its runtime cannot
// load a program with one): a box window is separable. Over x viewed [B, 1, D, H*W], the 2-D operator with
// window (kd, 1) pools the depth; over that viewed [B, Do, H, W], window (kh, kw) pools the plane. Max of maxes
// is the max; an average's divisor is the product of its per-dimension counts (the window's extent clipped to
// the padded input, or to the input when count_include_pad is false, the adaptive window's length), so the
// average of averages is the average; divisor_override: a sum over depth (divisor 1), then the override.
// max_pool3d's indices: the depth pass's flat index over (D, H*W) is already the 3-D flat index
// d*H*W + h*W + w; the plane pass picks which of them, gathered at its own indices.
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
    TensorMeta di = depth_m, pi = plane_m;
    di.dtype = pi.dtype = ScalarType::Long;
    auto depth = l.emit_raw("aten.max_pool2d_with_indices.default",
                            {NA("self", tensor_arg(xd)), NA("kernel_size", ints_arg({k[0], 1})),
                             NA("stride", ints_arg({stride[0], 1})), NA("padding", ints_arg({pad[0], 0})),
                             NA("dilation", ints_arg({dil[0], 1})), NA("ceil_mode", bool_arg(ceil))},
                            {depth_m, di}, "pool_depth");
    auto plane = l.emit_raw("aten.max_pool2d_with_indices.default",
                            {NA("self", tensor_arg(l.view(depth[0], {B, Do, H, W}))),
                             NA("kernel_size", ints_arg({k[1], k[2]})), NA("stride", ints_arg({stride[1], stride[2]})),
                             NA("padding", ints_arg({pad[1], pad[2]})), NA("dilation", ints_arg({dil[1], dil[2]})),
                             NA("ceil_mode", bool_arg(ceil))},
                            {plane_m, pi}, "pool_plane");
    l.bind(n, l.view(plane[0], m.sizes));
    if (indices) {
      TensorMeta im = contiguous(ScalarType::Long, {B, Do, Ho * Wo});
      ValueId idx = l.emit("aten.gather.default",
                           {NA("self", tensor_arg(l.view(depth[1], {B, Do, H * W}))), NA("dim", int_arg(2)),
                            NA("index", tensor_arg(l.view(plane[1], {B, Do, Ho * Wo}))),
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
  l.bind(n, l.view(y, m.sizes));
}

struct Decomposition {
  std::string_view target;
  void (*rewrite)(L&, const Node&);
};

// The table: operator -> its rewrite into operators kiln has.
constexpr Decomposition kDecompositions[] = {
    {"aten.chunk.default", pieces},
    {"aten.tensor_split.sections", pieces},
    {"aten.tensor_split.indices", pieces},
    {"aten.unsafe_split.Tensor", pieces},
    {"aten.unsafe_chunk.default", pieces},
    {"aten.unbind.int", unbind},
    {"aten.unbind_copy.int", unbind},
    {"aten.repeat_interleave.self_int", repeat_interleave_int},
    {"aten.repeat_interleave.self_Tensor", repeat_interleave_tensor},
    {"aten._weight_norm.default", weight_norm},
    {"aten.zero.default", zero},
    {"aten.empty_like.default", zero},  // (an out= target, written before it is read: zeros are as good)
    {"aten.empty.memory_format", zero},
    {"aten.fill.Tensor", fill_tensor},
    {"aten.silu.default", silu},
    {"aten.rsub.Tensor", rsub_tensor},
    {"aten.baddbmm.default", baddbmm},
    {"aten.addbmm.default", addbmm},
    {"aten.addmv.default", addmv},
    {"aten.addr.default", addr},
    {"aten.numpy_T.default", reverse_dims},
    {"aten.mT.default", swap_last_two},
    {"aten.adjoint.default", swap_last_two},
    {"aten.histc.default", histc},
    {"aten.stack.default", stack},
    {"aten.broadcast_tensors.default", broadcast_tensors},
    {"aten.conj_physical.default", conj_physical},
    {"aten.true_divide.Tensor", true_divide},
    {"aten.floor_divide.Tensor", floor_divide},
    {"aten.deg2rad.default", deg2rad},
    {"aten.frac.default", frac},
    {"aten.glu.default", glu},
    {"aten.triu.default", triu},
    {"aten.l1_loss.default", l1_loss},
    {"aten.mse_loss.default", mse_loss},
    {"aten.smooth_l1_loss.default", smooth_l1_loss},
    {"aten.huber_loss.default", huber_loss},
    {"aten.kl_div.default", kl_div},
    {"aten.margin_ranking_loss.default", margin_ranking_loss},
    {"aten.soft_margin_loss.default", soft_margin_loss},
    {"aten.binary_cross_entropy.default", binary_cross_entropy},
    {"aten.binary_cross_entropy_with_logits.default", binary_cross_entropy_with_logits},
    {"aten.poisson_nll_loss.default", poisson_nll_loss},
    {"aten.nll_loss_nd.default", nll_loss},
    {"aten.nll_loss.default", nll_loss},
    {"aten.nll_loss2d.default", nll_loss},
    {"aten.cross_entropy_loss.default", cross_entropy_loss},
    {"aten.multi_margin_loss.default", multi_margin_loss},
    {"aten.multilabel_margin_loss.default", multilabel_margin_loss},
    {"aten.threshold.default", threshold},
    {"aten.hinge_embedding_loss.default", hinge_embedding_loss},
    {"aten.cosine_embedding_loss.default", cosine_embedding_loss},
    {"aten.rnn_tanh_cell.default", rnn_tanh_cell},
    {"aten.rnn_relu_cell.default", rnn_relu_cell},
    {"aten.gru_cell.default", gru_cell},
    {"aten.lstm_cell.default", lstm_cell},
    {"aten.pow.Tensor", pow_by_kinds},
    {"aten.pow.Scalar", pow_by_kinds},
    {"aten.rad2deg.default", rad2deg},
    {"aten.heaviside.default", heaviside},
    {"aten.sinc.default", sinc},
    {"aten.sgn.default", sgn},
    {"aten.nan_to_num.default", nan_to_num},
    {"aten.square.default", square},
    {"aten.lerp.Scalar", lerp},
    {"aten.lerp.Tensor", lerp},
    {"aten.xlogy.Tensor", xlogy},
    {"aten.xlogy.Scalar_Self", xlogy},
    {"aten.xlogy.Scalar_Other", xlogy},
    {"aten.logit.default", logit},
    {"aten.renorm.default", renorm},
    {"aten.alpha_dropout.default", eval_dropout},
    {"aten.feature_dropout.default", eval_dropout},
    {"aten.feature_alpha_dropout.default", eval_dropout},
    {"aten.scatter_reduce.two", scatter_reduce},
    {"aten.exp2.default", exp2},
    {"aten.hardshrink.default", hardshrink},
    {"aten.softshrink.default", softshrink},
    {"aten.addcmul.default", addcmul},
    {"aten.addcdiv.default", addcdiv},
    {"aten.hstack.default", hstack},
    {"aten.vstack.default", vstack},
    {"aten.row_stack.default", vstack},
    {"aten.dstack.default", dstack},
    {"aten.avg_pool3d.default", pool3d},
    {"aten.max_pool3d.default", pool3d},
    {"aten.max_pool3d_with_indices.default", pool3d},
    {"aten.adaptive_avg_pool3d.default", pool3d},
    {"aten._adaptive_avg_pool3d.default", pool3d},
    {"aten.adaptive_max_pool3d.default", pool3d},
    {"transformers.grouped_mm_fallback.default", grouped_mm},
};

}  // namespace

bool Lowerer::lower_decomposition(const Node& n) {
  for (const auto& d : kDecompositions)
    if (d.target == n.target) {
      d.rewrite(*this, n);
      return true;
    }
  return false;
}

}  // namespace kiln::passes::detail
