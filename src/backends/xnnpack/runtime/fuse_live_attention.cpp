// The XNNPACK backend's attention over the live positions of a static KV cache (builder.h).
#include "builder.h"

#include <cmath>

namespace kiln::backends::xnnpack::detail {

// Attention over the live positions of a static KV cache: scores = q · Kᵀ (a few rows), then a
// rows step that only scales them by finite constants, adds an additive mask and takes the
// softmax, then P · V. Positions the mask hides in every row (-inf, or transformers' finfo.min:
// kMaskedBelow) get probability exactly 0 whatever their score, so the scores product skips them
// and P · V reads no V row for them: per token, attention reads the cache up to the current
// position instead of all of it. (Exact for finite K and V, which a cache written by the program
// holds; a non-finite value at a masked position would have made the eager result NaN. A row
// that hides every position runs over all of them, as eager.)
void find_live_attention(State& st) {
  for (size_t s = 0; s + 2 < st.steps.size(); ++s) {
    Step &qk = st.steps[s], &rows = st.steps[s + 1], &pv = st.steps[s + 2];
    if (qk.kind != StepKind::Bmm || !qk.trans_b || rows.kind != StepKind::Rows || pv.kind != StepKind::Bmm ||
        pv.trans_b || rows.cols != qk.n || rows.rows != qk.batch * qk.m || pv.k != qk.n || pv.batch != qk.batch ||
        pv.m != qk.m || rows.row_ops.size() < 2)
      continue;
    const int32_t scores = qk.out.group;
    if (st.groups[static_cast<size_t>(scores)].storage.kind != Storage::Kind::Arena) continue;
    if (read_elsewhere(st, scores, s + 1)) continue;  // the skipped scores are 0, not q · k: nothing else may read them
    auto mem_group = [&](const RowOperand& x) {
      return x.src == RowOperand::Src::Memory ? rows.in[static_cast<size_t>(x.index)].group : -1;
    };
    int32_t cur_slot = -1;  // the running value: the scores (memory) before the first op, then a slot
    auto is_cur = [&](const RowOperand& x) {
      return cur_slot < 0 ? mem_group(x) == scores && !x.scalar && x.period == rows.rows
                          : x.src == RowOperand::Src::Slot && x.index == cur_slot;
    };
    bool ok = true, masked = false;
    RowOperand mask;
    for (size_t i = 0; i + 1 < rows.row_ops.size() && ok; ++i) {
      const RowOp& op = rows.row_ops[i];
      const RowOperand* other = is_cur(op.a) ? &op.b : is_cur(op.b) ? &op.a : nullptr;
      ok = other != nullptr && op.write_group < 0 && !op.out_scalar && op.lo == -INFINITY && op.hi == INFINITY;
      if (!ok) break;
      if (op.kind == RowOpKind::Mul) {  // by finite constants: 0 stays finite
        const int32_t g = mem_group(*other);
        ok = g >= 0 && st.groups[static_cast<size_t>(g)].storage.kind == Storage::Kind::Static;
        if (ok) {
          const auto* c = static_cast<const float*>(st.groups[static_cast<size_t>(g)].storage.data);
          const int64_t count = other->period * (other->scalar ? 1 : rows.cols);
          for (int64_t j = 0; j < count && ok; ++j) ok = std::isfinite(c[j]);
        }
      } else if (op.kind == RowOpKind::Add && !masked) {
        ok = mem_group(*other) >= 0 && mem_group(*other) != scores && !other->scalar && other->period >= 1;
        mask = *other;
        masked = true;
      } else {
        ok = false;
      }
      cur_slot = op.out_slot;
    }
    const RowOp& sm = rows.row_ops.back();
    if (!ok || !masked || sm.kind != RowOpKind::Softmax || !is_cur(sm.a) || sm.write_group < 0 ||
        rows.in[static_cast<size_t>(sm.write_group)].group != pv.in[0].group)
      continue;
    qk.live_mask.group = mem_group(mask);
    qk.live_mask_period = mask.period;
    pv.live_k = true;
    qk.label = "kiln batch matmul (A · Bᵀ, live positions)";
    pv.label = "kiln batch matmul (live positions)";
  }
}

}  // namespace kiln::backends::xnnpack::detail
