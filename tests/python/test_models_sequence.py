"""Sequence models built inline with torch.nn (seeded random weights): LSTM, GRU,
RNN(tanh), and a small einsum/topk/sort/scatter model.

Each is lowered by kiln for both backends and by ExecuTorch (portable and
XNNPACK); every .pte runs in ExecuTorch's runtime and in kiln's, against eager
PyTorch (DESIGN's fp32 tolerance, 1e-4 x max|ref|).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import assert_close, et_execute, kiln_lower, run_kiln

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


def export_inline(module: torch.nn.Module, inputs: tuple, out: Path, name: str) -> Path:
    """torch.export of `module` on `inputs` (default IR), with the spec and eager reference I/O kiln's tools read."""
    out.mkdir(parents=True, exist_ok=True)
    module.eval()
    ep = torch.export.export(module, inputs)
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
            "ir": "default", "inputs": spec_in, "outputs": spec_out}
    (out / "model_spec.json").write_text(json.dumps(spec))
    return out / "model_spec.json"


def io_of(spec_path: Path):
    spec = json.loads(spec_path.read_text())
    ins = [np.load(spec_path.parent / i["reference"]) for i in spec["inputs"]]
    outs = [np.load(spec_path.parent / o["reference"]) for o in spec["outputs"]]
    return ins, outs


def kiln_run(pte: Path, inputs, tmp: Path, n_out: int) -> list[np.ndarray]:
    args = ["run", pte]
    for i, x in enumerate(inputs):
        np.save(tmp / f"in{i}.npy", x)
        args += ["--input", tmp / f"in{i}.npy"]
    for i in range(n_out):
        args += ["--output", tmp / f"out{i}.npy"]
    run_kiln(*args)
    return [np.load(tmp / f"out{i}.npy") for i in range(n_out)]


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
    "lstm_gru": lambda: (LstmGru(), (torch.randint(0, 20, (2, 4)), torch.randn(4, 2, 24), torch.randn(4, 2, 24))),
    "rnn_tanh": lambda: (Rnn(), (torch.randn(4, 3, 12),)),
}


@pytest.fixture(scope="module", params=sorted(MODELS))
def model_spec(request, tmp_path_factory):
    torch.manual_seed(0)
    module, inputs = MODELS[request.param]()
    return export_inline(module, inputs, tmp_path_factory.mktemp(request.param), request.param)


@pytest.mark.parametrize("backend", ["portable", "xnnpack"])
def test_kiln_lowering_runs_in_both_runtimes(model_spec, backend, tmp_path):
    ins, refs = io_of(model_spec)
    pte = kiln_lower(model_spec, backend)
    compare(et_execute(pte, ins), refs, f"kiln {backend} .pte in ExecuTorch's runtime")
    compare(kiln_run(pte, ins, tmp_path, len(refs)), refs, f"kiln {backend} .pte in kiln's runtime")
    if backend == "xnnpack":
        # The unrolled cells are mm/addmm/sigmoid/tanh/mul/add/slice/cat: all delegated, few regions.
        assert 1 <= delegate_calls(pte) <= 2


@pytest.mark.parametrize("backend", ["portable", "xnnpack"])
def test_kiln_runs_executorch_lowering(model_spec, backend, tmp_path):
    ins, refs = io_of(model_spec)
    pte = et_lower(model_spec, backend)
    compare(kiln_run(pte, ins, tmp_path, len(refs)), refs, f"ExecuTorch's {backend} .pte in kiln's runtime")
