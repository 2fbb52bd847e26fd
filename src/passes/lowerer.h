// The to-edge lowerer, shared by the rewrite families. Private to kiln_passes:
// include it only from src/passes. One class, its work in one file per part:
//   lowerer.cpp            the frame: inputs, outputs, emission, folding on the
//                          spot, dead code
//   building_blocks.cpp    views, permutes, conversions, matrix products
//   decompose.cpp          the walk: Lowerer::lower, one source node at a time
//   decompositions.cpp     the table of decompositions by operator
//   rewrites_<family>.cpp  the rewrite families (declared at the end of the class)
#pragma once

#include "fold.h"
#include "kiln/core/error.h"
#include "kiln/passes/edge_program.h"
#include "kiln/passes/op_table.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <map>
#include <numeric>
#include <optional>
#include <set>

namespace kiln::passes::detail {


using graph::Argument;
using graph::NamedArgument;
using graph::Node;
using graph::TensorMeta;
using graph::ValueId;

// Folding may only create constants this small unless it replaces its inputs.
inline constexpr int64_t kFoldLimitBytes = 1 << 20;

inline TensorMeta contiguous(ScalarType dtype, std::vector<int64_t> sizes) {
  TensorMeta m;
  m.dtype = dtype;
  m.strides.resize(sizes.size());
  int64_t s = 1;
  for (size_t i = sizes.size(); i-- > 0;) {
    m.strides[i] = s;
    s *= std::max<int64_t>(sizes[i], 1);
  }
  m.sizes = std::move(sizes);
  return m;
}

inline TensorMeta contiguous(const TensorMeta& m) { return contiguous(m.dtype, m.sizes); }

inline NamedArgument NA(std::string_view name, Argument a) { return {std::string(name), std::move(a), false}; }
inline Argument tensor_arg(ValueId v) { return Argument::tensor(v); }
inline Argument int_arg(int64_t v) { return Argument::integer(v); }
inline Argument ints_arg(std::vector<int64_t> v) { return {Argument::Kind::Ints, std::move(v)}; }
inline Argument float_arg(double v) { return {Argument::Kind::Float, v}; }
inline Argument bool_arg(bool v) { return {Argument::Kind::Bool, v}; }

// "File "x.py", line 12, in f\n    code" -> "x.py:12"
inline std::string source_location(const std::string& stack_trace) {
  auto pos = stack_trace.rfind("File \"");
  if (pos == std::string::npos) return {};
  auto end = stack_trace.find('"', pos + 6);
  auto line = stack_trace.find("line ", end);
  if (end == std::string::npos || line == std::string::npos) return {};
  auto line_end = stack_trace.find_first_not_of("0123456789", line + 5);
  std::string file = stack_trace.substr(pos + 6, end - pos - 6);
  if (auto slash = file.rfind('/'); slash != std::string::npos) file = file.substr(slash + 1);
  return file + ":" + stack_trace.substr(line + 5, line_end - line - 5);
}

class Lowerer {
 public:
  Lowerer(const pt2::ExportedProgram& ep, LoweringStats* stats, const EdgeOptions& options = {})
      : ep_(ep), stats_(stats), options_(options) {
    out_.exported = &ep;
    out_.inputs_spec = ep.inputs_spec;
    out_.outputs_spec = ep.outputs_spec;
    vmap_.resize(ep.graph.values.size());
    count_storage_uses();
  }

  EdgeProgram run();

  // ---- setup -------------------------------------------------------------
  void count_storage_uses();
  static std::string storage_key(const pt2::ConstantTensor& c) {
    return fmt::format("{}+{}@{}", c.entry, c.entry_offset, c.meta.storage_offset);
  }

  void bind_inputs();
  void bind_outputs();
  void remove_dead_code();

  // ---- emission ----------------------------------------------------------
  std::string fresh_name(std::string_view hint);

  // Adds the node (or folds it) and returns its outputs.
  std::vector<ValueId> emit_raw(std::string_view target, std::vector<NamedArgument> args, std::vector<TensorMeta> metas,
                                std::string_view hint = {});

  std::optional<ValueId> reduction_of_a_0d_tensor(std::string_view target, const std::vector<NamedArgument>& args,
                                                  const std::vector<TensorMeta>& metas);

  // Every argument the out variant's schema takes as a Tensor is one: a Python number there (sub.Tensor(1, x),
  // as a full core-ATen decomposition writes `1 - x`) becomes a 0-d constant tensor, since ExecuTorch's runtime
  // aborts on a scalar EValue where its kernel reads a tensor. Anything else in a tensor's place is an error.
  void check_argument_kinds(std::string_view target, const OpSchema& schema, std::vector<NamedArgument>& args,
                            const std::vector<TensorMeta>& metas);
  ValueId emit(std::string_view target, std::vector<NamedArgument> args, TensorMeta meta, std::string_view hint = {}) {
    return emit_raw(target, std::move(args), {std::move(meta)}, hint)[0];
  }

  bool all_inputs_constant(const Node& node) const;
  bool try_fold(const Node& node, const OpSchema& schema);

  // ---- source argument access --------------------------------------------
  [[noreturn]] void unsupported(const Node& n, const std::string& why) const {
    std::string where = source_location(n.stack_trace);
    fail("cannot lower node '{}' ({}){}: {}", n.name, n.target, where.empty() ? "" : " at " + where, why);
  }

  const Argument* opt(const Node& n, std::string_view name) const {
    const auto* a = n.input(name);
    return a ? &a->arg : nullptr;
  }

  const Argument& arg(const Node& n, std::string_view name) const {
    const auto* a = opt(n, name);
    if (!a) unsupported(n, fmt::format("missing argument '{}'", name));
    return *a;
  }

  ValueId mapped(ValueId src) const {
    auto v = vmap_.at(static_cast<size_t>(src));
    if (!v) fail("internal: tensor '{}' used before it was lowered", ep_.graph.value(src).name);
    return *v;
  }

  ValueId tensor_in(const Node& n, std::string_view name) const {
    const Argument& a = arg(n, name);
    if (a.kind != Argument::Kind::Tensor) unsupported(n, fmt::format("argument '{}' is not a tensor", name));
    return mapped(std::get<ValueId>(a.payload));
  }

  std::optional<ValueId> opt_tensor_in(const Node& n, std::string_view name) const {
    const Argument* a = opt(n, name);
    if (!a || a->kind == Argument::Kind::None) return std::nullopt;
    return tensor_in(n, name);
  }

  int64_t int_in(const Node& n, std::string_view name, std::optional<int64_t> dflt = std::nullopt) const {
    const Argument* a = opt(n, name);
    if (!a || a->kind == Argument::Kind::None) {
      if (dflt) return *dflt;
      unsupported(n, fmt::format("missing argument '{}'", name));
    }
    if (a->kind == Argument::Kind::Int) return std::get<int64_t>(a->payload);
    if (a->kind == Argument::Kind::Bool) return std::get<bool>(a->payload) ? 1 : 0;
    unsupported(n, fmt::format("argument '{}' is not an int", name));
  }

  std::vector<int64_t> ints_in(const Node& n, std::string_view name) const {
    const Argument& a = arg(n, name);
    if (a.kind == Argument::Kind::Ints) return std::get<std::vector<int64_t>>(a.payload);
    if (a.kind == Argument::Kind::Int) return {std::get<int64_t>(a.payload)};
    unsupported(n, fmt::format("argument '{}' is not an int list", name));
  }

  std::optional<ScalarType> dtype_in(const Node& n, std::string_view name = "dtype") const {
    const Argument* a = opt(n, name);
    if (!a || a->kind == Argument::Kind::None) return std::nullopt;
    if (a->kind != Argument::Kind::ScalarType) unsupported(n, fmt::format("argument '{}' is not a dtype", name));
    return std::get<ScalarType>(a->payload);
  }

  // A node argument remapped onto edge values.
  Argument remap(const Argument& a) const;
  std::vector<ValueId> source_outputs(const Node& n) const { return n.output_ids(); }
  TensorMeta out_meta(const Node& n, size_t i = 0) const {
    auto outs = source_outputs(n);
    if (i >= outs.size()) unsupported(n, "node has fewer outputs than its operator returns");
    return contiguous(ep_.graph.value(outs[i]).meta);
  }
  const TensorMeta& meta_of(ValueId edge_value) const { return out_.graph.value(edge_value).meta; }

  void bind(const Node& n, ValueId v, size_t i = 0) {
    auto outs = source_outputs(n);
    if (i < outs.size()) vmap_[static_cast<size_t>(outs[i])] = v;
  }
  void bind_all(const Node& n, const std::vector<ValueId>& vs) {
    auto outs = source_outputs(n);
    for (size_t i = 0; i < outs.size() && i < vs.size(); ++i) vmap_[static_cast<size_t>(outs[i])] = vs[i];
  }

  // ---- building blocks -----------------------------------------------------
  ValueId view(ValueId x, std::vector<int64_t> sizes);
  ValueId permute(ValueId x, std::vector<int64_t> dims, std::string_view hint = "permute");

  // y = x @ W^T with W a tied weight: (W @ x^T)^T, so W is neither copied
  // per run nor stored transposed. `bias` is added after.
  ValueId matmul_shared_transposed(ValueId x, ValueId w, std::optional<ValueId> bias, const TensorMeta& m);
  ValueId expand(ValueId x, const std::vector<int64_t>& sizes);
  ValueId convert(ValueId x, ScalarType dtype);
  ValueId scalar_tensor(const Argument& scalar, ScalarType dtype);

  // The transposed weight of a linear layer: computed ahead of time when the
  // weight's storage is read by this node only (the original then disappears),
  // otherwise at run time so a tied weight is stored once.
  // A weight from the .pt2 whose storage other nodes read too (tied parameters).
  bool is_shared_weight(ValueId v);
  ValueId transposed_weight(ValueId w);
  static int64_t wrap_dim(int64_t d, size_t rank) { return d < 0 ? d + static_cast<int64_t>(rank) : d; }

  // ---- the rewrite of one source node ---------------------------------------
  void lower(const Node& n);
  ValueId matmul(const Node& n, ValueId a, ValueId b, const TensorMeta& m);

  // The edge node that computes `v`, if it is `target`.
  const Node* produced_by(ValueId v, std::string_view target) const;

  // Grouped-query attention written out (transformers' repeat_kv: x[:, :, None].expand(b, hk, G, s, d)
  // .reshape(b, hk * G, s, d)): `v` [..., hk*G, S, D] repeats each head of x [..., hk, S, D] G times.
  // Returns x and G when `v` is that view of that expand (heads on axis `rank - 3`).
  struct HeadRepeat {
    ValueId x;
    int64_t groups;
  };
  std::optional<HeadRepeat> head_repeat(ValueId v) const;

  // a [..., hk*G, M, K] @ b, where b (or b with its last two axes swapped) repeats each of hk heads G times:
  // the G query heads of a group become the rows of one bmm against the unrepeated head, so neither K
  // nor V is copied G times (the copy is what the repeat costs: XNNPACK materialises it every call).
  std::optional<ValueId> grouped_matmul(ValueId a, ValueId b, const TensorMeta& m);

  // ---- rewrite families, one file each (rewrites_<family>.cpp); each returns
  // true when it lowered `n` (bound its outputs), false when `n` is not its op.
  bool lower_decomposition(const Node& n);  // decompositions.cpp: the table of rewrites by operator
  bool lower_attention(const Node& n);  // SDPA, norms, activations
  bool lower_conv(const Node& n);       // convolutions, pooling, resizing, batch norm
  ValueId constant_tensor(ScalarType dtype, std::vector<int64_t> sizes, std::vector<std::byte> bytes,
                          std::string_view hint);  // rewrites_conv.cpp
  ValueId resize_dim(ValueId x, size_t dim, const std::vector<std::vector<int64_t>>& idx,
                     const std::vector<std::vector<float>>& w);  // rewrites_conv.cpp
  bool try_fold_batch_norm(const Node& n, ValueId x, std::optional<ValueId> gamma, std::optional<ValueId> beta,
                           ValueId mean, ValueId var, double eps);  // rewrites_conv.cpp
  std::optional<std::pair<ValueId, ValueId>> batch_norm_scale_shift(ValueId x, std::optional<ValueId> gamma,
                                                                    std::optional<ValueId> beta, ValueId mean,
                                                                    ValueId var, double eps);  // rewrites_conv.cpp
  bool lower_sequence(const Node& n);   // RNNs, einsum, sort/topk, scatter/gather, index ops
  void lower_rnn(const Node& n, int cell);  // (rewrites_sequence.cpp)
  void lower_einsum(const Node& n);
  bool lower_math(const Node& n);        // norms and distances (rewrites_math.cpp)
  void lower_vector_norm(const Node& n);
  double number_in(const Node& n, std::string_view name, double dflt) const;
  bool lower_state(const Node& n);      // mutable buffers, dynamic shapes
  bool lower_data(const Node& n);       // diagonals, as_strided, index_fill/add, circular pad (rewrites_data.cpp)
  // Programs quantized before export (rewrites_quant.cpp): torchao's affine quantization ops.
  bool lower_quant(const Node& n);
  bool lower_decomposed_quant(const Node& n);  // PT2E's quantized_decomposed.* ops
  void bind_quantized_weight(const Node& n, ValueId q, ValueId s, std::optional<ValueId> z, int64_t qmin,
                             int64_t qmax, int64_t group);
  struct ActQuant {
    ValueId x;                   // source value quantized per token
    std::vector<int64_t> block;  // block_size
  };
  std::map<ValueId, ActQuant> act_qparams_;  // source scale / zero point -> what choose_qparams read
  std::map<ValueId, ActQuant> act_quantized_;  // source int8 activation -> what it quantizes
  std::set<ValueId> fake_quant_src_;          // source values: activations quantized and dequantized per token
  std::set<ValueId> quantized_weight_src_;    // source values: dequantize_affine of a quantized weight
  // Mutable state (rewrites_state.cpp): which buffers the program mutates, the
  // value each holds at the end of a call, and the in-place write of that value.
  bool is_mutated_buffer(const std::string& fqn) const;
  void bind_buffer_mutation(const graph::OutputSpec& spec, const Argument& value);
  void finish_state();
  static bool writes_state(const Node& n);
  struct BufferWrite {
    ValueId buffer;  // edge value of the mutable buffer
    ValueId value;   // edge value it must hold when the call returns
  };
  std::vector<BufferWrite> buffer_writes_;
  // User inputs the program updates (USER_INPUT_MUTATION: caches passed in by the caller): input -> its name,
  // and the value each must hold when the call returns, with the position of the output that returns it.
  std::map<ValueId, std::string> mutated_inputs_;
  struct InputWrite {
    ValueId input;
    ValueId value;
    size_t output;  // index into out_.outputs
  };
  std::vector<InputWrite> input_writes_;
  void bind_input_mutation(const graph::OutputSpec& spec, const Argument& value);
  const pt2::ExportedProgram& ep_;
  LoweringStats* stats_;
  EdgeProgram out_;
  std::vector<std::optional<ValueId>> vmap_;
  std::map<std::string, int64_t> storage_uses_;
  std::map<ValueId, ValueId> transpose_of_shared_;  // permute(W,[1,0]) -> W, for tied weights
  const Node* current_ = nullptr;
  bool no_fold_ = false;  // the node being lowered has symbolic arguments
  int64_t folded_ = 0;
  int name_counter_ = 0;
  bool force_fold_ = false;
  EdgeOptions options_;
};

}  // namespace kiln::passes::detail
