// kiln's graph IR: an ATen-level dataflow graph as torch.export produced it.
//
// Values are tensors with static metadata; nodes call an ATen operator
// ("aten.view.default") with named, typed arguments; the signature says which
// graph inputs are user inputs and which are parameters, buffers or constants.
// The IR owns no weight bytes: constants refer to where their bytes live.
#pragma once

#include "kiln/core/dtype.h"

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <variant>
#include <vector>

namespace kiln::graph {

using ValueId = int32_t;

// A dynamic size as torch.export records it, kept simple: an integer constant
// plus a sum of symbols times integer coefficients ("4*s0 + 1"). Products of
// symbols and divisions that do not come out exact are refused by the reader.
struct SymExpr {
  int64_t constant = 0;
  std::vector<std::pair<std::string, int64_t>> terms;  // sorted by symbol name, non-zero coefficients

  bool is_constant() const { return terms.empty(); }
  // The value with every symbol bound; throws kiln::Error naming an unbound symbol.
  int64_t eval(const std::map<std::string, int64_t, std::less<>>& binding) const;
  std::string str() const;
  bool operator==(const SymExpr&) const = default;
};

// A symbol of a dynamic program (torch.export.Dim) and its inclusive range.
struct Symbol {
  std::string name;
  int64_t min = 0, max = 0;
};

// Static tensor metadata: dtype, sizes, strides (in elements) and storage offset.
// A dynamic program's tensors also carry sym_sizes (one expression per dim);
// `sizes` then holds the sizes at the reader's binding (the upper bounds by default).
struct TensorMeta {
  ScalarType dtype = ScalarType::Float;
  std::vector<int64_t> sizes;
  std::vector<int64_t> strides;
  int64_t storage_offset = 0;
  bool requires_grad = false;
  std::vector<SymExpr> sym_sizes;  // empty for a static tensor

  int64_t numel() const;
  int64_t nbytes() const { return numel() * element_size(dtype); }
  // True when strides are the row-major strides of `sizes` (size-1 dims ignored).
  bool is_contiguous() const;
  // Elements of storage the view reaches: storage_offset + 1 + sum((size-1)*stride); 0 if empty.
  int64_t storage_extent() const;
};

// A tensor value of the graph, named as in the exported program.
struct Value {
  std::string name;
  TensorMeta meta;
  int32_t producer = -1;  // index of the node that writes it; -1 for graph inputs
};

enum class MemoryFormat : int8_t { Unknown, ContiguousFormat, ChannelsLast, ChannelsLast3d, PreserveFormat };
enum class Layout : int8_t { Unknown, Strided, Other };

struct Device {
  std::string type = "cpu";
  std::optional<int64_t> index;
};

// One argument of a node call, or one of its outputs.
struct Argument {
  enum class Kind : uint8_t {
    None,
    Tensor,           // tensor value
    Tensors,          // list of tensor values
    OptionalTensors,  // list of optional tensor values (aten.index)
    Int,
    Ints,
    Float,
    Floats,
    Bool,
    Bools,
    String,
    Strings,
    ScalarType,
    MemoryFormat,
    Layout,
    Device,
  };
  Kind kind = Kind::None;
  std::variant<std::monostate, ValueId, std::vector<ValueId>, std::vector<std::optional<ValueId>>, int64_t,
               std::vector<int64_t>, double, std::vector<double>, bool, std::vector<bool>, std::string,
               std::vector<std::string>, kiln::ScalarType, graph::MemoryFormat, graph::Layout, graph::Device>
      payload;

  static Argument none() { return {}; }
  static Argument tensor(ValueId v) { return {Kind::Tensor, v}; }
  static Argument integer(int64_t i) { return {Kind::Int, i}; }

  // The tensors this argument reads (empty for non-tensor kinds).
  std::vector<ValueId> tensor_ids() const;
  // f(id) for each of them, without building the vector (for loops over a whole graph).
  template <class F>
  void for_each_tensor_id(F&& f) const {
    if (kind == Kind::Tensor) {
      f(std::get<ValueId>(payload));
    } else if (kind == Kind::Tensors) {
      for (ValueId v : std::get<std::vector<ValueId>>(payload)) f(v);
    } else if (kind == Kind::OptionalTensors) {
      for (const auto& v : std::get<std::vector<std::optional<ValueId>>>(payload))
        if (v) f(*v);
    }
  }
};

std::string_view argument_kind_name(Argument::Kind kind);

struct NamedArgument {
  std::string name;  // name in the operator schema ("self", "dim", ...)
  Argument arg;
  bool keyword = false;
};

struct Node {
  std::string name;    // the exported node's name ("view_3")
  std::string target;  // operator, "aten.view.default"; torch's "torch.ops." prefix removed
  std::vector<NamedArgument> inputs;
  std::vector<Argument> outputs;  // Tensor, Tensors or None per operator return
  std::string stack_trace;        // user source location, for error messages
  std::string module_path;        // innermost module of the .pt2's nn_module_stack ("transformer.h.3.attn")
  // Debug information (kiln lower's X.debug.json, docs/PROFILING.md): the
  // innermost module's class, and the .pt2 node(s) this node came from
  // (itself, for a node read from the .pt2; the node a decomposition or
  // fusion was lowering, for what it emitted). Default-initialised, so
  // aggregate initialisers that stop at module_path stay complete.
  std::string module_type{};
  std::vector<std::string> source_nodes{};
  bool symbolic = false;          // a dynamic program's node with a SymInt argument (never folded ahead of time)

  const NamedArgument* input(std::string_view name) const;
  std::vector<ValueId> output_ids() const;
};

// What a graph input stands for.
struct InputSpec {
  enum class Kind : uint8_t { UserInput, Parameter, Buffer, TensorConstant, ConstantInput, CustomObj, Token };
  Kind kind = Kind::UserInput;
  std::string arg_name;  // placeholder name in the graph
  std::string target;    // fully qualified name of the parameter/buffer/constant; empty for user inputs
  bool persistent = true;  // buffers only
};

// What a graph output stands for.
struct OutputSpec {
  enum class Kind : uint8_t {
    UserOutput,
    BufferMutation,
    UserInputMutation,
    ParameterMutation,
    LossOutput,
    GradientToParameter,
    GradientToUserInput,
    Token,
  };
  Kind kind = Kind::UserOutput;
  std::string arg_name;  // value returned; empty for non-tensor user outputs
  std::string target;    // mutated buffer / input / parameter name where relevant
};

std::string_view input_kind_name(InputSpec::Kind kind);
std::string_view output_kind_name(OutputSpec::Kind kind);

struct GraphSignature {
  std::vector<InputSpec> inputs;    // one per graph input, same order
  std::vector<OutputSpec> outputs;  // one per graph output, same order
};

class Graph {
 public:
  // A deque: adding a value keeps every reference to the others valid. The passes hold `meta_of(v)` references
  // across calls that add values (a vector's reallocation once left one dangling: a segfault lowering Gemma 4).
  std::deque<Value> values;
  std::vector<Node> nodes;       // topological order
  std::vector<ValueId> inputs;   // placeholders, in order
  std::vector<Argument> outputs; // returned arguments, in order
  std::vector<Symbol> symbols;   // a dynamic program's symbols (empty when static)

  // Adds a value; fails if the name is already taken.
  ValueId add_value(std::string name, TensorMeta meta);
  std::optional<ValueId> find_value(std::string_view name) const;
  const Value& value(ValueId id) const { return values.at(static_cast<size_t>(id)); }

  // Operator target -> number of call sites.
  std::map<std::string, int64_t> operator_histogram() const;

 private:
  std::map<std::string, ValueId, std::less<>> by_name_;
};

}  // namespace kiln::graph
