// Reading an edge-graph node's arguments for the XNNPACK payload builder:
// schema order with defaults filled (passes::ordered_arguments), and typed
// accessors that throw kiln::Error on a kind mismatch.
#pragma once

#include "kiln/core/error.h"
#include "kiln/graph/graph.h"
#include "kiln/passes/op_table.h"

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace kiln::backends::xnnpack::detail {

using graph::Argument;
using graph::ValueId;

inline constexpr size_t kMaxDims = 6;  // XNN_MAX_TENSOR_DIMS

// The node's arguments in its op-table schema's order; throws for an
// operator the op table does not know or an argument it does not expect.
inline std::vector<Argument> schema_arguments(const graph::Node& node) {
  const passes::OpSchema* schema = passes::find_op_schema(node.target);
  check(schema != nullptr, "node '{}': operator '{}' is not an edge operator", node.name, node.target);
  return passes::ordered_arguments(*schema, node);
}

inline bool is_none(const Argument& a) { return a.kind == Argument::Kind::None; }

// A number argument (int, float or bool), or nullopt for anything else.
inline std::optional<double> scalar_of(const Argument& a) {
  switch (a.kind) {
    case Argument::Kind::Int: return static_cast<double>(std::get<int64_t>(a.payload));
    case Argument::Kind::Float: return std::get<double>(a.payload);
    case Argument::Kind::Bool: return std::get<bool>(a.payload) ? 1.0 : 0.0;
    default: return std::nullopt;
  }
}

// The payload of an argument of kind `kind` (described as `expected` in the
// error naming `what` when it is of another kind).
template <class T>
const T& payload_of(const Argument& a, Argument::Kind kind, std::string_view expected, std::string_view what) {
  check(a.kind == kind, "{}: expected {}, got {}", what, expected, graph::argument_kind_name(a.kind));
  return std::get<T>(a.payload);
}

// nullopt for None, else `read(a, what)`.
template <class Read>
auto optional_of(const Argument& a, std::string_view what, Read read) -> std::optional<decltype(read(a, what))> {
  if (is_none(a)) return std::nullopt;
  return read(a, what);
}

inline ValueId tensor_of(const Argument& a, std::string_view what) {
  return payload_of<ValueId>(a, Argument::Kind::Tensor, "a tensor", what);
}

inline std::optional<ValueId> optional_tensor_of(const Argument& a, std::string_view what) {
  return optional_of(a, what, tensor_of);
}

inline int64_t int_of(const Argument& a, std::string_view what) {
  return payload_of<int64_t>(a, Argument::Kind::Int, "an int", what);
}

inline std::optional<int64_t> optional_int_of(const Argument& a, std::string_view what) {
  return optional_of(a, what, int_of);
}

inline bool bool_of(const Argument& a, std::string_view what) {
  return payload_of<bool>(a, Argument::Kind::Bool, "a bool", what);
}

inline std::string string_of(const Argument& a, std::string_view what) {
  return payload_of<std::string>(a, Argument::Kind::String, "a string", what);
}

// An int list (a single int counts as a list of one); nullopt for None.
inline std::optional<std::vector<int64_t>> optional_ints_of(const Argument& a, std::string_view what) {
  if (is_none(a)) return std::nullopt;
  if (a.kind == Argument::Kind::Int) return std::vector<int64_t>{std::get<int64_t>(a.payload)};
  return payload_of<std::vector<int64_t>>(a, Argument::Kind::Ints, "an int list", what);
}

inline std::vector<int64_t> ints_of(const Argument& a, std::string_view what) {
  auto v = optional_ints_of(a, what);
  check(v.has_value(), "{}: expected an int list, got None", what);
  return *v;
}

inline std::vector<ValueId> tensors_of(const Argument& a, std::string_view what) {
  return payload_of<std::vector<ValueId>>(a, Argument::Kind::Tensors, "a tensor list", what);
}

// `d` counted from the end when negative; nullopt when out of [0, rank).
inline std::optional<size_t> wrap_dim(int64_t d, size_t rank) {
  int64_t r = static_cast<int64_t>(rank);
  if (d < 0) d += r;
  if (d < 0 || d >= r) return std::nullopt;
  return static_cast<size_t>(d);
}

// Sorted, distinct, wrapped reduction dims; empty or None means all dims.
// nullopt when a dim is out of range or repeated.
inline std::optional<std::vector<size_t>> reduction_dims(const std::optional<std::vector<int64_t>>& dims,
                                                         size_t rank) {
  std::vector<size_t> out;
  if (!dims || dims->empty()) {
    for (size_t d = 0; d < rank; ++d) out.push_back(d);
    return out;
  }
  std::vector<bool> seen(rank, false);
  for (int64_t d : *dims) {
    auto w = wrap_dim(d, rank);
    if (!w || seen[*w]) return std::nullopt;
    seen[*w] = true;
  }
  for (size_t d = 0; d < rank; ++d)
    if (seen[d]) out.push_back(d);
  return out;
}

// The exponents of aten.pow.Tensor_Scalar the builder can express.
inline bool supported_exponent(double e) { return e == 1 || e == 2 || e == 3 || e == 0.5 || e == -0.5 || e == -1; }

}  // namespace kiln::backends::xnnpack::detail
