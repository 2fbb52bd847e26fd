// Chat templates: the Jinja subset Hugging Face models' templates use
// (chat_template in tokenizer_config.json, or chat_template.jinja), rendered
// the way transformers' apply_chat_template renders them (trim_blocks and
// lstrip_blocks on). kiln's own small engine: no Debian package renders
// Jinja from C++. Supported: {{ }}, {% if/elif/else %}, {% for [a, b] in %}
// with loop.*, {% set %} (names and namespace attributes), {#- -#} and the
// whitespace-control dashes; literals, lists, dicts, subscripts, slices,
// attributes, + - * / // % ~, comparisons, in, is [not] defined/none/string/
// number/mapping/iterable, and/or/not, conditional expressions; filters trim,
// length, upper, lower, tojson, string, first, last, join, default, items,
// capitalize, replace, list; string methods strip/lstrip/rstrip/startswith/
// endswith/split/upper/lower/replace/title, dict items/keys/values/get;
// namespace(), range(), raise_exception(). jinja2 is the oracle in tests.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

namespace kiln::tok {

struct ChatMessage {
  std::string role, content;
};

class ChatTemplate {
 public:
  // Parses `source`; null and *error (one line) if it does not parse.
  static std::unique_ptr<ChatTemplate> parse(const std::string& source, std::string* error);
  ~ChatTemplate();

  // Renders with `messages`, `add_generation_prompt` and the string variables
  // in `vars` (bos_token, eos_token, ...). False and *error on a render error
  // (including the template's own raise_exception).
  bool render(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
              const std::map<std::string, std::string>& vars, std::string* out, std::string* error) const;

 private:
  struct Impl;
  explicit ChatTemplate(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The chat template and its variables beside a tokenizer.json: `template_path`
// if given, else chat_template.jinja, else tokenizer_config.json's
// chat_template; bos_token, eos_token etc. from tokenizer_config.json.
struct ChatConfig {
  std::string source;                       // the template text
  std::map<std::string, std::string> vars;  // bos_token, eos_token, pad_token, unk_token
};
bool load_chat_config(const std::string& tokenizer_json, const std::string& template_path, ChatConfig* out,
                      std::string* error);

}  // namespace kiln::tok
