// A reader for the Python pickles torch.save writes (protocol 2-5), enough to
// read a tensor subclass's inner tensors out of a .pt2 (kiln/pt2/subclass.h).
// It builds a tree of values; it calls nothing: a global is a name, a REDUCE
// is a call record, a persistent id is the record torch.save gives a storage.
//
// Own code: no Debian package reads pickles outside Python (libtorch, which
// does, is what kiln may not link).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace kiln::pt2::pickle {

struct Value;
using ValuePtr = std::shared_ptr<Value>;

struct Value {
  enum class Kind : uint8_t { None, Bool, Int, Float, String, Bytes, Tuple, List, Dict, Global, Call, PersistentId, Built };
  Kind kind = Kind::None;
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;                 // String, Bytes; Global: "module.name"
  std::vector<ValuePtr> items;   // Tuple, List; Call: {callable, args}; PersistentId: {pid}; Built: {object, state}
  std::vector<std::pair<ValuePtr, ValuePtr>> entries;  // Dict

  bool is(Kind k) const { return kind == k; }
  bool is_global(std::string_view name) const { return kind == Kind::Global && s == name; }
  // Dict lookup by string key; null when absent or not a dict.
  const Value* get(std::string_view key) const;
};

// Parses `data`; throws kiln::Error ("pickle: ...") on an unknown opcode or malformed data.
ValuePtr load(std::span<const std::byte> data);

}  // namespace kiln::pt2::pickle
