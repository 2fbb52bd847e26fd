// Size expressions as torch writes them (sympy's srepr), for the .pt2
// reader (json_reader.h): reduced to kiln's linear form, or evaluated at the
// symbols' binding.
#include "json_reader.h"

#include <cctype>
#include <charconv>

namespace kiln::pt2::detail {

namespace {

// Past the identifier (letters, digits, '_') at `pos`.
size_t identifier_end(const std::string& t, size_t pos) {
  while (pos < t.size() && (std::isalnum(static_cast<unsigned char>(t[pos])) || t[pos] == '_')) ++pos;
  return pos;
}

// The arguments of a call in a sympy repr ("Symbol('s0', positive=True)"), `pos` just past its '(' and
// left past its ')': each positional one read by `element` (which moves `pos` past it), a quoted one (a
// symbol's name) into `*quoted`, keyword arguments (positive=True) skipped. False where the text is
// not such a list.
template <class Element>
bool call_arguments(const std::string& t, size_t& pos, std::string* quoted, const Element& element) {
  for (;;) {
    Reader::skip_space(t, pos);
    if (pos < t.size() && t[pos] == ')') {
      ++pos;
      return true;
    }
    if (pos < t.size() && t[pos] == '\'') {
      size_t end = t.find('\'', pos + 1);
      if (end == std::string::npos) return false;
      *quoted = t.substr(pos + 1, end - pos - 1);
      pos = end + 1;
    } else {
      size_t save = pos;
      pos = identifier_end(t, pos);
      Reader::skip_space(t, pos);
      if (pos < t.size() && t[pos] == '=') {  // keyword: skip its value
        ++pos;
        while (pos < t.size() && t[pos] != ',' && t[pos] != ')') ++pos;
      } else {
        pos = save;
        element();
      }
    }
    Reader::skip_space(t, pos);
    if (pos < t.size() && t[pos] == ',') ++pos;
    else if (pos >= t.size() || t[pos] != ')') return false;
  }
}

}  // namespace

graph::SymExpr Reader::expression(const std::string& text, const std::string& where) const {
  size_t pos = 0;
  graph::SymExpr e = parse_expr(text, pos, where);
  skip_space(text, pos);
  if (pos != text.size()) bad(where, fmt::format("cannot read size expression '{}'", text));
  return e;
}

void Reader::skip_space(const std::string& t, size_t& pos) {
  while (pos < t.size() && (t[pos] == ' ')) ++pos;
}

graph::SymExpr Reader::normalize(std::map<std::string, int64_t> terms, int64_t constant) {
  graph::SymExpr e;
  e.constant = constant;
  for (auto& [k, c] : terms)
    if (c != 0) e.terms.emplace_back(k, c);
  return e;
}

int64_t Reader::parse_integer(const std::string& digits, const std::string& where) const {
  int64_t v = 0;
  const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), v);
  if (ec != std::errc() || end != digits.data() + digits.size())
    bad(where, fmt::format("integer '{}' in a size expression is not a 64-bit integer", digits));
  return v;
}

graph::SymExpr Reader::parse_expr(const std::string& t, size_t& pos, const std::string& where) const {
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
  pos = identifier_end(t, pos);
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
  if (!call_arguments(t, pos, &symbol_name, [&] { args.push_back(parse_expr(t, pos, where)); }))
    return unreadable();
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

int64_t Reader::evaluate(const std::string& t, size_t& pos, const std::string& where) const {
  skip_space(t, pos);
  size_t start = pos;
  if (pos < t.size() && (t[pos] == '-' || std::isdigit(static_cast<unsigned char>(t[pos])))) {
    ++pos;
    while (pos < t.size() && std::isdigit(static_cast<unsigned char>(t[pos]))) ++pos;
    return parse_integer(t.substr(start, pos - start), where);
  }
  pos = identifier_end(t, pos);
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
  if (!call_arguments(t, pos, &symbol_name, [&] { args.push_back(evaluate(t, pos, where)); }))
    bad(where, fmt::format("cannot evaluate size expression '{}'", t));

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

}  // namespace kiln::pt2::detail
