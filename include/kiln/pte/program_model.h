// ProgramModel: an ExecuTorch program as plain C++ values, built by kiln's
// emitter and serialized by the .pte writer (src/pte). It mirrors the concepts
// of ExecuTorch's program format (execution plans, values, instructions,
// operators, delegates, constant and named data) without depending on the
// flatbuffer code, so the emitter never touches serialization details.
//
// Index conventions follow the format:
//  - every instruction argument, plan input/output and list item is an index
//    into ExecutionPlan::values;
//  - IntList/TensorList/OptionalTensorList items are value indices too (an int
//    list [2, 3] is two Int values plus an IntList naming them); an
//    OptionalTensorList uses -1 for "no tensor";
//  - constant tensor data: Tensor::constant_index > 0 names
//    Program::constants[constant_index]; index 0 is reserved ("not constant");
//  - planned (non-constant) tensors carry an Allocation in one of
//    ExecutionPlan::non_const_buffer_sizes; memory_id 0 is reserved, planned
//    buffers start at memory_id 1.
#pragma once

#include "kiln/core/dtype.h"

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <variant>
#include <vector>

namespace kiln::pte {

struct Allocation {
  uint32_t memory_id = 1;
  uint64_t offset = 0;  // bytes into that buffer
};

struct TensorValue {
  ScalarType dtype = ScalarType::Float;
  std::vector<int32_t> sizes;
  std::vector<uint8_t> dim_order;  // identity (0, 1, ..., n-1) for contiguous
  uint32_t constant_index = 0;     // > 0: Program::constants[constant_index]
  std::optional<Allocation> allocation;  // planned memory for non-constants; none for user inputs fed at run time
  uint32_t mutable_index = 0;      // > 0 (with an allocation): initial contents in Program::mutable_data[mutable_index]
  bool dynamic_bound = false;      // DYNAMIC_BOUND: `sizes` are the upper bounds; kernels resize it per call
};

struct NoneValue {};
struct IntList { std::vector<int32_t> items; };
struct DoubleList { std::vector<double> items; };
struct BoolList { std::vector<bool> items; };
struct TensorList { std::vector<int32_t> items; };
struct OptionalTensorList { std::vector<int32_t> items; };

using Value = std::variant<NoneValue, int64_t, double, bool, std::string, TensorValue, IntList, DoubleList, BoolList,
                           TensorList, OptionalTensorList>;

struct KernelCall { int32_t op_index = 0; std::vector<int32_t> args; };
struct DelegateCall { int32_t delegate_index = 0; std::vector<int32_t> args; };
struct MoveCall { int32_t from = 0; int32_t to = 0; };
struct JumpFalseCall { int32_t cond_value = 0; int32_t destination = 0; };
struct FreeCall { int32_t value = 0; };
using Instruction = std::variant<KernelCall, DelegateCall, MoveCall, JumpFalseCall, FreeCall>;

struct Operator {
  std::string name;      // "aten::add"
  std::string overload;  // "out"
};

struct CompileSpec {
  std::string key;
  std::vector<uint8_t> value;
};

struct BackendDelegate {
  std::string id;                 // backend name, "XnnpackBackend"
  uint32_t payload_index = 0;     // index into Program::delegate_payloads
  std::vector<CompileSpec> compile_specs;
};

struct ExecutionPlan {
  std::string name = "forward";
  std::vector<Value> values;
  std::vector<int32_t> inputs;
  std::vector<int32_t> outputs;
  std::vector<Instruction> instructions;  // a single chain
  std::vector<Operator> operators;
  std::vector<BackendDelegate> delegates;
  std::vector<int64_t> non_const_buffer_sizes{0};  // [0] reserved
  // Pytree specs of inputs/outputs as torch.export writes them; ExecuTorch's
  // Python runtime uses them to flatten arguments. Empty strings when unknown.
  std::string encoded_inputs_spec;
  std::string encoded_outputs_spec;
};

// Bytes the writer copies into the file. Large data (weights) is produced on
// demand by `write`, which streams exactly `size` bytes to the sink, so the
// writer never holds a second copy of the model's weights.
struct DataBlob {
  uint64_t size = 0;
  std::function<void(const std::function<void(std::span<const std::byte>)>& sink)> write;

  static DataBlob from_bytes(std::vector<std::byte> bytes);
};

// Data stored under a key (backends look up weights by name).
struct NamedBlob {
  std::string key;
  DataBlob data;
};

struct Program {
  uint32_t version = 0;
  std::vector<ExecutionPlan> plans;
  std::vector<DataBlob> constants{DataBlob{}};  // [0] reserved placeholder
  std::vector<DataBlob> delegate_payloads;
  std::vector<NamedBlob> named_data;
  std::vector<DataBlob> mutable_data{DataBlob{}};  // [0] reserved; initial contents of mutable buffers
};

}  // namespace kiln::pte
