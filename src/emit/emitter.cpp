#include "kiln/emit/emitter.h"

#include "kiln/core/error.h"
#include "kiln/emit/memory_plan.h"
#include "kiln/passes/dynamic.h"
#include "kiln/passes/op_table.h"

#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <queue>
#include <set>
#include <unordered_map>

namespace kiln::emit {
namespace {

using graph::Argument;
using graph::ValueId;
using passes::ConstantData;
using passes::EdgeProgram;

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
  Emitter(const EdgeProgram& program, std::span<const partition::DelegatedRegion> regions, EmitReport* report)
      : p_(program), regions_(regions), report_(report ? report : &local_report_) {}

  pte::Program run() {
    plan_.name = "forward";
    plan_.encoded_inputs_spec = p_.inputs_spec;
    plan_.encoded_outputs_spec = p_.outputs_spec;
    order_steps();
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
  // ---- the order of instructions ----------------------------------------------
  // One step per node on the portable path and per delegated region: a
  // topological order of the graph with every region contracted to one node,
  // each step as early in graph order as its inputs allow.
  struct Step {
    bool region = false;
    int32_t index = 0;  // node index, or index into regions_
  };

  void order_steps() {
    const auto& g = p_.graph;
    const size_t n = g.nodes.size();
    region_of_.assign(n, -1);
    for (size_t r = 0; r < regions_.size(); ++r) {
      const auto& region = regions_[r];
      check(!region.nodes.empty(), "delegated region {} has no nodes", r);
      check(!region.backend_id.empty(), "delegated region {} names no backend", r);
      for (int32_t i : region.nodes) {
        check(i >= 0 && static_cast<size_t>(i) < n, "delegated region {} names node index {} of {}", r, i, n);
        check(region_of_[static_cast<size_t>(i)] < 0, "node '{}' is in two delegated regions",
              g.nodes[static_cast<size_t>(i)].name);
        region_of_[static_cast<size_t>(i)] = static_cast<int32_t>(r);
      }
      report_->delegated_nodes += static_cast<int64_t>(region.nodes.size());
    }
    // Units: node i on the portable path is unit i, region r is unit n + r.
    auto unit_of = [&](size_t i) { return region_of_[i] < 0 ? i : n + static_cast<size_t>(region_of_[i]); };
    std::vector<int32_t> producer(g.values.size(), -1);
    for (size_t i = 0; i < n; ++i)
      for (ValueId v : g.nodes[i].output_ids()) producer.at(static_cast<size_t>(v)) = static_cast<int32_t>(i);
    const size_t units = n + regions_.size();
    std::vector<std::vector<size_t>> succs(units);
    std::vector<int32_t> indegree(units, 0);
    std::vector<size_t> key(units, SIZE_MAX);
    for (size_t i = 0; i < n; ++i) key[unit_of(i)] = std::min(key[unit_of(i)], i);
    std::set<std::pair<size_t, size_t>> edges;
    for (size_t i = 0; i < n; ++i) {
      for (const auto& in : g.nodes[i].inputs)
        for (ValueId v : in.arg.tensor_ids()) {
          if (p_.is_constant(v)) continue;
          int32_t q = producer.at(static_cast<size_t>(v));
          if (q < 0) continue;
          size_t a = unit_of(static_cast<size_t>(q)), b = unit_of(i);
          if (a != b && edges.emplace(a, b).second) {
            succs[a].push_back(b);
            ++indegree[b];
          }
        }
    }
    // An in-place write of a mutable buffer comes after every other reader of the buffer.
    for (size_t w = 0; w < n; ++w) {
      const passes::OpSchema* ws = passes::find_op_schema(g.nodes[w].target);
      if (ws == nullptr || !ws->inplace) continue;
      ValueId self = g.nodes[w].inputs.at(0).arg.tensor_ids().at(0);
      for (size_t i = 0; i < n; ++i) {
        if (i == w) continue;
        bool reads = false;
        for (const auto& in : g.nodes[i].inputs)
          for (ValueId v : in.arg.tensor_ids()) reads = reads || v == self;
        size_t a = unit_of(i), b = unit_of(w);
        if (reads && a != b && edges.emplace(a, b).second) {
          succs[a].push_back(b);
          ++indegree[b];
        }
      }
    }
    // A region's outputs must cover what is read outside it; its inputs what it reads.
    for (size_t r = 0; r < regions_.size(); ++r) {
      std::set<ValueId> ins(regions_[r].inputs.begin(), regions_[r].inputs.end());
      for (ValueId v : regions_[r].outputs) {
        int32_t q = producer.at(static_cast<size_t>(v));
        check(q >= 0 && region_of_[static_cast<size_t>(q)] == static_cast<int32_t>(r),
              "delegated region {} lists output '{}', which it does not compute", r, g.value(v).name);
      }
      for (int32_t i : regions_[r].nodes)
        for (const auto& in : g.nodes[static_cast<size_t>(i)].inputs)
          for (ValueId v : in.arg.tensor_ids()) {
            int32_t q = producer.at(static_cast<size_t>(v));
            bool inside = q >= 0 && region_of_[static_cast<size_t>(q)] == static_cast<int32_t>(r);
            // Constants a region does not list as inputs travel in its named data.
            check(inside || ins.contains(v) || p_.is_constant(v),
                  "delegated region {} reads '{}' but does not list it as an input", r, g.value(v).name);
          }
      for (ValueId v : regions_[r].inputs) {
        int32_t q = producer.at(static_cast<size_t>(v));
        check(q < 0 || region_of_[static_cast<size_t>(q)] != static_cast<int32_t>(r),
              "delegated region {} lists input '{}', which it computes itself", r, g.value(v).name);
      }
    }
    for (size_t i = 0; i < n; ++i)
      for (const auto& in : g.nodes[i].inputs)
        for (ValueId v : in.arg.tensor_ids()) {
          int32_t q = p_.is_constant(v) ? -1 : producer.at(static_cast<size_t>(v));
          if (q < 0 || region_of_[static_cast<size_t>(q)] < 0 || region_of_[static_cast<size_t>(q)] == region_of_[i])
            continue;
          const auto& outs = regions_[static_cast<size_t>(region_of_[static_cast<size_t>(q)])].outputs;
          check(std::find(outs.begin(), outs.end(), v) != outs.end(),
                "node '{}' reads '{}' from inside delegated region {}, which does not output it", g.nodes[i].name,
                g.value(v).name, region_of_[static_cast<size_t>(q)]);
        }
    for (ValueId v : p_.outputs) {
      int32_t q = p_.is_constant(v) ? -1 : producer.at(static_cast<size_t>(v));
      if (q < 0 || region_of_[static_cast<size_t>(q)] < 0) continue;
      const auto& outs = regions_[static_cast<size_t>(region_of_[static_cast<size_t>(q)])].outputs;
      check(std::find(outs.begin(), outs.end(), v) != outs.end(),
            "program output '{}' is computed inside delegated region {}, which does not output it", g.value(v).name,
            region_of_[static_cast<size_t>(q)]);
    }
    // Kahn's algorithm, earliest graph position first.
    std::priority_queue<std::pair<size_t, size_t>, std::vector<std::pair<size_t, size_t>>, std::greater<>> ready;
    size_t live_units = 0;
    for (size_t u = 0; u < units; ++u) {
      if (key[u] == SIZE_MAX) continue;  // a region number with no nodes cannot happen; a node always has a key
      ++live_units;
      if (indegree[u] == 0) ready.emplace(key[u], u);
    }
    while (!ready.empty()) {
      size_t u = ready.top().second;
      ready.pop();
      steps_.push_back(u < n ? Step{false, static_cast<int32_t>(u)} : Step{true, static_cast<int32_t>(u - n)});
      for (size_t s : succs[u])
        if (--indegree[s] == 0) ready.emplace(key[s], s);
    }
    check(steps_.size() == live_units,
          "delegated regions are not convex: contracting them leaves a cycle in the graph");
  }

  // ---- which view nodes become shared storage --------------------------------
  void decide_aliases() {
    const auto& g = p_.graph;
    storage_of_.assign(g.values.size(), -1);
    alias_node_.assign(g.nodes.size(), false);
    std::vector<bool> is_input(g.values.size(), false);
    for (ValueId v : g.inputs) is_input[static_cast<size_t>(v)] = true;
    // Root storages: inputs, every portable node output and every region
    // output; aliases point at their input's root. Values inside a region have none.
    int32_t next = 0;
    for (ValueId v : g.inputs) storage_of_[static_cast<size_t>(v)] = next++;
    // Mutable buffers: storage of their own for the whole call (their contents outlive it).
    for (const auto& b : p_.mutable_buffers) {
      storage_of_[static_cast<size_t>(b.value)] = next++;
      is_input[static_cast<size_t>(b.value)] = true;  // never the root of a shared view
    }
    for (const Step& step : steps_) {
      if (step.region) {
        for (ValueId v : regions_[static_cast<size_t>(step.index)].outputs) storage_of_[static_cast<size_t>(v)] = next++;
        continue;
      }
      auto i = static_cast<size_t>(step.index);
      const auto& n = g.nodes[i];
      auto outs = n.output_ids();
      // A view of a dynamic size is a kernel call: its shape is computed per call.
      const bool dynamic_out = p_.dynamic && outs.size() == 1 && p_.dynamic->is_dynamic(outs[0]);
      if (passes::is_view_like(n.target) && outs.size() == 1 && !dynamic_out) {
        ValueId in = n.inputs.at(0).arg.tensor_ids().at(0);
        bool same_dtype = g.value(in).meta.dtype == g.value(outs[0]).meta.dtype;
        if (same_dtype && !is_input[static_cast<size_t>(in)] && !p_.is_constant(in) &&
            storage_of_[static_cast<size_t>(in)] >= 0) {
          alias_node_[i] = true;
          storage_of_[static_cast<size_t>(outs[0])] = storage_of_[static_cast<size_t>(in)];
          ++report_->aliased_views;
          continue;
        }
      }
      if (const passes::OpSchema* s = passes::find_op_schema(n.target); s && s->inplace && outs.size() == 1) {
        ValueId self = n.inputs.at(0).arg.tensor_ids().at(0);
        storage_of_[static_cast<size_t>(outs[0])] = storage_of_[static_cast<size_t>(self)];
        inplace_of_[outs[0]] = self;  // the same value: ExecuTorch's in-place calls return their self
        continue;
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
    // Only constants an instruction or the program's outputs name: those only
    // delegates read are the delegates' named data, not constant segment data.
    std::set<ValueId> needed;
    for (const Step& step : steps_) {
      if (step.region) {
        for (ValueId v : regions_[static_cast<size_t>(step.index)].inputs)
          if (p_.is_constant(v)) needed.insert(v);
        continue;
      }
      for (const auto& in : p_.graph.nodes[static_cast<size_t>(step.index)].inputs)
        for (ValueId v : in.arg.tensor_ids())
          if (p_.is_constant(v)) needed.insert(v);
    }
    for (ValueId v : p_.outputs)
      if (p_.is_constant(v)) needed.insert(v);
    for (const auto& [v, c] : p_.constants) {
      if (!needed.contains(v)) continue;
      std::pair<const void*, std::string> identity =
          c.source ? std::pair<const void*, std::string>{nullptr, fmt::format("{}+{}@{}/{}/{}", c.source->entry,
                                                                               c.source->entry_offset,
                                                                               c.source->meta.storage_offset,
                                                                               fmt::join(c.source->meta.sizes, ","),
                                                                               fmt::join(c.source->meta.strides, ","))}
                   : std::pair<const void*, std::string>{
                         c.generated ? static_cast<const void*>(c.generated.get()) : c.bytes.get(), ""};
      if (auto it = by_identity.find(identity); it != by_identity.end()) {
        constant_index_[v] = it->second;
        ++report_->deduplicated_constants;
        continue;
      }
      uint64_t size = 0;
      // bytes computed as the file is written (a streamed quantized table): distinct by construction, not hashed
      // (sampling them would compute them twice more)
      uint64_t h = c.generated ? 0 : content_hash(v, c, &size);
      if (c.generated) size = c.generated->size;
      // A constant with no elements has no bytes to store: it is planned (0 bytes) instead.
      // A zero-size constant segment would make ExecuTorch's runtime take the program for one
      // that uses the deprecated in-flatbuffer constant buffers and reject it.
      if (size == 0) continue;
      uint32_t found = 0;
      for (uint32_t candidate : c.generated ? std::vector<uint32_t>{} : by_hash[h]) {
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
      if (!c.generated) by_hash[h].push_back(index);
      by_identity[identity] = index;
      constant_index_[v] = index;
      constant_value_[index] = v;
      pte::DataBlob blob;
      blob.size = size;
      if (c.generated) {
        auto gen = c.generated;
        blob.write = [gen](const std::function<void(std::span<const std::byte>)>& sink) { gen->write(sink); };
      } else if (c.source) {
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
      if (out.empty()) return;  // a constant of no elements: memcpy takes no null pointer, even for 0 bytes
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
    for (const auto& b : p_.mutable_buffers) touch(b.value, -1);
    int32_t count = 0;
    for (const Step& step : steps_) {
      if (step.region) {
        // A delegate call reads its inputs and writes its outputs at its instruction.
        const auto& r = regions_[static_cast<size_t>(step.index)];
        for (ValueId v : r.inputs) touch(v, count);
        for (ValueId v : r.outputs) touch(v, count);
        ++count;
        continue;
      }
      auto i = static_cast<size_t>(step.index);
      // An alias node neither reads nor writes at run time, but readers of its
      // output keep its root alive: attribute it to the previous instruction.
      int32_t at = alias_node_[i] ? std::max(0, count - 1) : count++;
      for (ValueId v : g.nodes[i].output_ids()) touch(v, at);
      for (const auto& in : g.nodes[i].inputs)
        for (ValueId v : in.arg.tensor_ids()) touch(v, at);
    }
    // Outputs live to the end; so do inputs, so a method can run again
    // without its inputs being set again.
    for (ValueId v : p_.outputs) touch(v, count);
    for (ValueId v : g.inputs) touch(v, count);
    for (const auto& b : p_.mutable_buffers) touch(b.value, count);
    MemoryPlan plan = plan_memory(req);
    storage_offset_ = plan.offsets;
    plan_.non_const_buffer_sizes = {0, static_cast<int64_t>(plan.total_bytes)};
    report_->planned_bytes = plan.total_bytes;
    report_->naive_bytes = plan.naive_bytes;
  }

  // ---- values -------------------------------------------------------------------
  int32_t add_value(pte::Value v) {
    plan_.values.push_back(std::move(v));
    return static_cast<int32_t>(plan_.values.size() - 1);
  }

  int32_t tensor_value(ValueId v) {
    if (auto it = tensor_index_.find(v); it != tensor_index_.end()) return it->second;
    if (auto it = inplace_of_.find(v); it != inplace_of_.end()) return tensor_index_[v] = tensor_value(it->second);
    const auto& meta = p_.graph.value(v).meta;
    pte::TensorValue t;
    t.dtype = meta.dtype;
    t.sizes = to_i32(meta.sizes);
    t.dim_order.resize(meta.sizes.size());
    std::iota(t.dim_order.begin(), t.dim_order.end(), uint8_t{0});
    t.dynamic_bound = p_.dynamic && p_.dynamic->is_dynamic(v);
    if (auto c = constant_index_.find(v); c != constant_index_.end()) {
      t.constant_index = c->second;
    } else if (p_.is_constant(v)) {
      t.allocation = pte::Allocation{1, 0};  // an empty constant (see assign_constants)
    } else {
      int32_t s = storage_of_.at(static_cast<size_t>(v));
      check(s >= 0, "internal: tensor '{}' has no storage", p_.graph.value(v).name);
      t.allocation = pte::Allocation{1, storage_offset_.at(static_cast<size_t>(s))};
      if (const passes::MutableBuffer* b = p_.mutable_buffer(v)) t.mutable_index = initial_data(*b);  // 0: zeros
    }
    int32_t index = add_value(std::move(t));
    tensor_index_[v] = index;
    return index;
  }

  // A mutable buffer's initial contents, in the program's mutable data (copied into its planned memory at load);
  // none (index 0) when they are all zeros, as ExecuTorch emits a KV cache: planned memory starts zeroed.
  uint32_t initial_data(const passes::MutableBuffer& b) {
    const uint64_t size = b.initial.bytes ? b.initial.bytes->size() : static_cast<uint64_t>(b.initial.source->meta.nbytes());
    ++report_->mutable_buffers;
    report_->mutable_buffer_bytes += size;
    bool zeros = true;
    auto check_zeros = [&zeros](std::span<const std::byte> chunk) {
      for (std::byte x : chunk) zeros = zeros && x == std::byte{0};
    };
    if (b.initial.source) p_.exported->stream_constant(*b.initial.source, check_zeros);
    else check_zeros(*b.initial.bytes);
    if (zeros) {
      ++report_->zero_initialized_buffers;
      return 0;
    }
    report_->mutable_data_bytes += size;
    auto index = static_cast<uint32_t>(program_.mutable_data.size());
    pte::DataBlob blob;
    blob.size = size;
    if (b.initial.source) {
      const pt2::ConstantTensor* src = b.initial.source;
      const pt2::ExportedProgram* ep = p_.exported;
      blob.write = [ep, src](const std::function<void(std::span<const std::byte>)>& sink) { ep->stream_constant(*src, sink); };
    } else {
      auto data = b.initial.bytes;
      blob.write = [data](const std::function<void(std::span<const std::byte>)>& sink) { sink(*data); };
    }
    program_.mutable_data.push_back(std::move(blob));
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

  int32_t operator_index(const passes::OpSchema& s) { return operator_index(s.kernel, s.overload); }

  int32_t operator_index(std::string_view name, std::string_view overload) {
    std::string key = fmt::format("{}.{}", name, overload);
    if (auto it = operator_index_.find(key); it != operator_index_.end()) return it->second;
    plan_.operators.push_back({std::string(name), std::string(overload)});
    auto index = static_cast<int32_t>(plan_.operators.size() - 1);
    operator_index_[key] = index;
    return index;
  }

  // ---- dynamic sizes: Int values computed at run time -------------------------
  // Each symbol is read once from the input dim that has its size (aten::sym_size.int),
  // and each expression is built from those with executorch_prim mul/add, as
  // ExecuTorch's emitter does for the SymInt nodes of its graphs.
  int32_t scalar_call(std::string_view name, std::string_view overload, std::vector<int32_t> args) {
    int32_t out = add_value(int64_t{0});
    pte::KernelCall call;
    call.op_index = operator_index(name, overload);
    call.args = std::move(args);
    call.args.push_back(out);
    plan_.instructions.push_back(std::move(call));
    report_->instruction_node.push_back(-1);  // no graph node: shape arithmetic (the debug map's "scalar")
    report_->instruction_region.push_back(-1);
    ++report_->kernel_calls;
    ++report_->operators[fmt::format("{}.{}", name, overload)];
    return out;
  }

  void emit_symbols() {
    const auto& d = *p_.dynamic;
    for (size_t k = 0; k < d.symbols.size(); ++k) {
      if (d.sources[k].input < 0) continue;
      symbol_value_[d.symbols[k].name] =
          scalar_call("aten::sym_size", "int", {tensor_value(d.sources[k].input), int_value(d.sources[k].dim)});
    }
  }

  int32_t expression_value(const graph::SymExpr& e) {
    if (e.is_constant()) return int_value(e.constant);
    const std::string key = e.str();
    if (auto it = expression_value_.find(key); it != expression_value_.end()) return it->second;
    int32_t acc = -1;
    for (const auto& [name, coef] : e.terms) {
      auto s = symbol_value_.find(name);
      check(s != symbol_value_.end(), "internal: symbol '{}' has no run-time value", name);
      int32_t term = coef == 1 ? s->second : scalar_call("executorch_prim::mul", "Scalar", {s->second, int_value(coef)});
      acc = acc < 0 ? term : scalar_call("executorch_prim::add", "Scalar", {acc, term});
    }
    if (e.constant != 0) acc = scalar_call("executorch_prim::add", "Scalar", {acc, int_value(e.constant)});
    expression_value_[key] = acc;
    return acc;
  }

  // An int argument of node `node` whose value depends on the symbols, or -1.
  int32_t dynamic_argument_value(size_t node, std::string_view name, const graph::Argument& a) {
    if (!p_.dynamic) return -1;
    auto it = p_.dynamic->int_args.find({static_cast<int32_t>(node), std::string(name)});
    if (it == p_.dynamic->int_args.end()) return -1;
    if (a.kind == Argument::Kind::Int) return expression_value(it->second.at(0));
    check(a.kind == Argument::Kind::Ints,
          "dynamic shapes: argument '{}' of node '{}' is a {} computed from a dynamic size; kiln computes integer "
          "sizes only",
          name, p_.graph.nodes[node].name, graph::argument_kind_name(a.kind));
    pte::IntList l;
    for (const auto& e : it->second) l.items.push_back(expression_value(e));
    return add_value(std::move(l));
  }

  // ---- instructions ----------------------------------------------------------
  void emit_instructions() {
    const auto& g = p_.graph;
    if (p_.dynamic) emit_symbols();
    for (const Step& step : steps_) {
      if (step.region) {
        emit_delegate_call(regions_[static_cast<size_t>(step.index)]);
        report_->instruction_node.push_back(-1);
        report_->instruction_region.push_back(step.index);
        continue;
      }
      auto i = static_cast<size_t>(step.index);
      if (alias_node_[i]) continue;
      const auto& n = g.nodes[i];
      const passes::OpSchema* s = passes::find_op_schema(n.target);
      check(s != nullptr, "node '{}': no kernel for '{}'", n.name, n.target);
      pte::KernelCall call;
      call.op_index = operator_index(*s);
      const auto ordered = passes::ordered_arguments(*s, n);
      std::vector<int32_t> arg_values;
      for (size_t k = 0; k < ordered.size(); ++k) {
        int32_t dyn = k < s->args.size() ? dynamic_argument_value(i, s->args[k].name, ordered[k]) : -1;
        arg_values.push_back(dyn >= 0 ? dyn : argument_value(ordered[k]));
      }
      call.args = std::move(arg_values);
      auto outs = n.output_ids();
      // Outs, then the return slot ExecuTorch's kernel calls carry: the out
      // itself, the out list, or a list of the outs (an in-place call: its self).
      if (s->inplace) {
        call.args.push_back(tensor_value(outs.at(0)));
      } else if (s->out_is_list) {
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
      report_->instruction_node.push_back(static_cast<int32_t>(i));
      report_->instruction_region.push_back(-1);
      ++report_->kernel_calls;
      ++report_->operators[s->overload.empty() ? std::string(s->kernel) : fmt::format("{}.{}", s->kernel, s->overload)];
    }
  }

  void emit_delegate_call(const partition::DelegatedRegion& r) {
    for (const auto& blob : r.named_data) {
      auto it = named_size_.find(blob.key);
      if (it != named_size_.end()) {
        check(it->second == blob.data.size, "named data '{}' is given as {} and as {} bytes", blob.key, it->second,
              blob.data.size);
        continue;
      }
      named_size_[blob.key] = blob.data.size;
      program_.named_data.push_back(blob);
      ++report_->named_data;
      report_->named_data_bytes += blob.data.size;
    }
    auto payload_index = static_cast<uint32_t>(program_.delegate_payloads.size());
    program_.delegate_payloads.push_back(r.payload);
    report_->delegate_payload_bytes += r.payload.size;
    plan_.delegates.push_back({r.backend_id, payload_index, r.compile_specs});
    pte::DelegateCall call;
    call.delegate_index = static_cast<int32_t>(plan_.delegates.size() - 1);
    for (ValueId v : r.inputs) call.args.push_back(tensor_value(v));
    for (ValueId v : r.outputs) call.args.push_back(tensor_value(v));
    plan_.instructions.push_back(std::move(call));
    ++report_->delegate_calls;
  }

  const EdgeProgram& p_;
  std::span<const partition::DelegatedRegion> regions_;
  EmitReport local_report_;
  EmitReport* report_;
  pte::Program program_;
  pte::ExecutionPlan plan_;
  std::vector<Step> steps_;
  std::vector<int32_t> region_of_;  // per node: index into regions_, or -1
  std::map<std::string, uint64_t> named_size_;
  std::vector<int32_t> storage_of_;
  std::vector<bool> alias_node_;
  int32_t storage_count_ = 0;
  std::vector<uint64_t> storage_offset_;
  std::map<ValueId, uint32_t> constant_index_;
  std::map<uint32_t, ValueId> constant_value_;
  std::map<ValueId, int32_t> tensor_index_;
  std::map<ValueId, ValueId> inplace_of_;  // output of an in-place node -> its self
  std::map<std::string, int32_t> operator_index_;
  std::map<std::string, int32_t> symbol_value_;      // symbol -> its Int value (dynamic programs)
  std::map<std::string, int32_t> expression_value_;  // expression text -> its Int value
  int32_t none_index_ = -1;
};

}  // namespace

pte::Program emit_program(const passes::EdgeProgram& program, EmitReport* report) {
  return Emitter(program, {}, report).run();
}

pte::Program emit_program(const passes::EdgeProgram& program, std::span<const partition::DelegatedRegion> regions,
                          EmitReport* report) {
  return Emitter(program, regions, report).run();
}

}  // namespace kiln::emit
