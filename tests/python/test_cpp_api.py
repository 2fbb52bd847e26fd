"""kiln as a C++ package: `cmake --install` the build, build tests/consumer (an
external CMake project: find_package(kiln), links kiln::runtime) against the
install prefix, and run tiny GPT-2 through kiln::Module. The oracle is the
eager PyTorch output the export front end saved."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from conftest import REPO, assert_close, export_model, reference_io, run_kiln, spec_of


def _build_dir() -> Path:
    return Path(os.environ.get("KILN_BIN", REPO / "build" / "kiln")).resolve().parent


def _run(cmd, **kw):
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kw)
    assert proc.returncode == 0, f"{' '.join(map(str, cmd))} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


@pytest.fixture(scope="module")
def consumer(tmp_path_factory) -> Path:
    """The consumer binary, built against a fresh install prefix of this build."""
    cmake = shutil.which("cmake")
    assert cmake is not None, "cmake not found (scripts/setup installs it)"
    tmp = tmp_path_factory.mktemp("kiln_package")
    prefix = tmp / "prefix"
    _run([cmake, "--install", _build_dir(), "--prefix", prefix])
    # only public headers: nothing generated, no writer or compiler headers
    headers = sorted(p.relative_to(prefix / "include").as_posix() for p in (prefix / "include").rglob("*.h"))
    assert "kiln/runtime/module.h" in headers
    assert not [h for h in headers if h.startswith(("kiln/fb/", "kiln/pte/", "kiln/emit/", "kiln/compiler/"))], headers
    build = tmp / "consumer-build"
    env = {k: v for k, v in os.environ.items() if k not in ("CMAKE_PREFIX_PATH",)}
    _run([cmake, "-S", REPO / "tests" / "consumer", "-B", build, "-G", "Ninja", f"-DCMAKE_PREFIX_PATH={prefix}",
          "-DCMAKE_BUILD_TYPE=Release"], env=env)
    _run([cmake, "--build", build], env=env)
    return build / "kiln_consumer"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return export_model(tmp_path_factory.mktemp("gpt2_tiny_api"), "--config", "tiny", "--seq-len", "16")


@pytest.mark.parametrize("backend,engine", [("portable", "kiln"), ("xnnpack", "kiln"), ("xnnpack", "xnnpack")])
def test_consumer_runs_tiny_gpt2(consumer, tiny, tmp_path, backend, engine):
    pte = tmp_path / f"gpt2_{backend}.pte"
    run_kiln("lower", "--spec", tiny, "--backend", backend, "--out", pte, "-q")
    spec = spec_of(tiny)
    ins, refs = reference_io(tiny)
    out = tmp_path / "logits.npy"
    proc = _run([consumer, pte, tiny.parent / spec["inputs"][0]["reference"], out, "--threads", "2",
                 "--engine", engine])
    assert "1 output(s)" in proc.stdout
    got = np.load(out)
    assert got.dtype == np.float32
    assert_close(got, refs[0], f"kiln::Module on tiny GPT-2 ({backend}, engine {engine}) vs eager PyTorch")


def test_consumer_reports_bad_input(consumer, tiny, tmp_path):
    """A wrong-shaped input is one error line from the Module, not a crash."""
    pte = tmp_path / "gpt2_portable.pte"
    run_kiln("lower", "--spec", tiny, "--backend", "portable", "--out", pte, "-q")
    bad = tmp_path / "bad.npy"
    np.save(bad, np.zeros((1, 7), dtype=np.int64))
    proc = subprocess.run([str(consumer), str(pte), str(bad), str(tmp_path / "o.npy")], capture_output=True, text=True)
    assert proc.returncode == 1
    assert len(proc.stderr.strip().splitlines()) == 1 and "input 0" in proc.stderr
