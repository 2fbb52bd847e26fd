"""ExecuTorch's runtime on an LLM .pte (forward(tokens[1, 1], input_pos[1]) -> logits), timed like
`kiln bench-llm`: prefill of P fixed pseudo-random tokens from position 0 (one execute per token
when the program takes one; one execute of all P when its `enable_dynamic_shape` method says it
takes up to get_max_seq_len), then N decode steps (one execute each); per repetition tokens/s,
after one warm-up pass. Prints one JSON object with the keys of `kiln bench-llm --json`.

    .venv/bin/python bench/llm_compare/et_llm.py FILE.pte [-p 128] [-n 128] [--threads T] [--reps R]

The per-call Python overhead (building no tensors: they are made before timing) is tens of
microseconds against milliseconds per forward call.
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("pte")
    ap.add_argument("-p", type=int, default=128)
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    import torch
    from executorch.extension.pybindings import portable_lib
    from executorch.runtime import Runtime

    torch.set_num_threads(args.threads)
    # XNNPACK delegates run on ExecuTorch's process-wide threadpool: sized before the program loads
    # (see bench/et_bench.py), and read back.
    portable_lib._unsafe_reset_threadpool(args.threads)
    got = int(portable_lib._threadpool_get_thread_count())
    if got != args.threads:
        sys.exit(f"et_llm: ExecuTorch's threadpool has {got} threads, asked for {args.threads}")
    t0 = time.perf_counter()
    program = Runtime.get().load_program(args.pte)
    method = program.load_method("forward")
    load_ms = (time.perf_counter() - t0) * 1e3
    max_seq = int(program.load_method("get_max_seq_len").execute([])[0])
    if args.p + args.n > max_seq:
        sys.exit(f"et_llm: -p {args.p} + -n {args.n} do not fit the cache ({max_seq} positions)")
    vocab = int(program.load_method("get_vocab_size").execute([])[0])
    rng = random.Random(args.seed)
    ids = [rng.randrange(vocab) for _ in range(args.p + args.n)]
    inputs = [[torch.tensor([[t]], dtype=torch.long), torch.tensor([i], dtype=torch.long)] for i, t in enumerate(ids)]
    dynamic = "enable_dynamic_shape" in program.method_names and bool(
        program.load_method("enable_dynamic_shape").execute([])[0])
    prefill = [inputs[i] for i in range(args.p)]
    if dynamic and args.p:
        prefill = [[torch.tensor([ids[:args.p]], dtype=torch.long), torch.arange(args.p, dtype=torch.long)]]
    pp, tg = [], []
    for rep in range(-1, args.reps):  # -1: warm-up
        t0 = time.perf_counter()
        for x in prefill:
            method.execute(x)
        t1 = time.perf_counter()
        for x in inputs[args.p:]:
            method.execute(x)
        t2 = time.perf_counter()
        if rep >= 0:
            if args.p:
                pp.append(args.p / (t1 - t0))
            if args.n:
                tg.append(args.n / (t2 - t1))
    print(json.dumps({"model": args.pte, "max_seq_len": max_seq, "vocab": vocab, "tokens_per_call": max_seq if dynamic else 1,
                      "load_ms": load_ms, "et_threadpool_threads": got,
                      "results": [{"threads": args.threads,
                                   "prefill_tokens_per_s": statistics.median(pp) if pp else None,
                                   "decode_tokens_per_s": statistics.median(tg) if tg else None,
                                   "prefill_runs": pp, "decode_runs": tg}]}))


if __name__ == "__main__":
    main()
