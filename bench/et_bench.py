"""ExecuTorch's runtime timed like `kiln bench`: one process, one file.

python bench/et_bench.py FILE.pte --input-shape 1,128 --input-dtype int64 [--iters N] [--warmup W] [--threads T]
Prints JSON: load_ms, first_run_ms, median_ms, min_ms, peak_rss_mb, baseline_rss_mb (after
imports, before loading the program).
"""
from __future__ import annotations

import argparse
import json
import resource
import statistics
import time


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return 0.0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("file")
    ap.add_argument("--input-shape", default="1,128")
    ap.add_argument("--input-dtype", default="int64")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    import torch
    from executorch.runtime import Runtime

    torch.set_num_threads(args.threads)
    try:  # XNNPACK's thread pool follows ExecuTorch's threadpool size
        from executorch.extension.pybindings import portable_lib
        if hasattr(portable_lib, "_unsafe_reset_threadpool"):
            portable_lib._unsafe_reset_threadpool(args.threads)
    except Exception:  # noqa: BLE001 - best effort; reported below
        pass
    shape = [int(s) for s in args.input_shape.split(",") if s]
    x = torch.zeros(shape, dtype=getattr(torch, args.input_dtype))
    baseline = rss_mb()
    t0 = time.perf_counter()
    program = Runtime.get().load_program(args.file)
    method = program.load_method("forward")
    load_ms = (time.perf_counter() - t0) * 1e3
    t0 = time.perf_counter()
    method.execute([x])
    first = (time.perf_counter() - t0) * 1e3
    for _ in range(args.warmup - 1):
        method.execute([x])
    times = []
    for _ in range(args.iters):
        t0 = time.perf_counter()
        method.execute([x])
        times.append((time.perf_counter() - t0) * 1e3)
    print(json.dumps({
        "file": args.file, "threads": args.threads, "iters": args.iters, "load_ms": load_ms,
        "first_run_ms": first, "median_ms": statistics.median(times), "min_ms": min(times),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
        "baseline_rss_mb": baseline, "times_ms": times,
    }))


if __name__ == "__main__":
    main()
