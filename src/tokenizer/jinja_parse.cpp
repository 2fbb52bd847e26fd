// The chat templates' Jinja engine (see jinja.h): lexing, expressions and statements into a tree.
#include "jinja.h"

#include <charconv>

namespace kiln::tok::jinja {
namespace {

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
  static std::shared_ptr<Stmt> stmt(Stmt::K k) {
    auto s = std::make_shared<Stmt>();
    s->k = k;
    return s;
  }
  // A name, then more after each `sep`, `most` names at the most (a for loop's targets, a set's).
  static std::vector<std::string> names(Parser& p, const char* sep, size_t most) {
    std::vector<std::string> v{p.name()};
    while (v.size() < most && p.accept(sep)) v.push_back(p.name());
    return v;
  }
  // Parses statements until one of `ends` (its keyword returned in *stop with its parser).
  Body body(const std::vector<std::string>& ends, std::string* stop, std::unique_ptr<Parser>* stop_parser = nullptr) {
    DepthGuard guard(depth_, kMaxBlockDepth, "blocks ({% if %}, {% for %})");
    Body out;
    while (i_ < p_.size()) {
      const Piece& pc = p_[i_++];
      if (pc.k == Piece::K::Text) {
        auto s = stmt(Stmt::K::Text); s->text = pc.s; out.push_back(s);
        continue;
      }
      auto parser = std::make_unique<Parser>(lex_expr(pc.s));
      if (pc.k == Piece::K::Expr) {
        auto s = stmt(Stmt::K::Out); s->e = parser->expr();
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
        auto s = stmt(Stmt::K::If);
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
        auto s = stmt(Stmt::K::For);
        s->vars = names(*parser, ",", SIZE_MAX);
        parser->expect("in");
        s->e = parser->expr();  // a trailing `if cond` parses as a conditional expression: undo that
        if (s->e->k == Expr::K::Cond && s->e->args[2] == nullptr) { s->filter = s->e->args[0]; s->e = s->e->args[1]; }
        std::string st;
        s->body = body({"else", "endfor"}, &st);
        if (st == "else") { std::string st2; s->else_body = body({"endfor"}, &st2); st = st2; }
        if (st != "endfor") error("missing '{% endfor %}'");
        out.push_back(s);
      } else if (kw == "set") {
        auto s = stmt(Stmt::K::Set);
        s->vars = names(*parser, ".", 2);  // a name, or {namespace, attribute}
        parser->expect("=");
        s->e = parser->expr();
        out.push_back(s);
      } else if (kw == "generation") {
        auto s = stmt(Stmt::K::Block);
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

}  // namespace

Body parse_template(const std::string& src) { return Builder(split(src)).parse_all(); }

}  // namespace kiln::tok::jinja
