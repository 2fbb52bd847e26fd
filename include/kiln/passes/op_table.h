// The core-ATen operators kiln emits, with the out-variant each runs as.
// Derived from the operator table (include/kiln/ops/aten_ops.def: the ATen schema text).
//
// For every functional operator kiln's edge graphs may contain ("aten.add.Tensor")
// this table says which out-variant kernel executes it ("aten::add" "out"), the
// schema's arguments in order with their defaults, and the out tensors. The
// emitter builds KernelCall argument lists from it (schema order, defaults
// filled, outs last: ExecuTorch's calling convention) and the constant folder
// uses the same lists to run kernels ahead of time.
#pragma once

#include "kiln/graph/graph.h"

#include <optional>
#include <span>
#include <string_view>
#include <variant>
#include <vector>

namespace kiln::passes {

enum class ArgType : uint8_t {
  Tensor,
  OptionalTensor,
  TensorList,
  OptionalTensorList,
  Int,
  OptionalInt,
  IntList,
  OptionalIntList,
  Float,
  OptionalFloat,
  Scalar,  // int, float or bool
  OptionalScalar,
  Bool,
  OptionalBool,
  ScalarType,
  OptionalScalarType,
  String,
  FloatList,
  OptionalFloatList,
  Ignored,  // layout/device/pin_memory/memory_format: emitted as None where the out variant has them
};

struct ArgSchema {
  std::string_view name;
  ArgType type;
  // Default when the node omits the argument: monostate = required; for optionals, None.
  std::variant<std::monostate, int64_t, double, bool, std::string_view, std::vector<int64_t>> default_value{};
  bool has_default = false;
};

struct OpSchema {
  std::string_view target;        // functional core-ATen target, "aten.add.Tensor"
  std::string_view kernel;        // out-variant operator name, "aten::add"
  std::string_view overload;      // "out"
  std::vector<ArgSchema> args;    // inputs of the out variant, in order (outs excluded)
  int num_outs = 1;               // out tensors appended after args
  bool out_is_list = false;       // one TensorList out (split_with_sizes_copy)
  bool inplace = false;           // in-place form (num_outs 0): args[0] self is written; the node's output is self
  uint16_t op = 0;                // its row in the operator table (kiln::ops::OpId)
};

// Schema for `target`, or nullptr if kiln cannot emit it.
const OpSchema* find_op_schema(std::string_view target);
std::span<const OpSchema> op_schemas();

// Targets whose (contiguous) output has exactly its input's bytes: views the
// folder shares with constants and the emitter turns into shared storage.
bool is_view_like(std::string_view target);

// The node's arguments in schema order with defaults filled in; throws
// kiln::Error naming the node if a required argument is missing or an
// unknown one is present.
std::vector<graph::Argument> ordered_arguments(const OpSchema& schema, const graph::Node& node);

}  // namespace kiln::passes
