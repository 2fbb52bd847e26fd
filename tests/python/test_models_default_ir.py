"""More architectures exported with plain `torch.export.export` (default IR, the libraries' defaults):
their graphs hold in-place operators (`*=`, `+=`, masked_fill_, ...) and non-core operators (chunk,
repeat_interleave, _weight_norm, unbind) that functionalization and the decomposition table lower.

Tiny seeded configurations; for each, both backends, kiln's runtime and ExecuTorch's runtime running
kiln's .pte, every output within 1e-4 x max|ref| of eager. The later architectures (GPT-NeoX, Falcon,
BLOOM, Swin, ConvNeXt, Mixtral with transformers' default grouped-mm experts) also have ExecuTorch's own
lowering beside kiln's, its .pte run in both runtimes against eager: for the portable backend only, as
ExecuTorch's XNNPACK lowering of each costs 20-90 s of CI time on this machine (kiln's lowering: well under a
second). ExecuTorch refuses Mixtral's default MoE (transformers' grouped_mm custom operator is not core
ATen), which kiln decomposes (decompositions.cpp).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from conftest import assert_close, et_execute, et_lower, run_kiln
from test_xnnpack_runtime import kiln_run


def export_program(module: nn.Module, example: tuple, out: Path, name: str) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    module.eval()
    with torch.no_grad():
        ep = torch.export.export(module, example)
        ref = module(*example)
    torch.export.save(ep, out / f"{name}.pt2")
    refs = list(ref) if isinstance(ref, tuple) else [ref]
    inputs, outputs = [], []
    for i, x in enumerate(example):
        np.save(out / f"{name}_input{i}.npy", x.numpy())
        inputs.append({"name": f"in{i}", "dtype": str(x.dtype).removeprefix("torch."), "shape": list(x.shape),
                       "reference": f"{name}_input{i}.npy"})
    for i, y in enumerate(refs):
        np.save(out / f"{name}_expected_output{i}.npy", y.numpy())
        outputs.append({"name": f"out{i}", "dtype": str(y.dtype).removeprefix("torch."), "shape": list(y.shape),
                        "reference": f"{name}_expected_output{i}.npy"})
    spec = {"name": name, "model_id": f"tests/{name}", "seq_len": 8, "exported_program": f"{name}.pt2",
            "ir": "default", "inputs": inputs, "outputs": outputs}
    (out / "model_spec.json").write_text(json.dumps(spec))
    return out / "model_spec.json"


class _FirstOutput(nn.Module):
    def __init__(self, model, key="input_ids"):
        super().__init__()
        self.model, self.key = model, key

    def forward(self, x):
        return self.model(**{self.key: x}, return_dict=False)[0]


COMMON = dict(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
              max_position_embeddings=64)


def ids(n=8):
    return torch.randint(0, 256, (1, n), generator=torch.Generator().manual_seed(1))


def pixels():
    return torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(3))


def build(name: str):
    import transformers as tf

    torch.manual_seed(0)
    if name == "mistral":
        return _FirstOutput(tf.MistralForCausalLM(tf.MistralConfig(**COMMON, num_key_value_heads=2, use_cache=False))), (ids(),)
    if name == "qwen2":
        return _FirstOutput(tf.Qwen2ForCausalLM(tf.Qwen2Config(**COMMON, num_key_value_heads=2, use_cache=False))), (ids(),)
    if name == "phi":
        return _FirstOutput(tf.PhiForCausalLM(tf.PhiConfig(**COMMON, use_cache=False))), (ids(),)
    if name == "t5_encoder":
        cfg = tf.T5Config(vocab_size=256, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4)
        return _FirstOutput(tf.T5EncoderModel(cfg)), (ids(),)
    if name == "whisper_encoder":
        cfg = tf.WhisperConfig(d_model=32, encoder_layers=2, encoder_attention_heads=4, encoder_ffn_dim=64,
                               num_mel_bins=16, max_source_positions=8, decoder_layers=1, decoder_attention_heads=4,
                               vocab_size=256, pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1)
        enc = tf.WhisperModel(cfg).get_encoder()
        return _FirstOutput(enc, "input_features"), (torch.randn(1, 16, 16, generator=torch.Generator().manual_seed(2)),)
    if name == "weight_norm_conv":
        class M(nn.Module):
            def __init__(self):
                super().__init__()
                self.c = nn.utils.parametrizations.weight_norm(nn.Conv1d(4, 6, 3, padding=1))
                self.d = nn.utils.parametrizations.weight_norm(nn.Linear(6, 5), dim=None)

            def forward(self, x):
                return self.d(F.gelu(self.c(x)).transpose(1, 2))
        return M(), (torch.randn(1, 4, 10),)
    if name == "multihead_attention":
        class M(nn.Module):
            def __init__(self):
                super().__init__()
                self.m = nn.MultiheadAttention(16, 4, batch_first=True)

            def forward(self, x):
                return self.m(x, x, x, need_weights=False)[0]
        return M(), (torch.randn(2, 5, 16),)
    if name == "splits":
        class M(nn.Module):
            def forward(self, x):
                a, b = torch.split(x, [2, 6], dim=1)
                c = torch.unbind(x, 0)
                d = torch.tensor_split(x, 3, dim=1)
                e = x.chunk(4, -1)
                r = x.repeat_interleave(2, dim=0)
                return a * 2, b.sum(0), c[1], d[2], e[3], r
        return M(), (torch.randn(3, 8),)
    if name == "causal_sdpa_block":  # transformers-like: `*=`, `+=`, is_causal SDPA
        class M(nn.Module):
            def __init__(self):
                super().__init__()
                self.qkv = nn.Linear(16, 48)
                self.o = nn.Linear(16, 16)
                self.scale = 0.5

            def forward(self, x):
                h = x.clone()
                q, k, v = self.qkv(h).view(1, -1, 3, 2, 8).permute(2, 0, 3, 1, 4).unbind(0)
                q *= self.scale
                a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                h += self.o(a.transpose(1, 2).reshape(1, -1, 16))
                h /= h.norm(dim=-1, keepdim=True)
                return h
        return M(), (torch.randn(1, 6, 16),)
    if name == "gpt_neox":  # partial rotary (rotary_pct), chunk of the fused qkv
        cfg = tf.GPTNeoXConfig(**{**COMMON, "num_hidden_layers": 1}, rotary_pct=0.5, use_cache=False)
        return _FirstOutput(tf.GPTNeoXForCausalLM(cfg)), (ids(),)
    if name == "falcon":  # parallel attention, x.T (aten.numpy_T), matmul, `+=`
        cfg = tf.FalconConfig(vocab_size=256, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                              use_cache=False)
        return _FirstOutput(tf.FalconForCausalLM(cfg)), (ids(),)
    if name == "bloom":  # ALiBi: baddbmm(alibi, q, k, beta, alpha)
        cfg = tf.BloomConfig(vocab_size=256, hidden_size=32, n_layer=1, n_head=4, use_cache=False)
        return _FirstOutput(tf.BloomForCausalLM(cfg)), (ids(),)
    if name == "swin":  # windows, then shifted windows (roll, masked_fill mask), pad, relative position index
        cfg = tf.SwinConfig(image_size=32, patch_size=4, embed_dim=16, depths=[2, 1], num_heads=[2, 2], window_size=4)
        return _FirstOutput(tf.SwinModel(cfg), "pixel_values"), (pixels(),)
    if name == "convnext":  # depthwise 7x7 conv, channels-last LayerNorm, layer scale
        cfg = tf.ConvNextConfig(num_channels=3, num_stages=2, hidden_sizes=[8, 16], depths=[1, 1], image_size=32)
        return _FirstOutput(tf.ConvNextModel(cfg), "pixel_values"), (pixels(),)
    if name == "mixtral_grouped_mm":  # transformers' default experts: sort, histc, its grouped_mm custom op
        cfg = tf.MixtralConfig(**{**COMMON, "num_hidden_layers": 1}, num_key_value_heads=2, num_local_experts=4,
                               num_experts_per_tok=2, use_cache=False)
        return _FirstOutput(tf.MixtralForCausalLM(cfg)), (ids(),)
    raise ValueError(name)


MODELS = ["mistral", "qwen2", "phi", "t5_encoder", "whisper_encoder", "weight_norm_conv",
          "multihead_attention", "splits", "causal_sdpa_block",
          "gpt_neox", "falcon", "bloom", "swin", "convnext", "mixtral_grouped_mm"]
# ExecuTorch's own portable lowering beside kiln's (see the module docstring)
WITH_EXECUTORCH_LOWERING = {"gpt_neox", "falcon", "bloom", "swin", "convnext"}


@pytest.mark.parametrize("name", MODELS)
def test_default_ir_model(name, tmp_path):
    module, example = build(name)
    spec = export_program(module, example, tmp_path / name, name)
    ins = [np.load(spec.parent / i["reference"]) for i in json.loads(spec.read_text())["inputs"]]
    refs = [np.load(spec.parent / o["reference"]) for o in json.loads(spec.read_text())["outputs"]]
    for backend in ("portable", "xnnpack"):
        pte = tmp_path / f"{name}_{backend}.pte"
        run_kiln("lower", "--spec", spec, "--backend", backend, "--out", pte, "-q")
        for runtime, got in (("ExecuTorch's", et_execute(pte, ins)), ("kiln's", kiln_run(pte, ins, tmp_path))):
            assert len(got) == len(refs), (name, backend, runtime, len(got))
            for i, (g, r) in enumerate(zip(got, refs)):
                assert_close(g, r, f"kiln {backend} .pte of {name} in {runtime} runtime, output {i}")
    if name in WITH_EXECUTORCH_LOWERING:
        et_pte = et_lower(spec, "portable")
        for runtime, got in (("ExecuTorch's", et_execute(et_pte, ins)), ("kiln's", kiln_run(et_pte, ins, tmp_path))):
            assert len(got) == len(refs), (name, runtime, len(got))
            for i, (g, r) in enumerate(zip(got, refs)):
                assert_close(g, r, f"ExecuTorch's portable .pte of {name} in {runtime} runtime, output {i}")
