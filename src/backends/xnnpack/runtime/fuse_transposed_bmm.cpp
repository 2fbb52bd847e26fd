// The XNNPACK backend's fold of a transpose into the batch matmul that reads it (builder.h).
#include "builder.h"

namespace kiln::backends::xnnpack::detail {

// transpose(B)'s last two dims -> bmm(A, ·), a few rows of A: one step, C = A · Bᵀ with dot
// products over B's rows as they are, so the transposed copy (for an LLM, of the whole K
// cache, every token) is never made.
void Builder::fuse_transposed_bmm(State& st) {
  for (size_t s = 0; s + 1 < st.steps.size(); ++s) {
    Step &t = st.steps[s], &mm = st.steps[s + 1];
    if (t.kind != StepKind::Transpose || mm.kind != StepKind::Bmm || mm.trans_b || t.rank < 2 ||
        mm.in[1].group != t.out.group || mm.in[0].group == t.out.group || mm.m >= kGemvRows)
      continue;
    bool last_two = t.perm[t.rank - 1] == t.rank - 2 && t.perm[t.rank - 2] == t.rank - 1;
    for (uint32_t d = 0; d + 2 < t.rank; ++d) last_two &= t.perm[d] == d;
    if (!last_two) continue;
    const int32_t mid = t.out.group, src = t.in[0].group;
    if (st.groups[static_cast<size_t>(mid)].storage.kind != Storage::Kind::Arena || read_elsewhere(st, mid, s + 1))
      continue;
    // the bmm then writes its output while it reads the transpose's input: their arena bytes
    // must not overlap (the plan made the transpose's input dead after the transpose)
    const Group &gi = st.groups[static_cast<size_t>(src)], &go = st.groups[static_cast<size_t>(mm.out.group)];
    if (gi.storage.kind == Storage::Kind::Arena && go.storage.kind == Storage::Kind::Arena &&
        gi.storage.offset < go.storage.offset + go.bytes && go.storage.offset < gi.storage.offset + gi.bytes)
      continue;
    if (gi.storage.kind == Storage::Kind::None) continue;
    mm.in[1] = t.in[0];
    mm.trans_b = true;
    mm.debug_handles.insert(mm.debug_handles.begin(), t.debug_handles.begin(), t.debug_handles.end());
    mm.label = "kiln batch matmul (A · Bᵀ)";
    st.steps.erase(st.steps.begin() + static_cast<std::ptrdiff_t>(s));
  }
}

}  // namespace kiln::backends::xnnpack::detail
