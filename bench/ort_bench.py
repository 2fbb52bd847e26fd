"""ONNX Runtime timed like `kiln bench`: one process, one file, checked against eager first.

python bench/ort_bench.py FILE.onnx --input-shape 1,128 --input-dtype int64 [--iters N] [--warmup W]
    [--threads T] [--check-input X.npy --check-ref Y.npy [--rtol R]]

The session: CPUExecutionProvider, intra_op_num_threads = T, inter_op_num_threads = 1,
graph optimizations ORT_ENABLE_ALL, ORT_SEQUENTIAL execution; everything else ONNX Runtime's
defaults (its intra-op threads spin a while before they sleep, as users get them).

With --check-input/--check-ref, the first run is on the reference input and its output is
compared with the eager reference (the .npy files python -m kiln_export wrote): the max abs
difference is printed; above rtol * max |ref| (default 1e-4, DESIGN's fp32 tolerance) the
process fails with exit status 3 before timing anything. The timed runs use zeros like the
other runtimes in bench/compare.

Prints JSON: load_ms, first_run_ms, median_ms, min_ms, peak_rss_mb, baseline_rss_mb (after
imports, before the session), ort_version, intra_op_num_threads / inter_op_num_threads as
read back from the session, max_abs_diff, max_abs_ref, tolerance, times_ms.
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


def fail(msg: str, code: int = 2) -> None:
    print(f"ort_bench: error: {msg}", file=sys.stderr)
    sys.exit(code)


def session_options(threads: int):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    return so


def check(out, ref, rtol: float) -> dict:
    """Max abs difference of `out` from `ref`, and whether it is within rtol * max |ref|."""
    import numpy as np

    if out.shape != ref.shape:
        return {"ok": False, "error": f"output shape {list(out.shape)} != reference {list(ref.shape)}"}
    diff = float(np.max(np.abs(out.astype(np.float64) - ref.astype(np.float64)))) if out.size else 0.0
    scale = float(np.max(np.abs(ref))) if ref.size else 0.0
    tol = rtol * scale
    ok = bool(np.isfinite(diff)) and diff <= tol
    return {"ok": ok, "max_abs_diff": diff, "max_abs_ref": scale, "tolerance": tol,
            **({} if ok else {"error": f"logits differ from the eager reference: max abs diff {diff:.3g} "
                                       f"> {tol:.3g} ({rtol:g} x max |ref| {scale:.3g})"})}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("file")
    ap.add_argument("--input-shape", default="1,128")
    ap.add_argument("--input-dtype", default="int64")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--check-input", help="reference input .npy (run first, compared with --check-ref)")
    ap.add_argument("--check-ref", help="eager reference output .npy")
    ap.add_argument("--rtol", type=float, default=1e-4,
                    help="tolerance as a fraction of max |ref| (default 1e-4)")
    args = ap.parse_args()
    if args.threads < 1 or args.iters < 1 or args.warmup < 0:
        fail("--threads and --iters must be >= 1, --warmup >= 0")
    if bool(args.check_input) != bool(args.check_ref):
        fail("--check-input and --check-ref go together")
    import numpy as np
    import onnxruntime as ort

    try:
        shape = [int(s) for s in args.input_shape.split(",") if s]
        x = np.zeros(shape, dtype=np.dtype(args.input_dtype))
    except (ValueError, TypeError) as e:
        fail(f"bad --input-shape/--input-dtype: {e}")
    ref_in = ref_out = None
    if args.check_input:
        try:
            ref_in, ref_out = np.load(args.check_input), np.load(args.check_ref)
        except (OSError, ValueError) as e:
            fail(f"cannot read the reference: {e}")
        if list(ref_in.shape) != shape or ref_in.dtype != x.dtype:
            fail(f"reference input is {ref_in.dtype}{list(ref_in.shape)}, timing input {x.dtype}{shape}")
    baseline = rss_mb()
    t0 = time.perf_counter()
    try:
        sess = ort.InferenceSession(args.file, sess_options=session_options(args.threads),
                                    providers=["CPUExecutionProvider"])
    except Exception as e:  # noqa: BLE001 - onnxruntime raises its own exception types
        fail(f"cannot load {args.file}: {type(e).__name__}: {str(e).strip().splitlines()[0]}")
    load_ms = (time.perf_counter() - t0) * 1e3
    so = sess.get_session_options()
    inputs = sess.get_inputs()
    if len(inputs) != 1:
        fail(f"{args.file} has {len(inputs)} inputs, expected 1")
    name = inputs[0].name

    result = {}
    t0 = time.perf_counter()
    out = sess.run(None, {name: ref_in if ref_in is not None else x})[0]
    first = (time.perf_counter() - t0) * 1e3
    if ref_out is not None:
        result = check(out, ref_out, args.rtol)
        print(f"ort_bench: ONNX Runtime vs eager: max abs diff {result.get('max_abs_diff', float('nan')):.3g} "
              f"(tolerance {result.get('tolerance', float('nan')):.3g})", file=sys.stderr)
        if not result.pop("ok"):
            fail(result["error"], 3)
    for _ in range(args.warmup - 1):  # the first run (on the reference input if checked) is one
        sess.run(None, {name: x})
    times = []
    for _ in range(args.iters):
        t0 = time.perf_counter()
        sess.run(None, {name: x})
        times.append((time.perf_counter() - t0) * 1e3)
    print(json.dumps({
        "file": args.file, "threads": args.threads, "ort_version": ort.__version__,
        "intra_op_num_threads": so.intra_op_num_threads, "inter_op_num_threads": so.inter_op_num_threads,
        "iters": args.iters, "warmup": args.warmup, "load_ms": load_ms,
        "first_run_ms": first, "median_ms": statistics.median(times), "min_ms": min(times),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
        "baseline_rss_mb": baseline, **result, "times_ms": times,
    }))


if __name__ == "__main__":
    main()
