// The XNNPACK backend's steps (builder.h): runs of library nodes as XNNPACK subgraphs, the rest
// as kiln's steps, in the payload's order; then the fusions over the steps.
#include "builder.h"
#include "nodes/node_kind.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <string>
#include <utility>

namespace kiln::backends::xnnpack::detail {

// One XNNPACK subgraph for nodes [begin, end) (library nodes and view reshapes).
Status Builder::subgraph_step(State& st, size_t begin, size_t end) {
  Step step;
  step.kind = StepKind::Subgraph;
  std::vector<int32_t> local(st.values.size(), -1);  // value id -> subgraph value id
  std::vector<std::pair<uint32_t, int32_t>> externals;  // (value, group)
  // externals first: every non-constant value the nodes touch
  for (size_t i = begin; i < end; ++i) {
    if (skip_[i]) continue;
    for (size_t j = 0; j <= io_[i].num_in; ++j) {
      uint32_t v = j < io_[i].num_in ? io_[i].in[j] : io_[i].out;
      if (v == kInvalidId || st.values[v].constant) continue;
      if (local[v] == -1) {
        local[v] = -2;
        externals.emplace_back(v, st.values[v].group);
      }
    }
  }
  xnn_subgraph_t sg = nullptr;
  if (xnn_create_subgraph(static_cast<uint32_t>(externals.size()), 0, &sg) != xnn_status_success)
    return fail(error_, Status::Internal, "xnn_create_subgraph failed");
  std::unique_ptr<xnn_subgraph, decltype(&xnn_delete_subgraph)> owner(sg, xnn_delete_subgraph);
  auto define = [&](uint32_t v, uint32_t ext, uint32_t flags, const void* data) -> Status {
    const Value& val = st.values[v];
    std::array<size_t, kMaxRank> d{};
    for (uint32_t i = 0; i < val.ndims; ++i) d[i] = static_cast<size_t>(val.dims[i]);
    uint32_t id = 0;
    if (xnn_define_tensor_value(sg, xnn_datatype_fp32, val.ndims, d.data(), data, ext, flags, &id) != xnn_status_success)
      return fail(error_, Status::Internal, "XNNPACK rejected value %u", v);
    local[v] = static_cast<int32_t>(id);
    return Status::Ok;
  };
  for (size_t e = 0; e < externals.size(); ++e) {
    KILN_TRY(define(externals[e].first, static_cast<uint32_t>(e), kExternalInput | kExternalOutput, nullptr));
    step.external_groups.push_back(externals[e].second);
    step.externals.push_back({static_cast<uint32_t>(local[externals[e].first]), nullptr});
    if (st.groups[static_cast<size_t>(externals[e].second)].storage.kind == Storage::Kind::Arg) step.binds_args = true;
  }
  auto id_of = [&](uint32_t v) -> uint32_t {
    if (v == kInvalidId) return XNN_INVALID_VALUE_ID;
    if (local[v] < 0) {  // a constant, defined on first use
      if (define(v, XNN_INVALID_VALUE_ID, 0, st.values[v].constant) != Status::Ok) return XNN_INVALID_VALUE_ID - 1;
    }
    return static_cast<uint32_t>(local[v]);
  };
  size_t count = 0, fcs = 0;
  for (size_t i = begin; i < end; ++i) {
    if (skip_[i]) continue;
    const fbx::XNode* node = graph_->xnodes()->Get(static_cast<flatbuffers::uoffset_t>(i));
    float lo = -INFINITY, hi = INFINITY;
    if (const auto* mm = node->output_min_max()) { lo = mm->output_min(); hi = mm->output_max(); }
    const NodeIO& io = io_[i];
    uint32_t a = id_of(io.in[0]), b = io.num_in > 1 ? id_of(io.in[1]) : XNN_INVALID_VALUE_ID, o = id_of(io.out);
    uint32_t bias = io.num_in > 2 && io.in[2] != kInvalidId ? id_of(io.in[2]) : XNN_INVALID_VALUE_ID;
    const NodeKind* kind = node_kind(node->xnode_union_type());
    if (!kind || !kind->define)
      return fail(error_, Status::Internal, "node %zu: %s is not a library node", i, node_name(node->xnode_union_type()));
    xnn_status s = xnn_status_success;
    KILN_TRY(kind->define(DefineContext{{i, *node, io, error_}, st, sg, a, b, bias, o, lo, hi}, &s));
    if (node->xnode_union_type() == NodeType::XNNFullyConnected) ++fcs;
    if (s != xnn_status_success)
      return fail(error_, Status::InvalidProgram, "node %zu: XNNPACK rejected %s (status %d)", i,
                  node_name(node->xnode_union_type()), static_cast<int>(s));
    ++count;
  }
  if (count == 0) return Status::Ok;
  // XNNPACK's runtimes run on a pthreadpool, whose workers spin for a while
  // after each run. With the kiln engine only the heavy nodes (convolutions,
  // pooling, resizing) get it: a small subgraph between kiln's steps would
  // keep a second spinning thread on the core kiln's own pool needs.
  bool heavy = st.engine == Engine::Xnnpack;
  for (size_t i = begin; i < end && !heavy; ++i)
    heavy = node_kind(graph_->xnodes()->Get(static_cast<flatbuffers::uoffset_t>(i))->xnode_union_type())->heavy;
  if (xnn_create_runtime_v2(sg, heavy ? st.exec.raw_pool() : nullptr, 0, &step.runtime) != xnn_status_success)
    return fail(error_, Status::Internal, "XNNPACK could not create the runtime of nodes %zu..%zu", begin, end - 1);
  // XNNPACK packed this subgraph's weights into its own memory; their file
  // pages are not read again (a weight another node reads is kept), so they
  // leave memory now and packing never holds two copies of the model.
  for (size_t i = begin; i < end; ++i) {
    if (skip_[i] || graph_->xnodes()->Get(static_cast<flatbuffers::uoffset_t>(i))->xnode_union_type() != NodeType::XNNFullyConnected)
      continue;
    for (size_t j = 1; j < 3; ++j)
      if (uint32_t v = io_[i].in[j]; v != kInvalidId && only_packed_[v] && file_ && !dynamic_)
        file_->release_pages(st.values[v].constant_bytes);
  }
  if (count == 1) {
    for (size_t i = begin; i < end; ++i)
      if (!skip_[i]) {
        std::string_view name = node_name(graph_->xnodes()->Get(static_cast<flatbuffers::uoffset_t>(i))->xnode_union_type());
        if (name.starts_with("XNN")) name.remove_prefix(3);
        step.label = "xnnpack " + std::string(name);
        if (io_[i].num_in == 3 && name == "FullyConnected") {  // weights' shape, so a profile tells the layers apart
          const Value& w = st.values[io_[i].in[1]];
          if (w.ndims == 2) step.label += " " + std::to_string(w.dims[0]) + "x" + std::to_string(w.dims[1]);
        }
      }
  } else {
    step.label = fcs ? "xnnpack subgraph (fully connected + elementwise)" : "xnnpack subgraph (elementwise, softmax)";
  }
  add_handles(step, begin, end);
  st.steps.push_back(std::move(step));
  return Status::Ok;
}

Status Builder::kiln_step(State& st, size_t i) {
  const fbx::XNode* node = graph_->xnodes()->Get(static_cast<flatbuffers::uoffset_t>(i));
  const NodeIO& io = io_[i];
  const Value& out = st.values[io.out];
  Step step;
  step.out.group = out.group;
  for (size_t j = 0; j < io.num_in; ++j)
    step.in.push_back(Operand{io.in[j] == kInvalidId ? -1 : st.values[io.in[j]].group});
  if (const auto* mm = node->output_min_max()) { step.lo = mm->output_min(); step.hi = mm->output_max(); }
  const NodeType t = node->xnode_union_type();
  const NodeKind* kind = node_kind(t);
  if (!kind || !kind->kiln_step)
    return fail(error_, Status::NotSupported, "node %zu: %s is not supported by kiln's XNNPACK backend", i,
                node_name(t));
  const StepContext c{{i, *node, io, error_}, st, root_ ? *root_ : st, file_, dynamic_, only_packed_};
  KILN_TRY(kind->kiln_step(c, step));
  if (step.kind != StepKind::Unary && step.kind != StepKind::FullyConnected && step.kind != StepKind::QFullyConnected &&
      (step.lo != -INFINITY || step.hi != INFINITY))
    return fail(error_, Status::NotSupported, "node %zu: output clamp on %s", i, node_name(t));
  add_handles(step, i, i + 1);
  st.steps.push_back(std::move(step));
  return Status::Ok;
}

// Whether a step other than `reader` reads `group` (as an operand, or as a subgraph's external value,
// which `writer`'s own externals are not counted as: it writes the group). The fusions below rewrite
// what an intermediate holds, or drop it: only when its one reader is the step they fuse.
bool read_elsewhere(const State& st, int32_t group, size_t reader, size_t writer) {
  for (size_t o = 0; o < st.steps.size(); ++o) {
    if (o == reader) continue;
    for (const Operand& op : st.steps[o].in)
      if (op.group == group) return true;
    if (o != writer)
      for (int32_t eg : st.steps[o].external_groups)
        if (eg == group) return true;
  }
  return false;
}

Status Builder::make_steps(State& st) {
  size_t begin = 0;
  bool open = false;
  for (size_t i = 0; i < io_.size(); ++i) {
    const fbx::XNode* node = graph_->xnodes()->Get(static_cast<flatbuffers::uoffset_t>(i));
    NodeType t = node->xnode_union_type();
    const NodeKind& kind = *node_kind(t);  // parse: every node has its kind
    bool lib = kind.define != nullptr;
    if (kind.on_library)
      KILN_TRY(kind.on_library(NodeContext{i, *node, io_[i], error_}, st, &lib));
    if (skip_[i]) continue;  // a view: no step, inside or between subgraphs
    if (chain_of_[i] >= 0) {  // a fused chain: one step at its first node
      Chain& c = chains_[static_cast<size_t>(chain_of_[i])];
      if (i == c.begin) {
        if (open) {
          KILN_TRY(subgraph_step(st, begin, i));
          open = false;
        }
        for (size_t j = c.begin; j <= c.last; ++j)
          if (chain_of_[j] == chain_of_[i])
            c.step.debug_handles.push_back(graph_->xnodes()->Get(static_cast<flatbuffers::uoffset_t>(j))->debug_handle());
        c.step.last_node = static_cast<int32_t>(c.last);
        st.steps.push_back(std::move(c.step));
      }
      continue;
    }
    if (lib) {
      if (!open) { begin = i; open = true; }
      if (st.per_node) {  // profiling: one subgraph per node
        KILN_TRY(subgraph_step(st, begin, i + 1));
        open = false;
      }
      continue;
    }
    if (open) {
      KILN_TRY(subgraph_step(st, begin, i));
      open = false;
    }
    KILN_TRY(kiln_step(st, i));
  }
  if (open)
    KILN_TRY(subgraph_step(st, begin, io_.size()));
  KILN_TRY(fuse_lm_head(st));
  fuse_transposed_bmm(st);
  find_live_attention(st);
  fuse_scaled_softmax(st);
  plan_debug_outputs(st);
  return Status::Ok;
}

Status Builder::build(std::span<const std::byte> payload, State& st) {
  KILN_TRY(parse(payload, st));
  if (!call_.empty())
    KILN_TRY(infer_dims(st));
  KILN_TRY(plan_storage(st));
  // Which constants only fully-connected nodes read (as weights, which XNNPACK packs)
  only_packed_.assign(st.values.size(), true);
  for (size_t i = 0; i < io_.size(); ++i) {
    const bool fc = graph_->xnodes()->Get(static_cast<flatbuffers::uoffset_t>(i))->xnode_union_type() == NodeType::XNNFullyConnected;
    for (size_t j = 0; j < io_[i].num_in; ++j)
      if (io_[i].in[j] != kInvalidId && !(fc && j >= 1)) only_packed_[io_[i].in[j]] = false;
  }
  KILN_TRY(make_steps(st));
  st.bound_args.assign(st.arg_values.size(), nullptr);
  if (st.arena == nullptr && st.arena_bytes > 0) return Status::Ok;  // set up with the arena, at the first call
  return setup_subgraphs(st, error_);
}

}  // namespace kiln::backends::xnnpack::detail
