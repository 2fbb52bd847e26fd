// to_edge rewrites: mutable buffers (the KV cache and any other state a program
// keeps across calls).
//
// torch.export lists a mutated buffer as a BUFFER input and its value at the end
// of the call as a BUFFER_MUTATION output; the graph itself is functional
// (index_copy / index_put / slice_scatter / copy of the buffer give a new
// tensor). kiln keeps such a buffer in planned memory that lives across calls
// (initialised from the buffer's data, see the emitter) and writes it in place:
//
//  - when the node that computes the buffer's final value updates the buffer
//    itself (index_copy, index_put or slice_scatter of rows along one dim, or a
//    copy into it) and no later node reads the old buffer, that node becomes the
//    in-place form: aten::index_put_ (one 1-D index tensor: only the written
//    rows move) or aten::copy_;
//  - otherwise the final value is computed as usual and one aten::copy_ writes
//    it back after every reader of the buffer (ExecuTorch's write-back).
//
// A user input the program updates (USER_INPUT_MUTATION: a KV cache the caller
// passes in) is handled the same way, in the input's own memory, and returned
// as an output in the export's order (ExecuTorch's convention: the output is
// the input's tensor, so a runtime that keeps its inputs copies nothing).
//
// The emitter gives an in-place node's output the storage (and the value) of
// its `self` and orders every other reader of the buffer before it.
#include "lowerer.h"

namespace kiln::passes::detail {
namespace {

const graph::OutputSpec* mutation_of(const pt2::ExportedProgram& ep, const std::string& fqn, size_t* index,
                                     graph::OutputSpec::Kind kind = graph::OutputSpec::Kind::BufferMutation) {
  for (size_t i = 0; i < ep.signature.outputs.size(); ++i)
    if (ep.signature.outputs[i].kind == kind && ep.signature.outputs[i].target == fqn) {
      if (index) *index = i;
      return &ep.signature.outputs[i];
    }
  return nullptr;
}

}  // namespace

bool Lowerer::is_mutated_buffer(const std::string& fqn) const { return mutation_of(ep_, fqn, nullptr) != nullptr; }

bool Lowerer::writes_state(const Node& n) {
  const OpSchema* s = find_op_schema(n.target);
  return s != nullptr && s->inplace;
}

void Lowerer::bind_buffer_mutation(const graph::OutputSpec& spec, const Argument& value) {
  check(value.kind == Argument::Kind::Tensor, "{}: the new value of buffer '{}' is not a tensor", ep_.path, spec.target);
  const MutableBuffer* buffer = nullptr;
  for (const auto& b : out_.mutable_buffers)
    if (b.name == spec.target) buffer = &b;
  check(buffer != nullptr, "{}: output mutates buffer '{}', which is not an input of the program", ep_.path, spec.target);
  buffer_writes_.push_back({buffer->value, mapped(std::get<ValueId>(value.payload))});
}

void Lowerer::bind_input_mutation(const graph::OutputSpec& spec, const Argument& value) {
  check(value.kind == Argument::Kind::Tensor, "{}: the new value of input '{}' is not a tensor", ep_.path, spec.target);
  std::optional<ValueId> input;
  for (const auto& [v, name] : mutated_inputs_)
    if (name == spec.target) input = v;
  check(input.has_value(), "{}: output mutates input '{}', which is not a user input of the program", ep_.path,
        spec.target);
  const ValueId v = mapped(std::get<ValueId>(value.payload));
  input_writes_.push_back({*input, v, out_.outputs.size()});
  out_.outputs.push_back(v);
}

void Lowerer::finish_state() {
  // Whether `value` must be copied into `target` (an input or a mutable buffer, `what` 'name' in the error): not
  // when the node that made it wrote it in place. It must keep the target's shape and dtype (`keeps`).
  auto needs_copy = [&](ValueId target, ValueId value, std::string_view what, const std::string& name,
                        std::string_view keeps) {
    const auto& v = out_.graph.value(value);
    if (v.producer >= 0) {
      const Node& p = out_.graph.nodes[static_cast<size_t>(v.producer)];
      if (writes_state(p) && p.inputs.at(0).arg.tensor_ids().at(0) == target) return false;  // written in place
    }
    const auto& tm = meta_of(target);
    const auto& vm = meta_of(value);
    check(tm.sizes == vm.sizes && tm.dtype == vm.dtype,
          "{}: {} '{}' is {} {} but the program gives it a {} {} value; kiln keeps {}", ep_.path, what, name,
          dtype_name(tm.dtype), fmt::join(tm.sizes, "x"), dtype_name(vm.dtype), fmt::join(vm.sizes, "x"), keeps);
    return true;
  };
  for (const InputWrite& w : input_writes_) {
    if (!needs_copy(w.input, w.value, "input", mutated_inputs_.at(w.input), "an updated input's shape and dtype"))
      continue;
    // w.value == w.input (not changed after all) is copied onto itself: still the input's own tensor
    out_.outputs[w.output] = emit("aten.copy_.default", {NA("self", tensor_arg(w.input)), NA("src", tensor_arg(w.value))},
                                  contiguous(meta_of(w.input)), "write_back");
  }
  for (const BufferWrite& w : buffer_writes_) {
    if (w.value == w.buffer) continue;  // not changed after all
    if (!needs_copy(w.buffer, w.value, "buffer", out_.mutable_buffer(w.buffer)->name,
                    "a mutable buffer's shape and dtype"))
      continue;
    emit("aten.copy_.default", {NA("self", tensor_arg(w.buffer)), NA("src", tensor_arg(w.value))},
         contiguous(meta_of(w.buffer)), "write_back");
  }
}

bool Lowerer::lower_state(const Node& n) {
  const std::string& t = n.target;
  const bool is_index_copy = t == "aten.index_copy.default";
  const bool is_index_put = t == "aten.index_put.default";
  const bool is_slice_scatter = t == "aten.slice_scatter.default";
  const bool is_copy = t == "aten.copy.default";
  if (!is_index_copy && !is_index_put && !is_slice_scatter && !is_copy) return false;

  // Is `n` the node that gives a mutable buffer its final value, from the buffer
  // itself, with no later reader of the old buffer? Then it runs in place.
  const Argument* self_arg = opt(n, "self");
  if (self_arg == nullptr || self_arg->kind != Argument::Kind::Tensor) return false;
  const ValueId src_self = std::get<ValueId>(self_arg->payload);
  const ValueId self = mapped(src_self);
  // The state it updates: a mutable buffer, or a user input the program updates (an external cache)
  const MutableBuffer* buffer = out_.mutable_buffer(self);
  const auto mutated_input = mutated_inputs_.find(self);
  const bool is_state = buffer != nullptr || mutated_input != mutated_inputs_.end();
  const std::string state_name = buffer ? "mutable buffer '" + buffer->name + "'"
                                 : is_state ? "input '" + mutated_input->second + "'" : std::string();
  bool in_place = false;
  if (is_state) {
    size_t out_index = 0;
    if (buffer) mutation_of(ep_, buffer->name, &out_index);
    else mutation_of(ep_, mutated_input->second, &out_index, graph::OutputSpec::Kind::UserInputMutation);
    const Argument& final_value = ep_.graph.outputs.at(out_index);
    auto outs = source_outputs(n);
    in_place = final_value.kind == Argument::Kind::Tensor && outs.size() == 1 &&
               std::get<ValueId>(final_value.payload) == outs[0];
    const size_t at = static_cast<size_t>(&n - ep_.graph.nodes.data());
    for (size_t i = at + 1; in_place && i < ep_.graph.nodes.size(); ++i)
      for (const auto& in : ep_.graph.nodes[i].inputs)
        for (ValueId v : in.arg.tensor_ids()) in_place = in_place && v != src_self;
    for (const auto& o : ep_.graph.outputs)
      for (ValueId v : o.tensor_ids()) in_place = in_place && v != src_self;
  }
  const TensorMeta& sm = meta_of(self);
  if (!is_state && !is_copy) return false;  // an update of an ordinary tensor: another family's

  if (is_copy) {
    ValueId src = tensor_in(n, "src");
    if (in_place) {
      bind(n, emit("aten.copy_.default", {NA("self", tensor_arg(self)), NA("src", tensor_arg(src))}, contiguous(sm)));
      return true;
    }
    // Functional copy: src in self's dtype, broadcast to self's shape.
    if (meta_of(src).dtype != sm.dtype) src = convert(src, sm.dtype);
    if (meta_of(src).sizes != sm.sizes) src = expand(src, sm.sizes);
    bind(n, src);
    return true;
  }

  // The update as rows along one dim: (dim, 1-D index tensor, values of self's
  // shape except len(index) at dim).
  int64_t dim = 0;
  std::optional<ValueId> index;
  ValueId values = 0;
  if (is_index_copy) {
    dim = wrap_dim(int_in(n, "dim"), sm.sizes.size());
    index = tensor_in(n, "index");
    values = tensor_in(n, "source");
  } else if (is_index_put) {
    const Argument& ia = arg(n, "indices");
    values = tensor_in(n, "values");
    if (int_in(n, "accumulate", 0) != 0) in_place = false;
    std::vector<std::optional<ValueId>> idx;
    if (ia.kind == Argument::Kind::OptionalTensors)
      idx = std::get<std::vector<std::optional<ValueId>>>(ia.payload);
    else if (ia.kind == Argument::Kind::Tensors)
      for (ValueId v : std::get<std::vector<ValueId>>(ia.payload)) idx.emplace_back(v);
    int found = 0;
    for (size_t i = 0; i < idx.size(); ++i)
      if (idx[i]) {
        ++found;
        dim = static_cast<int64_t>(i);
        index = mapped(*idx[i]);
      }
    if (found != 1) in_place = false;
  } else {  // slice_scatter: rows start..end of dim, as a constant index
    dim = wrap_dim(int_in(n, "dim", 0), sm.sizes.size());
    values = tensor_in(n, "src");
    const int64_t size = sm.sizes.at(static_cast<size_t>(dim));
    auto bound = [&](const char* name, int64_t dflt) {
      const Argument* a = opt(n, name);
      int64_t v = (!a || a->kind == Argument::Kind::None) ? dflt : int_in(n, name);
      if (v < 0) v += size;
      return std::clamp<int64_t>(v, 0, size);
    };
    int64_t start = bound("start", 0), end = bound("end", size), step = int_in(n, "step", 1);
    if (step < 1) unsupported(n, "slice_scatter with a step below 1");
    std::vector<int64_t> rows;
    for (int64_t r = start; r < end; r += step) rows.push_back(r);
    auto bytes = std::make_shared<std::vector<std::byte>>(rows.size() * sizeof(int64_t));
    if (!rows.empty()) std::memcpy(bytes->data(), rows.data(), bytes->size());
    ValueId iv = out_.graph.add_value(fresh_name("rows"), contiguous(ScalarType::Long, {static_cast<int64_t>(rows.size())}));
    out_.constants[iv] = ConstantData{nullptr, bytes, fmt::format("{} (rows {}..{})", n.name, start, end)};
    index = iv;
  }
  if (index) {
    const TensorMeta& im = meta_of(*index);
    const TensorMeta& vm = meta_of(values);
    bool fits = im.sizes.size() == 1 && (im.dtype == ScalarType::Long || im.dtype == ScalarType::Int) &&
                vm.dtype == sm.dtype && vm.sizes.size() == sm.sizes.size();
    for (size_t d = 0; fits && d < sm.sizes.size(); ++d)
      fits = vm.sizes[d] == (static_cast<int64_t>(d) == dim ? im.sizes[0] : sm.sizes[d]);
    in_place = in_place && fits;
  }
  if (in_place && index) {
    std::vector<std::optional<ValueId>> idx(static_cast<size_t>(dim), std::nullopt);
    idx.emplace_back(*index);
    bind(n, emit("aten.index_put_.default",
                 {NA("self", tensor_arg(self)), NA("indices", {Argument::Kind::OptionalTensors, std::move(idx)}),
                  NA("values", tensor_arg(values)), NA("accumulate", bool_arg(false))},
                 contiguous(sm)));
    return true;
  }
  if (find_op_schema(t) != nullptr || is_index_copy) return false;  // the functional update; finish_state writes it back
  unsupported(n, "this update of " + state_name +
                    " cannot run in place (kiln writes buffers in place when one node updates rows along one "
                    "dimension and nothing reads the old buffer afterwards)");
}

}  // namespace kiln::passes::detail
