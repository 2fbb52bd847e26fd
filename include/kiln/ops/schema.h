// ATen schema text -> argument layout. Shared by the compiler (op table, emitter)
// and the runtime (kernel registry checks), so it builds without exceptions and
// allocates nothing: names are views into the schema text, which must outlive
// the Schema (the table's texts are string literals).
//
//   "aten::gelu.out(Tensor self, *, str approximate='none', Tensor(a!) out) -> Tensor(a!)"
//   -> ns "aten", name "gelu", overload "out",
//      args [self: Tensor, approximate: str = 'none' (kwarg-only), out: Tensor (a!) out]
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace kiln::ops {

// An argument's type, as the schema spells it (SymInt is int; int[N] is int[]).
enum class Type : uint8_t {
  Tensor,
  OptionalTensor,      // Tensor?
  TensorList,          // Tensor[]
  OptionalTensorList,  // Tensor?[]
  Int,                 // int, SymInt
  OptionalInt,
  IntList,             // int[], int[N], SymInt[]
  OptionalIntList,
  Float,
  OptionalFloat,
  Bool,
  OptionalBool,
  Scalar,
  OptionalScalar,
  ScalarType,
  OptionalScalarType,
  String,              // str
  OptionalString,
  MemoryFormat,
  OptionalMemoryFormat,
  OptionalLayout,
  OptionalDevice,
  FloatList,           // float[]
  OptionalFloatList,
  Count,
};

// "Tensor?", "int[]" ...: the schema spelling of a type (for messages).
std::string_view type_name(Type t);
// True for the X? types (their default, when the schema gives none, is None).
bool is_optional(Type t);

struct Default {
  enum class Kind : uint8_t { None, Int, Float, Bool, String, IntList } kind = Kind::None;
  int64_t i = 0;
  double d = 0;
  bool b = false;
  std::string_view s;      // String (unquoted)
  static constexpr int kMaxList = 8;
  int64_t list[kMaxList] = {};
  int list_size = 0;       // IntList
};

struct Arg {
  std::string_view name;
  Type type = Type::Tensor;
  bool kwarg_only = false;  // after the '*'
  bool is_out = false;      // an alias-annotated mutable argument: Tensor(a!) out
  bool has_default = false; // written with '=' in the schema
  Default default_value;    // valid when has_default
};

constexpr int kMaxArgs = 16;

struct Schema {
  std::string_view ns;        // "aten"
  std::string_view name;      // "gelu"
  std::string_view overload;  // "out" ("" when the schema has none)
  Arg args[kMaxArgs];         // in schema order, outs included (they come last)
  int num_args = 0;
  int num_outs = 0;            // trailing out arguments
  bool out_is_list = false;    // a single Tensor(a!)[] out
  bool inplace = false;        // an in-place form: args[0] is Tensor(a!) self, no out arguments

  int num_inputs() const { return num_args - num_outs; }
};

struct ParseError {
  size_t offset = 0;          // into the text
  const char* what = "";      // static message
};

// Parses `text`; false (and *err filled) if it is not a schema kiln understands.
bool parse_schema(std::string_view text, Schema* out, ParseError* err);

}  // namespace kiln::ops
