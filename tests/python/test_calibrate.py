"""kiln lower --calibrate FILE (compiler/calibrate.h): the fp32 program runs over the text in kiln's runtime, and
AWQ-style input-channel scales are folded into the constants (a norm's weight, an up projection's rows).

Oracles: ExecuTorch's runtime runs the calibrated file unchanged (same operators, same qb4w format) and kiln's
runtime agrees with it on the same file; PyTorch eager gives the fp32 reference the quantized outputs are measured
against. The model is tiny, with a few input channels whose activations are 30x the others' (an RMSNorm weight
with outliers, as trained LLMs have): the error calibration must cut there is the one AWQ is about."""
from __future__ import annotations

import json

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


def _lower(spec_dir, pte, *extra):
    run_kiln("lower", "--spec", spec_dir / "model_spec.json", "--backend", "xnnpack", "--quantize", "8da4w",
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
