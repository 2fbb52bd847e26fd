"""ETRecord (`kiln lower --etrecord`) and intermediate outputs (`kiln profile --etdump --debug-outputs`) in
ExecuTorch's devtools (docs/PROFILING.md).

Oracles: ExecuTorch's own ETRecord for its lowering of the same .pt2 (the module hierarchy and stack traces
Inspector's rows carry), PyTorch running the .pt2's program (what Inspector.calculate_numeric_gap compares
each instruction's output with), ExecuTorch's runtime writing the ETDump for kiln's .pte, and a weight the
test perturbs (the gap must appear first at the operator that reads it).
"""
from __future__ import annotations

import json
import math
import subprocess
import warnings
from pathlib import Path

import numpy as np
import pytest

from conftest import REPO, run_export, run_kiln, spec_of

warnings.filterwarnings("ignore")


def _lower(spec: Path, backend: str, out_dir: Path, name: str = "k") -> tuple[Path, Path]:
    pte, etr = out_dir / f"{name}_{backend}.pte", out_dir / f"{name}_{backend}.etrecord"
    run_kiln("lower", "--spec", spec, "--backend", backend, "--out", pte, "--etrecord", etr, "-q")
    return pte, etr


def _profile(pte: Path, inputs: list[Path], out: Path, debug_outputs: bool = True) -> Path:
    args = ["profile", pte, "--iters", 1, "--warmup", 0, "--etdump", out, "--json"]
    for i in inputs:
        args += ["--input", i]
    if debug_outputs:
        args.append("--debug-outputs")
    prof = json.loads(run_kiln(*args).stdout)
    if debug_outputs:
        assert prof["debug_outputs"]["tensors"] > 0 and not prof["debug_outputs"]["overflowed"]
    return out


def _inspector(etdp: Path, etr: Path, buf: Path | None = None):
    from executorch.devtools import Inspector

    return Inspector(etdump_path=str(etdp), etrecord=str(etr), debug_buffer_path=str(buf) if buf else None)


def _row_sets(ins):
    """(innermost module path -> its nn_module_stack, stack traces, operator names) over every row."""
    mods, traces, ops = {}, set(), set()
    for b in ins.event_blocks:
        for e in b.events:
            for stack in e.module_hierarchy.values():
                if stack:
                    mods[list(stack.values())[-1][0]] = tuple(stack.values())
            traces.update(t for t in e.stack_traces.values() if t)
            ops.update(e.op_types)
    return mods, traces, ops


def _executorch_pair(spec: Path, backend: str, out_dir: Path):
    """ExecuTorch's lowering of the .pt2 with its ETRecord, and its runtime's ETDump for the reference input."""
    import torch
    from executorch.exir import to_edge_transform_and_lower
    from executorch.extension.pybindings.portable_lib import _load_for_executorch

    s = spec_of(spec)
    ep = torch.export.load(str(spec.parent / s["exported_program"]))
    part = None
    if backend == "xnnpack":
        from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

        part = [XnnpackPartitioner()]
    et = to_edge_transform_and_lower(ep, partitioner=part, generate_etrecord=True).to_executorch()
    etr = out_dir / f"et_{backend}.etrecord"
    et.get_etrecord().save(str(etr))
    pte = out_dir / f"et_{backend}.pte"
    pte.write_bytes(et.buffer)
    etdp = _et_runtime_etdump(pte, [spec.parent / i["reference"] for i in s["inputs"]], out_dir / f"et_{backend}")
    return etdp, etr


def _et_runtime_etdump(pte: Path, inputs: list[Path], stem: Path) -> Path:
    import torch
    from executorch.extension.pybindings.portable_lib import _load_for_executorch

    m = _load_for_executorch(str(pte), enable_etdump=True, debug_buffer_size=16 << 20)
    m.forward(tuple(torch.from_numpy(np.load(i)) for i in inputs))
    m.write_etdump_result_to_file(str(stem) + ".etdp", str(stem) + ".bin")
    return Path(str(stem) + ".etdp")


def _edge_is_edge_dialect(etr: Path):
    from executorch.devtools.etrecord import parse_etrecord
    from executorch.exir.dialects.edge._ops import EdgeOpOverload

    r = parse_etrecord(str(etr))
    calls = [n for n in r.edge_dialect_program.graph.nodes if n.op == "call_function" and n.target.__name__ != "getitem"]
    assert calls and all(isinstance(n.target, EdgeOpOverload) for n in calls), [
        n.target for n in calls if not isinstance(n.target, EdgeOpOverload)][:5]
    assert all("debug_handle" in n.meta and "from_node" in n.meta for n in calls)
    return r


# ExecuTorch's own lowering and ETRecord are the slow part (17-45 s a row): the default IR only here; the
# core-ATen program's ETRecord is covered by the numeric-gap and ExecuTorch-runtime tests below.
@pytest.mark.parametrize("tiny_gpt2", ["default"], indirect=True)
@pytest.mark.parametrize("backend", ["portable", "xnnpack"])
def test_inspector_rows_match_executorch_etrecord(tiny_gpt2, backend, tmp_path):
    pte, etr = _lower(tiny_gpt2, backend, tmp_path)
    _edge_is_edge_dialect(etr)
    ref_in = [tiny_gpt2.parent / i["reference"] for i in spec_of(tiny_gpt2)["inputs"]]
    kmods, ktraces, kops = _row_sets(_inspector(_profile(pte, ref_in, tmp_path / "k.etdp", False), etr))
    emods, etraces, eops = _row_sets(_inspector(*_executorch_pair(tiny_gpt2, backend, tmp_path)))
    # every module and source line kiln's rows name, ExecuTorch's rows name too, with the same module stack
    assert kmods and set(kmods) <= set(emods), sorted(set(kmods) - set(emods))
    for path, stack in kmods.items():
        assert stack == emods[path], path
    assert ktraces and ktraces <= etraces
    # what ExecuTorch's rows have beyond kiln's: modules whose every node kiln computed ahead of time or
    # removed (position ids, masks, dropout): none of kiln's edge nodes belongs to them
    dmap = json.loads(pte.with_suffix(".debug.json").read_text())
    running = {n["module_path"] for n in dmap["nodes"] if n["instruction"] is not None}
    assert running - {""} <= set(kmods), sorted(running - set(kmods))
    for path in set(emods) - set(kmods):
        assert path not in running, path
    # operator names: the edge operators of the instructions' nodes
    want = {n["target"] for n in dmap["nodes"]}
    assert kops and kops <= want and (kops & eops), (sorted(kops - want), sorted(kops & eops))


def _gap_rows(ins):
    df = ins.calculate_numeric_gap("MSE")
    return [(list(r.aot_ops), list(r.runtime_ops), float(r.gap[0])) for r in df.itertuples()]


def test_numeric_gap_portable_and_perturbed_weight(tiny_gpt2, tmp_path):
    s = spec_of(tiny_gpt2)
    ref_in = [tiny_gpt2.parent / i["reference"] for i in s["inputs"]]
    pte, etr = _lower(tiny_gpt2, "portable", tmp_path)
    rows = _gap_rows(_inspector(_profile(pte, ref_in, tmp_path / "k.etdp"), etr, tmp_path / "k.debug.bin"))
    dmap = json.loads(pte.with_suffix(".debug.json").read_text())
    assert len(rows) >= len(dmap["instructions"]) // 2, (len(rows), len(dmap["instructions"]))
    for aot, rt, gap in rows:
        assert math.isfinite(gap) and gap < 1e-8, (aot, rt, gap)

    # the same program with one weight changed (h.1's MLP input projection): its product is the first to differ
    ep, pspec = _perturbed(tiny_gpt2, tmp_path / "perturbed")
    ppte = tmp_path / "perturbed.pte"
    run_kiln("lower", "--spec", pspec, "--backend", "portable", "--out", ppte, "-q")
    prows = _gap_rows(_inspector(_profile(ppte, ref_in, tmp_path / "p.etdp"), etr, tmp_path / "p.debug.bin"))
    first = next(r for r in prows if r[2] > 1e-6)
    assert _module_of(ep, first[0][-1]).endswith("h.1.mlp.c_fc"), first
    assert all(math.isfinite(g) for _, _, g in prows)


def _perturbed(spec: Path, pdir: Path):
    """The .pt2 of `spec` with h.1's MLP input projection weight changed, and a spec for it (same references)."""
    import torch

    s = spec_of(spec)
    ep = torch.export.load(str(spec.parent / s["exported_program"]))
    name = next(k for k in ep.state_dict if "h.1.mlp.c_fc.weight" in k)
    with torch.no_grad():  # (not a constant shift: the layer norm before it makes each row's sum 0)
        ep.state_dict[name].add_(0.5 * torch.randn(ep.state_dict[name].shape, generator=torch.Generator().manual_seed(0)))
    pdir.mkdir()
    torch.export.save(ep, str(pdir / s["exported_program"]))
    for i in s["inputs"] + s["outputs"]:
        (pdir / i["reference"]).write_bytes((spec.parent / i["reference"]).read_bytes())
    (pdir / "model_spec.json").write_text(json.dumps(s))
    return ep, pdir / "model_spec.json"


def _module_of(ep, aten_name: str) -> str:
    """The innermost module path of the .pt2 node `aten_name` (its nn_module_stack)."""
    stack = {n.name: n for n in ep.graph.nodes}[aten_name].meta.get("nn_module_stack") or {}
    return list(stack.values())[-1][0] if stack else ""


def _several_outputs(op: str) -> bool:
    """Whether the ATen operator `op` ("aten.split_with_sizes_copy.default") returns several tensors."""
    import torch

    _, name, overload = op.split(".")
    returns = getattr(getattr(torch.ops.aten, name), overload)._schema.returns
    return len(returns) > 1 or isinstance(returns[0].type, torch.ListType)


def test_xnnpack_delegate_node_outputs_numeric_gap_and_perturbed_weight(tiny_gpt2, tmp_path):
    """Inside kiln's XNNPACK delegate each step logs its output (its last node's, under that node's handle):
    Inspector's delegated rows carry them and calculate_numeric_gap compares them with the .pt2's operators
    in PyTorch. A fused step (a layer norm's or GELU's row chain, the attention softmax with its scale and
    mask) is one row: its operator is the fused group's last (GPT-2's GELU, 0.5 * x * (1 + tanh(...)), ends
    in a mul), and what is compared is that operator's output; the nodes inside the group are not logged."""
    s = spec_of(tiny_gpt2)
    ref_in = [tiny_gpt2.parent / i["reference"] for i in s["inputs"]]
    pte, etr = _lower(tiny_gpt2, "xnnpack", tmp_path)
    ins = _inspector(_profile(pte, ref_in, tmp_path / "k.etdp"), etr, tmp_path / "k.debug.bin")
    delegated = [e for b in ins.event_blocks for e in b.events if e.is_delegated_op]
    named = [e for e in delegated if e.debug_data and e.op_types]
    # a delegated row carries its step's output, and its timing (the profile and debug events are one row)
    assert len(named) >= 20 and all(e.perf_data is not None for e in named), (len(named), len(delegated))
    ops = {o for e in named for o in e.op_types}
    assert {"aten.addmm.default", "aten.native_layer_norm.default", "aten._softmax.default",
            "aten.permute_copy.default", "aten.mul.Tensor"} <= ops, sorted(ops)
    gelu = [e for e in named if e.name.split(":")[0].endswith("mlp.act")]
    assert gelu and all(e.op_types == ["aten.mul.Tensor"] for e in gelu), [(e.name, e.op_types) for e in gelu]

    rows = _gap_rows(ins)
    for aot, rt, gap in rows:
        assert math.isfinite(gap) and gap < 1e-8, (aot, rt, gap)
    # every delegated operator row with an output is compared, but those of operators with several outputs
    # (a split's list; core ATen's native_layer_norm: out, mean, rstd), which Inspector's comparator skips
    compared = {rt[0] for _, rt, _ in rows}
    missing = [(e.name, e.op_types) for e in named if e.name not in compared]
    assert all(len(ops) == 1 and _several_outputs(ops[0]) for _, ops in missing), missing
    inside = [r for r in rows if "(#" in r[1][0]]  # delegated steps' identifiers: "module: label (#i.s) <k>..."
    assert len(inside) >= 25, rows
    # an operator lowered as a product then a view that runs no step (the default IR's matmul: bmm, view; its
    # LM head's linear) is compared by the view's name and sizes; so is the model's output, the logits
    import torch

    ep0 = torch.export.load(str(tiny_gpt2.parent / s["exported_program"]))
    aten = {n.name: n for n in ep0.graph.nodes}
    compared_targets = {str(aten[a].target) for aot, rt, _ in inside for a in aot if a in aten}
    assert compared_targets & {"aten.matmul.default", "aten.bmm.default"}, sorted(compared_targets)
    logits = next(n for n in ep0.graph.nodes if n.op == "output").args[0][0]
    if "view" not in str(logits.target):  # (core ATen ends in a view of its own, which no step computes)
        assert any(logits.name in aot for aot, _, _ in inside), (logits.name, rows[-3:])

    # the same program with one weight changed, lowered the same way, against the unchanged program's
    # reference: the largest gap and the first one are at the product that reads the weight, a delegated step
    ep, pspec = _perturbed(tiny_gpt2, tmp_path / "perturbed")
    ppte = tmp_path / "perturbed_xnnpack.pte"
    run_kiln("lower", "--spec", pspec, "--backend", "xnnpack", "--out", ppte, "-q")
    prows = _gap_rows(_inspector(_profile(ppte, ref_in, tmp_path / "p.etdp"), etr, tmp_path / "p.debug.bin"))
    assert len(prows) == len(rows) and all(math.isfinite(g) for _, _, g in prows)
    worst = max(range(len(prows)), key=lambda k: prows[k][2])
    first = next(k for k, r in enumerate(prows) if r[2] > 1e-6)
    assert worst == first and prows[worst][2] > 1e-2, prows
    assert _module_of(ep, prows[worst][0][-1]).endswith("h.1.mlp.c_fc"), prows[worst]
    assert "kiln fully connected" in prows[worst][1][0], prows[worst]
    assert all(g < 1e-8 for _, _, g in prows[:first])


def test_executorch_runtime_etdump_with_kiln_etrecord(tiny_gpt2, tmp_path):
    s = spec_of(tiny_gpt2)
    ref_in = [tiny_gpt2.parent / i["reference"] for i in s["inputs"]]
    for backend in ("portable", "xnnpack"):
        pte, etr = _lower(tiny_gpt2, backend, tmp_path)
        stem = tmp_path / f"et_on_kiln_{backend}"
        etdp = _et_runtime_etdump(pte, ref_in, stem)
        ins = _inspector(etdp, etr, Path(str(stem) + ".bin"))
        mods, traces, ops = _row_sets(ins)
        assert mods and traces and ops
        rows = _gap_rows(ins)
        assert rows and all(math.isfinite(g) and g < 1e-8 for _, _, g in rows), rows[:5]
        if backend == "portable":
            assert len(rows) >= 40


@pytest.fixture(scope="module")
def tiny_llm(tmp_path_factory):
    """A tiny Llama LLM program (static KV cache) with reference inputs (one token at position 0)."""
    out = tmp_path_factory.mktemp("llm_etrecord")
    run_export("llm", "--arch", "llama", "--config", "tiny", "--max-seq-len", "32", "--seed", "0", "--out", out)
    np.save(out / "tokens.npy", np.array([[5]], dtype=np.int64))
    np.save(out / "pos.npy", np.array([0], dtype=np.int64))
    s = json.loads((out / "model_spec.json").read_text())
    s["inputs"][0]["reference"], s["inputs"][1]["reference"] = "tokens.npy", "pos.npy"
    (out / "spec_ref.json").write_text(json.dumps(s))
    return out / "spec_ref.json"


@pytest.mark.parametrize("backend", ["portable", "xnnpack"])
def test_llm_program_rows_and_numeric_gap(tiny_llm, backend, tmp_path):
    pte, etr = _lower(tiny_llm, backend, tmp_path)
    r = _edge_is_edge_dialect(etr)
    ins = _inspector(_profile(pte, [tiny_llm.parent / "tokens.npy", tiny_llm.parent / "pos.npy"], tmp_path / "l.etdp"),
                     etr, tmp_path / "l.debug.bin")
    mods, traces, ops = _row_sets(ins)
    assert any(".self_attn" in m for m in mods) and any(".mlp" in m for m in mods)
    assert any("index_put" in o for o in ops) or backend == "xnnpack"
    rows = _gap_rows(ins)
    assert rows and all(math.isfinite(g) and g < 1e-8 for _, _, g in rows), [x for x in rows if not x[2] < 1e-8][:3]
    # the KV cache writes are compared too (portable: the cache after index_put_)
    if backend == "portable":
        assert len(rows) > 50
    assert r.exported_program is not None


@pytest.mark.parametrize("tiny_gpt2", ["default"], indirect=True)
def test_xnnpack_delegate_node_outputs_allocate_nothing(tiny_gpt2, tmp_path):
    """Logging inside kiln's XNNPACK delegate copies into the log's preallocated buffer: execute() allocates
    nothing with it on (kiln_alloc_check counts the process's allocations during the call), and every step
    of tiny GPT-2's delegate logs its output."""
    alloc_check = REPO / "build" / "kiln_alloc_check"
    if not alloc_check.is_file():
        raise RuntimeError(f"{alloc_check} not built")
    pte, _ = _lower(tiny_gpt2, "xnnpack", tmp_path)
    proc = subprocess.run([str(alloc_check), str(pte), "--debug-outputs"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["hook_counted"] >= 1 and result["allocations_during_execute"] == 0, result
    prof = json.loads(run_kiln("profile", pte, "--iters", 1, "--warmup", 0, "--json").stdout)
    assert result["delegate_node_outputs"] == prof["delegate_steps"] > 20, (result, prof["delegate_steps"])
