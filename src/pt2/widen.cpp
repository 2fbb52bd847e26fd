// widen_to_float (pt2_reader.h): a bfloat16 / float16 program as float32, its constants widened as read; its user
// inputs and outputs keep their 16-bit type unless asked, converted at the program's edges.
#include "kiln/core/error.h"
#include "kiln/pt2/pt2_reader.h"

#include <map>

namespace kiln::pt2 {

namespace {

using graph::Argument;
using graph::ValueId;

// Every read of `from` in the nodes and the graph outputs reads `to` instead.
void replace_reads(graph::Graph& g, ValueId from, ValueId to) {
  auto swap_in = [&](Argument& a) {
    if (a.kind == Argument::Kind::Tensor) {
      auto& v = std::get<ValueId>(a.payload);
      if (v == from) v = to;
    } else if (a.kind == Argument::Kind::Tensors) {
      for (auto& v : std::get<std::vector<ValueId>>(a.payload))
        if (v == from) v = to;
    } else if (a.kind == Argument::Kind::OptionalTensors) {
      for (auto& v : std::get<std::vector<std::optional<ValueId>>>(a.payload))
        if (v && *v == from) v = to;
    }
  };
  for (auto& n : g.nodes)
    for (auto& a : n.inputs) swap_in(a.arg);
  for (auto& a : g.outputs) swap_in(a);
}

graph::Node to_copy(std::string name, ValueId in, ScalarType dtype, ValueId out) {
  graph::Node n;
  n.name = std::move(name);
  n.target = "aten._to_copy.default";
  n.inputs.push_back({"self", Argument::tensor(in), false});
  n.inputs.push_back({"dtype", Argument{Argument::Kind::ScalarType, dtype}, true});
  n.outputs.push_back(Argument::tensor(out));
  n.source_nodes.push_back(n.name);
  return n;
}

}  // namespace

std::optional<ScalarType> widen_to_float(ExportedProgram& ep, WidenIo io) {
  auto half = [](ScalarType t) { return t == ScalarType::BFloat16 || t == ScalarType::Half; };
  std::optional<ScalarType> from;
  auto see = [&](ScalarType t, std::string_view where) {
    if (!half(t)) return false;
    check(!from || *from == t, "{}: the program has both bfloat16 and float16 values ({} is {}): kiln widens one "
                               "16-bit float type to float32 per program",
          ep.path, where, dtype_name(t));
    from = t;
    return true;
  };
  graph::Graph& g = ep.graph;
  // The edges that keep their type: 16-bit user inputs the program does not write (a written one is state the
  // program updates in place, an external KV cache: it stays float32 like a buffer, or every call would convert
  // all of it twice), and 16-bit user outputs.
  std::vector<std::pair<ValueId, ScalarType>> kept_inputs;
  std::vector<std::pair<size_t, ScalarType>> kept_outputs;
  if (io == WidenIo::Keep) {
    std::map<std::string, bool, std::less<>> written;
    for (const auto& s : ep.signature.outputs)
      if (s.kind == graph::OutputSpec::Kind::UserInputMutation) written[s.target] = true;
    for (size_t i = 0; i < g.inputs.size() && i < ep.signature.inputs.size(); ++i) {
      const auto& s = ep.signature.inputs[i];
      const ScalarType t = g.value(g.inputs[i]).meta.dtype;
      if (s.kind == graph::InputSpec::Kind::UserInput && half(t) && !written.count(s.arg_name))
        kept_inputs.emplace_back(g.inputs[i], t);
    }
    for (size_t i = 0; i < g.outputs.size() && i < ep.signature.outputs.size(); ++i) {
      if (ep.signature.outputs[i].kind != graph::OutputSpec::Kind::UserOutput) continue;
      if (g.outputs[i].kind != Argument::Kind::Tensor) continue;
      const ScalarType t = g.value(std::get<ValueId>(g.outputs[i].payload)).meta.dtype;
      if (half(t)) kept_outputs.emplace_back(i, t);
    }
  }
  for (auto& v : g.values)
    if (see(v.meta.dtype, v.name)) v.meta.dtype = ScalarType::Float;
  for (auto& c : ep.constants)
    if (see(c.meta.dtype, c.name)) {
      c.stored_dtype = c.meta.dtype;
      c.meta.dtype = ScalarType::Float;
    }
  for (auto& n : g.nodes)
    for (auto& a : n.inputs)
      if (a.arg.kind == graph::Argument::Kind::ScalarType) {
        auto& t = std::get<ScalarType>(a.arg.payload);
        if (see(t, n.name)) t = ScalarType::Float;
      }
  if (!from) return from;
  ep.widened_from = from;
  ep.io_widened = io == WidenIo::Widen;
  if (kept_inputs.empty() && kept_outputs.empty()) return from;

  // Each kept input read through a float32 copy, made first; each kept output a 16-bit copy of the float32
  // value, made last (one per value returned, however often).
  std::vector<graph::Node> first;
  for (auto [v, t] : kept_inputs) {
    const std::string name = "kiln_widened_" + g.value(v).name;
    graph::TensorMeta meta = g.value(v).meta;  // Float now
    const ValueId wide = g.add_value(name, meta);
    replace_reads(g, v, wide);
    g.values[static_cast<size_t>(v)].meta.dtype = t;
    first.push_back(to_copy(name, v, ScalarType::Float, wide));
  }
  std::map<ValueId, ValueId> narrowed;
  for (auto [i, t] : kept_outputs) {
    const ValueId v = std::get<ValueId>(g.outputs[i].payload);
    auto it = narrowed.find(v);
    if (it == narrowed.end()) {
      const std::string name = "kiln_narrowed_" + g.value(v).name;
      graph::TensorMeta meta = g.value(v).meta;
      meta.dtype = t;
      const ValueId narrow = g.add_value(name, meta);
      g.nodes.push_back(to_copy(name, v, t, narrow));
      it = narrowed.emplace(v, narrow).first;
    }
    g.outputs[i] = Argument::tensor(it->second);
    ep.signature.outputs[i].arg_name = g.value(it->second).name;
  }
  g.nodes.insert(g.nodes.begin(), std::make_move_iterator(first.begin()), std::make_move_iterator(first.end()));
  for (auto& v : g.values) v.producer = -1;
  for (size_t i = 0; i < g.nodes.size(); ++i)
    for (ValueId v : g.nodes[i].output_ids()) g.values[static_cast<size_t>(v)].producer = static_cast<int32_t>(i);
  return from;
}

}  // namespace kiln::pt2
