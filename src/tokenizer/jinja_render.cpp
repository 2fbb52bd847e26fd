// The chat templates' Jinja engine (see jinja.h): evaluation, the tree rendered into text.
#include "jinja.h"

#include <array>
#include <cmath>
#include <functional>

namespace kiln::tok::jinja {
namespace {

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

// ---------------------------------------------------------------- evaluation

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

void render(const Body& b, Scope& sc, std::string& out) { Renderer(sc).run(b, out); }

}  // namespace kiln::tok::jinja
