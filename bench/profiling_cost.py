#!/usr/bin/env python3
"""What profiling costs kiln's runtime: the same .pte timed by `kiln bench` with profiling off in
two builds (BASE: a build before the profiling hooks; NEW: this one), and with it on in NEW
(`kiln profile`'s per-step timers: `kiln bench --profile`). Alternating rounds, each a fresh
process; a cell is the median over rounds of the process's median latency.

    .venv/bin/python bench/profiling_cost.py --base OLD/kiln --new build/kiln FILE.pte [--rounds 7]
        [--threads 1] [--iters 10]

Prints a markdown table (ratio NEW/BASE: 1.00 means profiling off costs nothing measurable at
this resolution; the spread of BASE's own rounds is printed beside it).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess


def bench(binary: str, pte: str, threads: int, iters: int, profile: bool) -> float:
    cmd = [binary, "bench", pte, "--threads", str(threads), "--iters", str(iters), "--warmup", "2", "--json"]
    if profile:
        cmd.append("--profile")
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"profiling_cost: {' '.join(cmd)} failed: {proc.stderr.strip()[-300:]}")
    return float(json.loads(proc.stdout)["median_ms"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("pte")
    ap.add_argument("--base", required=True, help="a kiln binary built before the profiling hooks")
    ap.add_argument("--new", required=True, help="the kiln binary under test")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--iters", type=int, default=10)
    args = ap.parse_args()
    cells = [("base, off", args.base, False), ("new, off", args.new, False), ("new, on (--profile)", args.new, True)]
    runs: dict[str, list[float]] = {c[0]: [] for c in cells}
    load0 = os.getloadavg()
    for r in range(args.rounds):
        for name, binary, prof in (cells if r % 2 == 0 else list(reversed(cells))):
            runs[name].append(bench(binary, args.pte, args.threads, args.iters, prof))
    load1 = os.getloadavg()
    base = statistics.median(runs["base, off"])
    print(f"{args.pte}, {args.threads} thread(s), {args.rounds} rounds of {args.iters} runs; load average "
          f"{load0[0]:.2f} at the start, {load1[0]:.2f} at the end\n")
    print("| build, profiling | median ms | min..max over rounds | / base |")
    print("|---|---:|---:|---:|")
    for name, _, _ in cells:
        v = runs[name]
        print(f"| {name} | {statistics.median(v):.2f} | {min(v):.2f}..{max(v):.2f} | {statistics.median(v) / base:.3f} |")


if __name__ == "__main__":
    main()
