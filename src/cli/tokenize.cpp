// kiln tokenize: a tokenizer.json's ids for a text, or the text of ids.
#include "commands.h"
#include "kiln/core/error.h"
#include "kiln/tokenizer/chat_template.h"
#include "kiln/tokenizer/tokenizer.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <iterator>
#include <memory>
#include <sstream>

namespace kiln::cli {
namespace {

struct TokenizeOptions {
  std::string tokenizer, text, file, decode, chat_template, system, messages;
  bool no_special = false, json = false, chat = false, print_prompt = false;
};

// The prompt a chat model sees: the text as the user's message (after --system),
// or the --messages list, through the model's chat template.
std::string chat_prompt(const TokenizeOptions& o, const std::string& text) {
  tok::ChatConfig cfg;
  std::string error;
  check(tok::load_chat_config(o.tokenizer, o.chat_template, &cfg, &error), "{}", error);
  auto tmpl = tok::ChatTemplate::parse(cfg.source, &error);
  check(tmpl != nullptr, "{}", error);
  std::vector<tok::ChatMessage> msgs;
  if (!o.messages.empty()) {
    std::ifstream in(o.messages);
    check(static_cast<bool>(in), "{}: cannot open", o.messages);
    nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
    check(j.is_array(), "{}: --messages takes a JSON list of {{\"role\": ..., \"content\": ...}}", o.messages);
    for (const auto& m : j) {
      check(m.is_object() && m.contains("role") && m["role"].is_string() && m.contains("content") && m["content"].is_string(),
            "{}: every message needs string 'role' and 'content'", o.messages);
      msgs.push_back({m["role"].get<std::string>(), m["content"].get<std::string>()});
    }
  } else {
    if (!o.system.empty()) msgs.push_back({"system", o.system});
    msgs.push_back({"user", text});
  }
  std::string prompt;
  check(tmpl->render(msgs, true, cfg.vars, &prompt, &error), "{}", error);
  return prompt;
}

int run_tokenize(const TokenizeOptions& o) {
  std::string error;
  auto tok = tok::Tokenizer::load(o.tokenizer, &error);
  check(tok != nullptr, "{}", error);
  if (!o.decode.empty()) {
    std::vector<int32_t> ids;
    std::stringstream ss(o.decode);
    for (std::string item; std::getline(ss, item, ',');) {
      char* end = nullptr;
      const long v = std::strtol(item.c_str(), &end, 10);
      check(end != item.c_str() && *end == '\0' && v >= 0 && v < tok->vocab_size(),
            "--decode: '{}' is not a token id (0 .. {})", item, tok->vocab_size() - 1);
      ids.push_back(static_cast<int32_t>(v));
    }
    const std::string text = tok->decode(ids, o.no_special);
    if (o.json) fmt::print("{}\n", nlohmann::json({{"text", text}}).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
    else fmt::print("{}\n", text);
    return 0;
  }
  std::string text = o.text;
  if (!o.file.empty()) {
    std::ifstream in(o.file, std::ios::binary);
    check(static_cast<bool>(in), "{}: cannot open", o.file);
    text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  if (o.chat || !o.messages.empty()) text = chat_prompt(o, text);
  if (o.print_prompt) {
    fmt::print("{}", text);
    return 0;
  }
  std::vector<int32_t> ids;
  check(tok->encode(text, &ids, &error, !o.no_special), "{}", error);
  if (o.json) {
    fmt::print("{}\n", nlohmann::json({{"ids", ids}}).dump());
  } else {
    for (size_t i = 0; i < ids.size(); ++i) fmt::print("{}{}", i ? " " : "", ids[i]);
    fmt::print("\n");
  }
  return 0;
}

}  // namespace

void add_tokenize_options(CLI::App* cmd, std::function<int()>& run) {
  auto o = bind_action(cmd, run, run_tokenize);
  cmd->add_option("--tokenizer", o->tokenizer, "Hugging Face tokenizer.json (byte-level BPE) or a SentencePiece .model")->required();
  auto* text = cmd->add_option("--text", o->text, "the text to encode");
  auto* file = cmd->add_option("--file", o->file, "a UTF-8 file to encode")->excludes(text);
  cmd->add_option("--decode", o->decode, "comma-separated ids to decode instead")->excludes(text)->excludes(file);
  cmd->add_flag("--no-special", o->no_special, "encode: special tokens in the text are plain text; decode: drop them");
  cmd->add_flag("--json", o->json, "print JSON ({\"ids\": [...]} or {\"text\": ...})");
  cmd->add_flag("--chat", o->chat, "wrap the text as the user's message with the model's chat template");
  cmd->add_option("--system", o->system, "--chat: a system message before it");
  cmd->add_option("--messages", o->messages, "a JSON list of {role, content} messages through the chat template");
  cmd->add_option("--chat-template", o->chat_template,
                  "the template (default: chat_template.jinja or tokenizer_config.json beside the tokenizer)");
  cmd->add_flag("--print-prompt", o->print_prompt, "print the text that would be encoded (after the chat template)");
}

}  // namespace kiln::cli
