// The chat templates' Jinja engine (see jinja.h): the work budget, values and their printing.
#include "jinja.h"

#include <cmath>

namespace kiln::tok::jinja {

[[noreturn]] void error(const std::string& what) { throw std::runtime_error(what); }

thread_local int64_t* t_work = nullptr;

void work(size_t bytes) {
  if (t_work != nullptr && (*t_work -= 1 + static_cast<int64_t>(bytes / 64)) < 0)
    error(fmt::format("rendering takes more than {} steps (a loop that does not end?)", kMaxWork));
}

void check_string_size(size_t n) {
  if (n > kMaxStringBytes) error(fmt::format("a string longer than {} MiB", kMaxStringBytes >> 20));
}

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
void str_into(std::string& out, const Value& v, int depth) {  // {{ v }} and |string
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

void json_into(std::string& out, const Value& v, int indent, int depth) {
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
  // a list or a dict: its n items (item(k) writes item k) between open and close, one a line
  auto items = [&](size_t n, const char* empty, const char* open, const char* close, auto&& item) {
    if (n == 0) return append(out, empty);
    append(out, open);
    for (size_t k = 0; k < n; ++k) {
      if (k) append(out, sep);
      nl(depth + 1);
      item(k);
    }
    nl(depth);
    append(out, close);
  };
  switch (v.t) {
    case Value::T::Undefined: case Value::T::None: return append(out, "null");
    case Value::T::Bool: return append(out, v.b ? "true" : "false");
    case Value::T::Int: return append(out, std::to_string(v.i));
    case Value::T::Float: return append(out, fmt::format("{}", v.f));
    case Value::T::Str: return json_string(out, v.s);
    case Value::T::VList:
      return items(v.l->size(), "[]", "[", "]", [&](size_t k) { json_into(out, (*v.l)[k], indent, depth + 1); });
    case Value::T::VDict:
      return items(v.d->size(), "{}", "{", "}", [&](size_t k) {
        json_string(out, (*v.d)[k].first);
        append(out, ": ");
        json_into(out, (*v.d)[k].second, indent, depth + 1);
      });
  }
}

bool equal(const Value& a, const Value& b, int depth) {
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

}  // namespace kiln::tok::jinja
