#include "kiln/passes/op_table.h"

#include "kiln/core/error.h"

#include "kiln/ops/op_id.h"

#include <map>

// The schemas come from the operator table, src/ops/aten_ops.def (the ATen
// schema text of each out variant, parsed by src/ops/schema.cpp): every line
// with a functional target becomes an OpSchema here. Arguments the out variant
// lacks (dtype/layout/device/pin_memory of factory functions) are not in its
// schema: the node's value for them is checked and dropped by the decomposer.

namespace kiln::passes {
namespace {

ArgType arg_type(ops::Type t) {
  using T = ops::Type;
  switch (t) {
    case T::Tensor: return ArgType::Tensor;
    case T::OptionalTensor: return ArgType::OptionalTensor;
    case T::TensorList: return ArgType::TensorList;
    case T::OptionalTensorList: return ArgType::OptionalTensorList;
    case T::Int: return ArgType::Int;
    case T::OptionalInt: return ArgType::OptionalInt;
    case T::IntList: return ArgType::IntList;
    case T::OptionalIntList: return ArgType::OptionalIntList;
    case T::Float: return ArgType::Float;
    case T::OptionalFloat: return ArgType::OptionalFloat;
    case T::Bool: return ArgType::Bool;
    case T::OptionalBool: return ArgType::OptionalBool;
    case T::Scalar: return ArgType::Scalar;
    case T::OptionalScalar: return ArgType::OptionalScalar;
    case T::ScalarType: return ArgType::ScalarType;
    case T::OptionalScalarType: return ArgType::OptionalScalarType;
    case T::String: case T::OptionalString: return ArgType::String;
    case T::FloatList: return ArgType::FloatList;
    case T::OptionalFloatList: return ArgType::OptionalFloatList;
    case T::MemoryFormat: case T::OptionalMemoryFormat: case T::OptionalLayout: case T::OptionalDevice:
    case T::Count: break;
  }
  return ArgType::Ignored;
}

ArgSchema arg_schema(const ops::Arg& a) {
  ArgSchema out{a.name, arg_type(a.type)};
  // an optional argument the schema gives no default defaults to None
  out.has_default = a.has_default || ops::is_optional(a.type);
  if (!a.has_default) return out;
  const ops::Default& d = a.default_value;
  switch (d.kind) {
    case ops::Default::Kind::None: break;
    case ops::Default::Kind::Int: out.default_value = d.i; break;
    case ops::Default::Kind::Float: out.default_value = d.d; break;
    case ops::Default::Kind::Bool: out.default_value = d.b; break;
    case ops::Default::Kind::String: out.default_value = d.s; break;
    case ops::Default::Kind::IntList:
      out.default_value = std::vector<int64_t>(d.list, d.list + d.list_size);
      break;
  }
  return out;
}

std::vector<OpSchema> build_table() {
  ops::OpId bad;
  if (const char* why = ops::check_op_table(&bad))
    fail("operator table: line {} ('{}'): {}", ops::op_info(bad).id, ops::op_info(bad).schema, why);
  std::vector<OpSchema> t;
  for (size_t i = 0; i < ops::kNumOps; ++i) {
    const auto id = static_cast<ops::OpId>(i);
    const ops::OpInfo& info = ops::op_info(id);
    if (info.target.empty()) continue;
    const ops::Schema& s = ops::op_schema(id);
    std::string_view name = ops::op_name(id);
    OpSchema o{info.target, name.substr(0, s.overload.empty() ? name.size() : name.size() - s.overload.size() - 1),
               s.overload, {}};
    for (int k = 0; k < s.num_inputs(); ++k) o.args.push_back(arg_schema(s.args[k]));
    o.num_outs = s.num_outs;
    o.out_is_list = s.out_is_list;
    o.inplace = s.inplace;
    o.op = static_cast<uint16_t>(id);
    t.push_back(std::move(o));
  }
  return t;
}

const std::vector<OpSchema>& table() {
  static const std::vector<OpSchema> t = build_table();
  return t;
}

const std::map<std::string_view, const OpSchema*>& index() {
  static const std::map<std::string_view, const OpSchema*> by_target = [] {
    std::map<std::string_view, const OpSchema*> m;
    for (const auto& s : table()) m.emplace(s.target, &s);
    return m;
  }();
  return by_target;
}

graph::Argument default_argument(const ArgSchema& a) {
  graph::Argument arg;
  if (std::holds_alternative<int64_t>(a.default_value)) {
    arg.kind = graph::Argument::Kind::Int;
    arg.payload = std::get<int64_t>(a.default_value);
  } else if (std::holds_alternative<double>(a.default_value)) {
    arg.kind = graph::Argument::Kind::Float;
    arg.payload = std::get<double>(a.default_value);
  } else if (std::holds_alternative<bool>(a.default_value)) {
    arg.kind = graph::Argument::Kind::Bool;
    arg.payload = std::get<bool>(a.default_value);
  } else if (std::holds_alternative<std::string_view>(a.default_value)) {
    arg.kind = graph::Argument::Kind::String;
    arg.payload = std::string(std::get<std::string_view>(a.default_value));
  } else if (std::holds_alternative<std::vector<int64_t>>(a.default_value)) {
    arg.kind = graph::Argument::Kind::Ints;
    arg.payload = std::get<std::vector<int64_t>>(a.default_value);
  }
  return arg;  // None for optionals
}

// Serialized graphs are loose about some argument kinds; the out-variant
// kernels are not: a list of tensors where the schema has Tensor?[], an int
// where it has float.
graph::Argument coerce(const ArgSchema& a, const graph::Argument& arg) {
  using K = graph::Argument::Kind;
  if (a.type == ArgType::OptionalTensorList && arg.kind == K::Tensors) {
    std::vector<std::optional<graph::ValueId>> ids;
    for (graph::ValueId v : std::get<std::vector<graph::ValueId>>(arg.payload)) ids.emplace_back(v);
    return {K::OptionalTensors, std::move(ids)};
  }
  if (a.type == ArgType::Float && arg.kind == K::Int)
    return {K::Float, static_cast<double>(std::get<int64_t>(arg.payload))};
  return arg;
}

}  // namespace

const OpSchema* find_op_schema(std::string_view target) {
  auto it = index().find(target);
  return it == index().end() ? nullptr : it->second;
}

std::span<const OpSchema> op_schemas() { return table(); }

bool is_view_like(std::string_view target) {
  return target == "aten.view_copy.default" || target == "aten.unsqueeze_copy.default" ||
         target == "aten.squeeze_copy.dims" || target == "aten.alias_copy.default" ||
         target == "dim_order_ops._clone_dim_order.default";
}

std::vector<graph::Argument> ordered_arguments(const OpSchema& schema, const graph::Node& node) {
  std::vector<graph::Argument> out;
  out.reserve(schema.args.size());
  size_t matched = 0;
  for (const auto& a : schema.args) {
    if (const auto* na = node.input(a.name)) {
      out.push_back(coerce(a, na->arg));
      ++matched;
    } else if (a.has_default) {
      out.push_back(default_argument(a));
    } else {
      fail("node '{}' ({}): missing required argument '{}'", node.name, node.target, a.name);
    }
  }
  if (matched != node.inputs.size()) {
    for (const auto& na : node.inputs) {
      bool known = false;
      for (const auto& a : schema.args) known = known || a.name == na.name;
      if (!known) fail("node '{}' ({}): unexpected argument '{}'", node.name, node.target, na.name);
    }
  }
  return out;
}

}  // namespace kiln::passes
