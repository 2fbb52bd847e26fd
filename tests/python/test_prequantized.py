"""Already-quantized .pt2 files (the seed's route: torchao's quantize_ before torch.export).

torchao's Int8DynamicActivationIntxWeightConfig leaves each linear weight a tensor subclass
(IntxUnpackedToInt8Tensor), which torch.export.save pickles; the graph quantizes activations per token
and dequantizes weights with torchao's affine ops. kiln reads the subclasses' parts in place and
lowers the pattern as ExecuTorch's XNNPACK partitioner does (dynamically quantized fully connected
nodes on int4 / int8 weights).

Oracles: the torchao-quantized model in PyTorch eager (int4 group scales rounded to bf16 first, as
the file stores them, so the fp32 tolerance applies), and ExecuTorch's runtime on kiln's file. The MLPs
return the input of each quantized linear as well, and each product is checked on the runtime's own
input to it (quant_oracle.py: an fp32 difference before a product can move an int8 rounding)."""
from __future__ import annotations

import json
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import assert_close, et_execute, run_kiln
from quant_oracle import Taps, check_stages
from test_models_transformers import export_program
from test_xnnpack_runtime import kiln_run


def _config(scheme: str, **kw):
    from torchao.quantization import Int8DynamicActivationIntxWeightConfig, PerAxis, PerGroup

    if scheme.startswith("8da4w"):
        group = int(scheme.split(":")[1]) if ":" in scheme else 32
        return Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int4, weight_granularity=PerGroup(group), **kw)
    return Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int8, weight_granularity=PerAxis(0), **kw)


def _quantize(model, scheme: str, **kw):
    from torchao.quantization import quantize_

    quantize_(model, _config(scheme, **kw))
    if scheme.startswith("8da4w"):  # kiln's (and ExecuTorch's) file keeps bf16 group scales: give eager the same
        with torch.no_grad():
            for mod in model.modules():
                if isinstance(mod, torch.nn.Linear) and hasattr(mod.weight, "scale"):
                    mod.weight.scale.copy_(mod.weight.scale.to(torch.bfloat16).to(mod.weight.scale.dtype))
    return model


def _mlp(k: int, seed: int):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(k, 256), torch.nn.ReLU(), torch.nn.Linear(256, 128, bias=False),
                               torch.nn.SiLU(), torch.nn.Linear(128, 32)).eval()


def _export_taps(model, x, out: Path):
    """The MLP exported returning the input of each quantized linear as well (quant_oracle.Taps): each product
    is then checked on a runtime's own input to it. Returns (spec path, inputs)."""
    from test_quantized_runtime import _export_spec

    with torch.no_grad():
        spec = _export_spec(Taps(model), x, out, name="q")
    return spec, [x.numpy()]


def _lower(spec: Path, out: Path, *extra: str):
    return run_kiln("lower", "--spec", spec, "--backend", "xnnpack", "--out", out, "-q", *extra, check=False)


def _expected(spec: Path):
    s = json.loads(spec.read_text())
    return [np.load(spec.parent / i["reference"]) for i in s["inputs"]], np.load(spec.parent / s["outputs"][0]["reference"])


@pytest.mark.parametrize("scheme,k", [("8da4w", 64), ("8da4w:64", 128), ("8da4w:128", 256), ("8da8w", 72)])
@pytest.mark.parametrize("rows", [1, 5])
def test_torchao_quantized_pt2_runs_in_both_runtimes(scheme, k, rows, tmp_path):
    model = _quantize(_mlp(k, seed=k + rows), scheme)
    spec, ins = _export_taps(model, torch.randn(rows, k), tmp_path / "m")
    pte = tmp_path / "q.pte"
    proc = _lower(spec, pte)
    assert proc.returncode == 0, proc.stderr
    d = json.loads(pte.with_suffix(".json").read_text())["delegation"]
    assert d["delegate_call_sites"] == 1 and d["fallback_count"] == 0, d
    assert d["prequantized_nodes"] == 3 and d["quantized_nodes"] == 3, d
    assert d["quantization"].startswith(scheme if ":" in scheme or scheme == "8da8w" else scheme + ":32"), d
    check_stages(model, ins[0], et_execute(pte, ins), f"{scheme}: ExecuTorch's runtime on kiln's file vs torchao eager")
    for engine in ("kiln", "xnnpack"):
        got = kiln_run(pte, ins, tmp_path, "--engine", engine, "--threads", "2")
        check_stages(model, ins[0], got, f"{scheme}: kiln's runtime ({engine}) vs torchao eager")
    # the weights stay quantized in the file: int4 about 1/8 of fp32 (plus scales), int8 1/4
    fp32_bytes = 4 * (k * 256 + 256 * 128 + 128 * 32)
    assert pte.stat().st_size < fp32_bytes * (0.2 if scheme.startswith("8da4w") else 0.3)


def _tiny_llama():
    import transformers as tf

    torch.manual_seed(0)
    cfg = tf.LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, use_cache=False)
    model = tf.LlamaForCausalLM(cfg).eval()

    class Logits(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, ids):
            return self.m(input_ids=ids).logits

    return Logits(model).eval()


@pytest.mark.parametrize("scheme", ["8da4w", "8da8w"])
def test_torchao_quantized_llama_matches_torchao(scheme, tmp_path):
    """A decoder (SDPA attention, RMSNorm, SwiGLU, a [1, T, K] activation per linear): every linear quantized,
    the embedding left fp32, as ExecuTorch's LLM export does."""
    model = _quantize(_tiny_llama(), scheme)
    ids = torch.randint(0, 512, (1, 16), generator=torch.Generator().manual_seed(3))
    spec = export_program(model, (ids,), tmp_path / "m", "llama")
    ins, ref = _expected(spec)
    pte = tmp_path / "q.pte"
    proc = _lower(spec, pte)
    assert proc.returncode == 0, proc.stderr
    d = json.loads(pte.with_suffix(".json").read_text())["delegation"]
    assert d["prequantized_nodes"] == 2 * 7 + 1 and d["delegate_call_sites"] == 1, d  # q k v o gate up down; lm_head
    et = et_execute(pte, ins)[0]
    got = kiln_run(pte, ins, tmp_path)[0]
    # Per-token int8 activations: a last-bit difference in a norm can move one activation's rounding, so the
    # bound is a small share of the logits' range rather than fp32's; both runtimes agree with each other closely.
    scale = float(np.abs(ref).max())
    for name, out in (("ExecuTorch's runtime", et), ("kiln's runtime", got)):
        err = float(np.abs(out - ref).max())
        assert err <= 0.01 * scale, f"{scheme}: {name} on kiln's file: max |diff| {err:.3g} vs max |logit| {scale:.3g}"
        assert (out.argmax(-1) == ref.argmax(-1)).mean() >= 0.9, name
    assert float(np.abs(got - et).max()) <= 0.01 * scale


def _rename_ops(src: Path, dst: Path, old: str, new: str):
    """A copy of the .pt2 with the graph's operator namespace `old` renamed `new` (older torchao's quant.*)."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as zout:
        for item in zin.infolist():
            data = zin.read(item.filename)
            if item.filename.endswith("models/model.json"):
                text = data.decode()
                assert f'"torch.ops.{old}.' in text
                data = text.replace(f'"torch.ops.{old}.', f'"torch.ops.{new}.').encode()
            zout.writestr(item, data)


def test_older_quant_namespace_lowers_the_same(tmp_path):
    model = _quantize(_mlp(64, seed=7), "8da4w")
    spec, ins = _export_taps(model, torch.randn(3, 64), tmp_path / "m")
    pt2 = spec.parent / "q.pt2"
    _rename_ops(pt2, tmp_path / "quant.pt2", "torchao", "quant")
    (tmp_path / "quant.pt2").replace(pt2)
    ops = json.loads(run_kiln("inspect", spec, "--json").stdout)["operators"]
    assert ops.get("quant.dequantize_affine.default") == 6 and not any(o.startswith("torchao.") for o in ops), ops
    pte = tmp_path / "q.pte"
    proc = _lower(spec, pte)
    assert proc.returncode == 0, proc.stderr
    check_stages(model, ins[0], kiln_run(pte, ins, tmp_path), "quant.* ops, kiln's runtime")
    check_stages(model, ins[0], et_execute(pte, ins), "quant.* ops, ExecuTorch's runtime")


def test_legacy_int8_dyn_act_int4_weight_quantizer(tmp_path):
    """torchao's older module-swap quantizer (Int8DynActInt4WeightQuantizer, the one ExecuTorch's llama export
    used for -qmode 8da4w): plain buffers for the int4 values, scales and zero points instead of a tensor
    subclass, the same choose_qparams / quantize / dequantize_affine graph."""
    from torchao.quantization.quant_api import Int8DynActInt4WeightQuantizer

    model = Int8DynActInt4WeightQuantizer(groupsize=32, precision=torch.float32).quantize(_mlp(64, seed=11))
    with torch.no_grad():  # the payload stores the group scales as bf16: give eager the same
        for name, buf in model.named_buffers():
            if name.endswith("scales"):
                buf.copy_(buf.to(torch.bfloat16).to(buf.dtype))
    spec, ins = _export_taps(model, torch.randn(5, 64), tmp_path / "m")
    pte = tmp_path / "q.pte"
    proc = _lower(spec, pte)
    assert proc.returncode == 0, proc.stderr
    d = json.loads(pte.with_suffix(".json").read_text())["delegation"]
    assert d["prequantized_nodes"] == 3 and d["fallback_count"] == 0, d
    check_stages(model, ins[0], kiln_run(pte, ins, tmp_path), "legacy quantizer, kiln's runtime vs torchao eager")
    check_stages(model, ins[0], et_execute(pte, ins), "legacy quantizer, ExecuTorch's runtime vs torchao eager")


def _pt2e_dynamic(model, x):
    """PT2E: prepare_pt2e / convert_pt2e with ExecuTorch's XNNPACKQuantizer, its dynamic per-channel config
    (quantized_decomposed.choose_qparams / quantize_per_tensor / dequantize_per_tensor on the activation,
    dequantize_per_channel on an int8 weight)."""
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (XNNPACKQuantizer,
                                                                         get_symmetric_quantization_config)
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    q = XNNPACKQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=True, is_dynamic=True))
    gm = prepare_pt2e(torch.export.export(model, (x,)).module(), q)
    gm(x)
    return convert_pt2e(gm)


@pytest.mark.parametrize("rows", [1, 6])
def test_pt2e_dynamic_quantized_decomposed_ops(rows, tmp_path):
    """The quantized_decomposed.* form. Eager quantizes each activation per tensor; ExecuTorch lowers it to
    XNNPACK's qdint8 conversion, which is per row, and so does kiln. One row: eager is the oracle. Several rows:
    ExecuTorch's own lowering of the same .pt2, in its runtime, is (kiln's file agrees with it to fp32 rounding),
    and eager is one int8 step per row away."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    torch.manual_seed(rows)
    x = torch.randn(rows, 64)
    gm = _pt2e_dynamic(_mlp(64, seed=5), x)
    spec = export_program(gm, (x,), tmp_path / "m", "q")
    ops = json.loads(run_kiln("inspect", spec, "--json").stdout)["operators"]
    assert ops.get("quantized_decomposed.dequantize_per_channel.default") == 3, ops
    ins, ref = _expected(spec)
    pte = tmp_path / "q.pte"
    proc = _lower(spec, pte)
    assert proc.returncode == 0, proc.stderr
    d = json.loads(pte.with_suffix(".json").read_text())["delegation"]
    assert d["prequantized_nodes"] == 3 and d["fallback_count"] == 0 and d["delegate_call_sites"] == 1, d
    assert d["quantization"].startswith("8da8w"), d
    ep = torch.export.load(str(spec.parent / "q.pt2"))
    et_pte = tmp_path / "et.pte"
    et_pte.write_bytes(to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()]).to_executorch().buffer)
    want = et_execute(et_pte, ins)[0] if rows > 1 else ref
    what = "ExecuTorch's lowering in its runtime" if rows > 1 else "eager"
    assert_close(et_execute(pte, ins)[0], want, f"ExecuTorch's runtime on kiln's file vs {what}")
    assert_close(kiln_run(pte, ins, tmp_path)[0], want, f"kiln's runtime on kiln's file vs {what}")
    assert_close(kiln_run(et_pte, ins, tmp_path)[0], want, f"kiln's runtime on ExecuTorch's file vs {what}")
    if rows > 1:
        assert float(np.abs(want - ref).max()) <= 0.05 * float(np.abs(ref).max())


def test_pt2e_static_quantization_is_one_clear_line(tmp_path):
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (XNNPACKQuantizer,
                                                                         get_symmetric_quantization_config)
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    x = torch.randn(2, 64)
    q = XNNPACKQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=True))
    gm = prepare_pt2e(torch.export.export(_mlp(64, seed=2), (x,)).module(), q)
    gm(x)
    spec = export_program(convert_pt2e(gm), (x,), tmp_path / "m", "q")
    pte = tmp_path / "q.pte"
    proc = _lower(spec, pte)
    assert proc.returncode != 0 and not pte.exists()
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "quantized_decomposed" in lines[0] and "static int8" in lines[0], proc.stderr


def test_weight_only_quantized_layers_lower_exactly(tmp_path):
    """IntxWeightOnlyConfig (no activation quantization) on a linear layer and an embedding: the graph computes
    with the dequantized weights in fp32, and so does kiln's program."""
    from torchao.quantization import IntxWeightOnlyConfig, PerAxis, PerGroup, quantize_

    torch.manual_seed(5)

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(100, 64)
            self.fc = torch.nn.Linear(64, 48)

        def forward(self, ids):
            return self.fc(self.emb(ids))

    model = M().eval()
    quantize_(model, IntxWeightOnlyConfig(weight_dtype=torch.int8, granularity=PerAxis(0)),
              filter_fn=lambda m, fqn: isinstance(m, torch.nn.Embedding))
    quantize_(model, IntxWeightOnlyConfig(weight_dtype=torch.int4, granularity=PerGroup(32)))
    spec = export_program(model, (torch.randint(0, 100, (2, 7)),), tmp_path / "m", "wo")
    ins, ref = _expected(spec)
    pte = tmp_path / "q.pte"
    proc = _lower(spec, pte)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(pte.with_suffix(".json").read_text())["delegation"]["prequantized_nodes"] == 0
    assert_close(kiln_run(pte, ins, tmp_path)[0], ref, "weight-only, kiln's runtime")
    assert_close(et_execute(pte, ins)[0], ref, "weight-only, ExecuTorch's runtime")


@pytest.mark.parametrize("case,message", [
    ("int4-groups-of-16", "groups of 16"),
    ("int8-in-groups", "int8 weights in groups of 32"),
    ("asymmetric-weights", "zero point"),
    ("portable", "--backend xnnpack"),
])
def test_quantized_pattern_kiln_does_not_know_is_one_clear_line(case, message, tmp_path):
    from torchao.quantization import Int8DynamicActivationIntxWeightConfig, PerGroup, quantize_
    from torchao.quantization.quant_primitives import MappingType

    model = _mlp(64, seed=2)
    if case == "int4-groups-of-16":
        quantize_(model, Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int4, weight_granularity=PerGroup(16)))
    elif case == "int8-in-groups":
        quantize_(model, Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int8, weight_granularity=PerGroup(32)))
    else:
        kw = {"weight_mapping_type": MappingType.ASYMMETRIC} if case == "asymmetric-weights" else {}
        model = _quantize(model, "8da4w", **kw)
    spec = export_program(model, (torch.randn(2, 64),), tmp_path / "m", "q")
    out = tmp_path / "q.pte"
    if case == "portable":
        proc = run_kiln("lower", "--spec", spec, "--backend", "portable", "--out", out, "-q", check=False)
    else:
        proc = _lower(spec, out)
    assert proc.returncode != 0 and message in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not out.exists() and not any(p.name.startswith("q.pte") for p in tmp_path.iterdir())


@pytest.mark.parametrize("damage", ["not-a-zip", "truncated-pickle"])
def test_damaged_subclass_weight_is_one_clear_line(damage, tmp_path):
    model = _quantize(_mlp(64, seed=4), "8da4w")
    spec = export_program(model, (torch.randn(2, 64),), tmp_path / "m", "q")
    pt2 = spec.parent / "q.pt2"
    damaged = tmp_path / "damaged.pt2"
    with zipfile.ZipFile(pt2) as zin, zipfile.ZipFile(damaged, "w", zipfile.ZIP_STORED) as zout:
        config = next(n for n in zin.namelist() if n.endswith("model_weights_config.json"))
        pickled = {e["path_name"] for e in json.loads(zin.read(config))["config"].values() if e["use_pickle"]}
        assert pickled
        for item in zin.infolist():
            data = zin.read(item.filename)
            if item.filename.rsplit("/", 1)[-1] in pickled:
                if damage == "not-a-zip":
                    data = b"\x00" * len(data)
                else:  # the pickle's bytes cut short inside the nested zip (same length, so the zip stays whole)
                    at = data.index(b"\x80\x02")
                    data = data[:at + 40] + b"\x00" * 160 + data[at + 200:]
            zout.writestr(item, data)
    damaged.replace(pt2)
    out = tmp_path / "q.pte"
    proc = _lower(spec, out)
    assert proc.returncode != 0 and ("archive entry" in proc.stderr if damage == "not-a-zip" else "parameter '0.weight'" in proc.stderr), proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not out.exists()
