"""Shared fixtures: the kiln binary, and tiny GPT-2 exported by the front end."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _kiln_bin() -> Path:
    path = Path(os.environ.get("KILN_BIN", REPO / "build" / "kiln"))
    if not path.is_file():
        raise RuntimeError(f"kiln binary not found at {path}; build first (scripts/test does)")
    return path


@pytest.fixture(scope="session")
def kiln_bin() -> Path:
    return _kiln_bin()


def run_kiln(*args, check=True, **kw) -> subprocess.CompletedProcess:
    """Runs the kiln CLI; returns the completed process (text mode)."""
    proc = subprocess.run([str(_kiln_bin()), *map(str, args)], capture_output=True, text=True, **kw)
    if check and proc.returncode != 0:
        raise AssertionError(f"kiln {' '.join(map(str, args))} failed ({proc.returncode}): {proc.stderr}")
    return proc


def export_model(out: Path, *extra: str) -> Path:
    """Runs the export front end; returns the model_spec.json path."""
    env = dict(os.environ, PYTHONPATH=str(REPO / "python"))
    cmd = [sys.executable, "-m", "kiln_export", "gpt2", "--out", str(out), *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise AssertionError(f"export failed: {' '.join(cmd)}\n{proc.stderr[-4000:]}")
    return out / "model_spec.json"


@pytest.fixture(scope="session", params=["default", "core_aten"])
def tiny_gpt2(request, tmp_path_factory) -> Path:
    """Tiny GPT-2 (2 layers, width 64, seq_len 16) in both IR flavors; yields the spec path."""
    out = tmp_path_factory.mktemp(f"gpt2_tiny_{request.param}")
    extra = ["--config", "tiny", "--seq-len", "16"]
    if request.param == "core_aten":
        extra.append("--decompose")
    return export_model(out, *extra)
