#include "kiln/llm/runner.h"

#include <algorithm>
#include <cstring>

#include <fmt/format.h>

namespace kiln::llm {
namespace {

// The single value a constant method returns, if the program has that method.
std::optional<rt::EValue> constant(const rt::Program& p, const char* name, std::vector<int64_t>* ints = nullptr) {
  rt::ErrorMessage err;
  auto m = p.load_method(name, &err);
  if (!m.ok() || m.value().num_inputs() != 0 || m.value().num_outputs() == 0) return std::nullopt;
  if (m.value().execute(&err) != rt::Status::Ok) return std::nullopt;
  if (ints)
    for (size_t i = 0; i < m.value().num_outputs(); ++i)
      if (m.value().output_value(i).tag == rt::EValue::Tag::Int) ints->push_back(m.value().output_value(i).to_int());
  return m.value().output_value(0);
}

}  // namespace

std::unique_ptr<Runner> Runner::load(const std::string& pte, const rt::MethodOptions& options, std::string* error) {
  rt::ErrorMessage err;
  auto program = rt::Program::load(pte.c_str(), &err);
  if (!program.ok()) {
    *error = fmt::format("{}: {}", pte, err.c_str());
    return nullptr;
  }
  std::unique_ptr<Runner> r(new Runner());
  r->program_ = std::make_unique<rt::Program>(std::move(program.value()));
  auto m = r->program_->load_method("forward", options, &err);
  if (!m.ok()) {
    *error = fmt::format("{}: {}", pte, err.c_str());
    return nullptr;
  }
  r->method_ = std::make_unique<rt::Method>(std::move(m.value()));
  rt::Method& f = *r->method_;
  auto not_llm = [&](const std::string& why) {
    *error = fmt::format("{}: not an LLM program kiln can drive (forward(tokens[1, T], input_pos) -> logits): {}", pte, why);
    return nullptr;
  };
  // Inputs past the first two are external caches: each returned, updated in place, as one of the outputs
  // before the logits (the input's own tensor), so the runner sets them never and no step copies them.
  const size_t caches = f.num_inputs() >= 2 ? f.num_inputs() - 2 : 0;
  if (f.num_inputs() < 2 || f.num_outputs() != caches + 1)
    return not_llm(fmt::format("forward takes {} inputs and returns {} outputs", f.num_inputs(), f.num_outputs()));
  for (size_t i = 0; i < caches; ++i)
    if (!f.output_is_tensor(i) || f.output(i).data != f.input(2 + i).data)
      return not_llm(fmt::format("input {} (an external cache) is not updated in place as output {}", 2 + i, i));
  r->logits_output_ = caches;
  const rt::Tensor& tok = f.input(0);
  const rt::Tensor& pos = f.input(1);
  if (tok.dtype != ScalarType::Long || tok.dim != 2 || tok.size(0) != 1) return not_llm("input 0 is not int64 tokens [1, T]");
  if (pos.dtype != ScalarType::Long || pos.dim != 1) return not_llm("input 1 is not int64 positions");
  r->step_tokens_ = tok.size(1);
  // A dynamic token count (export --dynamic): a prompt goes in whole, in calls of up to the bound.
  r->dynamic_ = f.input_is_dynamic(0) && f.input_is_dynamic(1);
  if (r->step_tokens_ != 1 && !r->dynamic_)
    return not_llm(fmt::format("forward takes {} tokens a call; kiln generate needs a program that takes one (export "
                               "with a sequence length of 1)", r->step_tokens_));
  r->pos_is_vector_ = pos.size(0) == r->step_tokens_;
  const rt::Tensor& logits = f.output(r->logits_output_);
  if ((logits.dtype != ScalarType::Float && logits.dtype != ScalarType::BFloat16 && logits.dtype != ScalarType::Half) ||
      logits.dim < 2)
    return not_llm("the output is not float32, bfloat16 or float16 logits");
  r->vocab_ = logits.size(logits.dim - 1);
  if (auto v = constant(*r->program_, "get_max_context_len"); v && v->tag == rt::EValue::Tag::Int)
    r->meta_.max_seq_len = v->to_int();
  else if (auto s = constant(*r->program_, "get_max_seq_len"); s && s->tag == rt::EValue::Tag::Int)
    r->meta_.max_seq_len = s->to_int();
  if (auto v = constant(*r->program_, "get_vocab_size"); v && v->tag == rt::EValue::Tag::Int) r->meta_.vocab_size = v->to_int();
  if (auto v = constant(*r->program_, "get_bos_id"); v && v->tag == rt::EValue::Tag::Int) r->meta_.bos = v->to_int();
  if (!constant(*r->program_, "get_eos_ids", &r->meta_.eos)) constant(*r->program_, "get_eos_id", &r->meta_.eos);
  if (r->meta_.max_seq_len <= 0) return not_llm("it has no get_max_context_len or get_max_seq_len constant method");
  if (r->meta_.vocab_size > 0 && r->meta_.vocab_size != r->vocab_)
    return not_llm(fmt::format("get_vocab_size says {} but the logits have {}", r->meta_.vocab_size, r->vocab_));
  r->tok_buf_.assign(static_cast<size_t>(r->step_tokens_), 0);
  r->pos_buf_.assign(static_cast<size_t>(pos.size(0)), 0);
  return r;
}

bool Runner::feed(std::span<const int32_t> tokens, std::span<const float>* logits, std::string* error) {
  rt::Method& f = *method_;
  if (dynamic_ && !tokens.empty()) {  // whole chunks: checked first, so a refused chunk changes nothing
    for (size_t at = 0; at < tokens.size();) {
      const size_t n = std::min(tokens.size() - at, static_cast<size_t>(step_tokens_));
      if (pos_ + static_cast<int64_t>(n) > meta_.max_seq_len) {
        *error = fmt::format("the KV cache is full ({} positions); the prompt and the new tokens must fit in it",
                             meta_.max_seq_len);
        return false;
      }
      for (size_t i = 0; i < n; ++i) {
        const int32_t t = tokens[at + i];
        if (t < 0 || t >= vocab_) {
          *error = fmt::format("token id {} is out of the model's range (0 .. {})", t, vocab_ - 1);
          return false;
        }
        tok_buf_[i] = t;
        pos_buf_[i] = pos_ + static_cast<int64_t>(i);
      }
      const int64_t tok_shape[2] = {1, static_cast<int64_t>(n)};
      const int64_t pos_shape[1] = {static_cast<int64_t>(n)};
      rt::ErrorMessage err;
      if (f.set_input(0, tok_buf_.data(), n * sizeof(int64_t), tok_shape, &err) != rt::Status::Ok ||
          f.set_input(1, pos_buf_.data(), n * sizeof(int64_t), pos_shape, &err) != rt::Status::Ok ||
          f.execute(&err) != rt::Status::Ok) {
        *error = fmt::format("forward at positions {}..{}: {}", pos_, pos_ + static_cast<int64_t>(n) - 1, err.c_str());
        return false;
      }
      pos_ += static_cast<int64_t>(n);
      at += n;
    }
    *logits = last_row();
    return true;
  }
  for (int32_t t : tokens) {
    if (pos_ >= meta_.max_seq_len) {
      *error = fmt::format("the KV cache is full ({} positions); the prompt and the new tokens must fit in it", meta_.max_seq_len);
      return false;
    }
    if (t < 0 || t >= vocab_) {
      *error = fmt::format("token id {} is out of the model's range (0 .. {})", t, vocab_ - 1);
      return false;
    }
    tok_buf_[0] = t;
    pos_buf_[0] = pos_;
    rt::ErrorMessage err;
    if (f.set_input(0, tok_buf_.data(), tok_buf_.size() * sizeof(int64_t), &err) != rt::Status::Ok ||
        f.set_input(1, pos_buf_.data(), pos_buf_.size() * sizeof(int64_t), &err) != rt::Status::Ok ||
        f.execute(&err) != rt::Status::Ok) {
      *error = fmt::format("forward at position {}: {}", pos_, err.c_str());
      return false;
    }
    ++pos_;
  }
  *logits = last_row();
  return true;
}

std::span<const float> Runner::last_row() {
  const rt::Tensor& out = method_->output(logits_output_);
  const int64_t at = (out.numel / vocab_ - 1) * vocab_;
  if (out.dtype == ScalarType::Float)
    return {static_cast<const float*>(out.data) + at, static_cast<size_t>(vocab_)};
  // 16-bit logits (a bfloat16 / float16 program that returns its own type): the row widened, exactly
  wide_.resize(static_cast<size_t>(vocab_));
  const auto* row = static_cast<const std::byte*>(out.data) + at * 2;
  for (int64_t i = 0; i < vocab_; ++i) {
    if (out.dtype == ScalarType::BFloat16) {  // the top half of a float32
      uint16_t b;
      std::memcpy(&b, row + 2 * i, 2);
      const uint32_t u = static_cast<uint32_t>(b) << 16;
      std::memcpy(&wide_[static_cast<size_t>(i)], &u, 4);
    } else {
      uint16_t h;
      std::memcpy(&h, row + 2 * i, 2);
      wide_[static_cast<size_t>(i)] = half_bits_to_float_exact(h);
    }
  }
  return wide_;
}

}  // namespace kiln::llm
