// The .pt2 reader's JSON layer (json_reader.h): tensor metadata, arguments,
// SymInts.
#include "json_reader.h"

#include "kiln/core/enum_names.h"

namespace kiln::pt2::detail {

int64_t Reader::sym_int_value(const json& j, const std::string& where) const {
  auto [kind, v] = union_member(j, where);
  if (kind != "as_expr") return sym_int_expr(j, where, nullptr);
  if (binding.empty()) bad(where, "symbolic (dynamic) size, but the archive's range_constraints bound no symbol");
  const std::string& text = as_string(field(*v, "expr_str", where), where);
  size_t pos = 0;
  int64_t value = evaluate(text, pos, where);
  return value;
}

int64_t Reader::sym_int_expr(const json& j, const std::string& where, graph::SymExpr* expr) const {
  auto [kind, v] = union_member(j, where);
  if (kind == "as_int") {
    int64_t x = as_int(*v, where);
    if (expr) *expr = normalize({}, x);
    return x;
  }
  if (kind == "as_expr") {
    if (binding.empty())
      bad(where, "symbolic (dynamic) size, but the archive's range_constraints bound no symbol");
    graph::SymExpr e = expression(as_string(field(*v, "expr_str", where), where), where);
    if (expr) *expr = e;
    return e.eval(binding);
  }
  bad(where, fmt::format("unknown SymInt kind '{}'", kind));
}

int64_t Reader::sym_int_argument(const json& j, const std::string& where) const {
  auto [kind, v] = union_member(j, where);
  if (kind == "as_int") return as_int(*v, where);
  if (kind == "as_name") {
    const auto& name = as_string(*v, where);
    auto it = sym_values.find(name);
    if (it == sym_values.end()) bad(where, fmt::format("refers to unknown SymInt '{}'", name));
    return it->second.eval(binding);
  }
  bad(where, fmt::format("unknown SymInt argument kind '{}'", kind));
}

bool Reader::sym_bool_argument(const json& j, const std::string& where) const {
  auto [kind, v] = union_member(j, where);
  if (kind == "as_bool") return as_bool(*v, where);
  bad(where, fmt::format("symbolic bool argument '{}'; kiln lowers symbolic sizes, not conditions on them",
                         kind == "as_name" ? as_string(*v, where) : kind));
}

ScalarType Reader::scalar_type(const json& j, const std::string& where) const {
  int64_t code = as_int(j, where);
  auto t = scalar_type_from_export_code(code);
  if (!t) bad(where, fmt::format("unknown dtype code {}", code));
  return *t;
}

TensorMeta Reader::tensor_meta(const json& j, const std::string& where) const {
  TensorMeta m;
  m.dtype = scalar_type(field(j, "dtype", where), where + " dtype");
  bool dynamic = false;
  for (const auto& d : as_array(field(j, "sizes", where), where + " sizes")) {
    graph::SymExpr e;
    m.sizes.push_back(sym_int_expr(d, where + " sizes", &e));
    dynamic = dynamic || !e.is_constant();
    m.sym_sizes.push_back(std::move(e));
  }
  if (!dynamic) m.sym_sizes.clear();
  m.strides = list_of(field(j, "strides", where), where + " strides", &Reader::sym_int_value);
  if (m.strides.size() != m.sizes.size())
    bad(where, fmt::format("{} sizes but {} strides", m.sizes.size(), m.strides.size()));
  for (size_t i = 0; i < m.sizes.size(); ++i) {
    if (m.sizes[i] < 0) bad(where, fmt::format("negative size {} in dim {}", m.sizes[i], i));
    if (m.strides[i] < 0) bad(where, fmt::format("negative stride {} in dim {}", m.strides[i], i));
  }
  if (auto it = j.find("storage_offset"); it != j.end()) m.storage_offset = sym_int_value(*it, where + " storage_offset");
  if (m.storage_offset < 0) bad(where, "negative storage offset");
  // Element count, byte size and storage extent in checked arithmetic: a size whose product
  // overflows (2^64 elements would count as 0) is bad input, not a small tensor.
  int64_t numel = 1, nbytes = 0, extent = m.storage_offset;
  for (size_t i = 0; i < m.sizes.size(); ++i)
    if (__builtin_mul_overflow(numel, m.sizes[i], &numel))
      bad(where, fmt::format("sizes [{}] hold more elements than a 64-bit count", fmt::join(m.sizes, ", ")));
  if (__builtin_mul_overflow(numel, static_cast<int64_t>(element_size(m.dtype)), &nbytes))
    bad(where, fmt::format("sizes [{}] hold more bytes than a 64-bit count", fmt::join(m.sizes, ", ")));
  for (size_t i = 0; numel > 0 && i < m.sizes.size(); ++i) {
    int64_t reach = 0;
    if (__builtin_mul_overflow(m.sizes[i] - 1, m.strides[i], &reach) || __builtin_add_overflow(extent, reach, &extent))
      bad(where, "its sizes and strides reach past a 64-bit offset");
  }
  if (numel > 0 && (__builtin_add_overflow(extent, 1, &extent) ||
                    __builtin_mul_overflow(extent, static_cast<int64_t>(element_size(m.dtype)), &extent)))
    bad(where, "its sizes and strides reach past a 64-bit offset");
  if (auto it = j.find("requires_grad"); it != j.end() && it->is_boolean()) m.requires_grad = it->get<bool>();
  if (auto it = j.find("layout"); it != j.end() && it->is_number_integer() && it->get<int64_t>() != 7)
    bad(where, fmt::format("layout code {} is not strided; kiln handles dense strided tensors only",
                           it->get<int64_t>()));
  return m;
}

ValueId Reader::tensor_ref(const json& j, const std::string& where) const {
  const auto& name = as_string(field(j, "name", where), where);
  auto id = graph->find_value(name);
  if (!id) bad(where, fmt::format("refers to unknown tensor '{}'", name));
  return *id;
}

graph::Device Reader::device(const json& j, const std::string& where) const {
  graph::Device d;
  d.type = as_string(field(j, "type", where), where);
  if (auto it = j.find("index"); it != j.end() && !it->is_null()) d.index = as_int(*it, where);
  return d;
}

std::optional<ValueId> Reader::optional_tensor(const json& j, const std::string& where) const {
  auto [k, v] = union_member(j, where);
  if (k == "as_none") return std::nullopt;
  if (k == "as_tensor") return tensor_ref(*v, where);
  bad(where, fmt::format("unknown optional tensor kind '{}'", k));
}

Argument Reader::argument(const json& j, const std::string& where) const {
  auto [kind, vp] = union_member(j, where);
  const json& v = *vp;
  using K = Argument::Kind;
  if (kind == "as_none") return {};
  if (kind == "as_tensor") return {K::Tensor, tensor_ref(v, where)};
  if (kind == "as_tensors") return {K::Tensors, list_of(v, where, &Reader::tensor_ref)};
  if (kind == "as_optional_tensors") return {K::OptionalTensors, list_of(v, where, &Reader::optional_tensor)};
  if (kind == "as_optional_tensor") {
    auto t = optional_tensor(v, where);
    return t ? Argument{K::Tensor, *t} : Argument{};
  }
  if (kind == "as_int") return {K::Int, as_int(v, where)};
  if (kind == "as_ints") return {K::Ints, list_of(v, where, &Reader::as_int)};
  if (kind == "as_float") return {K::Float, as_float(v, where)};
  if (kind == "as_floats") return {K::Floats, list_of(v, where, &Reader::as_float)};
  if (kind == "as_bool") return {K::Bool, as_bool(v, where)};
  if (kind == "as_bools") return {K::Bools, list_of(v, where, &Reader::as_bool)};
  if (kind == "as_string") return {K::String, as_string(v, where)};
  if (kind == "as_strings") return {K::Strings, list_of(v, where, &Reader::as_string)};
  if (kind == "as_scalar_type") return {K::ScalarType, scalar_type(v, where)};
  if (kind == "as_memory_format") {
    int64_t code = as_int(v, where);
    if (code < 0 || code > 4) bad(where, fmt::format("unknown memory format code {}", code));
    return {K::MemoryFormat, static_cast<graph::MemoryFormat>(code)};
  }
  if (kind == "as_layout") {
    int64_t code = as_int(v, where);
    return {K::Layout, code == 7 ? graph::Layout::Strided : code == 0 ? graph::Layout::Unknown : graph::Layout::Other};
  }
  if (kind == "as_device") return {K::Device, device(v, where)};
  if (kind == "as_sym_int") return {K::Int, sym_int_argument(v, where)};
  if (kind == "as_sym_ints") return {K::Ints, list_of(v, where, &Reader::sym_int_argument)};
  if (kind == "as_sym_bool") return {K::Bool, sym_bool_argument(v, where)};
  if (kind == "as_sym_bools") return {K::Bools, list_of(v, where, &Reader::sym_bool_argument)};
  if (kind == "as_sym_float" || kind == "as_sym_floats")
    bad(where, fmt::format("symbolic float argument '{}'; kiln lowers symbolic integer sizes only", kind));
  if (kind == "as_graph" || kind == "as_custom_obj" || kind == "as_operator" || kind == "as_complex" ||
      kind == "as_nested_tensors" || kind == "as_int_lists" || kind == "as_string_to_argument" ||
      kind == "as_float_lists")
    bad(where, fmt::format("argument kind '{}' is not supported by kiln", kind));
  bad(where, fmt::format("unknown argument kind '{}'", kind));
}

}  // namespace kiln::pt2::detail
