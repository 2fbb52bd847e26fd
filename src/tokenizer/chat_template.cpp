// A small Jinja engine for chat templates (see chat_template.h for the subset).
// Templates are parsed once into a tree and rendered with reference-counted
// values; errors are exceptions inside this file, one-line messages outside.
#include "kiln/tokenizer/chat_template.h"

#include "one_line.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <sstream>

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <functional>
#include <stdexcept>
#include <utility>

namespace kiln::tok {
namespace {

// ---------------------------------------------------------------- limits
//
// A chat template comes with the model: it is untrusted input, and a template
// can loop, recurse and grow values. Rendering is bounded by these limits (an
// error with one line when one is passed, never a crash or a hang); real
// templates stay orders of magnitude below every one of them.
constexpr size_t kMaxSourceBytes = size_t{1} << 20;  // the template's text
constexpr int kMaxExprDepth = 100;                   // an expression's tree: parentheses, operators, filters
constexpr int kMaxBlockDepth = 100;                  // if / for / generation blocks inside each other
constexpr int kMaxValueDepth = 100;                  // lists and dicts inside each other
constexpr size_t kMaxStringBytes = size_t{16} << 20;  // any string value, and the rendered text
constexpr size_t kMaxListItems = size_t{1} << 20;    // any list (range(), +, split, a loop's items)
constexpr int kMaxJsonIndent = 64;                   // tojson(indent=N)
constexpr uintmax_t kMaxConfigBytes = uintmax_t{64} << 20;  // tokenizer_config.json
// The work one render may do, in units: one evaluation step, one value copied,
// one loop iteration or list item made, 64 bytes of string made, copied or
// compared. Ten million units is about a second; a chat template with a
// thousand messages uses well under a million.
constexpr int64_t kMaxWork = 10'000'000;

[[noreturn]] void error(const std::string& what) { throw std::runtime_error(what); }

// The current render's remaining work (null outside render(): parsing is bounded by the source's size).
thread_local int64_t* t_work = nullptr;

void work(size_t bytes = 0) {
  if (t_work != nullptr && (*t_work -= 1 + static_cast<int64_t>(bytes / 64)) < 0)
    error(fmt::format("rendering takes more than {} steps (a loop that does not end?)", kMaxWork));
}

void check_string_size(size_t n) {
  if (n > kMaxStringBytes) error(fmt::format("a string longer than {} MiB", kMaxStringBytes >> 20));
}

struct Value;
using ListT = std::vector<Value>;
using DictT = std::vector<std::pair<std::string, Value>>;  // insertion-ordered

// Values are immutable except namespace() objects, whose attributes {% set ns.x = v %}
// assigns. A namespace attribute may not hold a value with a namespace in it, so no
// value can contain itself (no cycles), and the depth recorded at construction is
// exact for every value without a namespace and short by less than kMaxValueDepth
// for one with (a namespace's attributes are checked when assigned).
struct Value {
  enum class T { Undefined, None, Bool, Int, Float, Str, VList, VDict } t = T::Undefined;
  bool b = false;
  bool ns = false;      // a namespace() object (attributes assignable)
  bool has_ns = false;  // a namespace() object is in it (or it is one)
  uint16_t depth = 0;   // nesting of lists and dicts (0 for a scalar)
  int64_t i = 0;
  double f = 0;
  std::string s;
  std::shared_ptr<ListT> l;
  std::shared_ptr<DictT> d;

  Value() = default;
  Value(const Value& o) : t(o.t), b(o.b), ns(o.ns), has_ns(o.has_ns), depth(o.depth), i(o.i), f(o.f), s(o.s), l(o.l), d(o.d) {
    work(s.size());
  }
  Value& operator=(const Value& o) {
    if (this != &o) {
      work(o.s.size());
      t = o.t, b = o.b, ns = o.ns, has_ns = o.has_ns, depth = o.depth, i = o.i, f = o.f, s = o.s, l = o.l, d = o.d;
    }
    return *this;
  }
  Value(Value&&) noexcept = default;
  Value& operator=(Value&&) noexcept = default;
  ~Value() = default;

  static Value none() { Value v; v.t = T::None; return v; }
  static Value boolean(bool x) { Value v; v.t = T::Bool; v.b = x; return v; }
  static Value integer(int64_t x) { Value v; v.t = T::Int; v.i = x; return v; }
  static Value real(double x) { Value v; v.t = T::Float; v.f = x; return v; }
  static Value str(std::string x) {
    check_string_size(x.size());
    work(x.size());
    Value v; v.t = T::Str; v.s = std::move(x); return v;
  }
  static Value list(ListT x = {}) {
    if (x.size() > kMaxListItems) error(fmt::format("a list of more than {} items", kMaxListItems));
    Value v; v.t = T::VList;
    for (const Value& e : x) v.nest(e);
    work(x.size());
    v.l = std::make_shared<ListT>(std::move(x));
    return v;
  }
  static Value dict(DictT x = {}, bool is_namespace = false) {
    Value v; v.t = T::VDict; v.ns = v.has_ns = is_namespace;
    for (const auto& kv : x) {
      if (is_namespace) check_attribute(kv.second);
      v.nest(kv.second);
    }
    work(x.size());
    v.d = std::make_shared<DictT>(std::move(x));
    return v;
  }
  // What a namespace's attribute may hold.
  static void check_attribute(const Value& x) {
    if (x.has_ns) error("a namespace attribute cannot hold a namespace (or a list or dict with one in it)");
    if (x.depth + 1 > kMaxValueDepth) error(fmt::format("lists and dicts nested deeper than {} levels", kMaxValueDepth));
  }

 private:
  void nest(const Value& e) {
    if (e.depth + 1 > kMaxValueDepth) error(fmt::format("lists and dicts nested deeper than {} levels", kMaxValueDepth));
    depth = std::max<uint16_t>(depth, static_cast<uint16_t>(e.depth + 1));
    has_ns = has_ns || e.has_ns;
  }
};

// Walks over a value's items stop at this depth (see Value: a namespace's
// recorded depth may be short of the true one by less than kMaxValueDepth).
void check_walk_depth(int depth) {
  if (depth > 2 * kMaxValueDepth + 1) error(fmt::format("lists and dicts nested deeper than {} levels", kMaxValueDepth));
}

const Value* dict_get(const DictT& d, const std::string& k) {
  work(d.size());
  for (const auto& [key, v] : d)
    if (key == k) return &v;
  return nullptr;
}

void dict_set(DictT& d, const std::string& k, Value v) {
  work(d.size());
  for (auto& [key, old] : d)
    if (key == k) { old = std::move(v); return; }
  d.emplace_back(k, std::move(v));
}

bool truthy(const Value& v) {
  switch (v.t) {
    case Value::T::Undefined: case Value::T::None: return false;
    case Value::T::Bool: return v.b;
    case Value::T::Int: return v.i != 0;
    case Value::T::Float: return v.f != 0;
    case Value::T::Str: return !v.s.empty();
    case Value::T::VList: return !v.l->empty();
    case Value::T::VDict: return v.ns || !v.d->empty();
  }
  return false;
}

// Text being built: every append is charged and the size checked.
void append(std::string& out, std::string_view piece) {
  work(piece.size());
  check_string_size(out.size() + piece.size());
  out += piece;
}

std::string float_str(double f) {
  if (std::floor(f) == f && std::abs(f) < 1e16) return fmt::format("{:.1f}", f);
  return fmt::format("{}", f);
}

void repr_into(std::string& out, const Value& v, int depth);
void str_into(std::string& out, const Value& v, int depth = 0) {  // {{ v }} and |string
  switch (v.t) {
    case Value::T::Undefined: return;
    case Value::T::None: return append(out, "None");
    case Value::T::Bool: return append(out, v.b ? "True" : "False");
    case Value::T::Int: return append(out, std::to_string(v.i));
    case Value::T::Float: return append(out, float_str(v.f));
    case Value::T::Str: return append(out, v.s);
    default: return repr_into(out, v, depth);
  }
}

std::string to_str(const Value& v) {
  if (v.t == Value::T::Str) {
    work(v.s.size());
    return v.s;
  }
  std::string out;
  str_into(out, v);
  return out;
}

void quote_py(std::string& out, const std::string& s) {
  const char q = s.find('\'') != std::string::npos && s.find('"') == std::string::npos ? '"' : '\'';
  std::string o(1, q);
  for (char c : s) {
    if (c == '\\') o += "\\\\";
    else if (c == '\n') o += "\\n";
    else if (c == '\t') o += "\\t";
    else if (c == q) o += std::string("\\") + q;
    else o += c;
  }
  o += q;
  append(out, o);
}

void repr_into(std::string& out, const Value& v, int depth) {  // Python's repr, for lists and dicts rendered directly
  check_walk_depth(depth);
  switch (v.t) {
    case Value::T::Str: return quote_py(out, v.s);
    case Value::T::VList:
      append(out, "[");
      for (size_t k = 0; k < v.l->size(); ++k) {
        if (k) append(out, ", ");
        repr_into(out, (*v.l)[k], depth + 1);
      }
      return append(out, "]");
    case Value::T::VDict:
      append(out, "{");
      for (size_t k = 0; k < v.d->size(); ++k) {
        if (k) append(out, ", ");
        quote_py(out, (*v.d)[k].first);
        append(out, ": ");
        repr_into(out, (*v.d)[k].second, depth + 1);
      }
      return append(out, "}");
    default: return str_into(out, v, depth);
  }
}

void json_string(std::string& out, const std::string& s) {  // json.dumps(ensure_ascii=False)
  std::string o = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"': o += "\\\""; break;
      case '\\': o += "\\\\"; break;
      case '\n': o += "\\n"; break;
      case '\r': o += "\\r"; break;
      case '\t': o += "\\t"; break;
      case '\b': o += "\\b"; break;
      case '\f': o += "\\f"; break;
      default:
        if (c < 0x20) o += fmt::format("\\u{:04x}", c);
        else o += static_cast<char>(c);
    }
  }
  o += '"';
  append(out, o);
}

void json_into(std::string& out, const Value& v, int indent, int depth = 0) {
  check_walk_depth(depth);
  auto nl = [&](int d) {
    if (indent < 0) return;
    append(out, "\n");
    const size_t n = static_cast<size_t>(indent) * static_cast<size_t>(d);
    check_string_size(out.size() + n);
    work(n);
    out.append(n, ' ');
  };
  const char* sep = indent < 0 ? ", " : ",";
  switch (v.t) {
    case Value::T::Undefined: case Value::T::None: return append(out, "null");
    case Value::T::Bool: return append(out, v.b ? "true" : "false");
    case Value::T::Int: return append(out, std::to_string(v.i));
    case Value::T::Float: return append(out, fmt::format("{}", v.f));
    case Value::T::Str: return json_string(out, v.s);
    case Value::T::VList:
      if (v.l->empty()) return append(out, "[]");
      append(out, "[");
      for (size_t k = 0; k < v.l->size(); ++k) {
        if (k) append(out, sep);
        nl(depth + 1);
        json_into(out, (*v.l)[k], indent, depth + 1);
      }
      nl(depth);
      return append(out, "]");
    case Value::T::VDict:
      if (v.d->empty()) return append(out, "{}");
      append(out, "{");
      for (size_t k = 0; k < v.d->size(); ++k) {
        if (k) append(out, sep);
        nl(depth + 1);
        json_string(out, (*v.d)[k].first);
        append(out, ": ");
        json_into(out, (*v.d)[k].second, indent, depth + 1);
      }
      nl(depth);
      return append(out, "}");
  }
}

bool equal(const Value& a, const Value& b, int depth = 0) {
  check_walk_depth(depth);
  work(std::min(a.s.size(), b.s.size()));
  auto num = [](const Value& v) { return v.t == Value::T::Int || v.t == Value::T::Float || v.t == Value::T::Bool; };
  if (num(a) && num(b)) {
    if (a.t != Value::T::Float && b.t != Value::T::Float)  // exact, also beyond 2^53
      return (a.t == Value::T::Bool ? a.b : a.i) == (b.t == Value::T::Bool ? b.b : b.i);
    auto as_d = [](const Value& v) { return v.t == Value::T::Float ? v.f : static_cast<double>(v.t == Value::T::Bool ? v.b : v.i); };
    return as_d(a) == as_d(b);
  }
  if (a.t != b.t) return false;
  switch (a.t) {
    case Value::T::Str: return a.s == b.s;
    case Value::T::VList:
      if (a.l->size() != b.l->size()) return false;
      for (size_t k = 0; k < a.l->size(); ++k)
        if (!equal((*a.l)[k], (*b.l)[k], depth + 1)) return false;
      return true;
    case Value::T::VDict: return a.d == b.d;
    default: return true;
  }
}

// The first `needle` in `hay` at or after `from` (npos if none), in time linear
// in both (Knuth-Morris-Pratt; std::string::find may take |hay| x |needle|).
class Finder {
 public:
  explicit Finder(std::string_view needle) : n_(needle), fail_(needle.size() + 1, 0) {
    work(needle.size());
    size_t k = 0;
    for (size_t q = 1; q < n_.size(); ++q) {
      while (k > 0 && n_[q] != n_[k]) k = fail_[k];
      if (n_[q] == n_[k]) ++k;
      fail_[q + 1] = k;
    }
  }
  size_t find(std::string_view hay, size_t from = 0) const {
    if (n_.empty()) return from <= hay.size() ? from : std::string_view::npos;
    size_t k = 0;
    for (size_t q = from; q < hay.size(); ++q) {
      while (k > 0 && hay[q] != n_[k]) k = fail_[k];
      if (hay[q] == n_[k]) ++k;
      if (k == n_.size()) {
        work(q + 1 - from);
        return q + 1 - n_.size();
      }
    }
    work(hay.size() - std::min(from, hay.size()));
    return std::string_view::npos;
  }

 private:
  std::string_view n_;
  std::vector<size_t> fail_;
};

// ---------------------------------------------------------------- lexing

struct Tok {
  enum class K { Name, Str, Int, Float, Op, End } k;
  std::string s;
};

std::vector<Tok> lex_expr(const std::string& src) {
  std::vector<Tok> out;
  size_t i = 0;
  while (i < src.size()) {
    char c = src[i];
    if (std::isspace(static_cast<unsigned char>(c))) { ++i; continue; }
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t j = i;
      while (j < src.size() && (std::isalnum(static_cast<unsigned char>(src[j])) || src[j] == '_')) ++j;
      out.push_back({Tok::K::Name, src.substr(i, j - i)});
      i = j;
      continue;
    }
    if (std::isdigit(static_cast<unsigned char>(c))) {
      size_t j = i;
      bool fl = false;
      while (j < src.size() && (std::isdigit(static_cast<unsigned char>(src[j])) || (src[j] == '.' && !fl && j + 1 < src.size() && std::isdigit(static_cast<unsigned char>(src[j + 1]))))) {
        if (src[j] == '.') fl = true;
        ++j;
      }
      out.push_back({fl ? Tok::K::Float : Tok::K::Int, src.substr(i, j - i)});
      i = j;
      continue;
    }
    if (c == '\'' || c == '"') {
      std::string s;
      size_t j = i + 1;
      for (; j < src.size() && src[j] != c; ++j) {
        if (src[j] == '\\' && j + 1 < src.size()) {
          char e = src[++j];
          s += e == 'n' ? '\n' : e == 't' ? '\t' : e == 'r' ? '\r' : e;
        } else {
          s += src[j];
        }
      }
      if (j >= src.size()) error("unterminated string literal");
      out.push_back({Tok::K::Str, s});
      i = j + 1;
      continue;
    }
    static const char* two[] = {"==", "!=", "<=", ">=", "//", "**"};
    bool matched = false;
    for (const char* t : two)
      if (src.compare(i, 2, t) == 0) { out.push_back({Tok::K::Op, t}); i += 2; matched = true; break; }
    if (matched) continue;
    if (std::string_view("()[]{}.,:|+-*/%~<>=").find(c) == std::string_view::npos)
      error(fmt::format("unexpected character '{}' in an expression", c));
    out.push_back({Tok::K::Op, std::string(1, c)});
    ++i;
  }
  out.push_back({Tok::K::End, ""});
  return out;
}

// ---------------------------------------------------------------- expressions

struct Expr;
using ExprP = std::shared_ptr<Expr>;
struct Expr {
  enum class K { Lit, Name, VList, VDict, Attr, Index, Slice, Call, Filter, Test, Unary, Binary, Cond } k;
  Value lit;
  std::string name;              // Name, Attr, Filter, Test, Unary/Binary operator
  std::vector<ExprP> args;       // operands / call arguments / list items / dict key,value pairs
  std::vector<std::pair<std::string, ExprP>> kwargs;
  bool negate = false;           // Test: is not
  int depth = 1;                 // of the tree below it (<= kMaxExprDepth)
};

ExprP mk(Expr::K k) { auto e = std::make_shared<Expr>(); e->k = k; return e; }

// `e` with its depth set from its operands; an error past kMaxExprDepth (the
// tree is walked recursively when evaluated and freed). Every node with
// operands is made through here.
ExprP fin(ExprP e) {
  int d = 0;
  for (const ExprP& a : e->args)
    if (a) d = std::max(d, a->depth);
  for (const auto& kw : e->kwargs) d = std::max(d, kw.second->depth);
  e->depth = d + 1;
  if (e->depth > kMaxExprDepth) error(fmt::format("an expression nested deeper than {} levels", kMaxExprDepth));
  return e;
}

// Counts the parser's recursion (parentheses, brackets, unary operators, chained
// conditionals; blocks in blocks); an error past the limit, before the stack can run out.
class DepthGuard {
 public:
  explicit DepthGuard(int& depth, int limit = kMaxExprDepth, const char* what = "an expression") : depth_(depth) {
    if (++depth_ > limit) error(fmt::format("{} nested deeper than {} levels", what, limit));
  }
  ~DepthGuard() { --depth_; }
  DepthGuard(const DepthGuard&) = delete;
  DepthGuard& operator=(const DepthGuard&) = delete;

 private:
  int& depth_;
};

class Parser {
 public:
  explicit Parser(std::vector<Tok> t) : t_(std::move(t)) {}
  ExprP expr() { return cond(); }
  bool at_end() const { return t_[p_].k == Tok::K::End; }
  bool is(const std::string& s) const { return (t_[p_].k == Tok::K::Op || t_[p_].k == Tok::K::Name) && t_[p_].s == s; }
  bool accept(const std::string& s) { if (is(s)) { ++p_; return true; } return false; }
  void expect(const std::string& s) { if (!accept(s)) error(fmt::format("expected '{}' near '{}'", s, t_[p_].s)); }
  std::string name() {
    if (t_[p_].k != Tok::K::Name) error(fmt::format("expected a name near '{}'", t_[p_].s));
    return t_[p_++].s;
  }

 private:
  ExprP cond() {
    DepthGuard guard(depth_);
    ExprP a = or_();
    if (accept("if")) {
      ExprP c = or_();
      ExprP b = accept("else") ? cond() : nullptr;
      auto e = mk(Expr::K::Cond);
      e->args = {c, a, b ? b : nullptr};
      return fin(e);
    }
    return a;
  }
  ExprP bin(const std::string& op, ExprP a, ExprP b) { auto e = mk(Expr::K::Binary); e->name = op; e->args = {a, b}; return fin(e); }
  ExprP or_() { ExprP a = and_(); while (accept("or")) a = bin("or", a, and_()); return a; }
  ExprP and_() { ExprP a = not_(); while (accept("and")) a = bin("and", a, not_()); return a; }
  ExprP not_() {
    if (accept("not")) { DepthGuard guard(depth_); auto e = mk(Expr::K::Unary); e->name = "not"; e->args = {not_()}; return fin(e); }
    return cmp();
  }
  ExprP cmp() {
    ExprP a = concat();
    for (;;) {
      if (is("==") || is("!=") || is("<") || is(">") || is("<=") || is(">=")) {
        std::string op = t_[p_++].s;
        a = bin(op, a, concat());
      } else if (accept("in")) {
        a = bin("in", a, concat());
      } else if (is("not") && t_[p_ + 1].s == "in") {
        p_ += 2;
        auto e = mk(Expr::K::Unary); e->name = "not"; e->args = {bin("in", a, concat())};
        a = fin(e);
      } else if (accept("is")) {
        auto e = mk(Expr::K::Test);
        e->negate = accept("not");
        e->name = name();
        e->args = {a};
        a = fin(e);
      } else {
        return a;
      }
    }
  }
  ExprP concat() { ExprP a = add(); while (accept("~")) a = bin("~", a, add()); return a; }
  ExprP add() {
    ExprP a = mul();
    while (is("+") || is("-")) { std::string op = t_[p_++].s; a = bin(op, a, mul()); }
    return a;
  }
  ExprP mul() {
    ExprP a = pow();
    while (is("*") || is("/") || is("//") || is("%")) { std::string op = t_[p_++].s; a = bin(op, a, pow()); }
    return a;
  }
  ExprP pow() {  // Jinja's: left-associative, and a unary minus binds tighter (-2 ** 2 is 4)
    ExprP a = unary();
    while (accept("**")) a = bin("**", a, unary());
    return a;
  }
  ExprP unary() {
    if (accept("-")) { DepthGuard guard(depth_); auto e = mk(Expr::K::Unary); e->name = "-"; e->args = {unary()}; return fin(e); }
    if (accept("+")) { DepthGuard guard(depth_); return unary(); }
    return postfix();
  }
  void call_args(Expr& e) {
    if (accept(")")) return;
    do {
      if (t_[p_].k == Tok::K::Name && t_[p_ + 1].s == "=" ) {
        std::string k = name();
        expect("=");
        e.kwargs.emplace_back(k, expr());
      } else {
        e.args.push_back(expr());
      }
    } while (accept(","));
    expect(")");
  }
  ExprP postfix() {
    ExprP a = primary();
    for (;;) {
      if (accept(".")) {
        auto e = mk(Expr::K::Attr); e->name = name(); e->args = {a}; a = fin(e);
      } else if (accept("[")) {
        ExprP lo = is(":") ? nullptr : expr();
        if (accept(":")) {
          ExprP hi = is("]") ? nullptr : expr();
          auto e = mk(Expr::K::Slice); e->args = {a, lo, hi}; a = fin(e);
        } else {
          auto e = mk(Expr::K::Index); e->args = {a, lo}; a = fin(e);
        }
        expect("]");
      } else if (accept("(")) {
        auto e = mk(Expr::K::Call); e->args = {a}; call_args(*e); a = fin(e);
      } else if (accept("|")) {
        auto e = mk(Expr::K::Filter); e->name = name(); e->args = {a};
        if (accept("(")) call_args(*e);
        a = fin(e);
      } else {
        return a;
      }
    }
  }
  ExprP primary() {
    const Tok& t = t_[p_];
    if (t.k == Tok::K::Str) {
      ++p_;
      std::string s = t.s;
      while (t_[p_].k == Tok::K::Str) s += t_[p_++].s;  // adjacent literals concatenate
      auto e = mk(Expr::K::Lit); e->lit = Value::str(s); return e;
    }
    if (t.k == Tok::K::Int) {
      ++p_;
      int64_t v = 0;
      const auto [end, ec] = std::from_chars(t.s.data(), t.s.data() + t.s.size(), v);
      if (ec != std::errc() || end != t.s.data() + t.s.size())
        error(fmt::format("the integer {} is out of range (kiln's templates have 64-bit integers)", t.s.substr(0, 40)));
      auto e = mk(Expr::K::Lit); e->lit = Value::integer(v); return e;
    }
    if (t.k == Tok::K::Float) {  // digits and one point: strtod gives inf past the largest double, as Python does
      ++p_;
      auto e = mk(Expr::K::Lit); e->lit = Value::real(std::strtod(t.s.c_str(), nullptr)); return e;
    }
    if (t.k == Tok::K::Name) {
      ++p_;
      auto e = mk(Expr::K::Lit);
      if (t.s == "true" || t.s == "True") { e->lit = Value::boolean(true); return e; }
      if (t.s == "false" || t.s == "False") { e->lit = Value::boolean(false); return e; }
      if (t.s == "none" || t.s == "None") { e->lit = Value::none(); return e; }
      auto n = mk(Expr::K::Name); n->name = t.s; return n;
    }
    if (accept("(")) {
      ExprP a = expr();
      if (accept(",")) {  // a tuple: a list here
        auto l = mk(Expr::K::VList); l->args = {a};
        if (!is(")")) do { l->args.push_back(expr()); } while (accept(","));
        expect(")");
        return fin(l);
      }
      expect(")");
      return a;
    }
    if (accept("[")) {
      auto l = mk(Expr::K::VList);
      if (!accept("]")) { do { if (is("]")) break; l->args.push_back(expr()); } while (accept(",")); expect("]"); }
      return fin(l);
    }
    if (accept("{")) {
      auto d = mk(Expr::K::VDict);
      if (!accept("}")) {
        do { if (is("}")) break; d->args.push_back(expr()); expect(":"); d->args.push_back(expr()); } while (accept(","));
        expect("}");
      }
      return fin(d);
    }
    error(fmt::format("unexpected '{}' in an expression", t.s));
  }
  std::vector<Tok> t_;
  size_t p_ = 0;
  int depth_ = 0;  // recursion, see DepthGuard
};

// ---------------------------------------------------------------- statements

struct Stmt;
using Body = std::vector<std::shared_ptr<Stmt>>;
struct Stmt {
  enum class K { Text, Out, If, For, Set, Block } k;
  std::string text;
  ExprP e;                                  // Out, For (iterable), Set (value)
  std::vector<std::pair<ExprP, Body>> branches;  // If
  Body body, else_body;                     // For, If else, Block
  std::vector<std::string> vars;            // For targets; Set: name or {ns, attr}
  ExprP filter;                             // For ... if cond
};

struct Piece {  // raw template pieces after whitespace handling
  enum class K { Text, Expr, Stmt } k;
  std::string s;
};

std::vector<Piece> split(const std::string& src) {
  std::vector<Piece> out;
  size_t i = 0;
  bool strip_next = false, trim_newline = false;
  while (i <= src.size()) {
    size_t open = src.find('{', i);
    while (open != std::string::npos && open + 1 < src.size() && src[open + 1] != '{' && src[open + 1] != '%' && src[open + 1] != '#')
      open = src.find('{', open + 1);
    if (open + 1 >= src.size()) open = std::string::npos;
    std::string text = src.substr(i, open == std::string::npos ? std::string::npos : open - i);
    const std::string orig = text;  // as in the source, for where lines start
    if (strip_next) text.erase(0, text.find_first_not_of(" \t\r\n") == std::string::npos ? text.size() : text.find_first_not_of(" \t\r\n"));
    else if (trim_newline && !text.empty() && text[0] == '\n') text.erase(0, 1);
    if (open == std::string::npos) {
      if (!text.empty()) out.push_back({Piece::K::Text, text});
      break;
    }
    const char kind = src[open + 1];
    const char* close = kind == '{' ? "}}" : kind == '%' ? "%}" : "#}";
    size_t end = src.find(close, open + 2);
    if (end == std::string::npos) error(fmt::format("unterminated '{{{}' tag", kind));
    std::string inner = src.substr(open + 2, end - open - 2);
    const bool dash_left = !inner.empty() && inner[0] == '-';
    if (dash_left) inner.erase(0, 1);
    const bool dash_right = !inner.empty() && inner.back() == '-';  // after the left one: "{%-%}" has one dash
    if (dash_right) inner.pop_back();
    if (dash_left) {
      size_t k = text.find_last_not_of(" \t\r\n");
      text.erase(k == std::string::npos ? 0 : k + 1);
    } else if (kind != '{') {  // lstrip_blocks: spaces and tabs before a block tag at the start of a source line
      const size_t k = orig.find_last_not_of(" \t");
      const bool line_start = k == std::string::npos ? (i == 0 || src[i - 1] == '\n') : orig[k] == '\n';
      if (line_start) {
        const size_t t = text.find_last_not_of(" \t");
        text.erase(t == std::string::npos ? 0 : t + 1);
      }
    }
    if (!text.empty()) out.push_back({Piece::K::Text, text});
    if (kind == '{') out.push_back({Piece::K::Expr, inner});
    else if (kind == '%') out.push_back({Piece::K::Stmt, inner});
    strip_next = dash_right;
    trim_newline = kind != '{';  // trim_blocks
    i = end + 2;
  }
  return out;
}

class Builder {
 public:
  explicit Builder(std::vector<Piece> p) : p_(std::move(p)) {}
  Body parse_all() {
    std::string stop;
    Body b = body({}, &stop);
    if (!stop.empty()) error(fmt::format("unexpected '{{% {} %}}'", stop));
    return b;
  }

 private:
  // Parses statements until one of `ends` (its keyword returned in *stop with its parser).
  Body body(const std::vector<std::string>& ends, std::string* stop, std::unique_ptr<Parser>* stop_parser = nullptr) {
    DepthGuard guard(depth_, kMaxBlockDepth, "blocks ({% if %}, {% for %})");
    Body out;
    while (i_ < p_.size()) {
      const Piece& pc = p_[i_++];
      if (pc.k == Piece::K::Text) {
        auto s = std::make_shared<Stmt>(); s->k = Stmt::K::Text; s->text = pc.s; out.push_back(s);
        continue;
      }
      auto parser = std::make_unique<Parser>(lex_expr(pc.s));
      if (pc.k == Piece::K::Expr) {
        auto s = std::make_shared<Stmt>(); s->k = Stmt::K::Out; s->e = parser->expr();
        if (!parser->at_end()) error(fmt::format("unexpected text in '{{{{{}}}}}'", pc.s));
        out.push_back(s);
        continue;
      }
      std::string kw = parser->name();
      if (std::find(ends.begin(), ends.end(), kw) != ends.end()) {
        *stop = kw;
        if (stop_parser) *stop_parser = std::move(parser);
        return out;
      }
      if (kw == "if") {
        auto s = std::make_shared<Stmt>(); s->k = Stmt::K::If;
        ExprP c = parser->expr();
        for (;;) {
          std::string st;
          std::unique_ptr<Parser> sp;
          Body b = body({"elif", "else", "endif"}, &st, &sp);
          s->branches.emplace_back(c, std::move(b));
          if (st == "elif") { c = sp->expr(); continue; }
          if (st == "else") {
            std::string st2;
            s->else_body = body({"endif"}, &st2);
            if (st2 != "endif") error("missing '{% endif %}'");
          } else if (st != "endif") {
            error("missing '{% endif %}'");
          }
          break;
        }
        out.push_back(s);
      } else if (kw == "for") {
        auto s = std::make_shared<Stmt>(); s->k = Stmt::K::For;
        s->vars.push_back(parser->name());
        while (parser->accept(",")) s->vars.push_back(parser->name());
        parser->expect("in");
        s->e = parser->expr();  // a trailing `if cond` parses as a conditional expression: undo that
        if (s->e->k == Expr::K::Cond && s->e->args[2] == nullptr) { s->filter = s->e->args[0]; s->e = s->e->args[1]; }
        std::string st;
        s->body = body({"else", "endfor"}, &st);
        if (st == "else") { std::string st2; s->else_body = body({"endfor"}, &st2); st = st2; }
        if (st != "endfor") error("missing '{% endfor %}'");
        out.push_back(s);
      } else if (kw == "set") {
        auto s = std::make_shared<Stmt>(); s->k = Stmt::K::Set;
        s->vars.push_back(parser->name());
        if (parser->accept(".")) s->vars.push_back(parser->name());
        parser->expect("=");
        s->e = parser->expr();
        out.push_back(s);
      } else if (kw == "generation") {
        auto s = std::make_shared<Stmt>(); s->k = Stmt::K::Block;
        std::string st;
        s->body = body({"endgeneration"}, &st);
        out.push_back(s);
      } else {
        error(fmt::format("'{{% {} %}}' is not supported", kw));
      }
    }
    stop->clear();
    return out;
  }
  std::vector<Piece> p_;
  size_t i_ = 0;
  int depth_ = 0;  // body() recursion, see DepthGuard
};

// ---------------------------------------------------------------- evaluation

struct Scope {
  std::vector<std::map<std::string, Value>> frames;
  Value get(const std::string& n) const {
    for (auto it = frames.rbegin(); it != frames.rend(); ++it)
      if (auto f = it->find(n); f != it->end()) return f->second;
    return {};
  }
  void set(const std::string& n, Value v) { frames.back()[n] = std::move(v); }
};

class Renderer {
 public:
  explicit Renderer(Scope& s) : sc_(s) {}
  void run(const Body& b, std::string& out) {
    for (const auto& s : b) exec(*s, out);
  }

 private:
  void exec(const Stmt& s, std::string& out) {
    switch (s.k) {
      case Stmt::K::Text: append(out, s.text); break;
      case Stmt::K::Out: str_into(out, eval(*s.e)); break;
      case Stmt::K::Block: run(s.body, out); break;
      case Stmt::K::If:
        for (const auto& [c, b] : s.branches)
          if (truthy(eval(*c))) { run(b, out); return; }
        run(s.else_body, out);
        break;
      case Stmt::K::Set:
        if (s.vars.size() == 2) {
          Value ns = sc_.get(s.vars[0]);
          if (ns.t != Value::T::VDict || !ns.ns) error(fmt::format("'{}' is not a namespace", s.vars[0]));
          Value v = eval(*s.e);
          Value::check_attribute(v);  // no cycles, bounded depth (see Value)
          dict_set(*ns.d, s.vars[1], std::move(v));
        } else {
          sc_.set(s.vars[0], eval(*s.e));
        }
        break;
      case Stmt::K::For: {
        Value it = eval(*s.e);
        std::shared_ptr<const ListT> items;  // a list is immutable: iterated in place, not copied
        if (it.t == Value::T::VList) {
          items = it.l;
        } else {
          ListT made;
          if (it.t == Value::T::VDict) {
            for (const auto& kv : *it.d) made.push_back(Value::str(kv.first));
          } else if (it.t == Value::T::Str) {
            if (it.s.size() > kMaxListItems) error(fmt::format("a loop over more than {} items", kMaxListItems));
            for (char c : it.s) made.push_back(Value::str(std::string(1, c)));
          } else if (it.t != Value::T::Undefined && it.t != Value::T::None) {
            error("for loop over a value that is not iterable");
          }
          items = std::make_shared<const ListT>(std::move(made));
        }
        if (s.filter) {
          ListT kept;
          for (const Value& v : *items) {
            work();
            sc_.frames.emplace_back();
            bind(s.vars, v);
            if (truthy(eval(*s.filter))) kept.push_back(v);
            sc_.frames.pop_back();
          }
          items = std::make_shared<const ListT>(std::move(kept));
        }
        if (items->empty()) { run(s.else_body, out); break; }
        const auto n = static_cast<int64_t>(items->size());
        for (int64_t k = 0; k < n; ++k) {
          work();
          sc_.frames.emplace_back();
          bind(s.vars, (*items)[static_cast<size_t>(k)]);
          DictT loop = {{"index", Value::integer(k + 1)}, {"index0", Value::integer(k)}, {"first", Value::boolean(k == 0)},
                       {"last", Value::boolean(k == n - 1)}, {"length", Value::integer(n)},
                       {"revindex", Value::integer(n - k)}, {"revindex0", Value::integer(n - k - 1)}};
          if (k > 0) loop.emplace_back("previtem", (*items)[static_cast<size_t>(k - 1)]);
          if (k + 1 < n) loop.emplace_back("nextitem", (*items)[static_cast<size_t>(k + 1)]);
          sc_.set("loop", Value::dict(std::move(loop)));
          run(s.body, out);
          sc_.frames.pop_back();
        }
        break;
      }
    }
  }
  void bind(const std::vector<std::string>& vars, const Value& v) {
    if (vars.size() == 1) { sc_.set(vars[0], v); return; }
    if (v.t != Value::T::VList || v.l->size() != vars.size()) error("cannot unpack a loop item");
    for (size_t k = 0; k < vars.size(); ++k) sc_.set(vars[k], (*v.l)[k]);
  }

  static int64_t as_int(const Value& v) {
    if (v.t == Value::T::Int) return v.i;
    if (v.t == Value::T::Bool) return v.b;
    if (v.t == Value::T::Float) {  // truncated; a value beyond int64 (or NaN) would be undefined behaviour
      if (!(v.f >= -9223372036854775808.0 && v.f < 9223372036854775808.0)) error(fmt::format("{} is not a 64-bit integer", v.f));
      return static_cast<int64_t>(v.f);
    }
    error("expected a number");
  }
  static bool is_num(const Value& v) { return v.t == Value::T::Int || v.t == Value::T::Float || v.t == Value::T::Bool; }
  static double as_d(const Value& v) { return v.t == Value::T::Float ? v.f : static_cast<double>(as_int(v)); }

  Value index(const Value& a, const Value& k) {
    if (a.t == Value::T::VDict) {
      if (k.t != Value::T::Str) return {};
      const Value* v = dict_get(*a.d, k.s);
      return v ? *v : Value{};
    }
    if (a.t == Value::T::VList || a.t == Value::T::Str) {
      int64_t n = a.t == Value::T::VList ? static_cast<int64_t>(a.l->size()) : static_cast<int64_t>(a.s.size());
      int64_t i = as_int(k);
      if (i < 0) i += n;
      if (i < 0 || i >= n) return {};
      return a.t == Value::T::VList ? (*a.l)[static_cast<size_t>(i)] : Value::str(std::string(1, a.s[static_cast<size_t>(i)]));
    }
    return {};
  }

  static std::string strip(const std::string& s, const std::string& chars, bool left, bool right) {
    std::array<bool, 256> drop{};  // linear in both strings
    for (unsigned char c : chars) drop[c] = true;
    work(s.size() + chars.size());
    size_t b = 0, e = s.size();
    if (left) while (b < e && drop[static_cast<unsigned char>(s[b])]) ++b;
    if (right) while (e > b && drop[static_cast<unsigned char>(s[e - 1])]) --e;
    return s.substr(b, e - b);
  }

  Value method(const Value& self, const std::string& m, const ListT& args) {
    const std::string ws = " \t\n\r\f\v";
    if (self.t == Value::T::Str) {
      const std::string chars = args.empty() || args[0].t != Value::T::Str ? ws : args[0].s;
      if (m == "strip") return Value::str(strip(self.s, chars, true, true));
      if (m == "lstrip") return Value::str(strip(self.s, chars, true, false));
      if (m == "rstrip") return Value::str(strip(self.s, chars, false, true));
      if (m == "upper" || m == "lower") {
        std::string r = self.s;
        for (char& c : r) c = static_cast<char>(m == "upper" ? std::toupper(static_cast<unsigned char>(c)) : std::tolower(static_cast<unsigned char>(c)));
        return Value::str(r);
      }
      if (m == "title") {
        std::string r = self.s;
        bool start = true;
        for (char& c : r) {
          c = static_cast<char>(start ? std::toupper(static_cast<unsigned char>(c)) : std::tolower(static_cast<unsigned char>(c)));
          start = !std::isalpha(static_cast<unsigned char>(c));
        }
        return Value::str(r);
      }
      if ((m == "startswith" || m == "endswith") && !args.empty() && args[0].t == Value::T::Str) {
        const std::string& p = args[0].s;
          work(p.size());
        bool r = p.size() <= self.s.size() &&
                 (m == "startswith" ? self.s.compare(0, p.size(), p) == 0 : self.s.compare(self.s.size() - p.size(), p.size(), p) == 0);
        return Value::boolean(r);
      }
      if (m == "split") {
        ListT parts;
        if (args.empty() || args[0].t != Value::T::Str) {
          size_t i = 0;
          while (i < self.s.size()) {
            while (i < self.s.size() && ws.find(self.s[i]) != std::string::npos) ++i;
            size_t j = i;
            while (j < self.s.size() && ws.find(self.s[j]) == std::string::npos) ++j;
            if (j > i && parts.size() >= kMaxListItems) error(fmt::format("a list of more than {} items", kMaxListItems));
            if (j > i) parts.push_back(Value::str(self.s.substr(i, j - i)));
            i = j;
          }
        } else {
          const std::string& sep = args[0].s;
          if (sep.empty()) error("split() with an empty separator");
          const Finder finder(sep);
          size_t i = 0;
          for (size_t j; (j = finder.find(self.s, i)) != std::string::npos; i = j + sep.size()) {
            if (parts.size() >= kMaxListItems) error(fmt::format("a list of more than {} items", kMaxListItems));
            parts.push_back(Value::str(self.s.substr(i, j - i)));
          }
          parts.push_back(Value::str(self.s.substr(i)));
        }
        return Value::list(std::move(parts));
      }
      if (m == "replace" && args.size() >= 2) return Value::str(replace(self.s, to_str(args[0]), to_str(args[1])));
    }
    if (self.t == Value::T::VDict) {
      if (m == "items") { ListT l; for (const auto& [k, v] : *self.d) l.push_back(Value::list({Value::str(k), v})); return Value::list(l); }
      if (m == "keys") { ListT l; for (const auto& kv : *self.d) l.push_back(Value::str(kv.first)); return Value::list(l); }
      if (m == "values") { ListT l; for (const auto& kv : *self.d) l.push_back(kv.second); return Value::list(l); }
      if (m == "get" && !args.empty()) {
        const Value* v = args[0].t == Value::T::Str ? dict_get(*self.d, args[0].s) : nullptr;
        return v ? *v : (args.size() > 1 ? args[1] : Value::none());
      }
    }
    error(fmt::format("unknown method '{}'", m));
  }

  static std::string replace(const std::string& s, const std::string& a, const std::string& b) {
    if (a.empty()) return s;
    const Finder finder(a);
    std::string out;
    size_t i = 0;
    for (size_t j; (j = finder.find(s, i)) != std::string::npos; i = j + a.size()) {
      append(out, std::string_view(s).substr(i, j - i));
      append(out, b);
    }
    append(out, std::string_view(s).substr(i));
    return out;
  }

  Value filter(const std::string& f, const Value& v, const ListT& args, const std::vector<std::pair<std::string, Value>>& kw) {
    if (f == "trim") return Value::str(strip(to_str(v), " \t\n\r\f\v", true, true));
    if (f == "length" || f == "count") {
      if (v.t == Value::T::VList) return Value::integer(static_cast<int64_t>(v.l->size()));
      if (v.t == Value::T::VDict) return Value::integer(static_cast<int64_t>(v.d->size()));
      return Value::integer(static_cast<int64_t>(to_str(v).size()));
    }
    if (f == "upper" || f == "lower") return method(Value::str(to_str(v)), f, {});
    if (f == "capitalize") {
      std::string s = to_str(v);
      for (size_t k = 0; k < s.size(); ++k) s[k] = static_cast<char>(k ? std::tolower(static_cast<unsigned char>(s[k])) : std::toupper(static_cast<unsigned char>(s[k])));
      return Value::str(s);
    }
    if (f == "string") return Value::str(to_str(v));
    if (f == "list") return v.t == Value::T::VList ? v : Value::list();
    if (f == "first") return v.t == Value::T::VList && !v.l->empty() ? v.l->front() : Value{};
    if (f == "last") return v.t == Value::T::VList && !v.l->empty() ? v.l->back() : Value{};
    if (f == "join") {
      std::string sep = args.empty() ? "" : to_str(args[0]), out;
      if (v.t == Value::T::VList)
        for (size_t k = 0; k < v.l->size(); ++k) {
          if (k) append(out, sep);
          str_into(out, (*v.l)[k]);
        }
      return Value::str(std::move(out));
    }
    if (f == "default" || f == "d") {
      const bool boolean = args.size() > 1 && truthy(args[1]);
      if (v.t == Value::T::Undefined || (boolean && !truthy(v))) return args.empty() ? Value::str("") : args[0];
      return v;
    }
    if (f == "items") return method(v, "items", {});
    if (f == "replace" && args.size() >= 2) return Value::str(replace(to_str(v), to_str(args[0]), to_str(args[1])));
    if (f == "tojson") {
      int64_t indent = -1;
      if (!args.empty() && args[0].t != Value::T::None) indent = as_int(args[0]);
      for (const auto& [k, a] : kw) if (k == "indent" && a.t != Value::T::None) indent = as_int(a);
      if (indent < -1 || indent > kMaxJsonIndent) error(fmt::format("tojson indent {} is not in 0 .. {}", indent, kMaxJsonIndent));
      std::string out;
      json_into(out, v, static_cast<int>(indent));
      return Value::str(std::move(out));
    }
    error(fmt::format("unknown filter '{}'", f));
  }

  Value eval(const Expr& e) {
    work();
    switch (e.k) {
      case Expr::K::Lit: return e.lit;
      case Expr::K::Name: return sc_.get(e.name);
      case Expr::K::VList: { ListT l; for (const auto& a : e.args) l.push_back(eval(*a)); return Value::list(std::move(l)); }
      case Expr::K::VDict: {
        DictT d;
        for (size_t k = 0; k + 1 < e.args.size(); k += 2) dict_set(d, to_str(eval(*e.args[k])), eval(*e.args[k + 1]));
        return Value::dict(std::move(d));
      }
      case Expr::K::Attr: {
        Value a = eval(*e.args[0]);
        if (a.t == Value::T::VDict) { const Value* v = dict_get(*a.d, e.name); return v ? *v : Value{}; }
        return {};
      }
      case Expr::K::Index: return index(eval(*e.args[0]), eval(*e.args[1]));
      case Expr::K::Slice: {
        Value a = eval(*e.args[0]);
        const int64_t n = a.t == Value::T::VList ? static_cast<int64_t>(a.l->size()) : static_cast<int64_t>(a.s.size());
        auto clampi = [&](const ExprP& x, int64_t dflt) {
          if (!x) return dflt;
          int64_t v = as_int(eval(*x));
          if (v < 0) v += n;
          return std::clamp<int64_t>(v, 0, n);
        };
        const int64_t lo = clampi(e.args[1], 0), hi = clampi(e.args[2], n);
        if (a.t == Value::T::VList) return Value::list(hi > lo ? ListT(a.l->begin() + lo, a.l->begin() + hi) : ListT{});
        if (a.t == Value::T::Str) return Value::str(hi > lo ? a.s.substr(static_cast<size_t>(lo), static_cast<size_t>(hi - lo)) : "");
        return {};
      }
      case Expr::K::Call: {
        ListT args;
        for (size_t k = 1; k < e.args.size(); ++k) args.push_back(eval(*e.args[k]));
        const Expr& fn = *e.args[0];
        if (fn.k == Expr::K::Attr) return method(eval(*fn.args[0]), fn.name, args);
        if (fn.k == Expr::K::Name) {
          if (fn.name == "raise_exception") error(fmt::format("the template raised: {}", args.empty() ? "" : to_str(args[0])));
          if (fn.name == "namespace") {
            DictT attrs;
            for (const auto& [k, a] : e.kwargs) dict_set(attrs, k, eval(*a));
            return Value::dict(std::move(attrs), /*is_namespace=*/true);
          }
          if (fn.name == "range") {
            int64_t lo = 0, hi = 0, step = 1;
            if (args.size() == 1) hi = as_int(args[0]);
            else if (args.size() >= 2) { lo = as_int(args[0]); hi = as_int(args[1]); if (args.size() > 2) step = as_int(args[2]); }
            if (step == 0) error("range() step is zero");
            // the count first, in unsigned arithmetic (no overflow), then the items
            uint64_t count = 0;
            if (step > 0 ? lo < hi : lo > hi) {
              const uint64_t span = step > 0 ? static_cast<uint64_t>(hi) - static_cast<uint64_t>(lo)
                                             : static_cast<uint64_t>(lo) - static_cast<uint64_t>(hi);
              const uint64_t astep = step > 0 ? static_cast<uint64_t>(step) : uint64_t{0} - static_cast<uint64_t>(step);
              count = (span - 1) / astep + 1;
            }
            if (count > kMaxListItems) error(fmt::format("range() of more than {} items", kMaxListItems));
            ListT l;
            l.reserve(count);
            for (uint64_t k = 0; k < count; ++k)  // lo + k * step is in range: wrap-free in two's complement
              l.push_back(Value::integer(static_cast<int64_t>(static_cast<uint64_t>(lo) + k * static_cast<uint64_t>(step))));
            return Value::list(std::move(l));
          }
        }
        error("unsupported function call");
      }
      case Expr::K::Filter: {
        ListT args;
        for (size_t k = 1; k < e.args.size(); ++k) args.push_back(eval(*e.args[k]));
        std::vector<std::pair<std::string, Value>> kw;
        for (const auto& [k, a] : e.kwargs) kw.emplace_back(k, eval(*a));
        return filter(e.name, eval(*e.args[0]), args, kw);
      }
      case Expr::K::Test: {
        Value a = eval(*e.args[0]);
        bool r;
        if (e.name == "defined") r = a.t != Value::T::Undefined;
        else if (e.name == "undefined") r = a.t == Value::T::Undefined;
        else if (e.name == "none") r = a.t == Value::T::None;
        else if (e.name == "string") r = a.t == Value::T::Str;
        else if (e.name == "number") r = a.t == Value::T::Int || a.t == Value::T::Float;
        else if (e.name == "mapping") r = a.t == Value::T::VDict;
        else if (e.name == "iterable" || e.name == "sequence") r = a.t == Value::T::VList || a.t == Value::T::Str || a.t == Value::T::VDict;
        else if (e.name == "true") r = a.t == Value::T::Bool && a.b;
        else if (e.name == "false") r = a.t == Value::T::Bool && !a.b;
        else if (e.name == "boolean") r = a.t == Value::T::Bool;
        else error(fmt::format("unknown test '{}'", e.name));
        return Value::boolean(e.negate ? !r : r);
      }
      case Expr::K::Unary: {
        if (e.name == "not") return Value::boolean(!truthy(eval(*e.args[0])));
        Value a = eval(*e.args[0]);
        if (!is_num(a)) error("unary '-' on a value that is not a number");
        if (a.t == Value::T::Float) return Value::real(-a.f);
        int64_t r = 0;
        if (__builtin_sub_overflow(int64_t{0}, as_int(a), &r)) overflow("-");
        return Value::integer(r);
      }
      case Expr::K::Cond:
        if (truthy(eval(*e.args[0]))) return eval(*e.args[1]);
        return e.args[2] ? eval(*e.args[2]) : Value{};
      case Expr::K::Binary: {
        const std::string& op = e.name;
        if (op == "and") { Value a = eval(*e.args[0]); return truthy(a) ? eval(*e.args[1]) : a; }
        if (op == "or") { Value a = eval(*e.args[0]); return truthy(a) ? a : eval(*e.args[1]); }
        Value a = eval(*e.args[0]), b = eval(*e.args[1]);
        if (op == "~") {
          std::string r = to_str(a);
          str_into(r, b);
          return Value::str(std::move(r));
        }
        if (op == "==") return Value::boolean(equal(a, b));
        if (op == "!=") return Value::boolean(!equal(a, b));
        if (op == "in") {
          if (b.t == Value::T::Str) {
            const std::string needle = to_str(a);
            return Value::boolean(Finder(needle).find(b.s) != std::string::npos);
          }
          if (b.t == Value::T::VList) { for (const Value& x : *b.l) if (equal(a, x)) return Value::boolean(true); return Value::boolean(false); }
          if (b.t == Value::T::VDict) return Value::boolean(a.t == Value::T::Str && dict_get(*b.d, a.s) != nullptr);
          return Value::boolean(false);
        }
        if (op == "+") {
          if (a.t == Value::T::Str && b.t == Value::T::Str) {
            check_string_size(a.s.size() + b.s.size());
            return Value::str(a.s + b.s);
          }
          if (a.t == Value::T::VList && b.t == Value::T::VList) {
            if (a.l->size() + b.l->size() > kMaxListItems) error(fmt::format("a list of more than {} items", kMaxListItems));
            ListT l = *a.l;
            l.insert(l.end(), b.l->begin(), b.l->end());
            return Value::list(std::move(l));
          }
        }
        if (op == "<" || op == ">" || op == "<=" || op == ">=") {
          int c;
          if (a.t == Value::T::Str && b.t == Value::T::Str) {
            work(std::min(a.s.size(), b.s.size()));
            c = a.s.compare(b.s) < 0 ? -1 : a.s.compare(b.s) > 0 ? 1 : 0;
          }
          else { double x = as_d(a), y = as_d(b); c = x < y ? -1 : x > y ? 1 : 0; }
          return Value::boolean(op == "<" ? c < 0 : op == ">" ? c > 0 : op == "<=" ? c <= 0 : c >= 0);
        }
        if (!is_num(a) || !is_num(b)) error(fmt::format("operator '{}' on values that are not numbers", op));
        const bool fl = a.t == Value::T::Float || b.t == Value::T::Float || op == "/";
        // integers are 64-bit here (Python's are unbounded): a result that does not fit is an error
        int64_t r = 0;
        if (op == "+") {
          if (fl) return Value::real(as_d(a) + as_d(b));
          if (__builtin_add_overflow(as_int(a), as_int(b), &r)) overflow(op);
          return Value::integer(r);
        }
        if (op == "-") {
          if (fl) return Value::real(as_d(a) - as_d(b));
          if (__builtin_sub_overflow(as_int(a), as_int(b), &r)) overflow(op);
          return Value::integer(r);
        }
        if (op == "*") {
          if (fl) return Value::real(as_d(a) * as_d(b));
          if (__builtin_mul_overflow(as_int(a), as_int(b), &r)) overflow(op);
          return Value::integer(r);
        }
        if (op == "**") return power(a, b);
        if (op == "/") { if (as_d(b) == 0) error("division by zero"); return Value::real(as_d(a) / as_d(b)); }
        if (op == "//" || op == "%") {
          if (fl) {
            double y = as_d(b);
            if (y == 0) error("division by zero");
            double q = std::floor(as_d(a) / y);
            return op == "//" ? Value::real(q) : Value::real(as_d(a) - q * y);
          }
          const int64_t x = as_int(a), y = as_int(b);
          if (y == 0) error("division by zero");
          if (y == -1) {  // x / -1 and x % -1 trap for INT64_MIN
            if (op == "%") return Value::integer(0);
            if (__builtin_sub_overflow(int64_t{0}, x, &r)) overflow(op);
            return Value::integer(r);
          }
          int64_t q = x / y, m = x % y;
          if (m != 0 && ((m < 0) != (y < 0))) {  // Python's floor division and modulo
            --q;
            m += y;
          }
          return op == "//" ? Value::integer(q) : Value::integer(m);
        }
        error(fmt::format("unknown operator '{}'", op));
      }
    }
    return {};
  }

  [[noreturn]] static void overflow(const std::string& op) {
    error(fmt::format("integer overflow in '{}' (kiln's templates have 64-bit integers)", op));
  }

  // a ** b as Python computes it (an int for ints with b >= 0, else a float), overflow an error
  static Value power(const Value& a, const Value& b) {
    if (a.t != Value::T::Float && b.t != Value::T::Float && as_int(b) >= 0) {
      int64_t base = as_int(a), e = as_int(b), r = 1;
      while (e > 0) {
        if ((e & 1) && __builtin_mul_overflow(r, base, &r)) overflow("**");
        e >>= 1;
        if (e > 0 && __builtin_mul_overflow(base, base, &base)) overflow("**");
      }
      return Value::integer(r);
    }
    const double x = as_d(a), y = as_d(b);
    if (x == 0 && y < 0) error("zero to a negative power");
    if (x < 0 && std::floor(y) != y) error("a negative number to a fractional power");
    const double r = std::pow(x, y);
    if (std::isinf(r) && std::isfinite(x) && std::isfinite(y)) error("'**' result out of range");
    return Value::real(r);
  }

  Scope& sc_;
};

}  // namespace

struct ChatTemplate::Impl {
  Body body;
};

ChatTemplate::ChatTemplate(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ChatTemplate::~ChatTemplate() = default;

std::unique_ptr<ChatTemplate> ChatTemplate::parse(const std::string& source, std::string* err) {
  try {
    if (source.size() > kMaxSourceBytes) error(fmt::format("the template is over {} MiB", kMaxSourceBytes >> 20));
    auto impl = std::make_unique<Impl>();
    impl->body = Builder(split(source)).parse_all();
    return std::unique_ptr<ChatTemplate>(new ChatTemplate(std::move(impl)));
  } catch (const std::bad_alloc&) {
    *err = "chat template: out of memory";
    return nullptr;
  } catch (const std::exception& e) {
    *err = fmt::format("chat template: {}", one_line(e.what()));
    return nullptr;
  }
}

bool ChatTemplate::render(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                          const std::map<std::string, std::string>& vars, std::string* out, std::string* err) const {
  int64_t work_left = kMaxWork;
  struct WorkScope {  // the budget counts while this render runs on this thread
    int64_t* saved;
    explicit WorkScope(int64_t* w) : saved(t_work) { t_work = w; }
    ~WorkScope() { t_work = saved; }
  } work_scope(&work_left);
  try {
    Scope sc;
    sc.frames.emplace_back();
    ListT msgs;
    for (const ChatMessage& m : messages) msgs.push_back(Value::dict({{"role", Value::str(m.role)}, {"content", Value::str(m.content)}}));
    sc.set("messages", Value::list(std::move(msgs)));
    sc.set("add_generation_prompt", Value::boolean(add_generation_prompt));
    for (const auto& [k, v] : vars) sc.set(k, Value::str(v));
    sc.frames.emplace_back();  // the template's own sets
    out->clear();
    Renderer(sc).run(impl_->body, *out);
    return true;
  } catch (const std::bad_alloc&) {
    *err = "chat template: out of memory";
  } catch (const std::exception& e) {
    *err = fmt::format("chat template: {}", one_line(e.what()));
  }
  out->clear();
  return false;
}

bool load_chat_config(const std::string& tokenizer_json, const std::string& template_path, ChatConfig* out,
                      std::string* err) {
  namespace fs = std::filesystem;
  // A whole file, if it is a regular file of at most `limit` bytes (else false and *err).
  auto slurp = [err](const fs::path& p, std::string* text, uintmax_t limit) {
    std::error_code ec;
    if (!fs::is_regular_file(p, ec)) {
      *err = fmt::format("{}: cannot open (not a file)", p.string());
      return false;
    }
    const uintmax_t size = fs::file_size(p, ec);
    if (ec || size > limit) {
      *err = ec ? fmt::format("{}: cannot read ({})", p.string(), ec.message())
                : fmt::format("{}: {} bytes; kiln reads at most {} MiB", p.string(), size, limit >> 20);
      return false;
    }
    std::ifstream in(p, std::ios::binary);
    if (!in) {
      *err = fmt::format("{}: cannot open", p.string());
      return false;
    }
    std::stringstream ss;
    ss << in.rdbuf();
    *text = ss.str();
    return true;
  };
  const fs::path dir = fs::path(tokenizer_json).parent_path();
  out->source.clear();
  out->vars.clear();
  std::error_code ec;
  const fs::path config = dir / "tokenizer_config.json";
  if (fs::is_regular_file(config, ec)) {
    std::string text;
    if (!slurp(config, &text, kMaxConfigBytes)) return false;
    nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
    if (j.is_discarded() || !j.is_object()) {
      *err = fmt::format("{}: not a JSON object", config.string());
      return false;
    }
    for (const char* k : {"bos_token", "eos_token", "pad_token", "unk_token"}) {
      if (!j.contains(k)) continue;
      const auto& v = j[k];
      if (v.is_string()) out->vars[k] = v.get<std::string>();
      else if (v.is_object() && v.contains("content") && v["content"].is_string()) out->vars[k] = v["content"].get<std::string>();
    }
    if (j.contains("chat_template") && j["chat_template"].is_string()) out->source = j["chat_template"].get<std::string>();
  }
  if (!template_path.empty()) {
    if (!slurp(template_path, &out->source, kMaxSourceBytes)) return false;
  } else if (fs::is_regular_file(dir / "chat_template.jinja", ec)) {
    if (!slurp(dir / "chat_template.jinja", &out->source, kMaxSourceBytes)) return false;
  }
  if (out->source.empty()) {
    *err = fmt::format("no chat template beside {} (chat_template.jinja or tokenizer_config.json's chat_template); "
                       "give one with --chat-template", tokenizer_json);
    return false;
  }
  return true;
}

}  // namespace kiln::tok
