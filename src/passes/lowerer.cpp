// The to-edge lowerer's frame (lowerer.h): inputs and outputs bound, nodes
// emitted (and folded on the spot with kiln's kernels), dead code removed.
#include "lowerer.h"

#include <algorithm>
#include <numeric>
#include <set>

namespace kiln::passes::detail {

EdgeProgram Lowerer::run() {
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

void Lowerer::count_storage_uses() {
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

void Lowerer::bind_inputs() {
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

void Lowerer::bind_outputs() {
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

void Lowerer::remove_dead_code() {
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

std::string Lowerer::fresh_name(std::string_view hint) {
  std::string base = current_ ? current_->name : "kiln";
  if (!hint.empty()) base += "_" + std::string(hint);
  std::string name = base;
  while (out_.graph.find_value(name)) name = fmt::format("{}_{}", base, ++name_counter_);
  return name;
}

// A sum or cumulative sum over a 0-d tensor is its one element (in the out's dtype): written as that copy, since
// ExecuTorch's sum.IntList_out and cumsum.out kernels abort its runtime on dim 0 of a 0-d tensor (a dim torch
// accepts there, and a core-ATen decomposition writes: logsumexp, nansum). Whoever emits the reduction, from the
// source graph or a rewrite, gets the copy.
std::optional<ValueId> Lowerer::reduction_of_a_0d_tensor(std::string_view target, const std::vector<NamedArgument>& args,
                                                         const std::vector<TensorMeta>& metas) {
  if (target != "aten.sum.dim_IntList" && target != "aten.cumsum.default" && target != "aten.mean.dim") return std::nullopt;
  if (metas.size() != 1 || !metas[0].sizes.empty()) return std::nullopt;
  for (const auto& a : args)
    if (a.name == "self" && a.arg.kind == Argument::Kind::Tensor) {
      const ValueId x = std::get<ValueId>(a.arg.payload);
      if (!meta_of(x).sizes.empty()) return std::nullopt;
      return emit("dim_order_ops._to_dim_order_copy.default",
                  {NA("self", tensor_arg(x)), NA("non_blocking", bool_arg(false)), NA("dim_order", ints_arg({}))},
                  contiguous(metas[0].dtype, {}), "reduced");
    }
  return std::nullopt;
}

std::vector<ValueId> Lowerer::emit_raw(std::string_view target, std::vector<NamedArgument> args, std::vector<TensorMeta> metas,
                              std::string_view hint) {
  if (auto copy = reduction_of_a_0d_tensor(target, args, metas)) return {*copy};
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

void Lowerer::check_argument_kinds(std::string_view target, const OpSchema& schema, std::vector<NamedArgument>& args,
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

bool Lowerer::all_inputs_constant(const Node& node) const {
  for (const auto& in : node.inputs)
    for (ValueId v : in.arg.tensor_ids())
      if (!out_.is_constant(v)) return false;
  return true;
}

bool Lowerer::try_fold(const Node& node, const OpSchema& schema) {
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

Argument Lowerer::remap(const Argument& a) const {
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

}  // namespace kiln::passes::detail
