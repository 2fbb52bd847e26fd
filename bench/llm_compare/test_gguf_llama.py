"""bench/llm_compare/gguf_llama.py: the GGUF writer behind the 1 B Llama comparison with llama.cpp (issue 38,
item 6). The oracle for its "same weights" claim: llama.cpp loads the written file and its logits match
transformers' eager on the same (tiny, seeded) weights; a file written without llama.cpp's q/k row permutation
does not match (the check can fail). Needs llama-cpp-python (bench/llm_compare/requirements.txt), which CI does not
install (a 30-minute source build), so this test lives with the benchmark and is not skipped when it is missing: it
fails. Run it before the benchmark:

    .venv/bin/python -m pytest bench/llm_compare/test_gguf_llama.py -q -p no:cacheprovider
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

import gguf  # noqa: F401  (a missing oracle package fails the run)
import llama_cpp  # noqa: F401
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gguf_llama  # noqa: E402

TOKENS = [3, 17, 250, 300, 42, 7, 311, 128]


def tiny(tied: bool, dtype, qk_scale: float = 10.0):
    from transformers import LlamaConfig, LlamaForCausalLM

    # GQA (4 query heads, 2 kv heads) so that q and k are permuted with different head counts; a vocabulary
    # above the 256 byte tokens of the stand-in tokenizer
    cfg = LlamaConfig(vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=64,
                      rms_norm_eps=1e-5, rope_theta=500000.0, tie_word_embeddings=tied, bos_token_id=1,
                      eos_token_id=2)
    torch.manual_seed(7)
    model = LlamaForCausalLM(cfg).to(dtype)
    with torch.no_grad():  # norms away from 1 so that a misplaced norm weight shows; q and k large enough
        for n, p in model.named_parameters():  # that attention is far from uniform (the rotary layout matters)
            if "norm" in n:
                p.copy_(1 + 0.5 * torch.rand_like(p))
            elif "q_proj" in n or "k_proj" in n:
                p.mul_(qk_scale)
    return model.state_dict(), cfg


@pytest.mark.parametrize("tied,dtype", [(True, torch.bfloat16), (False, torch.float32)])
def test_llama_cpp_matches_eager(tmp_path, tied, dtype):
    sd, cfg = tiny(tied, dtype)
    path = tmp_path / "tiny.gguf"
    gguf_llama.write_gguf(sd, cfg, path)
    got = gguf_llama.llama_cpp_logits(path, TOKENS, threads=1)
    ref = gguf_llama.eager_logits(sd, cfg, TOKENS)
    assert got.shape == ref.shape == (len(TOKENS), cfg.vocab_size)
    c = gguf_llama.compare(got, ref)
    # f32: llama.cpp's f32 products (its KV cache is f16); bf16: it also rounds activations to bf16 for bf16
    # products
    assert c["min_cosine"] > (0.99999 if dtype == torch.float32 else 0.999), c
    assert c["max_diff_over_std"] < (1e-2 if dtype == torch.float32 else 0.1), c
    assert c["argmax_agree"] == len(TOKENS), c


def test_without_permutation_does_not_match(tmp_path, monkeypatch):
    """The comparison above can fail: the same file written without the q/k permutation disagrees."""
    sd, cfg = tiny(True, torch.float32)
    monkeypatch.setattr(gguf_llama, "permute_rows", lambda w, n_head: w)
    path = tmp_path / "unpermuted.gguf"
    gguf_llama.write_gguf(sd, cfg, path)
    c = gguf_llama.compare(gguf_llama.llama_cpp_logits(path, TOKENS, threads=1),
                           gguf_llama.eager_logits(sd, cfg, TOKENS))
    assert c["max_diff_over_std"] > 0.2 and c["min_cosine"] < 0.999, c


def test_quantize_q4_0(tmp_path):
    """llama.cpp's own quantizer on the written file: a Q4_0 file it loads, close to the bf16 one's logits."""
    import gguf

    sd, cfg = tiny(True, torch.bfloat16, qk_scale=1.0)  # transformers' initialisation: int4 error stays small
    src, dst = tmp_path / "tiny.gguf", tmp_path / "tiny.q4_0.gguf"
    gguf_llama.write_gguf(sd, cfg, src)
    gguf_llama.quantize(src, dst, "q4_0", threads=1)
    types = {t.name: t.tensor_type for t in gguf.GGUFReader(str(dst)).tensors}
    assert types["blk.0.attn_q.weight"] == gguf.GGMLQuantizationType.Q4_0
    c = gguf_llama.compare(gguf_llama.llama_cpp_logits(dst, TOKENS, threads=1),
                           gguf_llama.eager_logits(sd, cfg, TOKENS))
    assert c["min_cosine"] > 0.95, c


def test_quantize_q4_0_with_imatrix(tmp_path):
    """quantize(..., imatrix=): llama.cpp's quantizer takes the importance per input column. The invariant: with a
    few columns of blk.0.ffn_up made important, its Q4_0 weights (read back and dequantized by the gguf package) have
    a lower importance-weighted squared error than without the imatrix, and the other tensors are unchanged."""
    import gguf
    import numpy as np
    from gguf.quants import dequantize

    sd, cfg = tiny(True, torch.float32, qk_scale=1.0)
    src = tmp_path / "tiny.gguf"
    gguf_llama.write_gguf(sd, cfg, src)
    k = cfg.hidden_size
    imp = np.full(k, 1e-3, dtype=np.float32)
    imp[::7] = 100.0  # every 7th input column matters
    gguf_llama.quantize(src, tmp_path / "plain.gguf", "q4_0", threads=1)
    gguf_llama.quantize(src, tmp_path / "imat.gguf", "q4_0", threads=1, imatrix={"blk.0.ffn_up.weight": imp})

    def tensors(path):
        return {t.name: dequantize(t.data, t.tensor_type).reshape(-1, k) if t.name == "blk.0.ffn_up.weight"
                else np.array(t.data) for t in gguf.GGUFReader(str(path)).tensors}

    plain, imat = tensors(tmp_path / "plain.gguf"), tensors(tmp_path / "imat.gguf")
    w = sd["model.layers.0.mlp.up_proj.weight"].numpy()

    def weighted(q):
        return float((((w - q) ** 2) * imp).sum())

    e_plain, e_imat = weighted(plain["blk.0.ffn_up.weight"]), weighted(imat["blk.0.ffn_up.weight"])
    print(f"imatrix: weighted error {e_imat:.4g} vs {e_plain:.4g} without")
    assert e_imat < 0.7 * e_plain, (e_imat, e_plain)
    for name in plain:
        if name != "blk.0.ffn_up.weight":
            assert np.array_equal(plain[name], imat[name]), name
