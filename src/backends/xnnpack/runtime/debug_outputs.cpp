// Intermediate outputs inside kiln's XNNPACK delegates (rt::Backend::enable_debug_outputs): after each
// step, the output of the last payload node it runs, copied into the method's rt::DebugOutputLog under
// that node's debug handle (XNode.debug_handle), as ExecuTorch's XNNPACK delegate logs a node's output
// under its delegate debug identifier. The ETDump writer (kiln profile) gives the entry the step's
// identifier, whose "<k>" names the node in the ETRecord's delegate map.
//
// A step runs one node, or several fused: a chain of elementwise rows (a layer norm, a GELU, a
// softmax: its intermediates live in registers and scratch rows, never in memory), the tied LM head
// (transpose, product, transpose), a transpose folded into the product that reads it, or, without
// --profiling detail, a run of XNNPACK nodes as one subgraph. Such a step logs only its last node's
// output, the value it leaves in memory; its other nodes' outputs are not logged (they are not kept).
// When reshapes that are views (no step) follow and view that output, the entry also names the last
// of them and its sizes: kiln profile names the tensor by that view when the debug map says the view
// and the step's last node lower the same .pt2 operator (matmul as bmm then view; the LM head's linear).
// Not logged at all: a step whose last output is not a plain fp32 tensor in memory (quantized rows,
// a value only a fused chain's registers hold), and the scores of attention over a KV cache's live
// positions (fuse_live_attention.cpp), which leaves the positions its mask hides 0, not q · k.
//
// Off (the default), a call tests one pointer per step. On, a step's output is copied (memcpy) into
// the log's preallocated buffer; nothing is allocated.
#include "builder.h"
#include "kiln/runtime/debug_outputs.h"

namespace kiln::backends::xnnpack::detail {

void Builder::plan_debug_outputs(State& st) const {
  for (Step& step : st.steps) {
    step.debug_value = kInvalidId;
    if (step.last_node < 0 || static_cast<size_t>(step.last_node) >= io_.size()) continue;
    if (step.live_mask.group >= 0) continue;  // live-position scores: hidden positions are 0, not q · k
    const uint32_t v = io_[static_cast<size_t>(step.last_node)].out;
    if (v == kInvalidId || v >= st.values.size()) continue;
    const Value& val = st.values[v];
    if (val.quant != Value::Quant::None || val.elem_bits != 32 || val.group < 0 ||
        static_cast<size_t>(val.group) >= st.groups.size())
      continue;
    const size_t g = static_cast<size_t>(val.group);
    if (st.groups[g].storage.kind == Storage::Kind::None || st.groups[g].storage.kind == Storage::Kind::Static ||
        (g < slot_only_.size() && slot_only_[g]))
      continue;
    step.debug_value = v;
    step.debug_node = xnode(static_cast<size_t>(step.last_node))->debug_handle();
    // the views of that output between this step's nodes and the next step's (reshapes that run no step):
    // a lowering that ends an operator with a view (matmul: bmm, then view) names the operator by it
    step.debug_view_value = kInvalidId;
    uint32_t cur = v;
    for (size_t j = static_cast<size_t>(step.last_node) + 1; j < io_.size() && skip_[j]; ++j)
      if (io_[j].num_in >= 1 && io_[j].in[0] == cur && io_[j].out != kInvalidId && st.values[io_[j].out].group == val.group) {
        cur = io_[j].out;
        step.debug_view_value = cur;
        step.debug_view_node = xnode(j)->debug_handle();
      }
  }
}

void enable_debug_outputs(State& st, rt::DebugOutputLog* log) {
  st.debug_log = log;
  for (auto& p : st.plans) enable_debug_outputs(*p, log);
}

void log_step_output(const State& st, const Step& step, std::span<EValue*> args) {
  if (step.debug_value == kInvalidId) return;
  const Value& v = st.values[step.debug_value];
  const float* data = Operand{v.group}.data(st.groups, st.arena, args);
  if (data == nullptr) return;
  int32_t view_node = -1;
  std::span<const int64_t> view_sizes;
  if (step.debug_view_value != kInvalidId) {
    const Value& w = st.values[step.debug_view_value];
    view_node = static_cast<int32_t>(step.debug_view_node);
    view_sizes = std::span<const int64_t>(w.dims.data(), w.ndims);
  }
  st.debug_log->log(st.debug_log->instruction(), static_cast<int32_t>(step.debug_node), ScalarType::Float,
                    std::span<const int64_t>(v.dims.data(), v.ndims), data, view_node, view_sizes);
}

}  // namespace kiln::backends::xnnpack::detail
