// A small Jinja engine for chat templates (see chat_template.h for the subset).
// The engine is jinja.h's; this file is the API: parse, render, and the files a template comes in.
#include "kiln/tokenizer/chat_template.h"

#include "one_line.h"

#include "jinja.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <sstream>

namespace kiln::tok {

using namespace jinja;

struct ChatTemplate::Impl {
  Body body;
};

ChatTemplate::ChatTemplate(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ChatTemplate::~ChatTemplate() = default;

std::unique_ptr<ChatTemplate> ChatTemplate::parse(const std::string& source, std::string* err) {
  try {
    if (source.size() > kMaxSourceBytes) error(fmt::format("the template is over {} MiB", kMaxSourceBytes >> 20));
    auto impl = std::make_unique<Impl>();
    impl->body = parse_template(source);
    return std::unique_ptr<ChatTemplate>(new ChatTemplate(std::move(impl)));
  } catch (const std::bad_alloc&) {
    *err = "chat template: out of memory";
    return nullptr;
  } catch (const std::exception& e) {
    *err = fmt::format("chat template: {}", one_line(e.what()));
    return nullptr;
  }
}

bool ChatTemplate::render(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                          const std::map<std::string, std::string>& vars, std::string* out, std::string* err) const {
  int64_t work_left = kMaxWork;
  struct WorkScope {  // the budget counts while this render runs on this thread
    int64_t* saved;
    explicit WorkScope(int64_t* w) : saved(t_work) { t_work = w; }
    ~WorkScope() { t_work = saved; }
  } work_scope(&work_left);
  try {
    Scope sc;
    sc.frames.emplace_back();
    ListT msgs;
    for (const ChatMessage& m : messages) msgs.push_back(Value::dict({{"role", Value::str(m.role)}, {"content", Value::str(m.content)}}));
    sc.set("messages", Value::list(std::move(msgs)));
    sc.set("add_generation_prompt", Value::boolean(add_generation_prompt));
    for (const auto& [k, v] : vars) sc.set(k, Value::str(v));
    sc.frames.emplace_back();  // the template's own sets
    out->clear();
    jinja::render(impl_->body, sc, *out);
    return true;
  } catch (const std::bad_alloc&) {
    *err = "chat template: out of memory";
  } catch (const std::exception& e) {
    *err = fmt::format("chat template: {}", one_line(e.what()));
  }
  out->clear();
  return false;
}

bool load_chat_config(const std::string& tokenizer_json, const std::string& template_path, ChatConfig* out,
                      std::string* err) {
  namespace fs = std::filesystem;
  // A whole file, if it is a regular file of at most `limit` bytes (else false and *err).
  auto slurp = [err](const fs::path& p, std::string* text, uintmax_t limit) {
    std::error_code ec;
    if (!fs::is_regular_file(p, ec)) {
      *err = fmt::format("{}: cannot open (not a file)", p.string());
      return false;
    }
    const uintmax_t size = fs::file_size(p, ec);
    if (ec || size > limit) {
      *err = ec ? fmt::format("{}: cannot read ({})", p.string(), ec.message())
                : fmt::format("{}: {} bytes; kiln reads at most {} MiB", p.string(), size, limit >> 20);
      return false;
    }
    std::ifstream in(p, std::ios::binary);
    if (!in) {
      *err = fmt::format("{}: cannot open", p.string());
      return false;
    }
    std::stringstream ss;
    ss << in.rdbuf();
    *text = ss.str();
    return true;
  };
  const fs::path dir = fs::path(tokenizer_json).parent_path();
  out->source.clear();
  out->vars.clear();
  std::error_code ec;
  const fs::path config = dir / "tokenizer_config.json";
  if (fs::is_regular_file(config, ec)) {
    std::string text;
    if (!slurp(config, &text, kMaxConfigBytes)) return false;
    nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
    if (j.is_discarded() || !j.is_object()) {
      *err = fmt::format("{}: not a JSON object", config.string());
      return false;
    }
    for (const char* k : {"bos_token", "eos_token", "pad_token", "unk_token"}) {
      if (!j.contains(k)) continue;
      const auto& v = j[k];
      if (v.is_string()) out->vars[k] = v.get<std::string>();
      else if (v.is_object() && v.contains("content") && v["content"].is_string()) out->vars[k] = v["content"].get<std::string>();
    }
    if (j.contains("chat_template") && j["chat_template"].is_string()) out->source = j["chat_template"].get<std::string>();
  }
  if (!template_path.empty()) {
    if (!slurp(template_path, &out->source, kMaxSourceBytes)) return false;
  } else if (fs::is_regular_file(dir / "chat_template.jinja", ec)) {
    if (!slurp(dir / "chat_template.jinja", &out->source, kMaxSourceBytes)) return false;
  }
  if (out->source.empty()) {
    *err = fmt::format("no chat template beside {} (chat_template.jinja or tokenizer_config.json's chat_template); "
                       "give one with --chat-template", tokenizer_json);
    return false;
  }
  return true;
}

}  // namespace kiln::tok
