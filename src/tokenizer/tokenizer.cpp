// BPE from a Hugging Face tokenizer.json, byte-level or SentencePiece-style (see tokenizer.h).
#include "kiln/tokenizer/tokenizer.h"

#include "one_line.h"
#include "sentencepiece.h"
#include "tokenizer_impl.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <limits>

namespace kiln::tok {
namespace hf {

[[noreturn]] void fail(const std::string& what) { throw std::runtime_error(what); }

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

namespace {

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

}  // namespace
}  // namespace hf

using namespace hf;

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
