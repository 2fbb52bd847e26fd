// Byte-level BPE from a Hugging Face tokenizer.json (see tokenizer.h).
#include "kiln/tokenizer/tokenizer.h"

#include "sentencepiece.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <fstream>
#include <limits>
#include <unordered_map>

namespace kiln::tok {
namespace {

using nlohmann::json;

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
  }
  ~Regex() { pcre2_code_free(code); }
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // [begin, end) of each match in s, in order.
  std::vector<std::pair<size_t, size_t>> matches(std::string_view s) const {
    std::vector<std::pair<size_t, size_t>> out;
    pcre2_match_data* md = pcre2_match_data_create_from_pattern(code, nullptr);
    size_t at = 0;
    while (at <= s.size()) {
      // the text was checked as UTF-8 once: no re-check per match
      int rc = pcre2_match(code, reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), at, PCRE2_NO_UTF_CHECK, md, nullptr);
      if (rc < 0) break;
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

struct Step {  // one pre-tokenizer step
  enum class Kind { Split, ByteLevel } kind;
  std::shared_ptr<Regex> regex;  // Split, or ByteLevel with use_regex
  bool removed = false;          // Split behavior Removed (else Isolated)
  bool prefix_space = false;     // ByteLevel add_prefix_space
};

struct Added {
  std::string content;
  int32_t id;
  bool special, lstrip, rstrip;
};

bool is_space(unsigned char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

}  // namespace

struct Tokenizer::Impl {
  std::unordered_map<std::string, int32_t> vocab;
  std::vector<std::string> tokens;  // id -> vocabulary string (byte-mapped) or added content
  std::vector<bool> special, added_id;
  std::unordered_map<std::string, int32_t> merge_rank;  // "a\0b" -> rank
  std::vector<Added> added;
  std::vector<Step> steps;
  bool ignore_merges = false;
  std::optional<int32_t> unk;

  void add_step(const json& p) {
    const std::string type = p.at("type").get<std::string>();
    if (type == "Sequence") {
      for (const json& q : p.at("pretokenizers")) add_step(q);
      return;
    }
    if (type == "ByteLevel") {
      Step s{Step::Kind::ByteLevel, nullptr, false, p.value("add_prefix_space", false)};
      if (p.value("use_regex", true)) s.regex = std::make_shared<Regex>(kGpt2Pattern);
      steps.push_back(std::move(s));
      return;
    }
    if (type == "Split") {
      const json& pat = p.at("pattern");
      std::string re;
      if (pat.contains("Regex")) {
        re = pat.at("Regex").get<std::string>();
      } else {  // a literal string: escape it
        for (char c : pat.at("String").get<std::string>()) {
          if (std::string_view("\\^$.|?*+()[]{}").find(c) != std::string_view::npos) re += '\\';
          re += c;
        }
      }
      const std::string behavior = p.value("behavior", "Isolated");
      if ((behavior != "Isolated" && behavior != "Removed") || p.value("invert", false))
        throw std::runtime_error(fmt::format("pre-tokenizer Split with behavior {} is not supported", behavior));
      steps.push_back({Step::Kind::Split, std::make_shared<Regex>(re), behavior == "Removed", false});
      return;
    }
    throw std::runtime_error(fmt::format("pre-tokenizer '{}' is not supported (kiln reads byte-level BPE tokenizers)", type));
  }

  // pieces of one text segment (no added tokens in it), each byte-mapped
  std::vector<std::string> pre_tokenize(std::string_view text) const {
    std::vector<std::string> pieces{std::string(text)};
    bool mapped = false;
    for (const Step& s : steps) {
      std::vector<std::string> next;
      for (std::string& piece : pieces) {
        if (s.kind == Step::Kind::ByteLevel && s.prefix_space && !mapped && (piece.empty() || piece[0] != ' '))
          piece.insert(piece.begin(), ' ');
        if (!s.regex) {
          next.push_back(std::move(piece));
          continue;
        }
        size_t at = 0;
        for (auto [b, e] : s.regex->matches(piece)) {
          if (b > at && !(s.kind == Step::Kind::Split && s.removed)) next.push_back(piece.substr(at, b - at));
          next.push_back(piece.substr(b, e - b));
          at = e;
        }
        if (at < piece.size()) next.push_back(piece.substr(at));
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
    if (!mapped) throw std::runtime_error("the pre-tokenizer has no ByteLevel step");
    std::erase_if(pieces, [](const std::string& p) { return p.empty(); });
    return pieces;
  }

  void bpe(const std::string& piece, std::vector<int32_t>* ids) const {
    if (ignore_merges)
      if (auto it = vocab.find(piece); it != vocab.end()) {
        ids->push_back(it->second);
        return;
      }
    std::vector<std::string> sym;
    for (size_t i = 0; i < piece.size();) {
      size_t n = std::min(utf8_len(static_cast<unsigned char>(piece[i])), piece.size() - i);
      sym.push_back(piece.substr(i, n));
      i += n;
    }
    std::string key;
    while (sym.size() > 1) {
      int32_t best = std::numeric_limits<int32_t>::max();
      size_t at = 0;
      for (size_t i = 0; i + 1 < sym.size(); ++i) {
        key.assign(sym[i]).push_back('\0');
        key += sym[i + 1];
        if (auto it = merge_rank.find(key); it != merge_rank.end() && it->second < best) {
          best = it->second;
          at = i;
        }
      }
      if (best == std::numeric_limits<int32_t>::max()) break;
      sym[at] += sym[at + 1];
      sym.erase(sym.begin() + static_cast<std::ptrdiff_t>(at) + 1);
    }
    for (const std::string& s : sym) {
      if (auto it = vocab.find(s); it != vocab.end()) ids->push_back(it->second);
      else if (unk) ids->push_back(*unk);
    }
  }
};

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(std::unique_ptr<detail::SentencePiece> sp) : sp_(std::move(sp)) {}
Tokenizer::~Tokenizer() = default;

std::unique_ptr<Tokenizer> Tokenizer::load(const std::string& path, std::string* error) {
  try {
    std::ifstream in(path, std::ios::binary);
    if (!in) {
      *error = fmt::format("{}: cannot open the tokenizer file", path);
      return nullptr;
    }
    if (char c = ' '; (in >> std::ws).get(c) && c != '{') {  // not JSON: a SentencePiece model (a protobuf)
      std::string why;
      if (auto sp = detail::SentencePiece::load(path, &why)) return std::unique_ptr<Tokenizer>(new Tokenizer(std::move(sp)));
      *error = fmt::format("{}: neither a tokenizer.json nor a SentencePiece model ({})", path, why);
      return nullptr;
    }
    in.clear();
    in.seekg(0);
    json j = json::parse(in);
    auto impl = std::make_unique<Impl>();
    const json& model = j.at("model");
    if (model.value("type", "BPE") != "BPE")
      throw std::runtime_error(fmt::format("model type '{}' is not supported (kiln reads BPE)",
                                           model.value("type", "")));
    if (j.contains("normalizer") && !j["normalizer"].is_null())
      throw std::runtime_error(fmt::format("normalizer '{}' is not supported", j["normalizer"].value("type", "?")));
    if (!j.contains("decoder") || j["decoder"].is_null() || j["decoder"].value("type", "") != "ByteLevel")
      throw std::runtime_error("only the ByteLevel decoder is supported");
    impl->ignore_merges = model.value("ignore_merges", false);
    int32_t max_id = -1;
    for (const auto& [tok, id] : model.at("vocab").items()) {
      impl->vocab[tok] = id.get<int32_t>();
      max_id = std::max(max_id, id.get<int32_t>());
    }
    int32_t rank = 0;
    for (const json& m : model.at("merges")) {
      std::string a, b;
      if (m.is_string()) {
        const std::string s = m.get<std::string>();
        const size_t sp = s.find(' ');
        if (sp == std::string::npos) throw std::runtime_error(fmt::format("merge '{}' has no space", s));
        a = s.substr(0, sp);
        b = s.substr(sp + 1);
      } else {
        a = m.at(0).get<std::string>();
        b = m.at(1).get<std::string>();
      }
      impl->merge_rank.emplace(a + std::string(1, '\0') + b, rank++);
    }
    if (j.contains("added_tokens"))
      for (const json& t : j.at("added_tokens")) {
        Added a{t.at("content").get<std::string>(), t.at("id").get<int32_t>(), t.value("special", false),
                t.value("lstrip", false), t.value("rstrip", false)};
        max_id = std::max(max_id, a.id);
        impl->added.push_back(std::move(a));
      }
    std::sort(impl->added.begin(), impl->added.end(),
              [](const Added& x, const Added& y) { return x.content.size() > y.content.size(); });  // longest first
    impl->tokens.assign(static_cast<size_t>(max_id + 1), std::string());
    impl->special.assign(static_cast<size_t>(max_id + 1), false);
    impl->added_id.assign(static_cast<size_t>(max_id + 1), false);
    for (const auto& [tok, id] : impl->vocab) impl->tokens[static_cast<size_t>(id)] = tok;
    for (const Added& a : impl->added) {
      impl->tokens[static_cast<size_t>(a.id)] = a.content;
      impl->special[static_cast<size_t>(a.id)] = a.special;
      impl->added_id[static_cast<size_t>(a.id)] = true;
    }
    if (model.contains("unk_token") && model["unk_token"].is_string())
      if (auto it = impl->vocab.find(model["unk_token"].get<std::string>()); it != impl->vocab.end()) impl->unk = it->second;
    if (!j.contains("pre_tokenizer") || j["pre_tokenizer"].is_null())
      throw std::runtime_error("a tokenizer without a pre-tokenizer is not supported");
    impl->add_step(j.at("pre_tokenizer"));
    return std::unique_ptr<Tokenizer>(new Tokenizer(std::move(impl)));
  } catch (const std::exception& e) {
    *error = fmt::format("{}: {}", path, e.what());
    return nullptr;
  }
}

bool Tokenizer::encode(std::string_view text, std::vector<int32_t>* ids, std::string* error, bool special) const {
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
  if (sp_) return sp_->encode(text, ids, error);
  try {
    auto encode_plain = [&](std::string_view seg) {
      if (seg.empty()) return;
      for (const std::string& piece : impl_->pre_tokenize(seg)) impl_->bpe(piece, ids);
    };
    size_t start = 0, i = 0;
    while (i < text.size()) {
      const Added* hit = nullptr;
      if (special)
        for (const Added& a : impl_->added)
          if (!a.content.empty() && text.compare(i, a.content.size(), a.content) == 0) {
            hit = &a;
            break;
          }
      if (!hit) {
        ++i;
        continue;
      }
      size_t seg_end = i;
      if (hit->lstrip)
        while (seg_end > start && is_space(static_cast<unsigned char>(text[seg_end - 1]))) --seg_end;
      encode_plain(text.substr(start, seg_end - start));
      ids->push_back(hit->id);
      i += hit->content.size();
      if (hit->rstrip)
        while (i < text.size() && is_space(static_cast<unsigned char>(text[i]))) ++i;
      start = i;
    }
    encode_plain(text.substr(start));
  } catch (const std::exception& e) {
    *error = e.what();
    return false;
  }
  return true;
}

std::string Tokenizer::token_bytes(int32_t id) const {
  if (sp_) return sp_->token_bytes(id);
  if (id < 0 || static_cast<size_t>(id) >= impl_->tokens.size()) return {};
  const std::string& t = impl_->tokens[static_cast<size_t>(id)];
  if (impl_->added_id[static_cast<size_t>(id)]) return t;
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

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special) const {
  if (sp_) return sp_->decode(ids);  // the library drops control symbols either way
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
