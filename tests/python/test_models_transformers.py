"""Transformer families as `transformers` 5 builds them by default (SDPA attention,
no KV cache), tiny and seeded: BERT, Llama, Qwen3, Gemma3.

For each: kiln lowers the default-IR export for both backends; ExecuTorch's
runtime and kiln's run kiln's .pte; kiln's runtime runs ExecuTorch's own .pte
(XNNPACK-delegated and portable); every output is within 1e-4 * max|ref| of
eager PyTorch. With --backend xnnpack the whole network is one delegate region
plus the (int64) embedding lookup.

Smaller graphs exercise the SDPA variants the models do not: a boolean mask that
is a program input, an additive mask, is_causal, an explicit scale, enable_gqa.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from conftest import REPO, assert_close, et_execute, kiln_lower, reference_io, run_kiln, spec_of
from test_xnnpack_runtime import kiln_run

SEQ = 16
_REFERENCE = None


def et_lower(spec_path: Path, backend: str) -> Path:
    """ExecuTorch's own lowering (bench/reference/lower_with_executorch.py), run in this
    process: the test already imports torch and executorch, a subprocess per file would again."""
    global _REFERENCE
    if _REFERENCE is None:
        import importlib.util

        loader = importlib.util.spec_from_file_location(
            "lower_with_executorch", REPO / "bench" / "reference" / "lower_with_executorch.py")
        _REFERENCE = importlib.util.module_from_spec(loader)
        loader.loader.exec_module(_REFERENCE)
    meta = _REFERENCE.lower(Path(spec_path), backend, None)
    return Path(meta["pte"])


class _FirstOutput(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids):
        return self.model(input_ids=input_ids, return_dict=False)[0]


def _build(family: str) -> torch.nn.Module:
    import transformers as tf

    common = dict(vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, max_position_embeddings=256)
    if family == "bert":
        model = tf.BertModel(tf.BertConfig(**common))
    elif family == "llama":
        model = tf.LlamaForCausalLM(tf.LlamaConfig(**common, num_key_value_heads=2, use_cache=False))
    elif family == "qwen3":
        model = tf.Qwen3ForCausalLM(tf.Qwen3Config(**common, num_key_value_heads=2, head_dim=16, use_cache=False))
    elif family == "gemma3":
        # sliding_window < SEQ: the local layers' band masks differ from the global causal one.
        model = tf.Gemma3ForCausalLM(tf.Gemma3TextConfig(**common, num_key_value_heads=2, head_dim=16,
                                                         sliding_window=8, use_cache=False))
    else:
        raise ValueError(family)
    assert model.config._attn_implementation == "sdpa", model.config._attn_implementation
    return _FirstOutput(model.eval()).eval()


def export_program(module: torch.nn.Module, example: tuple, out: Path, name: str) -> Path:
    """torch.export (default IR) of `module` on `example`, written like the export front end does."""
    out.mkdir(parents=True, exist_ok=True)
    with torch.no_grad():
        ep = torch.export.export(module, example, strict=False)
        ref = module(*example)
    torch.export.save(ep, out / f"{name}.pt2")
    inputs = []
    for i, x in enumerate(example):
        np.save(out / f"{name}_input{i}.npy", x.numpy())
        inputs.append({"name": f"in{i}", "dtype": str(x.dtype).removeprefix("torch."), "shape": list(x.shape),
                       "reference": f"{name}_input{i}.npy"})
    np.save(out / f"{name}_expected_output0.npy", ref.numpy())
    spec = {"name": name, "model_id": f"tests/{name}", "seq_len": SEQ, "exported_program": f"{name}.pt2",
            "ir": "default", "inputs": inputs,
            "outputs": [{"name": "out", "dtype": "float32", "shape": list(ref.shape),
                         "reference": f"{name}_expected_output0.npy"}]}
    (out / "model_spec.json").write_text(json.dumps(spec))
    return out / "model_spec.json"


FAMILIES = ["bert", "llama", "qwen3", "gemma3"]


@pytest.fixture(scope="module", params=FAMILIES)
def family(request, tmp_path_factory) -> Path:
    torch.manual_seed(0)
    module = _build(request.param)
    ids = torch.randint(0, 1000, (1, SEQ), generator=torch.Generator().manual_seed(1))
    return export_program(module, (ids,), tmp_path_factory.mktemp(request.param), request.param)


def _delegation(pte: Path) -> dict:
    return json.loads(pte.with_suffix(".json").read_text())["delegation"]


def test_default_export_has_sdpa(family):
    """The oracle premise: the graph kiln lowers holds aten.scaled_dot_product_attention."""
    ops = json.loads(run_kiln("inspect", family, "--json").stdout)["operators"]
    assert ops.get("aten.scaled_dot_product_attention.default", 0) == 2, ops


def test_kiln_lowering_runs_in_both_runtimes(family, tmp_path):
    name = spec_of(family)["name"]
    ins, refs = reference_io(family)
    for backend in ("portable", "xnnpack"):
        pte = kiln_lower(family, backend)
        assert_close(et_execute(pte, ins)[0], refs[0], f"kiln {backend} .pte of {name} in ExecuTorch's runtime")
        assert_close(kiln_run(pte, ins, tmp_path)[0], refs[0], f"kiln {backend} .pte of {name} in kiln's runtime")
    d = _delegation(pte)
    assert d["delegate_call_sites"] == 1, d
    assert d["fallback_ops"] == {"aten.embedding.default": 1}, d


@pytest.mark.parametrize("backend", ["xnnpack", "portable"])
def test_kiln_runtime_runs_executorch_pte(family, backend, tmp_path):
    name = spec_of(family)["name"]
    ins, refs = reference_io(family)
    pte = et_lower(family, backend)
    engines = ["kiln", "xnnpack"] if backend == "xnnpack" else ["kiln"]
    for engine in engines:
        out = kiln_run(pte, ins, tmp_path, "--engine", engine)[0]
        assert_close(out, refs[0], f"ExecuTorch's {backend} .pte of {name} in kiln's runtime (--engine {engine})")


# ---------------------------------------------------------------------------
# SDPA variants, one small graph each


class Attn(torch.nn.Module):
    """Projections around one F.scaled_dot_product_attention call; q has 4 heads, k/v `kv_heads`."""

    def __init__(self, kv_heads=4, mask=None, causal=False, scale=None, gqa=False):
        super().__init__()
        self.q = torch.nn.Linear(32, 32)
        self.kv = torch.nn.Linear(32, 2 * 8 * kv_heads)
        self.kv_heads, self.mask, self.causal, self.scale, self.gqa = kv_heads, mask, causal, scale, gqa

    def forward(self, x, mask=None):
        b, t, _ = x.shape
        q = self.q(x).view(b, t, 4, 8).transpose(1, 2)
        kv = self.kv(x).view(b, t, 2, self.kv_heads, 8).permute(2, 0, 3, 1, 4)
        k, v = kv[0], kv[1]
        if mask is None:
            mask = self.mask
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=self.causal, scale=self.scale,
                                           enable_gqa=self.gqa)
        return y.transpose(1, 2).reshape(b, t, 32)


def _variant(tmp_path, module, *inputs, executorch_pte=False):
    torch.manual_seed(0)
    spec = export_program(module.eval(), inputs, tmp_path / "m", "attn")
    ins, refs = reference_io(spec)
    for backend in ("portable", "xnnpack"):
        pte = kiln_lower(spec, backend)
        assert_close(et_execute(pte, ins)[0], refs[0], f"{backend} in ExecuTorch's runtime")
        assert_close(kiln_run(pte, ins, tmp_path)[0], refs[0], f"{backend} in kiln's runtime")
        if executorch_pte:
            assert_close(kiln_run(et_lower(spec, backend), ins, tmp_path)[0], refs[0],
                         f"ExecuTorch's {backend} .pte in kiln's runtime")
    return _delegation(kiln_lower(spec, "xnnpack"))


def _x(b=2, t=SEQ):
    return torch.randn(b, t, 32, generator=torch.Generator().manual_seed(2))


def test_causal_scale_and_gqa(tmp_path):
    torch.manual_seed(0)
    d = _variant(tmp_path, Attn(kv_heads=2, causal=True, scale=0.3, gqa=True), _x(), executorch_pte=True)
    assert d["delegate_call_sites"] == 1 and d["fallback_count"] == 0, d


def test_constant_additive_mask_broadcast(tmp_path):
    torch.manual_seed(0)
    mask = torch.randn(1, 4, 1, SEQ)  # per head, broadcast over the queries
    d = _variant(tmp_path, Attn(kv_heads=2, mask=mask, gqa=True), _x())
    assert d["delegate_call_sites"] == 1 and d["fallback_count"] == 0, d


@pytest.mark.parametrize("kind", ["bool", "float"])
def test_mask_input(tmp_path, kind):
    """A run-time mask: made additive (and finite) ahead of the delegate, still one region. Two
    query rows have no key left; eager SDPA gives 0 there, and so must kiln (not NaN)."""
    torch.manual_seed(0)
    mask = torch.rand(2, 1, SEQ, SEQ, generator=torch.Generator().manual_seed(3)) > 0.3
    mask[0, 0, 3] = False
    mask[1, 0, 7] = False
    if kind == "float":
        mask = torch.zeros(mask.shape).masked_fill(~mask, float("-inf"))
    y = Attn()(_x(), mask)
    assert torch.isfinite(y).all() and (y[0, 3] == 0).all()  # the oracle's behaviour, checked
    d = _variant(tmp_path, Attn(), _x(), mask)
    assert d["delegate_call_sites"] == 1, d
    assert "aten.bmm.default" not in d["fallback_ops"] and "aten._softmax.default" not in d["fallback_ops"], d


def test_dropout_is_a_clear_error(tmp_path):
    class Drop(torch.nn.Module):
        def forward(self, q):
            return F.scaled_dot_product_attention(q, q, q, dropout_p=0.5)

    spec = export_program(Drop(), (torch.randn(1, 2, 4, 8),), tmp_path, "drop")
    proc = run_kiln("lower", "--spec", spec, "-q", check=False)
    assert proc.returncode != 0
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and "scaled_dot_product_attention" in err[0] and "dropout_p=0.5" in err[0], err
    assert not (tmp_path / "drop_portable.pte").exists()


class _WithMask(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask):
        return self.model(input_ids=input_ids, attention_mask=attention_mask, return_dict=False)[0]


def test_bert_with_a_padding_mask_input(tmp_path):
    """BERT given attention_mask (a program input, padding in the second row): the boolean
    SDPA mask is computed at run time, ahead of the one delegate region."""
    import transformers as tf

    torch.manual_seed(0)
    model = tf.BertModel(tf.BertConfig(vocab_size=1000, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                       intermediate_size=128, max_position_embeddings=256)).eval()
    ids = torch.randint(0, 1000, (2, SEQ), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(2, SEQ, dtype=torch.int64)
    mask[1, 10:] = 0
    spec = export_program(_WithMask(model).eval(), (ids, mask), tmp_path / "m", "bert_mask")
    ins, refs = reference_io(spec)
    for backend in ("portable", "xnnpack"):
        pte = kiln_lower(spec, backend)
        assert_close(et_execute(pte, ins)[0], refs[0], f"{backend} in ExecuTorch's runtime")
        assert_close(kiln_run(pte, ins, tmp_path)[0], refs[0], f"{backend} in kiln's runtime")
    d = _delegation(pte)
    assert d["delegate_call_sites"] == 1, d
    assert "aten.embedding.default" in d["fallback_ops"] and "aten.bmm.default" not in d["fallback_ops"], d


class _FlashForCpu(torch.nn.Module):
    """The CPU kernel's overload, as a decomposition may leave it (two results; only the output used)."""

    def forward(self, q, k, v, mask):
        y = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, False, attn_mask=mask, scale=0.4)
        return y[0]


def test_flash_attention_for_cpu_overload(tmp_path):
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(1, 2, SEQ, 8, generator=g) for _ in range(3))
    mask = torch.randn(1, 1, SEQ, SEQ, generator=g)
    spec = export_program(_FlashForCpu(), (q, k, v, mask), tmp_path / "m", "flash")
    ops = json.loads(run_kiln("inspect", spec, "--json").stdout)["operators"]
    assert ops.get("aten._scaled_dot_product_flash_attention_for_cpu.default") == 1, ops
    ins, refs = reference_io(spec)
    for backend in ("portable", "xnnpack"):
        pte = kiln_lower(spec, backend)
        assert_close(et_execute(pte, ins)[0], refs[0], f"{backend} in ExecuTorch's runtime")
        assert_close(kiln_run(pte, ins, tmp_path)[0], refs[0], f"{backend} in kiln's runtime")
    d = _delegation(pte)
    # the run-time mask's row test (any key left?) runs ahead of the one region
    assert d["delegate_call_sites"] == 1, d
    assert set(d["fallback_ops"]) <= {"aten.eq.Scalar", "aten.logical_not.default", "aten.any.dim",
                                      "dim_order_ops._to_dim_order_copy.default"}, d


class _SafeSoftmax(torch.nn.Module):
    def forward(self, x, y):
        return torch.ops.aten._safe_softmax(x, -1) + torch.ops.aten._safe_softmax(torch.bmm(y, y.transpose(1, 2)), -1)


def test_safe_softmax(tmp_path):
    """aten._safe_softmax: rows that are all -inf give 0 (x, an input, has one); over a matmul
    result no row can be, and it is a plain softmax inside the delegate."""
    g = torch.Generator().manual_seed(5)
    x = torch.randn(2, 4, 4, generator=g)
    x[1, 2] = float("-inf")
    x[0, 1, :2] = float("-inf")
    y = torch.randn(2, 4, 3, generator=g)
    spec = export_program(_SafeSoftmax(), (x, y), tmp_path / "m", "safe")
    ops = json.loads(run_kiln("inspect", spec, "--json").stdout)["operators"]
    assert ops.get("aten._safe_softmax.default") == 2, ops
    ins, refs = reference_io(spec)
    assert torch.all(torch.ops.aten._safe_softmax(x, -1)[1, 2] == 0) and np.isfinite(refs[0]).all()
    for backend in ("portable", "xnnpack"):
        pte = kiln_lower(spec, backend)
        assert_close(et_execute(pte, ins)[0], refs[0], f"{backend} in ExecuTorch's runtime")
        assert_close(kiln_run(pte, ins, tmp_path)[0], refs[0], f"{backend} in kiln's runtime")
    assert _delegation(pte)["fallback_ops"].get("aten.where.self") == 1
