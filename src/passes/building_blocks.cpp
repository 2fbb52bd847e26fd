// The to-edge lowerer's building blocks (lowerer.h): views, permutes,
// conversions, and matrix products (batched, grouped-query, tied weights).
#include "lowerer.h"

#include <algorithm>
#include <functional>
#include <numeric>

namespace kiln::passes::detail {

ValueId Lowerer::view(ValueId x, std::vector<int64_t> sizes) {
  const auto& m = meta_of(x);
  if (m.sizes == sizes) return x;
  TensorMeta meta = contiguous(m.dtype, sizes);
  return emit("aten.view_copy.default", {NA("self", tensor_arg(x)), NA("size", ints_arg(sizes))}, meta, "view");
}

ValueId Lowerer::permute(ValueId x, std::vector<int64_t> dims, std::string_view hint) {
  const auto& m = meta_of(x);
  std::vector<int64_t> sizes;
  bool identity = true;
  for (size_t i = 0; i < dims.size(); ++i) {
    dims[i] = wrap_dim(dims[i], m.sizes.size());  // permute(x, (0, -1, 1)): dims count from the end too
    check(dims[i] >= 0 && dims[i] < static_cast<int64_t>(m.sizes.size()),
          "permute: dim {} is out of range for a rank-{} tensor", dims[i], m.sizes.size());
    sizes.push_back(m.sizes[static_cast<size_t>(dims[i])]);
    identity = identity && dims[i] == static_cast<int64_t>(i);
  }
  if (identity) return x;
  ValueId y = emit("aten.permute_copy.default", {NA("self", tensor_arg(x)), NA("dims", ints_arg(dims))},
                   contiguous(m.dtype, sizes), hint);
  if (dims.size() == 2 && is_shared_weight(x)) transpose_of_shared_[y] = x;
  return y;
}

ValueId Lowerer::matmul_shared_transposed(ValueId x, ValueId w, std::optional<ValueId> bias, const TensorMeta& m) {
  const auto& xm = meta_of(x);
  int64_t rows = xm.sizes.at(0), out_features = meta_of(w).sizes.at(0);
  ValueId xt = permute(x, {1, 0}, "x_t");
  ValueId yt = emit("aten.mm.default", {NA("self", tensor_arg(w)), NA("mat2", tensor_arg(xt))},
                    contiguous(m.dtype, {out_features, rows}), "mm_t");
  ValueId y = permute(yt, {1, 0}, "y");
  if (bias) y = emit("aten.add.Tensor", {NA("self", tensor_arg(y)), NA("other", tensor_arg(*bias))}, m, "bias");
  return y;
}

ValueId Lowerer::expand(ValueId x, const std::vector<int64_t>& sizes) {
  const auto& m = meta_of(x);
  if (m.sizes == sizes) return x;
  return emit("aten.expand_copy.default", {NA("self", tensor_arg(x)), NA("size", ints_arg(sizes))},
              contiguous(m.dtype, sizes), "expand");
}

ValueId Lowerer::convert(ValueId x, ScalarType dtype) {
  const auto& m = meta_of(x);
  if (m.dtype == dtype) return x;
  std::vector<int64_t> order(m.sizes.size());
  std::iota(order.begin(), order.end(), 0);
  return emit("dim_order_ops._to_dim_order_copy.default",
              {NA("self", tensor_arg(x)), NA("non_blocking", bool_arg(false)), NA("dim_order", ints_arg(order))},
              contiguous(dtype, m.sizes), "to");
}

ValueId Lowerer::scalar_tensor(const Argument& scalar, ScalarType dtype) {
  return emit("aten.scalar_tensor.default", {NA("s", scalar)}, contiguous(dtype, {}), "scalar");
}

bool Lowerer::is_shared_weight(ValueId v) {
  auto c = out_.constants.find(v);
  if (c == out_.constants.end() || c->second.source == nullptr) return false;
  return storage_uses_[storage_key(*c->second.source)] > 1;
}

ValueId Lowerer::transposed_weight(ValueId w) {
  auto c = out_.constants.find(w);
  force_fold_ = options_.fold_weight_transposes && c != out_.constants.end() && c->second.source != nullptr &&
                !is_shared_weight(w);
  // A quantized weight stays W: the payload builder finds it under the transpose and uses its int4/int8 form.
  const bool keep = no_fold_;
  if (c != out_.constants.end() && c->second.quantized) no_fold_ = true;
  ValueId t = permute(w, {1, 0}, "weight_t");
  no_fold_ = keep;
  force_fold_ = false;
  return t;
}

ValueId Lowerer::matmul(const Node& n, ValueId a, ValueId b, const TensorMeta& m) {
  const auto& am = meta_of(a);
  const auto& bm = meta_of(b);
  size_t ra = am.sizes.size(), rb = bm.sizes.size();
  if (ra == 0 || rb == 0) unsupported(n, "matmul of a 0-d tensor");
  if (ra == 1 || rb == 1) {
    // torch's rule: a 1-D left operand is a row [1, K], a 1-D right one a column [K, 1]; the
    // product's added dim is dropped again (1-D by 1-D: a dot product, 0-d)
    std::vector<int64_t> sizes = m.sizes;
    if (ra == 1) sizes.insert(sizes.end() - (rb == 1 ? 0 : 1), 1);
    if (rb == 1) sizes.push_back(1);
    const int64_t ka = am.sizes[0], kb = bm.sizes[0];  // (view() adds values: am, bm would dangle)
    ValueId a2 = ra == 1 ? view(a, {1, ka}) : a;
    ValueId b2 = rb == 1 ? view(b, {kb, 1}) : b;
    ValueId y = matmul(n, a2, b2, contiguous(m.dtype, sizes));
    if (const Node* v = produced_by(y, "aten.view_copy.default")) y = std::get<ValueId>(v->inputs[0].arg.payload);
    return view(y, m.sizes);  // (the inner view, now unread, is dead code)
  }
  int64_t M = am.sizes[ra - 2], K = am.sizes[ra - 1], N = bm.sizes[rb - 1];
  if (auto w = transpose_of_shared_.find(b); w != transpose_of_shared_.end() && rb == 2) {
    // x @ W.t() with W a tied weight (GPT-2's LM head written as a matmul): (W @ x^T)^T as the linear
    // lowering does, so W is not transposed on every run (only the activations are)
    int64_t rows = am.numel() / std::max<int64_t>(K, 1);
    const ValueId weight = w->second;
    ValueId y = matmul_shared_transposed(view(a, {rows, K}), weight, std::nullopt, contiguous(m.dtype, {rows, N}));
    return view(y, m.sizes);
  }
  if (ra == 2 && rb == 2)
    return emit("aten.mm.default", {NA("self", tensor_arg(a)), NA("mat2", tensor_arg(b))}, m, "mm");
  if (rb == 2) {  // [..., M, K] @ [K, N]: one mm over all rows
    int64_t rows = am.numel() / std::max<int64_t>(K, 1);
    ValueId a2 = view(a, {rows, K});
    ValueId y = emit("aten.mm.default", {NA("self", tensor_arg(a2)), NA("mat2", tensor_arg(b))},
                     contiguous(m.dtype, {rows, N}), "mm");
    return view(y, m.sizes);
  }
  if (auto y = grouped_matmul(a, b, m)) return *y;
  // Batched: broadcast the batch dims, fold them into one, bmm.
  std::vector<int64_t> batch(m.sizes.begin(), m.sizes.end() - 2);
  int64_t B = std::accumulate(batch.begin(), batch.end(), int64_t{1}, std::multiplies<>());
  auto with = [&](std::vector<int64_t> dims, int64_t x, int64_t y) {
    dims.push_back(x);
    dims.push_back(y);
    return dims;
  };
  ValueId ae = view(expand(ra == 2 ? view(a, with({}, M, K)) : a, with(batch, M, K)), {B, M, K});
  ValueId be = view(expand(b, with(batch, K, N)), {B, K, N});
  ValueId y = emit("aten.bmm.default", {NA("self", tensor_arg(ae)), NA("mat2", tensor_arg(be))},
                   contiguous(m.dtype, {B, M, N}), "bmm");
  return view(y, m.sizes);
}

const Node* Lowerer::produced_by(ValueId v, std::string_view target) const {
  int32_t p = out_.graph.values[static_cast<size_t>(v)].producer;
  if (p < 0 || static_cast<size_t>(p) >= out_.graph.nodes.size()) return nullptr;
  const Node& node = out_.graph.nodes[static_cast<size_t>(p)];
  if (node.target != target || node.inputs.empty() || node.inputs[0].arg.kind != Argument::Kind::Tensor)
    return nullptr;
  return &node;
}

std::optional<Lowerer::HeadRepeat> Lowerer::head_repeat(ValueId v) const {
  const auto& vm = meta_of(v);
  size_t r = vm.sizes.size();
  const Node* view_node = produced_by(v, "aten.view_copy.default");
  if (r < 3 || !view_node) return std::nullopt;
  ValueId e = std::get<ValueId>(view_node->inputs[0].arg.payload);
  const Node* expand_node = produced_by(e, "aten.expand_copy.default");
  if (!expand_node) return std::nullopt;
  ValueId u = std::get<ValueId>(expand_node->inputs[0].arg.payload);
  const auto& em = meta_of(e);
  const auto& um = meta_of(u);
  // u [..., hk, 1, S, D] -> e [..., hk, G, S, D] -> v [..., hk*G, S, D]
  if (em.sizes.size() != r + 1 || um.sizes.size() != r + 1 || !vm.sym_sizes.empty() || !um.sym_sizes.empty())
    return std::nullopt;
  size_t h = r - 3;  // heads axis of v; the group axis of e is h + 1
  for (size_t i = 0; i <= r; ++i) {
    if (i == h + 1) continue;
    if (um.sizes[i] != em.sizes[i]) return std::nullopt;
  }
  if (um.sizes[h + 1] != 1 || em.sizes[h + 1] <= 1 || vm.sizes[h] != em.sizes[h] * em.sizes[h + 1] ||
      vm.sizes[h + 1] != em.sizes[h + 2] || vm.sizes[h + 2] != em.sizes[h + 3])
    return std::nullopt;
  for (size_t i = 0; i < h; ++i)
    if (vm.sizes[i] != em.sizes[i]) return std::nullopt;
  std::vector<int64_t> xs = vm.sizes;
  xs[h] = em.sizes[h];
  return HeadRepeat{const_cast<Lowerer*>(this)->view(u, xs), em.sizes[h + 1]};
}

std::optional<ValueId> Lowerer::grouped_matmul(ValueId a, ValueId b, const TensorMeta& m) {
  const auto& am = meta_of(a);
  size_t r = m.sizes.size();
  if (am.sizes.size() != r || meta_of(b).sizes.size() != r || r < 3 || no_fold_ || !am.sym_sizes.empty() ||
      !m.sym_sizes.empty())
    return std::nullopt;
  for (size_t i = 0; i + 2 < r; ++i)
    if (am.sizes[i] != m.sizes[i]) return std::nullopt;  // a's batch dims must not broadcast
  bool transposed = false;
  std::optional<HeadRepeat> rep = head_repeat(b);
  if (!rep) {
    const Node* p = produced_by(b, "aten.permute_copy.default");
    if (!p) return std::nullopt;
    std::vector<int64_t> swap(r);
    std::iota(swap.begin(), swap.end(), 0);
    std::swap(swap[r - 2], swap[r - 1]);
    const Argument* dims = p->input("dims") ? &p->input("dims")->arg : nullptr;
    if (!dims || dims->kind != Argument::Kind::Ints || std::get<std::vector<int64_t>>(dims->payload) != swap)
      return std::nullopt;
    rep = head_repeat(std::get<ValueId>(p->inputs[0].arg.payload));
    transposed = true;
    if (!rep) return std::nullopt;
  }
  const auto& xm = meta_of(rep->x);  // [..., hk, S, D]
  int64_t G = rep->groups, M = am.sizes[r - 2], K = am.sizes[r - 1], N = m.sizes[r - 1];
  int64_t B = xm.numel() / std::max<int64_t>(xm.sizes[r - 2] * xm.sizes[r - 1], 1);
  bool fits = transposed ? xm.sizes[r - 1] == K && xm.sizes[r - 2] == N : xm.sizes[r - 2] == K && xm.sizes[r - 1] == N;
  if (!fits || B * G * M * K != am.numel()) return std::nullopt;
  ValueId a3 = view(a, {B, G * M, K});
  ValueId b3 = view(rep->x, {B, xm.sizes[r - 2], xm.sizes[r - 1]});
  if (transposed) b3 = permute(b3, {0, 2, 1}, "k_t");
  ValueId y = emit("aten.bmm.default", {NA("self", tensor_arg(a3)), NA("mat2", tensor_arg(b3))},
                   contiguous(m.dtype, {B, G * M, N}), "bmm_grouped");
  return view(y, m.sizes);
}

}  // namespace kiln::passes::detail
