"""llama.cpp (the llama-cpp-python bindings, bench/llm_compare/requirements.txt) on a GGUF file, timed
like `kiln bench-llm` and llama-bench: prefill of P fixed pseudo-random tokens in one batch
(llama.cpp's batched prefill, n_batch = P), then N decode steps of one token each; per
repetition tokens/s after one warm-up pass; the KV cache is cleared between passes.

    .venv/bin/python bench/llm_compare/llamacpp_llm.py FILE.gguf [-p 128] [-n 128] [--threads T] [--reps R]

Prints one JSON object with the keys of `kiln bench-llm --json`.
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import time


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("gguf")
    ap.add_argument("-p", type=int, default=128)
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    import llama_cpp

    t0 = time.perf_counter()
    llm = llama_cpp.Llama(model_path=args.gguf, n_ctx=args.p + args.n, n_batch=max(args.p, 1),
                          n_ubatch=max(args.p, 1), n_threads=args.threads, n_threads_batch=args.threads,
                          logits_all=False, verbose=False)
    load_ms = (time.perf_counter() - t0) * 1e3
    vocab = llm.n_vocab()
    rng = random.Random(args.seed)
    ids = [rng.randrange(vocab) for _ in range(args.p + args.n)]
    pp, tg = [], []
    for rep in range(-1, args.reps):  # -1: warm-up
        llm.reset()  # n_tokens = 0: eval() drops the cache from there on
        t0 = time.perf_counter()
        if args.p:
            llm.eval(ids[:args.p])
        t1 = time.perf_counter()
        for t in ids[args.p:]:
            llm.eval([t])
        t2 = time.perf_counter()
        if rep >= 0:
            if args.p:
                pp.append(args.p / (t1 - t0))
            if args.n:
                tg.append(args.n / (t2 - t1))
    print(json.dumps({"model": args.gguf, "max_seq_len": args.p + args.n, "vocab": vocab, "tokens_per_call": args.p,
                      "load_ms": load_ms, "llama_cpp_version": llama_cpp.__version__,
                      "system_info": llama_cpp.llama_print_system_info().decode(errors="replace").strip(),
                      "results": [{"threads": args.threads,
                                   "prefill_tokens_per_s": statistics.median(pp) if pp else None,
                                   "decode_tokens_per_s": statistics.median(tg) if tg else None,
                                   "prefill_runs": pp, "decode_runs": tg}]}))


if __name__ == "__main__":
    main()
