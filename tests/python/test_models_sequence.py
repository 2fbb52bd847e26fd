"""Sequence models built inline with torch.nn (seeded random weights): LSTM, GRU,
RNN(tanh), and a small einsum/topk/sort/scatter model.

Each is lowered by kiln for both backends and by ExecuTorch (portable and
XNNPACK); every .pte runs in ExecuTorch's runtime and in kiln's, against eager
PyTorch (DESIGN's fp32 tolerance, 1e-4 x max|ref|).
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import assert_close, et_execute, kiln_lower, run_kiln
from inproc import run_pte, run_pte_cli

_ET: dict = {}


def et_lower(spec_path: Path, backend: str) -> Path:
    """ExecuTorch's own lowering (to_edge_transform_and_lower, XnnpackPartitioner for xnnpack), in process."""
    key = (str(spec_path), backend)
    if key not in _ET:
        from executorch.exir import to_edge_transform_and_lower

        spec = json.loads(spec_path.read_text())
        ep = torch.export.load(str(spec_path.parent / spec["exported_program"]))
        parts = None
        if backend == "xnnpack":
            from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

            parts = [XnnpackPartitioner()]
        prog = to_edge_transform_and_lower(ep, partitioner=parts).to_executorch()
        out = spec_path.parent / f"{spec['name']}_{backend}_et.pte"
        out.write_bytes(prog.buffer)
        _ET[key] = out
    return _ET[key]


def export_inline(module: torch.nn.Module, inputs: tuple, out: Path, name: str, decompose: bool = False) -> Path:
    """torch.export of `module` on `inputs` (default IR, or core ATen with `decompose`), with the spec and
    eager reference I/O kiln's tools read."""
    out.mkdir(parents=True, exist_ok=True)
    module.eval()
    ep = torch.export.export(module, inputs)
    if decompose:
        ep = ep.run_decompositions()
    torch.export.save(ep, out / f"{name}.pt2")
    with torch.no_grad():
        ys = module(*inputs)
    ys = ys if isinstance(ys, tuple) else (ys,)
    spec_in, spec_out = [], []
    for i, x in enumerate(inputs):
        np.save(out / f"{name}_input{i}.npy", x.numpy())
        spec_in.append({"name": f"x{i}", "dtype": str(x.dtype).removeprefix("torch."), "shape": list(x.shape),
                        "reference": f"{name}_input{i}.npy"})
    for i, y in enumerate(ys):
        np.save(out / f"{name}_expected_output{i}.npy", y.numpy())
        spec_out.append({"name": f"y{i}", "dtype": str(y.dtype).removeprefix("torch."), "shape": list(y.shape),
                         "reference": f"{name}_expected_output{i}.npy"})
    spec = {"name": name, "model_id": f"tests/{name}", "seq_len": int(inputs[0].shape[1 if inputs[0].dim() > 1 else 0]), "exported_program": f"{name}.pt2",
            "ir": "core_aten" if decompose else "default", "inputs": spec_in, "outputs": spec_out}
    (out / "model_spec.json").write_text(json.dumps(spec))
    return out / "model_spec.json"


def io_of(spec_path: Path):
    spec = json.loads(spec_path.read_text())
    ins = [np.load(spec_path.parent / i["reference"]) for i in spec["inputs"]]
    outs = [np.load(spec_path.parent / o["reference"]) for o in spec["outputs"]]
    return ins, outs


def kiln_run(pte: Path, inputs, tmp: Path, n_out: int, *extra: str) -> list[np.ndarray]:
    """What `kiln run PTE EXTRA` gives: kiln's runtime in this process (tests/python/inproc.py)."""
    return run_pte(pte, inputs, tmp, *extra, n_out=n_out)


def delegate_calls(pte: Path) -> int:
    plan = json.loads(run_kiln("inspect", pte, "--json").stdout)["plans"][0]
    return sum(plan["delegate_calls"].values())


def compare(got, refs, what):
    assert len(got) == len(refs), what
    for i, (g, r) in enumerate(zip(got, refs)):
        if r.dtype.kind in "iub":
            np.testing.assert_array_equal(g, r, err_msg=f"{what} output {i}")
        else:
            assert_close(g, r, f"{what} output {i}")


# ---------------------------------------------------------------------------
# Models


class LstmGru(torch.nn.Module):
    """embedding -> 2-layer bidirectional LSTM (batch_first, given initial state) -> GRU -> linear."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(20, 16)
        self.lstm = torch.nn.LSTM(16, 24, num_layers=2, bidirectional=True, batch_first=True)
        self.gru = torch.nn.GRU(48, 32, batch_first=True)
        self.fc = torch.nn.Linear(32, 5)

    def forward(self, ids, h0, c0):
        y, (h, c) = self.lstm(self.emb(ids), (h0, c0))
        y, g = self.gru(y)
        return self.fc(y), h, c, g


class Rnn(torch.nn.Module):
    """nn.RNN(tanh), 2 layers, time-major, no initial state; and a one-layer bidirectional relu RNN without bias."""

    def __init__(self):
        super().__init__()
        self.rnn = torch.nn.RNN(12, 16, num_layers=2)
        self.relu = torch.nn.RNN(16, 8, nonlinearity="relu", bias=False, bidirectional=True)

    def forward(self, x):
        y, h = self.rnn(x)
        z, _ = self.relu(y)
        return z, h


class Indexing(torch.nn.Module):
    """einsum (batched contraction, a vector contraction, an outer product), topk, sort,
    scatter / scatter_add, max.dim, argmin, amin, clamp (Scalar and Tensor bounds),
    remainder, floor_divide, roll, flip, masked_fill, where, cumsum, gather, index_select."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)
        self.v = torch.nn.Parameter(torch.randn(5))

    def forward(self, x):  # [2, 5, 8]
        a = torch.einsum("bij,bkj->bik", x, self.proj(x))  # [2, 5, 5]
        m = torch.einsum("bik,k->bi", a, self.v)
        outer = torch.einsum("bi,j->bij", m, self.v)
        top, ti = torch.topk(a, 3, dim=-1)
        srt, si = torch.sort(x, dim=1, descending=True)
        sc = torch.zeros_like(a).scatter(-1, ti, top)
        sa = torch.zeros(2, 5, 8).scatter_add(1, si, x)
        mx, mi = torch.max(a, dim=-1)
        lo = torch.amin(x, dim=-1, keepdim=True)
        c = torch.clamp(x, min=-0.5, max=0.5) + torch.clamp(x, min=lo * 0.5)
        r = torch.remainder(x, 0.7) + torch.floor_divide(x, 0.3)
        rolled = torch.roll(x, shifts=2, dims=1) + torch.flip(x, dims=[2])
        masked = x.masked_fill(x > 1.0, -1.0) + torch.where(x < 0, x, 0.5 * x)
        g = torch.gather(x, 2, torch.argmin(x, dim=2, keepdim=True)) + torch.index_select(x, 1, mi[0])
        y = c + r + rolled + masked + g + torch.cumsum(srt, dim=2) + sa
        return y, sc + outer, mi, si


MODELS = {
    "indexing": lambda: (Indexing(), (torch.randn(2, 5, 8),)),
    "lstm_gru": lambda: (LstmGru(), (torch.randint(0, 20, (2, 2)), torch.randn(4, 2, 24), torch.randn(4, 2, 24))),
    "rnn_tanh": lambda: (Rnn(), (torch.randn(4, 3, 12),)),
}


# GEMMs of the unrolled RNNs: one input projection per layer and direction for all time
# steps, one hidden-state product per step (folded away where the state is the zero h0).
GEMMS = {
    # LSTM 2 layers x 2 directions: 4 projections (addmm), 2 steps x 4 hidden mm (h0 is an input);
    # GRU: 1 projection, b_hh stays with the hidden product: addmm for step 2; the linear head: 1
    "lstm_gru": {"aten::addmm.out": 4 + 1 + 1 + 1, "aten::mm.out": 2 * 4},
    # RNN 2 layers: 2 projections, 3 of 4 steps x 2 hidden mm; bias-free bidirectional RNN: 2 projections (mm),
    # 3 of 4 steps x 2 directions
    "rnn_tanh": {"aten::addmm.out": 2, "aten::mm.out": 3 * 2 + 2 + 3 * 2},
}


@pytest.fixture(scope="module")
def specs(tmp_path_factory):
    """name -> the model's exported spec (each exported once per module)."""
    cache: dict = {}

    def get(name):
        if name not in cache:
            torch.manual_seed(0)
            module, inputs = MODELS[name]()
            cache[name] = export_inline(module, inputs, tmp_path_factory.mktemp(name), name)
        return cache[name]

    return get


@pytest.mark.parametrize("backend", ["portable", "xnnpack"])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_kiln_lowering_runs_in_both_runtimes(specs, name, backend, tmp_path):
    model_spec = specs(name)
    ins, refs = io_of(model_spec)
    pte = kiln_lower(model_spec, backend)
    compare(et_execute(pte, ins), refs, f"kiln {backend} .pte in ExecuTorch's runtime")
    compare(kiln_run(pte, ins, tmp_path, len(refs)), refs, f"kiln {backend} .pte in kiln's runtime")
    if backend == "portable" and name in GEMMS:
        plan = json.loads(run_kiln("inspect", pte, "--json").stdout)["plans"][0]
        assert {k: v for k, v in plan["kernel_calls"].items() if k in GEMMS[name]} == GEMMS[name]
    if backend == "xnnpack":
        # The unrolled cells are mm/addmm/sigmoid/tanh/mul/add/slice/cat: all delegated, few regions.
        assert delegate_calls(pte) >= 1
        if name != "indexing":
            assert delegate_calls(pte) <= 2


@pytest.mark.parametrize("name", sorted(MODELS))
def test_core_aten_flavor(name, tmp_path):
    """The same models after torch's core-ATen decompositions (torch unrolls the RNNs itself)."""
    torch.manual_seed(0)
    module, inputs = MODELS[name]()
    spec = export_inline(module, inputs, tmp_path / name, name, decompose=True)
    ins, refs = io_of(spec)
    for backend in ("portable", "xnnpack"):
        pte = kiln_lower(spec, backend)
        compare(et_execute(pte, ins), refs, f"kiln {backend} .pte (core ATen) in ExecuTorch's runtime")
        compare(kiln_run(pte, ins, tmp_path, len(refs)), refs, f"kiln {backend} .pte (core ATen) in kiln's runtime")


# ExecuTorch's XNNPACK lowering for the RNNs (the indexing model's delegable part is a bmm and adds)
@pytest.mark.parametrize("name,backend", [("indexing", "portable"), ("lstm_gru", "portable"), ("lstm_gru", "xnnpack"),
                                          ("rnn_tanh", "portable"), ("rnn_tanh", "xnnpack")])
def test_kiln_runs_executorch_lowering(specs, name, backend, tmp_path):
    model_spec = specs(name)
    ins, refs = io_of(model_spec)
    pte = et_lower(model_spec, backend)
    # kiln's engine through `kiln run` itself (the CLI's test in this file), XNNPACK's through the binding
    compare(run_pte_cli(pte, ins, tmp_path, "--engine", "kiln", n_out=len(refs)), refs,
            f"ExecuTorch's {backend} .pte in kiln's runtime (kiln run --engine kiln)")
    if backend == "xnnpack":
        compare(kiln_run(pte, ins, tmp_path, len(refs), "--engine", "xnnpack"), refs,
                f"ExecuTorch's {backend} .pte in kiln's runtime (--engine xnnpack)")


# ---------------------------------------------------------------------------
# One-operator programs: the forms the models above do not meet


class Fn(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *xs):
        return self.fn(*xs)


_G = torch.Generator().manual_seed(0)
X = torch.randn(3, 6, generator=_G)
IDX = torch.randint(0, 3, (2, 6), generator=_G)
ONE_OPS = {
    "einsum_transpose_sum": (lambda a: torch.einsum("ij->j", a) + torch.einsum("ij->ji", a).sum(1).sum(), (X,)),
    "einsum_dot_implicit": (lambda a, b: torch.einsum("ij,jk", a, b).sum() + torch.einsum("i,i->", a[0], a[1]),
                            (X, torch.randn(6, 2, generator=_G))),
    "einsum_batch_reduce": (lambda a, b: torch.einsum("bhqd,bhkd->bhq", a, b),
                            (torch.randn(2, 2, 3, 4, generator=_G), torch.randn(2, 2, 5, 4, generator=_G))),
    "einsum_ellipsis": (lambda a, b: torch.einsum("...ij,...jk->...ik", a, b) + torch.einsum("b...,b...", a, a).sum(),
                        (torch.randn(2, 3, 4, generator=_G), torch.randn(1, 4, 3, generator=_G))),
    "min_max_forms": (lambda a: (torch.min(a, 1)[0] + torch.max(a) + torch.min(a), torch.min(a, 0)[1],
                                 torch.max(a, a.flip(0)) - torch.min(a, a[:1])), (X,)),
    "scatter_value_reduce": (lambda a, i: (a.scatter(0, i, 2.5) + a.scatter_reduce(0, i, a[:2] * 3, "amax"),
                                           a.scatter_reduce(0, i, a[:2], "sum", include_self=False)), (X, IDX)),
    # prod/amax/amin, include_self both ways, an index smaller than self (positions no index reaches keep self)
    "scatter_reduce_prod_amax_amin": (
        lambda a, i: (a.scatter_reduce(0, i, a[:2] * 3, "amax"), a.scatter_reduce(0, i, a[1:], "prod"),
                      a.scatter_reduce(0, i[:, :4], -a, "amin", include_self=False),
                      a.scatter_reduce(1, i[:1, :2] + 1, a[:, 2:] - 1, "prod", include_self=False),
                      a.scatter_reduce(-1, i.t()[:3], a * 2, "amax", include_self=False),
                      a.scatter_reduce(1, i[:2, :3] * 2, a, "amin")), (X, IDX)),
    "index_put_masked": (lambda a, i: (a.index_put((i[0, :2],), a[:2], accumulate=True),
                                       a.masked_fill(a > 0, torch.tensor(0.25))), (X, IDX)),
    "sort_stable_unfold": (lambda a: (torch.sort(a, dim=0, stable=True)[0], a.unfold(1, 3, 2)), (X,)),
    "bucketize": (lambda a, b: (torch.bucketize(a, b), torch.bucketize(a, b, right=True, out_int32=True)),
                  (X, torch.tensor([-1.0, 0.0, 0.5]))),
    "clamp_fmod": (lambda a: torch.clamp_min(a, -0.2) + torch.clamp_max(a, 0.3) + torch.fmod(a, 0.4), (X,)),
    "rnn_relu_gru_bidir": (None, (torch.randn(3, 2, 4, generator=_G),)),
    "diagonal_as_strided": (lambda a: (torch.diagonal(a, 1), torch.linalg.diagonal(a.reshape(3, 2, 3), offset=-1,
                                                                                    dim1=0, dim2=-1),
                                       a.as_strided((2, 2), (1, 3), 1) * 2.0), (X,)),
    "index_fill_add": (lambda a, i: (a.index_fill(1, i[0, :3], -1.5), a.index_fill(-2, i[1, :2], torch.tensor(2.0)),
                                     a.index_add(0, i[1], torch.cat([a, a]), alpha=0.5)), (X, IDX)),
    "masked_scatter_matmul_1d": (lambda a, b: (a.masked_scatter(a[0] > 0, b.flatten()), a @ a[0], a[:, 0] @ a,
                                               a[0] @ a[1], a[0] @ b, b.transpose(1, 2) @ a[0]),
                                 (X, torch.randn(2, 6, 4, generator=_G))),
}


class RnnMix(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.GRU(4, 6, num_layers=2, bidirectional=True, bias=False)
        self.b = torch.nn.RNN(12, 5, nonlinearity="relu", batch_first=True)

    def forward(self, x):
        y, h = self.a(x)
        z, g = self.b(y)
        return z, h, g


# kernels kiln's lowering may emit that ExecuTorch's portable library does not register
NOT_IN_EXECUTORCH = {"aten::bucketize.Tensor_out"}


# programs ExecuTorch's own lowering rejects (what its error names)
EXECUTORCH_CANNOT_LOWER = {"sort_stable_unfold": "sort.stable is not in Core ATen",
                           "bucketize": "bucketize.Tensor is not in Core ATen"}


def kernel_names(pte: Path) -> set[str]:
    plan = json.loads(run_kiln("inspect", pte, "--json").stdout)["plans"][0]
    return set(plan["kernel_calls"])


@pytest.mark.parametrize("name", sorted(ONE_OPS))
def test_one_op_programs(name, tmp_path):
    torch.manual_seed(0)
    fn, inputs = ONE_OPS[name]
    module = RnnMix() if fn is None else Fn(fn)
    spec = export_inline(module, inputs, tmp_path / name, name)
    ins, refs = io_of(spec)
    pte = kiln_lower(spec, "portable")
    compare(kiln_run(pte, ins, tmp_path, len(refs)), refs, f"{name}: kiln's .pte in kiln's runtime")
    from executorch.extension.pybindings import portable_lib

    missing = kernel_names(pte) - set(portable_lib._get_operator_names())
    assert missing <= NOT_IN_EXECUTORCH, missing
    if not missing:
        compare(et_execute(pte, ins), refs, f"{name}: kiln's .pte in ExecuTorch's runtime")
    if name in EXECUTORCH_CANNOT_LOWER:
        with pytest.raises(Exception, match=EXECUTORCH_CANNOT_LOWER[name]):
            et_lower(spec, "portable")
        return
    et = et_lower(spec, "portable")
    compare(kiln_run(et, ins, tmp_path, len(refs)), refs, f"{name}: ExecuTorch's .pte in kiln's runtime")


# ---------------------------------------------------------------------------
# What kiln cannot lower fails with the operator, the node, the source line and why; nothing is written


class ProjLstm(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = torch.nn.LSTM(4, 6, proj_size=3)

    def forward(self, x):
        return self.lstm(x)[0]


@pytest.mark.parametrize("name,module,inputs,why", [
    ("lstm_proj", ProjLstm(), (torch.randn(2, 1, 4),), "proj_size is not supported"),
    ("einsum_diagonal", Fn(lambda a: torch.einsum("ii->i", a)), (torch.randn(3, 3),), "repeated label"),
    ("einsum_three", Fn(lambda a: torch.einsum("ij,jk,kl->il", a, a, a)), (torch.randn(3, 3),), "three"),
    ("nonzero", Fn(lambda a: torch.nonzero(a)), (torch.randn(3, 4),), "output size depends on the data"),
])
def test_unsupported_forms_fail_clearly(name, module, inputs, why, tmp_path):
    spec = export_inline(module, inputs, tmp_path / name, name)
    out = tmp_path / "out.pte"
    proc = run_kiln("lower", "--spec", spec, "--backend", "portable", "--out", out, "-q", check=False)
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert re.search(r"cannot lower node '\w+' \(aten\.\w+\.\w+\) at \S+\.py:\d+: ", lines[0]), lines[0]
    assert why in lines[0] or (why == "three" and "3 operands" in lines[0]), lines[0]
    assert not out.exists()
