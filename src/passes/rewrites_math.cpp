// to_edge rewrites: norms and distances (linalg_vector_norm, cdist, pdist), expand_as, __xor__.
#include "lowerer.h"

#include <cmath>

namespace kiln::passes::detail {

// A Scalar or float argument as a double (default when absent or None).
double Lowerer::number_in(const Node& n, std::string_view name, double dflt) const {
  const Argument* a = opt(n, name);
  if (!a || a->kind == Argument::Kind::None) return dflt;
  if (a->kind == Argument::Kind::Float) return std::get<double>(a->payload);
  if (a->kind == Argument::Kind::Int) return static_cast<double>(std::get<int64_t>(a->payload));
  if (a->kind == Argument::Kind::Bool) return std::get<bool>(a->payload) ? 1.0 : 0.0;
  unsupported(n, fmt::format("argument '{}' is not a number", name));
}

bool Lowerer::lower_math(const Node& n) {
  const std::string& t = n.target;
  if (t == "aten.cdist.default" || t == "aten._cdist_forward.default") {
    // both runtimes' _cdist_forward kernels compute every distance directly
    std::vector<NamedArgument> args{NA("x1", tensor_arg(tensor_in(n, "x1"))), NA("x2", tensor_arg(tensor_in(n, "x2"))),
                                    NA("p", float_arg(number_in(n, "p", 2.0)))};
    const Argument* mode = opt(n, "compute_mode");
    args.push_back(NA("compute_mode", mode ? *mode : Argument::none()));
    bind(n, emit("aten._cdist_forward.default", std::move(args), out_meta(n)));
    return true;
  }
  if (t == "aten.pdist.default" || t == "aten._pdist_forward.default") {
    bind(n, emit("aten._pdist_forward.default",
                 {NA("self", tensor_arg(tensor_in(n, "self"))), NA("p", float_arg(number_in(n, "p", 2.0)))},
                 out_meta(n)));
    return true;
  }
  if (t == "aten.__xor__.Tensor") {  // a ^ b on tensors
    bind(n, emit("aten.bitwise_xor.Tensor",
                 {NA("self", tensor_arg(tensor_in(n, "self"))), NA("other", tensor_arg(tensor_in(n, "other")))},
                 out_meta(n)));
    return true;
  }
  if (t == "aten.expand_as.default") {  // (normalize divides by its norm expanded as the input)
    bind(n, expand(tensor_in(n, "self"), meta_of(tensor_in(n, "other")).sizes));
    return true;
  }
  if (t == "aten.linalg_vector_norm.default") {
    lower_vector_norm(n);
    return true;
  }
  return false;
}

// linalg_vector_norm(x, ord, dim, keepdim, dtype), as torch's reference defines it, in
// the result dtype: ord 0 counts the nonzeros, +-inf is amax/amin of |x|, 1 sums |x|,
// 2 is sqrt(sum(x * x)), any other ord (sum |x|^ord)^(1/ord); a reduction over dims
// of size 1 only is |x|.
void Lowerer::lower_vector_norm(const Node& n) {
  ValueId x = tensor_in(n, "self");
  const TensorMeta om = out_meta(n);
  if (meta_of(x).dtype != ScalarType::Float && meta_of(x).dtype != ScalarType::Double &&
      meta_of(x).dtype != ScalarType::Half && meta_of(x).dtype != ScalarType::BFloat16)
    unsupported(n, "linalg_vector_norm of a tensor that is not floating point");
  x = convert(x, om.dtype);
  const TensorMeta xm = contiguous(meta_of(x));  // a copy: emit() adds values
  const size_t rank = xm.sizes.size();
  std::vector<int64_t> dims;
  if (const Argument* d = opt(n, "dim"); d && d->kind != Argument::Kind::None) dims = ints_in(n, "dim");
  if (dims.empty())
    for (size_t i = 0; i < rank; ++i) dims.push_back(static_cast<int64_t>(i));
  bool all_ones = true;
  for (int64_t& d : dims) {
    d = wrap_dim(d, rank);
    if (rank > 0) all_ones = all_ones && xm.sizes.at(static_cast<size_t>(d)) == 1;
  }
  const bool keepdim = int_in(n, "keepdim", 0) != 0;
  const double ord = number_in(n, "ord", 2.0);
  auto abs_of = [&](ValueId v) { return emit("aten.abs.default", {NA("self", tensor_arg(v))}, xm, "abs"); };
  auto reduce = [&](const char* target, ValueId v, const TensorMeta& m, std::string_view hint) {
    return emit(target, {NA("self", tensor_arg(v)), NA("dim", ints_arg(dims)), NA("keepdim", bool_arg(keepdim))}, m,
                hint);
  };
  if (ord == 0) {
    TensorMeta bm = xm;
    bm.dtype = ScalarType::Bool;
    const ValueId nz = emit("aten.ne.Scalar", {NA("self", tensor_arg(x)), NA("other", float_arg(0.0))}, bm, "nonzero");
    const ValueId count = convert(nz, om.dtype);
    // a 0-d input has nothing to sum (and ExecuTorch's sum refuses dim 0 of a 0-d tensor)
    bind(n, rank == 0 ? view(count, om.sizes) : reduce("aten.sum.dim_IntList", count, om, "norm"));
    return;
  }
  if (std::isinf(ord)) {
    bind(n, reduce(ord > 0 ? "aten.amax.default" : "aten.amin.default", abs_of(x), om, "norm"));
    return;
  }
  if (all_ones) {  // nothing is summed: |x| in the out's shape
    bind(n, view(abs_of(x), om.sizes));
    return;
  }
  if (ord == 1) {
    bind(n, reduce("aten.sum.dim_IntList", abs_of(x), om, "norm"));
    return;
  }
  if (ord == 2) {
    const ValueId sq = emit("aten.mul.Tensor", {NA("self", tensor_arg(x)), NA("other", tensor_arg(x))}, xm, "square");
    const ValueId s = reduce("aten.sum.dim_IntList", sq, om, "sum");
    bind(n, emit("aten.sqrt.default", {NA("self", tensor_arg(s))}, om, "norm"));
    return;
  }
  const bool even = std::fmod(ord, 2.0) == 0.0;
  const ValueId a = even ? x : abs_of(x);
  const ValueId pw = emit("aten.pow.Tensor_Scalar", {NA("self", tensor_arg(a)), NA("exponent", float_arg(ord))}, xm, "pow");
  const ValueId s = reduce("aten.sum.dim_IntList", pw, om, "sum");
  bind(n, emit("aten.pow.Tensor_Scalar", {NA("self", tensor_arg(s)), NA("exponent", float_arg(1.0 / ord))}, om, "norm"));
}

}  // namespace kiln::passes::detail
