"""kiln's runtime vs ExecuTorch's runtime, same files, one run.

Each round runs every (runtime, file) pair once, alternating, in fresh
processes: `kiln bench --json` for kiln, bench/et_bench.py for ExecuTorch's
Python runtime (executorch.runtime). Reports the median over rounds of load
time, first run, median latency and peak RSS, and kiln/ExecuTorch ratios.

  python bench/runtime_compare.py --spec artifacts/gpt2/model_spec.json \
      --files artifacts/gpt2/gpt2_portable.pte artifacts/gpt2/gpt2_portable_et.pte \
      [--rounds 3] [--iters 10] [--et-iters 10] [--threads 1]
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def last_json(text: str) -> dict:
    for line in reversed(text.strip().splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    return json.loads(text)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--spec", required=True, help="model_spec.json (input shape and dtype)")
    ap.add_argument("--files", nargs="+", required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--et-iters", type=int, default=10)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--kiln", default=str(REPO / "build" / "kiln"))
    args = ap.parse_args()
    spec = json.loads(Path(args.spec).read_text())
    inp = spec["inputs"][0]
    shape = ",".join(str(s) for s in inp["shape"])
    results: dict = {}
    for r in range(args.rounds):
        for f in args.files:
            for runtime in ("kiln", "executorch"):
                if runtime == "kiln":
                    cmd = [args.kiln, "bench", f, "--json", "--iters", str(args.iters), "--threads", str(args.threads)]
                    proc = subprocess.run(cmd, capture_output=True, text=True)
                    # kiln bench --json prints an indented object
                    res = json.loads(proc.stdout) if proc.returncode == 0 else None
                else:
                    cmd = [sys.executable, str(REPO / "bench" / "et_bench.py"), f, "--input-shape", shape,
                           "--input-dtype", inp["dtype"], "--iters", str(args.et_iters), "--threads", str(args.threads)]
                    proc = subprocess.run(cmd, capture_output=True, text=True)
                    res = last_json(proc.stdout) if proc.returncode == 0 else None
                if res is None:
                    print(f"{runtime} on {f} failed: {proc.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
                    continue
                results.setdefault((runtime, f), []).append(res)
                print(f"round {r + 1}: {runtime:10s} {Path(f).name}: load {res['load_ms']:.1f} ms, "
                      f"median {res['median_ms']:.1f} ms, peak RSS {res['peak_rss_mb']:.0f} MB",
                      file=sys.stderr, flush=True)
    med = lambda rs, k: statistics.median(x[k] for x in rs)  # noqa: E731
    print(f"{spec['name']} seq_len {spec['seq_len']}, {args.threads} thread(s), median of {args.rounds} rounds\n")
    print("| file | runtime | load ms | first run ms | median ms | peak RSS MB |")
    print("|---|---|---:|---:|---:|---:|")
    for f in args.files:
        for runtime in ("kiln", "executorch"):
            rs = results.get((runtime, f))
            if not rs:
                print(f"| {Path(f).name} | {runtime} | failed | | | |")
                continue
            extra = f" (after imports: {med(rs, 'baseline_rss_mb'):.0f})" if runtime == "executorch" else ""
            print(f"| {Path(f).name} | {runtime} | {med(rs, 'load_ms'):.1f} | {med(rs, 'first_run_ms'):.1f} | "
                  f"{med(rs, 'median_ms'):.1f} | {med(rs, 'peak_rss_mb'):.0f}{extra} |")
    print()
    for f in args.files:
        k, e = results.get(("kiln", f)), results.get(("executorch", f))
        if k and e:
            print(f"{Path(f).name}: kiln/ExecuTorch load {med(k, 'load_ms') / med(e, 'load_ms'):.2f}x, "
                  f"latency {med(k, 'median_ms') / med(e, 'median_ms'):.3f}x, "
                  f"peak RSS {med(k, 'peak_rss_mb') / med(e, 'peak_rss_mb'):.2f}x "
                  f"({med(k, 'peak_rss_mb') / max(med(e, 'peak_rss_mb') - med(e, 'baseline_rss_mb'), 1e-9):.2f}x of "
                  f"ExecuTorch's growth over its import baseline)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
