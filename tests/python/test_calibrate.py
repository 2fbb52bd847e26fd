"""kiln lower --calibrate FILE (compiler/calibrate.h): the fp32 program runs over the text in kiln's runtime, and
AWQ-style input-channel scales are folded into the constants (a norm's weight, an up projection's rows).

Oracles: ExecuTorch's runtime runs the calibrated file unchanged (same operators, same qb4w format) and kiln's
runtime agrees with it on the same file; PyTorch eager gives the fp32 reference the quantized outputs are measured
against. The model is tiny, with a few input channels whose activations are 30x the others' (an RMSNorm weight
with outliers, as trained LLMs have): the error calibration must cut there is the one AWQ is about."""
from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest
import torch

from conftest import assert_close, et_execute, run_kiln
from test_xnnpack_runtime import kiln_run

T, D, H, V = 8, 64, 128, 256
CALIBRATION = ("It was the best of times, it was the worst of times, it was the age of wisdom, it was the age of "
               "foolishness, it was the epoch of belief, it was the epoch of incredulity, it was the season of Light, "
               "it was the season of Darkness, it was the spring of hope, it was the winter of despair.")
EVAL = "Call me Ishmael. Some years ago, never mind how long precisely, having little or no money in my purse."


class TinyLM(torch.nn.Module):
    """tokens [1, T], input_pos [T] -> logits [1, T, V]: embedding, RMSNorm, gated MLP, RMSNorm, LM head."""

    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.emb = torch.nn.Embedding(V, D)
        self.pos = torch.nn.Embedding(T, D)
        self.norm1 = torch.nn.Parameter(1 + 0.1 * torch.randn(D, generator=g))
        self.norm2 = torch.nn.Parameter(1 + 0.1 * torch.randn(D, generator=g))
        with torch.no_grad():
            for w in (self.norm1, self.norm2):
                w[[3, 17, 40, 55]] *= 30  # outlier channels
            self.emb.weight.copy_(torch.randn(V, D, generator=g))
            self.pos.weight.copy_(0.1 * torch.randn(T, D, generator=g))
        self.gate = torch.nn.Linear(D, H, bias=False)
        self.up = torch.nn.Linear(D, H, bias=False)
        self.down = torch.nn.Linear(H, D, bias=False)
        self.head = torch.nn.Linear(D, V, bias=False)
        with torch.no_grad():
            for lin in (self.gate, self.up, self.down, self.head):
                lin.weight.copy_(torch.randn(lin.weight.shape, generator=g) / lin.weight.shape[1] ** 0.5)

    @staticmethod
    def rms(x, w):
        return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5))

    def forward(self, tokens, input_pos):
        h = self.emb(tokens) + self.pos(input_pos)
        x = self.rms(h, self.norm1)
        h = h + self.down(torch.nn.functional.silu(self.gate(x)) * self.up(x))
        return self.head(self.rms(h, self.norm2))


def _byte_tokenizer(path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    tok = Tokenizer(models.BPE(vocab={ch: i for i, ch in enumerate(sorted(alphabet))}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.save(str(path))
    return tok


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    out = tmp_path_factory.mktemp("calibrate")
    model = TinyLM().eval()
    example = (torch.zeros(1, T, dtype=torch.long), torch.arange(T))
    torch.export.save(torch.export.export(model, example), out / "m.pt2")
    spec = {"name": "m", "model_id": "tests/calibrate", "seq_len": T, "exported_program": "m.pt2", "ir": "default",
            "inputs": [{"name": "tokens", "dtype": "int64", "shape": [1, T]},
                       {"name": "input_pos", "dtype": "int64", "shape": [T]}],
            "outputs": [{"name": "logits", "dtype": "float32", "shape": [1, T, V]}]}
    (out / "model_spec.json").write_text(json.dumps(spec))
    tok = _byte_tokenizer(out / "tokenizer.json")
    (out / "calibration.txt").write_text(CALIBRATION)
    ids = tok.encode(EVAL).ids
    windows = [np.array([ids[i:i + T]], dtype=np.int64) for i in range(0, len(ids) - T + 1, T)]
    with torch.no_grad():
        refs = [model(torch.from_numpy(w), torch.arange(T)).numpy() for w in windows]
    return out, windows, refs


def _lower(spec_dir, pte, *extra, quantize="8da4w"):
    run_kiln("lower", "--spec", spec_dir / "model_spec.json", "--backend", "xnnpack", "--quantize", quantize,
             "--out", pte, "-q", *extra)
    return json.loads(pte.with_suffix(".json").read_text())


def _error(pte, windows, refs) -> float:
    """mean squared error of the file's logits (ExecuTorch's runtime) against fp32 eager, over the eval windows"""
    sq = [np.mean((et_execute(pte, [w, np.arange(T)])[0] - r) ** 2) for w, r in zip(windows, refs, strict=True)]
    return float(np.mean(sq))


def test_calibration_cuts_the_error_of_outlier_channels(tiny, tmp_path):
    out, windows, refs = tiny
    plain = _lower(out, tmp_path / "plain.pte")
    meta = _lower(out, tmp_path / "cal.pte", "--calibrate", out / "calibration.txt", "--calibrate-method", "awq")
    assert "calibration" not in plain
    c = meta["calibration"]
    # both norms fold (gate+up behind norm1, the head behind norm2) and the up rows fold for down
    assert c["inputs_found"] == 3 and c["inputs_scaled"] >= 2 and c["tokens"] > 0, c
    # the output-aware int4 groups are what the file stores (the payload's quantizer re-finds each grid)
    assert c["int4_groups"] > (D * H * 2 + H * D + D * V) // 32 // 2 and c["int4_groups_not_reproduced"] == 0, c
    assert meta["delegation"]["quantized_nodes"] == plain["delegation"]["quantized_nodes"] == 4
    assert (tmp_path / "cal.pte").stat().st_size == pytest.approx((tmp_path / "plain.pte").stat().st_size, abs=64)
    e_plain, e_cal = _error(tmp_path / "plain.pte", windows, refs), _error(tmp_path / "cal.pte", windows, refs)
    print(f"calibrate: logits mse {e_cal:.4g} calibrated vs {e_plain:.4g} uncalibrated")
    assert e_cal < 0.7 * e_plain, f"calibrated logits' mse {e_cal:.4g} vs uncalibrated {e_plain:.4g}"


def test_calibrated_file_runs_the_same_in_both_runtimes(tiny, tmp_path):
    out, windows, refs = tiny
    _lower(out, tmp_path / "cal.pte", "--calibrate", out / "calibration.txt")
    for w in windows[:2]:
        et = et_execute(tmp_path / "cal.pte", [w, np.arange(T)])[0]
        got = kiln_run(tmp_path / "cal.pte", [w, np.arange(T)], tmp_path)[0]
        assert_close(got, et, "calibrated 8da4w: kiln's runtime vs ExecuTorch's runtime, same file")


@pytest.mark.parametrize("args,message", [
    (["--calibrate", "/nonexistent/text.txt"], "cannot open the calibration text"),
    (["--calibrate", "{out}/calibration.txt", "--quantize", "int8w"], "--calibrate needs --quantize 8da4w or 8da8w"),
])
def test_bad_calibration_is_one_error_line(tiny, tmp_path, args, message):
    out, _, _ = tiny
    pte = tmp_path / "bad.pte"
    args = [a.format(out=out) for a in args]
    quant = [] if "--quantize" in args else ["--quantize", "8da4w"]
    proc = run_kiln("lower", "--spec", out / "model_spec.json", "--backend", "xnnpack", *quant, *args, "--out", pte,
                    "-q", check=False)
    assert proc.returncode == 1 and proc.stderr.startswith("kiln: error: ") and message in proc.stderr, proc.stderr
    assert proc.stderr.count("\n") == 1, proc.stderr
    assert not pte.exists()


@pytest.fixture(scope="module")
def tiny_static_and_dynamic(tmp_path_factory):
    """TinyLM exported twice: one token per call (T = 1, the static decode form) and a dynamic T in 1..8 (the
    prefill form), both with get_max_seq_len 8, so --calibrate runs the same windows of 8 positions either way"""
    out = tmp_path_factory.mktemp("calibrate_forms")
    model = TinyLM().eval()
    _byte_tokenizer(out / "tokenizer.json")
    (out / "calibration.txt").write_text(CALIBRATION)
    t = torch.export.Dim("t", min=1, max=T)
    forms = {"static": torch.export.export(model, (torch.zeros(1, 1, dtype=torch.long), torch.arange(1))),
             "dynamic": torch.export.export(model, (torch.zeros(1, 2, dtype=torch.long), torch.arange(2)),
                                            dynamic_shapes={"tokens": {1: t}, "input_pos": {0: t}})}
    specs = {}
    for name, ep in forms.items():
        d = out / name
        d.mkdir()
        torch.export.save(ep, d / "m.pt2")
        n = 1 if name == "static" else T
        spec = {"name": "m", "model_id": "tests/calibrate", "seq_len": n, "exported_program": "m.pt2",
                "ir": "default", "inputs": [{"name": "tokens", "dtype": "int64", "shape": [1, n]},
                                            {"name": "input_pos", "dtype": "int64", "shape": [n]}],
                "outputs": [{"name": "logits", "dtype": "float32", "shape": [1, n, V]}],
                "constant_methods": {"get_max_seq_len": T}}
        (d / "model_spec.json").write_text(json.dumps(spec))
        (d / "tokenizer.json").write_bytes((out / "tokenizer.json").read_bytes())
        specs[name] = d
    return out, specs, model


@pytest.mark.parametrize("method", ["awq", "awq+gptq"])
def test_chunked_calibration_matches_one_token_per_call(tiny_static_and_dynamic, tmp_path, method):
    """--calibrate on a dynamic program runs up to a window of tokens per call; on a static one-token program, one
    token per call. The model has no attention, so both see the same activations: the statistics (AWQ's choices,
    its error proxies, GPTQ's objective on each input's X^T X) must agree up to float rounding, the token count must
    be the text's (the `tokenizers` package), and the two calibrated programs must compute the same logits
    (ExecuTorch's runtime, against each other and near fp32 eager)."""
    from tokenizers import Tokenizer

    out, specs, model = tiny_static_and_dynamic
    meta = {}
    for name, d in specs.items():
        meta[name] = _lower(d, tmp_path / f"{name}.pte", "--calibrate", out / "calibration.txt", "--calibrate-method",
                            method)["calibration"]
    s, d = meta["static"], meta["dynamic"]
    n_ids = len(Tokenizer.from_file(str(out / "tokenizer.json")).encode(CALIBRATION).ids)
    assert s["tokens"] == d["tokens"] == n_ids, (s["tokens"], d["tokens"], n_ids)
    assert s["choices"] == d["choices"], (s["choices"], d["choices"])
    for key in ("proxy_before", "proxy_after", "gptq_objective_plain", "gptq_objective"):
        assert d[key] == pytest.approx(s[key], rel=1e-4, abs=1e-9), (key, s[key], d[key])
    assert s["inputs_scaled"] == d["inputs_scaled"] and s["int4_groups"] == d["int4_groups"]
    ids = np.array([[5, 77, 130, 200, 31, 8, 99, 250]], dtype=np.int64)
    with torch.no_grad():
        ref = model(torch.from_numpy(ids), torch.arange(T)).numpy()
    dyn = et_execute(tmp_path / "dynamic.pte", [ids, np.arange(T)])[0]
    static = np.concatenate([et_execute(tmp_path / "static.pte", [ids[:, i:i + 1], np.arange(i, i + 1)])[0]
                             for i in range(T)], axis=1)
    assert_close(dyn, static, "calibrated from windows vs calibrated one token per call (same eval input)")
    assert np.mean((dyn - ref) ** 2) < 0.05 * np.mean(ref ** 2), "calibrated 8da4w far from fp32 eager"


def test_calibrated_auto_cuts_the_error_within_the_budget(tiny, tmp_path):
    """--quantize auto --calibrate: AWQ's channel scales folded first (no int4 grid written: the plan then picks int4
    or int8 per layer). At a budget between all-int4 and all-int8, the calibrated file fits, ExecuTorch's runtime
    runs it, and its logits are closer to fp32 eager than the uncalibrated auto file's at the same budget."""
    out, windows, refs = tiny
    probe = _lower(out, tmp_path / "probe.pte", "--max-size", "10", quantize="auto")["quantize_auto"]
    budget = probe["all_int4_bytes"] + (probe["all_int8_bytes"] - probe["all_int4_bytes"]) // 3
    mb = f"{budget / 1e6:.6f}"
    plain = _lower(out, tmp_path / "plain.pte", "--max-size", mb, quantize="auto")
    cal = _lower(out, tmp_path / "cal.pte", "--max-size", mb, "--calibrate", out / "calibration.txt",
                 "--calibrate-method", "awq", quantize="auto")
    c = cal["calibration"]
    assert c["inputs_scaled"] >= 2 and c["int4_groups"] == 0 and c["method"] == "awq", c
    for name in ("plain", "cal"):
        assert (tmp_path / f"{name}.pte").stat().st_size <= budget
    e_plain, e_cal = _error(tmp_path / "plain.pte", windows, refs), _error(tmp_path / "cal.pte", windows, refs)
    print(f"calibrated auto: logits mse {e_cal:.4g} vs {e_plain:.4g} uncalibrated "
          f"(int8 layers {cal['quantize_auto']['int8_layers']} vs {plain['quantize_auto']['int8_layers']})")
    assert e_cal < 0.8 * e_plain, (e_cal, e_plain)


def test_calibrated_auto_with_gptq(tiny, tmp_path):
    """--quantize auto --calibrate (the default method, awq+gptq): AWQ's scales, then the plan, then GPTQ to each
    layer's chosen form. The plan is made before
    GPTQ, so it is awq's plan at the same budget; GPTQ quantizes every layer (int4 and int8); the file fits, holds
    the forms the metadata reports, ExecuTorch's runtime and kiln's agree on it, and its logits are closer to fp32
    eager than the uncalibrated auto file's."""
    from test_quantize_auto import _filters

    out, windows, refs = tiny
    probe = _lower(out, tmp_path / "probe.pte", "--max-size", "10", quantize="auto")["quantize_auto"]
    budget = probe["all_int4_bytes"] + (probe["all_int8_bytes"] - probe["all_int4_bytes"]) // 3
    mb = f"{budget / 1e6:.6f}"
    plain = _lower(out, tmp_path / "plain.pte", "--max-size", mb, quantize="auto")
    awq = _lower(out, tmp_path / "awq.pte", "--max-size", mb, "--calibrate", out / "calibration.txt",
                 "--calibrate-method", "awq", quantize="auto")
    pte = tmp_path / "gptq.pte"  # the default method: awq+gptq
    meta = _lower(out, pte, "--max-size", mb, "--calibrate", out / "calibration.txt", quantize="auto")
    c, a = meta["calibration"], meta["quantize_auto"]
    assert c["method"] == "awq+gptq" and c["gptq_layers"] == len(a["layers"]) == 4, c
    assert [L["scheme"] for L in a["layers"]] == [L["scheme"] for L in awq["quantize_auto"]["layers"]]
    assert 0 < a["int8_layers"] < 4, a  # a mix
    assert pte.stat().st_size <= budget and a["estimate_bytes"] <= budget
    want = Counter((L["n"], L["k"], "xnn_datatype_qcint8" if L["scheme"] == "8da8w" else "xnn_datatype_qbint4")
                   for L in a["layers"])
    assert _filters(pte, tmp_path / "p") == want, a["layers"]
    for w in windows[:2]:
        et = et_execute(pte, [w, np.arange(T)])[0]
        assert_close(kiln_run(pte, [w, np.arange(T)], tmp_path)[0], et, "auto awq+gptq: kiln's vs ExecuTorch's runtime")
    e_plain, e_awq, e_gptq = (_error(tmp_path / f"{n}.pte", windows, refs) for n in ("plain", "awq", "gptq"))
    print(f"auto at {mb} MB: logits mse {e_gptq:.4g} awq+gptq, {e_awq:.4g} awq, {e_plain:.4g} uncalibrated")
    assert e_gptq < 0.8 * e_plain, (e_gptq, e_plain)