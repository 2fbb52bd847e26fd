"""kiln lower --calibrate FILE --calibrate-method gptq | awq+gptq: GPTQ's error feedback on each linear input's Gram
matrix H = X^T X, collected from the fp32 program's activations in kiln's runtime (compiler/calibrate.h,
backends/xnnpack/quantize.h: quantize_weights_gptq).

Oracles and invariants: PyTorch eager gives the calibration inputs X (a hook on the layer, the same windows kiln
runs) and the fp32 logits; the int4 weights are read out of the written file (its qb4w blob through ExecuTorch's
deserializer) and GPTQ's objective sum_rows (w - q) H (w - q)^T is computed with numpy: it must be far below the
plain (uncalibrated, mse-scale) rounding's on the same H, which is what GPTQ minimises. ExecuTorch's runtime runs
the files unchanged (same qb4w format) and kiln's runtime agrees with it."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from conftest import assert_close, et_execute, run_kiln
from test_calibrate import CALIBRATION, D, H, T, V, TinyLM, _byte_tokenizer
from test_xnnpack_runtime import kiln_run


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    out = tmp_path_factory.mktemp("gptq")
    model = TinyLM().eval()
    example = (torch.zeros(1, T, dtype=torch.long), torch.arange(T))
    torch.export.save(torch.export.export(model, example), out / "m.pt2")
    spec = {"name": "m", "model_id": "tests/gptq", "seq_len": T, "exported_program": "m.pt2", "ir": "default",
            "inputs": [{"name": "tokens", "dtype": "int64", "shape": [1, T]},
                       {"name": "input_pos", "dtype": "int64", "shape": [T]}],
            "outputs": [{"name": "logits", "dtype": "float32", "shape": [1, T, 256]}]}
    (out / "model_spec.json").write_text(json.dumps(spec))
    tok = _byte_tokenizer(out / "tokenizer.json")
    (out / "calibration.txt").write_text(CALIBRATION)
    ids = tok.encode(CALIBRATION).ids
    # kiln's windows for a static program of T positions without a cache length: whole steps of T from position 0
    windows = [np.array([ids[i:i + T]], dtype=np.int64) for i in range(0, len(ids) - T + 1, T)]
    xs = []
    hook = model.up.register_forward_pre_hook(lambda m, a: xs.append(a[0].detach().reshape(-1, D).double().numpy()))
    with torch.no_grad():
        refs = [model(torch.from_numpy(w), torch.arange(T)).numpy() for w in windows]
    hook.remove()
    x = np.concatenate(xs)
    return out, model, windows, refs, x.T @ x


def _lower(spec_dir, pte, *extra):
    run_kiln("lower", "--spec", spec_dir / "model_spec.json", "--backend", "xnnpack", "--quantize", "8da4w",
             "--out", pte, "-q", *extra)
    return json.loads(pte.with_suffix(".json").read_text())


def _int4_weight(pte, n: int, k: int, group: int = 32) -> np.ndarray:
    """The one qb4w weight [n, k] of the file (its data and bf16 scales blobs), dequantized with numpy."""
    from executorch.exir._serialize._program import deserialize_pte_binary

    named = deserialize_pte_binary(pte.read_bytes()).named_data
    blobs = [bytes(named.buffers[e.buffer_index]) for e in named.pte_data.values()]
    data = [b for b in blobs if len(b) == n * k // 2]
    scales = [b for b in blobs if len(b) == n * k // group * 2]
    assert len(data) == 1 and len(scales) == 1, (len(data), len(scales))
    b = np.frombuffer(data[0], dtype=np.uint8).reshape(n, k // 2)
    q = np.empty((n, k), dtype=np.float64)
    q[:, 0::2] = (b & 15).astype(np.float64) - 8  # the even input in the low nibble, as q + 8
    q[:, 1::2] = (b >> 4).astype(np.float64) - 8
    s16 = np.frombuffer(scales[0], dtype=np.uint16).reshape(n, k // group)
    s = (s16.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return q * np.repeat(s, group, axis=1)


def _objective(w: np.ndarray, q: np.ndarray, h: np.ndarray) -> float:
    d = w.astype(np.float64) - q
    return float(np.einsum("ri,ij,rj->", d, h, d))


def test_gptq_objective_below_plain_rounding(tiny, tmp_path):
    """Only `up` quantized (the others kept fp32): its int4 weight in the file, GPTQ's vs the plain rule's, on the
    calibration Gram matrix from eager."""
    out, model, _, _, h = tiny
    skip = ["--quantize-skip", "gate|down|head"]
    _lower(out, tmp_path / "plain.pte", *skip)
    meta = _lower(out, tmp_path / "gptq.pte", *skip, "--calibrate", out / "calibration.txt",
                  "--calibrate-method", "gptq")
    c = meta["calibration"]
    assert c["method"] == "gptq" and c["gptq_layers"] == 1 and c["tokens"] > 0, c
    w = model.up.weight.detach().numpy()
    plain, gptq = _int4_weight(tmp_path / "plain.pte", H, D), _int4_weight(tmp_path / "gptq.pte", H, D)
    e_plain, e_gptq = _objective(w, plain, h), _objective(w, gptq, h)
    print(f"gptq: objective {e_gptq:.4g} vs plain {e_plain:.4g}")
    assert e_gptq < 0.8 * e_plain, (e_gptq, e_plain)
    # and the weights stay a quantization of w (GPTQ trades weight error for output error, within bounds)
    assert np.linalg.norm(gptq - w) < 0.4 * np.linalg.norm(w)


def _int4_scales(pte, n: int, k: int, group: int = 32) -> bytes:
    from executorch.exir._serialize._program import deserialize_pte_binary

    named = deserialize_pte_binary(pte.read_bytes()).named_data
    blobs = [bytes(named.buffers[e.buffer_index]) for e in named.pte_data.values()]
    scales = [b for b in blobs if len(b) == n * k // group * 2]
    assert len(scales) == 1, len(scales)
    return scales[0]


def test_gptq_act_order_keeps_the_plain_scales_and_cuts_the_objective(tiny, tmp_path):
    """--calibrate-method gptq-act (act-order, static groups): the columns in decreasing diag(H) order, every group's
    bf16 scale the plain rule's on the original weights: the file's scales are byte for byte the uncalibrated file's,
    its codes differ, and GPTQ's objective on eager's Gram matrix is far below the plain rounding's."""
    out, model, _, _, h = tiny
    skip = ["--quantize-skip", "gate|down|head"]
    _lower(out, tmp_path / "plain.pte", *skip)
    meta = _lower(out, tmp_path / "act.pte", *skip, "--calibrate", out / "calibration.txt",
                  "--calibrate-method", "gptq-act")
    c = meta["calibration"]
    assert c["method"] == "gptq-act" and c["gptq_layers"] == 1, c
    assert _int4_scales(tmp_path / "act.pte", H, D) == _int4_scales(tmp_path / "plain.pte", H, D)
    w = model.up.weight.detach().numpy()
    plain, act = _int4_weight(tmp_path / "plain.pte", H, D), _int4_weight(tmp_path / "act.pte", H, D)
    assert not np.array_equal(plain, act)
    e_plain, e_act = _objective(w, plain, h), _objective(w, act, h)
    print(f"gptq-act: objective {e_act:.4g} vs plain {e_plain:.4g}")
    assert e_act < 0.8 * e_plain, (e_act, e_plain)
    assert np.linalg.norm(act - w) < 0.4 * np.linalg.norm(w)


def _logits_error(pte, windows, refs) -> float:
    """Mean squared logits error of the file in ExecuTorch's runtime against the references, over the windows."""
    return float(np.mean([np.mean((et_execute(pte, [w, np.arange(T)])[0] - r) ** 2)
                          for w, r in zip(windows, refs, strict=True)]))


def _runtimes_agree(pte, windows, tmp_path, what: str) -> None:
    """kiln's runtime gives ExecuTorch's runtime's logits on the file, for the first two windows."""
    for w in windows[:2]:
        et = et_execute(pte, [w, np.arange(T)])[0]
        got = kiln_run(pte, [w, np.arange(T)], tmp_path)[0]
        assert_close(got, et, f"{what}: kiln's runtime vs ExecuTorch's runtime, same file")


@pytest.mark.parametrize("method", ["gptq", "awq+gptq", "awq+gptq-act", "awq+gptq-act+refit", "awq+gptq-act+refit+seq"])
def test_gptq_cuts_the_output_error_on_calibration_text(tiny, tmp_path, method):
    out, _, windows, refs, _ = tiny
    plain = _lower(out, tmp_path / "plain.pte")
    meta = _lower(out, tmp_path / "cal.pte", "--calibrate", out / "calibration.txt", "--calibrate-method", method)
    assert meta["calibration"]["gptq_layers"] == 4, meta["calibration"]
    assert meta["delegation"]["quantized_nodes"] == plain["delegation"]["quantized_nodes"] == 4
    assert (tmp_path / "cal.pte").stat().st_size == pytest.approx((tmp_path / "plain.pte").stat().st_size, abs=64)

    e_plain = _logits_error(tmp_path / "plain.pte", windows, refs)
    e_cal = _logits_error(tmp_path / "cal.pte", windows, refs)
    print(f"{method}: logits mse {e_cal:.4g} vs {e_plain:.4g} uncalibrated")
    assert e_cal < 0.7 * e_plain, (e_cal, e_plain)
    _runtimes_agree(tmp_path / "cal.pte", windows, tmp_path, method)


def test_bad_calibration_method_is_one_error_line(tiny, tmp_path):
    out = tiny[0]
    for args, message in [(["--calibrate", out / "calibration.txt", "--calibrate-method", "sgd"],
                           "unknown calibration method 'sgd'"),
                          (["--calibrate", out / "calibration.txt", "--calibrate-method", "awq+seq"],
                           "+seq modifies a GPTQ method"),
                          (["--calibrate", out / "calibration.txt", "--calibrate-method", "gptq+awq"],
                           "awq comes first"),
                          (["--calibrate-method", "gptq"], "--calibrate-method needs --calibrate"),
                          (["--calibrate", out / "calibration.txt", "--calibrate-self", "8"], "not both"),
                          (["--calibrate-self", "8"], "one token per call")]:
        pte = tmp_path / "bad.pte"
        proc = run_kiln("lower", "--spec", out / "model_spec.json", "--backend", "xnnpack", "--quantize", "8da4w",
                        *args, "--out", pte, "-q", check=False)
        assert proc.returncode == 1 and proc.stderr.startswith("kiln: error: ") and message in proc.stderr, proc.stderr
        assert proc.stderr.count("\n") == 1 and not pte.exists(), proc.stderr


def test_self_calibration_runs_and_is_deterministic(tmp_path):
    """--calibrate-self N: the fp32 program samples its own text (one token per call, a fixed seed), GPTQ runs on
    the statistics of it; two lowerings write the same bytes, and both runtimes agree on the file."""
    positions = 16
    model = TinyLM().eval()
    model.pos = torch.nn.Embedding(positions, D)
    with torch.no_grad():
        model.pos.weight.copy_(0.1 * torch.randn(positions, D, generator=torch.Generator().manual_seed(1)))
    torch.export.save(torch.export.export(model, (torch.zeros(1, 1, dtype=torch.long), torch.tensor([0]))),
                      tmp_path / "m.pt2")
    spec = {"name": "m", "model_id": "tests/gptq_self", "seq_len": 1, "exported_program": "m.pt2", "ir": "default",
            "inputs": [{"name": "tokens", "dtype": "int64", "shape": [1, 1]},
                       {"name": "input_pos", "dtype": "int64", "shape": [1]}],
            "outputs": [{"name": "logits", "dtype": "float32", "shape": [1, 1, 256]}],
            "constant_methods": {"get_max_seq_len": positions}}
    (tmp_path / "model_spec.json").write_text(json.dumps(spec))
    _byte_tokenizer(tmp_path / "tokenizer.json")
    metas = [_lower(tmp_path, tmp_path / f"self{i}.pte", "--calibrate-self", "40", "--calibrate-method", "awq+gptq")
             for i in range(2)]
    c = metas[0]["calibration"]
    assert c["tokens"] == 40 and c["gptq_layers"] == 4 and c["method"] == "awq+gptq", c
    assert (tmp_path / "self0.pte").read_bytes() == (tmp_path / "self1.pte").read_bytes()
    plain = _lower(tmp_path, tmp_path / "plain.pte")
    assert (tmp_path / "self0.pte").read_bytes() != (tmp_path / "plain.pte").read_bytes()
    assert metas[0]["delegation"]["quantized_nodes"] == plain["delegation"]["quantized_nodes"] == 4
    for t in ([[5]], [[77]]):
        inputs = [np.array(t, dtype=np.int64), np.array([3])]
        et = et_execute(tmp_path / "self0.pte", inputs)[0]
        assert_close(kiln_run(tmp_path / "self0.pte", inputs, tmp_path)[0], et, "self-calibrated: kiln vs ExecuTorch")


@pytest.mark.parametrize("base", ["gptq", "gptq-act"])
def test_gptq_refit_scales_cut_the_objective_below_gptq(tiny, tmp_path, base):
    """--calibrate-method ...+refit: GPTQ's int4 codes kept, each row's bf16 group scales re-fitted jointly to the
    layer objective: the codes in the file are GPTQ's byte for byte, the scales differ, and the objective on eager's
    Gram matrix is below GPTQ's own (the refit's least squares over the scales, rounded to bf16, kept only where it
    lowers the row's objective)."""
    from executorch.exir._serialize._program import deserialize_pte_binary

    out, model, _, _, h = tiny
    skip = ["--quantize-skip", "gate|down|head"]
    cal = ["--calibrate", out / "calibration.txt", "--calibrate-method"]
    _lower(out, tmp_path / "gptq.pte", *skip, *cal, base)
    meta = _lower(out, tmp_path / "refit.pte", *skip, *cal, f"{base}+refit")
    assert meta["calibration"]["method"] == f"{base}+refit" and meta["calibration"]["gptq_layers"] == 1

    def codes(pte):
        named = deserialize_pte_binary(pte.read_bytes()).named_data
        return [bytes(named.buffers[e.buffer_index]) for e in named.pte_data.values()
                if len(named.buffers[e.buffer_index]) == H * D // 2]

    assert codes(tmp_path / "refit.pte") == codes(tmp_path / "gptq.pte")
    assert _int4_scales(tmp_path / "refit.pte", H, D) != _int4_scales(tmp_path / "gptq.pte", H, D)
    w = model.up.weight.detach().numpy()
    gptq, refit = _int4_weight(tmp_path / "gptq.pte", H, D), _int4_weight(tmp_path / "refit.pte", H, D)
    e_gptq, e_refit = _objective(w, gptq, h), _objective(w, refit, h)
    print(f"{base}+refit: objective {e_refit:.4g} vs {e_gptq:.4g} without the refit")
    assert e_refit < 0.95 * e_gptq, (e_refit, e_gptq)


def test_sequential_gptq_calibrates_later_layers_on_the_quantized_ones(tiny, tmp_path):
    """--calibrate-method gptq+seq: the inputs in program order, in stages; the first stage's layers (here `up`) are
    GPTQ's one-pass result byte for byte, and a later stage's (the head) is calibrated on the program with `up`
    already quantized. Oracle: PyTorch eager with the file's own int4 `up` gives the head's inputs X~; on
    H~ = X~^T X~, the sequential head's GPTQ objective is below the one-pass head's (which saw the fp32 inputs: 1.3%
    here, where `up`'s int4 error moves the head's inputs little), and far below the plain rounding's. ExecuTorch's runtime runs the file and kiln's runtime agrees with it."""
    out, model, windows, refs, _ = tiny
    skip = ["--quantize-skip", "gate|down"]
    plain = _lower(out, tmp_path / "plain.pte", *skip)
    one = _lower(out, tmp_path / "one.pte", *skip, "--calibrate", out / "calibration.txt", "--calibrate-method", "gptq")
    seq = _lower(out, tmp_path / "seq.pte", *skip, "--calibrate", out / "calibration.txt",
                 "--calibrate-method", "gptq+seq")
    c = seq["calibration"]
    assert c["method"] == "gptq+seq" and c["gptq_layers"] == 2 and c["gptq_stages"] == 2, c
    assert one["calibration"]["gptq_stages"] == 0
    assert plain["delegation"]["quantized_nodes"] == seq["delegation"]["quantized_nodes"] == 2
    up_one, up_seq = _int4_weight(tmp_path / "one.pte", H, D), _int4_weight(tmp_path / "seq.pte", H, D)
    assert np.array_equal(up_one, up_seq), "the first stage is one-pass GPTQ's"
    # the head's inputs in eager with the file's int4 `up` in place of the fp32 one
    xs = []
    with torch.no_grad():
        saved = model.up.weight.detach().clone()
        model.up.weight.copy_(torch.from_numpy(up_seq).float())
        hook = model.head.register_forward_pre_hook(lambda m, a: xs.append(a[0].reshape(-1, D).double().numpy()))
        try:
            for w in windows:
                model(torch.from_numpy(w), torch.arange(T))
        finally:
            hook.remove()
            model.up.weight.copy_(saved)
    x = np.concatenate(xs)
    h_seq = x.T @ x
    w = model.head.weight.detach().numpy()
    e = {name: _objective(w, _int4_weight(tmp_path / f"{name}.pte", V, D), h_seq) for name in ("plain", "one", "seq")}
    print(f"gptq+seq: head objective on the quantized program's inputs {e}")
    assert e["seq"] < e["one"] and e["seq"] < 0.5 * e["plain"], e
    for win in windows[:2]:
        et = et_execute(tmp_path / "seq.pte", [win, np.arange(T)])[0]
        got = kiln_run(tmp_path / "seq.pte", [win, np.arange(T)], tmp_path)[0]
        assert_close(got, et, "gptq+seq: kiln's runtime vs ExecuTorch's runtime, same file")


@pytest.mark.parametrize("method", ["awq+gptq", "gptq-act"])
def test_gptq_on_the_asym_grid(tiny, tmp_path, method):
    """--quantize-scales asym with --calibrate: GPTQ picks each group's scale and offset (the asym rule on the
    error-fed values, or the plain file's own with act-order) and feeds back the error of scale q + offset; the
    file holds its codes with the offsets (4 offset products, the same size as the uncalibrated asym file), its
    logits error on the calibration windows is well below the uncalibrated asym file's, and both runtimes agree."""
    out, _, windows, refs, _ = tiny
    plain = _lower(out, tmp_path / "plain.pte", "--quantize-scales", "asym")
    meta = _lower(out, tmp_path / "cal.pte", "--quantize-scales", "asym", "--calibrate", out / "calibration.txt",
                  "--calibrate-method", method)
    assert meta["calibration"]["gptq_layers"] == 4, meta["calibration"]
    for m in (plain, meta):
        assert m["delegation"]["quantized_nodes"] == m["delegation"]["int4_offset_nodes"] == 4, m["delegation"]
    assert (tmp_path / "cal.pte").stat().st_size == pytest.approx((tmp_path / "plain.pte").stat().st_size, abs=64)

    e_plain = _logits_error(tmp_path / "plain.pte", windows, refs)
    e_cal = _logits_error(tmp_path / "cal.pte", windows, refs)
    print(f"asym {method}: logits mse {e_cal:.4g} vs {e_plain:.4g} uncalibrated asym")
    assert e_cal < 0.7 * e_plain, (e_cal, e_plain)
    _runtimes_agree(tmp_path / "cal.pte", windows, tmp_path, f"asym {method}")
