"""Lowering speed, kiln vs ExecuTorch, in one run.

For the same .pt2, alternating rounds time:
  - ExecuTorch: torch.export.load + to_edge_transform_and_lower + to_executorch
    + writing the .pte (the reference workflow, in this process, imports done
    once before timing), and its to_edge + to_executorch part alone;
  - kiln: the whole `kiln lower` command (process start, .pt2 read, passes,
    emit, write, round-trip verification), wall time.
Reports medians and the ratios. Usage:
  python bench/lowering_speed.py --spec artifacts/gpt2/model_spec.json [--backend portable] [--rounds 5]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--spec", required=True)
    ap.add_argument("--backend", default="portable", choices=["portable", "xnnpack"])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--kiln", default=str(REPO / "build" / "kiln"))
    ap.add_argument("--json", action="store_true", help="print the result as JSON")
    args = ap.parse_args()

    import torch
    from executorch.exir import to_edge_transform_and_lower

    partitioner = []
    if args.backend == "xnnpack":
        from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
        partitioner = [XnnpackPartitioner()]

    spec_path = Path(args.spec).resolve()
    spec = json.loads(spec_path.read_text())
    pt2 = spec_path.parent / spec["exported_program"]
    tmp = Path(tempfile.mkdtemp(prefix="kiln_lowering_bench_"))
    et_total, et_lower, kiln_total = [], [], []
    for r in range(args.rounds):
        # ExecuTorch
        t0 = time.perf_counter()
        ep = torch.export.load(str(pt2))
        t1 = time.perf_counter()
        edge = to_edge_transform_and_lower(ep, partitioner=partitioner)
        et_prog = edge.to_executorch()
        t2 = time.perf_counter()
        out = tmp / f"et_{r}.pte"
        with open(out, "wb") as f:
            et_prog.write_to_file(f)
        t3 = time.perf_counter()
        et_total.append(t3 - t0)
        et_lower.append(t2 - t1)
        out.unlink()
        del ep, edge, et_prog
        # kiln
        kout = tmp / f"kiln_{r}.pte"
        t0 = time.perf_counter()
        proc = subprocess.run([args.kiln, "lower", "--spec", str(spec_path), "--backend", args.backend,
                               "--out", str(kout), "-q"], capture_output=True, text=True)
        t1 = time.perf_counter()
        if proc.returncode != 0:
            print(proc.stderr, file=sys.stderr)
            return 1
        kiln_total.append(t1 - t0)
        kout.unlink()
        kout.with_suffix(".json").unlink()
        print(f"round {r + 1}/{args.rounds}: ExecuTorch {et_total[-1]:.2f} s (to_edge+to_executorch "
              f"{et_lower[-1]:.2f} s), kiln {kiln_total[-1]:.3f} s", file=sys.stderr, flush=True)
    res = {
        "model": spec["name"], "seq_len": spec["seq_len"], "backend": args.backend, "rounds": args.rounds,
        "executorch_total_s": statistics.median(et_total),
        "executorch_to_edge_to_executorch_s": statistics.median(et_lower),
        "kiln_lower_s": statistics.median(kiln_total),
    }
    res["speedup_vs_total"] = res["executorch_total_s"] / res["kiln_lower_s"]
    res["speedup_vs_to_edge_to_executorch"] = res["executorch_to_edge_to_executorch_s"] / res["kiln_lower_s"]
    if args.json:
        print(json.dumps(res, indent=2))
    else:
        print(f"{spec['name']} seq_len {spec['seq_len']} --backend {args.backend}, median of {args.rounds} rounds:")
        print(f"  ExecuTorch load+lower+write   {res['executorch_total_s']:8.2f} s")
        print(f"  ExecuTorch to_edge+to_executorch {res['executorch_to_edge_to_executorch_s']:5.2f} s")
        print(f"  kiln lower (whole command)    {res['kiln_lower_s']:8.3f} s")
        print(f"  speedup: {res['speedup_vs_total']:.1f}x (whole job), "
              f"{res['speedup_vs_to_edge_to_executorch']:.1f}x (vs to_edge+to_executorch alone)")
    os.rmdir(tmp)
    return 0


if __name__ == "__main__":
    sys.exit(main())
