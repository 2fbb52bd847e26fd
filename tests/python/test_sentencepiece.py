"""SentencePiece models in kiln (src/tokenizer/sentencepiece.cpp, through Debian's
libsentencepiece) against the `sentencepiece` package: models trained here
(BPE and unigram, byte fallback on), the same ids and the same decoded text for
a fixed multilingual text; `kiln generate --tokenizer X.model` on a tiny Llama
gives transformers' greedy tokens for the prompt the package encodes."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from conftest import REPO, run_export, run_kiln

CORPUS = """The quick brown fox jumps over the lazy dog. It's 2026, naïve café — 日本語のテキストです。
    def f(x):
\treturn x ** 2  # a comment, with    spaces
emoji 😀🚀 and ZWJ 👩‍💻, accents ÀÉÎÕÜ, Ελληνικά, русский, العربية, हिन्दी, 中文分词测试。
1234567890 3.14159 -42 1e-5 0x1F; I'm sure they'll've done it, we'd, you're.
"""

TEXTS = [
    "Hello world! It's 2026, naïve café — 日本語 tokens.\n\n  spaces",
    "    def f(x):\n\treturn x**2  # comment\r\n",
    "emoji 😀🚀 and ZWJ 👩‍💻, accents ÀÉÎÕÜ, Ελληνικά, русский, العربية, हिन्दी",
    "unseen characters: 한국어 ไทย ᚠᛇᚻ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 ∀x∈ℝ",
    "whitespace   runs\t\t\tand\n\n\nnewlines   ",
    "   leading and trailing   ",
    "1234567890 3.14159 -42 1e-5 0x1F",
    "",
]


def _train(out: Path, model_type: str, vocab_size: int, byte_fallback: bool) -> Path:
    import sentencepiece as spm

    corpus = out / "corpus.txt"
    corpus.write_text((CORPUS * 20), encoding="utf-8")
    prefix = out / f"sp_{model_type}_{vocab_size}"
    spm.SentencePieceTrainer.train(input=str(corpus), model_prefix=str(prefix), model_type=model_type,
                                   vocab_size=vocab_size, byte_fallback=byte_fallback, character_coverage=1.0,
                                   hard_vocab_limit=False, user_defined_symbols=["<tool>"], minloglevel=2,
                                   num_threads=1)
    return prefix.with_suffix(".model")


@pytest.fixture(scope="module", params=["bpe", "unigram"])
def sp_model(request, tmp_path_factory) -> Path:
    return _train(tmp_path_factory.mktemp(f"sp_{request.param}"), request.param, 400, True)


def test_encode_decode_match_sentencepiece(sp_model, tmp_path):
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(sp_model))
    for text in TEXTS + ["<tool> user-defined symbol <tool>x"]:
        ref = sp.encode(text)
        f = tmp_path / "text.txt"
        f.write_bytes(text.encode("utf-8"))
        got = json.loads(run_kiln("tokenize", "--tokenizer", sp_model, "--file", f, "--json").stdout)["ids"]
        assert got == ref, (text, got, ref)
        if text:
            # byte-fallback pieces must be in there (the CJK/emoji the 400-piece model has not kept)
            dec = json.loads(run_kiln("tokenize", "--tokenizer", sp_model, "--decode", ",".join(map(str, ref)),
                                      "--json").stdout)["text"]
            assert dec == sp.decode(ref), (dec, sp.decode(ref))
    ids = sp.encode(TEXTS[3])
    assert any(sp.is_byte(i) for i in ids), "the test text should need byte fallback"
    # control symbols: dropped by decoding, as the package does
    ctl = [sp.bos_id()] + sp.encode("abc") + [sp.eos_id()]
    dec = json.loads(run_kiln("tokenize", "--tokenizer", sp_model, "--decode", ",".join(map(str, ctl)),
                              "--json").stdout)["text"]
    assert dec == sp.decode(ctl) == "abc"


def test_bad_sentencepiece_input_is_one_clear_line(sp_model, tmp_path):
    junk = tmp_path / "junk.model"
    junk.write_bytes(b"\x0a\x03abc not a protobuf \xff\xff\xff")
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"ok \xff\xfe not utf-8")
    for args, message in [([junk, "--text", "x"], "nor a SentencePiece model"),
                          ([sp_model, "--file", bad], "not valid UTF-8"),
                          ([sp_model, "--decode", "400000"], "is not a token id")]:
        proc = run_kiln("tokenize", "--tokenizer", *args, check=False)
        assert proc.returncode == 1 and message in proc.stderr, (args, proc.returncode, proc.stderr)
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    """(tiny Llama .pte (portable, vocab 256, bos 1, eos 2), its eager model)."""
    sys.path.insert(0, str(REPO / "python"))
    from kiln_export import llm

    out = tmp_path_factory.mktemp("tiny_llama_sp")
    argv = ["--arch", "llama", "--config", "tiny", "--max-seq-len", "64", "--out", str(out)]
    run_export("llm", *argv)
    pte = out / "tiny.pte"
    run_kiln("lower", "--spec", out / "model_spec.json", "--backend", "portable", "--out", pte, "-q")
    model, _, _ = llm.build_model(llm.parse(argv))  # the same seeded weights
    return pte, model


def test_generate_with_a_sentencepiece_model(tiny_llama, tmp_path):
    import sentencepiece as spm
    import torch

    pte, model = tiny_llama
    # 256 pieces, SentencePiece's default ids (unk 0, bos 1, eos 2) = the tiny config's
    small = _train(tmp_path, "bpe", 256, False)
    sp = spm.SentencePieceProcessor(model_file=str(small))
    assert sp.get_piece_size() == 256 and (sp.bos_id(), sp.eos_id()) == (1, 2)
    text = "The quick brown fox"
    prompt = [sp.bos_id()] + sp.encode(text)
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(12):
            nxt = int(model(torch.tensor([ids])).logits[0, -1].argmax())
            if nxt == sp.eos_id():
                break
            ids.append(nxt)
    ref = ids[len(prompt):]
    got = json.loads(run_kiln("generate", pte, "--tokenizer", small, "--prompt", text, "--max-new-tokens", "12",
                              "--json").stdout)
    assert got["prompt_tokens"] == len(prompt)
    assert got["tokens"] == ref, (got["tokens"], ref)
    whole, head = sp.decode(prompt[1:] + ref), sp.decode(prompt[1:])
    assert whole.startswith(head) and got["text"] == whole[len(head):], (got["text"], whole, head)

    # a SentencePiece model larger than the model's vocabulary is refused
    (tmp_path / "big").mkdir()
    big = _train(tmp_path / "big", "bpe", 400, True)
    proc = run_kiln("generate", pte, "--tokenizer", big, "--prompt", text, check=False)
    assert proc.returncode == 1 and "not this model's tokenizer" in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
