// Internal to kiln's XNNPACK backend: what the planner (builder.h) knows of each kind of payload
// node, in one place per kind, as XNNPACK's src/subgraph/<op>.c and ExecuTorch's XNNCompiler
// define-node table have it: the values it reads and writes, its output's sizes for a call's
// input sizes, its XNNPACK definition (where Debian's XNNPACK has one), its step on kiln's code,
// its op in a fused row chain.
//
// A new node kind: a file here that defines its NodeKind (or a small family's, as binary.cpp),
// and its line in table.cpp. The passes read the table; none switches on node types.
#pragma once

#include "../builder.h"

#include <array>
#include <cstdint>
#include <span>

namespace kiln::backends::xnnpack::detail {

// ---------------------------------------------------------------- contexts

// A node of the payload as a kind's functions see it.
struct NodeContext {
  size_t index;            // in the payload's node list
  const fbx::XNode& node;
  const NodeIO& io;
  ErrorMessage* error;

  NodeType type() const { return node.xnode_union_type(); }
  // "node N (Kind): what", InvalidProgram
  Status bad(const char* what) const;
};

// Shape inference (a dynamic delegate's call): `x` is input 0, `n` the output's rank.
struct ShapeContext {
  const State& st;
  const fbx::XNode& node;
  const NodeIO& io;
  const Value& x;
  size_t n;
  const Value& in(size_t j) const { return st.values[io.in[j]]; }
};
// Unsupported: kiln cannot change this node's sizes per call; Bad: the call's sizes do not fit (what).
struct ShapeResult {
  enum class Kind : uint8_t { Ok, Unsupported, Bad } kind = Kind::Ok;
  const char* what = nullptr;
};
inline ShapeResult shape_ok() { return {}; }
inline ShapeResult shape_unsupported() { return {ShapeResult::Kind::Unsupported, nullptr}; }
inline ShapeResult shape_bad(const char* what) { return {ShapeResult::Kind::Bad, what}; }

// An XNNPACK definition: the subgraph and the node's value ids in it (XNN_INVALID_VALUE_ID where
// absent): inputs 0, 1 and 2 (a bias), the output; its output clamp.
struct DefineContext : NodeContext {
  const State& st;
  xnn_subgraph_t sg;
  uint32_t a, b, bias, o;
  float lo, hi;
};

// A kiln step. `step` arrives with its operands (one per input, the output) and output clamp.
struct StepContext : NodeContext {
  State& st;
  State& owner;                          // keeps the weights every plan of a delegate shares
  const rt::PteFile* file;               // the program's file (null: inline constants)
  bool dynamic;                          // one weight layout for every call's sizes
  const std::vector<bool>& only_packed;  // per value: read only as fully-connected weights
  const Value& in(size_t j) const { return st.values[io.in[j]]; }
  const Value& out() const { return st.values[io.out]; }
  // See Builder::in_weight_memory.
  Status in_weight_memory(std::span<const std::byte> bytes, bool release, const float** out) const {
    return copy_to_weight_memory(owner, file, bytes, release, out, error);
  }
};

// ---------------------------------------------------------------- the kind

struct NodeKind {
  NodeType type = NodeType::NONE;
  // The value ids it reads and writes; false if the node's table is missing.
  bool (*io)(const fbx::XNode& node, NodeIO& io) = nullptr;
  // Its third input (a bias) may be absent.
  bool optional_bias = false;
  // Its output's sizes from its inputs' (XNNPACK's reshape); null: it cannot change them per call.
  ShapeResult (*infer)(const ShapeContext& c, std::array<int64_t, kMaxRank>& d) = nullptr;
  // Its XNNPACK definition; null: it runs on kiln's code only. Sets *s to XNNPACK's answer; a
  // Status other than Ok is a node XNNPACK cannot be asked to define.
  Status (*define)(const DefineContext& c, xnn_status* s) = nullptr;
  // Whether it runs in an XNNPACK subgraph (may fail for nodes no engine runs); null: when it has
  // a definition.
  Status (*on_library)(const NodeContext& c, const State& st, bool* library) = nullptr;
  // XNNPACK's operators get the thread pool with the kiln engine too (convolutions, pooling, resizing).
  bool heavy = false;
  // Its step on kiln's code; null: none.
  Status (*kiln_step)(const StepContext& c, Step& step) = nullptr;
  // Its op in a fused row chain (Engine::Kiln); None: it ends a chain.
  RowOpKind row_op = RowOpKind::None;
};

// A node file's kinds: defines `std::span<const NodeKind> NAME()`, which table.cpp lists.
#define KILN_XNNPACK_NODE_KINDS(NAME, ...)       \
  std::span<const NodeKind> NAME() {             \
    static const NodeKind kinds[] = {__VA_ARGS__}; \
    return kinds;                                \
  }

// The kind of node type `t`; null for a type kiln's XNNPACK backend does not run (table.cpp).
const NodeKind* node_kind(NodeType t);

// ---------------------------------------------------------------- shared by the kinds

// io for the payload's shared node tables: one input (input_id), two (input1_id, input2_id).
template <class T>
bool io_1x1(const T* n, NodeIO& io) {
  if (!n) return false;
  io.in[0] = n->input_id();
  io.num_in = 1;
  io.out = n->output_id();
  return true;
}
template <class T>
bool io_2x1(const T* n, NodeIO& io) {
  if (!n) return false;
  io.in[0] = n->input1_id();
  io.in[1] = n->input2_id();
  io.num_in = 2;
  io.out = n->output_id();
  return true;
}
// A one-input node read through its table's accessor: KILN_XNNPACK_IO(XNNELU).
template <auto As>
bool io_as(const fbx::XNode& node, NodeIO& io) {
  return io_1x1((node.*As)(), io);
}
#define KILN_XNNPACK_IO(TABLE) io_as<&fbx::XNode::xnode_union_as_##TABLE>
bool io_node1x1(const fbx::XNode& node, NodeIO& io);
bool io_node2x1(const fbx::XNode& node, NodeIO& io);
// The output has the input's sizes.
ShapeResult infer_same(const ShapeContext& c, std::array<int64_t, kMaxRank>& d);
// A kiln elementwise step of `op` over the input.
Status unary_step(const StepContext& c, Step& step, UnaryOp op, const char* label);

}  // namespace kiln::backends::xnnpack::detail
