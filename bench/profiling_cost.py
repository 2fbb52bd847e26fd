#!/usr/bin/env python3
"""What profiling costs kiln's runtime: the same .pte timed by `kiln bench` with profiling off in
two builds (BASE: a build before the profiling hooks; NEW: this one), and with it on in NEW
(`kiln profile`'s per-step timers: `kiln bench --profile`). Alternating rounds, each a fresh
process; a cell is the median over rounds of the process's median latency.

    .venv/bin/python bench/profiling_cost.py --base OLD/kiln --new build/kiln FILE.pte [--rounds 7]
        [--threads 1] [--iters 10]

Prints a markdown table (ratio NEW/BASE: 1.00 means profiling off costs nothing measurable at
this resolution; the spread of BASE's own rounds is printed beside it).

With --debug-outputs, two more cells: the run `kiln profile --etdump --debug-outputs` logs (every
instruction's outputs copied into the debug buffer, and inside kiln's XNNPACK delegates every
step's output) against the same run without the flag, both timed by `kiln profile` itself (its
first profiled run, after --warmup 2), in NEW; and what that run logged (tensors, MB).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile


def bench(binary: str, pte: str, threads: int, iters: int, profile: bool) -> float:
    cmd = [binary, "bench", pte, "--threads", str(threads), "--iters", str(iters), "--warmup", "2", "--json"]
    if profile:
        cmd.append("--profile")
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"profiling_cost: {' '.join(cmd)} failed: {proc.stderr.strip()[-300:]}")
    return float(json.loads(proc.stdout)["median_ms"])


LOGGED: dict[str, object] = {}


def profile_run(binary: str, pte: str, threads: int, debug_outputs: bool, tmp: str) -> float:
    """The first profiled run's wall time (ms): the one --debug-outputs logs."""
    cmd = [binary, "profile", pte, "--threads", str(threads), "--iters", "1", "--warmup", "2", "--json",
           "--etdump", os.path.join(tmp, "cost.etdp")]
    if debug_outputs:
        cmd.append("--debug-outputs")
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"profiling_cost: {' '.join(cmd)} failed: {proc.stderr.strip()[-300:]}")
    out = json.loads(proc.stdout)
    if debug_outputs:
        LOGGED.update(out["debug_outputs"])
    return float(out["times_ms"][0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("pte")
    ap.add_argument("--base", required=True, help="a kiln binary built before the profiling hooks")
    ap.add_argument("--new", required=True, help="the kiln binary under test")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--debug-outputs", action="store_true",
                    help="also time kiln profile's logged run with and without --debug-outputs (NEW)")
    args = ap.parse_args()
    cells = [("base, off", args.base, False), ("new, off", args.new, False), ("new, on (--profile)", args.new, True)]
    if args.debug_outputs:
        cells += [("new, kiln profile run", args.new, "profile"), ("new, kiln profile run, --debug-outputs", args.new, "debug")]
    runs: dict[str, list[float]] = {c[0]: [] for c in cells}
    load0 = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for name, binary, prof in (cells if r % 2 == 0 else list(reversed(cells))):
                if prof in ("profile", "debug"):
                    runs[name].append(profile_run(binary, args.pte, args.threads, prof == "debug", tmp))
                else:
                    runs[name].append(bench(binary, args.pte, args.threads, args.iters, prof))
    load1 = os.getloadavg()
    base = statistics.median(runs["base, off"])
    print(f"{args.pte}, {args.threads} thread(s), {args.rounds} rounds of {args.iters} runs; load average "
          f"{load0[0]:.2f} at the start, {load1[0]:.2f} at the end\n")
    print("| build, profiling | median ms | min..max over rounds | / base |")
    print("|---|---:|---:|---:|")
    for name, _, _ in cells:
        v = runs[name]
        print(f"| {name} | {statistics.median(v):.4f} | {min(v):.4f}..{max(v):.4f} | {statistics.median(v) / base:.3f} |")
    if LOGGED:
        print(f"\n--debug-outputs logged {LOGGED['tensors']} tensors, {int(LOGGED['bytes']) / 1e6:.2f} MB"
              f"{' (the buffer overflowed)' if LOGGED.get('overflowed') else ''}")


if __name__ == "__main__":
    main()
