// Decompositions as data: one table, keyed by operator target, of rewrites of a
// (non-core) operator into operators kiln already has. Lowerer::lower consults
// it by the node's target before its families; the functional variants that
// functionalization (functionalize.cpp) produces and the op table lacks
// (aten.zero, aten.fill.Tensor) live here too.
//
// A new decomposition is one function below (an nn module's formula: in decompositions_nn.cpp, declared in
// decompositions.h) and one row in kDecompositions.
#include "decompositions.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>

namespace kiln::passes::detail {
namespace decomp {

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

}  // namespace decomp

namespace {

using namespace decomp;

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

// The permutation of x's dims that swaps its last two (unsupported, as `need` says, below two dims).
std::vector<int64_t> last_two_swapped(L& l, const Node& n, ValueId x, const char* need) {
  std::vector<int64_t> dims(l.meta_of(x).sizes.size());
  if (dims.size() < 2) l.unsupported(n, need);
  std::iota(dims.begin(), dims.end(), 0);
  std::swap(dims[dims.size() - 1], dims[dims.size() - 2]);
  return dims;
}

void swap_last_two(L& l, const Node& n) {
  ValueId x = l.tensor_in(n, "self");
  l.bind(n, l.permute(x, last_two_swapped(l, n, x, "needs a tensor of at least 2 dims")));
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
  const std::vector<int64_t> dims = last_two_swapped(l, n, x, "triu needs a tensor of at least 2 dims");
  ValueId t = l.permute(x, dims, "transposed");
  ValueId r = l.emit("aten.tril.default", {NA("self", tensor_arg(t)), NA("diagonal", int_arg(-l.int_in(n, "diagonal", 0)))},
                     contiguous(l.meta_of(t)), "tril");
  l.bind(n, l.permute(r, dims));
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

// nan_to_num: NaN -> nan (0), +inf -> posinf (the dtype's max), -inf -> neginf (its lowest); every float type
void nan_to_num(L& l, const Node& n) {
  Ops o = ops_of(l, n);
  ValueId x = l.tensor_in(n, "self");
  if (o.dt == ScalarType::Long || o.dt == ScalarType::Int || o.dt == ScalarType::Short || o.dt == ScalarType::Char ||
      o.dt == ScalarType::Byte || o.dt == ScalarType::Bool) {
    l.bind(n, x);  // integers and bools have no NaN or infinity
    return;
  }
  if (!is_float(o.dt)) l.unsupported(n, "nan_to_num of a tensor that is neither floating point, an integer nor bool");
  auto value = [&](const char* name, double dflt) {
    const Argument* a = l.opt(n, name);
    return a && a->kind != Argument::Kind::None ? l.number_in(n, name, dflt) : dflt;
  };
  // the dtype's largest finite value
  const double kMax = o.dt == ScalarType::Half       ? 65504.0
                      : o.dt == ScalarType::BFloat16 ? 3.3895313892515355e38
                      : o.dt == ScalarType::Double   ? std::numeric_limits<double>::max()
                                                     : 3.4028234663852886e38;
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
  ValueId norm;  // p = inf: the largest |x| of each slice
  if (std::isinf(p)) {
    norm = l.emit("aten.amax.default", {NA("self", tensor_arg(a)), NA("dim", ints_arg(dims)), NA("keepdim", bool_arg(true))},
                  contiguous(o.dt, kept), "norm");
  } else {
    ValueId pw = p == 2.0 ? o.bin("aten.mul.Tensor", a, a, "pow")
                          : l.emit("aten.pow.Tensor_Scalar", {NA("self", tensor_arg(a)), NA("exponent", float_arg(p))},
                                   contiguous(l.meta_of(a)), "pow");
    ValueId s = l.emit("aten.sum.dim_IntList", {NA("self", tensor_arg(pw)), NA("dim", ints_arg(dims)),
                                                NA("keepdim", bool_arg(true))}, contiguous(o.dt, kept), "sum");
    norm = p == 2.0 ? o.un("aten.sqrt.default", s, "norm")
                    : l.emit("aten.pow.Tensor_Scalar", {NA("self", tensor_arg(s)), NA("exponent", float_arg(1.0 / p))},
                             contiguous(o.dt, kept), "norm");
  }
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

// `v` (of dtype `dt`) cut to its first sizes[i] elements along every dim i where it is longer: slices named `hint`.
ValueId leading_region(L& l, ValueId v, const std::vector<int64_t>& sizes, ScalarType dt, const char* hint) {
  for (size_t i = 0; i < sizes.size(); ++i)
    if (l.meta_of(v).sizes[i] != sizes[i]) {
      auto cut = l.meta_of(v).sizes;
      cut[i] = sizes[i];
      v = l.emit("aten.slice_copy.Tensor", {NA("self", tensor_arg(v)), NA("dim", int_arg(static_cast<int64_t>(i))),
                                            NA("start", int_arg(0)), NA("end", int_arg(sizes[i])), NA("step", int_arg(1))},
                 contiguous(dt, cut), hint);
    }
  return v;
}

// scatter_reduce 'prod', 'amax', 'amin' without a scatter_reduce kernel (ExecuTorch's portable library has none, its
// runtime cannot load a program with one): densely. Over the index's region R (the index's shape), mask[.., k, .., j]
// = index[.., k, ..] == j for every position j along dim; the source values where the mask holds (the reduction's
// identity elsewhere: 1, -inf, +inf) reduced over k give each position's reduction, moved back to dim; positions
// no index reaches (count 0) keep self, the others get it combined with self when include_self. Costs
// index.numel() x self.size(dim) elements: scatter's tables are small where the default IR has this operator.
void scatter_reduce_dense(L& l, const Node& n, const std::string& reduce) {
  TensorMeta m = l.out_meta(n);
  ValueId self = l.tensor_in(n, "self"), index = l.tensor_in(n, "index"), src = l.tensor_in(n, "src");
  // bool: as int32 0/1, where prod and amin are "and", amax "or" (torch's bool semantics); uint8, int8, int16: as
  // int32, whose extremes are theirs and whose product wraps to theirs (congruent modulo 2^8 or 2^16) when cast
  // back at the end
  const ScalarType narrow = m.dtype;
  const bool widen = narrow == ScalarType::Bool || narrow == ScalarType::Byte || narrow == ScalarType::Char ||
                     narrow == ScalarType::Short;
  if (widen) {
    m.dtype = ScalarType::Int;
    self = l.convert(self, ScalarType::Int);
    src = l.convert(src, ScalarType::Int);
  }
  auto result = [&](ValueId v) { return widen ? l.convert(v, narrow) : v; };
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
    l.unsupported(n, "scatter_reduce 'prod'/'amax'/'amin' of a tensor that is neither floating point, an integer nor bool");
  for (int64_t s : is)
    if (s == 0) {  // no index: self
      l.bind(n, result(self));
      return;
    }
  // the source's values in the index's region
  const ValueId sv = leading_region(l, src, is, m.dtype, "src_region");
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
  const ValueId self_r = leading_region(l, self, region, m.dtype, "self_region");
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
  l.bind(n, result(o.where(of.cmp("aten.gt.Scalar", count, 0.0, "scatter_reached"), red, self, "scatter_reduce")));
}

// scatter_reduce 'sum' and 'mean' by scatter_add, which ExecuTorch's portable library has (it has no scatter_reduce):
// the positions no index reaches keep self; include_self=False restarts the reached ones from 0; 'mean' divides by
// the count of values each position got (plus one for self when include_self). prod/amax/amin: densely, above.
void scatter_reduce(L& l, const Node& n) {
  const TensorMeta out = l.out_meta(n);
  const Argument& r = l.arg(n, "reduce");
  const std::string reduce = r.kind == Argument::Kind::String ? std::get<std::string>(r.payload) : "";
  if (reduce == "prod" || reduce == "amax" || reduce == "amin") {
    scatter_reduce_dense(l, n, reduce);
    return;
  }
  if (reduce != "sum" && reduce != "mean") l.unsupported(n, fmt::format("scatter_reduce '{}'", reduce));
  // 'mean' of float16 / bfloat16: summed, counted and divided in float32, rounded once
  const bool wide = reduce == "mean" && (out.dtype == ScalarType::Half || out.dtype == ScalarType::BFloat16);
  // 'mean' of integers: the sum divided by the count rounding down, as eager's
  const bool integral = out.dtype == ScalarType::Long || out.dtype == ScalarType::Int || out.dtype == ScalarType::Short ||
                        out.dtype == ScalarType::Char || out.dtype == ScalarType::Byte;
  if (reduce == "mean" && out.dtype != ScalarType::Float && out.dtype != ScalarType::Double && !wide && !integral)
    l.unsupported(n, "scatter_reduce 'mean' of a tensor that is neither floating point nor an integer");
  TensorMeta m = out;
  if (wide) m.dtype = ScalarType::Float;
  Ops o{l, m.dtype};
  ValueId self = l.convert(l.tensor_in(n, "self"), m.dtype), index = l.tensor_in(n, "index");
  ValueId src = l.convert(l.tensor_in(n, "src"), m.dtype);
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
  ValueId total = !include_self ? count
                 : integral ? l.emit("aten.add.Scalar", {NA("self", tensor_arg(count)), NA("other", int_arg(1))},
                                     contiguous(m.dtype, m.sizes), "count_self")
                            : o.scal("aten.add.Scalar", count, 1.0, "count_self");
  if (integral)  // positions no index reaches (count 0, self kept below) divide by 1: an integer division by 0 traps
    total = l.emit("aten.clamp.default", {NA("self", tensor_arg(total)), NA("min", int_arg(1))},
                   contiguous(m.dtype, m.sizes), "count_nonzero");
  ValueId mean = integral ? l.emit("aten.div.Tensor_mode", {NA("self", tensor_arg(sum)), NA("other", tensor_arg(total)),
                                                          NA("rounding_mode", {Argument::Kind::String, std::string("floor")})},
                                   contiguous(m.dtype, m.sizes), "mean")
                          : o.bin("aten.div.Tensor", sum, total, "mean");
  l.bind(n, l.convert(o.where(o.cmp("aten.eq.Scalar", count, 0.0, "untouched"), self, mean, "scatter_mean"), out.dtype));
}

// exp2(x) = pow(2, x): ExecuTorch's portable library has no exp2 kernel (its runtime cannot load a program with it)
void exp2(L& l, const Node& n) {
  const TensorMeta m = l.out_meta(n);
  ValueId x = l.convert(l.tensor_in(n, "self"), m.dtype);
  l.bind(n, l.emit("aten.pow.Tensor_Tensor", {NA("self", tensor_arg(l.scalar_tensor(float_arg(2.0), m.dtype))),
                                              NA("exponent", tensor_arg(x))}, m));
}

// remainder (Python's: the sign of the divisor). Of integers: a - b * floor(a / b), exact modulo 2^64, because
// ExecuTorch's integer remainder kernel is C's (-8 % 6 gives -2 in its runtime, 4 in eager's and kiln's); its floor
// division is right. Floating point: the operator itself, a scalar operand as a 0-d tensor.
void remainder(L& l, const Node& n) {
  const TensorMeta m = l.out_meta(n);
  auto operand = [&](const char* name) {
    const Argument& a = l.arg(n, name);
    return a.kind == Argument::Kind::Tensor ? l.convert(l.tensor_in(n, name), m.dtype) : l.scalar_tensor(a, m.dtype);
  };
  const ValueId a = operand("self"), b = operand("other");
  const bool integral = m.dtype == ScalarType::Long || m.dtype == ScalarType::Int || m.dtype == ScalarType::Short ||
                        m.dtype == ScalarType::Char || m.dtype == ScalarType::Byte;
  if (!integral) {
    l.bind(n, l.emit("aten.remainder.Tensor", {NA("self", tensor_arg(a)), NA("other", tensor_arg(b))}, m));
    return;
  }
  const TensorMeta cm = contiguous(m.dtype, m.sizes);
  ValueId q = l.emit("aten.div.Tensor_mode", {NA("self", tensor_arg(a)), NA("other", tensor_arg(b)),
                                              NA("rounding_mode", {Argument::Kind::String, std::string("floor")})},
                     cm, "floor_quotient");
  ValueId p = l.emit("aten.mul.Tensor", {NA("self", tensor_arg(q)), NA("other", tensor_arg(b))}, cm, "multiple");
  l.bind(n, l.emit("aten.sub.Tensor", {NA("self", tensor_arg(a)), NA("other", tensor_arg(p))}, m, "remainder"));
}

struct Decomposition {
  std::string_view target;
  void (*rewrite)(L&, const Node&);
};

// The table: operator -> its rewrite into operators kiln has.
constexpr Decomposition kDecompositions[] = {
    {"aten.remainder.Tensor", remainder},
    {"aten.remainder.Scalar", remainder},
    {"aten.remainder.Scalar_Tensor", remainder},
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
  if (auto rewrite = opdb_rewrite(n.target)) {  // the table's rows for the whole-op_db sweep's operators
    rewrite(*this, n);
    return true;
  }
  return false;
}

}  // namespace kiln::passes::detail
