#include "kiln/graph/graph.h"

#include "kiln/core/enum_names.h"
#include "kiln/core/error.h"

namespace kiln::graph {

int64_t TensorMeta::numel() const {
  int64_t n = 1;
  for (int64_t s : sizes) n *= s;
  return n;
}

bool TensorMeta::is_contiguous() const {
  if (strides.size() != sizes.size()) return false;
  int64_t expected = 1;
  for (size_t i = sizes.size(); i-- > 0;) {
    if (sizes[i] != 1 && strides[i] != expected) return false;
    expected *= sizes[i];
  }
  return true;
}

int64_t TensorMeta::storage_extent() const {
  if (numel() == 0) return 0;
  int64_t last = storage_offset;
  for (size_t i = 0; i < sizes.size() && i < strides.size(); ++i) last += (sizes[i] - 1) * strides[i];
  return last + 1;
}

std::vector<ValueId> Argument::tensor_ids() const {
  switch (kind) {
    case Kind::Tensor: return {std::get<ValueId>(payload)};
    case Kind::Tensors: return std::get<std::vector<ValueId>>(payload);
    case Kind::OptionalTensors: {
      std::vector<ValueId> ids;
      for (const auto& v : std::get<std::vector<std::optional<ValueId>>>(payload))
        if (v) ids.push_back(*v);
      return ids;
    }
    default: return {};
  }
}

std::string_view argument_kind_name(Argument::Kind kind) {
  static constexpr std::array<std::string_view, 16> kNames{
      "none", "tensor", "tensors", "optional_tensors", "int", "ints", "float", "floats", "bool", "bools", "string",
      "strings", "scalar_type", "memory_format", "layout", "device"};
  return enum_name<Argument::Kind::Device>(kind, kNames);
}

const NamedArgument* Node::input(std::string_view arg_name) const {
  for (const auto& a : inputs)
    if (a.name == arg_name) return &a;
  return nullptr;
}

std::vector<ValueId> Node::output_ids() const {
  std::vector<ValueId> ids;
  for (const auto& o : outputs)
    for (ValueId v : o.tensor_ids()) ids.push_back(v);
  return ids;
}

std::string_view input_kind_name(InputSpec::Kind kind) {
  static constexpr std::array<std::string_view, 7> kNames{
      "user_input", "parameter", "buffer", "tensor_constant", "constant_input", "custom_obj", "token"};
  return enum_name<InputSpec::Kind::Token>(kind, kNames);
}

std::string_view output_kind_name(OutputSpec::Kind kind) {
  static constexpr std::array<std::string_view, 8> kNames{
      "user_output", "buffer_mutation", "user_input_mutation", "parameter_mutation", "loss_output",
      "gradient_to_parameter", "gradient_to_user_input", "token"};
  return enum_name<OutputSpec::Kind::Token>(kind, kNames);
}

ValueId Graph::add_value(std::string name, TensorMeta meta) {
  check(!by_name_.contains(name), "duplicate tensor value '{}'", name);
  auto id = static_cast<ValueId>(values.size());
  by_name_.emplace(name, id);
  values.push_back(Value{std::move(name), std::move(meta), -1});
  return id;
}

std::optional<ValueId> Graph::find_value(std::string_view name) const {
  auto it = by_name_.find(name);
  if (it == by_name_.end()) return std::nullopt;
  return it->second;
}

std::map<std::string, int64_t> Graph::operator_histogram() const {
  std::map<std::string, int64_t> h;
  for (const auto& n : nodes) ++h[n.target];
  return h;
}

}  // namespace kiln::graph

namespace kiln::graph {

int64_t SymExpr::eval(const std::map<std::string, int64_t, std::less<>>& binding) const {
  int64_t v = constant;
  for (const auto& [name, coef] : terms) {
    auto it = binding.find(name);
    check(it != binding.end(), "size expression {} names symbol '{}', which has no value", str(), name);
    v += coef * it->second;
  }
  return v;
}

std::string SymExpr::str() const {
  std::string s;
  for (const auto& [name, coef] : terms) {
    if (!s.empty()) s += " + ";
    s += coef == 1 ? name : fmt::format("{}*{}", coef, name);
  }
  if (constant != 0 || s.empty()) s += s.empty() ? fmt::format("{}", constant) : fmt::format(" + {}", constant);
  return s;
}

}  // namespace kiln::graph
