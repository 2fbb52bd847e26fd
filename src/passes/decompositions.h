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

// decompositions_opdb.cpp (operators the whole-op_db sweep found)
void identity(L& l, const Node& n);
void renamed(L& l, const Node& n);
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

}  // namespace kiln::passes::detail::decomp
