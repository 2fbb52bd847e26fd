"""kiln's runtime runs kiln's and ExecuTorch's .pte files and matches PyTorch eager."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from conftest import REPO, assert_close, et_lower, kiln_lower, reference_io, run_kiln, spec_of

ALLOC_CHECK = Path(os.environ.get("KILN_ALLOC_CHECK", REPO / "build" / "kiln_alloc_check"))


def kiln_execute(pte: Path, inputs, tmp: Path):
    """Runs `kiln run` on .npy inputs; returns (outputs, stdout)."""
    args = ["run", pte]
    for i, x in enumerate(inputs):
        np.save(tmp / f"in{i}.npy", x)
        args += ["--input", tmp / f"in{i}.npy"]
    n_out = len(spec_of_pte_outputs(pte))
    for i in range(n_out):
        args += ["--output", tmp / f"out{i}.npy"]
    proc = run_kiln(*args)
    return [np.load(tmp / f"out{i}.npy") for i in range(n_out)], proc.stdout


def spec_of_pte_outputs(pte: Path):
    info = json.loads(run_kiln("inspect", pte, "--json").stdout)
    return info["plans"][0]["outputs"]


@pytest.mark.parametrize("producer", ["kiln", "executorch"])
def test_tiny_models(tiny_model, producer, tmp_path):
    pte = kiln_lower(tiny_model) if producer == "kiln" else et_lower(tiny_model, "portable")
    ins, refs = reference_io(tiny_model)
    outs, _ = kiln_execute(pte, ins, tmp_path)
    for o, r in zip(outs, refs, strict=True):
        assert_close(o, r, f"{producer} .pte of {spec_of(tiny_model)['name']} in kiln's runtime")


@pytest.mark.parametrize("producer", ["kiln", "executorch"])
def test_gpt2_small(gpt2_small, producer, tmp_path):
    pte = kiln_lower(gpt2_small) if producer == "kiln" else et_lower(gpt2_small, "portable")
    ins, refs = reference_io(gpt2_small)
    outs, stdout = kiln_execute(pte, ins, tmp_path)
    assert_close(outs[0], refs[0], f"{producer} GPT-2 small .pte in kiln's runtime")
    assert "loaded in" in stdout  # kiln run reports load time


def test_delegated_program_without_backend_is_a_clear_error(tiny_gpt2, tmp_path):
    """ExecuTorch's XNNPACK program with its delegates renamed to a backend kiln lacks."""
    from executorch.exir._serialize._program import deserialize_pte_binary, serialize_pte_binary

    f = deserialize_pte_binary(et_lower(tiny_gpt2, "xnnpack").read_bytes())
    for d in f.program.execution_plan[0].delegates:
        d.id = "NoSuchBackend"
    pte = tmp_path / "renamed.pte"
    pte.write_bytes(bytes(serialize_pte_binary(f)))
    ins, _ = reference_io(tiny_gpt2)
    np.save(tmp_path / "in.npy", ins[0])
    proc = run_kiln("run", pte, "--input", tmp_path / "in.npy", check=False)
    assert proc.returncode == 1
    assert len(proc.stderr.strip().splitlines()) == 1
    assert "NoSuchBackend" in proc.stderr


@pytest.mark.parametrize("producer", ["kiln", "executorch"])
def test_execute_allocates_no_heap_memory(tiny_gpt2, producer):
    if not ALLOC_CHECK.is_file():
        raise RuntimeError(f"{ALLOC_CHECK} not built")
    pte = kiln_lower(tiny_gpt2) if producer == "kiln" else et_lower(tiny_gpt2, "portable")
    proc = subprocess.run([str(ALLOC_CHECK), str(pte)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["hook_counted"] >= 1  # the counting hook sees allocations...
    assert result["allocations_during_execute"] == 0  # ...and execute makes none


def test_wrong_input_shape_is_a_clear_error(tiny_gpt2, tmp_path):
    pte = kiln_lower(tiny_gpt2)
    np.save(tmp_path / "bad.npy", np.zeros((1, 7), dtype=np.int64))
    proc = run_kiln("run", pte, "--input", tmp_path / "bad.npy", check=False)
    assert proc.returncode == 1 and "expects int64[1, 16]" in proc.stderr
    np.save(tmp_path / "bad.npy", np.zeros((1, 16), dtype=np.float32))
    proc = run_kiln("run", pte, "--input", tmp_path / "bad.npy", check=False)
    assert proc.returncode == 1 and "float32[1, 16] given" in proc.stderr
