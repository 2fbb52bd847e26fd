#!/usr/bin/env python3
"""Quantize-and-lower time and peak memory, kiln vs ExecuTorch, SmolLM2-135M-Instruct 8da4w (issue 14).

    .venv/bin/python bench/llm_compare/lowering_time.py [--max-seq 256] [--rounds 3] [--et-rounds 1]
        [--work artifacts/llm_compare] [--out-md FILE]

What each side starts from and does (one fresh process per run, rounds alternate the sides):
  export         python -m kiln_export llm --arch smollm2: transformers loads the GGUF, torch.export
                 of the fp32 wrapper (a static cache) -> the .pt2 kiln lowers. Done once per model and
                 cache length; every kiln scheme below starts from it.
  kiln 8da4w     kiln lower --backend xnnpack --quantize 8da4w (C++: reads the .pt2, quantizes, partitions,
                 writes and verifies the .pte)
  kiln 8da4w+e4  the same with --quantize-embedding 4
  ExecuTorch     bench/llm_compare/et_lower.py SPEC OUT 8da4w:32: transformers loads the GGUF, torchao's
                 quantize_ (Int8DynamicActivationIntxWeightConfig(int4, PerGroup(32))) on the same wrapper,
                 strict torch.export, to_edge_transform_and_lower(XnnpackPartitioner), to_executorch, write
Wall seconds (median over runs) and the process's peak RSS (wait4's ru_maxrss). The .pte files are left
where bench/llm_compare/llm_compare.py looks for them (export_N/kiln_8da4w.pte, export_N/et_8da4w.pte).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
PY = sys.executable


def log(msg: str) -> None:
    print(f"lowering_time: {msg}", file=sys.stderr, flush=True)


def timed(cmd, env=None) -> tuple[float, float, str]:
    """(wall seconds, peak RSS MB, stderr) of one process; exits with its last line if it fails."""
    t0 = time.perf_counter()
    proc = subprocess.Popen([str(c) for c in cmd], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env=env)
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        sys.exit(f"lowering_time: {' '.join(map(str, cmd[:3]))} ... failed ({proc.returncode}): "
                 f"{(err.strip().splitlines() or ['no output'])[-1][:300]}")
    return wall, usage.ru_maxrss / 1024, err


def cpu_isa() -> str:
    flags = ""
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("flags"):
                flags = line
                break
    model = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "?")
    isa = "AVX-512 (VNNI)" if "avx512_vnni" in flags else "AVX-512" if "avx512f" in flags else \
        "AVX2+FMA" if "avx2" in flags else "baseline x86-64"
    return f"{os.cpu_count()} logical CPUs ({model}), ISA {isa}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--max-seq", type=int, default=256, help="the static cache length (llm_compare: -p + -n)")
    ap.add_argument("--rounds", type=int, default=3, help="runs of each kiln lowering")
    ap.add_argument("--et-rounds", type=int, default=1, help="runs of ExecuTorch's (minutes each)")
    ap.add_argument("--kiln", default=str(REPO / "build" / "kiln"))
    ap.add_argument("--work", default=str(REPO / "artifacts" / "llm_compare"))
    ap.add_argument("--out-md", default=None)
    args = ap.parse_args()
    export = Path(args.work) / f"export_{args.max_seq}"
    spec = export / "model_spec.json"
    env = dict(os.environ, PYTHONPATH=str(REPO / "python"))
    runs: dict[str, list[tuple[float, float]]] = {}
    et_stages = []
    if not spec.exists():
        log(f"exporting SmolLM2 (max_seq_len {args.max_seq}) to {export}")
        runs["export"] = [timed([PY, "-m", "kiln_export", "llm", "--arch", "smollm2", "--max-seq-len",
                                 args.max_seq, "--out", export], env)[:2]]
    kiln_sides = {
        "kiln 8da4w": ["--quantize", "8da4w", "--out", export / "kiln_8da4w.pte"],
        "kiln 8da4w+e4": ["--quantize", "8da4w", "--quantize-embedding", "4", "--out", export / "kiln_8da4w_e4.pte"],
    }
    start = datetime.datetime.now(datetime.timezone.utc)
    load0 = os.getloadavg()
    for r in range(max(args.rounds, args.et_rounds)):
        order = list(kiln_sides) + ["ExecuTorch"]
        if r % 2:
            order.reverse()
        for side in order:
            if side == "ExecuTorch":
                if r >= args.et_rounds:
                    continue
                log(f"round {r + 1}: ExecuTorch quantize + export + lower (minutes)")
                out = export / "et_8da4w.pte"
                wall, rss, err = timed([PY, HERE / "et_lower.py", spec, out, "8da4w:32"], env)
                line = next((ln for ln in err.splitlines() if ln.startswith("et_lower stages ")), None)
                if line:
                    et_stages.append(json.loads(line[len("et_lower stages "):]))
            else:
                if r >= args.rounds:
                    continue
                log(f"round {r + 1}: {side}")
                wall, rss, _ = timed([args.kiln, "lower", "--spec", spec, "--backend", "xnnpack",
                                      *kiln_sides[side], "-q"])
            runs.setdefault(side, []).append((wall, rss))
            log(f"  {wall:.2f} s, peak RSS {rss:.0f} MB")
    load1 = os.getloadavg()

    commit = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    files = {"kiln 8da4w": export / "kiln_8da4w.pte", "kiln 8da4w+e4": export / "kiln_8da4w_e4.pte",
             "ExecuTorch": export / "et_8da4w.pte"}
    md = ["    .venv/bin/python bench/llm_compare/lowering_time.py " + " ".join(sys.argv[1:]), "",
          f"**Date**: {start:%Y-%m-%d %H:%M} UTC. **Machine**: {cpu_isa()}; load average "
          f"{' '.join(f'{x:.2f}' for x in load0)} at the start, {' '.join(f'{x:.2f}' for x in load1)} at the end. "
          f"kiln `{commit}`. SmolLM2-135M-Instruct, a static cache of {args.max_seq}.", "",
          "| step | runs | wall s (median) | peak RSS MB | output |", "|---|---:|---:|---:|---|"]
    for side, rs in runs.items():
        f = files.get(side)
        out = f"`{f.name}` {f.stat().st_size / 1e6:.1f} MB" if f and f.exists() else "the .pt2 and spec"
        md.append(f"| {side} | {len(rs)} | {statistics.median(w for w, _ in rs):.2f} | "
                  f"{max(m for _, m in rs):.0f} | {out} |")
    if et_stages:
        md += ["", "ExecuTorch's stages (seconds, first run): " +
               ", ".join(f"{k} {v:.1f}" for k, v in et_stages[0].items())]
    text = "\n".join(md) + "\n"
    print(text)
    if args.out_md:
        Path(args.out_md).write_text(text)


if __name__ == "__main__":
    main()
