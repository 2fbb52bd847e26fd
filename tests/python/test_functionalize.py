"""In-place operators of torch.export's default IR (functionalize.cpp, the decomposition table).

Each module is exported with plain `torch.export.export` (no run_decompositions: the graph keeps
aten.mul_, aten.add_ on slices, masked_fill_, copy_ into views, ...). kiln lowers it for both
backends; kiln's runtime and ExecuTorch's runtime run kiln's .pte; every output matches eager
PyTorch within 1e-4 x max|ref| (integers exactly). A user input the module updates in place is
returned first, ExecuTorch's convention (which inputs torch's own functionalization lists as
mutated is the oracle for that), and compared with the input eager left behind.
"""
from __future__ import annotations

import inspect
import json
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from conftest import assert_close, et_execute, run_kiln
from test_xnnpack_runtime import kiln_run


def export_mutating(module: torch.nn.Module, inputs: tuple, out: Path, name: str) -> Path:
    """Default-IR export of `module`, with a spec whose outputs are the updated user inputs (as torch's
    functionalization lists them) then the module's outputs, all from eager."""
    out.mkdir(parents=True, exist_ok=True)
    module.eval()
    ep = torch.export.export(module, tuple(x.clone() for x in inputs))
    torch.export.save(ep, out / f"{name}.pt2")
    functional = ep.run_decompositions()
    mutated = set(functional.graph_signature.user_inputs_to_mutate.values())
    names = functional.graph_signature.user_inputs
    eager_in = [x.clone() for x in inputs]
    with torch.no_grad():
        ys = module(*eager_in)
    ys = list(ys) if isinstance(ys, tuple) else [ys]
    refs = [eager_in[i] for i, n in enumerate(names) if n in mutated] + ys
    spec_in, spec_out = [], []
    for i, x in enumerate(inputs):
        np.save(out / f"{name}_input{i}.npy", x.numpy())
        spec_in.append({"name": f"x{i}", "dtype": str(x.dtype).removeprefix("torch."), "shape": list(x.shape),
                        "reference": f"{name}_input{i}.npy"})
    for i, y in enumerate(refs):
        np.save(out / f"{name}_expected_output{i}.npy", y.detach().numpy())
        spec_out.append({"name": f"y{i}", "dtype": str(y.dtype).removeprefix("torch."), "shape": list(y.shape),
                         "reference": f"{name}_expected_output{i}.npy"})
    spec = {"name": name, "model_id": f"tests/{name}", "seq_len": 1, "exported_program": f"{name}.pt2",
            "ir": "default", "inputs": spec_in, "outputs": spec_out}
    (out / "model_spec.json").write_text(json.dumps(spec))
    return out / "model_spec.json"


def io_of(spec_path: Path):
    spec = json.loads(spec_path.read_text())
    ins = [np.load(spec_path.parent / i["reference"]) for i in spec["inputs"]]
    outs = [np.load(spec_path.parent / o["reference"]) for o in spec["outputs"]]
    return ins, outs


def compare(got, refs, what):
    assert len(got) == len(refs), f"{what}: {len(got)} outputs, eager has {len(refs)}"
    for i, (g, r) in enumerate(zip(got, refs)):
        if r.dtype.kind in "iub":
            np.testing.assert_array_equal(g, r, err_msg=f"{what} output {i}")
        else:
            assert_close(g, r, f"{what} output {i}")


# ---- the modules --------------------------------------------------------------------------------
class Chain(torch.nn.Module):  # x.mul_(2).add_(1) on an intermediate; the chain's result aliases it
    def forward(self, x):
        h = x + 0.5
        r = h.mul_(2).add_(1)
        return h * 3, r - 1


class SliceWriteSeenByBase(torch.nn.Module):  # a write through a view, read through the base
    def forward(self, x):
        h = x * 2
        h[:, 1:3].mul_(3)
        return h + 1


class BaseWriteSeenByView(torch.nn.Module):  # a view taken before the base changes, read after
    def forward(self, x):
        h = x * 2
        v = h[1]
        t = h.t()
        h.add_(1)
        return v * 1, t * 1


class SliceAddAssign(torch.nn.Module):  # `+=` on a slice of an intermediate
    def forward(self, x, y):
        h = x.clone()
        h[:, :2] += y
        h[1:, 2:] -= 1.5
        return h


class MaskedFill(torch.nn.Module):
    def forward(self, x):
        h = x * 1
        h.masked_fill_(h > 0.25, 0.5)
        return h.relu_() + 0


class InputUpdate(torch.nn.Module):  # in-place on user inputs: returned first, updated
    def forward(self, x, y):
        x.add_(1)
        y[0].mul_(2)
        return x * 2 + y.sum()


class MetadataMutations(torch.nn.Module):  # unsqueeze_/transpose_/t_/squeeze_: the tensor becomes a view of itself
    def forward(self, x):
        h = x * 2
        row = h[1]           # a view taken before the metadata changes: sees the later writes
        h.unsqueeze_(0)      # [1, 3, 4]
        h.transpose_(1, 2)   # [1, 4, 3]
        h.add_(1)            # written through the new view, into h's storage
        g = x + 0
        g.t_()
        g[0].mul_(3)         # column 0 of x's layout
        s = (x - 1).unsqueeze(1).unsqueeze(0)
        s.squeeze_()
        s.sub_(0.5)
        d = (x + 2).unsqueeze(0).unsqueeze(2)
        d.squeeze_((0, 2))
        k = x * 3
        w = k[1]             # a view of k, its shape changed, then written: k sees the write
        w.unsqueeze_(0)
        w.add_(5)
        return h * 1, row * 1, g * 1, s * 1, d + 0, k * 1, w * 1


class AsStridedInplace(torch.nn.Module):  # as_strided_ rebinds the tensor to a strided view of its storage
    def forward(self, x):
        a = x + 0
        a.as_strided_((2, 3), (1, 2), 1)
        a.mul_(10)
        return a * 1, x + 0


class TransposeSelectZero(torch.nn.Module):  # zero_ through select of a transpose
    def forward(self, x):
        h = x * 2
        h.t()[0].zero_()
        return h


class ViewCopyInto(torch.nn.Module):  # copy_ / fill_ into views made by view and unsqueeze
    def forward(self, x, y):
        h = x + 0
        flat = h.view(-1)
        flat[3:7].copy_(y)
        h.unsqueeze(0)[0, 2].fill_(-1.0)
        return h, flat * 2


class DiagonalAndChunk(torch.nn.Module):  # views written back through their index map
    def forward(self, x):
        h = x * 1
        h.diagonal().fill_(0.0)
        a, b = h.chunk(2, dim=1)
        b.mul_(10)
        return h


class ClampDivSub(torch.nn.Module):
    def forward(self, x):
        h = x.clone()
        h.clamp_(-0.5, 0.5)
        h.div_(0.25)
        h.sub_(x, alpha=2)
        h *= torch.sigmoid(x)
        h /= h.abs().sum(-1, keepdim=True) + 1
        return h


class IntInplace(torch.nn.Module):  # integer tensors: exact
    def forward(self, x):
        h = x * 3
        h[0] += 7
        h.mul_(2)
        return h


class OutForms(torch.nn.Module):  # out= overloads, one into an intermediate, one into an input
    def forward(self, x, y):
        c = torch.empty_like(x)
        torch.add(x, y, out=c)
        torch.mul(c, 2, out=x)
        return c + 1


class BufferCounter(torch.nn.Module):  # a buffer updated in place (state across calls)
    def __init__(self):
        super().__init__()
        self.register_buffer("count", torch.zeros(4))

    def forward(self, x):
        self.count.add_(1)
        return x * self.count


class CacheIndexCopy(torch.nn.Module):  # a KV cache updated with index_copy_ in the default IR
    def __init__(self):
        super().__init__()
        self.register_buffer("k", torch.zeros(1, 2, 8, 4))

    def forward(self, x, pos):
        self.k.index_copy_(2, pos, x)
        return self.k.sum(-1) * 2


R = torch.Generator().manual_seed(0)


def rn(*s):
    return torch.randn(*s, generator=R)


CASES = [
    ("chain", Chain, lambda: (rn(3, 4),)),
    ("slice_write_seen_by_base", SliceWriteSeenByBase, lambda: (rn(4, 5),)),
    ("base_write_seen_by_view", BaseWriteSeenByView, lambda: (rn(3, 4),)),
    ("slice_add_assign", SliceAddAssign, lambda: (rn(3, 4), rn(3, 2))),
    ("masked_fill", MaskedFill, lambda: (rn(4, 6),)),
    ("input_update", InputUpdate, lambda: (rn(3, 4), rn(2, 4))),
    ("transpose_select_zero", TransposeSelectZero, lambda: (rn(3, 4),)),
    ("metadata_mutations", MetadataMutations, lambda: (rn(3, 4),)),
    ("as_strided_inplace", AsStridedInplace, lambda: (rn(3, 4),)),
    ("view_copy_into", ViewCopyInto, lambda: (rn(3, 4), rn(4))),
    ("diagonal_and_chunk", DiagonalAndChunk, lambda: (rn(4, 4),)),
    ("clamp_div_sub", ClampDivSub, lambda: (rn(3, 8),)),
    ("int_inplace", IntInplace, lambda: (torch.arange(12).reshape(3, 4),)),
    ("out_forms", OutForms, lambda: (rn(3, 4), rn(3, 4))),
    ("buffer_counter", BufferCounter, lambda: (rn(2, 4),)),
    ("cache_index_copy", CacheIndexCopy, lambda: (rn(1, 2, 1, 4), torch.tensor([3]))),
]


@pytest.mark.parametrize("name,cls,make", CASES, ids=[c[0] for c in CASES])
def test_inplace_module_matches_eager(name, cls, make, tmp_path):
    torch.manual_seed(0)
    spec = export_mutating(cls(), make(), tmp_path / name, name)
    ins, refs = io_of(spec)
    for backend in ("portable", "xnnpack"):
        pte = tmp_path / f"{name}_{backend}.pte"
        run_kiln("lower", "--spec", spec, "--backend", backend, "--out", pte, "-q")
        compare(et_execute(pte, [x.copy() for x in ins]), refs, f"kiln {backend} .pte of {name} in ExecuTorch's runtime")
        compare(kiln_run(pte, ins, tmp_path), refs, f"kiln {backend} .pte of {name} in kiln's runtime")


def test_inplace_graph_is_what_kiln_lowers(tmp_path):
    """The premise: the default IR holds the in-place operators (no run_decompositions)."""
    spec = export_mutating(SliceAddAssign(), (rn(3, 4), rn(3, 2)), tmp_path / "p", "p")
    ops = json.loads(run_kiln("inspect", spec, "--json").stdout)["operators"]
    assert ops.get("aten.add_.Tensor", 0) >= 1 and ops.get("aten.sub_.Tensor", 0) >= 1, ops


def test_unlowerable_inplace_fails_clearly(tmp_path):
    """An in-place operator kiln still has no form for (resize_, a change of a tensor's size and storage) is
    refused in one line naming the node, the operator, the source line and the reason; no file written."""
    class M(torch.nn.Module):
        def forward(self, x):
            h = x * 2
            h.resize_(2, 6)
            return h + 1

    spec = export_mutating(M(), (rn(3, 4),), tmp_path / "m", "m")
    pte = tmp_path / "m.pte"
    before = sorted(tmp_path.rglob("*"))
    proc = run_kiln("lower", "--spec", spec, "--out", pte, "-q", check=False)
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kiln: error: ") and "resize_" in lines[0], proc.stderr
    line_no = inspect.getsourcelines(M.forward)[1] + 2  # the `h.resize_(2, 6)` line
    assert f"test_functionalize.py:{line_no}:" in lines[0] and "no kernel or decomposition" in lines[0], lines[0]
    assert sorted(tmp_path.rglob("*")) == before  # nothing written: no .pte, no debug map


def test_scalar_in_a_tensor_argument_becomes_a_tensor(tmp_path):
    """`1 - x` after a full core-ATen decomposition is aten.sub.Tensor(1, x): a Python number where the
    out variant's schema has a Tensor. kiln's file must load and run in ExecuTorch's runtime (which aborts
    on a scalar EValue where a kernel reads a tensor) and match eager."""
    class M(torch.nn.Module):
        def forward(self, x, k):
            return 1 - x, 2 - k * 3

    x, k = rn(3, 4), rn(2, 3)
    out = tmp_path / "s"
    out.mkdir()
    ep = torch.export.export(M(), (x, k)).run_decompositions()
    targets = [(str(n.target), n.args) for n in ep.graph.nodes if n.op == "call_function"]
    assert ("aten.sub.Tensor", 1) in [(t, a[0]) for t, a in targets], targets  # the oracle's premise
    torch.export.save(ep, out / "s.pt2")
    refs = [y.numpy() for y in M()(x, k)]
    spec = {"name": "s", "model_id": "tests/s", "seq_len": 1, "exported_program": "s.pt2", "ir": "core_aten",
            "inputs": [], "outputs": []}
    for i, t in enumerate((x, k)):
        np.save(out / f"in{i}.npy", t.numpy())
        spec["inputs"].append({"name": f"x{i}", "dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape),
                               "reference": f"in{i}.npy"})
    for i, r in enumerate(refs):
        np.save(out / f"out{i}.npy", r)
        spec["outputs"].append({"name": f"y{i}", "dtype": str(r.dtype), "shape": list(r.shape), "reference": f"out{i}.npy"})
    (out / "model_spec.json").write_text(json.dumps(spec))
    for backend in ("portable", "xnnpack"):
        pte = tmp_path / f"s_{backend}.pte"
        run_kiln("lower", "--spec", out / "model_spec.json", "--backend", backend, "--out", pte, "-q")
        compare(et_execute(pte, [x.numpy(), k.numpy()]), refs, f"kiln {backend} .pte in ExecuTorch's runtime")
        compare(kiln_run(pte, [x.numpy(), k.numpy()], tmp_path), refs, f"kiln {backend} .pte in kiln's runtime")


def test_unsupported_operator_is_one_line_naming_it(tmp_path):
    """An operator kiln cannot lower: one line naming the operator, the node, the source line and the
    reason; exit 1; no .pte written."""
    class M(torch.nn.Module):
        def forward(self, x):
            y = x * 2
            return torch.linalg.inv(y)

    spec = export_mutating(M(), (rn(3, 3),), tmp_path / "u", "u")
    pte = tmp_path / "u.pte"
    before = sorted(tmp_path.rglob("*"))
    for backend in ("portable", "xnnpack"):
        proc = run_kiln("lower", "--spec", spec, "--backend", backend, "--out", pte, "-q", check=False)
        assert proc.returncode == 1, proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1, proc.stderr
        line = lines[0]
        assert line.startswith("kiln: error: cannot lower node '"), line
        line_no = inspect.getsourcelines(M.forward)[1] + 2  # the `torch.linalg.inv(y)` line
        assert "aten.linalg_inv" in line and f"at test_functionalize.py:{line_no}: " in line, line
        assert "kiln has no kernel or decomposition for this operator" in line, line  # the reason
        assert sorted(tmp_path.rglob("*")) == before  # nothing written: no .pte, no debug map, no JSON
