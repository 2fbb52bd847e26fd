// The to-edge lowerer, shared by decompose.cpp (the walk, views, linear
// algebra) and the rewrite families in rewrites_<family>.cpp. Private to
// kiln_passes: include it only from src/passes.
#pragma once

#include "fold.h"
#include "kiln/core/error.h"
#include "kiln/passes/edge_program.h"
#include "kiln/passes/op_table.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <map>
#include <numeric>
#include <optional>
#include <set>

namespace kiln::passes::detail {


using graph::Argument;
using graph::NamedArgument;
using graph::Node;
using graph::TensorMeta;
using graph::ValueId;

// Folding may only create constants this small unless it replaces its inputs.
inline constexpr int64_t kFoldLimitBytes = 1 << 20;

inline TensorMeta contiguous(ScalarType dtype, std::vector<int64_t> sizes) {
  TensorMeta m;
  m.dtype = dtype;
  m.strides.resize(sizes.size());
  int64_t s = 1;
  for (size_t i = sizes.size(); i-- > 0;) {
    m.strides[i] = s;
    s *= std::max<int64_t>(sizes[i], 1);
  }
  m.sizes = std::move(sizes);
  return m;
}

inline TensorMeta contiguous(const TensorMeta& m) { return contiguous(m.dtype, m.sizes); }

inline NamedArgument NA(std::string_view name, Argument a) { return {std::string(name), std::move(a), false}; }
inline Argument tensor_arg(ValueId v) { return Argument::tensor(v); }
inline Argument int_arg(int64_t v) { return Argument::integer(v); }
inline Argument ints_arg(std::vector<int64_t> v) { return {Argument::Kind::Ints, std::move(v)}; }
inline Argument float_arg(double v) { return {Argument::Kind::Float, v}; }
inline Argument bool_arg(bool v) { return {Argument::Kind::Bool, v}; }

// "File "x.py", line 12, in f\n    code" -> "x.py:12"
inline std::string source_location(const std::string& stack_trace) {
  auto pos = stack_trace.rfind("File \"");
  if (pos == std::string::npos) return {};
  auto end = stack_trace.find('"', pos + 6);
  auto line = stack_trace.find("line ", end);
  if (end == std::string::npos || line == std::string::npos) return {};
  auto line_end = stack_trace.find_first_not_of("0123456789", line + 5);
  std::string file = stack_trace.substr(pos + 6, end - pos - 6);
  if (auto slash = file.rfind('/'); slash != std::string::npos) file = file.substr(slash + 1);
  return file + ":" + stack_trace.substr(line + 5, line_end - line - 5);
}

class Lowerer {
 public:
  Lowerer(const pt2::ExportedProgram& ep, LoweringStats* stats, const EdgeOptions& options = {})
      : ep_(ep), stats_(stats), options_(options) {
    out_.exported = &ep;
    out_.inputs_spec = ep.inputs_spec;
    out_.outputs_spec = ep.outputs_spec;
    vmap_.resize(ep.graph.values.size());
    count_storage_uses();
  }

  EdgeProgram run() {
    bind_inputs();
    for (const Node& n : ep_.graph.nodes) {
      current_ = &n;
      no_fold_ = n.symbolic;  // its sizes change with a symbol: computed per call, never a constant
      lower(n);
    }
    no_fold_ = false;
    current_ = nullptr;
    bind_outputs();
    if (!buffer_writes_.empty() || !input_writes_.empty()) finish_state();
    remove_dead_code();
    if (stats_) {
      stats_->source_nodes = static_cast<int64_t>(ep_.graph.nodes.size());
      stats_->edge_nodes = static_cast<int64_t>(out_.graph.nodes.size());
      stats_->folded_nodes = folded_;
    }
    return std::move(out_);
  }

  // ---- setup -------------------------------------------------------------
  void count_storage_uses() {
    // How many node arguments read each constant's storage (tied parameters
    // are separate inputs over one storage entry).
    std::map<ValueId, const pt2::ConstantTensor*> const_of;
    for (size_t i = 0; i < ep_.signature.inputs.size(); ++i) {
      const auto& spec = ep_.signature.inputs[i];
      if (const auto* c = ep_.find_constant(spec.target); c && spec.kind != graph::InputSpec::Kind::UserInput)
        const_of[ep_.graph.inputs[i]] = c;
    }
    for (const Node& n : ep_.graph.nodes)
      for (const auto& in : n.inputs)
        for (ValueId v : in.arg.tensor_ids())
          if (auto it = const_of.find(v); it != const_of.end()) ++storage_uses_[storage_key(*it->second)];
  }

  static std::string storage_key(const pt2::ConstantTensor& c) {
    return fmt::format("{}+{}@{}", c.entry, c.entry_offset, c.meta.storage_offset);
  }

  void bind_inputs() {
    for (size_t i = 0; i < ep_.graph.inputs.size(); ++i) {
      const auto& spec = ep_.signature.inputs[i];
      const auto& src = ep_.graph.value(ep_.graph.inputs[i]);
      ValueId v = out_.graph.add_value(src.name, contiguous(src.meta));
      vmap_[static_cast<size_t>(ep_.graph.inputs[i])] = v;
      if (spec.kind == graph::InputSpec::Kind::UserInput) {
        out_.graph.inputs.push_back(v);
        for (const auto& o : ep_.signature.outputs)  // an input the program updates (an external KV cache)
          if (o.kind == graph::OutputSpec::Kind::UserInputMutation && o.target == spec.arg_name)
            mutated_inputs_[v] = spec.arg_name;
      } else {
        const auto* c = ep_.find_constant(spec.target);
        check(c != nullptr, "{}: input '{}' has no constant data", ep_.path, spec.target);
        if (spec.kind == graph::InputSpec::Kind::Buffer && is_mutated_buffer(spec.target))
          out_.mutable_buffers.push_back({v, ConstantData{c, nullptr, c->name}, spec.target});
        else
          out_.constants[v] = ConstantData{c, nullptr, c->name};
      }
    }
  }

  void bind_outputs() {
    std::set<ValueId> seen;
    for (size_t i = 0; i < ep_.graph.outputs.size(); ++i) {
      if (ep_.signature.outputs[i].kind == graph::OutputSpec::Kind::BufferMutation) {
        bind_buffer_mutation(ep_.signature.outputs[i], ep_.graph.outputs[i]);
        continue;
      }
      if (ep_.signature.outputs[i].kind == graph::OutputSpec::Kind::UserInputMutation) {
        // ExecuTorch's convention: the updated input is also an output, in the export's order; written in
        // place (or copied back, see finish_state), so the output is the input's own tensor
        bind_input_mutation(ep_.signature.outputs[i], ep_.graph.outputs[i]);
        seen.insert(out_.outputs.back());
        continue;
      }
      if (ep_.signature.outputs[i].kind != graph::OutputSpec::Kind::UserOutput)
        fail("{}: output {} is a {}; kiln lowers inference programs without mutated state", ep_.path, i,
             graph::output_kind_name(ep_.signature.outputs[i].kind));
      const Argument& a = ep_.graph.outputs[i];
      check(a.kind == Argument::Kind::Tensor, "{}: output {} is not a tensor; kiln supports tensor outputs only",
            ep_.path, i);
      ValueId v = mapped(std::get<ValueId>(a.payload));
      // An output must be a tensor the program computes, once: copy constants,
      // inputs and repeated outputs.
      bool is_input = std::find(out_.graph.inputs.begin(), out_.graph.inputs.end(), v) != out_.graph.inputs.end();
      if (out_.is_constant(v) || is_input || seen.contains(v)) {
        const auto& m = out_.graph.value(v).meta;
        std::vector<int64_t> order(m.sizes.size());
        std::iota(order.begin(), order.end(), 0);
        v = emit_raw("dim_order_ops._clone_dim_order.default",
                     {NA("self", tensor_arg(v)), NA("non_blocking", bool_arg(false)), NA("dim_order", ints_arg(order))},
                     {contiguous(m)}, "output_copy")[0];
      }
      seen.insert(v);
      out_.outputs.push_back(v);
    }
  }

  void remove_dead_code() {
    auto& g = out_.graph;
    std::vector<bool> live(g.values.size(), false);
    for (ValueId v : out_.outputs) live[static_cast<size_t>(v)] = true;
    std::vector<bool> keep(g.nodes.size(), false);
    for (size_t i = g.nodes.size(); i-- > 0;) {
      bool needed = writes_state(g.nodes[i]);  // an update of a mutable buffer is the point of its node
      for (ValueId v : g.nodes[i].output_ids()) needed = needed || live[static_cast<size_t>(v)];
      if (!needed) continue;
      keep[i] = true;
      for (const auto& in : g.nodes[i].inputs)
        for (ValueId v : in.arg.tensor_ids()) live[static_cast<size_t>(v)] = true;
    }
    std::vector<Node> kept;
    for (size_t i = 0; i < g.nodes.size(); ++i) {
      if (keep[i]) kept.push_back(std::move(g.nodes[i]));
      else if (stats_) ++stats_->removed_nodes;
    }
    g.nodes = std::move(kept);
    for (size_t i = 0; i < g.nodes.size(); ++i)
      for (ValueId v : g.nodes[i].output_ids()) g.values[static_cast<size_t>(v)].producer = static_cast<int32_t>(i);
    for (auto it = out_.constants.begin(); it != out_.constants.end();)
      it = live[static_cast<size_t>(it->first)] ? std::next(it) : out_.constants.erase(it);
  }

  // ---- emission ----------------------------------------------------------
  std::string fresh_name(std::string_view hint) {
    std::string base = current_ ? current_->name : "kiln";
    if (!hint.empty()) base += "_" + std::string(hint);
    std::string name = base;
    while (out_.graph.find_value(name)) name = fmt::format("{}_{}", base, ++name_counter_);
    return name;
  }

  // Adds the node (or folds it) and returns its outputs.
  std::vector<ValueId> emit_raw(std::string_view target, std::vector<NamedArgument> args, std::vector<TensorMeta> metas,
                                std::string_view hint = {}) {
    const OpSchema* schema = find_op_schema(target);
    if (schema == nullptr) fail("internal: kiln emitted '{}' which has no out-variant schema", target);
    check_argument_kinds(target, *schema, args, metas);
    Node node;
    node.name = fresh_name(hint);
    // a multi-output node names its values name_0, name_1, ...: those must be fresh too
    for (std::string base = node.name; metas.size() > 1 && out_.graph.find_value(node.name + "_0");)
      node.name = fmt::format("{}_{}", base, ++name_counter_);
    node.target = std::string(target);
    node.inputs = std::move(args);
    if (current_) {  // debug information: what it was lowered from
      node.stack_trace = current_->stack_trace;
      node.source_nodes = {current_->name};
      node.module_path = current_->module_path;
      node.module_type = current_->module_type;
    }
    std::vector<ValueId> outs;
    for (size_t i = 0; i < metas.size(); ++i)
      outs.push_back(out_.graph.add_value(metas.size() == 1 ? node.name : fmt::format("{}_{}", node.name, i), metas[i]));
    if (schema->out_is_list || metas.size() > 1) {
      if (schema->out_is_list) {
        node.outputs.push_back({Argument::Kind::Tensors, outs});
      } else {
        for (ValueId v : outs) node.outputs.push_back(tensor_arg(v));
      }
    } else {
      node.outputs.push_back(tensor_arg(outs[0]));
    }
    if (!try_fold(node, *schema)) {
      for (ValueId v : outs) out_.graph.values[static_cast<size_t>(v)].producer = static_cast<int32_t>(out_.graph.nodes.size());
      out_.graph.nodes.push_back(std::move(node));
    }
    return outs;
  }

  // Every argument the out variant's schema takes as a Tensor is one: a Python number there (sub.Tensor(1, x),
  // as a full core-ATen decomposition writes `1 - x`) becomes a 0-d constant tensor, since ExecuTorch's runtime
  // aborts on a scalar EValue where its kernel reads a tensor. Anything else in a tensor's place is an error.
  void check_argument_kinds(std::string_view target, const OpSchema& schema, std::vector<NamedArgument>& args,
                            const std::vector<TensorMeta>& metas) {
    using K = Argument::Kind;
    for (auto& a : args) {
      const ArgSchema* s = nullptr;
      for (const auto& sa : schema.args) s = sa.name == a.name ? &sa : s;
      if (s == nullptr || (s->type != ArgType::Tensor && s->type != ArgType::OptionalTensor)) continue;
      if (a.arg.kind == K::Tensor || (a.arg.kind == K::None && s->type == ArgType::OptionalTensor)) continue;
      if (a.arg.kind == K::Int || a.arg.kind == K::Float || a.arg.kind == K::Bool) {
        std::optional<ScalarType> like;
        for (const auto& b : args)
          if (b.arg.kind == K::Tensor && !like) like = meta_of(std::get<ValueId>(b.arg.payload)).dtype;
        ScalarType dt = like ? *like : metas.empty() ? ScalarType::Float : metas[0].dtype;
        if (a.arg.kind == K::Float && dt != ScalarType::Float && dt != ScalarType::Double && dt != ScalarType::Half &&
            dt != ScalarType::BFloat16)
          dt = ScalarType::Float;
        if (a.arg.kind == K::Int && dt == ScalarType::Bool) dt = ScalarType::Long;
        a.arg = tensor_arg(scalar_tensor(a.arg, dt));
        continue;
      }
      fail("cannot lower node '{}' ({}): argument '{}' of {} must be a tensor, not {}", current_ ? current_->name : "",
           current_ ? current_->target : "", a.name, target, graph::argument_kind_name(a.arg.kind));
    }
  }

  ValueId emit(std::string_view target, std::vector<NamedArgument> args, TensorMeta meta, std::string_view hint = {}) {
    return emit_raw(target, std::move(args), {std::move(meta)}, hint)[0];
  }

  bool all_inputs_constant(const Node& node) const {
    for (const auto& in : node.inputs)
      for (ValueId v : in.arg.tensor_ids())
        if (!out_.is_constant(v)) return false;
    return true;
  }

  bool try_fold(const Node& node, const OpSchema& schema) {
    if (no_fold_ || !all_inputs_constant(node)) return false;
    std::vector<ValueId> outs = node.output_ids();
    if (is_view_like(node.target)) {  // same bytes, new shape: share the constant's data
      ValueId in = node.inputs[0].arg.tensor_ids().at(0);
      const auto& in_meta = out_.graph.value(in).meta;
      if (in_meta.dtype == out_.graph.value(outs[0]).meta.dtype) {
        out_.constants[outs[0]] = out_.constants.at(in);
        ++folded_;
        return true;
      }
    }
    int64_t out_bytes = 0;
    for (ValueId v : outs) out_bytes += out_.graph.value(v).meta.nbytes();
    if (!force_fold_) {
      if (out_bytes > kFoldLimitBytes) return false;
      // A computed copy of a weight that stays in use would store it twice (a smaller result, e.g. the
      // product of a tied weight and a constant vector, is folded).
      for (const auto& in : node.inputs)
        for (ValueId v : in.arg.tensor_ids())
          if (is_shared_weight(v) && out_bytes >= out_.graph.value(v).meta.nbytes()) return false;
    }
    std::string why;
    auto result = evaluate_constant_node(out_, node, schema, &why);
    if (!result) return false;
    for (size_t i = 0; i < outs.size(); ++i)
      out_.constants[outs[i]] = ConstantData{nullptr, std::make_shared<const std::vector<std::byte>>(std::move((*result)[i])),
                                             fmt::format("{} (folded)", node.name)};
    ++folded_;
    return true;
  }

  // ---- source argument access --------------------------------------------
  [[noreturn]] void unsupported(const Node& n, const std::string& why) const {
    std::string where = source_location(n.stack_trace);
    fail("cannot lower node '{}' ({}){}: {}", n.name, n.target, where.empty() ? "" : " at " + where, why);
  }

  const Argument* opt(const Node& n, std::string_view name) const {
    const auto* a = n.input(name);
    return a ? &a->arg : nullptr;
  }

  const Argument& arg(const Node& n, std::string_view name) const {
    const auto* a = opt(n, name);
    if (!a) unsupported(n, fmt::format("missing argument '{}'", name));
    return *a;
  }

  ValueId mapped(ValueId src) const {
    auto v = vmap_.at(static_cast<size_t>(src));
    if (!v) fail("internal: tensor '{}' used before it was lowered", ep_.graph.value(src).name);
    return *v;
  }

  ValueId tensor_in(const Node& n, std::string_view name) const {
    const Argument& a = arg(n, name);
    if (a.kind != Argument::Kind::Tensor) unsupported(n, fmt::format("argument '{}' is not a tensor", name));
    return mapped(std::get<ValueId>(a.payload));
  }

  std::optional<ValueId> opt_tensor_in(const Node& n, std::string_view name) const {
    const Argument* a = opt(n, name);
    if (!a || a->kind == Argument::Kind::None) return std::nullopt;
    return tensor_in(n, name);
  }

  int64_t int_in(const Node& n, std::string_view name, std::optional<int64_t> dflt = std::nullopt) const {
    const Argument* a = opt(n, name);
    if (!a || a->kind == Argument::Kind::None) {
      if (dflt) return *dflt;
      unsupported(n, fmt::format("missing argument '{}'", name));
    }
    if (a->kind == Argument::Kind::Int) return std::get<int64_t>(a->payload);
    if (a->kind == Argument::Kind::Bool) return std::get<bool>(a->payload) ? 1 : 0;
    unsupported(n, fmt::format("argument '{}' is not an int", name));
  }

  std::vector<int64_t> ints_in(const Node& n, std::string_view name) const {
    const Argument& a = arg(n, name);
    if (a.kind == Argument::Kind::Ints) return std::get<std::vector<int64_t>>(a.payload);
    if (a.kind == Argument::Kind::Int) return {std::get<int64_t>(a.payload)};
    unsupported(n, fmt::format("argument '{}' is not an int list", name));
  }

  std::optional<ScalarType> dtype_in(const Node& n, std::string_view name = "dtype") const {
    const Argument* a = opt(n, name);
    if (!a || a->kind == Argument::Kind::None) return std::nullopt;
    if (a->kind != Argument::Kind::ScalarType) unsupported(n, fmt::format("argument '{}' is not a dtype", name));
    return std::get<ScalarType>(a->payload);
  }

  // A node argument remapped onto edge values.
  Argument remap(const Argument& a) const {
    Argument r = a;
    switch (a.kind) {
      case Argument::Kind::Tensor: r.payload = mapped(std::get<ValueId>(a.payload)); break;
      case Argument::Kind::Tensors: {
        std::vector<ValueId> ids;
        for (ValueId v : std::get<std::vector<ValueId>>(a.payload)) ids.push_back(mapped(v));
        r.payload = std::move(ids);
        break;
      }
      case Argument::Kind::OptionalTensors: {
        std::vector<std::optional<ValueId>> ids;
        for (const auto& v : std::get<std::vector<std::optional<ValueId>>>(a.payload))
          ids.push_back(v ? std::optional<ValueId>(mapped(*v)) : std::nullopt);
        r.payload = std::move(ids);
        break;
      }
      default: break;
    }
    return r;
  }

  std::vector<ValueId> source_outputs(const Node& n) const { return n.output_ids(); }
  TensorMeta out_meta(const Node& n, size_t i = 0) const {
    auto outs = source_outputs(n);
    if (i >= outs.size()) unsupported(n, "node has fewer outputs than its operator returns");
    return contiguous(ep_.graph.value(outs[i]).meta);
  }
  const TensorMeta& meta_of(ValueId edge_value) const { return out_.graph.value(edge_value).meta; }

  void bind(const Node& n, ValueId v, size_t i = 0) {
    auto outs = source_outputs(n);
    if (i < outs.size()) vmap_[static_cast<size_t>(outs[i])] = v;
  }
  void bind_all(const Node& n, const std::vector<ValueId>& vs) {
    auto outs = source_outputs(n);
    for (size_t i = 0; i < outs.size() && i < vs.size(); ++i) vmap_[static_cast<size_t>(outs[i])] = vs[i];
  }

  // ---- building blocks -----------------------------------------------------
  ValueId view(ValueId x, std::vector<int64_t> sizes) {
    const auto& m = meta_of(x);
    if (m.sizes == sizes) return x;
    TensorMeta meta = contiguous(m.dtype, sizes);
    return emit("aten.view_copy.default", {NA("self", tensor_arg(x)), NA("size", ints_arg(sizes))}, meta, "view");
  }

  ValueId permute(ValueId x, std::vector<int64_t> dims, std::string_view hint = "permute") {
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

  // y = x @ W^T with W a tied weight: (W @ x^T)^T, so W is neither copied
  // per run nor stored transposed. `bias` is added after.
  ValueId matmul_shared_transposed(ValueId x, ValueId w, std::optional<ValueId> bias, const TensorMeta& m) {
    const auto& xm = meta_of(x);
    int64_t rows = xm.sizes.at(0), out_features = meta_of(w).sizes.at(0);
    ValueId xt = permute(x, {1, 0}, "x_t");
    ValueId yt = emit("aten.mm.default", {NA("self", tensor_arg(w)), NA("mat2", tensor_arg(xt))},
                      contiguous(m.dtype, {out_features, rows}), "mm_t");
    ValueId y = permute(yt, {1, 0}, "y");
    if (bias) y = emit("aten.add.Tensor", {NA("self", tensor_arg(y)), NA("other", tensor_arg(*bias))}, m, "bias");
    return y;
  }

  ValueId expand(ValueId x, const std::vector<int64_t>& sizes) {
    const auto& m = meta_of(x);
    if (m.sizes == sizes) return x;
    return emit("aten.expand_copy.default", {NA("self", tensor_arg(x)), NA("size", ints_arg(sizes))},
                contiguous(m.dtype, sizes), "expand");
  }

  ValueId convert(ValueId x, ScalarType dtype) {
    const auto& m = meta_of(x);
    if (m.dtype == dtype) return x;
    std::vector<int64_t> order(m.sizes.size());
    std::iota(order.begin(), order.end(), 0);
    return emit("dim_order_ops._to_dim_order_copy.default",
                {NA("self", tensor_arg(x)), NA("non_blocking", bool_arg(false)), NA("dim_order", ints_arg(order))},
                contiguous(dtype, m.sizes), "to");
  }

  ValueId scalar_tensor(const Argument& scalar, ScalarType dtype) {
    return emit("aten.scalar_tensor.default", {NA("s", scalar)}, contiguous(dtype, {}), "scalar");
  }

  // The transposed weight of a linear layer: computed ahead of time when the
  // weight's storage is read by this node only (the original then disappears),
  // otherwise at run time so a tied weight is stored once.
  // A weight from the .pt2 whose storage other nodes read too (tied parameters).
  bool is_shared_weight(ValueId v) {
    auto c = out_.constants.find(v);
    if (c == out_.constants.end() || c->second.source == nullptr) return false;
    return storage_uses_[storage_key(*c->second.source)] > 1;
  }

  ValueId transposed_weight(ValueId w) {
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

  static int64_t wrap_dim(int64_t d, size_t rank) { return d < 0 ? d + static_cast<int64_t>(rank) : d; }

  // ---- the rewrite of one source node ---------------------------------------
  void lower(const Node& n) {
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
      const auto& xm = meta_of(x);
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

  ValueId matmul(const Node& n, ValueId a, ValueId b, const TensorMeta& m) {
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

  // The edge node that computes `v`, if it is `target`.
  const Node* produced_by(ValueId v, std::string_view target) const {
    int32_t p = out_.graph.values[static_cast<size_t>(v)].producer;
    if (p < 0 || static_cast<size_t>(p) >= out_.graph.nodes.size()) return nullptr;
    const Node& node = out_.graph.nodes[static_cast<size_t>(p)];
    if (node.target != target || node.inputs.empty() || node.inputs[0].arg.kind != Argument::Kind::Tensor)
      return nullptr;
    return &node;
  }

  // Grouped-query attention written out (transformers' repeat_kv: x[:, :, None].expand(b, hk, G, s, d)
  // .reshape(b, hk * G, s, d)): `v` [..., hk*G, S, D] repeats each head of x [..., hk, S, D] G times.
  // Returns x and G when `v` is that view of that expand (heads on axis `rank - 3`).
  struct HeadRepeat {
    ValueId x;
    int64_t groups;
  };
  std::optional<HeadRepeat> head_repeat(ValueId v) const {
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

  // a [..., hk*G, M, K] @ b, where b (or b with its last two axes swapped) repeats each of hk heads G times:
  // the G query heads of a group become the rows of one bmm against the unrepeated head, so neither K
  // nor V is copied G times (the copy is what the repeat costs: XNNPACK materialises it every call).
  std::optional<ValueId> grouped_matmul(ValueId a, ValueId b, const TensorMeta& m) {
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

  // ---- rewrite families, one file each (rewrites_<family>.cpp); each returns
  // true when it lowered `n` (bound its outputs), false when `n` is not its op.
  bool lower_decomposition(const Node& n);  // decompositions.cpp: the table of rewrites by operator
  bool lower_attention(const Node& n);  // SDPA, norms, activations
  bool lower_conv(const Node& n);       // convolutions, pooling, resizing, batch norm
  ValueId constant_tensor(ScalarType dtype, std::vector<int64_t> sizes, std::vector<std::byte> bytes,
                          std::string_view hint);  // rewrites_conv.cpp
  ValueId resize_dim(ValueId x, size_t dim, const std::vector<std::vector<int64_t>>& idx,
                     const std::vector<std::vector<float>>& w);  // rewrites_conv.cpp
  bool try_fold_batch_norm(const Node& n, ValueId x, std::optional<ValueId> gamma, std::optional<ValueId> beta,
                           ValueId mean, ValueId var, double eps);  // rewrites_conv.cpp
  std::optional<std::pair<ValueId, ValueId>> batch_norm_scale_shift(ValueId x, std::optional<ValueId> gamma,
                                                                    std::optional<ValueId> beta, ValueId mean,
                                                                    ValueId var, double eps);  // rewrites_conv.cpp
  bool lower_sequence(const Node& n);   // RNNs, einsum, sort/topk, scatter/gather, index ops
  void lower_rnn(const Node& n, int cell);  // (rewrites_sequence.cpp)
  void lower_einsum(const Node& n);
  bool lower_math(const Node& n);        // norms and distances (rewrites_math.cpp)
  void lower_vector_norm(const Node& n);
  double number_in(const Node& n, std::string_view name, double dflt) const;
  bool lower_state(const Node& n);      // mutable buffers, dynamic shapes
  bool lower_data(const Node& n);       // diagonals, as_strided, index_fill/add, circular pad (rewrites_data.cpp)
  // Programs quantized before export (rewrites_quant.cpp): torchao's affine quantization ops.
  bool lower_quant(const Node& n);
  bool lower_decomposed_quant(const Node& n);  // PT2E's quantized_decomposed.* ops
  void bind_quantized_weight(const Node& n, ValueId q, ValueId s, std::optional<ValueId> z, int64_t qmin,
                             int64_t qmax, int64_t group);
  struct ActQuant {
    ValueId x;                   // source value quantized per token
    std::vector<int64_t> block;  // block_size
  };
  std::map<ValueId, ActQuant> act_qparams_;  // source scale / zero point -> what choose_qparams read
  std::map<ValueId, ActQuant> act_quantized_;  // source int8 activation -> what it quantizes
  std::set<ValueId> fake_quant_src_;          // source values: activations quantized and dequantized per token
  std::set<ValueId> quantized_weight_src_;    // source values: dequantize_affine of a quantized weight
  // Mutable state (rewrites_state.cpp): which buffers the program mutates, the
  // value each holds at the end of a call, and the in-place write of that value.
  bool is_mutated_buffer(const std::string& fqn) const;
  void bind_buffer_mutation(const graph::OutputSpec& spec, const Argument& value);
  void finish_state();
  static bool writes_state(const Node& n);
  struct BufferWrite {
    ValueId buffer;  // edge value of the mutable buffer
    ValueId value;   // edge value it must hold when the call returns
  };
  std::vector<BufferWrite> buffer_writes_;
  // User inputs the program updates (USER_INPUT_MUTATION: caches passed in by the caller): input -> its name,
  // and the value each must hold when the call returns, with the position of the output that returns it.
  std::map<ValueId, std::string> mutated_inputs_;
  struct InputWrite {
    ValueId input;
    ValueId value;
    size_t output;  // index into out_.outputs
  };
  std::vector<InputWrite> input_writes_;
  void bind_input_mutation(const graph::OutputSpec& spec, const Argument& value);

  const pt2::ExportedProgram& ep_;
  LoweringStats* stats_;
  EdgeProgram out_;
  std::vector<std::optional<ValueId>> vmap_;
  std::map<std::string, int64_t> storage_uses_;
  std::map<ValueId, ValueId> transpose_of_shared_;  // permute(W,[1,0]) -> W, for tied weights
  const Node* current_ = nullptr;
  bool no_fold_ = false;  // the node being lowered has symbolic arguments
  int64_t folded_ = 0;
  int name_counter_ = 0;
  bool force_fold_ = false;
  EdgeOptions options_;
};

}  // namespace kiln::passes::detail
