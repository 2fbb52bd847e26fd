// Choosing the next token from a row of logits: greedy, or sampled with
// temperature, top-k, top-p (nucleus) and a repetition penalty, from a seeded
// generator (the same seed gives the same tokens). Temperature 0 and top-k 1
// are greedy. Allocates only at construction (vocabulary-sized buffers).
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <vector>

namespace kiln::llm {

struct SamplerOptions {
  float temperature = 0.0f;   // 0: greedy
  int32_t top_k = 0;          // 0: all tokens
  float top_p = 1.0f;         // 1: all tokens
  float repeat_penalty = 1.0f;  // > 1 makes tokens already in `history` less likely (llama.cpp's rule)
  uint64_t seed = 0;
};

class Sampler {
 public:
  Sampler(int32_t vocab, const SamplerOptions& options);
  // The next token for `logits` (vocab floats; not modified) given the tokens so far.
  int32_t next(std::span<const float> logits, std::span<const int32_t> history);

 private:
  SamplerOptions o_;
  std::mt19937_64 rng_;
  std::vector<float> work_;
  std::vector<int32_t> order_;
  std::vector<uint8_t> seen_;
};

// The index of the largest value (the first of equals).
int32_t argmax(std::span<const float> logits);

}  // namespace kiln::llm
