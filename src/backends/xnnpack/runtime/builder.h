// Internal to kiln's XNNPACK backend: the planner that turns a delegate payload into a State
// (backend_state.h), in passes, each in its own file:
//
//   parse.cpp             the payload's header, values (their constants, quantization) and nodes
//   infer_dims.cpp        a dynamic delegate's sizes for one call, node by node
//   storage_plan.cpp      storage groups (reshape views), lifetimes, the arena
//   fuse_rows.cpp         fused elementwise row chains (Engine::Kiln)
//   make_steps.cpp        the steps: XNNPACK subgraphs and kiln's steps, in node order
//   fuse_lm_head.cpp      the tied LM head's transpose(bmm(W, transpose(x))) as one step
//   fuse_transposed_bmm.cpp  a transpose of B folded into the bmm that reads it
//   fuse_live_attention.cpp  attention over the live positions of a static KV cache
//   executor.cpp          a call: binds the arguments, runs the steps
//
// What each node kind reads and writes, its sizes, its XNNPACK definition and its kiln step:
// nodes/ (nodes/node_kind.h). Runtime code: no exceptions, no RTTI.
#pragma once

#include "backend_state.h"
#include "kiln/fb/xnnpack_graph_generated.h"
#include "kiln/runtime/pte_file.h"
#include "kiln/runtime/try.h"

#include <xnnpack.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace kiln::backends::xnnpack::detail {

namespace fbx = kiln::fb::xnnpack;
using rt::ErrorMessage;
using rt::Status;
using NodeType = fbx::XNodeUnion;

// Formats "XnnpackBackend: <message>" into `error` (when given) and returns `s`.
Status fail(ErrorMessage* error, Status s, const char* format, ...) __attribute__((format(printf, 3, 4)));

inline const char* node_name(NodeType t) { return fbx::EnumNameXNodeUnion(t); }

struct NodeIO {
  std::array<uint32_t, 5> in{kInvalidId, kInvalidId, kInvalidId, kInvalidId, kInvalidId};
  size_t num_in = 0;
  uint32_t out = kInvalidId;
};

// The plan's activations (zeroed), if not made yet.
Status ensure_arena(State& st, ErrorMessage* error);
// The subgraphs whose values all live in the arena or constants, set up on it (once: those that
// bind the call's arguments are set up per call).
Status setup_subgraphs(State& st, ErrorMessage* error);

// Whether a step other than `reader` reads `group` (as an operand, or as a subgraph's external value,
// which `writer`'s own externals are not counted as: it writes the group). The fusions rewrite
// what an intermediate holds, or drop it: only when its one reader is the step they fuse.
bool read_elsewhere(const State& st, int32_t group, size_t reader, size_t writer = SIZE_MAX);

// fuse_live_attention.cpp
void find_live_attention(State& st);

// fuse_rows.cpp: attention's scaling by a constant, additive mask and softmax in each rows step as one
// operation (after find_live_attention, which reads the three); the step's label follows.
void fuse_scaled_softmax(State& st);

class Builder {
 public:
  // file: where named constants come from; null for payloads that carry their constants inline
  Builder(const rt::PteFile* file, ErrorMessage* error) : file_(file), error_(error) {}

  Status build(std::span<const std::byte> payload, State& st);
  // A plan of a dynamic delegate (State::dynamic): `root` is the plan at the payload's sizes, which
  // owns the weights every plan shares; `call`, if not empty, the call whose input sizes this plan
  // is for (else the payload's).
  void plan_for(State* root, std::span<EValue* const> call) {
    root_ = root;
    call_ = call;
    dynamic_ = true;
  }

 private:
  Status parse(std::span<const std::byte> payload, State& st);
  Status infer_dims(State& st);
  Status plan_storage(State& st);
  Status make_steps(State& st);
  Status subgraph_step(State& st, size_t begin, size_t end);
  Status kiln_step(State& st, size_t index);
  Status fuse_lm_head(State& st);
  void fuse_transposed_bmm(State& st);
  const fbx::XNode* xnode(size_t i) const { return graph_->xnodes()->Get(static_cast<flatbuffers::uoffset_t>(i)); }
  // The debug handles of nodes [begin, end) a step runs (not views, not chain members).
  void add_handles(Step& step, size_t begin, size_t end) const {
    for (size_t i = begin; i < end; ++i)
      if (!skip_[i] && chain_of_[i] < 0) {
        step.debug_handles.push_back(xnode(i)->debug_handle());
        step.last_node = static_cast<int32_t>(i);
      }
  }
  // Each step's debug output (Step::debug_value): its last node's output, where it stays in memory
  // (debug_outputs.cpp).
  void plan_debug_outputs(State& st) const;
  template <class ConstantAt>
  Status quant_params(const fbx::XNNQuantizedTensorValue& qv, uint32_t id, Value& val, const ConstantAt& constant_at);
  Status quantized_rows(State& st);
  Status check_value(const State& st, uint32_t id, size_t node, const char* role) const;
  // *out: `bytes` (fp32 weights of the file, streamed once per token) copied into weight_memory,
  // once per delegate (every plan reads the same copy), the file's pages released if `release`;
  // with KILN_HUGE_PAGES=0 the file's own bytes.
  Status in_weight_memory(State& st, std::span<const std::byte> bytes, bool release, const float** out) {
    return copy_to_weight_memory(root_ ? *root_ : st, file_, bytes, release, out, error_);
  }

  const rt::PteFile* file_;
  ErrorMessage* error_;
  const fbx::XNNGraph* graph_ = nullptr;
  std::vector<NodeIO> io_;
  std::vector<bool> skip_;                 // reshapes that are views
  std::vector<bool> only_packed_;          // per value: read only as fully-connected weights
  State* root_ = nullptr;                  // who owns repacked weights (State::qb4w_panels): st itself if null
  std::span<EValue* const> call_;          // dynamic: the call this plan is for
  bool dynamic_ = false;                   // the delegate's sizes change per call: one weight layout for all
  // fused row chains (Engine::Kiln)
  Status find_chains(State& st);
  bool add_row_op(const State& st, size_t node, int64_t rows, int64_t cols, Step& step,
                  std::vector<int32_t>& slot_of_group, std::vector<bool>& slot_scalar);
  struct Chain {
    size_t begin = 0, last = 0;  // first and last member node
    Step step;
  };
  std::vector<Chain> chains_;
  std::vector<int32_t> chain_of_;          // per node: its chain, or -1
  std::vector<bool> slot_only_;            // per group: lives only in a chain's row slots
};

}  // namespace kiln::backends::xnnpack::detail
