"""bench/llm_compare/gguf_gemma4.py: the GGUF writer behind the Gemma 4 E2B comparison with llama.cpp (issue 38,
item 6). Oracles: torch.export.load for the .pt2 reader; transformers' own fp32 Gemma4ForCausalLM for the eager
reference the E2B check uses; llama.cpp loading the written file and matching that reference on tiny seeded
weights with every E2B feature (per-layer embeddings, KV-shared layers, sliding and global layers with
proportional RoPE, double-wide MLPs, soft-capping); a file written with a wrong RoPE table does not match (the
check can fail). Needs llama-cpp-python (bench/llm_compare/requirements.txt), which CI does not install, so this
test lives with the benchmark and fails (is not skipped) when it is missing:

    .venv/bin/python -m pytest bench/llm_compare/test_gguf_gemma4.py -q -p no:cacheprovider -n 0
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import gguf  # noqa: F401  (a missing oracle package fails the run)
import llama_cpp  # noqa: F401
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))
import gguf_gemma4  # noqa: E402
from kiln_export import gemma4  # noqa: E402

# 12 tokens: past the tiny configuration's sliding window of 8, so the sliding layers' window matters
TOKENS = [3, 17, 250, 300, 42, 7, 311, 128, 5, 9, 400, 33]


def tiny(dtype):
    """kiln_export's tiny Gemma 4 (every E2B feature at width 64), norms and layer scalars moved away from 1 so
    that a misplaced one shows."""
    model = gemma4.build("tiny", 3, "eager", dtype=dtype)
    with torch.no_grad():
        for n, p in list(model.named_parameters()) + list(model.named_buffers()):
            if "norm" in n or n.endswith("layer_scalar"):
                p.copy_(1 + 0.5 * torch.rand_like(p))
    return model.state_dict(), gemma4.config("tiny"), model


def test_pt2_weights_match_torch_export_load(tmp_path):
    """The memory-mapped reader against torch.export.load, for both writers (torch's and kiln_export's)."""
    from kiln_export import pt2_writer

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(40, 16, dtype=torch.bfloat16)
            self.lin = torch.nn.Linear(16, 24, bias=True, dtype=torch.bfloat16)
            self.head = torch.nn.Linear(16, 40, bias=False, dtype=torch.bfloat16)
            self.head.weight = self.emb.weight  # tied: one record, two names
            self.register_buffer("scale", torch.tensor([1.5, 2.5], dtype=torch.float32))

        def forward(self, ids):
            h = self.emb(ids)
            return self.head(h), self.lin(h) * self.scale[0]

    torch.manual_seed(0)
    ep = torch.export.export(M().eval(), (torch.tensor([[1, 2, 3]]),))
    for name, save in [("torch", torch.export.save), ("kiln", pt2_writer.save)]:
        path = tmp_path / f"{name}.pt2"
        save(ep, str(path))
        ref = torch.export.load(str(path)).state_dict
        got = gguf_gemma4.pt2_weights(path)
        assert set(got) == set(ref), name
        for k in ref:
            assert got[k].dtype == ref[k].dtype and torch.equal(got[k], ref[k]), (name, k)


def test_eager_reference_is_transformers_fp32():
    """eager_logits (weights widened per call) is transformers' fp32 model on the widened weights, exactly."""
    sd, cfg, _ = tiny(torch.bfloat16)
    got = gguf_gemma4.eager_logits(sd, cfg, TOKENS)
    model = gemma4.build("tiny", 3, "eager", dtype=torch.float32)
    model.load_state_dict({k: v.float() for k, v in sd.items()})
    with torch.no_grad():
        ref = model(torch.tensor([TOKENS]), use_cache=False).logits[0].numpy()
    np.testing.assert_array_equal(got, ref)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_llama_cpp_matches_eager(tmp_path, dtype):
    sd, cfg, _ = tiny(dtype)
    path = tmp_path / "tiny.gguf"
    gguf_gemma4.write_gguf(sd, cfg, path)
    got = gguf_gemma4.llama_cpp_logits(path, TOKENS, threads=1)
    ref = gguf_gemma4.eager_logits(sd, cfg, TOKENS)
    assert got.shape == ref.shape == (len(TOKENS), cfg.vocab_size)
    c = gguf_gemma4.compare(got, ref)
    # f32: llama.cpp's f32 products (its KV cache is f16); bf16: it also rounds activations for bf16 products
    assert c["min_cosine"] > (0.9999 if dtype == torch.float32 else 0.999), c
    assert c["max_diff_over_std"] < (0.02 if dtype == torch.float32 else 0.1), c
    assert c["argmax_agree"] == len(TOKENS) or c["argmax_disagree_ref_margin"] < c["max_abs_diff"], c


def test_wrong_rope_table_does_not_match(tmp_path, monkeypatch):
    """The comparison above can fail: the global layers rotating every pair (no proportional-RoPE table)."""
    sd, cfg, _ = tiny(torch.float32)
    monkeypatch.setattr(gguf_gemma4, "rope_freqs", lambda cfg: np.ones(gguf_gemma4.global_head_dim(cfg) // 2,
                                                                      dtype=np.float32))
    path = tmp_path / "wrong_rope.gguf"
    gguf_gemma4.write_gguf(sd, cfg, path)
    c = gguf_gemma4.compare(gguf_gemma4.llama_cpp_logits(path, TOKENS, threads=1),
                            gguf_gemma4.eager_logits(sd, cfg, TOKENS))
    assert c["max_diff_over_std"] > 0.05 and c["min_cosine"] < 0.9999, c


def test_quantize(tmp_path):
    """llama.cpp's own quantizer on the written file: files it loads, with the types asked, whose logits track
    the reference (each token at position 0): Q8_0 closely; Q4_0 loosely (int4 groups at width 64 on random
    weights: cosine ~0.83 measured, against ~0 for unrelated logits)."""
    import gguf

    sd, cfg, _ = tiny(torch.bfloat16)
    src = tmp_path / "tiny.gguf"
    gguf_gemma4.write_gguf(sd, cfg, src)
    ref = gguf_gemma4.eager_logits(sd, cfg, TOKENS, separate=True)
    for q, qtype, floor in [("q8_0", gguf.GGMLQuantizationType.Q8_0, 0.99),
                            ("q4_0", gguf.GGMLQuantizationType.Q4_0, 0.5)]:
        dst = tmp_path / f"tiny.{q}.gguf"
        gguf_gemma4.quantize(src, dst, q, threads=1)
        types = {t.name: t.tensor_type for t in gguf.GGUFReader(str(dst)).tensors}
        assert types["blk.0.attn_q.weight"] == qtype and types["blk.4.ffn_down.weight"] == qtype
        assert "per_layer_token_embd.weight" in types and "rope_freqs.weight" in types
        c = gguf_gemma4.compare(gguf_gemma4.llama_cpp_logits(dst, TOKENS, threads=1, separate=True), ref)
        assert c["min_cosine"] > floor, (q, c)
