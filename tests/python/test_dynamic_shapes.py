"""Dynamic shapes: .pt2 files exported with dynamic_shapes (a bounded symbolic size,
torch.export.Dim) lower to ExecuTorch's DYNAMIC_BOUND tensors, planned at the upper
bound, with the shape arithmetic as sym_size / executorch_prim instructions. One
lowering runs at every length up to the bound, in kiln's runtime and in ExecuTorch's,
against PyTorch eager."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import run_kiln

MAX_T = 8


class SmallModel(torch.nn.Module):
    """linear + layer_norm + gelu + view + softmax + reshape + linear over a dynamic leading dim."""

    def __init__(self):
        super().__init__()
        self.l1 = torch.nn.Linear(16, 32)
        self.ln = torch.nn.LayerNorm(32)
        self.l2 = torch.nn.Linear(32, 16)

    def forward(self, x):
        h = torch.nn.functional.gelu(self.ln(self.l1(x)))
        h = h.view(x.shape[0], 4, 8)
        h = torch.softmax(h, -1)
        return self.l2(h.reshape(x.shape[0], 32))


class SeqModel(torch.nn.Module):
    """A dynamic sequence dim in the middle: [1, T, 16] -> heads -> back (sizes that are multiples of T)."""

    def __init__(self):
        super().__init__()
        self.l1 = torch.nn.Linear(16, 32)
        self.l2 = torch.nn.Linear(32, 8)

    def forward(self, x):
        b, t, _ = x.shape
        h = self.l1(x).view(b, t, 4, 8).transpose(1, 2)  # [1, 4, T, 8]
        h = torch.softmax(h * 0.5, dim=-1).transpose(1, 2).reshape(b, t * 32)
        return self.l2(h.view(b, t, 32)).sum(dim=-1, keepdim=True) + h.view(b * t, 32)[:, :1].view(b, t, 1)


def export_dynamic(module, example, dim: int, out: Path, name: str, decompose: bool, max_t: int = MAX_T) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    module.eval()
    torch.manual_seed(0)
    T = torch.export.Dim("T", min=1, max=max_t)
    ep = torch.export.export(module, (example,), dynamic_shapes={"x": {dim: T}})
    if decompose:
        ep = ep.run_decompositions()
    torch.export.save(ep, out / f"{name}.pt2")
    shape = list(example.shape)
    shape[dim] = max_t
    spec = {"name": name, "model_id": f"tests/{name}", "seq_len": MAX_T, "exported_program": f"{name}.pt2",
            "ir": "core_aten" if decompose else "default",
            "inputs": [{"name": "x", "dtype": "float32", "shape": shape}],
            "outputs": [{"name": "y", "dtype": "float32"}]}
    (out / "model_spec.json").write_text(json.dumps(spec))
    return out / "model_spec.json"


def kiln_run(pte: Path, x: np.ndarray, tmp: Path) -> np.ndarray:
    np.save(tmp / "x.npy", x)
    run_kiln("run", pte, "--input", tmp / "x.npy", "--output", tmp / "y.npy")
    return np.load(tmp / "y.npy")


def et_run(pte: Path, x: np.ndarray) -> np.ndarray:
    from executorch.runtime import Runtime

    method = Runtime.get().load_program(str(pte)).load_method("forward")
    return method.execute([torch.from_numpy(x)])[0].numpy()


def close(got, ref, what):
    assert got.shape == ref.shape, (what, got.shape, ref.shape)
    diff = float(np.abs(got.astype(np.float64) - ref.astype(np.float64)).max())
    assert diff <= 1e-5 * max(1.0, float(np.abs(ref).max())), f"{what}: max |diff| {diff:.3g}"


CASES = [("small", SmallModel, (5, 16), 0), ("seq", SeqModel, (1, 5, 16), 1)]


def delegate_count(pte: Path) -> int:
    from executorch.exir._serialize._program import deserialize_pte_binary

    loaded = deserialize_pte_binary(pte.read_bytes())
    return len((loaded.program if hasattr(loaded, "program") else loaded).execution_plan[0].delegates)


@pytest.mark.parametrize("backend", ["portable", "xnnpack"])
@pytest.mark.parametrize("decompose", [False, True], ids=["default", "core_aten"])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_one_lowering_runs_every_length_in_both_runtimes(tmp_path, case, decompose, backend):
    name, cls, shape, dim = case
    torch.manual_seed(0)
    module = cls().eval()
    spec = export_dynamic(module, torch.randn(*shape), dim, tmp_path, name, decompose)
    run_kiln("lower", "--spec", spec, "--backend", backend, "-q")
    pte = tmp_path / f"{name}_{backend}.pte"
    if backend == "xnnpack":  # the linear layers, at least, run in XNNPACK delegates of the dynamic length
        meta = json.loads(pte.with_suffix(".json").read_text())["delegation"]
        assert meta["delegate_call_sites"] >= 1, meta
        assert not {"aten.addmm.default", "aten.mm.default", "aten.linear.default"} & set(meta["fallback_ops"]), meta

    # The program's format: the input is DYNAMIC_BOUND at the upper bound; sizes come from sym_size.
    from executorch.exir._serialize._program import deserialize_pte_binary
    from executorch.exir.schema import TensorShapeDynamism

    loaded = deserialize_pte_binary(pte.read_bytes())
    plan = (loaded.program if hasattr(loaded, "program") else loaded).execution_plan[0]
    x_value = plan.values[plan.inputs[0]].val
    assert x_value.shape_dynamism == TensorShapeDynamism.DYNAMIC_BOUND
    assert x_value.sizes[dim] == MAX_T
    if backend == "portable":
        assert "aten::sym_size" in [op.name for op in plan.operators]

    for t in (1, 3, MAX_T):
        s = list(shape)
        s[dim] = t
        x = torch.randn(*s)
        with torch.no_grad():
            ref = module(x).numpy()
        close(kiln_run(pte, x.numpy(), tmp_path), ref, f"kiln runtime, T={t}")
        close(et_run(pte, x.numpy()), ref, f"ExecuTorch runtime, T={t}")


def test_xnnpack_delegates_of_a_two_value_dim(tmp_path):
    """T in [1, 2]: the lowering's second look at each region is at T = 1, and every length runs right."""
    torch.manual_seed(0)
    module = SmallModel().eval()
    spec = export_dynamic(module, torch.randn(2, 16), 0, tmp_path, "small2", False, max_t=2)
    run_kiln("lower", "--spec", spec, "--backend", "xnnpack", "-q")
    pte = tmp_path / "small2_xnnpack.pte"
    assert delegate_count(pte) >= 1
    for t in (1, 2):
        x = torch.randn(t, 16)
        with torch.no_grad():
            ref = module(x).numpy()
        close(kiln_run(pte, x.numpy(), tmp_path), ref, f"kiln runtime, T={t}")
        close(et_run(pte, x.numpy()), ref, f"ExecuTorch runtime, T={t}")


def test_reader_reports_symbols_and_size_expressions(tmp_path):
    module = SeqModel().eval()
    spec = export_dynamic(module, torch.randn(1, 5, 16), 1, tmp_path, "seq", False)
    ep = torch.export.load(str(tmp_path / "seq.pt2"))
    info = json.loads(run_kiln("inspect", spec, "--json").stdout)
    (sym, rng), = ep.range_constraints.items()
    assert info["symbols"] == [{"name": str(sym), "min": int(rng.lower), "max": int(rng.upper)}]
    x = info["inputs"][0]
    assert x["shape"] == [1, MAX_T, 16]
    assert x["sym_shape"] == ["1", str(sym), "16"]


@pytest.mark.parametrize("backend", ["portable", "xnnpack"])
def test_bad_lengths_give_one_line(tmp_path, backend):
    module = SmallModel().eval()
    spec = export_dynamic(module, torch.randn(5, 16), 0, tmp_path, "small", False)
    run_kiln("lower", "--spec", spec, "--backend", backend, "-q")
    pte = tmp_path / f"small_{backend}.pte"
    for bad in (np.zeros((MAX_T + 1, 16), np.float32), np.zeros((3, 15), np.float32)):
        np.save(tmp_path / "bad.npy", bad)
        proc = run_kiln("run", pte, "--input", tmp_path / "bad.npy", check=False)
        assert proc.returncode != 0
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    # after a refused input, the same program still runs good ones, in one process (kiln run --steps)
    xs = [torch.randn(t, 16) for t in (2, MAX_T, 2)]
    args = []
    for k, x in enumerate(xs):
        np.save(tmp_path / f"x{k}.npy", x.numpy())
        args += ["-i", tmp_path / f"x{k}.npy", "-o", tmp_path / f"y{k}.npy"]
    run_kiln("run", pte, "--steps", len(xs), *args)
    with torch.no_grad():
        for k, x in enumerate(xs):
            close(np.load(tmp_path / f"y{k}.npy"), module(x).numpy(), f"call {k} (T={x.shape[0]})")


class AttentionBlock(torch.nn.Module):
    """A GPT-2 block (nanoGPT's form): attention with the causal mask sliced to the dynamic length."""

    def __init__(self, C=32, H=4):
        super().__init__()
        self.C, self.H = C, H
        self.ln1, self.ln2 = torch.nn.LayerNorm(C), torch.nn.LayerNorm(C)
        self.attn, self.proj = torch.nn.Linear(C, 3 * C), torch.nn.Linear(C, C)
        self.fc, self.fc2 = torch.nn.Linear(C, 4 * C), torch.nn.Linear(4 * C, C)
        block = 2 * MAX_T  # the model's block size; the exported length goes up to MAX_T
        self.register_buffer("bias", torch.tril(torch.ones(block, block)).view(1, 1, block, block))

    def forward(self, x):
        B, T, C = x.shape
        D = C // self.H
        q, k, v = self.attn(self.ln1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.H, D).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / D ** 0.5)
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        y = (torch.softmax(att, dim=-1) @ v).transpose(1, 2).reshape(B, T, C)
        x = x + self.proj(y)
        return x + self.fc2(torch.nn.functional.gelu(self.fc(self.ln2(x))))


@pytest.mark.parametrize("backend", ["portable", "xnnpack"])
def test_attention_block_with_a_causal_mask_of_the_dynamic_length(tmp_path, backend):
    torch.manual_seed(0)
    module = AttentionBlock().eval()
    spec = export_dynamic(module, torch.randn(1, 5, 32), 1, tmp_path, "block", False)
    run_kiln("lower", "--spec", spec, "--backend", backend, "-q")
    pte = tmp_path / f"block_{backend}.pte"
    if backend == "xnnpack":
        assert delegate_count(pte) >= 1
    for t in (1, 3, MAX_T):
        x = torch.randn(1, t, 32)
        with torch.no_grad():
            ref = module(x).numpy()
        close(kiln_run(pte, x.numpy(), tmp_path), ref, f"kiln runtime, T={t}")
        close(et_run(pte, x.numpy()), ref, f"ExecuTorch runtime, T={t}")


class Stateful(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("acc", torch.zeros(16))

    def forward(self, x):
        self.acc.copy_(self.acc + x.sum(0))
        return x * 2 + self.acc


@pytest.mark.parametrize("backend", ["portable", "xnnpack"])
def test_dynamic_program_with_state_keeps_it_across_lengths(tmp_path, backend):
    """A buffer the program updates, with inputs of a different length each call: one lowering, the state
    carried from call to call in both runtimes (kiln run --steps; ExecuTorch's method called again)."""
    spec = export_dynamic(Stateful(), torch.randn(5, 16), 0, tmp_path, "state", True)
    run_kiln("lower", "--spec", spec, "--backend", backend, "-q")
    pte = tmp_path / f"state_{backend}.pte"
    xs = [torch.randn(t, 16, generator=torch.Generator().manual_seed(t)) for t in (3, 1, MAX_T, 2)]
    eager = Stateful()
    with torch.no_grad():
        refs = [eager(x).numpy() for x in xs]
    args = []
    for k, x in enumerate(xs):
        np.save(tmp_path / f"x{k}.npy", x.numpy())
        args += ["-i", tmp_path / f"x{k}.npy", "-o", tmp_path / f"y{k}.npy"]
    run_kiln("run", pte, "--steps", len(xs), *args)
    from executorch.runtime import Runtime

    method = Runtime.get().load_program(str(pte)).load_method("forward")
    for k, (x, ref) in enumerate(zip(xs, refs)):
        close(np.load(tmp_path / f"y{k}.npy"), ref, f"kiln runtime, call {k} (T={x.shape[0]})")
        close(method.execute([x])[0].numpy(), ref, f"ExecuTorch runtime, call {k} (T={x.shape[0]})")


def test_profile_and_bench_take_inputs_of_a_dynamic_length(tmp_path):
    """`kiln profile` and `kiln bench` run a dynamic program on an .npy of any length within the bound;
    a longer one gets one line naming the input."""
    torch.manual_seed(0)
    module = SmallModel().eval()
    spec = export_dynamic(module, torch.randn(MAX_T, 16), 0, tmp_path, "small", False)
    run_kiln("lower", "--spec", spec, "--backend", "xnnpack", "-q")
    pte = tmp_path / "small_xnnpack.pte"
    np.save(tmp_path / "x3.npy", np.random.default_rng(0).standard_normal((3, 16), dtype=np.float32))
    for cmd in ("profile", "bench"):
        proc = run_kiln(cmd, pte, "-i", tmp_path / "x3.npy", "--iters", "2")
        assert "execute" in proc.stdout or "median" in proc.stdout, proc.stdout
    np.save(tmp_path / "x9.npy", np.zeros((MAX_T + 1, 16), dtype=np.float32))
    np.save(tmp_path / "xd.npy", np.zeros((3, 16), dtype=np.float64))
    for bad, words in (("x9.npy", "input 0"), ("xd.npy", "dtype")):
        for cmd in ("profile", "bench"):
            proc = run_kiln(cmd, pte, "-i", tmp_path / bad, check=False)
            assert proc.returncode != 0
            lines = proc.stderr.strip().splitlines()
            assert len(lines) == 1 and words in lines[0], proc.stderr


def test_fp32_weights_in_huge_page_memory_give_the_same_results(tmp_path, monkeypatch):
    """The default (fully-connected weights copied out of the file into huge pages at load; any
    value but 0) and KILN_HUGE_PAGES=0 (read in place): the same outputs as eager at every length."""
    torch.manual_seed(0)
    module = SmallModel().eval()
    spec = export_dynamic(module, torch.randn(MAX_T, 16), 0, tmp_path, "small", False)
    run_kiln("lower", "--spec", spec, "--backend", "xnnpack", "-q")
    pte = tmp_path / "small_xnnpack.pte"
    for mode in ("1", "0"):
        monkeypatch.setenv("KILN_HUGE_PAGES", mode)
        for t in (1, MAX_T):
            x = torch.randn(t, 16)
            with torch.no_grad():
                ref = module(x).numpy()
            close(kiln_run(pte, x.numpy(), tmp_path), ref, f"KILN_HUGE_PAGES={mode}, T={t}")
