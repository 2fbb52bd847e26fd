#include "kiln/pt2/pt2_reader.h"

#include "kiln/core/enum_names.h"
#include "kiln/core/error.h"
#include "pickle.h"

#include <nlohmann/json.hpp>
#include <zlib.h>

#include <algorithm>
#include <charconv>
#include <cctype>
#include <cmath>
#include <cstring>
#include <limits>

// Reads the torch.export archive layout (torch/export/pt2_archive) and the
// serialized ExportedProgram JSON (torch/_export/serde/schema.py, schema 8.x).
// Every field is checked before use: a malformed archive is a kiln::Error with
// one line naming the file and the place, never a crash.

namespace kiln::pt2 {
namespace {

using json = nlohmann::json;
using graph::Argument;
using graph::TensorMeta;
using graph::ValueId;

constexpr std::string_view kOpPrefix = "torch.ops.";

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
  graph::SymExpr expression(const std::string& text, const std::string& where) const {
    size_t pos = 0;
    graph::SymExpr e = parse_expr(text, pos, where);
    skip_space(text, pos);
    if (pos != text.size()) bad(where, fmt::format("cannot read size expression '{}'", text));
    return e;
  }

  static void skip_space(const std::string& t, size_t& pos) {
    while (pos < t.size() && (t[pos] == ' ')) ++pos;
  }

  static graph::SymExpr normalize(std::map<std::string, int64_t> terms, int64_t constant) {
    graph::SymExpr e;
    e.constant = constant;
    for (auto& [k, c] : terms)
      if (c != 0) e.terms.emplace_back(k, c);
    return e;
  }

  // A decimal integer of a size expression; one that does not fit in 64 bits is bad input (not std::stoll's exception).
  int64_t parse_integer(const std::string& digits, const std::string& where) const {
    int64_t v = 0;
    const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), v);
    if (ec != std::errc() || end != digits.data() + digits.size())
      bad(where, fmt::format("integer '{}' in a size expression is not a 64-bit integer", digits));
    return v;
  }

  graph::SymExpr parse_expr(const std::string& t, size_t& pos, const std::string& where) const {
    skip_space(t, pos);
    auto unreadable = [&]() -> graph::SymExpr {
      bad(where, fmt::format("size expression '{}' is not one kiln lowers (integer constants, symbols, sums, "
                             "products by constants, exact divisions)", t));
    };
    size_t start = pos;
    if (pos < t.size() && (t[pos] == '-' || std::isdigit(static_cast<unsigned char>(t[pos])))) {
      ++pos;
      while (pos < t.size() && std::isdigit(static_cast<unsigned char>(t[pos]))) ++pos;
      return normalize({}, parse_integer(t.substr(start, pos - start), where));
    }
    while (pos < t.size() && (std::isalnum(static_cast<unsigned char>(t[pos])) || t[pos] == '_')) ++pos;
    std::string head = t.substr(start, pos - start);
    if (head.empty()) return unreadable();
    skip_space(t, pos);
    if (pos >= t.size() || t[pos] != '(') {  // a bare symbol name (str form)
      if (!binding.contains(head)) bad(where, fmt::format("size expression names unknown symbol '{}'", head));
      return normalize({{head, 1}}, 0);
    }
    ++pos;
    // Arguments up to the matching parenthesis; keyword arguments (positive=True) are skipped.
    std::vector<graph::SymExpr> args;
    std::string symbol_name;
    for (;;) {
      skip_space(t, pos);
      if (pos < t.size() && t[pos] == ')') {
        ++pos;
        break;
      }
      if (pos < t.size() && t[pos] == '\'') {
        size_t end = t.find('\'', pos + 1);
        if (end == std::string::npos) return unreadable();
        symbol_name = t.substr(pos + 1, end - pos - 1);
        pos = end + 1;
      } else {
        size_t save = pos;
        while (pos < t.size() && (std::isalnum(static_cast<unsigned char>(t[pos])) || t[pos] == '_')) ++pos;
        skip_space(t, pos);
        if (pos < t.size() && t[pos] == '=') {  // keyword: skip its value
          ++pos;
          while (pos < t.size() && t[pos] != ',' && t[pos] != ')') ++pos;
        } else {
          pos = save;
          args.push_back(parse_expr(t, pos, where));
        }
      }
      skip_space(t, pos);
      if (pos < t.size() && t[pos] == ',') ++pos;
      else if (pos >= t.size() || t[pos] != ')') return unreadable();
    }
    if (head == "Symbol") {
      if (symbol_name.empty()) return unreadable();
      if (!binding.contains(symbol_name))
        bad(where, fmt::format("size expression names symbol '{}', which range_constraints does not bound",
                               symbol_name));
      return normalize({{symbol_name, 1}}, 0);
    }
    if (head == "Integer" && args.size() == 1 && args[0].is_constant()) return args[0];
    if (head == "Add" && !args.empty()) {
      std::map<std::string, int64_t> terms;
      int64_t c = 0;
      for (const auto& a : args) {
        c += a.constant;
        for (const auto& [k, v] : a.terms) terms[k] += v;
      }
      return normalize(terms, c);
    }
    if (head == "Mul" && !args.empty()) {
      graph::SymExpr acc = normalize({}, 1);
      for (const auto& a : args) {
        if (!acc.is_constant() && !a.is_constant())
          bad(where, fmt::format("size expression '{}' multiplies symbols; kiln lowers linear sizes only", t));
        const graph::SymExpr& k = acc.is_constant() ? acc : a;
        const graph::SymExpr& x = acc.is_constant() ? a : acc;
        std::map<std::string, int64_t> terms;
        for (const auto& [n, v] : x.terms) terms[n] = v * k.constant;
        acc = normalize(terms, x.constant * k.constant);
      }
      return acc;
    }
    if ((head == "FloorDiv" || head == "CleanDiv") && args.size() == 2 && args[1].is_constant() &&
        args[1].constant > 0) {
      const int64_t d = args[1].constant;
      bool exact = args[0].constant % d == 0;
      for (const auto& [n, v] : args[0].terms) exact = exact && v % d == 0;
      if (!exact) bad(where, fmt::format("size expression '{}' divides inexactly; kiln lowers linear sizes only", t));
      std::map<std::string, int64_t> terms;
      for (const auto& [n, v] : args[0].terms) terms[n] = v / d;
      return normalize(terms, args[0].constant / d);
    }
    return unreadable();
  }

  // The value of a sympy repr at the binding, for strides and offsets (which may be
  // products of symbols: a [1, 1, T, T] tensor's outer strides are T**2).
  int64_t evaluate(const std::string& t, size_t& pos, const std::string& where) const {
    skip_space(t, pos);
    size_t start = pos;
    if (pos < t.size() && (t[pos] == '-' || std::isdigit(static_cast<unsigned char>(t[pos])))) {
      ++pos;
      while (pos < t.size() && std::isdigit(static_cast<unsigned char>(t[pos]))) ++pos;
      return parse_integer(t.substr(start, pos - start), where);
    }
    while (pos < t.size() && (std::isalnum(static_cast<unsigned char>(t[pos])) || t[pos] == '_')) ++pos;
    std::string head = t.substr(start, pos - start);
    skip_space(t, pos);
    if (pos >= t.size() || t[pos] != '(') {
      auto it = binding.find(head);
      if (it == binding.end()) bad(where, fmt::format("cannot evaluate size expression '{}'", t));
      return it->second;
    }
    ++pos;
    std::vector<int64_t> args;
    std::string symbol_name;
    for (;;) {
      skip_space(t, pos);
      if (pos < t.size() && t[pos] == ')') {
        ++pos;
        break;
      }
      if (pos < t.size() && t[pos] == '\'') {
        size_t end = t.find('\'', pos + 1);
        if (end == std::string::npos) bad(where, fmt::format("cannot evaluate size expression '{}'", t));
        symbol_name = t.substr(pos + 1, end - pos - 1);
        pos = end + 1;
      } else {
        size_t save = pos;
        while (pos < t.size() && (std::isalnum(static_cast<unsigned char>(t[pos])) || t[pos] == '_')) ++pos;
        skip_space(t, pos);
        if (pos < t.size() && t[pos] == '=') {
          ++pos;
          while (pos < t.size() && t[pos] != ',' && t[pos] != ')') ++pos;
        } else {
          pos = save;
          args.push_back(evaluate(t, pos, where));
        }
      }
      skip_space(t, pos);
      if (pos < t.size() && t[pos] == ',') ++pos;
      else if (pos >= t.size() || t[pos] != ')') bad(where, fmt::format("cannot evaluate size expression '{}'", t));
    }
    if (head == "Symbol") {
      auto it = binding.find(symbol_name);
      if (it == binding.end()) bad(where, fmt::format("size expression names unbound symbol '{}'", symbol_name));
      return it->second;
    }
    if (head == "Integer" && args.size() == 1) return args[0];
    if (head == "Add" && !args.empty()) {
      int64_t v = 0;
      for (int64_t a : args) v += a;
      return v;
    }
    if (head == "Mul" && !args.empty()) {
      int64_t v = 1;
      for (int64_t a : args) v *= a;
      return v;
    }
    if (head == "Pow" && args.size() == 2 && args[1] >= 0 && args[1] < 64) {
      int64_t v = 1;
      for (int64_t k = 0; k < args[1]; ++k) v *= args[0];
      return v;
    }
    if ((head == "FloorDiv" || head == "CleanDiv") && args.size() == 2 && args[1] > 0) {
      int64_t q = args[0] / args[1];
      if (args[0] % args[1] != 0 && args[0] < 0) --q;
      return q;
    }
    bad(where, fmt::format("cannot evaluate size expression '{}'", t));
  }

  // A stride or offset SymInt at the binding (any expression torch writes for them).
  int64_t sym_int_value(const json& j, const std::string& where) const {
    auto [kind, v] = union_member(j, where);
    if (kind != "as_expr") return sym_int_expr(j, where, nullptr);
    if (binding.empty()) bad(where, "symbolic (dynamic) size, but the archive's range_constraints bound no symbol");
    const std::string& text = as_string(field(*v, "expr_str", where), where);
    size_t pos = 0;
    int64_t value = evaluate(text, pos, where);
    return value;
  }

  // A SymInt ({"as_int": 3} or {"as_expr": {"expr_str": ...}}) at the binding;
  // `expr` (if given) receives its expression.
  int64_t sym_int_expr(const json& j, const std::string& where, graph::SymExpr* expr) const {
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

  int64_t sym_int(const json& j, const std::string& where) const { return sym_int_expr(j, where, nullptr); }

  // A SymInt argument: {"as_int": 3} or {"as_name": "sym_size_int_1"} (a named graph SymInt).
  int64_t sym_int_argument(const json& j, const std::string& where) const {
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

  bool sym_bool_argument(const json& j, const std::string& where) const {
    auto [kind, v] = union_member(j, where);
    if (kind == "as_bool") return as_bool(*v, where);
    bad(where, fmt::format("symbolic bool argument '{}'; kiln lowers symbolic sizes, not conditions on them",
                           kind == "as_name" ? as_string(*v, where) : kind));
  }

  ScalarType scalar_type(const json& j, const std::string& where) const {
    int64_t code = as_int(j, where);
    auto t = scalar_type_from_export_code(code);
    if (!t) bad(where, fmt::format("unknown dtype code {}", code));
    return *t;
  }

  TensorMeta tensor_meta(const json& j, const std::string& where) const {
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

  ValueId tensor_ref(const json& j, const std::string& where) const {
    const auto& name = as_string(field(j, "name", where), where);
    auto id = graph->find_value(name);
    if (!id) bad(where, fmt::format("refers to unknown tensor '{}'", name));
    return *id;
  }

  graph::Device device(const json& j, const std::string& where) const {
    graph::Device d;
    d.type = as_string(field(j, "type", where), where);
    if (auto it = j.find("index"); it != j.end() && !it->is_null()) d.index = as_int(*it, where);
    return d;
  }

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
  std::optional<ValueId> optional_tensor(const json& j, const std::string& where) const {
    auto [k, v] = union_member(j, where);
    if (k == "as_none") return std::nullopt;
    if (k == "as_tensor") return tensor_ref(*v, where);
    bad(where, fmt::format("unknown optional tensor kind '{}'", k));
  }

  Argument argument(const json& j, const std::string& where) const {
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
};

std::string strip_op_prefix(const std::string& target) {
  if (target.starts_with(kOpPrefix)) return target.substr(kOpPrefix.size());
  return target;
}

// Finds "<root>/models/<name>.json"; returns {root with trailing '/', name}.
std::pair<std::string, std::string> locate_model(const Pt2Archive& archive) {
  std::vector<std::pair<std::string, std::string>> found;
  for (const auto& e : archive.entries()) {
    auto pos = e.find("models/");
    if (pos == std::string::npos || !e.ends_with(".json")) continue;
    std::string root = e.substr(0, pos);
    if (!root.empty() && (root.back() != '/' || root.find('/') != root.size() - 1)) continue;
    std::string name = e.substr(pos + 7, e.size() - pos - 7 - 5);
    if (name.empty() || name.find('/') != std::string::npos) continue;
    found.emplace_back(root, name);
  }
  if (found.empty())
    fail("{}: archive has no serialized graph (expected an entry <archive>/models/<name>.json); "
         "is this a torch.export.save file?",
         archive.path());
  if (found.size() > 1) {
    auto it = std::find_if(found.begin(), found.end(), [](const auto& f) { return f.second == "model"; });
    if (it == found.end()) fail("{}: archive holds {} models; kiln reads single-model archives", archive.path(), found.size());
    return *it;
  }
  return found.front();
}

void read_payload_config(const Reader& r, const Pt2Archive& archive, const std::string& root,
                         const std::string& config_entry, const std::string& data_dir,
                         std::map<std::string, std::pair<std::string, json>>& out) {
  if (!archive.contains(config_entry)) return;
  json cfg;
  try {
    cfg = json::parse(archive.read_text(config_entry));
  } catch (const json::exception& e) {
    r.bad(config_entry, fmt::format("invalid JSON ({})", e.what()));
  }
  const json& entries = r.field(cfg, "config", config_entry);
  if (!entries.is_object()) r.bad(config_entry, "'config' is not an object");
  for (auto it = entries.begin(); it != entries.end(); ++it)
    out[it.key()] = {root + data_dir, it.value()};
}



// ---- tensor subclass parameters -------------------------------------------------------------------
// torchao's quantize_ before torch.export leaves weights as tensor subclasses (IntxUnpackedToInt8Tensor:
// qdata, scale, zero_point). The archive stores each pickled (torch.save's zip inside the entry) and the
// graph reads their parts with export.access_subclass_inner_tensor(p, attr). Each part becomes a
// parameter of its own, "<fqn>.<attr>", read in place from the pickle's storage; the access nodes and
// the subclass placeholder leave the graph. Done on the JSON, before the graph is built, so everything
// after sees plain dense parameters and checks them as usual.
struct InnerTensor {
  std::string storage;     // storage key: the nested member "<dir>/data/<key>"
  int64_t storage_offset;  // elements
  int64_t element_bytes;
  int64_t storage_numel;
};

int64_t storage_element_bytes(std::string_view cls) {
  static const std::map<std::string_view, int64_t> sizes = {
      {"torch.CharStorage", 1},     {"torch.ByteStorage", 1},   {"torch.BoolStorage", 1},
      {"torch.ShortStorage", 2},    {"torch.HalfStorage", 2},   {"torch.BFloat16Storage", 2},
      {"torch.IntStorage", 4},      {"torch.FloatStorage", 4},  {"torch.LongStorage", 8},
      {"torch.DoubleStorage", 8}};
  auto it = sizes.find(cls);
  return it == sizes.end() ? 0 : it->second;
}

// attr -> inner tensor, from the pickle torch.save wrote for one subclass tensor.
std::map<std::string, InnerTensor> read_subclass_pickle(const Reader& r, const std::string& where,
                                                        const pickle::Value& top, std::string* cls) {
  using K = pickle::Value::Kind;
  auto call_of = [](const pickle::Value* v, std::string_view fn) -> const pickle::Value* {
    if (!v || !v->is(K::Call) || v->items.size() != 2 || !v->items[0]->is_global(fn) || !v->items[1]->is(K::Tuple))
      return nullptr;
    return v->items[1].get();
  };
  const pickle::Value* args = call_of(&top, "torch._tensor._rebuild_from_type_v2");
  if (!args || args->items.size() < 4 || !args->items[1]->is(K::Global) || !args->items[3]->is(K::Dict))
    r.bad(where, "is pickled, but not as a tensor subclass kiln knows (torch._tensor._rebuild_from_type_v2 of a class "
                 "and its attributes)");
  *cls = args->items[1]->s;
  std::map<std::string, InnerTensor> out;
  for (const auto& [key, value] : args->items[3]->entries) {
    const pickle::Value* t = call_of(value.get(), "torch._utils._rebuild_tensor_v2");
    if (!t || !key->is(K::String)) continue;  // a plain attribute (block_size, dtypes, ...)
    const std::string what = fmt::format("{} attribute '{}'", where, key->s);
    if (t->items.size() < 4 || !t->items[0]->is(K::PersistentId) || !t->items[1]->is(K::Int))
      r.bad(what, "is not a tensor torch.save wrote (a storage and an offset)");
    const pickle::Value& pid = *t->items[0]->items[0];
    if (!pid.is(K::Tuple) || pid.items.size() < 5 || !pid.items[0]->is(K::String) || pid.items[0]->s != "storage" ||
        !pid.items[1]->is(K::Global) || !pid.items[2]->is(K::String) || !pid.items[4]->is(K::Int))
      r.bad(what, "has a storage record kiln does not read");
    InnerTensor it;
    it.storage = pid.items[2]->s;
    it.storage_offset = t->items[1]->i;
    it.element_bytes = storage_element_bytes(pid.items[1]->s);
    it.storage_numel = pid.items[4]->i;
    if (it.element_bytes == 0) r.bad(what, fmt::format("has storage of type {}, which kiln does not read", pid.items[1]->s));
    out.emplace(key->s, std::move(it));
  }
  return out;
}

void unwrap_subclass_parameters(const Reader& r, const Pt2Archive& archive, json& graph_json, json& signature,
                                std::map<std::string, std::pair<std::string, json>>& payloads) {
  std::vector<std::string> pickled;
  for (const auto& [fqn, p] : payloads)
    if (p.second.is_object() && p.second.value("use_pickle", false)) pickled.push_back(fqn);
  if (pickled.empty()) return;
  json& specs = signature["input_specs"];
  json& inputs = graph_json["inputs"];
  json& nodes = graph_json["nodes"];
  const json& tvs = graph_json["tensor_values"];
  if (!specs.is_array() || !inputs.is_array() || !nodes.is_array() || !tvs.is_object()) return;  // reported later
  for (const std::string& fqn : pickled) {
    const std::string where = fmt::format("parameter '{}'", fqn);
    auto& [dir, meta] = payloads.at(fqn);
    const std::string entry = dir + r.as_string(r.field(meta, "path_name", where), where);
    if (!archive.contains(entry)) r.bad(where, fmt::format("storage entry '{}' is missing", entry));
    const auto members = archive.nested_members(entry);
    auto pkl = std::find_if(members.begin(), members.end(), [](const auto& m) {
      return m.first.size() >= 8 && m.first.compare(m.first.size() - 8, 8, "data.pkl") == 0;
    });
    if (pkl == members.end()) r.bad(where, "is stored pickled, but its entry holds no data.pkl");
    const std::string prefix = pkl->first.substr(0, pkl->first.size() - 8);  // "archive/"
    std::vector<std::byte> bytes(static_cast<size_t>(pkl->second.size));
    archive.read(entry, pkl->second.offset, bytes);
    std::string cls;
    pickle::ValuePtr top;
    try {
      top = pickle::load(bytes);
    } catch (const Error& e) {
      r.bad(where, fmt::format("its pickle ({}) cannot be read: {}", pkl->first, e.what()));
    }
    const auto inner = read_subclass_pickle(r, where, *top, &cls);

    // The placeholder, its input spec and the nodes reading it.
    size_t spec_index = specs.size();
    std::string kind, placeholder;
    for (size_t i = 0; i < specs.size() && spec_index == specs.size(); ++i)
      for (const char* k : {"parameter", "buffer", "tensor_constant"}) {
        const char* name_field = std::string_view(k) == "parameter" ? "parameter_name"
                                 : std::string_view(k) == "buffer"  ? "buffer_name"
                                                                    : "tensor_constant_name";
        auto it = specs[i].find(k);
        if (it != specs[i].end() && it->is_object() && it->value(name_field, std::string()) == fqn) {
          spec_index = i, kind = k;
          placeholder = r.as_string(r.field(r.field(*it, "arg", where), "name", where), where);
          break;
        }
      }
    if (spec_index == specs.size()) continue;  // not a graph input: nothing reads it
    json new_specs = json::array(), new_inputs = json::array();
    json kept_nodes = json::array();
    for (auto& n : nodes) {
      const bool access = n.value("target", std::string()) == "torch.ops.export.access_subclass_inner_tensor.default";
      bool reads = false;
      std::string attr;
      for (const auto& in : n.value("inputs", json::array())) {
        const json& a = in.value("arg", json::object());
        if (a.is_object() && a.contains("as_tensor") && a["as_tensor"].value("name", std::string()) == placeholder) reads = true;
        if (a.is_object() && a.contains("as_string")) attr = a["as_string"].get<std::string>();
        if (a.is_object() && a.contains("as_tensors"))
          for (const auto& t : a["as_tensors"])
            if (t.value("name", std::string()) == placeholder) reads = true;
      }
      if (!reads) {
        kept_nodes.push_back(std::move(n));
        continue;
      }
      if (!access)
        r.bad(where, fmt::format("is a tensor subclass ({}) that node '{}' ({}) reads whole; kiln reads a subclass's "
                                 "inner tensors only (export.access_subclass_inner_tensor)",
                                 cls, n.value("name", std::string("?")), n.value("target", std::string("?"))));
      auto t = inner.find(attr);
      if (t == inner.end())
        r.bad(where, fmt::format("the graph reads attribute '{}' of its {}, which the pickle does not hold", attr, cls));
      const json& outs = n["outputs"];
      if (!outs.is_array() || outs.size() != 1 || !outs[0].contains("as_tensor"))
        r.bad(where, "an access_subclass_inner_tensor node without one tensor output");
      const std::string value = outs[0]["as_tensor"].value("name", std::string());
      auto vm = tvs.find(value);
      if (vm == tvs.end()) r.bad(where, fmt::format("inner tensor '{}' has no metadata", value));
      auto member = members.find(prefix + "data/" + t->second.storage);
      if (member == members.end())
        r.bad(where, fmt::format("attribute '{}' names storage '{}', which its entry does not hold", attr, t->second.storage));
      if (static_cast<uint64_t>(t->second.storage_numel * t->second.element_bytes) > member->second.size)
        r.bad(where, fmt::format("attribute '{}': storage '{}' is shorter than its record", attr, t->second.storage));
      json m = *vm;  // the inner tensor's metadata, as the graph has it; the offset from the pickle
      m["storage_offset"] = {{"as_int", t->second.storage_offset}};
      const std::string inner_fqn = fqn + "." + attr;
      payloads[inner_fqn] = {dir, json{{"path_name", meta["path_name"]}, {"tensor_meta", m},
                                       {"kiln_member_offset", member->second.offset},
                                       {"kiln_member_bytes", member->second.size},
                                       {"kiln_element_bytes", t->second.element_bytes}}};
      const char* name_field = kind == "parameter" ? "parameter_name" : kind == "buffer" ? "buffer_name" : "tensor_constant_name";
      json spec = specs[spec_index];
      spec[kind]["arg"]["name"] = value;
      spec[kind][name_field] = inner_fqn;
      new_specs.push_back(std::move(spec));
      new_inputs.push_back(json{{"as_tensor", {{"name", value}}}});
    }
    nodes = std::move(kept_nodes);
    // The subclass placeholder's spec and graph input are replaced by its inner tensors'.
    json specs_out = json::array(), inputs_out = json::array();
    for (size_t i = 0; i < specs.size(); ++i) {
      if (i == spec_index) {
        for (auto& x : new_specs) specs_out.push_back(x);
        continue;
      }
      specs_out.push_back(specs[i]);
    }
    for (auto& in : inputs) {
      if (in.is_object() && in.contains("as_tensor") && in["as_tensor"].value("name", std::string()) == placeholder) {
        for (auto& x : new_inputs) inputs_out.push_back(x);
        continue;
      }
      inputs_out.push_back(in);
    }
    specs = std::move(specs_out);
    inputs = std::move(inputs_out);
    payloads.erase(fqn);
  }
}

// The innermost module of a node's serialized nn_module_stack: entries
// "key,path,type" joined by ';', outermost first (torch.export's serializer);
// a path may hold commas inside brackets or quotes ("L['self'].h[0]"). The
// path comes back as an attribute path: "transformer.h.0.attn".
void innermost_module(const std::string& stack, std::string* path, std::string* type) {
  std::string_view last(stack);
  if (auto semi = last.rfind(';'); semi != std::string_view::npos) last = last.substr(semi + 1);
  std::vector<std::string> parts(1);
  int depth = 0;
  char quote = 0;
  for (char c : last) {
    if (quote) {
      if (c == quote) quote = 0;
    } else if (c == '\'' || c == '"') {
      quote = c;
    } else if (c == '[' || c == '(' || c == '{') {
      ++depth;
    } else if ((c == ']' || c == ')' || c == '}') && depth > 0) {
      --depth;
    } else if (c == ',' && depth == 0) {
      parts.emplace_back();
      continue;
    }
    parts.back() += c;
  }
  if (parts.size() < 3) return;
  *type = parts.back();
  std::string raw = parts[1];
  for (size_t k = 2; k + 1 < parts.size(); ++k) raw += "," + parts[k];
  // L['self'].a.b[0]['c'] / L__self__.a -> a.b.0.c
  for (std::string_view root : {"L['self']", "L[\"self\"]", "L__self__", "self"})
    if (raw.starts_with(root) && (raw.size() == root.size() || raw[root.size()] == '.' || raw[root.size()] == '[')) {
      raw = raw.substr(root.size());
      break;
    }
  std::string out;
  for (char c : raw) {
    if (c == '[') {
      out += '.';
    } else if (c != ']' && c != '\'' && c != '"') {
      out += c;
    }
  }
  while (!out.empty() && out.front() == '.') out.erase(out.begin());
  *path = out;
}

}  // namespace

std::string_view constant_kind_name(ConstantTensor::Kind kind) {
  static constexpr std::array<std::string_view, 3> kNames{"parameter", "buffer", "tensor_constant"};
  return enum_name<ConstantTensor::Kind::TensorConstant>(kind, kNames);
}

const ConstantTensor* ExportedProgram::find_constant(std::string_view name) const {
  for (const auto& c : constants)
    if (c.name == name) return &c;
  return nullptr;
}

void ExportedProgram::stream_constant(const ConstantTensor& c,
                                      const std::function<void(std::span<const std::byte>)>& sink) const {
  const auto& m = c.meta;
  const auto esize = static_cast<uint64_t>(element_size(m.dtype));
  if (m.numel() == 0) return;
  if (m.is_contiguous()) {
    archive->stream(c.entry, c.entry_offset + static_cast<uint64_t>(m.storage_offset) * esize, static_cast<uint64_t>(m.nbytes()), sink);
    return;
  }
  // A strided view of its storage (e.g. a transposed or sliced parameter):
  // read the storage span it reaches once, then gather row-major.
  std::vector<std::byte> storage(static_cast<size_t>(m.storage_extent()) * esize);
  archive->read(c.entry, c.entry_offset, storage);
  const size_t rank = m.sizes.size();
  std::vector<int64_t> index(rank, 0);
  std::vector<std::byte> row;
  const int64_t inner = rank ? m.sizes.back() : 1;
  const int64_t inner_stride = rank ? m.strides.back() : 1;
  row.resize(static_cast<size_t>(inner) * esize);
  for (int64_t done = 0; done < m.numel(); done += inner) {
    int64_t base = m.storage_offset;
    for (size_t d = 0; d + 1 < rank; ++d) base += index[d] * m.strides[d];
    for (int64_t i = 0; i < inner; ++i)
      std::memcpy(row.data() + static_cast<size_t>(i) * esize,
                  storage.data() + static_cast<size_t>(base + i * inner_stride) * esize, esize);
    sink(row);
    for (size_t d = rank - 1; d-- > 0;) {  // advance the outer index, odometer style
      if (++index[d] < m.sizes[d]) break;
      index[d] = 0;
    }
  }
}

void ExportedProgram::read_constant(const ConstantTensor& c, std::span<std::byte> out) const {
  check(out.size() == static_cast<size_t>(c.meta.nbytes()), "read_constant('{}'): buffer holds {} bytes, tensor {}",
        c.name, out.size(), c.meta.nbytes());
  size_t pos = 0;
  stream_constant(c, [&](std::span<const std::byte> chunk) {
    std::memcpy(out.data() + pos, chunk.data(), chunk.size());
    pos += chunk.size();
  });
}

void ExportedProgram::read_constant_range(const ConstantTensor& c, uint64_t offset, std::span<std::byte> out) const {
  const auto nbytes = static_cast<uint64_t>(c.meta.nbytes());
  check(offset <= nbytes && out.size() <= nbytes - offset, "read_constant_range('{}'): {} bytes at {} past its {} bytes",
        c.name, out.size(), offset, nbytes);
  if (c.meta.is_contiguous()) {
    archive->read(c.entry, c.entry_offset + static_cast<uint64_t>(c.meta.storage_offset) * static_cast<uint64_t>(element_size(c.meta.dtype)) + offset, out);
    return;
  }
  std::vector<std::byte> all(nbytes);
  read_constant(c, all);
  std::memcpy(out.data(), all.data() + offset, out.size());
}

uint32_t ExportedProgram::content_crc32(const ConstantTensor& c) const {
  uLong crc = crc32(0L, Z_NULL, 0);
  stream_constant(c, [&](std::span<const std::byte> chunk) {
    crc = crc32(crc, reinterpret_cast<const Bytef*>(chunk.data()), static_cast<uInt>(chunk.size()));
  });
  return static_cast<uint32_t>(crc);
}

// True for a node that only computes or checks symbols: a SymInt/SymBool
// output (aten.sym_size.int, operator.mul), or a runtime assert on a SymBool.
bool is_symbolic_node(const json& jn) {
  auto outs = jn.find("outputs");
  if (outs != jn.end() && outs->is_array())
    for (const auto& o : *outs)
      if (o.is_object() && o.size() == 1 &&
          (o.contains("as_sym_int") || o.contains("as_sym_bool") || o.contains("as_sym_float")))
        return true;
  auto target = jn.find("target");
  if (target == jn.end() || !target->is_string()) return false;
  const std::string& t = target->get_ref<const std::string&>();
  if (t.find("_assert_scalar") == std::string::npos && t.find("sym_constrain_range") == std::string::npos)
    return false;
  auto ins = jn.find("inputs");
  if (ins != jn.end() && ins->is_array())
    for (const auto& i : *ins)
      if (auto a = i.find("arg"); a != i.end() && a->is_object() && (a->contains("as_sym_bool") || a->contains("as_sym_int")))
        return true;
  return false;
}

// True for an argument that names a graph SymInt ({"as_sym_int": {"as_name": ...}} or a list with one).
bool has_symbol_reference(const json& arg) {
  if (!arg.is_object()) return false;
  auto named = [](const json& e) { return e.is_object() && e.contains("as_name"); };
  if (auto it = arg.find("as_sym_int"); it != arg.end()) return named(*it);
  if (auto it = arg.find("as_sym_ints"); it != arg.end() && it->is_array())
    for (const auto& e : *it)
      if (named(e)) return true;
  return false;
}

// range_constraints -> symbols (each with a finite upper bound).
std::vector<graph::Symbol> read_symbols(const Reader& r, const json& doc) {
  std::vector<graph::Symbol> out;
  auto it = doc.find("range_constraints");
  if (it == doc.end() || !it->is_object()) return out;
  for (auto rc = it->begin(); rc != it->end(); ++rc) {
    std::string where = fmt::format("range_constraints '{}'", rc.key());
    graph::Symbol s;
    s.name = rc.key();
    const json& lo = r.field(rc.value(), "min_val", where);
    const json& hi = r.field(rc.value(), "max_val", where);
    s.min = lo.is_number_integer() ? lo.get<int64_t>() : 0;
    if (!hi.is_number_integer() || hi.get<int64_t>() > (int64_t{1} << 31))
      r.bad(where, "dynamic size has no upper bound; kiln plans memory at the bound: export with "
                   "torch.export.Dim(name, max=N)");
    s.max = hi.get<int64_t>();
    if (s.max < s.min || s.max < 0) r.bad(where, fmt::format("empty range [{}, {}]", s.min, s.max));
    out.push_back(std::move(s));
  }
  return out;
}

ExportedProgram read_pt2(const std::string& path, const SymbolBinding* binding) {
  ExportedProgram ep;
  ep.path = path;
  auto archive = std::make_shared<Pt2Archive>(path);
  ep.archive = archive;
  auto [root, model_name] = locate_model(*archive);
  ep.model_name = model_name;

  if (archive->contains(root + "archive_format")) {
    std::string fmt_value = archive->read_text(root + "archive_format");
    check(fmt_value == "pt2", "{}: archive_format is '{}', expected 'pt2'", path, fmt_value);
  }
  if (archive->contains(root + "byteorder")) {
    std::string order = archive->read_text(root + "byteorder");
    check(order == "little", "{}: byteorder is '{}'; kiln reads little-endian archives only", path, order);
  }

  Reader r{path, &ep.graph, {}, {}};
  const std::string model_entry = root + "models/" + model_name + ".json";
  json doc;
  try {
    doc = json::parse(archive->read_text(model_entry));
  } catch (const json::exception& e) {
    r.bad(model_entry, fmt::format("invalid JSON ({})", e.what()));
  }
  if (!doc.is_object()) r.bad(model_entry, "expected a JSON object");

  if (auto it = doc.find("torch_version"); it != doc.end() && it->is_string()) ep.torch_version = *it;
  if (auto it = doc.find("schema_version"); it != doc.end() && it->is_object())
    ep.schema_version = fmt::format("{}.{}", it->value("major", 0), it->value("minor", 0));
  if (auto it = doc.find("verifiers"); it != doc.end() && it->is_array() && !it->empty() && (*it)[0].is_string())
    ep.dialect = (*it)[0].get<std::string>();
  else if (auto d = doc.find("dialect"); d != doc.end() && d->is_string())
    ep.dialect = *d;

  std::map<std::string, std::pair<std::string, json>> payloads;  // fqn -> (data dir, PayloadMeta)
  read_payload_config(r, *archive, root, root + "data/weights/" + model_name + "_weights_config.json", "data/weights/",
                      payloads);
  read_payload_config(r, *archive, root, root + "data/constants/" + model_name + "_constants_config.json",
                      "data/constants/", payloads);
  {
    json& gm_mut = doc["graph_module"];
    if (gm_mut.is_object() && gm_mut["graph"].is_object() && gm_mut["signature"].is_object())
      unwrap_subclass_parameters(r, *archive, gm_mut["graph"], gm_mut["signature"], payloads);
  }
  const json& gm = r.field(doc, "graph_module", model_entry);
  const json& g = r.field(gm, "graph", "graph_module");

  // Symbols and the values the graph is read at.
  ep.graph.symbols = read_symbols(r, doc);
  for (const auto& s : ep.graph.symbols) {
    int64_t v = s.max;
    if (binding) {
      auto it = binding->find(s.name);
      if (it != binding->end()) v = it->second;
      if (v < s.min || v > s.max) r.bad("range_constraints", fmt::format("{} = {} is outside [{}, {}]", s.name, v, s.min, s.max));
    }
    r.binding[s.name] = v;
  }
  if (auto sv = g.find("sym_int_values"); sv != g.end() && sv->is_object())
    for (auto it = sv->begin(); it != sv->end(); ++it) {
      graph::SymExpr e;
      r.sym_int_expr(it.value(), fmt::format("SymInt '{}'", it.key()), &e);
      r.sym_values[it.key()] = std::move(e);
    }

  // Tensor values first: every node argument refers to them by name.
  const json& tvs = r.field(g, "tensor_values", "graph");
  if (!tvs.is_object()) r.bad("graph.tensor_values", "expected an object");
  for (auto it = tvs.begin(); it != tvs.end(); ++it)
    ep.graph.add_value(it.key(), r.tensor_meta(it.value(), fmt::format("tensor '{}'", it.key())));

  for (const auto& in : r.as_array(r.field(g, "inputs", "graph"), "graph.inputs")) {
    auto [kind, v] = r.union_member(in, "graph input");
    if (kind != "as_tensor") r.bad("graph input", fmt::format("input of kind '{}'; kiln supports tensor inputs only", kind));
    ep.graph.inputs.push_back(r.tensor_ref(*v, "graph input"));
  }

  int32_t index = 0;
  for (const auto& jn : r.as_array(r.field(g, "nodes", "graph"), "graph.nodes")) {
    if (!ep.graph.symbols.empty() && is_symbolic_node(jn)) continue;  // its values are known at the binding
    graph::Node node;
    std::string where = fmt::format("node #{}", index);
    if (auto it = jn.find("name"); it != jn.end() && it->is_string()) node.name = *it;
    if (!node.name.empty()) where = fmt::format("node '{}'", node.name);
    node.target = strip_op_prefix(r.as_string(r.field(jn, "target", where), where));
    where += fmt::format(" ({})", node.target);
    for (const auto& ji : r.as_array(r.field(jn, "inputs", where), where)) {
      graph::NamedArgument na;
      na.name = r.as_string(r.field(ji, "name", where), where);
      na.arg = r.argument(r.field(ji, "arg", where), fmt::format("{} input '{}'", where, na.name));
      if (auto it = ji.find("kind"); it != ji.end() && it->is_number_integer()) na.keyword = it->get<int64_t>() == 2;
      node.symbolic = node.symbolic || has_symbol_reference(r.field(ji, "arg", where));
      node.inputs.push_back(std::move(na));
    }
    for (const auto& jo : r.as_array(r.field(jn, "outputs", where), where)) {
      Argument out = r.argument(jo, where + " output");
      if (out.kind != Argument::Kind::Tensor && out.kind != Argument::Kind::Tensors && out.kind != Argument::Kind::None)
        r.bad(where, fmt::format("output of kind '{}'; kiln supports tensor outputs only",
                                 graph::argument_kind_name(out.kind)));
      for (ValueId v : out.tensor_ids()) {
        auto& value = ep.graph.values[static_cast<size_t>(v)];
        if (value.producer >= 0) r.bad(where, fmt::format("tensor '{}' is written by two nodes", value.name));
        value.producer = index;
      }
      node.outputs.push_back(std::move(out));
    }
    if (auto md = jn.find("metadata"); md != jn.end() && md->is_object()) {
      if (auto st = md->find("stack_trace"); st != md->end() && st->is_string()) node.stack_trace = *st;
      if (auto ms = md->find("nn_module_stack"); ms != md->end() && ms->is_string())
        innermost_module(ms->get<std::string>(), &node.module_path, &node.module_type);
    }
    node.source_nodes = {node.name};
    ep.graph.nodes.push_back(std::move(node));
    ++index;
  }

  for (const auto& out : r.as_array(r.field(g, "outputs", "graph"), "graph.outputs"))
    ep.graph.outputs.push_back(r.argument(out, "graph output"));

  // Pytree specs of the root module's call (ExecuTorch programs carry them too).
  if (auto mcg = gm.find("module_call_graph"); mcg != gm.end() && mcg->is_array()) {
    for (const auto& entry : *mcg) {
      if (!entry.is_object() || entry.value("fqn", std::string("?")) != "") continue;
      if (auto s = entry.find("signature"); s != entry.end() && s->is_object()) {
        if (auto i = s->find("in_spec"); i != s->end() && i->is_string()) ep.inputs_spec = *i;
        if (auto o = s->find("out_spec"); o != s->end() && o->is_string()) ep.outputs_spec = *o;
      }
    }
  }

  // Signature.
  const json& sig = r.field(gm, "signature", "graph_module");
  for (const auto& js : r.as_array(r.field(sig, "input_specs", "signature"), "signature.input_specs")) {
    auto [kind, v] = r.union_member(js, "input spec");
    graph::InputSpec spec;
    using IK = graph::InputSpec::Kind;
    std::string where = "input spec '" + kind + "'";
    auto arg_name = [&](const json& arg) { return r.as_string(r.field(arg, "name", where), where); };
    if (kind == "user_input") {
      spec.kind = IK::UserInput;
      auto [ak, av] = r.union_member(r.field(*v, "arg", where), where);
      if (ak != "as_tensor") r.bad(where, fmt::format("user input of kind '{}'; kiln supports tensor inputs only", ak));
      spec.arg_name = arg_name(*av);
    } else if (kind == "parameter") {
      spec.kind = IK::Parameter;
      spec.arg_name = arg_name(r.field(*v, "arg", where));
      spec.target = r.as_string(r.field(*v, "parameter_name", where), where);
    } else if (kind == "buffer") {
      spec.kind = IK::Buffer;
      spec.arg_name = arg_name(r.field(*v, "arg", where));
      spec.target = r.as_string(r.field(*v, "buffer_name", where), where);
      if (auto it = v->find("persistent"); it != v->end() && it->is_boolean()) spec.persistent = *it;
    } else if (kind == "tensor_constant") {
      spec.kind = IK::TensorConstant;
      spec.arg_name = arg_name(r.field(*v, "arg", where));
      spec.target = r.as_string(r.field(*v, "tensor_constant_name", where), where);
    } else if (kind == "custom_obj" || kind == "token" || kind == "constant_input") {
      r.bad(where, "input kind not supported by kiln");
    } else {
      r.bad(where, "unknown input spec kind");
    }
    ep.signature.inputs.push_back(std::move(spec));
  }
  if (ep.signature.inputs.size() != ep.graph.inputs.size())
    r.bad("signature", fmt::format("{} input specs for {} graph inputs", ep.signature.inputs.size(), ep.graph.inputs.size()));
  for (size_t i = 0; i < ep.graph.inputs.size(); ++i)
    if (ep.graph.value(ep.graph.inputs[i]).name != ep.signature.inputs[i].arg_name)
      r.bad("signature", fmt::format("input spec {} names '{}' but graph input {} is '{}'", i,
                                     ep.signature.inputs[i].arg_name, i, ep.graph.value(ep.graph.inputs[i]).name));

  for (const auto& js : r.as_array(r.field(sig, "output_specs", "signature"), "signature.output_specs")) {
    auto [kind, v] = r.union_member(js, "output spec");
    std::string where = "output spec '" + kind + "'";
    graph::OutputSpec spec;
    using OK = graph::OutputSpec::Kind;
    static const std::map<std::string, std::pair<OK, const char*>> kinds = {
        {"user_output", {OK::UserOutput, nullptr}},
        {"loss_output", {OK::LossOutput, nullptr}},
        {"buffer_mutation", {OK::BufferMutation, "buffer_name"}},
        {"user_input_mutation", {OK::UserInputMutation, "user_input_name"}},
        {"parameter_mutation", {OK::ParameterMutation, "parameter_name"}},
        {"gradient_to_parameter", {OK::GradientToParameter, "parameter_name"}},
        {"gradient_to_user_input", {OK::GradientToUserInput, "user_input_name"}},
        {"token", {OK::Token, nullptr}},
    };
    auto k = kinds.find(kind);
    if (k == kinds.end()) r.bad(where, "unknown output spec kind");
    spec.kind = k->second.first;
    const json& arg = r.field(*v, "arg", where);
    if (kind == "user_output") {
      auto [ak, av] = r.union_member(arg, where);
      if (ak == "as_tensor") spec.arg_name = r.as_string(r.field(*av, "name", where), where);
    } else {
      spec.arg_name = r.as_string(r.field(arg, "name", where), where);
    }
    if (k->second.second) spec.target = r.as_string(r.field(*v, k->second.second, where), where);
    ep.signature.outputs.push_back(std::move(spec));
  }
  if (ep.signature.outputs.size() != ep.graph.outputs.size())
    r.bad("signature", fmt::format("{} output specs for {} graph outputs", ep.signature.outputs.size(),
                                   ep.graph.outputs.size()));

  // Constant tensors: where each parameter, buffer and tensor constant's bytes live (payloads, read above).
  for (size_t i = 0; i < ep.signature.inputs.size(); ++i) {
    const auto& spec = ep.signature.inputs[i];
    ConstantTensor c;
    using IK = graph::InputSpec::Kind;
    if (spec.kind == IK::Parameter) c.kind = ConstantTensor::Kind::Parameter;
    else if (spec.kind == IK::Buffer) c.kind = ConstantTensor::Kind::Buffer;
    else if (spec.kind == IK::TensorConstant) c.kind = ConstantTensor::Kind::TensorConstant;
    else continue;
    c.name = spec.target;
    std::string where = fmt::format("{} '{}'", constant_kind_name(c.kind), c.name);
    auto p = payloads.find(c.name);
    if (p == payloads.end()) r.bad(where, "has no entry in the archive's weights or constants config");
    const json& meta = p->second.second;
    const std::string& dir = p->second.first;
    if (meta.value("use_pickle", false))
      r.bad(where, "is stored pickled, and the graph does not read it as a tensor subclass's inner tensors; kiln reads "
                   "plain dense tensors and tensor subclasses' parts only");
    c.entry = dir + r.as_string(r.field(meta, "path_name", where), where);
    c.meta = r.tensor_meta(r.field(meta, "tensor_meta", where), where);
    const auto& placeholder = ep.graph.value(ep.graph.inputs[i]).meta;
    if (placeholder.sizes != c.meta.sizes || placeholder.dtype != c.meta.dtype)
      r.bad(where, "metadata disagrees with its graph input's");
    if (!archive->contains(c.entry)) r.bad(where, fmt::format("storage entry '{}' is missing", c.entry));
    c.entry_bytes = archive->entry_size(c.entry);
    if (auto off = meta.find("kiln_member_offset"); off != meta.end()) {  // a subclass's part (unwrap_subclass_parameters)
      c.entry_offset = off->get<uint64_t>();
      c.entry_bytes = meta.at("kiln_member_bytes").get<uint64_t>();
      if (meta.at("kiln_element_bytes").get<int64_t>() != element_size(c.meta.dtype))
        r.bad(where, "its storage's element size disagrees with its dtype");
    }
    const uint64_t need = static_cast<uint64_t>(c.meta.storage_extent()) * static_cast<uint64_t>(element_size(c.meta.dtype));
    if (c.entry_bytes < need)
      r.bad(where, fmt::format("storage entry '{}' holds {} bytes but its metadata needs {}", c.entry, c.entry_bytes, need));
    ep.constants.push_back(std::move(c));
  }
  return ep;
}

}  // namespace kiln::pt2
