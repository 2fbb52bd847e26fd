// SentencePiece models through libsentencepiece (see sentencepiece.h).
#include "sentencepiece.h"

#include <fmt/format.h>
#include <sentencepiece_processor.h>

namespace kiln::tok::detail {

std::unique_ptr<SentencePiece> SentencePiece::load(const std::string& path, std::string* error) {
  auto sp = std::make_unique<sentencepiece::SentencePieceProcessor>();
  const auto status = sp->Load(path);
  if (!status.ok()) {
    *error = status.ToString();
    return nullptr;
  }
  std::unique_ptr<SentencePiece> s(new SentencePiece());
  s->sp_ = std::move(sp);
  return s;
}

SentencePiece::~SentencePiece() = default;

bool SentencePiece::encode(std::string_view text, std::vector<int32_t>* ids, std::string* error) const {
  std::vector<int> out;
  const auto status = sp_->Encode(text, &out);
  if (!status.ok()) {
    *error = fmt::format("sentencepiece: {}", status.ToString());
    return false;
  }
  ids->insert(ids->end(), out.begin(), out.end());
  return true;
}

// The library's decoding: control symbols dropped, the word-boundary mark to a
// space (the first one removed), byte pieces joined into their characters.
std::string SentencePiece::decode(std::span<const int32_t> ids) const {
  std::string text;
  const std::vector<int> v(ids.begin(), ids.end());
  if (!sp_->Decode(v, &text).ok()) return {};
  return text;
}

// One token's bytes for streaming after a prompt: no leading space is removed
// (the token continues the text), a byte piece "<0xAB>" is its byte, control
// symbols are empty and the unknown symbol is the library's " \u2047 ".
std::string SentencePiece::token_bytes(int32_t id) const {
  if (id < 0 || id >= sp_->GetPieceSize() || sp_->IsControl(id) || sp_->IsUnused(id)) return {};
  if (sp_->IsUnknown(id)) return " \xE2\x81\x87 ";
  const std::string& piece = sp_->IdToPiece(id);
  if (sp_->IsByte(id)) return std::string(1, static_cast<char>(std::stoi(piece.substr(3, 2), nullptr, 16)));
  static constexpr std::string_view kSpace = "\xE2\x96\x81";  // U+2581, SentencePiece's word boundary
  std::string out;
  for (size_t i = 0; i < piece.size();) {
    if (piece.compare(i, kSpace.size(), kSpace) == 0) {
      out += ' ';
      i += kSpace.size();
    } else {
      out += piece[i++];
    }
  }
  return out;
}

int32_t SentencePiece::vocab_size() const { return sp_->GetPieceSize(); }

std::optional<int32_t> SentencePiece::id_of(std::string_view piece) const {
  const int id = sp_->PieceToId(piece);
  if (id == sp_->unk_id() && sp_->IdToPiece(id) != piece) return std::nullopt;
  return id;
}

bool SentencePiece::is_special(int32_t id) const { return id >= 0 && id < sp_->GetPieceSize() && sp_->IsControl(id); }

std::optional<int32_t> SentencePiece::bos_id() const {
  return sp_->bos_id() >= 0 ? std::optional<int32_t>(sp_->bos_id()) : std::nullopt;
}

std::optional<int32_t> SentencePiece::eos_id() const {
  return sp_->eos_id() >= 0 ? std::optional<int32_t>(sp_->eos_id()) : std::nullopt;
}

}  // namespace kiln::tok::detail
