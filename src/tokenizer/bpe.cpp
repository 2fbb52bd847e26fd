// Bytes and UTF-8 (GPT-2's byte map, "<0xAB>" tokens) and BPE's merge loop (see tokenizer_impl.h).
#include "tokenizer_impl.h"

#include <algorithm>
#include <queue>

namespace kiln::tok {
namespace hf {

namespace {

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

}  // namespace

// Length of the UTF-8 character starting with byte c (1 for a stray byte).
size_t utf8_len(unsigned char c) {
  if (c < 0x80) return 1;
  if ((c >> 5) == 0x6) return 2;
  if ((c >> 4) == 0xE) return 3;
  if ((c >> 3) == 0x1E) return 4;
  return 1;
}

ByteMap::ByteMap() {
  uint32_t next = 256;
  for (uint32_t b = 0; b < 256; ++b) {
    const bool keep = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
    std::string s;
    append_utf8(s, keep ? b : next++);
    to_char[b] = s;
    to_byte[s] = static_cast<uint8_t>(b);
  }
}

const ByteMap& byte_map() {
  static const ByteMap m;
  return m;
}

// "<0xAB>" -> 0xAB; -1 for any other token.
int byte_token(std::string_view t) {
  if (t.size() != 6 || t.substr(0, 3) != "<0x" || t[5] != '>') return -1;
  int v = 0;
  for (char c : t.substr(3, 2)) {
    v *= 16;
    if (c >= '0' && c <= '9') v += c - '0';
    else if (c >= 'A' && c <= 'F') v += c - 'A' + 10;
    else if (c >= 'a' && c <= 'f') v += c - 'a' + 10;
    else return -1;
  }
  return v;
}

bool valid_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    uint32_t cp = n == 1 ? c : n == 2 ? (c & 0x1F) : n == 3 ? (c & 0x0F) : (c & 0x07);
    for (size_t k = 1; k < n; ++k) {
      const auto d = static_cast<unsigned char>(s[i + k]);
      if ((d & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (d & 0x3F);
    }
    const uint32_t min = n == 1 ? 0 : n == 2 ? 0x80 : n == 3 ? 0x800 : 0x10000;
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += n;
  }
  return true;
}

}  // namespace hf

using namespace hf;

// A byte-level token's bytes (GPT-2's byte map undone).
std::string Tokenizer::Impl::unmap_bytes(const std::string& t) {
  std::string out;
  for (size_t i = 0; i < t.size();) {
    const size_t n = std::min(utf8_len(static_cast<unsigned char>(t[i])), t.size() - i);
    auto it = byte_map().to_byte.find(t.substr(i, n));
    if (it != byte_map().to_byte.end()) out += static_cast<char>(it->second);
    else out += t.substr(i, n);
    i += n;
  }
  return out;
}

void Tokenizer::Impl::bpe(const std::string& piece, std::vector<int32_t>* ids) const {
  if (ignore_merges)
    if (auto it = vocab.find(piece); it != vocab.end()) {
      ids->push_back(it->second);
      return;
    }
  struct Sym {
    int32_t id, prev, next;  // prev/next: neighbours' indices, -1 at the ends
    bool alive;
  };
  std::vector<Sym> sym;
  sym.reserve(piece.size());
  std::string ch;
  bool unknown = false;  // the last symbol stands for characters not in the vocabulary
  for (size_t i = 0; i < piece.size();) {
    size_t n = std::min(utf8_len(static_cast<unsigned char>(piece[i])), piece.size() - i);
    ch.assign(piece, i, n);
    i += n;
    if (auto it = vocab.find(ch); it != vocab.end()) {
      sym.push_back({it->second, 0, 0, true});
      unknown = false;
    } else if (byte_fallback && std::all_of(ch.begin(), ch.end(), [&](char c) { return byte_ids[static_cast<uint8_t>(c)] >= 0; })) {
      for (char c : ch) sym.push_back({byte_ids[static_cast<uint8_t>(c)], 0, 0, true});  // "<0xAB>" tokens
    } else if (unk && !(fuse_unk && unknown)) {
      sym.push_back({*unk, 0, 0, true});
      unknown = true;
    }
  }
  const auto n = static_cast<int32_t>(sym.size());
  for (int32_t i = 0; i < n; ++i) {
    sym[static_cast<size_t>(i)].prev = i - 1;
    sym[static_cast<size_t>(i)].next = i + 1 < n ? i + 1 : -1;
  }
  struct Cand {
    int32_t rank, pos;  // merge the symbol at pos with its next
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Cand, std::vector<Cand>, std::greater<>> heap;
  auto consider = [&](int32_t pos) {
    const int32_t nx = sym[static_cast<size_t>(pos)].next;
    if (nx < 0) return;
    if (auto it = merges.find(pair_key(sym[static_cast<size_t>(pos)].id, sym[static_cast<size_t>(nx)].id)); it != merges.end())
      heap.push({it->second.rank, pos});
  };
  for (int32_t i = 0; i + 1 < n; ++i) consider(i);
  while (!heap.empty()) {
    const Cand c = heap.top();
    heap.pop();
    Sym& a = sym[static_cast<size_t>(c.pos)];
    if (!a.alive || a.next < 0) continue;
    Sym& b = sym[static_cast<size_t>(a.next)];
    auto it = merges.find(pair_key(a.id, b.id));
    if (it == merges.end() || it->second.rank != c.rank) continue;  // stale
    a.id = it->second.id;
    b.alive = false;
    a.next = b.next;
    if (b.next >= 0) sym[static_cast<size_t>(b.next)].prev = c.pos;
    if (a.prev >= 0) consider(a.prev);
    consider(c.pos);
  }
  for (const Sym& s : sym)
    if (s.alive) ids->push_back(s.id);
}

}  // namespace kiln::tok
