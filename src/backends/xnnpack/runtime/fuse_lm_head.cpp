// The XNNPACK backend's fusion of the tied LM head (builder.h).
#include "builder.h"
#include "kiln/cpu/gemm.h"

#include <utility>

namespace kiln::backends::xnnpack::detail {

// The tied LM head: transpose(bmm(W, transpose(x))) -> one fused step.
Status Builder::fuse_lm_head(State& st) {
  for (size_t s = 0; s + 2 < st.steps.size(); ++s) {
    Step &t1 = st.steps[s], &mm = st.steps[s + 1], &t2 = st.steps[s + 2];
    if (t1.kind != StepKind::Transpose || mm.kind != StepKind::Bmm || t2.kind != StepKind::Transpose) continue;
    if (t1.rank != 2 || t2.rank != 2 || mm.batch != 1 || mm.in[1].group != t1.out.group || t2.in[0].group != mm.out.group)
      continue;
    if (mm.n > 256 * 64) continue;
    // the intermediate must not be read elsewhere
    const int32_t mid = mm.out.group;
    const bool elsewhere = st.groups[static_cast<size_t>(mid)].storage.kind != Storage::Kind::Arena ||
                           read_elsewhere(st, mid, s + 2, s + 1);
    // the fused step writes the output while it reads x: the output must not share x's arena bytes
    if (elsewhere || st.groups[static_cast<size_t>(t2.out.group)].storage.kind == Storage::Kind::Arena) continue;
    Step fused;
    fused.kind = StepKind::LmHead;
    fused.label = "kiln LM head (x · Wᵀ, tiled)";
    fused.in = {mm.in[0], t1.out};  // W [N, K], xt [K, M]
    fused.out = t2.out;
    fused.last_node = t2.last_node;
    for (const Step* part : {&t1, &mm, &t2})
      fused.debug_handles.insert(fused.debug_handles.end(), part->debug_handles.begin(), part->debug_handles.end());
    fused.m = mm.n;   // sequence rows
    fused.n = mm.m;   // vocabulary
    fused.k = mm.k;
    if (fused.m > 256 || fused.k > 1024) continue;
    // x's rows or xt's packed panels at the rows' upper bound (steps.cpp: run_lm_head), planned here
    fused.scratch.assign(static_cast<size_t>(lm_head_scratch_floats(fused.m, fused.k)), 0.0f);
    mm = std::move(fused);
    st.steps.erase(st.steps.begin() + static_cast<std::ptrdiff_t>(s + 2));
    if (!dynamic_ && mm.m >= kGemvRows && cpu::sgemm_pack_once())
      mm.label = "kiln LM head (x · Wᵀ, W packed once)";  // below, or at the first call (executor.cpp: table_panels)
    // the table, streamed once per token (the tied embedding's lookup reads its rows from the file)
    Storage& table = st.groups[static_cast<size_t>(mm.in[0].group)].storage;
    if (table.kind == Storage::Kind::Static && !dynamic_ && mm.m >= kGemvRows && cpu::sgemm_pack_once()) {
      // Many rows of a static delegate, where the selected GEMM packs its B once (as fully-connected
      // weights are, nodes/fully_connected.cpp): Wᵀ packed at load as the GEMM's column panels, so the
      // product is x · Wᵀ written straight into the logits' rows (W · xᵀ and a transpose of the
      // [vocabulary, rows] tile wrote 25.7 MB of GPT-2's logits column-wise: 86 against ~70 ms on a Xeon).
      // The file's pages of the table are released as they are packed (table_panels_once). A table the
      // delegate takes as an argument (GPT-2's tied embedding) is packed at the first call instead.
      const float* panels = nullptr;
      KILN_TRY(table_panels_once(root_ ? *root_ : st, file_, static_cast<const float*>(table.data), mm.n, mm.k,
                                 &panels, error_));
      mm.weights = panels;
      mm.weights_panels = true;
    } else if (table.kind == Storage::Kind::Static && (dynamic_ || mm.m < kGemvRows)) {
      const float* copy = nullptr;
      const std::span<const std::byte> bytes(static_cast<const std::byte*>(table.data),
                                             static_cast<size_t>(mm.n * mm.k) * sizeof(float));
      KILN_TRY(in_weight_memory(st, bytes, true, &copy));
      table.data = copy;
    }
  }
  return Status::Ok;
}

}  // namespace kiln::backends::xnnpack::detail
