// The decomposition table (decompositions.cpp) and the rewrites it names, over two files: decompositions.cpp (the
// table, shapes, arithmetic, functional forms, scatter_reduce) and decompositions_nn.cpp (nn modules' formulas:
// losses, shrinks, RNN cells, 3-d pooling). What both use is here.
#pragma once

#include "lowerer.h"

#include <numeric>
#include <optional>
#include <vector>

namespace kiln::passes::detail::decomp {

using L = Lowerer;

// The broadcast shape of a and b.
inline std::vector<int64_t> broadcast_sizes(std::vector<int64_t> s, const std::vector<int64_t>& t) {
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

inline Ops ops_of(L& l, const Node& n) { return Ops{l, l.out_meta(n).dtype}; }

// A constant int64 vector 0..n-1 (float32 when dt is Float), named `hint` (decompositions.cpp).
ValueId iota_constant(L& l, int64_t n, ScalarType dt, const char* hint);

// decompositions_nn.cpp
void l1_loss(L& l, const Node& n);
void mse_loss(L& l, const Node& n);
void smooth_l1_loss(L& l, const Node& n);
void huber_loss(L& l, const Node& n);
void kl_div(L& l, const Node& n);
void margin_ranking_loss(L& l, const Node& n);
void soft_margin_loss(L& l, const Node& n);
void binary_cross_entropy(L& l, const Node& n);
void binary_cross_entropy_with_logits(L& l, const Node& n);
void poisson_nll_loss(L& l, const Node& n);
void nll_loss(L& l, const Node& n);
void cross_entropy_loss(L& l, const Node& n);
void multi_margin_loss(L& l, const Node& n);
void multilabel_margin_loss(L& l, const Node& n);
void hardshrink(L& l, const Node& n);
void softshrink(L& l, const Node& n);
void threshold(L& l, const Node& n);
void hinge_embedding_loss(L& l, const Node& n);
void cosine_embedding_loss(L& l, const Node& n);
void rnn_tanh_cell(L& l, const Node& n);
void rnn_relu_cell(L& l, const Node& n);
void gru_cell(L& l, const Node& n);
void lstm_cell(L& l, const Node& n);
void pool3d(L& l, const Node& n);

// decompositions_opdb.cpp (operators the whole-op_db sweep found): its table's rewrite for an operator, or null
using Rewrite = void (*)(L&, const Node&);
Rewrite opdb_rewrite(std::string_view target);
void identity(L& l, const Node& n);
void renamed(L& l, const Node& n);
void conj_transpose(L& l, const Node& n);
void view_as_output(L& l, const Node& n);
void t_copy(L& l, const Node& n);
void narrow(L& l, const Node& n);
void broadcast_to(L& l, const Node& n);
void flip_one(L& l, const Node& n);
void movedim(L& l, const Node& n);
void rot90(L& l, const Node& n);
void tile(L& l, const Node& n);
void split_pieces(L& l, const Node& n);
void channel_shuffle(L& l, const Node& n);
void meshgrid(L& l, const Node& n);
void logsumexp(L& l, const Node& n);
void std_dev(L& l, const Node& n);
void var_mean(L& l, const Node& n);
void all_of(L& l, const Node& n);
void count_nonzero(L& l, const Node& n);
void nansum(L& l, const Node& n);
void trace(L& l, const Node& n);
void dot(L& l, const Node& n);
void inner(L& l, const Node& n);
void mv(L& l, const Node& n);
void outer(L& l, const Node& n);
void cross(L& l, const Node& n);
void take(L& l, const Node& n);
void take_along_dim(L& l, const Node& n);
void logaddexp(L& l, const Node& n);
void round_decimals(L& l, const Node& n);
void erfc(L& l, const Node& n);
void special_ndtr(L& l, const Node& n);
void hypot(L& l, const Node& n);
void signbit(L& l, const Node& n);
void copysign(L& l, const Node& n);
void fmax_fmin(L& l, const Node& n);
void isfinite(L& l, const Node& n);
void isinf_signed(L& l, const Node& n);
void isreal(L& l, const Node& n);
void special_xlog1py(L& l, const Node& n);
void special_entr(L& l, const Node& n);
void isclose(L& l, const Node& n);
void eye(L& l, const Node& n);
void sum_to_size(L& l, const Node& n);
void aminmax(L& l, const Node& n);
void pairwise_distance(L& l, const Node& n);
void triplet_margin_loss(L& l, const Node& n);
void cosine_similarity(L& l, const Node& n);
void isin(L& l, const Node& n);
void linspace(L& l, const Node& n);
void column_stack(L& l, const Node& n);
void block_diag(L& l, const Node& n);
void cartesian_prod(L& l, const Node& n);
void diag_embed(L& l, const Node& n);
void diag(L& l, const Node& n);
void max_unpool(L& l, const Node& n);
void bucketize(L& l, const Node& n);
void unfold_copy(L& l, const Node& n);
void kron(L& l, const Node& n);
void tensordot(L& l, const Node& n);
void trapezoid(L& l, const Node& n);
void trapezoid_dx(L& l, const Node& n);
void grid_sampler(L& l, const Node& n);
void diff(L& l, const Node& n);
void unsafe_masked_index(L& l, const Node& n);
void unsafe_masked_index_put_accumulate(L& l, const Node& n);
void argsort(L& l, const Node& n);
void gradient(L& l, const Node& n);
void fftshift(L& l, const Node& n);
void multi_dot(L& l, const Node& n);
void matrix_power(L& l, const Node& n);
void linalg_norm(L& l, const Node& n);
void float_power(L& l, const Node& n);

// ---- helpers of decompositions_opdb*.cpp (the whole-op_db sweep's rewrites)

// Lowers `n` as the source operator `target` with `inputs` (source-graph arguments) and `outputs` (a subset
// of n's): a rewrite into another operator the lowerer has.
inline void as_op(L& l, const Node& n, std::string target, std::vector<NamedArgument> inputs,
           std::optional<std::vector<Argument>> outputs = std::nullopt) {
  Node m = n;
  m.target = std::move(target);
  m.inputs = std::move(inputs);
  if (outputs) m.outputs = std::move(*outputs);
  l.lower(m);
}

inline NamedArgument source_input(L& l, const Node& n, std::string_view name) {
  const NamedArgument* a = n.input(name);
  if (!a) l.unsupported(n, fmt::format("missing argument '{}'", name));
  return {a->name, a->arg, a->keyword};
}

inline ValueId output_value(const Node& n, size_t i) { return std::get<ValueId>(n.outputs.at(i).payload); }

inline bool is_float(ScalarType t) {
  return t == ScalarType::Float || t == ScalarType::Double || t == ScalarType::Half || t == ScalarType::BFloat16;
}

inline ValueId unary(L& l, const char* op, ValueId x, ScalarType out, const char* hint) {
  return l.emit(op, {NA("self", tensor_arg(x))}, contiguous(out, l.meta_of(x).sizes), hint);
}

inline ValueId binary(L& l, const char* op, ValueId a, ValueId b, ScalarType out, const char* hint) {
  return l.emit(op, {NA("self", tensor_arg(a)), NA("other", tensor_arg(b))},
                contiguous(out, broadcast_sizes(l.meta_of(a).sizes, l.meta_of(b).sizes)), hint);
}

inline ValueId with_scalar(L& l, const char* op, ValueId a, double v, ScalarType out, const char* hint) {
  return l.emit(op, {NA("self", tensor_arg(a)), NA("other", float_arg(v))}, contiguous(out, l.meta_of(a).sizes),
                hint);
}

inline ValueId select_where(L& l, ValueId c, ValueId a, ValueId b, ScalarType out, const char* hint) {
  const auto s = broadcast_sizes(broadcast_sizes(l.meta_of(c).sizes, l.meta_of(a).sizes), l.meta_of(b).sizes);
  return l.emit("aten.where.self", {NA("condition", tensor_arg(c)), NA("self", tensor_arg(a)),
                                    NA("other", tensor_arg(b))}, contiguous(out, s), hint);
}

inline ValueId constant_of(L& l, double v, ScalarType dt) { return l.scalar_tensor(float_arg(v), dt); }

// The reduction dims of an int[]? argument: None or [] is every dim; wrapped, in order.
inline std::vector<int64_t> dims_of(L& l, const Node& n, const char* name, size_t rank) {
  const Argument* a = l.opt(n, name);
  std::vector<int64_t> dims;
  if (a && a->kind != Argument::Kind::None) dims = l.ints_in(n, name);
  if (dims.empty())
    for (size_t d = 0; d < rank; ++d) dims.push_back(static_cast<int64_t>(d));
  for (auto& d : dims) d = L::wrap_dim(d, std::max<size_t>(rank, 1));
  return dims;
}

inline std::vector<int64_t> kept_sizes(std::vector<int64_t> s, const std::vector<int64_t>& dims) {
  for (int64_t d : dims)
    if (static_cast<size_t>(d) < s.size()) s[static_cast<size_t>(d)] = 1;
  return s;
}

// sum of x over dims (kept), in dtype dt; a 0-d x is viewed as [1] first.
inline ValueId sum_kept(L& l, ValueId x, const std::vector<int64_t>& dims, const char* hint) {
  if (l.meta_of(x).sizes.empty()) x = l.view(x, {1});
  const TensorMeta xm = l.meta_of(x);
  std::vector<int64_t> d = dims.empty() ? std::vector<int64_t>{0} : dims;
  return l.emit("aten.sum.dim_IntList", {NA("self", tensor_arg(x)), NA("dim", ints_arg(d)),
                                         NA("keepdim", bool_arg(true))}, contiguous(xm.dtype, kept_sizes(xm.sizes, d)),
                hint);
}

// signbit of a float tensor: x < 0, and -0.0 (1 / -0.0 = -inf).
inline ValueId signbit_of(L& l, ValueId x) {
  const ScalarType dt = l.meta_of(x).dtype;
  ValueId neg = with_scalar(l, "aten.lt.Scalar", x, 0.0, ScalarType::Bool, "negative");
  if (!is_float(dt)) return neg;
  ValueId zero = with_scalar(l, "aten.eq.Scalar", x, 0.0, ScalarType::Bool, "zero");
  ValueId inv = unary(l, "aten.reciprocal.default", x, dt, "inverse");
  ValueId negzero = with_scalar(l, "aten.lt.Scalar", inv, 0.0, ScalarType::Bool, "negative_zero");
  return select_where(l, zero, negzero, neg, ScalarType::Bool, "signbit");
}

}  // namespace kiln::passes::detail::decomp
