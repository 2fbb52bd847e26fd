// Functionalization (kiln/passes/functionalize.h): the default IR's in-place
// operators -> torch's functional form, one walk over the graph.
//
// Model (torch's functionalization): every tensor value is either a base (a
// placeholder or the result of a non-view operator) or an alias of one, made by
// a chain of view operators. A base has a current value and a version; an
// alias is materialized from its base's current value and re-materialized
// (its view chain replayed) when it is read after the base changed. A write
// into an alias computes the new alias value, then writes it back link by link
// down the view chain (each view operator's scatter), ending in a new current
// value for the base.
#include "kiln/passes/functionalize.h"

#include "kiln/core/error.h"
#include "kiln/ops/op_id.h"
#include "lowerer.h"  // detail::source_location

#include <algorithm>
#include <map>
#include <numeric>
#include <optional>

namespace kiln::passes {
namespace {

using graph::Argument;
using graph::NamedArgument;
using graph::Node;
using graph::TensorMeta;
using graph::ValueId;

// How a write into a view goes back into its base.
enum class ViewKind {
  Identity,  // the same elements (alias, detach, a same-dtype `to`): the new value itself
  Slice,     // slice_scatter
  Select,    // select_scatter
  Reshape,   // view back to the base's sizes
  Transpose, // the same transposition again
  Permute,   // the inverse permutation
  Expand,    // not writable (eager refuses an in-place write into an expanded tensor)
  Other,     // index_put through the view's index map (diagonal, as_strided, split, unbind, narrow, ...)
};

struct ViewOp {
  std::string_view target;
  ViewKind kind;
};

// The view operators of the default IR ("aten.reshape" / "flatten" / "contiguous" / "to" are views only
// when their input allows; see view_kind).
constexpr ViewOp kViews[] = {
    {"aten.alias.default", ViewKind::Identity},        {"aten.detach.default", ViewKind::Identity},
    {"aten.lift_fresh.default", ViewKind::Identity},   {"aten.contiguous.default", ViewKind::Identity},
    {"aten.to.dtype", ViewKind::Identity},             {"aten.to.dtype_layout", ViewKind::Identity},
    {"aten.to.device", ViewKind::Identity},            {"aten.type_as.default", ViewKind::Identity},
    {"aten.slice.Tensor", ViewKind::Slice},            {"aten.select.int", ViewKind::Select},
    {"aten.view.default", ViewKind::Reshape},          {"aten._unsafe_view.default", ViewKind::Reshape},
    {"aten.reshape.default", ViewKind::Reshape},       {"aten.flatten.using_ints", ViewKind::Reshape},
    {"aten.unflatten.int", ViewKind::Reshape},         {"aten.view_as.default", ViewKind::Reshape},
    {"aten.reshape_as.default", ViewKind::Reshape},    {"aten.squeeze.default", ViewKind::Reshape},
    {"aten.squeeze.dim", ViewKind::Reshape},           {"aten.squeeze.dims", ViewKind::Reshape},
    {"aten.unsqueeze.default", ViewKind::Reshape},     {"aten.transpose.int", ViewKind::Transpose},
    {"aten.swapaxes.default", ViewKind::Transpose},    {"aten.swapdims.default", ViewKind::Transpose},
    {"aten.t.default", ViewKind::Transpose},           {"aten.permute.default", ViewKind::Permute},
    {"aten.transpose.default", ViewKind::Transpose},  // transpose_'s functional name (torch's is transpose.int)
    {"aten.expand.default", ViewKind::Expand},         {"aten.expand_as.default", ViewKind::Expand},
    {"aten.diagonal.default", ViewKind::Other},        {"aten.as_strided.default", ViewKind::Other},
    {"aten.narrow.default", ViewKind::Other},          {"aten.split.Tensor", ViewKind::Other},
    {"aten.split_with_sizes.default", ViewKind::Other}, {"aten.chunk.default", ViewKind::Other},
    {"aten.unbind.int", ViewKind::Other},              {"aten.tensor_split.sections", ViewKind::Other},
    {"aten.tensor_split.indices", ViewKind::Other},    {"aten.unfold.default", ViewKind::Other},
    {"aten.movedim.int", ViewKind::Other},             {"aten.movedim.intlist", ViewKind::Other},
};

const ViewOp* find_view(std::string_view target) {
  for (const auto& v : kViews)
    if (v.target == target) return &v;
  return nullptr;
}

struct Inplace {
  std::string functional;   // functional target
  std::string mutated_arg;  // the argument the operator writes
};

// " at file.py:12" from the node's stack_trace, as the lowerer's messages name it (empty without one).
std::string at_source(const Node& n) {
  std::string where = detail::source_location(n.stack_trace);
  return where.empty() ? where : " at " + where;
}

std::optional<Inplace> inplace_of(const Node& n) {
  std::string_view t = n.target;
  const size_t dot1 = t.find('.'), dot2 = t.rfind('.');
  if (dot1 == std::string_view::npos || dot2 == dot1) return std::nullopt;
  std::string_view ns = t.substr(0, dot1), name = t.substr(dot1 + 1, dot2 - dot1 - 1), overload = t.substr(dot2 + 1);
  if (ns != "aten" || name.empty()) return std::nullopt;
  const std::string self = n.input("self") || n.inputs.empty() ? "self" : n.inputs[0].name;
  if (name.size() > 4 && name.starts_with("__i") && name.ends_with("__"))  // __iand__ -> __and__
    return Inplace{fmt::format("aten.__{}.{}", name.substr(3), overload), self};
  if (name.size() > 1 && name.back() == '_' && !name.starts_with("__"))  // mul_ -> mul
    return Inplace{fmt::format("aten.{}.{}", name.substr(0, name.size() - 1), overload), self};
  if ((overload == "out" || overload.ends_with("_out")) && n.input("out")) {  // add.out -> add.Tensor
    auto id = ops::find_op(fmt::format("aten::{}", name), overload);
    if (!id || ops::op_info(*id).target.empty())
      fail("cannot lower node '{}' ({}){}: kiln knows no functional form of this out= overload", n.name, n.target,
           at_source(n));
    return Inplace{std::string(ops::op_info(*id).target), "out"};
  }
  return std::nullopt;
}

class Functionalizer {
 public:
  explicit Functionalizer(pt2::ExportedProgram& ep) : ep_(ep), g_(ep.graph) {}

  void run() {
    old_ = std::move(g_.nodes);
    g_.nodes.clear();
    for (size_t i = 0; i < old_.size(); ++i) {
      if (auto ip = inplace_of(old_[i]); ip && rebinds(*ip)) {
        // unsqueeze_, t_, transpose_, squeeze_, as_strided_: a change of the tensor's shape or strides, not of
        // its values. torch.export already gives the later readers the in-place node's result, so that result
        // is the functional view of the tensor it changed: an alias, written back through that view's scatter.
        old_[i].target = ip->functional == "aten.transpose.default" ? "aten.transpose.int" : ip->functional;
      }
      const Node& n = old_[i];
      if (auto ip = inplace_of(n)) {
        lower_inplace(n, *ip);
      } else if (const ViewOp* v = view_of(n)) {
        Node c = n;
        read_inputs(c);
        push(std::move(c));
        ValueId self = std::get<ValueId>(n.input("self")->arg.payload);
        int out = 0;
        for (ValueId o : n.output_ids()) {
          alias_[o] = Alias{v->kind, static_cast<int32_t>(i), out++, self};
          mat_[o] = {version_[root(o)], o};
        }
      } else {
        Node c = n;
        read_inputs(c);
        push(std::move(c));
      }
    }
    for (auto& o : g_.outputs) o = read_arg(o);
    add_mutation_outputs();
    for (auto& v : g_.values) v.producer = -1;
    for (size_t i = 0; i < g_.nodes.size(); ++i)
      for (ValueId v : g_.nodes[i].output_ids()) g_.values[static_cast<size_t>(v)].producer = static_cast<int32_t>(i);
  }

 private:
  struct Alias {
    ViewKind kind;
    int32_t node;    // the view node (index into old_); -1 for the result of an in-place node (same as `input`)
    int out;         // which of its outputs
    ValueId input;   // the value it views
  };

  const TensorMeta& meta(ValueId v) const { return g_.value(v).meta; }

  // An in-place operator whose functional form is a view that changes the shape or strides (not detach_).
  static bool rebinds(const Inplace& ip) {
    const ViewOp* v = find_view(ip.functional);
    return v && v->kind != ViewKind::Identity && ip.mutated_arg == "self";
  }

  // The node is a view of its `self` here (reshape of a non-contiguous tensor copies, and so on).
  const ViewOp* view_of(const Node& n) const {
    const ViewOp* v = find_view(n.target);
    const auto* self = n.input("self");
    if (!v || !self || self->arg.kind != Argument::Kind::Tensor) return nullptr;
    const TensorMeta& in = meta(std::get<ValueId>(self->arg.payload));
    const auto outs = n.output_ids();
    if (outs.empty()) return nullptr;
    const TensorMeta& out = meta(outs[0]);
    if (v->kind == ViewKind::Identity) {
      if (out.dtype != in.dtype || out.sizes != in.sizes) return nullptr;      // a conversion: a new tensor
      if (n.target == "aten.contiguous.default" && !in.is_contiguous()) return nullptr;
      if (const auto* c = n.input("copy"); c && c->arg.kind == Argument::Kind::Bool && std::get<bool>(c->arg.payload))
        return nullptr;
    }
    if ((n.target == "aten.reshape.default" || n.target == "aten.flatten.using_ints" ||
         n.target == "aten.reshape_as.default") && !in.is_contiguous())
      return nullptr;  // (torch views some non-contiguous reshapes too; kiln treats them as the copy torch may make)
    return v;
  }

  ValueId root(ValueId v) const {
    for (auto it = alias_.find(v); it != alias_.end(); it = alias_.find(v)) v = it->second.input;
    return v;
  }

  std::string fresh(std::string_view hint) {
    std::string name = std::string(hint);
    while (g_.find_value(name)) name = fmt::format("{}_{}", hint, ++counter_);
    return name;
  }

  ValueId new_value(const TensorMeta& m, std::string_view hint) { return g_.add_value(fresh(hint), m); }

  void push(Node n) { g_.nodes.push_back(std::move(n)); }

  Node derived(const Node& from, std::string target, std::string_view suffix) {
    Node n;
    n.name = fmt::format("{}_{}", from.name, suffix);
    n.target = std::move(target);
    n.stack_trace = from.stack_trace;
    n.module_path = from.module_path;
    n.module_type = from.module_type;
    n.source_nodes = {from.name};
    n.symbolic = from.symbolic;
    return n;
  }

  // The current value of old value v (materializing a stale alias).
  ValueId read(ValueId v) {
    auto a = alias_.find(v);
    if (a == alias_.end()) {
      auto c = cur_.find(v);
      return c == cur_.end() ? v : c->second;
    }
    if (a->second.node < 0) return read(a->second.input);
    const int ver = version_[root(v)];
    if (auto m = mat_.find(v); m != mat_.end() && m->second.first == ver) return m->second.second;
    // replay the view node on the current value of what it views
    const Node& view = old_[static_cast<size_t>(a->second.node)];
    const ValueId base = read(a->second.input);
    auto outs = replay(view, base, std::nullopt, "regen");
    const auto old_outs = view.output_ids();
    for (size_t k = 0; k < outs.size(); ++k) mat_[old_outs[k]] = {ver, outs[k]};
    return outs.at(static_cast<size_t>(a->second.out));
  }

  // A copy of view node `view` reading `self` (other tensor arguments read as they are now), with fresh
  // outputs (in `dtype` if given). Returns the outputs in order.
  std::vector<ValueId> replay(const Node& view, ValueId self, std::optional<ScalarType> dtype, std::string_view suffix) {
    Node c = view;
    c.name = fmt::format("{}_{}", view.name, suffix);
    c.source_nodes = {view.name};
    for (auto& in : c.inputs) {
      if (in.name == "self") in.arg = Argument::tensor(self);
      else in.arg = read_arg(in.arg);
    }
    std::vector<ValueId> outs;
    for (auto& o : c.outputs) {
      auto fresh_of = [&](ValueId old) {
        TensorMeta m = meta(old);
        if (dtype) m.dtype = *dtype;
        ValueId v = new_value(m, c.name);
        outs.push_back(v);
        return v;
      };
      if (o.kind == Argument::Kind::Tensor) {
        o.payload = fresh_of(std::get<ValueId>(o.payload));
      } else if (o.kind == Argument::Kind::Tensors) {
        std::vector<ValueId> ids;
        for (ValueId v : std::get<std::vector<ValueId>>(o.payload)) ids.push_back(fresh_of(v));
        o.payload = std::move(ids);
      }
    }
    push(std::move(c));
    return outs;
  }

  Argument read_arg(const Argument& a) {
    Argument r = a;
    switch (a.kind) {
      case Argument::Kind::Tensor: r.payload = read(std::get<ValueId>(a.payload)); break;
      case Argument::Kind::Tensors: {
        auto ids = std::get<std::vector<ValueId>>(a.payload);
        for (auto& v : ids) v = read(v);
        r.payload = std::move(ids);
        break;
      }
      case Argument::Kind::OptionalTensors: {
        auto ids = std::get<std::vector<std::optional<ValueId>>>(a.payload);
        for (auto& v : ids)
          if (v) v = read(*v);
        r.payload = std::move(ids);
        break;
      }
      default: break;
    }
    return r;
  }

  void read_inputs(Node& n) {
    for (auto& in : n.inputs) in.arg = read_arg(in.arg);
  }

  ValueId emit1(const Node& at, std::string target, std::vector<NamedArgument> args, const TensorMeta& m,
                std::string_view suffix) {
    Node n = derived(at, std::move(target), suffix);
    n.inputs = std::move(args);
    ValueId v = new_value(m, n.name);
    n.outputs.push_back(Argument::tensor(v));
    push(std::move(n));
    return v;
  }

  static NamedArgument NA(std::string name, Argument a) { return {std::move(name), std::move(a), false}; }
  static Argument ints(std::vector<int64_t> v) { return {Argument::Kind::Ints, std::move(v)}; }

  ValueId view_as_sizes(const Node& at, ValueId x, const std::vector<int64_t>& sizes, std::string_view suffix) {
    TensorMeta m = meta(x);
    if (m.sizes == sizes) return x;
    TensorMeta out = m;
    out.sizes = sizes;
    out.strides.assign(sizes.size(), 1);
    for (size_t i = sizes.size(); i-- > 1;) out.strides[i - 1] = out.strides[i] * std::max<int64_t>(sizes[i], 1);
    out.sym_sizes.clear();
    if (m.sym_sizes.size() == sizes.size()) out.sym_sizes = m.sym_sizes;
    return emit1(at, "aten.view.default", {NA("self", Argument::tensor(x)), NA("size", ints(sizes))}, out, suffix);
  }

  // The new value of the base of `a` (currently `base`) once the view holds `value`.
  ValueId scatter(const Node& at, const Alias& a, ValueId old_base, ValueId base, ValueId value) {
    const Node& view = old_[static_cast<size_t>(a.node)];
    const TensorMeta bm = meta(old_base);  // a copy: the emits below add values, which may move the graph's storage
    auto copy_args = [&](std::initializer_list<const char*> names) {
      std::vector<NamedArgument> args{NA("self", Argument::tensor(base)), NA("src", Argument::tensor(value))};
      for (const char* nm : names)
        if (const auto* x = view.input(nm)) args.push_back(NA(nm, x->arg));
      return args;
    };
    switch (a.kind) {
      case ViewKind::Identity: return value;
      case ViewKind::Slice:
        if (meta(view.output_ids().at(0)).sizes == bm.sizes) return value;  // a full slice (x[:, 1:3]'s first dim)
        return emit1(at, "aten.slice_scatter.default", copy_args({"dim", "start", "end", "step"}), bm, "slice_scatter");
      case ViewKind::Select:
        return emit1(at, "aten.select_scatter.default", copy_args({"dim", "index"}), bm, "select_scatter");
      case ViewKind::Reshape: return view_as_sizes(at, value, bm.sizes, "unview");
      case ViewKind::Transpose: {
        std::vector<NamedArgument> args{NA("self", Argument::tensor(value))};
        for (const auto& in : view.inputs)
          if (in.name != "self") args.push_back(in);
        return emit1(at, view.target, std::move(args), bm, "untranspose");
      }
      case ViewKind::Permute: {
        const auto* d = view.input("dims");
        check(d && d->arg.kind == Argument::Kind::Ints, "node '{}' ({}): permute without dims", view.name, view.target);
        auto dims = std::get<std::vector<int64_t>>(d->arg.payload);
        const auto rank = static_cast<int64_t>(dims.size());
        std::vector<int64_t> inv(dims.size());
        for (int64_t i = 0; i < rank; ++i) inv[static_cast<size_t>((dims[static_cast<size_t>(i)] % rank + rank) % rank)] = i;
        return emit1(at, "aten.permute.default", {NA("self", Argument::tensor(value)), NA("dims", ints(inv))}, bm,
                     "unpermute");
      }
      case ViewKind::Expand:
        fail("cannot lower node '{}' ({}){}: it writes in place into an expanded view ('{}'), which PyTorch refuses "
             "too", at.name, at.target, at_source(at), view.name);
      case ViewKind::Other: break;
    }
    // Any other view: the flat positions of the view's elements in the base (the view applied to
    // arange(numel) shaped as the base: a constant the lowering folds), written with index_put.
    const int64_t numel = bm.numel();
    TensorMeta lm = bm;
    lm.dtype = ScalarType::Long;
    lm.sym_sizes.clear();
    TensorMeta flat = lm;
    flat.sizes = {numel};
    flat.strides = {1};
    ValueId r = emit1(at, "aten.arange.default", {NA("end", Argument::integer(numel))}, flat, "positions");
    ValueId shaped = view_as_sizes(at, r, bm.sizes, "positions");
    ValueId picked = replay(view, shaped, ScalarType::Long, "positions").at(static_cast<size_t>(a.out));
    const int64_t k = meta(picked).numel();
    ValueId idx = view_as_sizes(at, picked, {k}, "positions");
    ValueId base_flat = view_as_sizes(at, base, {numel}, "flat");
    ValueId value_flat = view_as_sizes(at, value, {k}, "flat");
    TensorMeta pm = meta(base_flat);
    ValueId put = emit1(at, "aten.index_put.default",
                        {NA("self", Argument::tensor(base_flat)),
                         NA("indices", {Argument::Kind::Tensors, std::vector<ValueId>{idx}}),
                         NA("values", Argument::tensor(value_flat)), NA("accumulate", {Argument::Kind::Bool, false})},
                        pm, "index_put");
    return view_as_sizes(at, put, bm.sizes, "unview");
  }

  // Old value m now holds `value` (a new value): write it back to its base.
  void write(const Node& at, ValueId m, ValueId value) {
    auto a = alias_.find(m);
    if (a == alias_.end()) {
      cur_[m] = value;
      ++version_[m];
      writer_[m] = at.name;
      return;
    }
    const Alias al = a->second;
    if (al.node < 0) {
      write(at, al.input, value);
      return;
    }
    const ValueId base = read(al.input);
    write(at, al.input, scatter(at, al, al.input, base, value));
    mat_[m] = {version_[root(m)], value};
  }

  void lower_inplace(const Node& n, const Inplace& ip) {
    const auto* target = n.input(ip.mutated_arg);
    if (!target || target->arg.kind != Argument::Kind::Tensor)
      fail("cannot lower node '{}' ({}){}: it writes argument '{}', which is not a tensor", n.name, n.target,
           at_source(n), ip.mutated_arg);
    const ValueId m = std::get<ValueId>(target->arg.payload);
    const auto outs = n.output_ids();
    if (const ViewOp* v = find_view(ip.functional)) {  // detach_ (unsqueeze_, t_, ... are views: run())
      if (v->kind != ViewKind::Identity)
        fail("cannot lower node '{}' ({}){}: an in-place change of a tensor's shape or strides; write the "
             "out-of-place form ({})", n.name, n.target, at_source(n), ip.functional);
      for (ValueId o : outs) alias_[o] = Alias{ViewKind::Identity, -1, 0, m};
      return;
    }
    Node f = n;
    f.target = ip.functional;
    f.source_nodes = {n.name};
    f.inputs.clear();
    for (const auto& in : n.inputs)
      if (!(ip.mutated_arg == "out" && in.name == "out")) f.inputs.push_back({in.name, read_arg(in.arg), in.keyword});
    const TensorMeta& mm = meta(m);
    ValueId v = new_value(mm, n.name + "_functional");
    f.outputs = {Argument::tensor(v)};
    push(std::move(f));
    write(n, m, v);
    for (ValueId o : outs) alias_[o] = Alias{ViewKind::Identity, -1, 0, m};
  }

  void add_mutation_outputs() {
    using OK = graph::OutputSpec::Kind;
    std::vector<Argument> outs;
    std::vector<graph::OutputSpec> specs;
    for (size_t i = 0; i < g_.inputs.size() && i < ep_.signature.inputs.size(); ++i) {
      const ValueId p = g_.inputs[i];
      if (!version_[p]) continue;
      const auto& in = ep_.signature.inputs[i];
      graph::OutputSpec s;
      if (in.kind == graph::InputSpec::Kind::UserInput) {
        s.kind = OK::UserInputMutation;
        s.target = in.arg_name;
      } else if (in.kind == graph::InputSpec::Kind::Buffer) {
        s.kind = OK::BufferMutation;
        s.target = in.target;
      } else {
        fail("{}: node '{}' writes {} '{}' in place; kiln lowers inference programs, whose parameters and constants "
             "do not change", ep_.path, writer_[p], graph::input_kind_name(in.kind), in.target);
      }
      for (const auto& o : ep_.signature.outputs)
        check(!(o.kind == s.kind && o.target == s.target), "{}: '{}' is both updated in place and returned as its "
              "mutation", ep_.path, s.target);
      const ValueId v = cur_.at(p);
      s.arg_name = g_.value(v).name;
      outs.push_back(Argument::tensor(v));
      specs.push_back(std::move(s));
    }
    outs.insert(outs.end(), g_.outputs.begin(), g_.outputs.end());
    specs.insert(specs.end(), ep_.signature.outputs.begin(), ep_.signature.outputs.end());
    g_.outputs = std::move(outs);
    ep_.signature.outputs = std::move(specs);
  }

  pt2::ExportedProgram& ep_;
  graph::Graph& g_;
  std::vector<Node> old_;
  std::map<ValueId, Alias> alias_;
  std::map<ValueId, ValueId> cur_;                    // base -> its current value
  std::map<ValueId, int> version_;                    // base -> how many writes so far
  std::map<ValueId, std::string> writer_;             // base -> the last node that wrote it
  std::map<ValueId, std::pair<int, ValueId>> mat_;    // alias -> (base version, its value at that version)
  int counter_ = 0;
};

}  // namespace

std::string inplace_functional_target(std::string_view target) {
  Node n;
  n.target = std::string(target);
  n.inputs.push_back({"self", Argument::none(), false});
  n.inputs.push_back({"out", Argument::none(), false});
  try {
    auto ip = inplace_of(n);
    return ip ? ip->functional : std::string();
  } catch (const Error&) {
    return {};
  }
}

bool needs_functionalization(const graph::Graph& g) {
  for (const Node& n : g.nodes)
    if (inplace_of(n)) return true;
  return false;
}

void functionalize(pt2::ExportedProgram& ep) { Functionalizer(ep).run(); }

}  // namespace kiln::passes
