"""End-to-end test of the ExecuTorch reference lowering (bench/reference/lower_with_executorch.py).

Exports tiny GPT-2 with the kiln export front end, lowers it with ExecuTorch for
both backends, checks the metadata JSON against the files and graphs it
describes, and runs each .pte in ExecuTorch's runtime against the eager output.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from executorch.runtime import Runtime

from conftest import run_export

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "bench" / "reference" / "lower_with_executorch.py"
SEQ_LEN = 16
BACKENDS = ("portable", "xnnpack")
EXPECTED_KEYS = {
    "model", "model_id", "backend", "exported_program", "pte", "pte_size_mb", "seq_len",
    "delegation", "lowering_seconds", "executorch_version",
}
STAGES = {"to_edge_transform_and_lower", "to_executorch", "serialize", "total"}


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(REPO / "python")] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    return env


def _run(args, **kw):
    return subprocess.run([sys.executable, *args], cwd=REPO, env=_env(), capture_output=True,
                          text=True, **kw)


@pytest.fixture(scope="module")
def tiny_spec(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("gpt2_tiny")
    run_export("gpt2", "--config", "tiny", "--seq-len", SEQ_LEN, "--out", out)
    spec = out / "model_spec.json"
    assert spec.is_file()
    return spec


@pytest.fixture(scope="module")
def lowered(tiny_spec) -> dict:
    """backend -> (metadata dict, stdout) for both backends, lowered once per module."""
    results = {}
    for backend in BACKENDS:
        r = _run([str(SCRIPT), "--spec", str(tiny_spec), "--backend", backend])
        assert r.returncode == 0, f"{backend} lowering failed:\n{r.stdout}\n{r.stderr}"
        meta_path = tiny_spec.parent / f"gpt2_{backend}_et.json"
        assert meta_path.is_file(), f"no metadata JSON at {meta_path}"
        results[backend] = (json.loads(meta_path.read_text()), r.stdout)
    return results


@pytest.mark.parametrize("backend", BACKENDS)
def test_metadata_consistent(tiny_spec, lowered, backend):
    meta, stdout = lowered[backend]
    spec = json.loads(tiny_spec.read_text())
    assert set(meta) == EXPECTED_KEYS
    assert meta["model"] == spec["name"] == "gpt2"
    assert meta["model_id"] == spec["model_id"]
    assert meta["backend"] == backend
    assert meta["seq_len"] == spec["seq_len"] == SEQ_LEN
    assert Path(meta["exported_program"]).resolve() == \
        (tiny_spec.parent / spec["exported_program"]).resolve()

    pte = Path(meta["pte"])
    assert pte.resolve() == (tiny_spec.parent / f"gpt2_{backend}_et.pte").resolve()
    assert pte.is_file()
    assert meta["pte_size_mb"] == pte.stat().st_size / 1e6
    # No temp files left behind beside the outputs.
    assert not [p.name for p in tiny_spec.parent.iterdir() if p.name.endswith(".tmp")]

    d = meta["delegation"]
    assert isinstance(d, dict)
    if backend == "portable":
        assert d["delegate_call_sites"] == 0
        assert d.get("delegated_node_count", 0) == 0
    else:
        assert d["delegate_call_sites"] >= 1
        assert d["delegated_node_count"] >= d["delegate_call_sites"]
    for hist_key, count_key in (("fallback_ops", "fallback_count"),
                                ("edge_fallback_ops", "edge_fallback_count")):
        hist = d[hist_key]
        assert all(isinstance(v, int) and v > 0 for v in hist.values())
        assert d[count_key] == sum(hist.values())
    # The delegate op itself is never counted as a fallback.
    assert not [k for k in d["fallback_ops"] if "executorch_call_delegate" in k]
    # to_executorch adds memory planning (alloc) nodes, so its graph has more call_functions.
    assert d["fallback_count"] > d["edge_fallback_count"]
    assert any(k.endswith("memory.alloc") for k in d["fallback_ops"])
    if backend == "portable":
        # Portable programs run only out-variant kernels (plus memory/getitem helpers).
        aten = [k for k in d["fallback_ops"] if k.startswith("aten.")]
        assert aten and all(k.endswith("out") or "_out" in k for k in aten), aten

    s = meta["lowering_seconds"]
    assert set(s) == STAGES
    assert all(v >= 0 for v in s.values())
    parts = s["to_edge_transform_and_lower"] + s["to_executorch"] + s["serialize"]
    assert s["total"] == pytest.approx(parts)
    assert meta["executorch_version"].startswith("1.5")

    assert f"backend {backend}" in stdout
    assert f"delegate call sites: {d['delegate_call_sites']}" in stdout


def test_xnnpack_delegates_fallbacks(lowered):
    portable = lowered["portable"][0]["delegation"]
    xnnpack = lowered["xnnpack"][0]["delegation"]
    # Delegation moves work out of the portable path: fewer fallback nodes remain.
    assert xnnpack["edge_fallback_count"] < portable["edge_fallback_count"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_pte_runs_and_matches_eager(tiny_spec, lowered, backend):
    meta, _ = lowered[backend]
    spec = json.loads(tiny_spec.read_text())
    x = torch.from_numpy(np.load(tiny_spec.parent / spec["inputs"][0]["reference"]))
    ref = np.load(tiny_spec.parent / spec["outputs"][0]["reference"])

    program = Runtime.get().load_program(meta["pte"])
    method = program.load_method("forward")
    assert method is not None
    outputs = method.execute([x])
    assert len(outputs) == 1
    got = outputs[0].numpy()
    assert got.shape == ref.shape == tuple(spec["outputs"][0]["shape"])
    assert got.dtype == np.float32
    diff = float(np.abs(got - ref).max())
    tol = 1e-4 * float(np.abs(ref).max())
    assert diff <= tol, f"{backend}: max |diff| {diff} > {tol}"


def test_out_path(tiny_spec, tmp_path):
    out = tmp_path / "custom.pte"
    r = _run([str(SCRIPT), "--spec", str(tiny_spec), "--backend", "portable", "--out", str(out)])
    assert r.returncode == 0, r.stderr
    meta = json.loads((tmp_path / "custom.json").read_text())
    assert Path(meta["pte"]) == out
    assert meta["pte_size_mb"] == out.stat().st_size / 1e6


def _assert_one_line_error(r, needle):
    assert r.returncode != 0
    # Library warnings may precede it; the script itself says exactly one line.
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("lower_with_executorch:")]
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("lower_with_executorch: error:")
    assert needle in lines[0]
    # No traceback from the script itself (libraries may log their own, prefixed).
    assert not [ln for ln in r.stderr.splitlines() if ln.startswith("Traceback")], r.stderr


def test_missing_spec(tmp_path):
    r = _run([str(SCRIPT), "--spec", str(tmp_path / "nope.json"), "--backend", "portable"])
    _assert_one_line_error(r, "spec not found")


def test_missing_pt2(tiny_spec, tmp_path):
    spec = json.loads(tiny_spec.read_text())
    spec["exported_program"] = "missing.pt2"
    bad = tmp_path / "model_spec.json"
    bad.write_text(json.dumps(spec))
    r = _run([str(SCRIPT), "--spec", str(bad), "--backend", "xnnpack"])
    _assert_one_line_error(r, "exported program not found")
    assert not list(tmp_path.glob("*.pte"))


def test_corrupt_pt2_leaves_no_output(tiny_spec, tmp_path):
    spec = json.loads(tiny_spec.read_text())
    (tmp_path / spec["exported_program"]).write_bytes(b"not a zip archive")
    (tmp_path / "model_spec.json").write_text(json.dumps(spec))
    r = _run([str(SCRIPT), "--spec", str(tmp_path / "model_spec.json"), "--backend", "portable"])
    _assert_one_line_error(r, "cannot load exported program")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["model_spec.json", spec["exported_program"]])
