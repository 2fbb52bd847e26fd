"""Activations and RMSNorm: kiln's kernels against torch, and whole programs.

Kernels (hardswish, hardsigmoid, mish, hardtanh) run through the kernel runner
against torch, NaN/inf included. A small network using every activation of the
list (hardswish, hardsigmoid, silu, mish, elu, leaky_relu, gelu both ways, erf,
log_softmax, hardtanh/relu6, nn.RMSNorm) exported with torch.export's default IR
is lowered by kiln for both backends and run in ExecuTorch's runtime and kiln's;
ExecuTorch's own .pte (portable and XNNPACK) runs in kiln's runtime; every
output within 1e-4 * max|ref| of eager.
"""
from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from conftest import assert_close, et_execute, kiln_lower, reference_io, run_kiln
from kernel_harness import Double, T
from test_kernels_math import FLOATS, compare, ids, rand
from test_models_transformers import et_lower, export_program
from test_xnnpack_runtime import kiln_run


@pytest.mark.parametrize("dtype", FLOATS, ids=ids)
@pytest.mark.parametrize("op,fn,params", [
    ("hardswish", F.hardswish, []),
    ("hardsigmoid", F.hardsigmoid, []),
    ("mish", F.mish, []),
    ("hardtanh", F.hardtanh, [Double(-1), Double(1)]),
    ("hardtanh", lambda x: F.hardtanh(x, -0.5, 2.0), [Double(-0.5), Double(2.0)]),
], ids=["hardswish", "hardsigmoid", "mish", "hardtanh", "hardtanh_bounds"])
def test_activation_kernels(op, fn, params, dtype):
    x = rand((3, 9), dtype, seed=5, lo=-30.0, hi=30.0)
    x[1] = torch.linspace(-4, 4, 9, dtype=torch.float64).to(dtype)  # the kinks of the hard ones
    if dtype.is_floating_point:
        x[0, :3] = torch.tensor([float("nan"), float("-inf"), float("inf")], dtype=torch.float64).to(dtype)
    compare(f"aten::{op}", "out", [T(x), *params], lambda: fn(x))


class Activations(torch.nn.Module):
    """Linear layers between activations (so XNNPACK has a region to keep whole)."""

    def __init__(self):
        super().__init__()
        self.lins = torch.nn.ModuleList(torch.nn.Linear(16, 16) for _ in range(6))
        self.norm = torch.nn.RMSNorm(16, eps=1e-5)

    def forward(self, x):
        a, b, c, d, e, f = self.lins
        x = F.hardswish(a(x)) + F.hardsigmoid(x)
        x = F.silu(b(x)) + F.mish(x)
        x = F.elu(c(x)) + F.leaky_relu(x, 0.1)
        x = F.gelu(d(x)) + F.gelu(x, approximate="tanh")
        x = F.hardtanh(e(x), -2.0, 2.0) + F.relu6(x)
        x = self.norm(f(x)) + torch.erf(x)
        return F.log_softmax(x, dim=-1)


@pytest.fixture(scope="module")
def activations(tmp_path_factory):
    torch.manual_seed(0)
    x = torch.randn(2, 8, 16, generator=torch.Generator().manual_seed(1)) * 3
    return export_program(Activations().eval(), (x,), tmp_path_factory.mktemp("act"), "act")


def test_kiln_lowers_activations(activations, tmp_path):
    ins, refs = reference_io(activations)
    for backend in ("portable", "xnnpack"):
        pte = kiln_lower(activations, backend)
        assert_close(et_execute(pte, ins)[0], refs[0], f"kiln {backend} .pte in ExecuTorch's runtime")
        for engine in ("kiln", "xnnpack"):
            assert_close(kiln_run(pte, ins, tmp_path, "--engine", engine)[0], refs[0],
                         f"kiln {backend} .pte in kiln's runtime (--engine {engine})")
    d = json.loads(pte.with_suffix(".json").read_text())["delegation"]
    # erf and log_softmax have no XNNPACK node (nor does ExecuTorch delegate them); everything else is delegated.
    assert set(d["fallback_ops"]) == {"aten.erf.default", "aten._log_softmax.default"}, d
    assert d["fallback_ops"]["aten.erf.default"] == 1 and d["fallback_ops"]["aten._log_softmax.default"] == 1, d


def test_tanh_gelu_runs_as_one_operation(activations):
    """kiln's lowering of gelu(approximate='tanh') (eight XNNPACK nodes) runs as one row operation in kiln's
    engine (its outputs: test_kiln_lowers_activations, against eager)."""
    pte = kiln_lower(activations, "xnnpack")
    labels = json.loads(run_kiln("bench", pte, "--iters", "1", "--profile", "--json").stdout)["profile"]
    assert any("fused rows:" in k and " gelu_tanh" in k for k in labels), list(labels)


@pytest.mark.parametrize("backend", ["portable", "xnnpack"])
def test_kiln_runs_executorch_activations(activations, backend, tmp_path):
    ins, refs = reference_io(activations)
    pte = et_lower(activations, backend)
    for engine in ("kiln", "xnnpack") if backend == "xnnpack" else ("kiln",):
        assert_close(kiln_run(pte, ins, tmp_path, "--engine", engine)[0], refs[0],
                     f"ExecuTorch's {backend} .pte in kiln's runtime (--engine {engine})")


class MoreActivations(torch.nn.Module):
    """selu / celu (elu with its scales), softplus and log-sigmoid (decomposed), and unary math that lowers to
    the portable kernels directly."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(16, 16)

    def forward(self, x):
        x = self.lin(x)
        y = F.selu(x) + F.celu(x, alpha=0.7) + F.softplus(x, beta=2.0, threshold=5.0) + F.logsigmoid(x)
        z = torch.acos(torch.tanh(x)) + torch.log10(x.abs() + 1) + torch.round(x) + torch.reciprocal(x.abs() + 0.5)
        return y + z + torch.expm1(x.clamp(max=3)) + torch.sign(x) * torch.floor(x)


def test_kiln_lowers_more_activations_and_unary_math(tmp_path):
    torch.manual_seed(0)
    x = torch.randn(2, 8, 16, generator=torch.Generator().manual_seed(2)) * 4
    spec = export_program(MoreActivations().eval(), (x,), tmp_path / "m", "more")
    ins, refs = reference_io(spec)
    for backend in ("portable", "xnnpack"):
        pte = kiln_lower(spec, backend)
        assert_close(et_execute(pte, ins)[0], refs[0], f"kiln {backend} .pte in ExecuTorch's runtime")
        assert_close(kiln_run(pte, ins, tmp_path)[0], refs[0], f"kiln {backend} .pte in kiln's runtime")
