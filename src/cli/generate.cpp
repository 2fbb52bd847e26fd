// kiln generate: text in, text out, streaming, on an LLM program (kiln's or ExecuTorch's).
#include "commands.h"
#include "kiln/core/error.h"
#include "kiln/llm/runner.h"
#include "kiln/llm/sampler.h"
#include "kiln/tokenizer/chat_template.h"
#include "kiln/tokenizer/tokenizer.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>

namespace kiln::cli {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

struct GenerateOptions {
  std::string pte, tokenizer, prompt, prompt_file, system, chat_template, engine = "kiln";
  std::vector<std::string> stop;
  bool chat = false, json = false, ignore_eos = false;
  int max_new_tokens = 128, threads = 1, top_k = 0;
  float temperature = 0.0f, top_p = 1.0f, repeat_penalty = 1.0f;
  uint64_t seed = 0;
};

double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

// tokenizer.json (else a SentencePiece tokenizer.model) beside the .pte, or in a tokenizer/ folder there.
std::string default_tokenizer(const std::string& pte) {
  const fs::path dir = fs::path(pte).parent_path();
  std::error_code ec;
  for (const fs::path& d : {dir, dir / "tokenizer"})
    for (const char* name : {"tokenizer.json", "tokenizer.model"})
      if (fs::is_regular_file(d / name, ec)) return (d / name).string();
  return {};
}

int run_generate(const GenerateOptions& o) {
  check_threads(o.threads);
  check(o.max_new_tokens >= 0, "--max-new-tokens must be >= 0");
  check(o.temperature >= 0, "--temperature must be >= 0");
  check(o.top_p > 0 && o.top_p <= 1, "--top-p must be in (0, 1]");
  check(o.repeat_penalty > 0, "--repeat-penalty must be > 0");
  std::string prompt = o.prompt;
  if (!o.prompt_file.empty()) {
    std::ifstream in(o.prompt_file, std::ios::binary);
    check(static_cast<bool>(in), "{}: cannot open the prompt file", o.prompt_file);
    prompt.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  check(!prompt.empty(), "the prompt is empty (give --prompt TEXT or --prompt-file FILE)");
  const std::string tok_path = o.tokenizer.empty() ? default_tokenizer(o.pte) : o.tokenizer;
  check(!tok_path.empty(), "{}: no tokenizer.json beside it (nor tokenizer.model); give --tokenizer PATH", o.pte);
  std::string error;
  auto tok = tok::Tokenizer::load(tok_path, &error);
  check(tok != nullptr, "{}", error);

  if (o.chat) {
    tok::ChatConfig cfg;
    check(tok::load_chat_config(tok_path, o.chat_template, &cfg, &error), "{}", error);
    auto tmpl = tok::ChatTemplate::parse(cfg.source, &error);
    check(tmpl != nullptr, "{}", error);
    std::vector<tok::ChatMessage> msgs;
    if (!o.system.empty()) msgs.push_back({"system", o.system});
    msgs.push_back({"user", prompt});
    std::string rendered;
    check(tmpl->render(msgs, true, cfg.vars, &rendered, &error), "{}", error);
    prompt = std::move(rendered);
  }

  rt::MethodOptions mo;
  mo.backend.threads = static_cast<size_t>(o.threads);
  mo.backend.engine = o.engine.c_str();
  auto runner = llm::Runner::load(o.pte, mo, &error);
  check(runner != nullptr, "{}", error);
  check(tok->vocab_size() <= runner->vocab(), "{}: the tokenizer has {} tokens but the model's logits have {}: not this "
        "model's tokenizer", tok_path, tok->vocab_size(), runner->vocab());

  // The prompt (with BOS) must leave the KV cache room for one new token: encoding
  // stops as soon as it is longer than that, so a long prompt is refused quickly.
  std::vector<int32_t> ids;
  const int64_t max_seq = runner->metadata().max_seq_len;
  const int64_t bos_len = tok->bos_id() ? 1 : 0;
  const size_t limit = static_cast<size_t>(std::max<int64_t>(max_seq - 1 - bos_len, 0));
  check(tok->encode(prompt, &ids, &error, true, limit), "{}", error);
  check(ids.size() <= limit, "the prompt is more than {} tokens; the model's KV cache holds {} (leave room "
        "for at least one new token)", limit + static_cast<size_t>(bos_len), max_seq);
  if (auto bos = tok->bos_id()) ids.insert(ids.begin(), *bos);  // a SentencePiece model's prompts start with BOS
  check(!ids.empty(), "the prompt encodes to no tokens");

  // stop tokens: the program's eos ids, else the tokenizer's eos token
  std::vector<int32_t> eos;
  for (int64_t e : runner->metadata().eos) eos.push_back(static_cast<int32_t>(e));
  if (eos.empty() && tok->eos_id()) eos.push_back(*tok->eos_id());
  if (eos.empty()) {
    tok::ChatConfig cfg;
    std::string ignored;
    tok::load_chat_config(tok_path, "", &cfg, &ignored);
    if (auto it = cfg.vars.find("eos_token"); it != cfg.vars.end())
      if (auto id = tok->id_of(it->second)) eos.push_back(*id);
  }

  const auto t0 = Clock::now();
  std::span<const float> logits;
  check(runner->feed(ids, &logits, &error), "{}", error);
  const double prefill_ms = ms_since(t0);

  llm::Sampler sampler(static_cast<int32_t>(runner->vocab()),
                       {o.temperature, o.top_k, o.top_p, o.repeat_penalty, o.seed});
  std::vector<int32_t> history = ids, generated;
  std::string text;    // all generated text
  size_t printed = 0;  // bytes of it written to stdout (complete characters only)
  double ttft_ms = 0;
  const auto d0 = Clock::now();
  for (int n = 0; n < o.max_new_tokens; ++n) {
    const int32_t next = sampler.next(logits, history);
    if (n == 0) ttft_ms = ms_since(t0);
    if (!o.ignore_eos && std::find(eos.begin(), eos.end(), next) != eos.end()) break;
    history.push_back(next);
    generated.push_back(next);
    const std::string piece = tok->is_special(next) ? std::string() : tok->token_bytes(next);
    const size_t before = text.size();
    text += piece;
    bool stopped = false;
    for (const std::string& st : o.stop) {
      if (st.empty()) continue;
      const size_t from = before >= st.size() ? before - st.size() + 1 : 0;  // a match must end in the new piece
      if (const size_t at = text.find(st, from); at != std::string::npos) {
        text.resize(at);
        stopped = true;
      }
    }
    if (!o.json && text.size() > printed) {
      const size_t ready = stopped ? text.size() - printed : tok::complete_utf8_prefix(std::string_view(text).substr(printed));
      std::fwrite(text.data() + printed, 1, ready, stdout);
      std::fflush(stdout);
      printed += ready;
    }
    if (stopped || n + 1 == o.max_new_tokens || runner->position() >= max_seq) break;  // done, or the cache is full
    check(runner->feed(std::span<const int32_t>(&next, 1), &logits, &error), "{}", error);
  }
  const double decode_ms = ms_since(d0);
  const double prefill_tps = prefill_ms > 0 ? 1e3 * static_cast<double>(ids.size()) / prefill_ms : 0;
  // decode: the steps after the first sampled token (each one forward call)
  const double decode_steps = generated.size() > 1 ? static_cast<double>(generated.size() - 1) : 0;
  const double decode_tps = decode_ms > 0 && decode_steps > 0 ? 1e3 * decode_steps / decode_ms : 0;
  if (o.json) {
    nlohmann::json j = {{"text", text}, {"prompt_tokens", ids.size()}, {"generated_tokens", generated.size()},
                        {"ttft_ms", ttft_ms}, {"prefill_tokens_per_s", prefill_tps}, {"decode_tokens_per_s", decode_tps},
                        {"peak_rss_mb", peak_rss_mb()}, {"tokens", generated}};
    fmt::print("{}\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
  } else {
    if (text.size() > printed) std::fwrite(text.data() + printed, 1, text.size() - printed, stdout);
    fmt::print("\n");
    std::fflush(stdout);
    fmt::print(stderr, "kiln generate: {} prompt tokens, {} new; time to first token {:.1f} ms; prefill {:.1f} tok/s, "
               "decode {:.1f} tok/s; peak RSS {:.0f} MB\n", ids.size(), generated.size(), ttft_ms, prefill_tps,
               decode_tps, peak_rss_mb());
  }
  return 0;
}

}  // namespace

void add_generate_options(CLI::App* cmd, std::function<int()>& run) {
  auto o = bind_action(cmd, run, run_generate);
  cmd->add_option("pte", o->pte, "the LLM .pte (forward(tokens, input_pos) -> logits, KV cache inside)")->required();
  cmd->add_option("--tokenizer", o->tokenizer, "tokenizer.json or SentencePiece tokenizer.model (default: beside the .pte)");
  auto* p = cmd->add_option("--prompt", o->prompt, "the prompt text");
  cmd->add_option("--prompt-file", o->prompt_file, "read the prompt from a file")->excludes(p);
  cmd->add_flag("--chat", o->chat, "wrap the prompt with the model's chat template (a user turn)");
  cmd->add_option("--system", o->system, "--chat: a system message");
  cmd->add_option("--chat-template", o->chat_template, "--chat: the template file (default: beside the tokenizer)");
  cmd->add_option("--max-new-tokens", o->max_new_tokens, "tokens to generate at most")->capture_default_str();
  cmd->add_option("--temperature", o->temperature, "0: greedy")->capture_default_str();
  cmd->add_option("--top-k", o->top_k, "sample among the k likeliest (0: all)")->capture_default_str();
  cmd->add_option("--top-p", o->top_p, "sample within probability mass p")->capture_default_str();
  cmd->add_option("--repeat-penalty", o->repeat_penalty, "> 1 discourages repeating tokens")->capture_default_str();
  cmd->add_option("--seed", o->seed, "sampling seed (same seed, same text)")->capture_default_str();
  cmd->add_option("--stop", o->stop, "stop when the text contains this (repeatable)");
  cmd->add_flag("--ignore-eos", o->ignore_eos, "keep generating past the end-of-sequence token (benchmarks, tests)");
  cmd->add_option("--threads", o->threads, "threads")->capture_default_str();
  cmd->add_option("--engine", o->engine, "XNNPACK delegates: kiln or xnnpack")->check(CLI::IsMember({"kiln", "xnnpack"}))->capture_default_str();
  cmd->add_flag("--json", o->json, "print one JSON object (text, prompt_tokens, generated_tokens, ttft_ms, "
                "prefill_tokens_per_s, decode_tokens_per_s, peak_rss_mb) instead of streaming");
}

}  // namespace kiln::cli
