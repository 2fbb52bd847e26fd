// libFuzzer target: arbitrary bytes as a tokenizer file through Tokenizer::load
// (src/tokenizer/tokenizer.cpp: tokenizer.json; anything that is not JSON goes to the
// SentencePiece reader, src/tokenizer/sentencepiece.cpp), then encode and decode of a few
// texts (ASCII, Unicode, special-token text, a long word) and decode of every id, so the
// loaded tables are used. The tokenizer API returns errors; any exception, crash,
// sanitizer report, leak or hang is a finding, as is an encoded id outside the vocabulary
// or an error that is not one line. Answers are checked by tests/python/test_tokenizer.py.
#include "fuzz_input.h"
#include "kiln/tokenizer/tokenizer.h"

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

const std::string kTexts[] = {
    "Hello world! 12345 don't stop",
    "  leading\tand\ntrailing  ",
    "na\xc3\xafve caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e \xf0\x9f\x98\x80",
    "<|endoftext|><s></s><bos><eos><unk><pad><|im_start|>x<|im_end|> <0x41>",
    std::string(300, 'a') + " " + std::string(200, '9'),
    "",
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const char* path = kiln::fuzz::write_input(data, size);
  std::string error;
  std::unique_ptr<kiln::tok::Tokenizer> tok = kiln::tok::Tokenizer::load(path, &error);
  if (!tok) {
    if (error.empty() || error.find('\n') != std::string::npos) std::abort();  // one line, always
    return 0;
  }
  const int32_t vocab = tok->vocab_size();
  for (const std::string& text : kTexts)
    for (bool special : {true, false}) {
      std::vector<int32_t> ids;
      error.clear();
      if (!tok->encode(text, &ids, &error, special, 4096)) {
        if (error.empty()) std::abort();
        continue;
      }
      for (int32_t id : ids)
        if (id < 0 || id >= vocab) std::abort();  // an id outside the vocabulary
      (void)tok->decode(ids, false);
      (void)tok->decode(ids, true);
    }
  std::vector<int32_t> all;
  for (int32_t id = 0; id < vocab && id < 4096; ++id) {
    all.push_back(id);
    (void)tok->token_bytes(id);
    (void)tok->is_special(id);
  }
  (void)tok->decode(all, false);
  const int32_t outside[] = {-1, vocab, vocab + 1, INT32_MAX, INT32_MIN};
  (void)tok->decode(outside, false);
  for (int32_t id : outside) (void)tok->token_bytes(id);
  (void)tok->id_of("<|endoftext|>");
  (void)tok->bos_id();
  (void)tok->eos_id();
  return 0;
}
