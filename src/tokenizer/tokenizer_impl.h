// Internal to the tokenizer library: a Hugging Face tokenizer.json's BPE model as kiln holds it
// (Tokenizer::Impl) and the pieces its files share.
//   tokenizer.cpp  reading the file (the model, its vocabulary, merges and added tokens) and the
//                  public API (encode with added tokens, decode, token lookups)
//   pipeline.cpp   the steps around BPE: normalizers, pre-tokenizers (PCRE2 regex splits), decoders
//   bpe.cpp        bytes and UTF-8 (GPT-2's byte map, "<0xAB>" tokens), the merge loop
#pragma once

#include "kiln/tokenizer/tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <nlohmann/json.hpp>

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace kiln::tok::hf {

using nlohmann::json;

// Limits on a tokenizer.json (untrusted input: it comes with the model). Real
// files are far inside every one: the largest vocabularies have 262,144 ids,
// pre-tokenizers nest two deep, added tokens are tens of bytes.
inline constexpr int64_t kMaxVocab = int64_t{1} << 21;        // token ids are in [0, kMaxVocab)
constexpr int kMaxJsonDepth = 64;                      // arrays and objects inside each other
constexpr int kMaxStepDepth = 8;                       // Sequence pre-tokenizers inside each other
constexpr size_t kMaxAddedTokenBytes = 1024;           // an added token's content
constexpr uintmax_t kMaxFileBytes = uintmax_t{1} << 30;  // the file
constexpr uint32_t kMaxRegexMatchSteps = 10'000'000;   // PCRE2's match limit for one match of a pre-tokenizer regex

// Throws the error a load or an encode reports (tokenizer.cpp).
[[noreturn]] void fail(const std::string& what);

// JSON helpers that say what is wrong (nlohmann's own messages do not say where; tokenizer.cpp).
const json& member(const json& obj, const char* key, const char* where);
std::string string_of(const json& v, const char* what);
bool flag(const json& obj, const char* key, bool dflt, const char* where);

// ---------------------------------------------------------------- bytes and UTF-8 (bpe.cpp)

// Length of the UTF-8 character starting with byte c (1 for a stray byte).
size_t utf8_len(unsigned char c);

// GPT-2's reversible byte -> printable character map: printable Latin-1 bytes
// stand for themselves, the other 68 become U+0100.. in byte order.
struct ByteMap {
  std::array<std::string, 256> to_char;
  std::unordered_map<std::string, uint8_t> to_byte;
  ByteMap();
};
const ByteMap& byte_map();

// "<0xAB>" -> 0xAB; -1 for any other token.
int byte_token(std::string_view t);
bool valid_utf8(std::string_view s);

// ---------------------------------------------------------------- the steps around BPE (pipeline.cpp)

// A compiled pre-tokenizer or normalizer pattern (PCRE2, UTF and Unicode properties, JIT where it can).
struct Regex {
  pcre2_code* code = nullptr;
  pcre2_match_context* mctx = nullptr;
  explicit Regex(const std::string& pattern);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // [begin, end) of each match in s, in order.
  std::vector<std::pair<size_t, size_t>> matches(std::string_view s) const;
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

std::string replace_all(std::string_view s, std::string_view from, std::string_view to);

// ---------------------------------------------------------------- added tokens

struct Added {
  std::string content;
  int32_t id;
  bool special, lstrip, rstrip;
};

inline bool is_space(unsigned char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

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

inline uint64_t pair_key(int32_t a, int32_t b) { return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b); }

}  // namespace kiln::tok::hf

namespace kiln::tok {

struct Tokenizer::Impl {
  using json = hf::json;
  std::unordered_map<std::string, int32_t> vocab;
  std::vector<std::string> tokens;  // id -> vocabulary string (byte-mapped) or added content
  std::vector<bool> special, added_id;
  struct Merge {
    int32_t rank, id;  // its rank (lower merges first) and the token it makes
  };
  std::unordered_map<uint64_t, Merge> merges;  // pair_key(left id, right id) -> merge
  std::vector<hf::Added> added;
  hf::AddedTrie added_trie;  // over `added`, special or not
  std::vector<hf::Step> steps;
  std::vector<hf::Normalizer> normalizers;
  std::vector<hf::Decoder> decoders;
  bool ignore_merges = false, fuse_unk = false, byte_fallback = false;
  std::array<int32_t, 256> byte_ids{};  // byte_fallback: the id of "<0xAB>" for each byte (-1 if none)
  std::optional<int32_t> unk;

  // the file's steps (pipeline.cpp)
  void add_step(const json& p, int depth);
  void add_normalizer(const json& p, int depth);
  void add_decoder(const json& p, int depth);
  // The normalized text of one segment between added tokens.
  std::string normalize(std::string_view text) const;
  // pieces of one text segment (no added tokens in it), byte-mapped after a ByteLevel step;
  // `first`: the segment starts the text (Metaspace's prepend_scheme "first")
  std::vector<std::string> pre_tokenize(std::string_view text, bool first) const;
  // The decoder chain over token strings (the tokenizers package's decode_chain).
  std::string decode_tokens(std::vector<std::string> toks) const;

  // A byte-level token's bytes (GPT-2's byte map undone; bpe.cpp).
  static std::string unmap_bytes(const std::string& t);
  bool byte_level_decoder() const { return decoders.size() == 1 && decoders[0].kind == hf::Decoder::Kind::ByteLevel; }

  // BPE of one pre-tokenized piece, as the tokenizers package does it: the
  // piece's characters as symbols (unknown ones as the unk token, or dropped),
  // then the pair of adjacent symbols with the lowest merge rank merged, the
  // leftmost first, until no pair merges. A heap of candidate merges over a
  // linked list of symbols: O(n log n) in the piece's length (a stale heap
  // entry, whose symbols have merged since, is skipped when it comes up).
  void bpe(const std::string& piece, std::vector<int32_t>* ids) const;
};

}  // namespace kiln::tok
