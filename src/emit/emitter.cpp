#include "kiln/emit/emitter.h"

#include "kiln/core/error.h"
#include "kiln/emit/memory_plan.h"
#include "kiln/passes/op_table.h"

#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <unordered_map>

namespace kiln::emit {
namespace {

using graph::Argument;
using graph::ValueId;
using passes::ConstantData;
using passes::EdgeProgram;

bool is_view_like(std::string_view target) {
  return target == "aten.view_copy.default" || target == "aten.unsqueeze_copy.default" ||
         target == "aten.squeeze_copy.dims" || target == "aten.alias_copy.default" ||
         target == "dim_order_ops._clone_dim_order.default";
}

std::vector<int32_t> to_i32(const std::vector<int64_t>& v) {
  std::vector<int32_t> out;
  for (int64_t x : v) {
    check(x >= 0 && x <= INT32_MAX, "tensor dimension {} does not fit the program format", x);
    out.push_back(static_cast<int32_t>(x));
  }
  return out;
}

class Emitter {
 public:
  Emitter(const EdgeProgram& program, EmitReport* report) : p_(program), report_(report ? report : &local_report_) {}

  pte::Program run() {
    plan_.name = "forward";
    plan_.encoded_inputs_spec = p_.inputs_spec;
    plan_.encoded_outputs_spec = p_.outputs_spec;
    decide_aliases();
    assign_constants();
    plan_storage();
    emit_instructions();
    for (ValueId v : p_.graph.inputs) plan_.inputs.push_back(tensor_value(v));
    for (ValueId v : p_.outputs) plan_.outputs.push_back(tensor_value(v));
    report_->values = static_cast<int64_t>(plan_.values.size());
    program_.plans.push_back(std::move(plan_));
    return std::move(program_);
  }

 private:
  // ---- which view nodes become shared storage --------------------------------
  void decide_aliases() {
    const auto& g = p_.graph;
    storage_of_.assign(g.values.size(), -1);
    alias_node_.assign(g.nodes.size(), false);
    std::vector<bool> is_input(g.values.size(), false);
    for (ValueId v : g.inputs) is_input[static_cast<size_t>(v)] = true;
    // Root storages: inputs and every node output; aliases point at their input's root.
    int32_t next = 0;
    for (ValueId v : g.inputs) storage_of_[static_cast<size_t>(v)] = next++;
    for (size_t i = 0; i < g.nodes.size(); ++i) {
      const auto& n = g.nodes[i];
      auto outs = n.output_ids();
      if (is_view_like(n.target) && outs.size() == 1) {
        ValueId in = n.inputs.at(0).arg.tensor_ids().at(0);
        bool same_dtype = g.value(in).meta.dtype == g.value(outs[0]).meta.dtype;
        if (same_dtype && !is_input[static_cast<size_t>(in)] && !p_.is_constant(in)) {
          alias_node_[i] = true;
          storage_of_[static_cast<size_t>(outs[0])] = storage_of_[static_cast<size_t>(in)];
          ++report_->aliased_views;
          continue;
        }
      }
      for (ValueId v : outs) storage_of_[static_cast<size_t>(v)] = next++;
    }
    storage_count_ = next;
  }

  // ---- constants: one buffer per distinct content -------------------------------
  void assign_constants() {
    // Same data object first (tied parameters, views of constants), then same bytes.
    std::map<std::pair<const void*, std::string>, uint32_t> by_identity;
    std::unordered_map<uint64_t, std::vector<uint32_t>> by_hash;
    std::vector<const ConstantData*> buffer_data{nullptr};
    for (const auto& [v, c] : p_.constants) {
      std::pair<const void*, std::string> identity =
          c.source ? std::pair<const void*, std::string>{nullptr, fmt::format("{}@{}/{}/{}", c.source->entry,
                                                                               c.source->meta.storage_offset,
                                                                               fmt::join(c.source->meta.sizes, ","),
                                                                               fmt::join(c.source->meta.strides, ","))}
                   : std::pair<const void*, std::string>{c.bytes.get(), ""};
      if (auto it = by_identity.find(identity); it != by_identity.end()) {
        constant_index_[v] = it->second;
        ++report_->deduplicated_constants;
        continue;
      }
      uint64_t size = 0;
      uint64_t h = content_hash(v, c, &size);
      uint32_t found = 0;
      for (uint32_t candidate : by_hash[h]) {
        if (p_.constant_bytes(constant_value_[candidate]) == p_.constant_bytes(v)) {
          found = candidate;
          break;
        }
      }
      if (found != 0) {
        constant_index_[v] = found;
        by_identity[identity] = found;
        ++report_->deduplicated_constants;
        continue;
      }
      auto index = static_cast<uint32_t>(program_.constants.size());
      by_hash[h].push_back(index);
      by_identity[identity] = index;
      constant_index_[v] = index;
      constant_value_[index] = v;
      pte::DataBlob blob;
      blob.size = size;
      if (c.source) {
        const pt2::ConstantTensor* src = c.source;
        const pt2::ExportedProgram* ep = p_.exported;
        blob.write = [ep, src](const std::function<void(std::span<const std::byte>)>& sink) {
          ep->stream_constant(*src, sink);
        };
      } else {
        auto data = c.bytes;
        blob.write = [data](const std::function<void(std::span<const std::byte>)>& sink) { sink(*data); };
      }
      program_.constants.push_back(std::move(blob));
      ++report_->constants;
      report_->constant_bytes += size;
    }
  }

  // A fingerprint of the constant's row-major bytes: its size and an XXH3 of
  // all of it when small, of three 4 KiB samples (start, middle, end) when
  // large. Equal contents give equal fingerprints; a match is confirmed by
  // comparing the bytes, so this only has to make distinct weights rarely
  // collide, without reading every weight twice.
  uint64_t content_hash(ValueId v, const ConstantData& c, uint64_t* size) const {
    (void)v;
    constexpr uint64_t kSample = 4096;
    *size = c.bytes ? c.bytes->size() : static_cast<uint64_t>(c.source->meta.nbytes());
    auto read = [&](uint64_t offset, std::span<std::byte> out) {
      if (c.bytes) std::memcpy(out.data(), c.bytes->data() + offset, out.size());
      else p_.exported->read_constant_range(*c.source, offset, out);
    };
    std::vector<std::byte> sample(std::min<uint64_t>(*size, 3 * kSample));
    if (*size <= 3 * kSample) {
      read(0, sample);
    } else {
      read(0, std::span(sample).subspan(0, kSample));
      read((*size / 2) & ~uint64_t{63}, std::span(sample).subspan(kSample, kSample));
      read(*size - kSample, std::span(sample).subspan(2 * kSample, kSample));
    }
    return XXH3_64bits_withSeed(sample.data(), sample.size(), *size);
  }

  // ---- memory planning --------------------------------------------------------
  void plan_storage() {
    const auto& g = p_.graph;
    // Instruction index of each node once aliases are skipped.
    std::vector<int32_t> instr_of(g.nodes.size(), -1);
    int32_t count = 0;
    for (size_t i = 0; i < g.nodes.size(); ++i)
      if (!alias_node_[i]) instr_of[i] = count++;
    std::vector<StorageRequest> req(static_cast<size_t>(storage_count_));
    std::vector<bool> seen(req.size(), false);
    auto touch = [&](ValueId v, int32_t at) {
      int32_t s = storage_of_[static_cast<size_t>(v)];
      if (s < 0) return;
      auto& r = req[static_cast<size_t>(s)];
      if (!seen[static_cast<size_t>(s)]) {
        seen[static_cast<size_t>(s)] = true;
        r.first = r.last = at;
      }
      r.first = std::min(r.first, at);
      r.last = std::max(r.last, at);
      r.bytes = std::max<uint64_t>(r.bytes, static_cast<uint64_t>(g.value(v).meta.nbytes()));
    };
    for (ValueId v : g.inputs) touch(v, -1);
    for (size_t i = 0; i < g.nodes.size(); ++i) {
      // An alias node neither reads nor writes at run time, but readers of its
      // output keep its root alive: attribute it to the next real instruction.
      int32_t at = alias_node_[i] ? std::max<int32_t>(0, i > 0 ? instr_of_prev(instr_of, i) : 0) : instr_of[i];
      for (ValueId v : g.nodes[i].output_ids()) touch(v, at);
      for (const auto& in : g.nodes[i].inputs)
        for (ValueId v : in.arg.tensor_ids()) touch(v, at);
    }
    // Outputs live to the end; so do inputs, so a method can run again
    // without its inputs being set again.
    for (ValueId v : p_.outputs) touch(v, count);
    for (ValueId v : g.inputs) touch(v, count);
    MemoryPlan plan = plan_memory(req);
    storage_offset_ = plan.offsets;
    plan_.non_const_buffer_sizes = {0, static_cast<int64_t>(plan.total_bytes)};
    report_->planned_bytes = plan.total_bytes;
    report_->naive_bytes = plan.naive_bytes;
  }

  static int32_t instr_of_prev(const std::vector<int32_t>& instr_of, size_t i) {
    for (size_t j = i; j-- > 0;)
      if (instr_of[j] >= 0) return instr_of[j];
    return 0;
  }

  // ---- values -------------------------------------------------------------------
  int32_t add_value(pte::Value v) {
    plan_.values.push_back(std::move(v));
    return static_cast<int32_t>(plan_.values.size() - 1);
  }

  int32_t tensor_value(ValueId v) {
    if (auto it = tensor_index_.find(v); it != tensor_index_.end()) return it->second;
    const auto& meta = p_.graph.value(v).meta;
    pte::TensorValue t;
    t.dtype = meta.dtype;
    t.sizes = to_i32(meta.sizes);
    t.dim_order.resize(meta.sizes.size());
    std::iota(t.dim_order.begin(), t.dim_order.end(), uint8_t{0});
    if (auto c = constant_index_.find(v); c != constant_index_.end()) {
      t.constant_index = c->second;
    } else {
      int32_t s = storage_of_.at(static_cast<size_t>(v));
      check(s >= 0, "internal: tensor '{}' has no storage", p_.graph.value(v).name);
      t.allocation = pte::Allocation{1, storage_offset_.at(static_cast<size_t>(s))};
    }
    int32_t index = add_value(std::move(t));
    tensor_index_[v] = index;
    return index;
  }

  int32_t none_value() {
    if (none_index_ < 0) none_index_ = add_value(pte::NoneValue{});
    return none_index_;
  }

  int32_t int_value(int64_t x) { return add_value(x); }

  int32_t argument_value(const Argument& a) {
    using K = Argument::Kind;
    switch (a.kind) {
      case K::None: return none_value();
      case K::Tensor: return tensor_value(std::get<ValueId>(a.payload));
      case K::Int: return int_value(std::get<int64_t>(a.payload));
      case K::Float: return add_value(std::get<double>(a.payload));
      case K::Bool: return add_value(std::get<bool>(a.payload));
      case K::String: return add_value(std::get<std::string>(a.payload));
      case K::ScalarType: return int_value(static_cast<int64_t>(std::get<ScalarType>(a.payload)));
      case K::MemoryFormat: return int_value(static_cast<int64_t>(std::get<graph::MemoryFormat>(a.payload)));
      case K::Layout:
      case K::Device: return none_value();
      case K::Ints: {
        pte::IntList l;
        for (int64_t x : std::get<std::vector<int64_t>>(a.payload)) l.items.push_back(int_value(x));
        return add_value(std::move(l));
      }
      case K::Floats: return add_value(pte::DoubleList{std::get<std::vector<double>>(a.payload)});
      case K::Bools: return add_value(pte::BoolList{std::get<std::vector<bool>>(a.payload)});
      case K::Tensors: {
        pte::TensorList l;
        for (ValueId v : std::get<std::vector<ValueId>>(a.payload)) l.items.push_back(tensor_value(v));
        return add_value(std::move(l));
      }
      case K::OptionalTensors: {
        pte::OptionalTensorList l;
        for (const auto& v : std::get<std::vector<std::optional<ValueId>>>(a.payload))
          l.items.push_back(v ? tensor_value(*v) : -1);
        return add_value(std::move(l));
      }
      case K::Strings: break;
    }
    fail("argument kind '{}' cannot be emitted", graph::argument_kind_name(a.kind));
  }

  int32_t operator_index(const passes::OpSchema& s) {
    std::string key = fmt::format("{}.{}", s.kernel, s.overload);
    if (auto it = operator_index_.find(key); it != operator_index_.end()) return it->second;
    plan_.operators.push_back({std::string(s.kernel), std::string(s.overload)});
    auto index = static_cast<int32_t>(plan_.operators.size() - 1);
    operator_index_[key] = index;
    return index;
  }

  // ---- instructions ----------------------------------------------------------
  void emit_instructions() {
    const auto& g = p_.graph;
    for (size_t i = 0; i < g.nodes.size(); ++i) {
      if (alias_node_[i]) continue;
      const auto& n = g.nodes[i];
      const passes::OpSchema* s = passes::find_op_schema(n.target);
      check(s != nullptr, "node '{}': no kernel for '{}'", n.name, n.target);
      pte::KernelCall call;
      call.op_index = operator_index(*s);
      for (const auto& a : passes::ordered_arguments(*s, n)) call.args.push_back(argument_value(a));
      auto outs = n.output_ids();
      // Outs, then the return slot ExecuTorch's kernel calls carry: the out
      // itself, the out list, or a list of the outs.
      if (s->out_is_list) {
        pte::TensorList l;
        for (ValueId v : outs) l.items.push_back(tensor_value(v));
        int32_t list = add_value(std::move(l));
        call.args.push_back(list);
        call.args.push_back(list);
      } else {
        std::vector<int32_t> out_values;
        for (ValueId v : outs) out_values.push_back(tensor_value(v));
        call.args.insert(call.args.end(), out_values.begin(), out_values.end());
        if (out_values.size() == 1) call.args.push_back(out_values[0]);
        else call.args.push_back(add_value(pte::TensorList{out_values}));
      }
      plan_.instructions.push_back(std::move(call));
      ++report_->kernel_calls;
      ++report_->operators[fmt::format("{}.{}", s->kernel, s->overload)];
    }
  }

  const EdgeProgram& p_;
  EmitReport local_report_;
  EmitReport* report_;
  pte::Program program_;
  pte::ExecutionPlan plan_;
  std::vector<int32_t> storage_of_;
  std::vector<bool> alias_node_;
  int32_t storage_count_ = 0;
  std::vector<uint64_t> storage_offset_;
  std::map<ValueId, uint32_t> constant_index_;
  std::map<uint32_t, ValueId> constant_value_;
  std::map<ValueId, int32_t> tensor_index_;
  std::map<std::string, int32_t> operator_index_;
  int32_t none_index_ = -1;
};

}  // namespace

pte::Program emit_program(const passes::EdgeProgram& program, EmitReport* report) {
  return Emitter(program, report).run();
}

}  // namespace kiln::emit
