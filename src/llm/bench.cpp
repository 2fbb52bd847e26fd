#include "kiln/llm/bench.h"

#include "kiln/llm/runner.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <random>

namespace kiln::llm {
namespace {

using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

// Feeds `tokens` one call at a time (decode) or all at once (prefill); tokens/s.
bool timed_feed(Runner& r, std::span<const int32_t> tokens, bool one_by_one, double* tps, std::string* error) {
  std::span<const float> logits;
  const auto t0 = Clock::now();
  if (one_by_one) {
    for (size_t i = 0; i < tokens.size(); ++i)
      if (!r.feed(tokens.subspan(i, 1), &logits, error)) return false;
  } else if (!r.feed(tokens, &logits, error)) {
    return false;
  }
  const double s = std::chrono::duration<double>(Clock::now() - t0).count();
  *tps = s > 0 ? static_cast<double>(tokens.size()) / s : 0;
  return true;
}

}  // namespace

bool parse_thread_list(const std::string& text, std::vector<int>* threads, std::string* error) {
  threads->clear();
  size_t at = 0;
  while (true) {
    const size_t comma = text.find(',', at);
    const std::string item = text.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
    char* end = nullptr;
    const long v = item.empty() ? 0 : std::strtol(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || v < 1 || v > 1024) {
      *error = fmt::format("--threads: '{}' is not a comma-separated list of thread counts from 1 to 1024 (e.g. 1,2)", text);
      return false;
    }
    threads->push_back(static_cast<int>(v));
    if (comma == std::string::npos) return true;
    at = comma + 1;
  }
}

bool bench_llm(const std::string& pte, const BenchOptions& o, BenchReport* report, std::string* error) {
  if (o.prefill_tokens < 0 || o.decode_tokens < 0 || o.prefill_tokens + o.decode_tokens < 1) {
    *error = "-p and -n must be >= 0 and not both 0";
    return false;
  }
  if (o.reps < 1) {
    *error = "--reps must be >= 1";
    return false;
  }
  if (o.threads.empty()) {
    *error = "--threads: no thread count given";
    return false;
  }
  *report = BenchReport{};
  for (int t : o.threads) {
    rt::MethodOptions mo;
    mo.backend.threads = static_cast<size_t>(t);
    mo.backend.engine = o.engine.c_str();
    const auto l0 = Clock::now();
    auto runner = Runner::load(pte, mo, error);
    if (!runner) return false;
    if (report->rows.empty()) {
      report->load_ms = std::chrono::duration<double, std::milli>(Clock::now() - l0).count();
      report->max_seq_len = runner->metadata().max_seq_len;
      report->vocab = runner->vocab();
      report->tokens_per_call = runner->tokens_per_call();  // > 1: a dynamic T (a prompt in whole calls)
      if (o.prefill_tokens + o.decode_tokens > report->max_seq_len) {
        *error = fmt::format("{}: -p {} + -n {} = {} tokens do not fit the model's KV cache ({} positions)", pte,
                             o.prefill_tokens, o.decode_tokens, o.prefill_tokens + o.decode_tokens,
                             report->max_seq_len);
        return false;
      }
    }
    // fixed pseudo-random ids (the same for every thread count and repetition)
    std::mt19937_64 rng(o.seed);
    std::uniform_int_distribution<int32_t> id(0, static_cast<int32_t>(runner->vocab() - 1));
    std::vector<int32_t> prompt(static_cast<size_t>(o.prefill_tokens)), gen(static_cast<size_t>(o.decode_tokens));
    for (int32_t& x : prompt) x = id(rng);
    for (int32_t& x : gen) x = id(rng);
    BenchRow row;
    row.threads = t;
    for (int rep = -1; rep < o.reps; ++rep) {  // rep -1: warm-up, not recorded
      runner->reset();
      double pp = 0, tg = 0;
      if (!prompt.empty() && !timed_feed(*runner, prompt, false, &pp, error)) return false;
      if (!gen.empty() && !timed_feed(*runner, gen, true, &tg, error)) return false;
      if (rep < 0) continue;
      if (!prompt.empty()) row.prefill_tps.push_back(pp);
      if (!gen.empty()) row.decode_tps.push_back(tg);
    }
    row.prefill_median = median(row.prefill_tps);
    row.decode_median = median(row.decode_tps);
    report->rows.push_back(std::move(row));
  }
  return true;
}

}  // namespace kiln::llm
