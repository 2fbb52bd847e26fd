#!/usr/bin/env python3
"""ExecuTorch's own lowering of a kiln model spec: the reference kiln is compared against.

    python bench/reference/lower_with_executorch.py --spec SPEC --backend portable|xnnpack [--out PATH]

Loads the .pt2 named by model_spec.json, lowers it with
`executorch.exir.to_edge_transform_and_lower` (no partitioner for `portable`,
`XnnpackPartitioner()` for `xnnpack`), runs `.to_executorch()`, and writes
`<name>_<backend>_et.pte` beside the spec (or at --out) plus a JSON with the same
stem. The JSON carries the fields `kiln lower` writes (model, model_id, backend,
exported_program, pte, pte_size_mb, seq_len, delegation) and in addition the
per-stage lowering times and the ExecuTorch version.

`delegation` is a dict for both backends:
  delegate_call_sites    call_function nodes targeting executorch_call_delegate
  delegated_node_count   call_function nodes inside the lowered modules' original graphs
  fallback_ops           histogram target -> count of the other call_function nodes in the
                         graph after to_executorch (what the tutorial reported)
  fallback_count         total of fallback_ops
  edge_fallback_ops      the same histogram on the edge graph, before to_executorch
  edge_fallback_count    total of edge_fallback_ops

Stage times: `to_edge_transform_and_lower` (edge conversion, partitioning and
backend preprocess), `to_executorch` (ExecuTorch passes, memory planning,
emission and flatbuffer serialization, which happen in the
ExecutorchProgramManager constructor), `serialize` (writing the serialized
program to disk), and `total` (loading the .pt2 excluded).

This is a benchmark/oracle script: it imports torch and executorch. No kiln
product code depends on it.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import zipfile
from collections import Counter
from pathlib import Path

PROG = "lower_with_executorch"
BACKENDS = ("portable", "xnnpack")


class LoweringError(Exception):
    """A failure reported to the user as one line and a non-zero exit."""


def _parse(argv):
    p = argparse.ArgumentParser(
        prog="lower_with_executorch.py",
        description="Reference lowering of a kiln model spec with ExecuTorch "
        "(to_edge_transform_and_lower + to_executorch).",
    )
    p.add_argument("--spec", required=True, help="model_spec.json written by kiln_export")
    p.add_argument("--backend", required=True, choices=BACKENDS)
    p.add_argument("--out", default=None,
                   help="output .pte path (default: <spec dir>/<name>_<backend>_et.pte)")
    p.add_argument("--traceback", action="store_true",
                   help="on an unexpected failure, print the Python traceback too")
    return p.parse_args(argv)


def _load_spec(spec_path: Path) -> dict:
    if not spec_path.is_file():
        raise LoweringError(f"spec not found: {spec_path}")
    try:
        spec = json.loads(spec_path.read_text())
    except (OSError, ValueError) as e:
        raise LoweringError(f"cannot read spec {spec_path}: {e}") from e
    if not isinstance(spec, dict):
        raise LoweringError(f"spec {spec_path} is not a JSON object")
    missing = [k for k in ("name", "model_id", "seq_len", "exported_program") if k not in spec]
    if missing:
        raise LoweringError(f"spec {spec_path} lacks key(s): {', '.join(missing)}")
    return spec


def _target_name(target) -> str:
    """A stable, readable name for an fx node target (no object addresses):
    aten.mm.default, aten.mm.out, _operator.getitem, executorch.exir.memory.alloc."""
    import torch

    if isinstance(target, (torch._ops.OpOverload, torch._ops.HigherOrderOperator)):
        return str(target)
    try:
        from executorch.exir.dialects.edge._ops import EdgeOpOverload

        if isinstance(target, EdgeOpOverload):
            # Its str() appends the schema; name it like the ATen overload it wraps,
            # so edge and to_executorch histograms read alike (aten.mm.default / .out).
            return str(target._op)
    except ImportError:  # pragma: no cover - executorch layout changed
        pass
    name = getattr(target, "__name__", None)
    module = getattr(target, "__module__", None)
    if name:
        return f"{module}.{name}" if module else name
    return str(target)


def _call_function_histogram(graph_module, delegate_op) -> tuple[int, Counter]:
    """(delegate call sites, histogram of the other call_function targets) of a graph,
    including nested control-flow submodules' graphs (not lowered backend modules)."""
    import torch

    delegate_calls = 0
    hist: Counter = Counter()
    for node in graph_module.graph.nodes:
        if node.op != "call_function":
            continue
        if node.target == delegate_op:
            delegate_calls += 1
        else:
            hist[_target_name(node.target)] += 1
    # cond/map/while bodies live in submodules of the top-level graph module.
    for _, sub in graph_module.named_children():
        if isinstance(sub, torch.fx.GraphModule):
            d, h = _call_function_histogram(sub, delegate_op)
            delegate_calls += d
            hist.update(h)
    return delegate_calls, hist


def _sorted_hist(hist: Counter) -> dict:
    return dict(sorted(hist.items(), key=lambda kv: (-kv[1], kv[0])))


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _delegated_node_count(graph_module):
    try:
        from executorch.devtools.backend_debug import get_delegation_info
    except ImportError:
        return None
    return int(get_delegation_info(graph_module).num_delegated_nodes)


def lower(spec_path: Path, backend: str, out: Path | None) -> dict:
    spec = _load_spec(spec_path)
    spec_dir = spec_path.parent
    pt2 = spec_dir / spec["exported_program"]
    if not pt2.is_file():
        raise LoweringError(f"exported program not found: {pt2} (named by {spec_path})")
    if not zipfile.is_zipfile(pt2):
        raise LoweringError(f"cannot load exported program {pt2}: not a .pt2 (zip) archive")
    if out is None:
        out = spec_dir / f"{spec['name']}_{backend}_et.pte"
    if out.suffix != ".pte":
        raise LoweringError(f"--out must end in .pte: {out}")
    if not out.parent.is_dir():
        raise LoweringError(f"output directory does not exist: {out.parent}")
    meta_path = out.with_suffix(".json")

    import torch
    from executorch.exir import to_edge_transform_and_lower
    import executorch.version as et_version

    try:
        ep = torch.export.load(str(pt2))
    except Exception as e:  # noqa: BLE001 - any load failure is one line for the user
        raise LoweringError(f"cannot load exported program {pt2}: {type(e).__name__}: {e}") from e

    partitioner = []
    if backend == "xnnpack":
        from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

        partitioner = [XnnpackPartitioner()]
    delegate_op = torch.ops.higher_order.executorch_call_delegate

    t_start = time.perf_counter()
    edge = to_edge_transform_and_lower(ep, partitioner=partitioner or None)
    t_edge = time.perf_counter()

    # Count the edge graph now: to_executorch's passes may rewrite it in place.
    edge_gm = edge.exported_program().graph_module
    edge_calls, edge_hist = _call_function_histogram(edge_gm, delegate_op)
    delegated_nodes = _delegated_node_count(edge_gm)

    t_et0 = time.perf_counter()
    et_program = edge.to_executorch()
    t_et1 = time.perf_counter()

    et_gm = et_program.exported_program().graph_module
    calls, hist = _call_function_histogram(et_gm, delegate_op)
    if calls != edge_calls:
        raise LoweringError(f"delegate call sites changed in to_executorch: "
                            f"{edge_calls} on the edge graph, {calls} after")
    if getattr(et_program, "_tensor_data", None):
        raise LoweringError("lowering produced external tensor data (.ptd); "
                            "this script writes a self-contained .pte only")

    # Write to a temp file in the destination directory, then rename: no partial .pte.
    t_ser0 = time.perf_counter()
    fd, tmp = tempfile.mkstemp(prefix=f".{out.stem}.", suffix=".pte.tmp", dir=out.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            et_program.write_to_file(f)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp creates 0600; give the usual mode
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    t_ser1 = time.perf_counter()

    delegation = {"delegate_call_sites": calls}
    if delegated_nodes is not None:
        delegation["delegated_node_count"] = delegated_nodes
    delegation.update({
        "fallback_ops": _sorted_hist(hist),
        "fallback_count": sum(hist.values()),
        "edge_fallback_ops": _sorted_hist(edge_hist),
        "edge_fallback_count": sum(edge_hist.values()),
    })

    metadata = {
        "model": spec["name"],
        "model_id": spec["model_id"],
        "backend": backend,
        "exported_program": str(pt2),
        "pte": str(out),
        "pte_size_mb": out.stat().st_size / 1_000_000.0,
        "seq_len": spec["seq_len"],
        "delegation": delegation,
        "lowering_seconds": {
            "to_edge_transform_and_lower": t_edge - t_start,
            "to_executorch": t_et1 - t_et0,
            "serialize": t_ser1 - t_ser0,
            "total": (t_edge - t_start) + (t_et1 - t_et0) + (t_ser1 - t_ser0),
        },
        "executorch_version": et_version.__version__,
    }
    tmp_meta = meta_path.with_name(f".{meta_path.name}.tmp")
    tmp_meta.write_text(json.dumps(metadata, indent=2) + "\n")
    os.replace(tmp_meta, meta_path)
    metadata["_metadata_path"] = str(meta_path)
    return metadata


def _summary(meta: dict) -> str:
    d = meta["delegation"]
    s = meta["lowering_seconds"]
    lines = [
        f"{PROG}: {meta['model']} ({meta['model_id']}, seq_len {meta['seq_len']}) "
        f"backend {meta['backend']}, ExecuTorch {meta['executorch_version']}",
        f"  pte: {meta['pte']} ({meta['pte_size_mb']:.2f} MB)",
        f"  delegate call sites: {d['delegate_call_sites']}"
        + (f", delegated nodes: {d['delegated_node_count']}" if "delegated_node_count" in d else ""),
        f"  fallback call_function ops: {d['fallback_count']} after to_executorch, "
        f"{d['edge_fallback_count']} on the edge graph",
    ]
    top = list(d["fallback_ops"].items())[:10]
    if top:
        lines.append("  top fallback ops: " + ", ".join(f"{k} ({v})" for k, v in top))
    lines.append(
        f"  seconds: to_edge_transform_and_lower {s['to_edge_transform_and_lower']:.2f}, "
        f"to_executorch {s['to_executorch']:.2f}, serialize {s['serialize']:.2f}, "
        f"total {s['total']:.2f}")
    lines.append(f"  metadata: {meta['_metadata_path']}")
    return "\n".join(lines)


def main(argv=None) -> int:
    args = _parse(argv)
    try:
        meta = lower(Path(args.spec), args.backend, Path(args.out) if args.out else None)
    except LoweringError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 1
    except ImportError as e:
        print(f"{PROG}: error: missing Python package: {e}", file=sys.stderr)
        return 1
    except Exception as e:  # noqa: BLE001 - one clear line, not a traceback
        if args.traceback:
            import traceback

            traceback.print_exc()
        print(f"{PROG}: error: lowering failed: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    print(_summary(meta), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
