// SentencePiece models (tokenizer.model: Llama 2, Gemma, T5, ...) behind
// kiln::tok::Tokenizer, through Debian's libsentencepiece (the library the
// models come from, so encode/decode are the reference behaviour: normalizer,
// BPE or unigram, byte fallback, user-defined symbols). Private to
// src/tokenizer; tokenizer.cpp forwards to it when a file is not JSON.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace kiln::tok::detail {

class SentencePiece {
 public:
  // Null and *error (the library's message) if `path` is not a SentencePiece model.
  static std::unique_ptr<SentencePiece> load(const std::string& path, std::string* error);
  ~SentencePiece();

  bool encode(std::string_view text, std::vector<int32_t>* ids, std::string* error) const;
  std::string decode(std::span<const int32_t> ids) const;
  std::string token_bytes(int32_t id) const;
  int32_t vocab_size() const;
  std::optional<int32_t> id_of(std::string_view piece) const;
  bool is_special(int32_t id) const;
  std::optional<int32_t> bos_id() const;
  std::optional<int32_t> eos_id() const;

 private:
  SentencePiece() = default;
  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;
};

}  // namespace kiln::tok::detail
