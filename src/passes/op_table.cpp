#include "kiln/passes/op_table.h"

#include "kiln/core/error.h"

#include <deque>
#include <map>

// Schemas transcribed from the ATen operator signatures (out variants) that
// ExecuTorch's portable kernel library registers. Arguments the out variant
// lacks (dtype/layout/device/pin_memory of factory functions) are simply not
// listed: the node's value for them is checked and dropped by the decomposer.

namespace kiln::passes {
namespace {

using A = ArgSchema;
A T(std::string_view n) { return {n, ArgType::Tensor}; }
A OT(std::string_view n) { return {n, ArgType::OptionalTensor, {}, true}; }
A TL(std::string_view n) { return {n, ArgType::TensorList}; }
A OTL(std::string_view n) { return {n, ArgType::OptionalTensorList}; }
A I(std::string_view n) { return {n, ArgType::Int}; }
A I(std::string_view n, int64_t d) { return {n, ArgType::Int, d, true}; }
A OI(std::string_view n) { return {n, ArgType::OptionalInt, {}, true}; }
A IL(std::string_view n) { return {n, ArgType::IntList}; }
A OIL(std::string_view n) { return {n, ArgType::OptionalIntList, {}, true}; }
A F(std::string_view n) { return {n, ArgType::Float}; }
A S(std::string_view n) { return {n, ArgType::Scalar}; }
A S(std::string_view n, int64_t d) { return {n, ArgType::Scalar, d, true}; }
A B(std::string_view n, bool d) { return {n, ArgType::Bool, d, true}; }
A ODT(std::string_view n) { return {n, ArgType::OptionalScalarType, {}, true}; }
A STR(std::string_view n, std::string_view d) { return {n, ArgType::String, d, true}; }

std::vector<OpSchema> build_table() {
  std::vector<OpSchema> t;
  auto binary = [&](std::string_view target, std::string_view kernel, std::string_view overload, bool alpha) {
    std::vector<A> args{T("self"), T("other")};
    if (alpha) args.push_back(S("alpha", 1));
    t.push_back({target, kernel, overload, args});
  };
  binary("aten.add.Tensor", "aten::add", "out", true);
  binary("aten.sub.Tensor", "aten::sub", "out", true);
  binary("aten.mul.Tensor", "aten::mul", "out", false);
  binary("aten.div.Tensor", "aten::div", "out", false);
  binary("aten.minimum.default", "aten::minimum", "out", false);
  binary("aten.maximum.default", "aten::maximum", "out", false);
  binary("aten.pow.Tensor_Tensor", "aten::pow", "Tensor_Tensor_out", false);
  binary("aten.bitwise_and.Tensor", "aten::bitwise_and", "Tensor_out", false);
  binary("aten.bitwise_or.Tensor", "aten::bitwise_or", "Tensor_out", false);
  binary("aten.logical_and.default", "aten::logical_and", "out", false);
  binary("aten.logical_or.default", "aten::logical_or", "out", false);
  t.push_back({"aten.div.Tensor_mode", "aten::div", "out_mode", {T("self"), T("other"), {"rounding_mode", ArgType::String, {}, true}}});
  t.push_back({"aten.add.Scalar", "aten::add", "Scalar_out", {T("self"), S("other"), S("alpha", 1)}});
  t.push_back({"aten.sub.Scalar", "aten::sub", "Scalar_out", {T("self"), S("other"), S("alpha", 1)}});
  t.push_back({"aten.rsub.Scalar", "aten::rsub", "Scalar_out", {T("self"), S("other"), S("alpha", 1)}});
  t.push_back({"aten.mul.Scalar", "aten::mul", "Scalar_out", {T("self"), S("other")}});
  t.push_back({"aten.div.Scalar", "aten::div", "Scalar_out", {T("self"), S("other")}});
  t.push_back({"aten.pow.Tensor_Scalar", "aten::pow", "Tensor_Scalar_out", {T("self"), S("exponent")}});
  for (auto cmp : {"eq", "ne", "lt", "le", "gt", "ge"}) {
    static std::deque<std::string> names;  // stable storage for the composed names (deque: no moves)
    names.push_back(fmt::format("aten.{}.Tensor", cmp));
    std::string_view tensor_target = names.back();
    names.push_back(fmt::format("aten.{}.Scalar", cmp));
    std::string_view scalar_target = names.back();
    names.push_back(fmt::format("aten::{}", cmp));
    std::string_view kernel = names.back();
    t.push_back({tensor_target, kernel, "Tensor_out", {T("self"), T("other")}});
    t.push_back({scalar_target, kernel, "Scalar_out", {T("self"), S("other")}});
  }
  for (auto [target, kernel] : std::initializer_list<std::pair<std::string_view, std::string_view>>{
           {"aten.neg.default", "aten::neg"},       {"aten.abs.default", "aten::abs"},
           {"aten.exp.default", "aten::exp"},       {"aten.log.default", "aten::log"},
           {"aten.sqrt.default", "aten::sqrt"},     {"aten.rsqrt.default", "aten::rsqrt"},
           {"aten.tanh.default", "aten::tanh"},     {"aten.sigmoid.default", "aten::sigmoid"},
           {"aten.cos.default", "aten::cos"},       {"aten.sin.default", "aten::sin"},
           {"aten.erf.default", "aten::erf"},       {"aten.relu.default", "aten::relu"},
           {"aten.bitwise_not.default", "aten::bitwise_not"}, {"aten.logical_not.default", "aten::logical_not"},
           {"aten.alias_copy.default", "aten::alias_copy"}})
    t.push_back({target, kernel, "out", {T("self")}});
  t.push_back({"aten.gelu.default", "aten::gelu", "out", {T("self"), STR("approximate", "none")}});
  t.push_back({"aten.clamp.default", "aten::clamp", "out", {T("self"), {"min", ArgType::OptionalScalar, {}, true},
                                                           {"max", ArgType::OptionalScalar, {}, true}}});
  t.push_back({"aten.where.self", "aten::where", "self_out", {T("condition"), T("self"), T("other")}});
  t.push_back({"aten.scalar_tensor.default", "aten::scalar_tensor", "out", {S("s")}});
  t.push_back({"aten.full.default", "aten::full", "out", {IL("size"), S("fill_value")}});
  t.push_back({"aten.arange.start_step", "aten::arange", "start_out", {S("start"), S("end"), S("step", 1)}});
  t.push_back({"aten.cumsum.default", "aten::cumsum", "out", {T("self"), I("dim"), ODT("dtype")}});
  t.push_back({"aten.embedding.default", "aten::embedding", "out",
               {T("weight"), T("indices"), I("padding_idx", -1), B("scale_grad_by_freq", false), B("sparse", false)}});
  t.push_back({"aten.index.Tensor", "aten::index", "Tensor_out", {T("self"), OTL("indices")}});
  t.push_back({"aten.gather.default", "aten::gather", "out", {T("self"), I("dim"), T("index"), B("sparse_grad", false)}});
  t.push_back({"aten.index_select.default", "aten::index_select", "out", {T("self"), I("dim"), T("index")}});
  t.push_back({"aten.native_layer_norm.default", "aten::native_layer_norm", "out",
               {T("input"), IL("normalized_shape"), OT("weight"), OT("bias"), F("eps")}, 3});
  t.push_back({"aten._softmax.default", "aten::_softmax", "out", {T("self"), I("dim"), B("half_to_float", false)}});
  t.push_back({"aten._log_softmax.default", "aten::_log_softmax", "out", {T("self"), I("dim"), B("half_to_float", false)}});
  t.push_back({"aten.mean.dim", "aten::mean", "out", {T("self"), OIL("dim"), B("keepdim", false), ODT("dtype")}});
  t.push_back({"aten.sum.dim_IntList", "aten::sum", "IntList_out", {T("self"), OIL("dim"), B("keepdim", false), ODT("dtype")}});
  t.push_back({"aten.amax.default", "aten::amax", "out", {T("self"), {"dim", ArgType::IntList, {}, false}, B("keepdim", false)}});
  t.push_back({"aten.addmm.default", "aten::addmm", "out", {T("self"), T("mat1"), T("mat2"), S("beta", 1), S("alpha", 1)}});
  t.push_back({"aten.mm.default", "aten::mm", "out", {T("self"), T("mat2")}});
  t.push_back({"aten.bmm.default", "aten::bmm", "out", {T("self"), T("mat2")}});
  t.push_back({"aten.view_copy.default", "aten::view_copy", "out", {T("self"), IL("size")}});
  t.push_back({"aten.permute_copy.default", "aten::permute_copy", "out", {T("self"), IL("dims")}});
  t.push_back({"aten.expand_copy.default", "aten::expand_copy", "out", {T("self"), IL("size"), B("implicit", false)}});
  t.push_back({"aten.unsqueeze_copy.default", "aten::unsqueeze_copy", "out", {T("self"), I("dim")}});
  t.push_back({"aten.squeeze_copy.dims", "aten::squeeze_copy", "dims_out", {T("self"), IL("dim")}});
  t.push_back({"aten.slice_copy.Tensor", "aten::slice_copy", "Tensor_out",
               {T("self"), I("dim", 0), OI("start"), OI("end"), I("step", 1)}});
  t.push_back({"aten.select_copy.int", "aten::select_copy", "int_out", {T("self"), I("dim"), I("index")}});
  t.push_back({"aten.split_with_sizes_copy.default", "aten::split_with_sizes_copy", "out",
               {T("self"), IL("split_sizes"), I("dim", 0)}, 1, true});
  t.push_back({"aten.cat.default", "aten::cat", "out", {TL("tensors"), I("dim", 0)}});
  t.push_back({"aten.constant_pad_nd.default", "aten::constant_pad_nd", "out", {T("self"), IL("pad"), S("value", 0)}});
  // ExecuTorch's dim-order copies: contiguous clone and dtype conversion.
  t.push_back({"dim_order_ops._clone_dim_order.default", "dim_order_ops::_clone_dim_order", "out",
               {T("self"), B("non_blocking", false), OIL("dim_order")}});
  t.push_back({"dim_order_ops._to_dim_order_copy.default", "dim_order_ops::_to_dim_order_copy", "out",
               {T("self"), B("non_blocking", false), OIL("dim_order")}});
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
