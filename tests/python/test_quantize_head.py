"""kiln lower --quantize 8da4w (or auto) --quantize-head 8 (compiler/lower.cpp, backends/xnnpack/quantize.h: find_output_head):
the LM head (the output projection, tied to the token table or not) stored 8da8w (qc8w, int8 per channel) through
the payload's per-weight schemes (--quantize auto's path), every other linear layer 8da4w (qb4w).

Oracles: the delegate payloads (decoded with ExecuTorch's XNNPACK schema by flatc) hold one qc8w filter of the head's
shape and qb4w for the rest; ExecuTorch's runtime runs the file and its logits are torchao's 8da8w head
(Int8DynamicActivationIntxWeightConfig, int8 per axis) on the file's own input to the head (the model returns it:
quant_oracle.check_stage); kiln's runtime gives the same on the same file; fp32 eager: the 8-bit head's logits are
closer to it than the default's. The default (--quantize-head 4) file is byte-identical to the file without the flag.
The model is test_calibrate's tiny LM (RMSNorms with outlier channels, gated MLP), its head tied or not."""
from __future__ import annotations

import copy
import json
from collections import Counter

import numpy as np
import pytest
import torch

from conftest import assert_close, et_execute, run_kiln
from quant_oracle import check_stage
from test_calibrate import CALIBRATION, EVAL, D, H, T, TinyLM, V, _byte_tokenizer
from test_quantize_auto import _filters
from test_xnnpack_runtime import kiln_run

QB4, QC8 = "xnn_datatype_qbint4", "xnn_datatype_qcint8"


class HeadLM(TinyLM):
    """TinyLM with its head tied to the token table (or not); returns (the head's input, logits)."""

    def __init__(self, tied: bool):
        super().__init__()
        if tied:
            self.head.weight = self.emb.weight

    def forward(self, tokens, input_pos):
        h = self.emb(tokens) + self.pos(input_pos)
        x = self.rms(h, self.norm1)
        h = h + self.down(torch.nn.functional.silu(self.gate(x)) * self.up(x))
        x = self.rms(h, self.norm2)
        return x, self.head(x)


def _setup(out, tied: bool):
    out.mkdir(parents=True, exist_ok=True)
    model = HeadLM(tied).eval()
    example = (torch.zeros(1, T, dtype=torch.long), torch.arange(T))
    torch.export.save(torch.export.export(model, example), out / "m.pt2")
    spec = {"name": "m", "model_id": "tests/quantize_head", "seq_len": T, "exported_program": "m.pt2",
            "ir": "default",
            "inputs": [{"name": "tokens", "dtype": "int64", "shape": [1, T]},
                       {"name": "input_pos", "dtype": "int64", "shape": [T]}],
            "outputs": [{"name": "head_input", "dtype": "float32", "shape": [1, T, D]},
                        {"name": "logits", "dtype": "float32", "shape": [1, T, V]}]}
    (out / "model_spec.json").write_text(json.dumps(spec))
    tok = _byte_tokenizer(out / "tokenizer.json")
    (out / "calibration.txt").write_text(CALIBRATION)
    ids = tok.encode(EVAL).ids
    windows = [np.array([ids[i:i + T]], dtype=np.int64) for i in range(0, len(ids) - T + 1, T)]
    return model, windows


def _lower(out, pte, *args, check=True):
    return run_kiln("lower", "--spec", out / "model_spec.json", "--backend", "xnnpack", "--out", pte, "-q", *args,
                    check=check)


def _torchao_head(model, bits: int):
    from torchao.quantization import Int8DynamicActivationIntxWeightConfig, PerAxis, PerGroup, quantize_

    head = torch.nn.Sequential(copy.deepcopy(model.head))
    if bits == 8:
        cfg = Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int8, weight_granularity=PerAxis(0))
    else:
        cfg = Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int4, weight_granularity=PerGroup(32))
    quantize_(head, cfg)
    if bits == 4:  # kiln stores the int4 groups' scales bf16
        with torch.no_grad():
            head[0].weight.scale.copy_(head[0].weight.scale.to(torch.bfloat16).to(head[0].weight.scale.dtype))
    return head


@pytest.mark.parametrize("tied", [True, False])
def test_head_is_qc8w_and_matches_torchao(tied, tmp_path):
    out = tmp_path / "m"
    model, windows = _setup(out, tied)
    pte4, pte8, plain = tmp_path / "h4.pte", tmp_path / "h8.pte", tmp_path / "plain.pte"
    common = ["--quantize", "8da4w", "--quantize-scales", "minmax"]
    _lower(out, pte4, *common, "--quantize-head", "4")
    _lower(out, plain, *common)
    assert pte4.read_bytes() == plain.read_bytes(), "--quantize-head 4 is not the default"
    proc = _lower(out, pte8, *common, "--quantize-head", "8")
    meta = json.loads(pte8.with_suffix(".json").read_text())
    head = meta["quantize_head"]
    assert head["bits"] == 8 and head["scheme"] == "8da8w" and (head["n"], head["k"]) == (V, D), head
    assert head["layer"] == "head" and head["weight"], head  # the product's module path; its weight's name
    assert meta["delegation"]["untied_weights"] == (1 if tied else 0), meta["delegation"]  # tied: the head's own copy
    assert meta["delegation"]["quantization"].endswith("head 8da8w"), meta["delegation"]
    assert meta["delegation"]["quantized_nodes"] == 4, meta["delegation"]
    assert "quantize_head" not in json.loads(plain.with_suffix(".json").read_text())
    assert proc.returncode == 0
    # the payloads: the head qc8w, gate/up/down qb4w (the default file: all four qb4w)
    assert _filters(pte8, tmp_path / "p8") == Counter({(H, D, QB4): 2, (D, H, QB4): 1, (V, D, QC8): 1})
    assert _filters(plain, tmp_path / "p4") == Counter({(H, D, QB4): 2, (D, H, QB4): 1, (V, D, QB4): 1})
    # one int8 byte per head weight instead of half a byte (and the int4 group scales): the file grows by about that
    grow = pte8.stat().st_size - plain.stat().st_size
    assert V * D // 2 - V * (D // 32) * 2 - 4096 < grow < V * D // 2 + V * 4 + 4096, grow
    # the head's numbers: torchao's 8da8w on the runtime's own input to the head, both runtimes
    qhead8, qhead4 = _torchao_head(model, 8), _torchao_head(model, 4)
    with torch.no_grad():
        refs = [model(torch.from_numpy(w), torch.arange(T))[1].numpy() for w in windows[:3]]
    err = {4: [], 8: []}
    for w, ref in zip(windows[:3], refs, strict=True):
        inputs = [w, np.arange(T)]
        tap, logits = et_execute(pte8, inputs)
        check_stage(qhead8[0], tap.reshape(T, D), qhead8, logits.reshape(T, V),
                    f"tied={tied}: ExecuTorch's runtime's head vs torchao 8da8w")
        ktap, klogits = kiln_run(pte8, inputs, tmp_path)
        assert_close(klogits, logits, "the 8-bit head file: kiln's runtime vs ExecuTorch's runtime")
        check_stage(qhead8[0], ktap.reshape(T, D), qhead8, klogits.reshape(T, V),
                    f"tied={tied}: kiln's runtime's head vs torchao 8da8w")
        tap4, logits4 = et_execute(plain, inputs)  # the default: torchao's 8da4w head
        check_stage(qhead4[0], tap4.reshape(T, D), qhead4, logits4.reshape(T, V),
                    f"tied={tied}: the default file's head vs torchao 8da4w")
        err[8].append(np.mean((logits - ref) ** 2))
        err[4].append(np.mean((logits4 - ref) ** 2))
    e4, e8 = float(np.mean(err[4])), float(np.mean(err[8]))
    print(f"tied={tied}: logits mse vs fp32 eager: head 8da4w {e4:.4g}, head 8da8w {e8:.4g}")
    assert e8 < e4, (e4, e8)


def test_calibrated_head_is_qc8w(tmp_path):
    """--calibrate (awq+gptq): GPTQ quantizes the head in its own scheme (int8), the file holds it qc8w, both runtimes
    agree on it, and its logits are closer to fp32 than the calibrated file with an int4 head."""
    out = tmp_path / "m"
    model, windows = _setup(out, tied=True)
    cal = ["--quantize", "8da4w", "--calibrate", out / "calibration.txt"]
    pte4, pte8 = tmp_path / "c4.pte", tmp_path / "c8.pte"
    _lower(out, pte4, *cal)
    _lower(out, pte8, *cal, "--quantize-head", "8")
    meta = json.loads(pte8.with_suffix(".json").read_text())
    assert meta["calibration"]["method"] == "awq+gptq" and meta["calibration"]["gptq_layers"] == 4, meta["calibration"]
    assert _filters(pte8, tmp_path / "p8") == Counter({(H, D, QB4): 2, (D, H, QB4): 1, (V, D, QC8): 1})
    e = {4: [], 8: []}
    for w in windows:
        inputs = [w, np.arange(T)]
        with torch.no_grad():
            ref = model(torch.from_numpy(w), torch.arange(T))[1].numpy()
        logits = et_execute(pte8, inputs)[1]
        if w is windows[0]:
            assert_close(kiln_run(pte8, inputs, tmp_path)[1], logits,
                         "calibrated 8-bit head: kiln's runtime vs ExecuTorch's runtime")
        e[8].append(np.mean((logits - ref) ** 2))
        e[4].append(np.mean((et_execute(pte4, inputs)[1] - ref) ** 2))
    print(f"calibrated: logits mse vs fp32 eager: head 8da4w {np.mean(e[4]):.4g}, head 8da8w {np.mean(e[8]):.4g}")
    assert np.mean(e[8]) < np.mean(e[4]), e


def test_auto_with_head8_keeps_the_head_qc8w_within_the_budget(tmp_path):
    """--quantize auto --quantize-head 8: the head 8da8w whatever the plan (outside the knapsack, its bytes counted
    first). At the smallest budget the plan then allows, the other layers are int4; the file fits, the metadata and
    the payloads agree, and the head's logits are torchao's 8da8w in ExecuTorch's runtime and kiln's."""
    out = tmp_path / "m"
    model, windows = _setup(out, tied=True)
    common = ["--quantize", "auto", "--quantize-scales", "minmax", "--quantize-head", "8"]
    _lower(out, tmp_path / "probe.pte", *common, "--max-size", "10")
    probe = json.loads((tmp_path / "probe.json").read_text())["quantize_auto"]
    budget = probe["all_int4_bytes"]  # the head int8, every other layer int4
    # below it: one error line naming that minimum
    bad = _lower(out, tmp_path / "bad.pte", *common, "--max-size", f"{(budget - 2000) / 1e6:.6f}", check=False)
    assert bad.returncode == 1 and bad.stderr.startswith("kiln: error: ") and bad.stderr.count("\n") == 1, bad.stderr
    assert f"is {budget / 1e6:.2f} MB" in bad.stderr and "but the head 8da8w" in bad.stderr, bad.stderr
    assert not (tmp_path / "bad.pte").exists()
    pte = tmp_path / "a.pte"
    _lower(out, pte, *common, "--max-size", f"{budget / 1e6:.6f}")
    meta = json.loads(pte.with_suffix(".json").read_text())
    a = meta["quantize_auto"]
    assert pte.stat().st_size <= budget and a["estimate_bytes"] <= budget, (pte.stat().st_size, a)
    forced = [L for L in a["layers"] if L["forced_int8"]]
    assert len(forced) == 1 and forced[0]["layer"] == "head" and forced[0]["scheme"] == "8da8w", a["layers"]
    assert a["int8_layers"] == 1 and meta["quantize_head"]["layer"] == "head", a
    assert _filters(pte, tmp_path / "p") == Counter({(H, D, QB4): 2, (D, H, QB4): 1, (V, D, QC8): 1})
    # without the flag, the same budget buys other layers (the plan's own choice; the head is the largest layer)
    _lower(out, tmp_path / "free.pte", "--quantize", "auto", "--quantize-scales", "minmax", "--max-size",
           f"{budget / 1e6:.6f}")
    free = json.loads((tmp_path / "free.json").read_text())["quantize_auto"]
    assert not any(L["forced_int8"] for L in free["layers"]) and free["all_int4_bytes"] < budget, free
    qhead8 = _torchao_head(model, 8)
    for w in windows[:2]:
        inputs = [w, np.arange(T)]
        tap, logits = et_execute(pte, inputs)
        check_stage(qhead8[0], tap.reshape(T, D), qhead8, logits.reshape(T, V),
                    "auto --quantize-head 8: ExecuTorch's runtime's head vs torchao 8da8w")
        ktap, klogits = kiln_run(pte, inputs, tmp_path)
        assert_close(klogits, logits, "auto --quantize-head 8: kiln's runtime vs ExecuTorch's runtime")


@pytest.mark.parametrize("args,message", [
    (["--quantize-head", "8"], "--quantize-head 8 needs --quantize 8da4w"),
    (["--quantize", "8da8w", "--quantize-head", "8"], "--quantize-head 8 needs --quantize 8da4w"),
    (["--quantize", "int8w", "--quantize-head", "8"], "--quantize-head 8 needs --quantize 8da4w"),
    (["--quantize", "8da4w", "--quantize-head", "6"], "--quantize-head takes 4 or 8"),
    (["--quantize", "8da4w", "--quantize-head", "8", "--quantize-skip", "^head$"], "keeps the head 'head' fp32"),
])
def test_bad_quantize_head_is_one_clear_line(args, message, tmp_path):
    out = tmp_path / "m"
    _setup(out, tied=True)
    pte = tmp_path / "bad.pte"
    proc = _lower(out, pte, *args, check=False)
    assert proc.returncode == 1 and proc.stderr.startswith("kiln: error: ") and message in proc.stderr, proc.stderr
    assert proc.stderr.count("\n") == 1, proc.stderr
    assert not pte.exists()


def test_portable_backend_is_one_clear_line(tmp_path):
    out = tmp_path / "m"
    _setup(out, tied=True)
    pte = tmp_path / "bad.pte"
    proc = run_kiln("lower", "--spec", out / "model_spec.json", "--out", pte, "-q", "--quantize", "8da4w",
                    "--quantize-head", "8", check=False)
    assert proc.returncode == 1 and "--quantize-head 8 needs --quantize 8da4w" in proc.stderr, proc.stderr
    assert "--backend portable" in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
    assert not pte.exists()
