"""kiln's runtime runs ExecuTorch's dynamically quantized XNNPACK programs
(torchao 8da4w: int8 activations per token x int4 weights in groups, and
8da8w: x int8 weights per channel), on kiln's qd8 kernels (src/cpu/qd8-gemm).

Oracle: the torchao-quantized model in PyTorch eager; both runtimes are checked
against it. ExecuTorch stores int4 group scales as bf16, so the eager model gets
its scales rounded to bf16 first: then both sides compute the same quantized
product. The programs return the input of each quantized linear as well, and each
product is checked on the runtime's own input to it: the fp32 tolerance, plus one
int8 step for the few activations within a hair of a rounding boundary
(quant_oracle.py: fp32 differences before a product move int8 roundings, and they
differ from one CPU to the next)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import et_execute
from quant_oracle import Taps, check_stages
from test_xnnpack_runtime import kiln_run


def _quantized_model(scheme: str, group: int, k: int, seed: int):
    from torchao.quantization import Int8DynamicActivationIntxWeightConfig, PerAxis, PerGroup, quantize_

    torch.manual_seed(seed)
    model = torch.nn.Sequential(
        torch.nn.Linear(k, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256, bias=False), torch.nn.SiLU(),
        torch.nn.Linear(256, 32)).eval()
    if scheme == "8da4w":
        cfg = Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int4, weight_granularity=PerGroup(group))
    else:
        cfg = Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int8, weight_granularity=PerAxis(0))
    quantize_(model, cfg)
    if scheme == "8da4w":  # the file keeps bf16 scales: give eager the same ones
        with torch.no_grad():
            for mod in model:
                if isinstance(mod, torch.nn.Linear):
                    mod.weight.scale.copy_(mod.weight.scale.to(torch.bfloat16).to(mod.weight.scale.dtype))
    return model


def _et_lower(model, x, path):
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    ep = torch.export.export(model, (x,))
    prog = to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()]).to_executorch()
    path.write_bytes(prog.buffer)
    return path


@pytest.mark.parametrize("scheme,group,k", [("8da4w", 32, 64), ("8da4w", 64, 128), ("8da4w", 128, 256),
                                            ("8da4w", 32, 576), ("8da8w", 0, 72)])
@pytest.mark.parametrize("rows", [1, 5])
def test_executorch_quantized_program_runs_in_kiln(scheme, group, k, rows, tmp_path):
    model = _quantized_model(scheme, group, k, seed=k + rows)
    x = torch.randn(rows, k)
    pte = _et_lower(Taps(model), x, tmp_path / "q.pte")  # the input of each quantized product an output too
    check_stages(model, x.numpy(), et_execute(pte, [x.numpy()]), "ExecuTorch's runtime vs torchao eager")
    for engine in ("kiln", "xnnpack"):  # quantized products run on kiln's code in both engines
        for threads in ("1", "2"):
            got = kiln_run(pte, [x.numpy()], tmp_path, "--engine", engine, "--threads", threads)
            check_stages(model, x.numpy(), got, f"kiln ({engine}, {threads} threads) vs torchao eager")


def test_quantized_profile_names_the_steps(tmp_path):
    from conftest import run_kiln

    model = _quantized_model("8da4w", 32, 64, seed=3)
    x = torch.randn(2, 64)
    pte = _et_lower(model, x, tmp_path / "q.pte")
    out = run_kiln("bench", pte, "--iters", "2", "--profile").stdout
    assert "int8 x int4" in out and "quantize rows" in out, out


# ---- kiln's own quantization: kiln lower --quantize (C++, no torchao), checked
# against torchao's quantization of the same fp32 model, evaluated eagerly.

def _fp32_model(k: int, seed: int):
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(k, 256), torch.nn.GELU(), torch.nn.Linear(256, 128, bias=False), torch.nn.ReLU(),
        torch.nn.Linear(128, 64)).eval()


def _export_spec(module, x, out, name="qmodel"):
    import json

    out.mkdir(parents=True, exist_ok=True)
    torch.export.save(torch.export.export(module, (x,)), out / f"{name}.pt2")
    with torch.no_grad():
        ys = module(x)
    ys = ys if isinstance(ys, tuple) else (ys,)  # a tuple: several outputs (quant_oracle.Taps)
    np.save(out / "in.npy", x.numpy())
    outputs = []
    for i, y in enumerate(ys):
        np.save(out / f"out{i or ''}.npy", y.numpy())
        outputs.append({"name": f"y{i or ''}", "dtype": "float32", "shape": list(y.shape), "reference": f"out{i or ''}.npy"})
    spec = {"name": name, "model_id": f"tests/{name}", "seq_len": int(x.shape[0]), "exported_program": f"{name}.pt2",
            "ir": "default",
            "inputs": [{"name": "x", "dtype": "float32", "shape": list(x.shape), "reference": "in.npy"}],
            "outputs": outputs}
    (out / "model_spec.json").write_text(json.dumps(spec))
    return out / "model_spec.json"


@pytest.mark.parametrize("scheme", ["8da4w", "8da4w:64", "8da4w:128", "8da8w"])
def test_kiln_quantize_matches_torchao(scheme, tmp_path):
    import copy
    import json

    from conftest import run_kiln

    k, rows = 256, 6
    model = _fp32_model(k, seed=5)
    x = torch.randn(rows, k)
    spec = _export_spec(Taps(model), x, tmp_path / "m")  # the input of each quantized product an output too
    pte = tmp_path / "q.pte"
    run_kiln("lower", "--spec", spec, "--backend", "xnnpack", "--quantize", scheme, "--quantize-scales", "minmax",
             "--out", pte, "-q")
    meta = json.loads(pte.with_suffix(".json").read_text())
    assert meta["delegation"]["quantized_nodes"] == 3, meta["delegation"]
    assert meta["delegation"]["delegate_call_sites"] == 1

    group = int(scheme.split(":")[1]) if ":" in scheme else 32
    base = "8da4w" if scheme.startswith("8da4w") else "8da8w"
    ref_model = _quantized_model_from(copy.deepcopy(model), base, group)
    check_stages(ref_model, x.numpy(), et_execute(pte, [x.numpy()]),
                 f"{scheme}: ExecuTorch's runtime on kiln's file vs torchao eager")
    check_stages(ref_model, x.numpy(), kiln_run(pte, [x.numpy()], tmp_path),
                 f"{scheme}: kiln's runtime on kiln's file vs torchao eager")
    # and the weights shrank: int4 ~ 1/8 of fp32 plus scales, int8 ~ 1/4
    fp32_bytes = 4 * (k * 256 + 256 * 128 + 128 * 64)
    assert pte.stat().st_size < fp32_bytes * (0.2 if base == "8da4w" else 0.3)


def _quantized_model_from(model, scheme: str, group: int):
    from torchao.quantization import Int8DynamicActivationIntxWeightConfig, PerAxis, PerGroup, quantize_

    if scheme == "8da4w":
        cfg = Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int4, weight_granularity=PerGroup(group))
    else:
        cfg = Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int8, weight_granularity=PerAxis(0))
    quantize_(model, cfg)
    if scheme == "8da4w":
        with torch.no_grad():
            for mod in model:
                if isinstance(mod, torch.nn.Linear):
                    mod.weight.scale.copy_(mod.weight.scale.to(torch.bfloat16).to(mod.weight.scale.dtype))
    return model


@pytest.mark.parametrize("bad,message", [("int3", "unknown quantization scheme"), ("8da4w:48", "unknown group size"),
                                         ("8da8w:32", "unknown quantization scheme")])
def test_bad_quantize_option_is_one_clear_line(bad, message, tmp_path):
    from conftest import run_kiln

    spec = _export_spec(_fp32_model(64, seed=1), torch.randn(2, 64), tmp_path / "m")
    out = tmp_path / "q.pte"
    proc = run_kiln("lower", "--spec", spec, "--backend", "xnnpack", "--quantize", bad, "--out", out, "-q", check=False)
    assert proc.returncode != 0 and message in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not out.exists()
    proc = run_kiln("lower", "--spec", spec, "--backend", "portable", "--quantize", bad, "--out", out, "-q", check=False)
    assert proc.returncode != 0 and message in proc.stderr, proc.stderr  # the same line on the portable backend
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not out.exists()


def _check_block(qblock, h, outs, what):
    """A runtime's (c_proj's input, the head's input, logits) of the GPT-2 block, each quantized product checked
    against torchao eager on the runtime's own input to it (quant_oracle)."""
    from quant_oracle import check_stage

    a, r, y = outs
    mlp = qblock.mlp
    check_stage(mlp.c_fc, h, lambda t: mlp.act(mlp.c_fc(t)), a, f"{what}, c_fc + GELU", lipschitz=1.13)
    check_stage(mlp.c_proj, a, lambda t: torch.from_numpy(h) + mlp.c_proj(t), r, f"{what}, c_proj + residual")
    check_stage(qblock.lm_head, r, qblock.lm_head, y, f"{what}, lm_head")


@pytest.mark.parametrize("gpt2_small", ["default"], indirect=True)
@pytest.mark.parametrize("scheme", ["8da4w", "8da8w"])
def test_gpt2_small_quantized_matches_torchao(gpt2_small, scheme, tmp_path):
    """GPT-2 small (124M, seeded weights, seq_len 128) quantized by kiln (`--quantize`, in C++) against the
    same weights quantized by torchao (bench/quant/torchao_ref.py: transformers' Conv1D projections as the
    equal nn.Linear, the tied head given its own weight), in PyTorch eager, kiln's runtime and ExecuTorch's.

    Per layer type: layer 0's MLP (c_fc, GELU, c_proj: Conv1D, an addmm by W[in, out] in the graph) and
    the tied LM head, lowered alone and fed the model's own layer-0 activations, returning the input of
    each quantized product as well: each product, on the runtime's own input, is within the fp32 tolerance
    of torchao eager in both runtimes (the same int4/int8 weights and scales, the same int8 activation rows,
    fp32 accumulation order the only difference), plus one int8 step for the few activations within a hair
    of a rounding boundary (tests/python/quant_oracle.py).

    The whole model: 12 layers each quantize their activations to int8 again, so a rounding difference
    in the fp32 parts (attention, LayerNorm) moves a value by one int8 step now and then and the later
    layers carry it on. ExecuTorch's runtime on kiln's file is ~2% of max|logit| from torchao eager here
    (the quantization itself moves the logits ~3% from fp32). The bounds: both runtimes within 5% of
    max|logit| and the same argmax at >= 90% of the 128 positions, and kiln's runtime no further from
    torchao than twice ExecuTorch's runtime on the same file."""
    import copy
    import json
    import sys

    from conftest import REPO, reference_io, run_kiln

    sys.path.insert(0, str(REPO / "python"))
    sys.path.insert(0, str(REPO / "bench" / "quant"))
    from kiln_export.models import build_gpt2
    from torchao_ref import conv1d_to_linear, quantize_like_kiln, untie_head

    spec = json.loads(gpt2_small.read_text())
    module, example, _ = build_gpt2("small", spec["seq_len"], spec["seed"], None)
    ins, refs = reference_io(gpt2_small)
    assert np.array_equal(ins[0], example[0].numpy()), "the fixture's inputs are build_gpt2's"
    model = module.model  # GPT2LMHeadModel

    # ---- layer 0's MLP and the tied head, alone; the input of each quantized product an output too
    class Block(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.mlp = copy.deepcopy(m.transformer.h[0].mlp)
            self.lm_head = torch.nn.Linear(m.config.n_embd, m.config.vocab_size, bias=False)
            self.lm_head.weight = torch.nn.Parameter(m.transformer.wte.weight.detach().clone())

        def forward(self, h):
            a = self.mlp.act(self.mlp.c_fc(h))  # c_proj's input
            r = h + self.mlp.dropout(self.mlp.c_proj(a))  # the head's input
            return a, r, self.lm_head(r)

    with torch.no_grad():
        h = model(example[0][:, :32], output_hidden_states=True).hidden_states[1][0].contiguous()
    block = Block(model).eval()
    bspec = _export_spec(block, h, tmp_path / "block", name="gpt2block")
    bpte = tmp_path / f"block_{scheme}.pte"
    run_kiln("lower", "--spec", bspec, "--backend", "xnnpack", "--quantize", scheme, "--quantize-scales", "minmax",
             "--out", bpte, "-q")
    assert json.loads(bpte.with_suffix(".json").read_text())["delegation"]["quantized_nodes"] == 3
    qblock = quantize_like_kiln(conv1d_to_linear(copy.deepcopy(block)), scheme)
    with torch.no_grad():
        ref = qblock(h)[-1].numpy()
        fp32 = block(h)[-1].numpy()
    assert np.abs(ref - fp32).max() > 1e-3 * np.abs(fp32).max(), "the quantization must be visible"
    x = h.numpy()
    for what, outs in (("ExecuTorch's runtime", et_execute(bpte, [x])), ("kiln's runtime", kiln_run(bpte, [x], tmp_path))):
        _check_block(qblock, x, outs, f"GPT-2 block {scheme}: {what} vs torchao")

    # ---- the whole model
    pte = tmp_path / f"gpt2_{scheme}.pte"
    run_kiln("lower", "--spec", gpt2_small, "--backend", "xnnpack", "--quantize", scheme, "--quantize-scales", "minmax",
             "--out", pte, "-q")
    d = json.loads(pte.with_suffix(".json").read_text())["delegation"]
    assert d["quantized_nodes"] == 12 * 4 + 1 and d["delegate_call_sites"] == 1, d  # every projection, the head
    qmodel = conv1d_to_linear(copy.deepcopy(module))
    untie_head(qmodel.model.lm_head)
    quantize_like_kiln(qmodel, scheme)
    with torch.no_grad():
        want = qmodel(*example).numpy()
    scale = float(np.abs(want).max())
    moved = float(np.abs(want - refs[0]).max()) / scale
    assert moved > 0.01, f"the quantization must move the logits: {moved:.3g}"
    errs = {}
    for what, got in (("ExecuTorch's runtime", et_execute(pte, ins)[0]), ("kiln's runtime", kiln_run(pte, ins, tmp_path)[0])):
        errs[what] = float(np.abs(got - want).max()) / scale
        same = float(np.mean(got.argmax(-1) == want.argmax(-1)))
        assert errs[what] <= 0.05 and same >= 0.9, f"GPT-2 small {scheme}, {what}: {errs[what]:.3g} of max|logit|, " \
                                                    f"argmax {same:.2f} (the quantization moved it {moved:.3g})"
    assert errs["kiln's runtime"] <= 2 * errs["ExecuTorch's runtime"], errs
