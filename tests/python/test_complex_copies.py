"""Programs that convert to or from complex64 / complex128 (op_db's `cfloat` and `cdouble`, a complex input taken
to its real part or to bool): kiln computes nothing in complex, but its copies and conversions carry the dtype, so
such a program runs in kiln's runtime as in eager, `kiln run` reads and writes complex .npy arrays, and ExecuTorch's
runtime runs kiln's file. Before, kiln's runtime refused every complex tensor at its argument check
("argument 3 has unsupported dtype complex64") although ExecuTorch's runtime ran the same file."""
from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import et_execute, et_lower, kiln_lower, run_kiln

import torch  # the oracle (eager); a missing torch fails the run


class ToComplex64(torch.nn.Module):
    def forward(self, x):
        return (x * 2.0).to(torch.complex64)


class ToComplex128(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x).to(torch.complex128)


class IntToComplex(torch.nn.Module):
    def forward(self, x):
        return (x * 1000.0).to(torch.int64).to(torch.complex64)


class ComplexRoundTrip(torch.nn.Module):  # complex128 -> complex64 (each part rounded), then its real part
    def forward(self, z):
        return z.to(torch.complex64), z.to(torch.complex64).to(torch.float32) * 3.0


class ComplexToBool(torch.nn.Module):  # bool of a complex value: either part not zero
    def forward(self, z):
        return z.to(torch.bool)


def _float_input():
    g = torch.Generator().manual_seed(3)
    return torch.randn(4, 16, generator=g, dtype=torch.float32) * 3


def _complex_input():
    g = torch.Generator().manual_seed(4)
    re = torch.randn(4, 16, generator=g, dtype=torch.float64)
    im = torch.randn(4, 16, generator=g, dtype=torch.float64)
    re[0, :4] = 0.0
    im[0, 2:6] = 0.0  # (0, 0) at [0, 2:4]: bool False; (0, im) and (re, 0): True
    return torch.complex(re, im)


CASES = {
    "to_complex64": (ToComplex64, _float_input),
    "to_complex128": (ToComplex128, _float_input),
    "int_to_complex": (IntToComplex, _float_input),
    "complex_round_trip": (ComplexRoundTrip, _complex_input),
    "complex_to_bool": (ComplexToBool, _complex_input),
}


# ExecuTorch 1.5.1's runtime cannot run these files: its portable `_to_dim_order_copy` converts only floating inputs
# to complex ("Unhandled dtype Long", error 0x12), fails on complex to bool (0x12) and aborts the process on complex
# to complex and complex to float. kiln's runtime is checked against eager on them.
ET_CANNOT = {"int_to_complex", "complex_round_trip", "complex_to_bool"}


def _export(name, tmp_path):
    module_cls, make_input = CASES[name]
    module, x = module_cls(), make_input()
    out = tmp_path / name
    out.mkdir()
    torch.export.save(torch.export.export(module, (x,)), out / f"{name}.pt2")
    with torch.no_grad():
        refs = module(x)
    refs = refs if isinstance(refs, tuple) else (refs,)
    np.save(out / "in.npy", x.numpy())
    spec = {"name": name, "model_id": f"tests/{name}", "seq_len": 4, "exported_program": f"{name}.pt2",
            "ir": "default",
            "inputs": [{"name": "x", "dtype": str(x.numpy().dtype), "shape": list(x.shape), "reference": "in.npy"}],
            "outputs": [{"name": f"y{i}", "dtype": str(r.numpy().dtype), "shape": list(r.shape)}
                        for i, r in enumerate(refs)]}
    (out / "model_spec.json").write_text(json.dumps(spec))
    return out / "model_spec.json", x.numpy(), [r.numpy() for r in refs]


def _assert_equal(got, ref, what):
    # conversions only: the exact values (each part rounded once, as torch rounds it)
    assert got.dtype == ref.dtype, f"{what}: dtype {got.dtype}, eager {ref.dtype}"
    assert got.shape == ref.shape, f"{what}: shape {got.shape}, eager {ref.shape}"
    assert np.array_equal(got, ref), f"{what}: max |diff| {np.abs(got.astype(ref.dtype) - ref).max()}"


@pytest.mark.parametrize("backend", ["portable", "xnnpack"])
@pytest.mark.parametrize("name", list(CASES))
def test_complex_conversion_matches_eager_in_both_runtimes(name, backend, tmp_path):
    spec, x, refs = _export(name, tmp_path)
    pte = kiln_lower(spec, backend)
    outs = [tmp_path / f"y{i}.npy" for i in range(len(refs))]
    run_kiln("run", pte, "--input", spec.parent / "in.npy", *sum((["--output", o] for o in outs), []))
    for i, (o, ref) in enumerate(zip(outs, refs)):
        _assert_equal(np.load(o), ref, f"kiln's runtime, output {i}")
    if name in ET_CANNOT:
        return  # eager and kiln's runtime agree above; ExecuTorch's runtime has no kernel for it (ET_CANNOT)
    for i, (got, ref) in enumerate(zip(et_execute(pte, [x]), refs)):
        _assert_equal(got, ref, f"ExecuTorch's runtime, output {i}")


@pytest.mark.parametrize("name", ["to_complex64", "to_complex128"])
def test_executorch_program_of_a_complex_copy_runs_in_kilns_runtime(name, tmp_path):
    """ExecuTorch's own `.pte` of the conversion (its `_to_dim_order_copy`), in kiln's runtime, against eager."""
    spec, x, refs = _export(name, tmp_path)
    pte = et_lower(spec, "portable")
    run_kiln("run", pte, "--input", spec.parent / "in.npy", "--output", tmp_path / "y.npy")
    _assert_equal(np.load(tmp_path / "y.npy"), refs[0], "kiln's runtime on ExecuTorch's program")


def test_a_kernel_that_computes_still_refuses_complex(tmp_path):
    """Only the copies take complex tensors: a program that computes on a complex value (here a complex input
    multiplied, which kiln's `mul` kernel does not do) is refused with one line naming the kernel and the dtype,
    not run with wrong numbers."""

    class MulComplex(torch.nn.Module):
        def forward(self, z):
            return z * 2.0

    z = _complex_input()
    out = tmp_path / "mulc"
    out.mkdir()
    torch.export.save(torch.export.export(MulComplex(), (z,)), out / "mulc.pt2")
    np.save(out / "in.npy", z.numpy())
    spec = {"name": "mulc", "model_id": "tests/mulc", "seq_len": 4, "exported_program": "mulc.pt2", "ir": "default",
            "inputs": [{"name": "z", "dtype": "complex128", "shape": list(z.shape), "reference": "in.npy"}],
            "outputs": [{"name": "y", "dtype": "complex128", "shape": list(z.shape)}]}
    (out / "model_spec.json").write_text(json.dumps(spec))
    pte = kiln_lower(out / "model_spec.json", "portable")
    proc = run_kiln("run", pte, "--input", out / "in.npy", "--output", tmp_path / "y.npy", check=False)
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "mul" in lines[0] and "unsupported dtype complex128" in lines[0], proc.stderr
    assert not (tmp_path / "y.npy").exists()


def test_python_binding_takes_and_returns_complex_arrays(tmp_path):
    """kiln.load(...).forward with a complex128 numpy input returns complex64 / float32 arrays equal to eager's."""
    from inproc import binding

    kiln = binding()
    assert kiln is not None, "the Python extension is not built beside KILN_BIN (scripts/build builds it)"
    spec, x, refs = _export("complex_round_trip", tmp_path)
    outs = kiln.load(str(kiln_lower(spec, "portable"))).forward(x)
    assert len(outs) == len(refs)
    for i, (got, ref) in enumerate(zip(outs, refs)):
        _assert_equal(np.asarray(got), ref, f"kiln.load().forward, output {i}")
