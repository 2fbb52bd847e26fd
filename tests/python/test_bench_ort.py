"""The ONNX Runtime peer of bench/compare, checked against PyTorch eager.

Tiny GPT-2 is exported by the front end (which saves eager's logits on a seeded input),
converted to ONNX by bench/ort_export.py's code path (the .pt2 kiln lowers, through
torch.onnx's dynamo exporter), and run in onnxruntime with the session bench/ort_bench.py
times: the logits must match eager's within DESIGN's fp32 tolerance. bench/ort_bench.py's
own check must pass on the true reference and fail on a perturbed one.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import REPO, export_model

import onnxruntime as ort  # noqa: E402  (the peer; requirements.txt: a missing package fails the run)
import onnxscript  # noqa: E402,F401  (torch.onnx's dynamo exporter needs it)
sys.path.insert(0, str(REPO / "bench"))
import ort_bench  # noqa: E402
import ort_export  # noqa: E402


@pytest.fixture(scope="module")
def tiny_onnx(tmp_path_factory):
    # seq_len 16 only, to stay fast; bench/compare checks seq_len 128 and 1 of GPT-2 small before every cell
    out = tmp_path_factory.mktemp("gpt2_tiny_onnx")
    spec_path = export_model(out, "--config", "tiny", "--seq-len", "16")
    onnx_path = ort_export.export_onnx(spec_path, quiet=True)
    return spec_path, onnx_path


def _ref(spec_path: Path):
    spec = json.loads(spec_path.read_text())
    d = spec_path.parent
    return np.load(d / spec["inputs"][0]["reference"]), np.load(d / spec["outputs"][0]["reference"])


@pytest.mark.parametrize("threads", [1, 2])
def test_ort_logits_match_eager(tiny_onnx, threads):
    spec_path, onnx_path = tiny_onnx
    assert onnx_path == spec_path.parent / "gpt2.onnx" and onnx_path.is_file()
    x, ref = _ref(spec_path)
    sess = ort.InferenceSession(str(onnx_path), sess_options=ort_bench.session_options(threads),
                                providers=["CPUExecutionProvider"])
    so = sess.get_session_options()
    assert (so.intra_op_num_threads, so.inter_op_num_threads) == (threads, 1)
    assert so.graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    [inp] = sess.get_inputs()
    out = sess.run(None, {inp.name: x})[0]
    assert out.shape == ref.shape
    diff = float(np.max(np.abs(out - ref)))
    assert diff <= 1e-4 * float(np.max(np.abs(ref))), f"max abs diff {diff}"
    # a different input gives different logits (the graph is not constant-folded to the reference)
    other = sess.run(None, {inp.name: (x + 1) % 1000})[0]
    assert float(np.max(np.abs(other - ref))) > 1e-2


def _ort_bench(onnx_path: Path, spec_path: Path, ref_path: Path) -> subprocess.CompletedProcess:
    spec = json.loads(spec_path.read_text())
    d = spec_path.parent
    shape = ",".join(str(s) for s in spec["inputs"][0]["shape"])
    return subprocess.run(
        [sys.executable, str(REPO / "bench" / "ort_bench.py"), str(onnx_path), "--input-shape", shape,
         "--threads", "2", "--iters", "2", "--warmup", "1",
         "--check-input", str(d / spec["inputs"][0]["reference"]), "--check-ref", str(ref_path)],
        capture_output=True, text=True)


def test_ort_bench_checks_against_eager(tiny_onnx, tmp_path):
    spec_path, onnx_path = tiny_onnx
    spec = json.loads(spec_path.read_text())
    ref_path = spec_path.parent / spec["outputs"][0]["reference"]
    proc = _ort_bench(onnx_path, spec_path, ref_path)
    assert proc.returncode == 0, proc.stderr
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    assert res["intra_op_num_threads"] == 2 and res["inter_op_num_threads"] == 1
    assert res["ort_version"] == ort.__version__
    assert 0 <= res["max_abs_diff"] <= res["tolerance"]
    assert len(res["times_ms"]) == 2 and res["median_ms"] > 0

    # one logit moved by 1 % of the output's range: the check must fail the run
    ref = np.load(ref_path)
    bad = ref.copy()
    bad.flat[bad.size // 2] += 0.01 * float(np.max(np.abs(ref)))
    bad_path = tmp_path / "bad_ref.npy"
    np.save(bad_path, bad)
    proc = _ort_bench(onnx_path, spec_path, bad_path)
    assert proc.returncode == 3, proc.stderr
    assert "ort_bench: error: logits differ from the eager reference" in proc.stderr
    assert proc.stdout.strip() == ""
