// The XNNPACK backend's storage plan (builder.h): values joined by reshapes into groups, where
// each group lives (an argument, a constant, the arena), lifetimes and the arena by first fit.
#include "builder.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <numeric>

namespace kiln::backends::xnnpack::detail {

Status ensure_arena(State& st, ErrorMessage* error) {
  if (st.arena != nullptr || st.arena_bytes == 0) return Status::Ok;
  st.arena = static_cast<std::byte*>(std::aligned_alloc(kArenaAlign, st.arena_bytes));
  if (!st.arena) return fail(error, Status::OutOfMemory, "cannot allocate %zu bytes of activations", st.arena_bytes);
  std::memset(st.arena, 0, st.arena_bytes);
  return Status::Ok;
}

Status setup_subgraphs(State& st, ErrorMessage* error) {
  for (Step& step : st.steps) {
    if (step.kind != StepKind::Subgraph) continue;
    for (size_t e = 0; e < step.externals.size(); ++e) {
      const Storage& sto = st.groups[static_cast<size_t>(step.external_groups[e])].storage;
      if (sto.kind == Storage::Kind::Arena) step.externals[e].data = st.arena + sto.offset;
    }
    if (!step.binds_args &&
        xnn_setup_runtime(step.runtime, step.externals.size(), step.externals.data()) != xnn_status_success)
      return fail(error, Status::Internal, "xnn_setup_runtime failed");
  }
  return Status::Ok;
}

Status Builder::plan_storage(State& st) {
  const size_t nv = st.values.size();
  std::vector<int32_t> parent(nv);
  std::iota(parent.begin(), parent.end(), 0);
  auto find = [&](int32_t v) {
    while (parent[static_cast<size_t>(v)] != v) v = parent[static_cast<size_t>(v)] = parent[static_cast<size_t>(parent[static_cast<size_t>(v)])];
    return v;
  };
  // a root's fixed storage: an argument or a constant (at most one per group)
  auto fixed = [&](uint32_t v) { return st.values[v].constant != nullptr || (st.values[v].flags & (kExternalInput | kExternalOutput)); };
  std::vector<bool> root_fixed(nv);
  for (size_t v = 0; v < nv; ++v) root_fixed[v] = st.values[v].defined && fixed(static_cast<uint32_t>(v));
  skip_.assign(io_.size(), false);
  for (size_t i = 0; i < io_.size(); ++i) {
    const fbx::XNode* node = graph_->xnodes()->Get(static_cast<flatbuffers::uoffset_t>(i));
    if (node->xnode_union_type() != NodeType::XNNStaticReshape) continue;
    const Value &in = st.values[io_[i].in[0]], &out = st.values[io_[i].out];
    if (in.numel != out.numel)
      return fail(error_, Status::InvalidProgram, "node %zu: reshape from %lld to %lld elements", i,
                  static_cast<long long>(in.numel), static_cast<long long>(out.numel));
    int32_t a = find(static_cast<int32_t>(io_[i].in[0])), b = find(static_cast<int32_t>(io_[i].out));
    if (a == b) { skip_[i] = true; continue; }
    if (root_fixed[static_cast<size_t>(a)] && root_fixed[static_cast<size_t>(b)]) continue;  // two fixed homes: a copy step
    if (root_fixed[static_cast<size_t>(b)]) std::swap(a, b);
    parent[static_cast<size_t>(b)] = a;
    skip_[i] = true;
  }
  // groups
  std::vector<int32_t> group_of_root(nv, -1);
  for (size_t v = 0; v < nv; ++v) {
    if (!st.values[v].defined) continue;
    int32_t r = find(static_cast<int32_t>(v));
    if (group_of_root[static_cast<size_t>(r)] < 0) {
      group_of_root[static_cast<size_t>(r)] = static_cast<int32_t>(st.groups.size());
      st.groups.emplace_back();
    }
    st.values[v].group = group_of_root[static_cast<size_t>(r)];
    Group& grp = st.groups[static_cast<size_t>(st.values[v].group)];
    grp.bytes = std::max(grp.bytes, st.values[v].bytes());
    if (st.values[v].constant) {
      grp.storage.kind = Storage::Kind::Static;
      grp.storage.data = st.values[v].constant;
    }
  }
  for (size_t a = 0; a < st.arg_values.size(); ++a) {
    Group& grp = st.groups[static_cast<size_t>(st.values[st.arg_values[a]].group)];
    grp.storage.kind = Storage::Kind::Arg;
    grp.storage.arg = static_cast<uint32_t>(a);
  }
  KILN_TRY(find_chains(st));
  // A transpose of the last two dims whose one reader is a bmm with a few rows (B) is folded
  // into it by make_steps (C = A · Bᵀ): the transpose's input lives until that bmm.
  std::vector<int64_t> input_live_until(io_.size(), -1);
  std::vector<int32_t> readers(nv, 0), reader(nv, -1);
  for (size_t i = 0; i < io_.size(); ++i)
    for (size_t j = 0; j < io_[i].num_in; ++j)
      if (uint32_t v = io_[i].in[j]; v != kInvalidId) ++readers[v], reader[v] = static_cast<int32_t>(i);
  for (size_t i = 0; i < io_.size(); ++i) {
    const fbx::XNode* node = graph_->xnodes()->Get(static_cast<flatbuffers::uoffset_t>(i));
    if (node->xnode_union_type() != NodeType::XNNStaticTranspose || io_[i].num_in < 1) continue;
    const uint32_t v = io_[i].out;
    const auto* perm = node->xnode_union_as_XNNStaticTranspose()->perm();
    if (readers[v] != 1 || (st.values[v].flags & kExternalOutput) || !perm || perm->size() < 2) continue;
    const uint32_t r = perm->size();
    bool last_two = perm->Get(r - 1) == r - 2 && perm->Get(r - 2) == r - 1;
    for (uint32_t d = 0; d + 2 < r; ++d) last_two &= perm->Get(d) == d;
    auto j = static_cast<size_t>(reader[v]);
    uint32_t b = v;  // through reshapes that are views (the bmm's batch dims flattened)
    while (skip_[j] && readers[io_[j].out] == 1 && !(st.values[io_[j].out].flags & kExternalOutput)) {
      b = io_[j].out;
      j = static_cast<size_t>(reader[b]);
    }
    const fbx::XNode* mm = graph_->xnodes()->Get(static_cast<flatbuffers::uoffset_t>(j));
    if (!last_two || mm->xnode_union_type() != NodeType::XNNBatchMatrixMultiply || io_[j].in[1] != b ||
        io_[j].in[0] == b || io_[j].in[0] == kInvalidId)
      continue;
    const Value& a = st.values[io_[j].in[0]];
    if (a.ndims >= 2 && a.dims[a.ndims - 2] < kGemvRows) input_live_until[i] = static_cast<int64_t>(j);
  }
  // lifetimes over node positions; a fused chain runs its nodes row by row, so
  // everything it reads or writes is live from its first node to its last
  for (size_t i = 0; i < io_.size(); ++i) {
    if (skip_[i]) continue;
    auto def = static_cast<int64_t>(i), use = def;
    if (chain_of_[i] >= 0) {
      def = static_cast<int64_t>(chains_[static_cast<size_t>(chain_of_[i])].begin);
      use = static_cast<int64_t>(chains_[static_cast<size_t>(chain_of_[i])].last);
    }
    for (size_t j = 0; j < io_[i].num_in; ++j)
      if (io_[i].in[j] != kInvalidId) {
        Group& grp = st.groups[static_cast<size_t>(st.values[io_[i].in[j]].group)];
        grp.last_use = std::max({grp.last_use, use, input_live_until[i]});
      }
    Group& grp = st.groups[static_cast<size_t>(st.values[io_[i].out].group)];
    grp.first_def = std::min(grp.first_def, def);
    grp.last_use = std::max(grp.last_use, use);
  }
  // arena: first fit by lifetime, in order of definition
  std::vector<size_t> order;
  for (size_t gi = 0; gi < st.groups.size(); ++gi)
    if (st.groups[gi].storage.kind == Storage::Kind::None && st.groups[gi].last_use >= 0 && !slot_only_[gi])
      order.push_back(gi);
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return st.groups[a].first_def < st.groups[b].first_def; });
  struct Live { size_t offset, size; int64_t end; };
  std::vector<Live> live;
  size_t top = 0;
  for (size_t gi : order) {
    Group& grp = st.groups[gi];
    if (grp.first_def == INT64_MAX)
      return fail(error_, Status::InvalidProgram, "a value is read but never written (group %zu)", gi);
    std::erase_if(live, [&](const Live& l) { return l.end < grp.first_def; });
    std::sort(live.begin(), live.end(), [](const Live& a, const Live& b) { return a.offset < b.offset; });
    size_t need = (grp.bytes + XNN_EXTRA_BYTES + kArenaAlign - 1) / kArenaAlign * kArenaAlign, at = 0;
    for (const Live& l : live) {
      if (l.offset >= at + need) break;
      at = std::max(at, l.offset + l.size);
    }
    grp.storage.kind = Storage::Kind::Arena;
    grp.storage.offset = at;
    live.push_back({at, need, grp.last_use});
    top = std::max(top, at + need);
  }
  st.arena_bytes = top;
  // A dynamic delegate's first plan is at its upper bounds, which calls may never reach: its arena
  // is made when a call first runs it (ensure_arena), not held from load.
  if (dynamic_ && call_.empty()) return Status::Ok;
  return ensure_arena(st, error_);
}

}  // namespace kiln::backends::xnnpack::detail
