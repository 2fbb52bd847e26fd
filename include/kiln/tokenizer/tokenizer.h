// kiln's tokenizer: Hugging Face tokenizer.json files with a byte-level BPE
// model (GPT-2, SmolLM2, Llama 3, Qwen 2/3): added and special tokens, the
// pre-tokenizer's regex split (ByteLevel, or a Split + ByteLevel sequence),
// BPE merges by rank, and the byte-level decoder. Also SentencePiece-style
// tokenizer.json files (Llama 2, Gemma as transformers converts them):
// Replace / Prepend normalizers, Metaspace and Split pre-tokenizers (every
// Split behavior but invert), BPE with byte_fallback ("<0xAB>" tokens) and
// fuse_unk, and the Replace / ByteFallback / Fuse / Strip / Metaspace decoders
// in a Sequence. Not read: the NFC and other Unicode normalizers. Written here because no
// Debian package reads these files; the regex runs on Debian's PCRE2 (UTF +
// Unicode properties, the patterns' \p{L} / \p{N} / \s). The `tokenizers`
// package is the oracle in tests (tests/python/test_tokenizer.py).
//
// No exceptions cross this interface; a tokenizer is immutable once loaded
// and may be used from several threads.
//
// A tokenizer.json is untrusted input (it comes with the model): load checks
// every id, rank and nesting against explicit limits (tokenizer.cpp) and
// refuses a bad file with one line; BPE is O(n log n) in a word's length.
//
// SentencePiece models (tokenizer.model: Llama 2, Gemma) load through the same
// interface: Tokenizer::load reads any file that is not JSON as one, with
// Debian's libsentencepiece (src/tokenizer/sentencepiece.h).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace kiln::tok {
namespace detail {
class SentencePiece;
}

class Tokenizer {
 public:
  // Reads `path` (tokenizer.json, or a SentencePiece model); null and *error (one line) if it cannot.
  static std::unique_ptr<Tokenizer> load(const std::string& path, std::string* error);
  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // Token ids of `text` (UTF-8). Added tokens in the text are matched first
  // when `special` (as the tokenizers package does by default; a SentencePiece
  // model matches its user-defined symbols always, its control symbols never,
  // as the library does). No BOS is added (see bos_id). False and
  // *error when the text is not valid UTF-8.
  // Encoding stops early once more than `max_tokens` ids are out: *ids then
  // holds the first max_tokens + 1 of them (a caller with a length limit
  // refuses a long text without encoding all of it).
  bool encode(std::string_view text, std::vector<int32_t>* ids, std::string* error, bool special = true,
              size_t max_tokens = SIZE_MAX) const;

  // The text of `ids`; special tokens are dropped when skip_special. Bytes
  // that do not form UTF-8 on their own (a token that ends mid-character)
  // are kept as they are: see token_bytes for streaming.
  std::string decode(std::span<const int32_t> ids, bool skip_special = false) const;
  // The bytes one token stands for (its piece of UTF-8, possibly partial).
  std::string token_bytes(int32_t id) const;

  int32_t vocab_size() const;                            // largest id + 1
  std::optional<int32_t> id_of(std::string_view token) const;  // an added token's or a vocabulary entry's id
  bool is_special(int32_t id) const;
  // The token a prompt starts with: a SentencePiece model's BOS (its encoder
  // never adds it); none for tokenizer.json files.
  std::optional<int32_t> bos_id() const;
  // A SentencePiece model's EOS; none for tokenizer.json files (their eos token
  // is named in tokenizer_config.json).
  std::optional<int32_t> eos_id() const;

 private:
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  explicit Tokenizer(std::unique_ptr<detail::SentencePiece> sp);
  std::unique_ptr<Impl> impl_;
  std::unique_ptr<detail::SentencePiece> sp_;  // set instead of impl_ for a SentencePiece model
};

// How many leading bytes of `s` are complete UTF-8 characters (what a
// streaming printer may write now; the rest waits for the next token).
size_t complete_utf8_prefix(std::string_view s);

}  // namespace kiln::tok
