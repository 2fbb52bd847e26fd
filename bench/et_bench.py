"""ExecuTorch's runtime timed like `kiln bench`: one process, one file.

python bench/et_bench.py FILE.pte --input-shape 1,128 --input-dtype int64 [--iters N] [--warmup W] [--threads T]
Prints JSON: load_ms, first_run_ms, median_ms, min_ms, peak_rss_mb, baseline_rss_mb (after
imports, before loading the program), et_threadpool_threads (the size of ExecuTorch's
threadpool, which XNNPACK delegates run on, as read back after setting it to --threads;
null if this ExecuTorch cannot report it), times_ms.
"""
from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
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
    # ExecuTorch's XNNPACK delegate runs on ExecuTorch's process-wide pthreadpool
    # (extension/threadpool/threadpool.cpp: get_threadpool(), sized to the number of
    # logical CPUs on first use). XNNCompiler.cpp hands get_pthreadpool() to
    # xnn_create_runtime_v4 when a delegate is initialised, i.e. in load_method, so the
    # pool must be resized before the program is loaded: resizing later would free the
    # pool the delegate's runtime still points to. The pybindings expose the resize as
    # _unsafe_reset_threadpool (extension/pybindings/pybindings.cpp); executorch.runtime
    # uses the same extension module (_C), hence the same pool.
    et_threads = None
    try:
        from executorch.extension.pybindings import portable_lib
        if hasattr(portable_lib, "_unsafe_reset_threadpool"):
            portable_lib._unsafe_reset_threadpool(args.threads)
        if hasattr(portable_lib, "_threadpool_get_thread_count"):
            et_threads = int(portable_lib._threadpool_get_thread_count())
    except Exception as e:  # noqa: BLE001 - reported below
        print(f"et_bench: warning: cannot set ExecuTorch's threadpool: {type(e).__name__}: {e}",
              file=sys.stderr)
    if et_threads is not None and et_threads != args.threads:
        print(f"et_bench: error: ExecuTorch's threadpool has {et_threads} threads, asked for {args.threads}",
              file=sys.stderr)
        sys.exit(2)
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
        "file": args.file, "threads": args.threads, "et_threadpool_threads": et_threads,
        "iters": args.iters, "warmup": args.warmup, "load_ms": load_ms,
        "first_run_ms": first, "median_ms": statistics.median(times), "min_ms": min(times),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
        "baseline_rss_mb": baseline, "times_ms": times,
    }))


if __name__ == "__main__":
    main()
