// Internal to the tokenizer library: the chat templates' small Jinja engine (see chat_template.h
// for the subset). Templates are parsed once into a tree and rendered with reference-counted
// values; errors are exceptions inside the engine, one-line messages outside (chat_template.cpp).
//   jinja_value.cpp   the limits' work budget, values and their printing (str, repr, tojson), ==
//   jinja_parse.cpp   lexing, expressions, statements: the template as a tree
//   jinja_render.cpp  evaluation: the tree rendered into text
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kiln::tok::jinja {

// ---------------------------------------------------------------- limits
//
// A chat template comes with the model: it is untrusted input, and a template
// can loop, recurse and grow values. Rendering is bounded by these limits (an
// error with one line when one is passed, never a crash or a hang); real
// templates stay orders of magnitude below every one of them.
inline constexpr size_t kMaxSourceBytes = size_t{1} << 20;  // the template's text
inline constexpr int kMaxExprDepth = 100;                   // an expression's tree: parentheses, operators, filters
inline constexpr int kMaxBlockDepth = 100;                  // if / for / generation blocks inside each other
inline constexpr int kMaxValueDepth = 100;                  // lists and dicts inside each other
inline constexpr size_t kMaxStringBytes = size_t{16} << 20;  // any string value, and the rendered text
inline constexpr size_t kMaxListItems = size_t{1} << 20;    // any list (range(), +, split, a loop's items)
inline constexpr int kMaxJsonIndent = 64;                   // tojson(indent=N)
inline constexpr uintmax_t kMaxConfigBytes = uintmax_t{64} << 20;  // tokenizer_config.json
// The work one render may do, in units: one evaluation step, one value copied,
// one loop iteration or list item made, 64 bytes of string made, copied or
// compared. Ten million units is about a second; a chat template with a
// thousand messages uses well under a million.
#ifdef KILN_FUZZ_SMALL_WORK
// The libFuzzer build (scripts/fuzz): the same checks on a two-thousandth of the work, so that a template that
// loops until the budget stops it costs the fuzzer a few milliseconds of its instrumented code, not seconds (its
// rate fell from ~4,000 to ~200 inputs a second as the corpus filled with such templates: at 100,000 units the
// top 1% of the corpus, each render running to the budget, took half of its time). The fuzz target's
// conversations need at most 841 units with the real templates of its seeds (Gemma, Llama 3, Qwen, the kitchen sink).
inline constexpr int64_t kMaxWork = 5'000;
#else
inline constexpr int64_t kMaxWork = 10'000'000;
#endif

[[noreturn]] void error(const std::string& what);

// The current render's remaining work (null outside render(): parsing is bounded by the source's size).
extern thread_local int64_t* t_work;

// Charges the current render one unit of work and `bytes` bytes (see kMaxWork).
void work(size_t bytes = 0);
void check_string_size(size_t n);

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

// ---------------------------------------------------------------- values (jinja_value.cpp)

// Walks over a value's items stop at this depth (see Value: a namespace's
// recorded depth may be short of the true one by less than kMaxValueDepth).
void check_walk_depth(int depth);
const Value* dict_get(const DictT& d, const std::string& k);
void dict_set(DictT& d, const std::string& k, Value v);
bool truthy(const Value& v);
// Text being built: every append is charged and the size checked.
void append(std::string& out, std::string_view piece);
// {{ v }} and |string
void str_into(std::string& out, const Value& v, int depth = 0);
std::string to_str(const Value& v);
// tojson (json.dumps(ensure_ascii=False)); indent < 0: on one line
void json_into(std::string& out, const Value& v, int indent, int depth = 0);
// Jinja's == (numbers across int, float and bool; lists and dicts item by item)
bool equal(const Value& a, const Value& b, int depth = 0);

// ---------------------------------------------------------------- the tree (jinja_parse.cpp)

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

// The template `src` as a tree.
Body parse_template(const std::string& src);

// ---------------------------------------------------------------- evaluation (jinja_render.cpp)

struct Scope {
  std::vector<std::map<std::string, Value>> frames;
  Value get(const std::string& n) const {
    for (auto it = frames.rbegin(); it != frames.rend(); ++it)
      if (auto f = it->find(n); f != it->end()) return f->second;
    return {};
  }
  void set(const std::string& n, Value v) { frames.back()[n] = std::move(v); }
};

// `b` rendered into `out` with the variables of `sc`.
void render(const Body& b, Scope& sc, std::string& out);

}  // namespace kiln::tok::jinja
