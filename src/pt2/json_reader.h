// The .pt2 reader's JSON layer (private to kiln_pt2): typed, checked access to
// the serialized ExportedProgram (torch/_export/serde/schema.py), every
// failure one kiln::Error naming the file and the place. Its parts:
//   json_reader.cpp      tensor metadata, arguments, SymInts
//   size_expr.cpp        size expressions (sympy's repr) to kiln's linear form
//   subclass_params.cpp  tensor-subclass parameters unwrapped into dense ones
//   pt2_reader.cpp       the archive and the graph (read_pt2)
#pragma once

#include "kiln/core/error.h"
#include "kiln/pt2/pt2_reader.h"

#include <nlohmann/json.hpp>

#include <limits>
#include <map>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace kiln::pt2::detail {

using json = nlohmann::json;
using graph::Argument;
using graph::TensorMeta;
using graph::ValueId;

// Parsing context: the file name and a breadcrumb for error messages.
struct Reader {
  std::string file;
  graph::Graph* graph = nullptr;

  [[noreturn]] void bad(const std::string& where, const std::string& what) const {
    fail("{}: {}: {}", file, where, what);
  }

  const json& field(const json& obj, const char* key, const std::string& where) const {
    if (!obj.is_object()) bad(where, "expected a JSON object");
    auto it = obj.find(key);
    if (it == obj.end()) bad(where, fmt::format("missing field '{}'", key));
    return *it;
  }

  int64_t as_int(const json& j, const std::string& where) const {
    if (!j.is_number_integer()) bad(where, "expected an integer");
    return j.get<int64_t>();
  }

  double as_float(const json& j, const std::string& where) const {
    if (j.is_number()) return j.get<double>();
    if (j.is_string()) {  // non-finite floats are spelled as strings
      const auto& s = j.get_ref<const std::string&>();
      if (s == "Infinity") return std::numeric_limits<double>::infinity();
      if (s == "-Infinity") return -std::numeric_limits<double>::infinity();
      if (s == "NaN") return std::numeric_limits<double>::quiet_NaN();
    }
    bad(where, "expected a number");
  }

  const std::string& as_string(const json& j, const std::string& where) const {
    if (!j.is_string()) bad(where, "expected a string");
    return j.get_ref<const std::string&>();
  }

  const json& as_array(const json& j, const std::string& where) const {
    if (!j.is_array()) bad(where, "expected a list");
    return j;
  }

  // The single key of a tagged union ({"as_int": 3}).
  std::pair<std::string, const json*> union_member(const json& j, const std::string& where) const {
    if (!j.is_object() || j.size() != 1) bad(where, "expected a tagged union with exactly one member");
    auto it = j.begin();
    return {it.key(), &it.value()};
  }

  // Dynamic programs: the symbols' values the graph is read at, and the
  // expression of every named SymInt of the graph (sym_int_values).
  SymbolBinding binding;
  std::map<std::string, graph::SymExpr, std::less<>> sym_values;

  // A size expression as torch writes it (sympy's srepr: "Mul(Integer(4),
  // Symbol('s0', positive=True, integer=True))"), reduced to kiln's linear form.
  // Hand-written: a dozen lines for the four forms torch.export emits for
  // Dim-based sizes; no Debian package parses sympy's repr.
  graph::SymExpr expression(const std::string& text, const std::string& where) const;

  static void skip_space(const std::string& t, size_t& pos);

  static graph::SymExpr normalize(std::map<std::string, int64_t> terms, int64_t constant);

  // A decimal integer of a size expression; one that does not fit in 64 bits is bad input (not std::stoll's exception).
  int64_t parse_integer(const std::string& digits, const std::string& where) const;

  graph::SymExpr parse_expr(const std::string& t, size_t& pos, const std::string& where) const;

  // The value of a sympy repr at the binding, for strides and offsets (which may be
  // products of symbols: a [1, 1, T, T] tensor's outer strides are T**2).
  int64_t evaluate(const std::string& t, size_t& pos, const std::string& where) const;

  // A stride or offset SymInt at the binding (any expression torch writes for them).
  int64_t sym_int_value(const json& j, const std::string& where) const;

  // A SymInt ({"as_int": 3} or {"as_expr": {"expr_str": ...}}) at the binding;
  // `expr` (if given) receives its expression.
  int64_t sym_int_expr(const json& j, const std::string& where, graph::SymExpr* expr) const;

  int64_t sym_int(const json& j, const std::string& where) const { return sym_int_expr(j, where, nullptr); }

  // A SymInt argument: {"as_int": 3} or {"as_name": "sym_size_int_1"} (a named graph SymInt).
  int64_t sym_int_argument(const json& j, const std::string& where) const;

  bool sym_bool_argument(const json& j, const std::string& where) const;

  ScalarType scalar_type(const json& j, const std::string& where) const;

  TensorMeta tensor_meta(const json& j, const std::string& where) const;

  ValueId tensor_ref(const json& j, const std::string& where) const;

  graph::Device device(const json& j, const std::string& where) const;

  bool as_bool(const json& j, const std::string& where) const {
    if (!j.is_boolean()) bad(where, "expected a boolean");
    return j.get<bool>();
  }

  // A JSON list, each element read by `element`.
  template <class T>
  std::vector<std::decay_t<T>> list_of(const json& j, const std::string& where,
                                       T (Reader::*element)(const json&, const std::string&) const) const {
    std::vector<std::decay_t<T>> out;
    for (const auto& e : as_array(j, where)) out.push_back((this->*element)(e, where));
    return out;
  }

  // An OptionalTensor: {"as_none": ...} or {"as_tensor": {...}}.
  std::optional<ValueId> optional_tensor(const json& j, const std::string& where) const;

  Argument argument(const json& j, const std::string& where) const;
};

// Tensor-subclass parameters (subclass_params.cpp): each pickled parameter's
// inner tensors become dense parameters of their own ("<fqn>.<attr>"), the
// graph's access nodes and the subclass placeholder leave it. `payloads`:
// fqn -> (its data directory, its payload config entry).
void unwrap_subclass_parameters(const Reader& r, const Pt2Archive& archive, json& graph_json, json& signature,
                                std::map<std::string, std::pair<std::string, json>>& payloads);

}  // namespace kiln::pt2::detail
