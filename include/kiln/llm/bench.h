// kiln bench-llm: prefill and decode throughput of an LLM program (what
// llama-bench measures for llama.cpp), on fixed pseudo-random token ids: no
// tokenizer, no sampling; every call is the program's forward.
#pragma once

#include "kiln/runtime/program.h"

#include <cstdint>
#include <string>
#include <vector>

namespace kiln::llm {

struct BenchOptions {
  int64_t prefill_tokens = 128;  // -p: tokens fed before decoding (0: no prefill test)
  int64_t decode_tokens = 128;   // -n: tokens decoded one call each after them (0: no decode test)
  std::vector<int> threads{1};
  int reps = 3;
  std::string engine = "kiln";   // XNNPACK delegates: kiln or xnnpack
  uint64_t seed = 1;
};

struct BenchRow {
  int threads = 0;
  std::vector<double> prefill_tps, decode_tps;  // one value per repetition (tokens/s)
  double prefill_median = 0, decode_median = 0;
};

struct BenchReport {
  int64_t max_seq_len = 0, vocab = 0, tokens_per_call = 1;
  double load_ms = 0;  // loading the program and its forward method, first thread count
  std::vector<BenchRow> rows;
};

// Parses "1,2,4" (each >= 1); false and *error (one line) otherwise.
bool parse_thread_list(const std::string& text, std::vector<int>* threads, std::string* error);

// Runs the benchmark on `pte`: per thread count, one warm-up pass then `reps`
// passes of prefill (p tokens from position 0) followed by decode (n tokens).
// False and *error (one line) when the file is not an LLM program kiln can
// drive, or p + n does not fit its cache.
bool bench_llm(const std::string& pte, const BenchOptions& options, BenchReport* report, std::string* error);

}  // namespace kiln::llm
