// to_edge: exported program (default IR or core ATen) -> kiln's edge form.
//
// One walk over the source graph in order. Each source node is rewritten into
// zero or more edge nodes (core-ATen functional ops from the op table, views as
// *_copy ops, every tensor contiguous); no-ops (dropout in eval, asserts,
// same-dtype conversions, contiguous/clone/alias) bind their output to their
// input. Every emitted node whose inputs are all constant is folded on the
// spot with kiln's kernels when that does not grow the program; views of
// constants become constants sharing the same bytes. Dead nodes and unused
// constants are dropped at the end.

#include "lowerer.h"

#include "kiln/passes/functionalize.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <numeric>
#include <set>

namespace kiln::passes {

std::vector<std::byte> EdgeProgram::constant_bytes(graph::ValueId v) const {
  const ConstantData& c = constants.at(v);
  if (c.generated) {
    std::vector<std::byte> out;
    out.reserve(static_cast<size_t>(c.generated->size));
    c.generated->write([&](std::span<const std::byte> s) { out.insert(out.end(), s.begin(), s.end()); });
    return out;
  }
  if (c.bytes) return *c.bytes;
  std::vector<std::byte> out(static_cast<size_t>(c.source->meta.nbytes()));
  exported->read_constant(*c.source, out);
  return out;
}

EdgeProgram to_edge(const pt2::ExportedProgram& ep, LoweringStats* stats, const EdgeOptions& options) {
  if (needs_functionalization(ep.graph)) {  // the default IR's in-place operators (functionalize.h)
    auto functional = std::make_shared<pt2::ExportedProgram>(ep);
    functionalize(*functional);
    EdgeProgram edge = detail::Lowerer(*functional, stats, options).run();
    edge.functionalized = std::move(functional);  // edge.exported and its constants point into it
    return edge;
  }
  return detail::Lowerer(ep, stats, options).run();
}

}  // namespace kiln::passes

namespace kiln::passes::detail {

void Lowerer::lower(const Node& n) {
  const std::string& t = n.target;
  if (lower_quant(n)) return;
  if (lower_decomposition(n)) return;  // the table of decompositions by operator (decompositions.cpp)
  auto passthrough = [&](std::string_view target) {
    const OpSchema* schema = find_op_schema(target);
    std::vector<NamedArgument> args;
    for (const auto& in : n.inputs) args.push_back({in.name, remap(in.arg), in.keyword});
    std::vector<TensorMeta> metas;
    for (size_t i = 0; i < source_outputs(n).size(); ++i) metas.push_back(out_meta(n, i));
    if (metas.empty()) unsupported(n, "operator has no tensor outputs");
    (void)schema;
    bind_all(n, emit_raw(target, std::move(args), std::move(metas)));
  };

  // No-ops in inference.
  if (t == "aten._assert_tensor_metadata.default" || t == "aten._assert_scalar.default" ||
      t == "aten.sym_constrain_range_for_size.default" || t == "aten._assert_async.msg")
    return;
  if (t == "aten.dropout.default" || t == "aten.native_dropout.default") {
    if (int_in(n, "train", 0) != 0 && n.input("p") && std::get<double>(arg(n, "p").payload) != 0.0)
      unsupported(n, "dropout in training mode; export the model in eval() mode");
    bind(n, tensor_in(n, "input"));
    return;
  }
  if (t == "aten.alias.default" || t == "aten.contiguous.default" || t == "aten.clone.default" ||
      t == "aten.detach.default" || t == "aten.lift_fresh_copy.default" || t == "aten.alias_copy.default" ||
      t == "aten.detach_copy.default") {
    bind(n, tensor_in(n, "self"));
    return;
  }
  if (t == "aten.to.dtype" || t == "aten.to.dtype_layout" || t == "aten.to.device" || t == "aten._to_copy.default" ||
      t == "aten.type_as.default") {
    ValueId x = tensor_in(n, "self");
    bind(n, convert(x, out_meta(n).dtype));
    return;
  }

  // Views and shape changes.
  if (t == "aten.view.default" || t == "aten.reshape.default" || t == "aten._unsafe_view.default" ||
      t == "aten.view_copy.default" || t == "aten.flatten.using_ints" || t == "aten.unflatten.int") {
    bind(n, view(tensor_in(n, opt(n, "self") ? "self" : "input"), out_meta(n).sizes));
    if (t == "aten.flatten.using_ints" || t == "aten.unflatten.int") return;
    return;
  }
  if (t == "aten.unsqueeze.default" || t == "aten.unsqueeze_copy.default") {
    ValueId x = tensor_in(n, "self");
    bind(n, emit("aten.unsqueeze_copy.default", {NA("self", tensor_arg(x)), NA("dim", int_arg(int_in(n, "dim")))},
                 out_meta(n)));
    return;
  }
  if (t == "aten.squeeze.dims" || t == "aten.squeeze.dim" || t == "aten.squeeze.default" ||
      t == "aten.squeeze_copy.dims") {
    ValueId x = tensor_in(n, "self");
    bind(n, view(x, out_meta(n).sizes));
    return;
  }
  if (t == "aten.permute.default" || t == "aten.permute_copy.default") {
    bind(n, permute(tensor_in(n, "self"), ints_in(n, "dims")));
    return;
  }
  if (t == "aten.transpose.int" || t == "aten.transpose_copy.int" || t == "aten.t.default") {
    ValueId x = tensor_in(n, "self");
    size_t rank = meta_of(x).sizes.size();
    std::vector<int64_t> dims(rank);
    std::iota(dims.begin(), dims.end(), 0);
    if (rank >= 2) {
      int64_t a = t == "aten.t.default" ? 0 : wrap_dim(int_in(n, "dim0"), rank);
      int64_t b = t == "aten.t.default" ? 1 : wrap_dim(int_in(n, "dim1"), rank);
      std::swap(dims[static_cast<size_t>(a)], dims[static_cast<size_t>(b)]);
    }
    bind(n, permute(x, dims));
    return;
  }
  if (t == "aten.expand.default" || t == "aten.expand_copy.default") {
    ValueId x = tensor_in(n, "self");
    bind(n, expand(x, out_meta(n).sizes));
    return;
  }
  if (t == "aten.slice.Tensor" || t == "aten.slice_copy.Tensor") {
    ValueId x = tensor_in(n, "self");
    TensorMeta m = out_meta(n);
    if (m.sizes == meta_of(x).sizes) {  // a full slice is a no-op
      bind(n, x);
      return;
    }
    std::vector<NamedArgument> args{NA("self", tensor_arg(x))};
    for (const char* name : {"dim", "start", "end", "step"})
      if (const auto* a = opt(n, name)) args.push_back(NA(name, *a));
    bind(n, emit("aten.slice_copy.Tensor", std::move(args), m));
    return;
  }
  if (t == "aten.select.int" || t == "aten.select_copy.int") {
    ValueId x = tensor_in(n, "self");
    bind(n, emit("aten.select_copy.int",
                 {NA("self", tensor_arg(x)), NA("dim", int_arg(int_in(n, "dim"))), NA("index", int_arg(int_in(n, "index")))},
                 out_meta(n)));
    return;
  }
  if (t == "aten.split.Tensor" || t == "aten.split_with_sizes.default" || t == "aten.split_with_sizes_copy.default" ||
      t == "aten.split_copy.Tensor") {
    ValueId x = tensor_in(n, "self");
    size_t rank = meta_of(x).sizes.size();
    int64_t dim = wrap_dim(int_in(n, "dim", 0), rank);
    std::vector<TensorMeta> metas;
    std::vector<int64_t> sizes;
    for (size_t i = 0; i < source_outputs(n).size(); ++i) {
      metas.push_back(out_meta(n, i));
      sizes.push_back(metas.back().sizes.at(static_cast<size_t>(dim)));
    }
    bind_all(n, emit_raw("aten.split_with_sizes_copy.default",
                         {NA("self", tensor_arg(x)), NA("split_sizes", ints_arg(sizes)), NA("dim", int_arg(dim))},
                         metas));
    return;
  }

  // Factories: the out tensor carries dtype and shape.
  if (t == "aten.zeros.default" || t == "aten.ones.default" || t == "aten.new_zeros.default" ||
      t == "aten.new_ones.default" || t == "aten.zeros_like.default" || t == "aten.ones_like.default" ||
      t == "aten.full.default" || t == "aten.full_like.default" || t == "aten.new_full.default") {
    TensorMeta m = out_meta(n);
    Argument fill = int_arg(t.find("ones") != std::string::npos ? 1 : 0);
    if (const auto* fv = opt(n, "fill_value")) fill = *fv;
    bind(n, emit("aten.full.default", {NA("size", ints_arg(m.sizes)), NA("fill_value", fill)}, m));
    return;
  }
  if (t == "aten.scalar_tensor.default") {
    bind(n, scalar_tensor(arg(n, "s"), out_meta(n).dtype));
    return;
  }
  if (t == "aten.arange.default" || t == "aten.arange.start" || t == "aten.arange.start_step") {
    Argument start = int_arg(0), step = int_arg(1);
    if (const auto* s = opt(n, "start")) start = *s;
    if (const auto* s = opt(n, "step")) step = *s;
    bind(n, emit("aten.arange.start_step", {NA("start", start), NA("end", arg(n, "end")), NA("step", step)}, out_meta(n)));
    return;
  }

  // Compositions.
  if (t == "aten.linear.default") {
    ValueId x = tensor_in(n, "input");
    ValueId w = tensor_in(n, "weight");
    auto bias = opt_tensor_in(n, "bias");
    TensorMeta m = out_meta(n);
    const auto& xm = meta_of(x);
    int64_t in_features = xm.sizes.back();
    int64_t out_features = meta_of(w).sizes.at(0);
    int64_t rows = xm.numel() / std::max<int64_t>(in_features, 1);
    ValueId x2 = view(x, {rows, in_features});
    TensorMeta m2 = contiguous(m.dtype, {rows, out_features});
    if (is_shared_weight(w)) {
      bind(n, view(matmul_shared_transposed(x2, w, bias, m2), m.sizes));
      return;
    }
    ValueId wt = transposed_weight(w);
    ValueId y = bias ? emit("aten.addmm.default", {NA("self", tensor_arg(*bias)), NA("mat1", tensor_arg(x2)),
                                                   NA("mat2", tensor_arg(wt))}, m2, "addmm")
                     : emit("aten.mm.default", {NA("self", tensor_arg(x2)), NA("mat2", tensor_arg(wt))}, m2, "mm");
    bind(n, view(y, m.sizes));
    return;
  }
  if (t == "aten.matmul.default") {
    bind(n, matmul(n, tensor_in(n, "self"), tensor_in(n, "other"), out_meta(n)));
    return;
  }
  if (t == "aten.layer_norm.default" || t == "aten.native_layer_norm.default") {
    ValueId x = tensor_in(n, "input");
    std::vector<int64_t> shape = ints_in(n, "normalized_shape");
    const auto& xm = meta_of(x);
    std::vector<int64_t> stat_sizes = xm.sizes;
    for (size_t i = 0; i < shape.size() && i < stat_sizes.size(); ++i) stat_sizes[stat_sizes.size() - 1 - i] = 1;
    double eps = 1e-5;
    if (const auto* e = opt(n, "eps")) eps = std::get<double>(e->payload);
    std::vector<NamedArgument> args{NA("input", tensor_arg(x)), NA("normalized_shape", ints_arg(shape))};
    if (auto w = opt_tensor_in(n, "weight")) args.push_back(NA("weight", tensor_arg(*w)));
    if (auto b = opt_tensor_in(n, "bias")) args.push_back(NA("bias", tensor_arg(*b)));
    args.push_back(NA("eps", float_arg(eps)));
    auto outs = emit_raw("aten.native_layer_norm.default", std::move(args),
                         {contiguous(xm), contiguous(xm.dtype, stat_sizes), contiguous(xm.dtype, stat_sizes)});
    bind_all(n, outs);
    return;
  }
  if (t == "aten.softmax.int" || t == "aten._softmax.default" || t == "aten.log_softmax.int" ||
      t == "aten._log_softmax.default") {
    ValueId x = tensor_in(n, "self");
    if (auto dt = dtype_in(n)) x = convert(x, *dt);
    bool log = t.find("log_softmax") != std::string::npos;
    bind(n, emit(log ? "aten._log_softmax.default" : "aten._softmax.default",
                 {NA("self", tensor_arg(x)), NA("dim", int_arg(int_in(n, "dim"))), NA("half_to_float", bool_arg(false))},
                 out_meta(n)));
    return;
  }
  if (t == "aten.diff.default") {
    ValueId x = tensor_in(n, "self");
    if (int_in(n, "n", 1) != 1) unsupported(n, "diff with n != 1");
    int64_t dim = wrap_dim(int_in(n, "dim", -1), meta_of(x).sizes.size());
    // diff(x, prepend=p, append=q) == diff(cat([p, x, q], dim))
    auto pre = opt_tensor_in(n, "prepend");
    auto post = opt_tensor_in(n, "append");
    if (pre || post) {
      std::vector<ValueId> parts;
      if (pre) parts.push_back(*pre);
      parts.push_back(x);
      if (post) parts.push_back(*post);
      std::vector<int64_t> sizes = meta_of(x).sizes;
      sizes[static_cast<size_t>(dim)] = 0;
      for (ValueId v : parts) sizes[static_cast<size_t>(dim)] += meta_of(v).sizes[static_cast<size_t>(dim)];
      x = emit("aten.cat.default", {NA("tensors", {Argument::Kind::Tensors, parts}), NA("dim", int_arg(dim))},
               contiguous(meta_of(x).dtype, sizes), "cat");
    }
    const TensorMeta xm = meta_of(x);  // a copy: emit() adds values to the graph, which may move them
    TensorMeta m = out_meta(n);
    TensorMeta part = contiguous(xm.dtype, m.sizes);
    ValueId hi = emit("aten.slice_copy.Tensor", {NA("self", tensor_arg(x)), NA("dim", int_arg(dim)), NA("start", int_arg(1)),
                                                 NA("end", int_arg(std::numeric_limits<int64_t>::max()))}, part, "hi");
    ValueId lo = emit("aten.slice_copy.Tensor", {NA("self", tensor_arg(x)), NA("dim", int_arg(dim)), NA("start", int_arg(0)),
                                                 NA("end", int_arg(-1))}, part, "lo");
    bind(n, emit(xm.dtype == ScalarType::Bool ? "aten.ne.Tensor" : "aten.sub.Tensor",
                 {NA("self", tensor_arg(hi)), NA("other", tensor_arg(lo))}, m));
    return;
  }
  if (t == "aten.where.ScalarOther" || t == "aten.where.ScalarSelf" || t == "aten.where.Scalar") {
    ValueId cond = tensor_in(n, "condition");
    TensorMeta m = out_meta(n);
    auto side = [&](const char* name) {
      const Argument& a = arg(n, name);
      return a.kind == Argument::Kind::Tensor ? mapped(std::get<ValueId>(a.payload)) : scalar_tensor(a, m.dtype);
    };
    ValueId a = side("self"), b = side("other");
    bind(n, emit("aten.where.self", {NA("condition", tensor_arg(cond)), NA("self", tensor_arg(a)),
                                     NA("other", tensor_arg(b))}, m));
    return;
  }
  if (t == "aten.__and__.Tensor" || t == "aten.__or__.Tensor") {
    passthrough(t == "aten.__and__.Tensor" ? "aten.bitwise_and.Tensor" : "aten.bitwise_or.Tensor");
    return;
  }
  if (t == "aten.mean.default" || t == "aten.sum.default") {
    ValueId x = tensor_in(n, "self");
    std::vector<int64_t> dims(meta_of(x).sizes.size());
    std::iota(dims.begin(), dims.end(), 0);
    std::vector<NamedArgument> args{NA("self", tensor_arg(x)), NA("dim", ints_arg(dims)), NA("keepdim", bool_arg(false))};
    if (const auto* d = opt(n, "dtype")) args.push_back(NA("dtype", *d));
    bind(n, emit(t == "aten.mean.default" ? "aten.mean.dim" : "aten.sum.dim_IntList", std::move(args), out_meta(n)));
    return;
  }

  // mm/addmm against the transpose of a tied weight (core-ATen linear).
  if (t == "aten.mm.default" || t == "aten.addmm.default") {
    ValueId b = tensor_in(n, t == "aten.mm.default" ? "mat2" : "mat2");
    auto it = transpose_of_shared_.find(b);
    auto is_one = [&](const char* name) {
      const Argument* a = opt(n, name);
      return !a || (a->kind == Argument::Kind::Int && std::get<int64_t>(a->payload) == 1) ||
             (a->kind == Argument::Kind::Float && std::get<double>(a->payload) == 1.0);
    };
    bool plain_addmm = t == "aten.mm.default" ||
                       (is_one("beta") && is_one("alpha") && meta_of(tensor_in(n, "self")).sizes.size() <= 1);
    if (it != transpose_of_shared_.end() && plain_addmm) {
      ValueId a = tensor_in(n, t == "aten.mm.default" ? "self" : "mat1");
      std::optional<ValueId> bias;
      if (t == "aten.addmm.default") bias = tensor_in(n, "self");
      bind(n, matmul_shared_transposed(a, it->second, bias, out_meta(n)));
      return;
    }
  }
  // Binary ops exported with a Python number as `other` run as their .Scalar overloads.
  if (t.ends_with(".Tensor") && n.inputs.size() >= 2) {
    const Argument* other = opt(n, "other");
    if (other && (other->kind == Argument::Kind::Int || other->kind == Argument::Kind::Float ||
                  other->kind == Argument::Kind::Bool)) {
      std::string scalar_target = t.substr(0, t.size() - 7) + ".Scalar";
      if (find_op_schema(scalar_target) != nullptr) {
        passthrough(scalar_target);
        return;
      }
    }
  }
  // Rewrite families kept in their own files (declared below).
  if (lower_data(n)) return;  // before lower_conv: circular padding
  if (lower_state(n) || lower_attention(n) || lower_conv(n) || lower_sequence(n) || lower_math(n)) return;
  // Core ATen ops the op table knows run as they are.
  if (find_op_schema(t) != nullptr) {
    passthrough(t);
    return;
  }
  unsupported(n, "kiln has no kernel or decomposition for this operator (see src/passes/op_table.cpp for "
                 "what kiln runs; export with --decompose for core ATen, or add a decomposition)");
}

}  // namespace kiln::passes::detail
