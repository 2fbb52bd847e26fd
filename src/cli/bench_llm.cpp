// kiln bench-llm: llama-bench-style prefill/decode tokens/s of an LLM program (behaviour in src/llm/bench.cpp).
#include "commands.h"
#include "kiln/core/error.h"
#include "kiln/llm/bench.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <memory>

namespace kiln::cli {
namespace {

struct BenchLlmOptions {
  std::string pte, threads = "1", engine = "kiln";
  int64_t prefill = 128, decode = 128;
  int reps = 3;
  bool json = false;
};

int run_bench_llm(const BenchLlmOptions& o) {
  llm::BenchOptions bo;
  std::string error;
  check(llm::parse_thread_list(o.threads, &bo.threads, &error), "{}", error);
  for (int t : bo.threads) check_threads(t);  // and each count under the one --threads rule (commands.h)
  bo.prefill_tokens = o.prefill;
  bo.decode_tokens = o.decode;
  bo.reps = o.reps;
  bo.engine = o.engine;
  llm::BenchReport r;
  check(llm::bench_llm(o.pte, bo, &r, &error), "{}", error);
  const char* note = r.tokens_per_call > 1 ? "the program takes a dynamic token count: prefill is one call per prompt"
                                           : "the program takes one token per forward call: prefill is one call per "
                                             "prompt token";
  if (o.json) {
    nlohmann::json rows = nlohmann::json::array();
    for (const llm::BenchRow& row : r.rows) {
      nlohmann::json j = {{"threads", row.threads}};
      j["prefill_tokens_per_s"] = o.prefill > 0 ? nlohmann::json(row.prefill_median) : nlohmann::json();
      j["decode_tokens_per_s"] = o.decode > 0 ? nlohmann::json(row.decode_median) : nlohmann::json();
      j["prefill_runs"] = row.prefill_tps;
      j["decode_runs"] = row.decode_tps;
      rows.push_back(std::move(j));
    }
    nlohmann::json j = {{"model", o.pte}, {"engine", o.engine}, {"max_seq_len", r.max_seq_len}, {"vocab", r.vocab},
                        {"tokens_per_call", r.tokens_per_call}, {"prefill_tokens", o.prefill},
                        {"decode_tokens", o.decode}, {"reps", o.reps}, {"load_ms", r.load_ms}, {"note", note},
                        {"results", rows}};
    fmt::print("{}\n", j.dump());
    return 0;
  }
  fmt::print("kiln bench-llm {}: KV cache {} positions, vocab {}, engine {}; median of {} repetitions after a warm-up\n",
             o.pte, r.max_seq_len, r.vocab, o.engine, o.reps);
  fmt::print("note: {}\n\n", note);
  fmt::print("| threads | test | tokens/s (median) | min | max |\n|--------:|:-----|------------------:|----:|----:|\n");
  for (const llm::BenchRow& row : r.rows) {
    auto line = [&](const char* test, int64_t n, const std::vector<double>& v, double med) {
      if (n <= 0) return;
      fmt::print("| {:7} | {}{} | {:17.2f} | {:.2f} | {:.2f} |\n", row.threads, test, n, med,
                 *std::min_element(v.begin(), v.end()), *std::max_element(v.begin(), v.end()));
    };
    line("pp", o.prefill, row.prefill_tps, row.prefill_median);
    line("tg", o.decode, row.decode_tps, row.decode_median);
  }
  return 0;
}

}  // namespace

void add_bench_llm_options(CLI::App* cmd, std::function<int()>& run) {
  auto o = bind_action(cmd, run, run_bench_llm);
  cmd->add_option("pte", o->pte, "the LLM .pte (kiln's or ExecuTorch's; forward(tokens, input_pos) -> logits)")->required();
  cmd->add_option("-p,--prompt-tokens", o->prefill, "prefill: tokens fed from position 0 (0: skip)")->capture_default_str();
  cmd->add_option("-n,--gen-tokens", o->decode, "decode: tokens after the prompt, one call each (0: skip)")->capture_default_str();
  cmd->add_option("--threads", o->threads, "comma-separated thread counts, one row each")->capture_default_str();
  cmd->add_option("-r,--reps", o->reps, "repetitions (the median is reported)")->capture_default_str();
  cmd->add_option("--engine", o->engine, "XNNPACK delegates: kiln or xnnpack")->check(CLI::IsMember({"kiln", "xnnpack"}))->capture_default_str();
  cmd->add_flag("--json", o->json, "print one JSON object instead of the table");
}

}  // namespace kiln::cli
