// Decompositions as data: one table, keyed by operator target, of rewrites of a
// (non-core) operator into operators kiln already has. Lowerer::lower consults
// it by the node's target before its families; the functional variants that
// functionalization (functionalize.cpp) produces and the op table lacks
// (aten.zero, aten.fill.Tensor) live here too.
//
// A new decomposition is one function below and one row in kDecompositions.
#include "lowerer.h"

#include <cstring>

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
