"""Running a .pte in kiln's runtime from a test: in this process through kiln's Python binding (kiln.load) rather
than a `kiln run` process, a `kiln inspect` process and .npy files per call (issue 40). The model tests run a few
hundred programs; the binding is the same runtime (src/runtime, src/backends/xnnpack/runtime) behind the same
options (--threads, --engine), and `kiln run` itself keeps its own tests (test_runtime.py and one test in each
file that uses this helper, through run_pte_cli).

The binding is build/python/kiln beside KILN_BIN (scripts/build makes it once nanobind is in .venv); where it
is not built the helper runs `kiln run` instead, so no test depends on it being there."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Optional

import numpy as np

from conftest import REPO, run_kiln

_PACKAGE = Path(os.environ.get("KILN_BIN", REPO / "build" / "kiln")).resolve().parent / "python"
_kiln = None  # the imported package, False when not built


def binding():
    """The kiln package of this build (build/python/kiln), or None where the extension is not built."""
    global _kiln
    if _kiln is None:
        _kiln = False
        if any((_PACKAGE / "kiln").glob("_kiln*.so")):
            if str(_PACKAGE) not in sys.path:
                sys.path.insert(0, str(_PACKAGE))
            import kiln

            where = Path(kiln.__file__).resolve()
            assert where.is_relative_to(_PACKAGE.resolve()), f"`import kiln` found {where}, not {_PACKAGE}'s"
            _kiln = kiln
    return _kiln or None


def run_pte_cli(pte: Path, inputs, tmp: Path, *extra: str, n_out: Optional[int] = None, **kw) -> list[np.ndarray]:
    """`kiln run PTE --input ... --output ... EXTRA` on .npy files in `tmp`; the outputs (kw: subprocess
    options, e.g. env). n_out: the number of outputs, else `kiln inspect` tells."""
    args = ["run", pte, *extra]
    for i, x in enumerate(inputs):
        np.save(tmp / f"in{i}.npy", x)
        args += ["--input", tmp / f"in{i}.npy"]
    if n_out is None:
        n_out = len(json.loads(run_kiln("inspect", pte, "--json").stdout)["plans"][0]["outputs"])
    for i in range(n_out):
        args += ["--output", tmp / f"out{i}.npy"]
    run_kiln(*args, **kw)
    return [np.load(tmp / f"out{i}.npy") for i in range(n_out)]


def run_pte(pte: Path, inputs, tmp: Path, *extra: str, n_out: Optional[int] = None, **kw) -> list[np.ndarray]:
    """The outputs of `kiln run PTE EXTRA` on `inputs` (numpy arrays): kiln.load(pte, threads, engine).forward
    in this process where the binding is built and EXTRA holds only --threads N / --engine E (run_pte_cli
    otherwise, and for subprocess options such as env)."""
    kiln = binding()
    options = {"--threads": "1", "--engine": "kiln"}  # `kiln run`'s defaults
    flags = list(map(str, extra))
    if kiln is None or kw or len(flags) % 2 or any(f not in options for f in flags[::2]):
        return run_pte_cli(pte, inputs, tmp, *extra, n_out=n_out, **kw)
    options.update(zip(flags[::2], flags[1::2]))
    module = kiln.load(Path(pte), threads=int(options["--threads"]), engine=options["--engine"])
    # copies: a program that updates an input in place would update the caller's array (`kiln run` reads files)
    outs = [np.asarray(o) for o in module.forward(*[np.array(x, order="C", copy=True) for x in inputs])]
    assert n_out is None or len(outs) == n_out, f"{pte}: {len(outs)} outputs, expected {n_out}"
    return outs
