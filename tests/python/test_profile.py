"""Debug maps (`kiln lower` writes X.debug.json) and `kiln profile` (docs/PROFILING.md).

Oracles: the .pt2's own node metadata as torch.export.load reads it (node names,
nn_module_stack, stack_trace), the model's source files (the lines the map names
exist and hold the code the stack trace shows), the runtime's own instruction and
step counts (`kiln profile --json`), Python's json module for the trace, and the
invariant that the profile's rows add up to the measured execute() time.
"""
from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from conftest import REPO, kiln_lower, run_kiln, spec_of


def _pt2_nodes(spec_path: Path):
    """name -> (innermost nn_module_stack path, stack_trace) of every call node, from torch.export.load."""
    import torch

    ep = torch.export.load(spec_of(spec_path)["exported_program"] if Path(spec_of(spec_path)["exported_program"]).is_absolute()
                           else spec_path.parent / spec_of(spec_path)["exported_program"])
    nodes = {}
    for n in ep.graph.nodes:
        if n.op != "call_function":
            continue
        stack = n.meta.get("nn_module_stack") or {}
        path = list(stack.values())[-1][0] if stack else ""
        nodes[n.name] = (path, n.meta.get("stack_trace") or "")
    return nodes


def _map_of(pte: Path) -> dict:
    return json.loads(pte.with_suffix(".debug.json").read_text())


@pytest.mark.parametrize("backend", ["portable", "xnnpack"])
def test_debug_map_points_at_pt2_nodes_and_source_lines(tiny_gpt2, backend, tmp_path):
    pte = kiln_lower(tiny_gpt2, backend)
    dmap = _map_of(pte)
    assert dmap["format"] == "kiln-debug-map" and dmap["version"] == 1 and dmap["pte"] == pte.name
    pt2 = _pt2_nodes(tiny_gpt2)
    nodes = dmap["nodes"]
    assert nodes and [n["debug_handle"] for n in nodes] == list(range(len(nodes)))
    with_module = 0
    for n in nodes:
        assert n["source_nodes"], n["name"]
        for src in n["source_nodes"]:
            assert src in pt2, f"{n['name']}: source node {src} is not in the .pt2"
        path, trace = pt2[n["source_nodes"][0]]
        assert n["module_path"] == path, (n["name"], n["module_path"], path)
        assert n["stack_trace"] == trace
        with_module += bool(path)
        if n["source"] is not None:
            src = n["source"]
            assert f'File "{src["file"]}", line {src["line"]}' in trace
            lines = Path(src["file"]).read_text().splitlines()
            assert 1 <= src["line"] <= len(lines)
            # the frame's code line as the trace shows it is the file's line
            frame = [f for f in n["frames"] if f["file"] == src["file"] and f["line"] == src["line"]][0]
            if frame["code"]:
                assert lines[src["line"] - 1].strip() == frame["code"].strip()
            assert "/torch/" not in src["file"]
    assert with_module > len(nodes) // 2
    # the model's modules are there
    paths = {n["module_path"] for n in nodes}
    assert any(p.endswith("h.0.attn") or ".h.0.attn." in p for p in paths), sorted(paths)[:20]
    assert any(".h.1.mlp" in p for p in paths)

    # instructions and regions agree with the program as ExecuTorch's deserializer reads it,
    # and every XNNPACK payload node's debug_handle is a node of its region
    from executorch.exir._serialize._program import deserialize_pte_binary
    from test_xnnpack_payload import decode_graph

    program = deserialize_pte_binary(pte.read_bytes()).program
    plan = program.execution_plan[0]
    et_ins = plan.chains[0].instructions
    ins = dmap["instructions"]
    assert len(ins) == len(et_ins)
    for k, (i, e) in enumerate(zip(ins, et_ins)):
        assert i["index"] == k
        kind = type(e.instr_args).__name__
        if i["kind"] == "kernel":
            assert kind == "KernelCall"
            op = plan.operators[e.instr_args.op_index]
            assert i["op"] == (f"{op.name}.{op.overload}" if op.overload else op.name)
            assert nodes[i["debug_handle"]]["instruction"] == k and nodes[i["debug_handle"]]["region"] is None
        else:
            assert kind == "DelegateCall" and e.instr_args.delegate_index == i["delegate"]
            r = dmap["regions"][i["region"]]
            assert r["instruction"] == k and r["delegate"] == i["delegate"]
            for h in r["debug_handles"]:
                assert nodes[h]["region"] == i["region"] and nodes[h]["instruction"] == k
            d = plan.delegates[i["delegate"]]
            (tmp_path / f"payload{k}").mkdir()
            graph = decode_graph(program.backend_delegate_data[d.processed.index].data, tmp_path / f"payload{k}")
            handles = [x["debug_handle"] for x in graph["xnodes"]]
            assert handles and set(handles) <= set(r["debug_handles"]), (handles, r["debug_handles"])
    if backend == "portable":
        assert not dmap["regions"] and all(i["kind"] == "kernel" for i in ins)
    else:
        assert dmap["regions"]


def test_no_debug_map_flag_and_profile_note(tiny_gpt2, tmp_path):
    pte = tmp_path / "m.pte"
    run_kiln("lower", "--spec", tiny_gpt2, "--backend", "xnnpack", "--out", pte, "-q")
    assert pte.with_suffix(".debug.json").is_file()
    run_kiln("lower", "--spec", tiny_gpt2, "--backend", "xnnpack", "--out", pte, "-q", "--no-debug-map")
    assert not pte.with_suffix(".debug.json").exists()  # no stale map of another lowering
    prof = json.loads(run_kiln("profile", pte, "--iters", "2", "--json").stdout)
    assert prof["debug_map"] is None and "no debug map" in prof["note"]
    assert "by_module" not in prof and prof["rows"]
    text = run_kiln("profile", pte, "--iters", "1").stdout
    assert "note: no debug map" in text


def _check_profile(pte: Path, tmp_path: Path, iters: int, threads: int = 1):
    trace = tmp_path / "trace.json"
    prof = json.loads(run_kiln("profile", pte, "--iters", iters, "--threads", threads, "--trace", trace, "--json").stdout)
    dmap = _map_of(pte)
    assert prof["debug_map"] and prof["instructions"] == len(dmap["instructions"])
    # the rows' shares are parts of the measured execute() time: every instruction's interval lies
    # inside its run's, so they add up to at most 1 (what is left is execute's own loop and the
    # clock reads; on a tiny portable program of ~1 us kernels that was 8% on a slow machine, so
    # the lower bound only says the instructions, not the loop, are most of the time)
    total_share = sum(r["share"] for r in prof["rows"])
    assert 0.5 < total_share <= 1.0 + 1e-9, total_share
    assert abs(sum(r["ms_per_run"] for r in prof["rows"]) - prof["profiled_ms_per_run"]) < 1e-6 * max(1, prof["profiled_ms_per_run"]) + 1e-3
    # every delegate step's debug handles are nodes of that delegate's region
    for r in prof["rows"]:
        if r["kind"] == "step":
            region = dmap["regions"][r["region"]]
            assert set(r["debug_handles"]) <= set(region["debug_handles"]), r
            assert dmap["instructions"][r["instruction"]]["region"] == r["region"]
        elif r["kind"] == "instruction" and dmap["instructions"][r["instruction"]]["kind"] == "kernel":
            assert r["debug_handles"] == [dmap["instructions"][r["instruction"]]["debug_handle"]]

    # the trace: Chrome-trace JSON, one event per run, instruction run and delegate step run
    t = json.loads(trace.read_text())
    events = t["traceEvents"]
    assert all(e["ph"] in ("X", "M") for e in events)
    xs = [e for e in events if e["ph"] == "X"]
    for e in xs:
        assert isinstance(e["ts"], (int, float)) and e["dur"] >= 0 and e["pid"] == 1 and e["tid"] == 1 and e["name"]
    steps = [e for e in xs if e["cat"] == "step"]
    runs = [e for e in xs if e["cat"] == "run"]
    instr = [e for e in xs if e["cat"] in ("kernel", "delegate")]
    assert len(runs) == iters
    assert len(steps) == iters * prof["delegate_steps"]
    assert len(instr) == iters * prof["instructions"]
    assert len(steps) == sum(round(r["calls_per_run"] * iters) for r in prof["rows"] if r["kind"] == "step")
    # each step lies inside a delegate call of its instruction, each instruction inside a run
    calls = [e for e in instr if e["cat"] == "delegate"]
    for s in steps[: 200]:
        assert any(c["args"]["instruction"] == s["args"]["instruction"] and c["ts"] <= s["ts"] + 1e-3
                   and s["ts"] + s["dur"] <= c["ts"] + c["dur"] + 1e-3 for c in calls), s
    return prof


def _top_modules(prof, n):
    return [r["module"] for r in prof["by_module_pattern"][:n]]


def test_profile_tiny_gpt2(tiny_gpt2, tmp_path):
    pte = kiln_lower(tiny_gpt2, "xnnpack")
    prof = _check_profile(pte, tmp_path, iters=3, threads=2)
    assert prof["by_region"] and prof["by_operator"]
    modules = {r["module"] for r in prof["by_module"]}
    assert any(".attn" in m for m in modules) and any(".mlp" in m for m in modules) and "model.lm_head" in modules


def test_profile_portable_rows_are_kernel_calls(tiny_gpt2, tmp_path):
    pte = kiln_lower(tiny_gpt2, "portable")
    prof = _check_profile(pte, tmp_path, iters=2)
    assert prof["delegate_steps"] == 0 and all(r["kind"] == "instruction" for r in prof["rows"])


@pytest.mark.parametrize("gpt2_small", ["default"], indirect=True)
def test_profile_gpt2_small_names_attention_mlp_and_lm_head(gpt2_small, tmp_path):
    pte = kiln_lower(gpt2_small, "xnnpack")
    prof = _check_profile(pte, tmp_path, iters=2, threads=2)
    top = _top_modules(prof, 4)
    # the profile's top rows are the transformer's attention, MLP and the LM head
    assert any(re.search(r"\.h\.\*\.attn", m) for m in top), top
    assert any(re.search(r"\.h\.\*\.mlp", m) for m in top), top
    assert any(m.endswith("lm_head") for m in top), top


def test_profiling_allocates_nothing_in_execute(tiny_gpt2, tmp_path):
    alloc_check = REPO / "build" / "kiln_alloc_check"
    if not alloc_check.is_file():
        raise RuntimeError(f"{alloc_check} not built")
    pte = kiln_lower(tiny_gpt2, "xnnpack")
    proc = subprocess.run([str(alloc_check), str(pte), "--profile"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["hook_counted"] >= 1 and result["allocations_during_execute"] == 0, result


def test_profile_bad_input(tmp_path):
    bad = tmp_path / "bad.pte"
    bad.write_bytes(b"not a program")
    proc = run_kiln("profile", bad, check=False)
    assert proc.returncode != 0 and proc.stderr.strip().count("\n") == 0 and "error" in proc.stderr


def test_etdump_loads_in_executorch_inspector(tiny_gpt2, tmp_path):
    from executorch.devtools import Inspector

    pte = kiln_lower(tiny_gpt2, "xnnpack")
    etdp = tmp_path / "profile.etdp"
    iters = 3
    prof = json.loads(run_kiln("profile", pte, "--iters", iters, "--etdump", etdp, "--json").stdout)
    dmap = _map_of(pte)
    inspector = Inspector(etdump_path=str(etdp))
    assert len(inspector.event_blocks) == 1  # every run has the same events: one block
    events = inspector.event_blocks[0].events
    # Method::execute, every instruction, every delegate step
    assert len(events) == 1 + prof["instructions"] + prof["delegate_steps"]
    for e in events:
        assert len(e.perf_data.raw) == iters
    by_name = {}
    for e in events:
        by_name.setdefault(e.name, []).append(e)
    execute = by_name["Method::execute"][0]
    assert abs(sum(execute.perf_data.raw) / iters - prof["measured_ms_per_run"]) < 1e-6 * prof["measured_ms_per_run"] + 1e-6
    delegates = [i for i in dmap["instructions"] if i["kind"] == "delegate"]
    assert len(by_name["DELEGATE_CALL"]) == len(delegates)
    delegated = [e for e in events if e.is_delegated_op]
    assert len(delegated) == prof["delegate_steps"]
    # with the debug map, delegated rows name the model's modules, kernel rows their op and module
    assert any(".attn" in e.name for e in delegated) and any(".mlp" in e.name for e in delegated)
    kernels = [i for i in dmap["instructions"] if i["kind"] == "kernel"]
    for k in kernels:
        assert any(e.name.startswith(k["op"]) and e._instruction_id == k["index"] for e in events), k
