// The steps around BPE (see tokenizer_impl.h): normalizers, pre-tokenizers (PCRE2 regex splits),
// decoders, read from a tokenizer.json and run on a text.
#include "tokenizer_impl.h"

#include <fmt/format.h>

#include <algorithm>
#include <optional>

namespace kiln::tok {
namespace hf {

Regex::Regex(const std::string& pattern) {
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

Regex::~Regex() {
  pcre2_match_context_free(mctx);
  pcre2_code_free(code);
}

std::vector<std::pair<size_t, size_t>> Regex::matches(std::string_view s) const {
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

namespace {

// GPT-2's pre-tokenizer pattern (ByteLevel with use_regex).
constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

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

std::string escape_regex(std::string_view literal) {
  std::string re;
  for (char c : literal) {
    if (std::string_view("\\^$.|?*+()[]{}").find(c) != std::string_view::npos) re += '\\';
    re += c;
  }
  return re;
}

// The type of `p`, a pre-tokenizer, normalizer or decoder (`kind`); a Sequence of them (its list
// under `list_key`) is handed to `add` item by item, one level deeper, and has none (nullopt).
template <class Add>
std::optional<std::string> step_type(const json& p, int depth, const std::string& kind, const char* list_key, Add add) {
  if (depth > kMaxStepDepth) fail(fmt::format("{} Sequences nested deeper than {} levels", kind, kMaxStepDepth));
  const std::string type = string_of(member(p, "type", ("a " + kind).c_str()), ("a " + kind + "'s type").c_str());
  if (type != "Sequence") return type;
  const std::string seq = "a Sequence " + kind;
  const json& list = member(p, list_key, seq.c_str());
  if (!list.is_array()) fail(fmt::format("{}'s '{}' is not a list", seq, list_key));
  for (const json& q : list) add(q, depth + 1);
  return std::nullopt;
}

// The regex of a Split pre-tokenizer's or a Replace normalizer's pattern (`what`): {"Regex": ...}
// as it is, {"String": ...} escaped.
std::string pattern_regex(const json& p, const std::string& what) {
  const json& pat = member(p, "pattern", what.c_str());
  if (pat.is_object() && pat.contains("Regex")) return string_of(pat.at("Regex"), (what + "'s Regex").c_str());
  return escape_regex(string_of(member(pat, "String", (what + "'s pattern").c_str()), (what + "'s String").c_str()));
}

}  // namespace
}  // namespace hf

using namespace hf;

void Tokenizer::Impl::add_step(const json& p, int depth) {
  const auto of = step_type(p, depth, "pre-tokenizer", "pretokenizers", [&](const json& q, int d) { add_step(q, d); });
  if (!of) return;
  const std::string& type = *of;
  if (type == "ByteLevel") {
    Step s;
    s.kind = Step::Kind::ByteLevel;
    s.prefix_space = flag(p, "add_prefix_space", false, "the ByteLevel pre-tokenizer");
    if (flag(p, "use_regex", true, "the ByteLevel pre-tokenizer")) s.regex = std::make_shared<Regex>(kGpt2Pattern);
    steps.push_back(std::move(s));
    return;
  }
  if (type == "Split") {
    const std::string re = pattern_regex(p, "a Split pre-tokenizer");
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

void Tokenizer::Impl::add_normalizer(const json& p, int depth) {
  const auto of = step_type(p, depth, "normalizer", "normalizers", [&](const json& q, int d) { add_normalizer(q, d); });
  if (!of) return;
  const std::string& type = *of;
  if (type == "Replace") {
    const std::string re = pattern_regex(p, "a Replace normalizer");
    normalizers.push_back({Normalizer::Kind::Replace, std::make_shared<Regex>(re),
                           string_of(member(p, "content", "a Replace normalizer"), "a Replace normalizer's content")});
  } else if (type == "Prepend") {
    normalizers.push_back({Normalizer::Kind::Prepend, nullptr,
                           string_of(member(p, "prepend", "a Prepend normalizer"), "a Prepend normalizer's prepend")});
  } else {
    fail(fmt::format("normalizer '{}' is not supported", type.substr(0, 40)));
  }
}

void Tokenizer::Impl::add_decoder(const json& p, int depth) {
  const auto of = step_type(p, depth, "decoder", "decoders", [&](const json& q, int d) { add_decoder(q, d); });
  if (!of) return;
  const std::string& type = *of;
  Decoder d;
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
std::string Tokenizer::Impl::normalize(std::string_view text) const {
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
std::vector<std::string> Tokenizer::Impl::pre_tokenize(std::string_view text, bool first) const {
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
std::string Tokenizer::Impl::decode_tokens(std::vector<std::string> toks) const {
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

}  // namespace kiln::tok
