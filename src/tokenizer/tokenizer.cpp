// BPE from a Hugging Face tokenizer.json, byte-level or SentencePiece-style (see tokenizer.h).
#include "kiln/tokenizer/tokenizer.h"

#include "one_line.h"
#include "sentencepiece.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <filesystem>
#include <fstream>
#include <limits>
#include <queue>
#include <unordered_map>

namespace kiln::tok {
namespace {

using nlohmann::json;

// Limits on a tokenizer.json (untrusted input: it comes with the model). Real
// files are far inside every one: the largest vocabularies have 262,144 ids,
// pre-tokenizers nest two deep, added tokens are tens of bytes.
constexpr int64_t kMaxVocab = int64_t{1} << 21;        // token ids are in [0, kMaxVocab)
constexpr int kMaxJsonDepth = 64;                      // arrays and objects inside each other
constexpr int kMaxStepDepth = 8;                       // Sequence pre-tokenizers inside each other
constexpr size_t kMaxAddedTokenBytes = 1024;           // an added token's content
constexpr uintmax_t kMaxFileBytes = uintmax_t{1} << 30;  // the file
constexpr uint32_t kMaxRegexMatchSteps = 10'000'000;   // PCRE2's match limit for one match of a pre-tokenizer regex

[[noreturn]] void fail(const std::string& what) { throw std::runtime_error(what); }

// JSON helpers that say what is wrong (nlohmann's own messages do not say where).
const json& member(const json& obj, const char* key, const char* where) {
  if (!obj.is_object()) fail(fmt::format("{} is not a JSON object", where));
  auto it = obj.find(key);
  if (it == obj.end()) fail(fmt::format("{} has no '{}'", where, key));
  return *it;
}
std::string string_of(const json& v, const char* what) {
  if (!v.is_string()) fail(fmt::format("{} is not a string", what));
  return v.get<std::string>();
}
bool flag(const json& obj, const char* key, bool dflt, const char* where) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return dflt;
  if (!it->is_boolean()) fail(fmt::format("{}'s '{}' is not true or false", where, key));
  return it->get<bool>();
}
// A token id: an integer in [0, kMaxVocab).
int32_t token_id(const json& v, const std::string& what) {
  bool ok = false;
  int64_t id = -1;
  if (v.is_number_unsigned()) {
    ok = v.get<uint64_t>() < static_cast<uint64_t>(kMaxVocab);
    if (ok) id = static_cast<int64_t>(v.get<uint64_t>());
  } else if (v.is_number_integer()) {
    id = v.get<int64_t>();
    ok = id >= 0 && id < kMaxVocab;
  }
  if (!ok) fail(fmt::format("{}: id {} is not a token id (an integer in 0 .. {})", what, v.dump().substr(0, 40), kMaxVocab - 1));
  return static_cast<int32_t>(id);
}

// GPT-2's pre-tokenizer pattern (ByteLevel with use_regex).
constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

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

// Length of the UTF-8 character starting with byte c (1 for a stray byte).
size_t utf8_len(unsigned char c) {
  if (c < 0x80) return 1;
  if ((c >> 5) == 0x6) return 2;
  if ((c >> 4) == 0xE) return 3;
  if ((c >> 3) == 0x1E) return 4;
  return 1;
}

// GPT-2's reversible byte -> printable character map: printable Latin-1 bytes
// stand for themselves, the other 68 become U+0100.. in byte order.
struct ByteMap {
  std::array<std::string, 256> to_char;
  std::unordered_map<std::string, uint8_t> to_byte;
  ByteMap() {
    uint32_t next = 256;
    for (uint32_t b = 0; b < 256; ++b) {
      const bool keep = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
      std::string s;
      append_utf8(s, keep ? b : next++);
      to_char[b] = s;
      to_byte[s] = static_cast<uint8_t>(b);
    }
  }
};

const ByteMap& byte_map() {
  static const ByteMap m;
  return m;
}

struct Regex {
  pcre2_code* code = nullptr;
  pcre2_match_context* mctx = nullptr;
  explicit Regex(const std::string& pattern) {
    int err = 0;
    PCRE2_SIZE off = 0;
    code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), PCRE2_UTF | PCRE2_UCP, &err, &off,
                         nullptr);
    if (code == nullptr) {
      std::array<PCRE2_UCHAR, 256> buf{};
      pcre2_get_error_message(err, buf.data(), buf.size());
      throw std::runtime_error(fmt::format("pre-tokenizer regex does not compile at offset {}: {}", off,
                                           reinterpret_cast<const char*>(buf.data())));
    }
    pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // optional: falls back to the interpreter
    mctx = pcre2_match_context_create(nullptr);
    if (mctx == nullptr) throw std::bad_alloc();
    pcre2_set_match_limit(mctx, kMaxRegexMatchSteps);
  }
  ~Regex() {
    pcre2_match_context_free(mctx);
    pcre2_code_free(code);
  }
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // [begin, end) of each match in s, in order.
  std::vector<std::pair<size_t, size_t>> matches(std::string_view s) const {
    std::vector<std::pair<size_t, size_t>> out;
    pcre2_match_data* md = pcre2_match_data_create_from_pattern(code, nullptr);
    if (md == nullptr) throw std::bad_alloc();
    size_t at = 0;
    while (at <= s.size()) {
      // the text was checked as UTF-8 once: no re-check per match
      int rc = pcre2_match(code, reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), at, PCRE2_NO_UTF_CHECK, md, mctx);
      if (rc == PCRE2_ERROR_NOMATCH) break;
      if (rc < 0) {  // the match limit, or memory: an error, not a silently shorter split
        pcre2_match_data_free(md);
        std::array<PCRE2_UCHAR, 256> buf{};
        pcre2_get_error_message(rc, buf.data(), buf.size());
        fail(fmt::format("the pre-tokenizer's regex fails on this text: {}", reinterpret_cast<const char*>(buf.data())));
      }
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
      size_t b = ov[0], e = ov[1];
      if (e == b) {  // an empty match: step one character
        if (b >= s.size()) break;
        at = b + utf8_len(static_cast<unsigned char>(s[b]));
        continue;
      }
      out.emplace_back(b, e);
      at = e;
    }
    pcre2_match_data_free(md);
    return out;
  }
};

// What a Split keeps of the text around and in its matches (the tokenizers package's names).
enum class Behavior { Isolated, Removed, MergedWithPrevious, MergedWithNext, Contiguous };

struct Step {  // one pre-tokenizer step
  enum class Kind { Split, ByteLevel, Metaspace } kind = Kind::Split;
  std::shared_ptr<Regex> regex;  // Split, or ByteLevel with use_regex
  Behavior behavior = Behavior::Isolated;  // Split
  bool prefix_space = false;     // ByteLevel add_prefix_space
  std::string replacement;       // Metaspace: the character standing for a space (U+2581)
  enum class Prepend { Always, First, Never } prepend = Prepend::Always;  // Metaspace
  bool split = true;             // Metaspace: split before each replacement character
};

// Pieces of `piece` cut at `matches` ([begin, end) in order), kept as `behavior` says.
std::vector<std::string> split_pieces(const std::string& piece, const std::vector<std::pair<size_t, size_t>>& matches,
                                      Behavior behavior) {
  std::vector<std::string> out;
  size_t at = 0;
  std::string pending;  // MergedWithNext: a match waiting for the text after it
  bool last_was_match = false;
  for (auto [b, e] : matches) {
    const std::string gap = piece.substr(at, b - at), m = piece.substr(b, e - b);
    switch (behavior) {
      case Behavior::Removed:
        if (!gap.empty()) out.push_back(gap);
        break;
      case Behavior::Isolated:
        if (!gap.empty()) out.push_back(gap);
        out.push_back(m);
        break;
      case Behavior::Contiguous:
        if (!gap.empty()) out.push_back(gap);
        if (gap.empty() && last_was_match && !out.empty()) out.back() += m;
        else out.push_back(m);
        break;
      case Behavior::MergedWithPrevious:
        if (!gap.empty() || out.empty() || last_was_match) out.push_back(gap + m);
        else out.back() += m;
        break;
      case Behavior::MergedWithNext:
        if (!gap.empty() || !pending.empty()) out.push_back(pending + gap);
        pending = m;
        break;
    }
    last_was_match = true;
    at = e;
  }
  std::string rest = piece.substr(at);
  if (behavior == Behavior::MergedWithNext) rest = pending + rest;
  if (!rest.empty()) out.push_back(std::move(rest));
  return out;
}

// One normalizer (a Sequence flattened): applied to the text between added tokens.
struct Normalizer {
  enum class Kind { Replace, Prepend } kind;
  std::shared_ptr<Regex> regex;  // Replace: the pattern (a literal string escaped)
  std::string content;           // Replace: the replacement; Prepend: what is put in front
};

// One decoder (a Sequence flattened), the tokenizers package's decode_chain.
struct Decoder {
  enum class Kind { ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace } kind = Kind::Fuse;
  std::string pattern, content;  // Replace: literal pattern -> content; Strip: the character; Metaspace: replacement
  size_t start = 0, stop = 0;    // Strip: how many of `content` at most at the start and the end
  bool prepend_first = true;     // Metaspace: the first token's replacement characters are dropped
};

std::string escape_regex(std::string_view literal) {
  std::string re;
  for (char c : literal) {
    if (std::string_view("\\^$.|?*+()[]{}").find(c) != std::string_view::npos) re += '\\';
    re += c;
  }
  return re;
}

std::string replace_all(std::string_view s, std::string_view from, std::string_view to) {
  std::string out;
  if (from.empty()) return std::string(s);
  size_t at = 0;
  for (size_t j; (j = s.find(from, at)) != std::string_view::npos; at = j + from.size()) {
    out.append(s.substr(at, j - at));
    out.append(to);
  }
  out.append(s.substr(at));
  return out;
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

struct Added {
  std::string content;
  int32_t id;
  bool special, lstrip, rstrip;
};

bool is_space(unsigned char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

// The added tokens' contents as a byte trie: the longest one at a position in
// time bounded by the longest content (kMaxAddedTokenBytes), whatever their number.
class AddedTrie {
 public:
  void insert(const std::string& content, int32_t index) {
    uint32_t node = 0;
    for (unsigned char c : content) {
      auto [it, fresh] = next_.try_emplace(key(node, c), static_cast<uint32_t>(token_.size()));
      if (fresh) token_.push_back(-1);
      node = it->second;
    }
    if (token_[node] < 0) token_[node] = index;  // the first of equal contents
  }
  // The index of the longest content that `text` starts with at `at` (-1 if none).
  int32_t longest(std::string_view text, size_t at) const {
    int32_t best = -1;
    uint32_t node = 0;
    for (size_t i = at; i < text.size(); ++i) {
      auto it = next_.find(key(node, static_cast<unsigned char>(text[i])));
      if (it == next_.end()) break;
      node = it->second;
      if (token_[node] >= 0) best = token_[node];
    }
    return best;
  }

 private:
  static uint64_t key(uint32_t node, unsigned char c) { return (uint64_t{node} << 8) | c; }
  std::unordered_map<uint64_t, uint32_t> next_;
  std::vector<int32_t> token_{-1};  // per node: the added token ending there (node 0 is the root)
};

uint64_t pair_key(int32_t a, int32_t b) { return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b); }

}  // namespace

struct Tokenizer::Impl {
  std::unordered_map<std::string, int32_t> vocab;
  std::vector<std::string> tokens;  // id -> vocabulary string (byte-mapped) or added content
  std::vector<bool> special, added_id;
  struct Merge {
    int32_t rank, id;  // its rank (lower merges first) and the token it makes
  };
  std::unordered_map<uint64_t, Merge> merges;  // pair_key(left id, right id) -> merge
  std::vector<Added> added;
  AddedTrie added_trie;  // over `added`, special or not
  std::vector<Step> steps;
  std::vector<Normalizer> normalizers;
  std::vector<Decoder> decoders;
  bool ignore_merges = false, fuse_unk = false, byte_fallback = false;
  std::array<int32_t, 256> byte_ids{};  // byte_fallback: the id of "<0xAB>" for each byte (-1 if none)
  std::optional<int32_t> unk;

  void add_step(const json& p, int depth) {
    if (depth > kMaxStepDepth) fail(fmt::format("pre-tokenizer Sequences nested deeper than {} levels", kMaxStepDepth));
    const std::string type = string_of(member(p, "type", "a pre-tokenizer"), "a pre-tokenizer's type");
    if (type == "Sequence") {
      const json& list = member(p, "pretokenizers", "a Sequence pre-tokenizer");
      if (!list.is_array()) fail("a Sequence pre-tokenizer's 'pretokenizers' is not a list");
      for (const json& q : list) add_step(q, depth + 1);
      return;
    }
    if (type == "ByteLevel") {
      Step s;
      s.kind = Step::Kind::ByteLevel;
      s.prefix_space = flag(p, "add_prefix_space", false, "the ByteLevel pre-tokenizer");
      if (flag(p, "use_regex", true, "the ByteLevel pre-tokenizer")) s.regex = std::make_shared<Regex>(kGpt2Pattern);
      steps.push_back(std::move(s));
      return;
    }
    if (type == "Split") {
      const json& pat = member(p, "pattern", "a Split pre-tokenizer");
      std::string re;
      if (pat.is_object() && pat.contains("Regex")) re = string_of(pat.at("Regex"), "a Split pre-tokenizer's Regex");
      else re = escape_regex(string_of(member(pat, "String", "a Split pre-tokenizer's pattern"), "a Split pre-tokenizer's String"));
      std::string behavior = "Isolated";
      if (p.contains("behavior")) behavior = string_of(p["behavior"], "a Split pre-tokenizer's behavior");
      Step s;
      s.kind = Step::Kind::Split;
      s.regex = std::make_shared<Regex>(re);
      if (behavior == "Isolated") s.behavior = Behavior::Isolated;
      else if (behavior == "Removed") s.behavior = Behavior::Removed;
      else if (behavior == "MergedWithPrevious") s.behavior = Behavior::MergedWithPrevious;
      else if (behavior == "MergedWithNext") s.behavior = Behavior::MergedWithNext;
      else if (behavior == "Contiguous") s.behavior = Behavior::Contiguous;
      else fail(fmt::format("pre-tokenizer Split with behavior {} is not supported", behavior.substr(0, 40)));
      if (flag(p, "invert", false, "a Split pre-tokenizer")) fail("pre-tokenizer Split with invert is not supported");
      steps.push_back(std::move(s));
      return;
    }
    if (type == "Metaspace") {
      Step s;
      s.kind = Step::Kind::Metaspace;
      s.replacement = p.contains("replacement") ? string_of(p["replacement"], "the Metaspace replacement") : "\xE2\x96\x81";
      if (s.replacement.empty() || s.replacement.size() > 4) fail("the Metaspace replacement is not one character");
      s.regex = std::make_shared<Regex>(escape_regex(s.replacement));
      std::string scheme = flag(p, "add_prefix_space", true, "the Metaspace pre-tokenizer") ? "always" : "never";
      if (p.contains("prepend_scheme")) scheme = string_of(p["prepend_scheme"], "the Metaspace prepend_scheme");
      if (scheme == "always") s.prepend = Step::Prepend::Always;
      else if (scheme == "first") s.prepend = Step::Prepend::First;
      else if (scheme == "never") s.prepend = Step::Prepend::Never;
      else fail(fmt::format("Metaspace prepend_scheme '{}' is not supported", scheme.substr(0, 40)));
      s.split = flag(p, "split", true, "the Metaspace pre-tokenizer");
      steps.push_back(std::move(s));
      return;
    }
    fail(fmt::format("pre-tokenizer '{}' is not supported", type.substr(0, 40)));
  }

  void add_normalizer(const json& p, int depth) {
    if (depth > kMaxStepDepth) fail(fmt::format("normalizer Sequences nested deeper than {} levels", kMaxStepDepth));
    const std::string type = string_of(member(p, "type", "a normalizer"), "a normalizer's type");
    if (type == "Sequence") {
      const json& list = member(p, "normalizers", "a Sequence normalizer");
      if (!list.is_array()) fail("a Sequence normalizer's 'normalizers' is not a list");
      for (const json& q : list) add_normalizer(q, depth + 1);
    } else if (type == "Replace") {
      const json& pat = member(p, "pattern", "a Replace normalizer");
      std::string re;
      if (pat.is_object() && pat.contains("Regex")) re = string_of(pat.at("Regex"), "a Replace normalizer's Regex");
      else re = escape_regex(string_of(member(pat, "String", "a Replace normalizer's pattern"), "a Replace normalizer's String"));
      normalizers.push_back({Normalizer::Kind::Replace, std::make_shared<Regex>(re),
                             string_of(member(p, "content", "a Replace normalizer"), "a Replace normalizer's content")});
    } else if (type == "Prepend") {
      normalizers.push_back({Normalizer::Kind::Prepend, nullptr,
                             string_of(member(p, "prepend", "a Prepend normalizer"), "a Prepend normalizer's prepend")});
    } else {
      fail(fmt::format("normalizer '{}' is not supported", type.substr(0, 40)));
    }
  }

  void add_decoder(const json& p, int depth) {
    if (depth > kMaxStepDepth) fail(fmt::format("decoder Sequences nested deeper than {} levels", kMaxStepDepth));
    const std::string type = string_of(member(p, "type", "a decoder"), "a decoder's type");
    Decoder d;
    if (type == "Sequence") {
      const json& list = member(p, "decoders", "a Sequence decoder");
      if (!list.is_array()) fail("a Sequence decoder's 'decoders' is not a list");
      for (const json& q : list) add_decoder(q, depth + 1);
      return;
    }
    if (type == "ByteLevel") {
      d.kind = Decoder::Kind::ByteLevel;
    } else if (type == "Replace") {
      d.kind = Decoder::Kind::Replace;
      const json& pat = member(p, "pattern", "a Replace decoder");
      d.pattern = string_of(member(pat, "String", "a Replace decoder's pattern"), "a Replace decoder's String");
      d.content = string_of(member(p, "content", "a Replace decoder"), "a Replace decoder's content");
    } else if (type == "ByteFallback") {
      d.kind = Decoder::Kind::ByteFallback;
    } else if (type == "Fuse") {
      d.kind = Decoder::Kind::Fuse;
    } else if (type == "Strip") {
      d.kind = Decoder::Kind::Strip;
      d.content = string_of(member(p, "content", "a Strip decoder"), "a Strip decoder's content");
      if (d.content.size() != 1) fail("a Strip decoder's content is not one ASCII character");
      for (auto [key, field] : {std::pair{"start", &d.start}, std::pair{"stop", &d.stop}}) {
        const json& v = member(p, key, "a Strip decoder");
        if (!v.is_number_unsigned() || v.get<uint64_t>() > 1024) fail(fmt::format("a Strip decoder's {} is not a count", key));
        *field = static_cast<size_t>(v.get<uint64_t>());
      }
    } else if (type == "Metaspace") {
      d.kind = Decoder::Kind::Metaspace;
      d.content = p.contains("replacement") ? string_of(p["replacement"], "the Metaspace replacement") : "\xE2\x96\x81";
      std::string scheme = flag(p, "add_prefix_space", true, "the Metaspace decoder") ? "always" : "never";
      if (p.contains("prepend_scheme")) scheme = string_of(p["prepend_scheme"], "the Metaspace prepend_scheme");
      d.prepend_first = scheme != "never";
    } else {
      fail(fmt::format("decoder '{}' is not supported", type.substr(0, 40)));
    }
    decoders.push_back(std::move(d));
  }

  // The normalized text of one segment between added tokens.
  std::string normalize(std::string_view text) const {
    std::string s(text);
    for (const Normalizer& n : normalizers) {
      if (n.kind == Normalizer::Kind::Prepend) {
        if (!s.empty()) s.insert(0, n.content);
        continue;
      }
      std::string out;
      size_t at = 0;
      for (auto [b, e] : n.regex->matches(s)) {
        out.append(s, at, b - at);
        out += n.content;
        at = e;
      }
      out.append(s, at);
      s = std::move(out);
    }
    return s;
  }

  // pieces of one text segment (no added tokens in it), byte-mapped after a ByteLevel step;
  // `first`: the segment starts the text (Metaspace's prepend_scheme "first")
  std::vector<std::string> pre_tokenize(std::string_view text, bool first) const {
    std::vector<std::string> pieces{std::string(text)};
    bool mapped = false;
    for (const Step& s : steps) {
      std::vector<std::string> next;
      for (size_t k = 0; k < pieces.size(); ++k) {
        std::string& piece = pieces[k];
        if (s.kind == Step::Kind::ByteLevel && s.prefix_space && !mapped && (piece.empty() || piece[0] != ' '))
          piece.insert(piece.begin(), ' ');
        if (s.kind == Step::Kind::Metaspace) {
          piece = replace_all(piece, " ", s.replacement);
          const bool prepend = s.prepend == Step::Prepend::Always || (s.prepend == Step::Prepend::First && first && k == 0);
          if (prepend && piece.compare(0, s.replacement.size(), s.replacement) != 0) piece.insert(0, s.replacement);
          if (!s.split) {
            next.push_back(std::move(piece));
            continue;
          }
        }
        if (!s.regex) {
          next.push_back(std::move(piece));
          continue;
        }
        const Behavior behavior = s.kind == Step::Kind::Split       ? s.behavior
                                  : s.kind == Step::Kind::Metaspace ? Behavior::MergedWithNext
                                                                    : Behavior::Isolated;
        for (std::string& p : split_pieces(piece, s.regex->matches(piece), behavior)) next.push_back(std::move(p));
      }
      pieces = std::move(next);
      if (s.kind == Step::Kind::ByteLevel && !mapped) {
        for (std::string& piece : pieces) {
          std::string m;
          for (unsigned char c : piece) m += byte_map().to_char[c];
          piece = std::move(m);
        }
        mapped = true;
      }
    }
    std::erase_if(pieces, [](const std::string& p) { return p.empty(); });
    return pieces;
  }

  // The decoder chain over token strings (the tokenizers package's decode_chain).
  std::string decode_tokens(std::vector<std::string> toks) const {
    for (const Decoder& d : decoders) {
      switch (d.kind) {
        case Decoder::Kind::ByteLevel:  // as token_bytes does it, token by token
          for (std::string& t : toks) t = unmap_bytes(t);
          break;
        case Decoder::Kind::Replace:
          for (std::string& t : toks) t = replace_all(t, d.pattern, d.content);
          break;
        case Decoder::Kind::ByteFallback: {
          std::vector<std::string> out;
          std::string bytes;
          size_t count = 0;
          auto flush = [&] {
            if (count == 0) return;
            if (valid_utf8(bytes)) out.push_back(bytes);
            else for (size_t k = 0; k < count; ++k) out.emplace_back("\xEF\xBF\xBD");  // U+FFFD per byte
            bytes.clear();
            count = 0;
          };
          for (std::string& t : toks) {
            if (const int b = byte_token(t); b >= 0) {
              bytes += static_cast<char>(b);
              ++count;
            } else {
              flush();
              out.push_back(std::move(t));
            }
          }
          flush();
          toks = std::move(out);
          break;
        }
        case Decoder::Kind::Fuse: {
          std::string all;
          for (const std::string& t : toks) all += t;
          toks.assign(1, std::move(all));
          break;
        }
        case Decoder::Kind::Strip:
          for (std::string& t : toks) {
            size_t b = 0, e = t.size();
            while (b < d.start && b < e && t[b] == d.content[0]) ++b;
            for (size_t k = 0; k < d.stop && e > b && t[e - 1] == d.content[0]; ++k) --e;
            t = t.substr(b, e - b);
          }
          break;
        case Decoder::Kind::Metaspace:
          for (size_t k = 0; k < toks.size(); ++k)
            toks[k] = replace_all(toks[k], d.content, k == 0 && d.prepend_first ? "" : " ");
          break;
      }
    }
    std::string out;
    for (const std::string& t : toks) out += t;
    return out;
  }

  // A byte-level token's bytes (GPT-2's byte map undone).
  static std::string unmap_bytes(const std::string& t) {
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

  bool byte_level_decoder() const { return decoders.size() == 1 && decoders[0].kind == Decoder::Kind::ByteLevel; }

  // BPE of one pre-tokenized piece, as the tokenizers package does it: the
  // piece's characters as symbols (unknown ones as the unk token, or dropped),
  // then the pair of adjacent symbols with the lowest merge rank merged, the
  // leftmost first, until no pair merges. A heap of candidate merges over a
  // linked list of symbols: O(n log n) in the piece's length (a stale heap
  // entry, whose symbols have merged since, is skipped when it comes up).
  void bpe(const std::string& piece, std::vector<int32_t>* ids) const {
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
};

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(std::unique_ptr<detail::SentencePiece> sp) : sp_(std::move(sp)) {}
Tokenizer::~Tokenizer() = default;

std::string one_line(std::string_view what) {
  std::string out;
  for (unsigned char c : what) {
    if (out.size() >= 300) {
      out += "...";
      break;
    }
    if (c == '\n') out += "\\n";
    else if (c < 0x20 || c == 0x7F) out += fmt::format("\\x{:02x}", c);
    else out += static_cast<char>(c);
  }
  return out;
}

namespace {

// The file as JSON, arrays and objects at most kMaxJsonDepth deep.
json parse_json(std::istream& in) {
  json::parser_callback_t depth_check = [](int depth, json::parse_event_t event, json&) {
    if ((event == json::parse_event_t::object_start || event == json::parse_event_t::array_start) && depth >= kMaxJsonDepth)
      fail(fmt::format("JSON nested deeper than {} levels", kMaxJsonDepth));
    return true;
  };
  return json::parse(in, depth_check);
}

}  // namespace

std::unique_ptr<Tokenizer> Tokenizer::load(const std::string& path, std::string* error) {
  try {
    std::error_code ec;
    if (std::filesystem::is_directory(path, ec)) {
      *error = fmt::format("{}: is a directory, not a tokenizer file", path);
      return nullptr;
    }
    std::ifstream in(path, std::ios::binary);
    if (!in) {
      *error = fmt::format("{}: cannot open the tokenizer file", path);
      return nullptr;
    }
    if (const uintmax_t size = std::filesystem::file_size(path, ec); !ec && size > kMaxFileBytes) {
      *error = fmt::format("{}: {} bytes; kiln reads tokenizer files of at most {} MiB", path, size, kMaxFileBytes >> 20);
      return nullptr;
    }
    if (char c = ' '; (in >> std::ws).get(c) && c != '{') {  // not JSON: a SentencePiece model (a protobuf)
      std::string why;
      if (auto sp = detail::SentencePiece::load(path, &why)) return std::unique_ptr<Tokenizer>(new Tokenizer(std::move(sp)));
      *error = fmt::format("{}: neither a tokenizer.json nor a SentencePiece model ({})", path, one_line(why));
      return nullptr;
    }
    in.clear();
    in.seekg(0);
    const json j = parse_json(in);
    if (!j.is_object()) fail("not a JSON object");
    auto impl = std::make_unique<Impl>();
    const json& model = member(j, "model", "the file");
    if (!model.is_object()) fail("'model' is not a JSON object");
    const std::string model_type = model.contains("type") ? string_of(model["type"], "the model's type") : "BPE";
    if (model_type != "BPE") fail(fmt::format("model type '{}' is not supported (kiln reads BPE)", model_type.substr(0, 40)));
    for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"})
      if (model.contains(k) && !model[k].is_null() && !(model[k].is_string() && model[k].get<std::string>().empty()))
        fail(fmt::format("the BPE model's {} is not supported", k));
    if (j.contains("normalizer") && !j["normalizer"].is_null()) impl->add_normalizer(j["normalizer"], 0);
    if (!j.contains("decoder") || j["decoder"].is_null()) fail("a tokenizer without a decoder is not supported");
    impl->add_decoder(j["decoder"], 0);
    if (!impl->byte_level_decoder() &&
        std::any_of(impl->decoders.begin(), impl->decoders.end(), [](const Decoder& d) { return d.kind == Decoder::Kind::ByteLevel; }))
      fail("a ByteLevel decoder in a Sequence is not supported");
    impl->byte_fallback = flag(model, "byte_fallback", false, "the BPE model");
    impl->ignore_merges = flag(model, "ignore_merges", false, "the BPE model");
    impl->fuse_unk = flag(model, "fuse_unk", false, "the BPE model");

    // the vocabulary: distinct ids in range
    const json& vocab = member(model, "vocab", "the BPE model");
    if (!vocab.is_object()) fail("the BPE model's vocab is not a JSON object");
    int32_t max_id = -1;
    for (const auto& [tok, id] : vocab.items()) {
      const int32_t v = token_id(id, fmt::format("vocab entry '{}'", tok.substr(0, 40)));
      impl->vocab[tok] = v;
      max_id = std::max(max_id, v);
    }
    std::vector<bool> taken(static_cast<size_t>(max_id + 1), false);
    for (const auto& [tok, id] : impl->vocab) {
      if (taken[static_cast<size_t>(id)]) fail(fmt::format("token id {} is given to two vocabulary entries", id));
      taken[static_cast<size_t>(id)] = true;
    }

    // merges: both sides and their concatenation in the vocabulary (as the tokenizers package requires)
    const json& merges = member(model, "merges", "the BPE model");
    if (!merges.is_array()) fail("the BPE model's merges is not a list");
    if (merges.size() >= static_cast<size_t>(std::numeric_limits<int32_t>::max())) fail("too many merges");
    int32_t rank = 0;
    for (const json& m : merges) {
      std::string a, b;
      if (m.is_string()) {
        const std::string s = m.get<std::string>();
        const size_t sp = s.find(' ');
        if (sp == std::string::npos) fail(fmt::format("merge '{}' has no space", s.substr(0, 40)));
        a = s.substr(0, sp);
        b = s.substr(sp + 1);
      } else if (m.is_array() && m.size() == 2) {
        a = string_of(m[0], "a merge's left side");
        b = string_of(m[1], "a merge's right side");
      } else {
        fail(fmt::format("merge {} is neither \"a b\" nor [\"a\", \"b\"]", rank));
      }
      auto ia = impl->vocab.find(a), ib = impl->vocab.find(b), iab = impl->vocab.find(a + b);
      if (ia == impl->vocab.end() || ib == impl->vocab.end() || iab == impl->vocab.end())
        fail(fmt::format("merge {} ('{}' '{}'): {} is not in the vocabulary", rank, a.substr(0, 40), b.substr(0, 40),
                         ia == impl->vocab.end() ? "its left side" : ib == impl->vocab.end() ? "its right side" : "the merged token"));
      impl->merges.emplace(pair_key(ia->second, ib->second), Impl::Merge{rank, iab->second});  // a repeat keeps its first rank
      ++rank;
    }

    // added tokens: ids in range, each id once
    if (j.contains("added_tokens") && !j["added_tokens"].is_null()) {
      const json& list = j["added_tokens"];
      if (!list.is_array()) fail("added_tokens is not a list");
      for (const json& t : list) {
        Added a{string_of(member(t, "content", "an added token"), "an added token's content"),
                token_id(member(t, "id", "an added token"), "an added token"), flag(t, "special", false, "an added token"),
                flag(t, "lstrip", false, "an added token"), flag(t, "rstrip", false, "an added token")};
        if (a.content.size() > kMaxAddedTokenBytes)
          fail(fmt::format("added token {} is {} bytes long (kiln's limit: {})", a.id, a.content.size(), kMaxAddedTokenBytes));
        max_id = std::max(max_id, a.id);
        impl->added.push_back(std::move(a));
      }
    }
    if (max_id < 0) fail("the vocabulary is empty");
    impl->tokens.assign(static_cast<size_t>(max_id + 1), std::string());
    impl->special.assign(static_cast<size_t>(max_id + 1), false);
    impl->added_id.assign(static_cast<size_t>(max_id + 1), false);
    for (const auto& [tok, id] : impl->vocab) impl->tokens[static_cast<size_t>(id)] = tok;
    for (size_t k = 0; k < impl->added.size(); ++k) {
      const Added& a = impl->added[k];
      if (impl->added_id[static_cast<size_t>(a.id)]) fail(fmt::format("token id {} is given to two added tokens", a.id));
      impl->tokens[static_cast<size_t>(a.id)] = a.content;
      impl->special[static_cast<size_t>(a.id)] = a.special;
      impl->added_id[static_cast<size_t>(a.id)] = true;
      if (!a.content.empty()) impl->added_trie.insert(a.content, static_cast<int32_t>(k));
    }
    if (model.contains("unk_token") && model["unk_token"].is_string())
      if (auto it = impl->vocab.find(model["unk_token"].get<std::string>()); it != impl->vocab.end()) impl->unk = it->second;
    if (j.contains("pre_tokenizer") && !j["pre_tokenizer"].is_null()) impl->add_step(j["pre_tokenizer"], 0);
    const bool byte_level_steps =
        std::any_of(impl->steps.begin(), impl->steps.end(), [](const Step& s) { return s.kind == Step::Kind::ByteLevel; });
    if (byte_level_steps != impl->byte_level_decoder())
      fail("a ByteLevel pre-tokenizer needs the ByteLevel decoder and the other way round");
    impl->byte_ids.fill(-1);
    for (int b = 0; b < 256; ++b)
      if (auto it = impl->vocab.find(fmt::format("<0x{:02X}>", b)); it != impl->vocab.end()) impl->byte_ids[static_cast<size_t>(b)] = it->second;
    return std::unique_ptr<Tokenizer>(new Tokenizer(std::move(impl)));
  } catch (const std::bad_alloc&) {
    *error = fmt::format("{}: out of memory reading the tokenizer", path);
    return nullptr;
  } catch (const std::exception& e) {
    *error = fmt::format("{}: {}", path, one_line(e.what()));
    return nullptr;
  }
}

bool Tokenizer::encode(std::string_view text, std::vector<int32_t>* ids, std::string* error, bool special,
                       size_t max_tokens) const {
  int rc = 0;
  PCRE2_SIZE off = 0;
  {  // validate UTF-8 once (PCRE2 does it for an empty pattern match)
    static Regex any(".");
    pcre2_match_data* md = pcre2_match_data_create(1, nullptr);
    rc = pcre2_match(any.code, reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), 0, 0, md, nullptr);
    off = pcre2_get_startchar(md);
    pcre2_match_data_free(md);
  }
  if (rc <= PCRE2_ERROR_UTF8_ERR1 && rc >= PCRE2_ERROR_UTF8_ERR21) {
    *error = fmt::format("the text is not valid UTF-8 (at byte {})", off);
    return false;
  }
  ids->clear();
  if (sp_) {
    if (!sp_->encode(text, ids, error)) return false;
    if (ids->size() > max_tokens) ids->resize(max_tokens + 1);
    return true;
  }
  try {
    // true once more than max_tokens ids are out (ids then holds the first max_tokens + 1)
    auto encode_plain = [&](std::string_view seg, bool first) {
      if (seg.empty()) return false;
      const std::string normalized = impl_->normalize(seg);
      for (const std::string& piece : impl_->pre_tokenize(normalized, first)) {
        impl_->bpe(piece, ids);
        if (ids->size() > max_tokens) {
          ids->resize(max_tokens + 1);
          return true;
        }
      }
      return false;
    };
    size_t start = 0, i = 0;
    while (i < text.size()) {
      const Added* hit = nullptr;
      if (special)
        if (const int32_t k = impl_->added_trie.longest(text, i); k >= 0) hit = &impl_->added[static_cast<size_t>(k)];
      if (!hit) {
        ++i;
        continue;
      }
      size_t seg_end = i;
      if (hit->lstrip)
        while (seg_end > start && is_space(static_cast<unsigned char>(text[seg_end - 1]))) --seg_end;
      if (encode_plain(text.substr(start, seg_end - start), start == 0)) return true;
      ids->push_back(hit->id);
      if (ids->size() > max_tokens) return true;
      i += hit->content.size();
      if (hit->rstrip)
        while (i < text.size() && is_space(static_cast<unsigned char>(text[i]))) ++i;
      start = i;
    }
    encode_plain(text.substr(start), start == 0);
  } catch (const std::bad_alloc&) {
    *error = "out of memory encoding the text";
    return false;
  } catch (const std::exception& e) {
    *error = one_line(e.what());
    return false;
  }
  return true;
}

std::string Tokenizer::token_bytes(int32_t id) const {
  if (sp_) return sp_->token_bytes(id);
  if (id < 0 || static_cast<size_t>(id) >= impl_->tokens.size()) return {};
  const std::string& t = impl_->tokens[static_cast<size_t>(id)];
  if (impl_->added_id[static_cast<size_t>(id)]) return t;
  if (impl_->byte_level_decoder()) return Impl::unmap_bytes(t);
  // the decoder chain for one token that continues a text: replacements made,
  // a "<0xAB>" token its byte, nothing stripped as at the start of a text
  std::string out = t;
  for (const Decoder& d : impl_->decoders) {
    if (d.kind == Decoder::Kind::Replace) out = replace_all(out, d.pattern, d.content);
    else if (d.kind == Decoder::Kind::Metaspace) out = replace_all(out, d.content, " ");
    else if (d.kind == Decoder::Kind::ByteFallback && byte_token(out) >= 0) out = std::string(1, static_cast<char>(byte_token(out)));
  }
  return out;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special) const {
  if (sp_) return sp_->decode(ids);  // the library drops control symbols either way
  if (!impl_->byte_level_decoder()) {
    std::vector<std::string> toks;
    for (int32_t id : ids)
      if (id >= 0 && static_cast<size_t>(id) < impl_->tokens.size() && !(skip_special && is_special(id)))
        toks.push_back(impl_->tokens[static_cast<size_t>(id)]);
    return impl_->decode_tokens(std::move(toks));
  }
  std::string out;
  for (int32_t id : ids) {
    if (skip_special && is_special(id)) continue;
    out += token_bytes(id);
  }
  return out;
}

int32_t Tokenizer::vocab_size() const { return sp_ ? sp_->vocab_size() : static_cast<int32_t>(impl_->tokens.size()); }

std::optional<int32_t> Tokenizer::id_of(std::string_view token) const {
  if (sp_) return sp_->id_of(token);
  for (const Added& a : impl_->added)
    if (a.content == token) return a.id;
  if (auto it = impl_->vocab.find(std::string(token)); it != impl_->vocab.end()) return it->second;
  return std::nullopt;
}

bool Tokenizer::is_special(int32_t id) const {
  if (sp_) return sp_->is_special(id);
  return id >= 0 && static_cast<size_t>(id) < impl_->special.size() && impl_->special[static_cast<size_t>(id)];
}

std::optional<int32_t> Tokenizer::bos_id() const { return sp_ ? sp_->bos_id() : std::nullopt; }
std::optional<int32_t> Tokenizer::eos_id() const { return sp_ ? sp_->eos_id() : std::nullopt; }

size_t complete_utf8_prefix(std::string_view s) {
  size_t i = 0, ok = 0;
  while (i < s.size()) {
    const size_t n = utf8_len(static_cast<unsigned char>(s[i]));
    if (i + n > s.size()) break;
    i += n;
    ok = i;
  }
  return ok;
}

}  // namespace kiln::tok
