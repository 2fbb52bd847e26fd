#include "pickle.h"

#include "kiln/core/error.h"

#include <cstring>

namespace kiln::pt2::pickle {

const Value* Value::get(std::string_view key) const {
  if (kind != Kind::Dict) return nullptr;
  for (const auto& [k, v] : entries)
    if (k && k->kind == Kind::String && k->s == key) return v.get();
  return nullptr;
}

namespace {

class Machine {
 public:
  explicit Machine(std::span<const std::byte> data) : p_(reinterpret_cast<const uint8_t*>(data.data())), n_(data.size()) {}

  ValuePtr run() {
    for (;;) {
      const uint8_t op = u8();
      switch (op) {
        case 0x80: u8(); break;                               // PROTO
        case 0x95: skip(8); break;                            // FRAME
        case '.': return pop();                               // STOP
        case '(': marks_.push_back(stack_.size()); break;     // MARK
        case 'N': push(make(Value::Kind::None)); break;
        case 0x88: push(boolean(true)); break;                // NEWTRUE
        case 0x89: push(boolean(false)); break;               // NEWFALSE
        case 'K': push(integer(u8())); break;                 // BININT1
        case 'M': push(integer(uint_le(2))); break;           // BININT2
        case 'J': push(integer(static_cast<int32_t>(uint_le(4)))); break;  // BININT
        case 0x8a: push(integer(long_le(u8()))); break;       // LONG1
        case 'G': push(real(be_double())); break;             // BINFLOAT
        case 'X': push(text(uint_le(4))); break;              // BINUNICODE
        case 0x8c: push(text(u8())); break;                   // SHORT_BINUNICODE
        case 0x8d: push(text(uint_le(8))); break;             // BINUNICODE8
        case 'T': push(text(uint_le(4), Value::Kind::Bytes)); break;  // BINSTRING
        case 'U': push(text(u8(), Value::Kind::Bytes)); break;        // SHORT_BINSTRING
        case 'B': push(text(uint_le(4), Value::Kind::Bytes)); break;  // BINBYTES
        case 'C': push(text(u8(), Value::Kind::Bytes)); break;        // SHORT_BINBYTES
        case 0x8e: push(text(uint_le(8), Value::Kind::Bytes)); break; // BINBYTES8
        case ')': push(make(Value::Kind::Tuple)); break;      // EMPTY_TUPLE
        case ']': push(make(Value::Kind::List)); break;       // EMPTY_LIST
        case '}': push(make(Value::Kind::Dict)); break;       // EMPTY_DICT
        case 0x85: tuple_of(1); break;                        // TUPLE1
        case 0x86: tuple_of(2); break;                        // TUPLE2
        case 0x87: tuple_of(3); break;                        // TUPLE3
        case 't': {                                           // TUPLE
          auto v = make(Value::Kind::Tuple);
          v->items = take_to_mark();
          push(v);
          break;
        }
        case 'l': {                                           // LIST
          auto v = make(Value::Kind::List);
          v->items = take_to_mark();
          push(v);
          break;
        }
        case 'a': {                                           // APPEND
          auto x = pop();
          container(Value::Kind::List)->items.push_back(x);
          break;
        }
        case 'e': {                                           // APPENDS
          auto xs = take_to_mark();
          auto& l = container(Value::Kind::List)->items;
          l.insert(l.end(), xs.begin(), xs.end());
          break;
        }
        case 's': {                                           // SETITEM
          auto v = pop(), k = pop();
          container(Value::Kind::Dict)->entries.emplace_back(k, v);
          break;
        }
        case 'u': {                                           // SETITEMS
          auto xs = take_to_mark();
          if (xs.size() % 2) bad("SETITEMS with an odd number of items");
          auto d = container(Value::Kind::Dict);
          for (size_t j = 0; j < xs.size(); j += 2) d->entries.emplace_back(xs[j], xs[j + 1]);
          break;
        }
        case 'c': {                                           // GLOBAL "module\nname\n"
          std::string module = line(), name = line();
          push(global(module + "." + name));
          break;
        }
        case 0x93: {                                          // STACK_GLOBAL
          auto name = pop(), module = pop();
          if (!name->is(Value::Kind::String) || !module->is(Value::Kind::String)) bad("STACK_GLOBAL of non-strings");
          push(global(module->s + "." + name->s));
          break;
        }
        case 'R': pair_of(Value::Kind::Call); break;          // REDUCE: fn, args
        case 0x81: pair_of(Value::Kind::Call); break;         // NEWOBJ: cls.__new__(cls, *args): cls, args
        case 'b': pair_of(Value::Kind::Built); break;         // BUILD: obj, state
        case 'Q': {                                           // BINPERSID
          auto pid = pop();
          auto v = make(Value::Kind::PersistentId);
          v->items = {pid};
          push(v);
          break;
        }
        case 'q': memo_put(u8()); break;                      // BINPUT
        case 'r': memo_put(uint_le(4)); break;                // LONG_BINPUT
        case 0x94: memo_put(memo_.size()); break;             // MEMOIZE
        case 'h': memo_get(u8()); break;                      // BINGET
        case 'j': memo_get(uint_le(4)); break;                // LONG_BINGET
        case '0': pop(); break;                               // POP
        case '2': push(top()); break;                         // DUP
        default: bad(fmt::format("unsupported opcode 0x{:02x}", op));
      }
    }
  }

 private:
  [[noreturn]] void bad(const std::string& what) const { fail("pickle: {} at byte {}", what, pos_); }
  uint8_t u8() {
    if (pos_ >= n_) bad("truncated");
    return p_[pos_++];
  }
  void skip(size_t k) {
    if (n_ - pos_ < k) bad("truncated");
    pos_ += k;
  }
  uint64_t uint_le(int bytes) {
    uint64_t v = 0;
    for (int j = 0; j < bytes; ++j) v |= static_cast<uint64_t>(u8()) << (8 * j);
    return v;
  }
  int64_t long_le(int bytes) {  // two's complement, little endian
    if (bytes > 8) bad("integer wider than 64 bits");
    if (bytes == 0) return 0;
    uint64_t v = uint_le(bytes);
    if (bytes < 8 && (v >> (8 * bytes - 1)) & 1) v |= ~uint64_t{0} << (8 * bytes);
    return static_cast<int64_t>(v);
  }
  double be_double() {
    uint64_t v = 0;
    for (int j = 0; j < 8; ++j) v = (v << 8) | u8();
    double d;
    std::memcpy(&d, &v, 8);
    return d;
  }
  std::string line() {
    std::string s;
    for (uint8_t c = u8(); c != '\n'; c = u8()) s.push_back(static_cast<char>(c));
    return s;
  }
  static ValuePtr make(Value::Kind k) {
    auto v = std::make_shared<Value>();
    v->kind = k;
    return v;
  }
  // A value of kind k whose one field `field` is x.
  template <class F, class T>
  static ValuePtr make(Value::Kind k, F Value::*field, T x) {
    auto v = make(k);
    (*v).*field = std::move(x);
    return v;
  }
  static ValuePtr boolean(bool b) { return make(Value::Kind::Bool, &Value::b, b); }
  static ValuePtr integer(int64_t i) { return make(Value::Kind::Int, &Value::i, i); }
  static ValuePtr real(double f) { return make(Value::Kind::Float, &Value::f, f); }
  static ValuePtr global(std::string name) { return make(Value::Kind::Global, &Value::s, std::move(name)); }
  ValuePtr text(uint64_t len, Value::Kind k = Value::Kind::String) {
    if (n_ - pos_ < len) bad("truncated string");
    auto v = make(k);
    v->s.assign(reinterpret_cast<const char*>(p_ + pos_), static_cast<size_t>(len));
    pos_ += static_cast<size_t>(len);
    return v;
  }
  void push(ValuePtr v) { stack_.push_back(std::move(v)); }
  ValuePtr pop() {
    if (stack_.empty() || (!marks_.empty() && stack_.size() <= marks_.back())) bad("stack underflow");
    auto v = std::move(stack_.back());
    stack_.pop_back();
    return v;
  }
  const ValuePtr& top() const {
    if (stack_.empty()) bad("stack underflow");
    return stack_.back();
  }
  std::vector<ValuePtr> take_to_mark() {
    if (marks_.empty()) bad("no MARK");
    const size_t m = marks_.back();
    marks_.pop_back();
    std::vector<ValuePtr> xs(stack_.begin() + static_cast<std::ptrdiff_t>(m), stack_.end());
    stack_.resize(m);
    return xs;
  }
  void tuple_of(size_t k) {
    if (stack_.size() < k) bad("stack underflow");
    auto v = make(Value::Kind::Tuple);
    v->items.assign(stack_.end() - static_cast<std::ptrdiff_t>(k), stack_.end());
    stack_.resize(stack_.size() - k);
    push(v);
  }
  // The top two items (the one below first) as a `k` in their place.
  void pair_of(Value::Kind k) {
    auto second = pop(), first = pop();
    auto v = make(k);
    v->items = {first, second};
    push(v);
  }
  Value* container(Value::Kind k) {
    const auto& c = top();
    if (!c->is(k)) bad(k == Value::Kind::List ? "APPEND to a non-list" : "SETITEM on a non-dict");
    return c.get();
  }
  void memo_put(uint64_t idx) {
    if (idx > (uint64_t{1} << 24)) bad("memo index out of range");
    if (memo_.size() <= idx) memo_.resize(static_cast<size_t>(idx) + 1);
    memo_[static_cast<size_t>(idx)] = top();
  }
  void memo_get(uint64_t idx) {
    if (idx >= memo_.size() || !memo_[static_cast<size_t>(idx)]) bad("memo entry missing");
    push(memo_[static_cast<size_t>(idx)]);
  }

  const uint8_t* p_;
  size_t n_;
  size_t pos_ = 0;
  std::vector<ValuePtr> stack_;
  std::vector<size_t> marks_;
  std::vector<ValuePtr> memo_;
};

}  // namespace

ValuePtr load(std::span<const std::byte> data) { return Machine(data).run(); }

}  // namespace kiln::pt2::pickle
