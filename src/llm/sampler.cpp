#include "kiln/llm/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace kiln::llm {

int32_t argmax(std::span<const float> logits) {
  int32_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i)
    if (logits[i] > logits[static_cast<size_t>(best)]) best = static_cast<int32_t>(i);
  return best;
}

Sampler::Sampler(int32_t vocab, const SamplerOptions& options)
    : o_(options), rng_(options.seed), work_(static_cast<size_t>(vocab)), order_(static_cast<size_t>(vocab)),
      seen_(static_cast<size_t>(vocab), 0) {}

int32_t Sampler::next(std::span<const float> logits, std::span<const int32_t> history) {
  const size_t n = std::min(logits.size(), work_.size());
  std::copy(logits.begin(), logits.begin() + static_cast<std::ptrdiff_t>(n), work_.begin());
  std::span<float> w(work_.data(), n);
  if (o_.repeat_penalty != 1.0f) {  // llama.cpp: divide positive logits, multiply negative ones, once per token
    for (int32_t t : history)
      if (t >= 0 && static_cast<size_t>(t) < n && !seen_[static_cast<size_t>(t)]) {
        seen_[static_cast<size_t>(t)] = 1;
        float& v = w[static_cast<size_t>(t)];
        v = v > 0 ? v / o_.repeat_penalty : v * o_.repeat_penalty;
      }
    for (int32_t t : history)
      if (t >= 0 && static_cast<size_t>(t) < n) seen_[static_cast<size_t>(t)] = 0;
  }
  if (o_.temperature <= 0.0f || o_.top_k == 1) return argmax(w);
  // candidates by logit, largest first (only the top k sorted when k is set)
  std::span<int32_t> idx(order_.data(), n);
  std::iota(idx.begin(), idx.end(), 0);
  size_t k = o_.top_k > 0 ? std::min<size_t>(static_cast<size_t>(o_.top_k), n) : n;
  auto by_logit = [&](int32_t a, int32_t b) {
    const float x = w[static_cast<size_t>(a)], y = w[static_cast<size_t>(b)];
    return x > y || (x == y && a < b);
  };
  if (k < n) std::partial_sort(idx.begin(), idx.begin() + static_cast<std::ptrdiff_t>(k), idx.end(), by_logit);
  else std::sort(idx.begin(), idx.end(), by_logit);
  // softmax over the candidates at the temperature
  const float top = w[static_cast<size_t>(idx[0])];
  double total = 0;
  for (size_t i = 0; i < k; ++i) {
    const float p = std::exp((w[static_cast<size_t>(idx[i])] - top) / o_.temperature);
    w[static_cast<size_t>(idx[i])] = p;
    total += p;
  }
  // nucleus: the smallest prefix whose probability reaches top_p
  if (o_.top_p < 1.0f) {
    double acc = 0;
    size_t keep = 0;
    while (keep < k) {
      acc += w[static_cast<size_t>(idx[keep])] / total;
      ++keep;
      if (acc >= o_.top_p) break;
    }
    k = std::max<size_t>(keep, 1);
    total = 0;
    for (size_t i = 0; i < k; ++i) total += w[static_cast<size_t>(idx[i])];
  }
  std::uniform_real_distribution<double> u(0.0, total);
  double r = u(rng_), acc = 0;
  for (size_t i = 0; i < k; ++i) {
    acc += w[static_cast<size_t>(idx[i])];
    if (r < acc) return idx[i];
  }
  return idx[k - 1];
}

}  // namespace kiln::llm
