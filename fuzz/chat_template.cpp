// libFuzzer target: arbitrary bytes as a chat template (the Jinja subset of
// src/tokenizer/chat_template.cpp) parsed and rendered with a few conversations, with and
// without the generation prompt. The API returns errors; any exception, crash, sanitizer
// report, leak or hang (the engine bounds recursion, loops and sizes) is a finding.
#include "fuzz_input.h"
#include "kiln/tokenizer/chat_template.h"

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::vector<std::vector<kiln::tok::ChatMessage>> conversations = {
      {{"user", "What is 12+30?"}},
      {{"system", "  Be brief.  "}, {"user", "Hello there!"}, {"assistant", "Hi. How can I help?"},
       {"user", "Write a haiku\nabout tokens?!"}},
      {},
  };
  static const std::map<std::string, std::string> vars = {
      {"bos_token", "<s>"}, {"eos_token", "</s>"}, {"pad_token", "<pad>"}, {"unk_token", "<unk>"}};
  const std::string source(reinterpret_cast<const char*>(data), size);
  std::string error;
  std::unique_ptr<kiln::tok::ChatTemplate> t = kiln::tok::ChatTemplate::parse(source, &error);
  if (!t) {
    if (error.empty() || error.find('\n') != std::string::npos) std::abort();  // one line, always
    return 0;
  }
  for (const auto& messages : conversations)
    for (bool generation_prompt : {false, true}) {
      std::string out;
      error.clear();
      if (!t->render(messages, generation_prompt, vars, &out, &error))
        if (error.empty() || error.find('\n') != std::string::npos) std::abort();
    }
  return 0;
}
