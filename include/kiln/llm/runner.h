// Running an LLM program (forward(tokens[1, T], input_pos[T]) -> logits, its
// KV cache kept in the method's mutable buffers between calls, or passed as
// further inputs that the program updates in place and returns as outputs
// before the logits: the external-cache form), kiln's or ExecuTorch's: the metadata its constant methods carry (get_max_seq_len,
// get_vocab_size, get_bos_id, get_eos_ids / get_eos_id, ...), prefill and
// one-token steps.
#pragma once

#include "kiln/runtime/program.h"

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace kiln::llm {

struct Metadata {
  // The positions the KV cache holds (the prompt and the new tokens together): get_max_context_len, as
  // ExecuTorch's TextLLMRunner reads it, else get_max_seq_len (which that runner reads as the most
  // tokens one call takes, a dynamic program's prefill chunk; kiln reads that from the input's bound).
  int64_t max_seq_len = 0;
  int64_t vocab_size = 0;          // 0: unknown (the logits' width is used)
  std::optional<int64_t> bos;
  std::vector<int64_t> eos;
};

class Runner {
 public:
  // Loads `pte` and prepares "forward"; null and *error (one line) if it is
  // not an LLM program kiln can drive.
  static std::unique_ptr<Runner> load(const std::string& pte, const rt::MethodOptions& options, std::string* error);

  const Metadata& metadata() const { return meta_; }
  int64_t position() const { return pos_; }  // tokens the cache holds
  int64_t vocab() const { return vocab_; }   // logits per position
  int64_t tokens_per_call() const { return dynamic_ ? step_tokens_ : 1; }  // most tokens one forward call takes

  // Feeds `tokens` at the next positions (one call per token when the program
  // takes one); *logits points at the last position's row. False and *error
  // when the cache would overflow or the program fails; the state is then the
  // one before the call's failing token.
  bool feed(std::span<const int32_t> tokens, std::span<const float>* logits, std::string* error);

  // Starts over at position 0 (what the cache holds past the position is
  // overwritten before it is read again, and masked until then).
  void reset() { pos_ = 0; }

 private:
  Runner() = default;
  std::unique_ptr<rt::Program> program_;
  std::unique_ptr<rt::Method> method_;
  Metadata meta_;
  int64_t pos_ = 0, step_tokens_ = 1, vocab_ = 0;
  size_t logits_output_ = 0;  // external caches come first among the outputs
  bool pos_is_vector_ = true;
  bool dynamic_ = false;  // T symbolic (1..step_tokens_): a prompt in whole calls
  std::vector<int64_t> tok_buf_, pos_buf_;
  std::vector<float> wide_;  // 16-bit logits' last row, widened
  std::span<const float> last_row();
};

}  // namespace kiln::llm
