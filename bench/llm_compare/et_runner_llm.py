"""ExecuTorch's own LLM runner (TextLLMRunner, the C++ runner its examples ship, through its
Python bindings) on an LLM .pte: text prompt in, tokens out, timed by the runner's own Stats.
Prints one JSON object with the keys of `kiln bench-llm --json`.

    .venv/bin/python bench/llm_compare/et_runner_llm.py FILE.pte --tokenizer tokenizer.json
        [-p 128] [-n 128] [--threads T] [--reps R]

The prompt is the start of bench/data/public_domain_en.txt cut to P tokens with the `tokenizers`
package (decoded back to text; the runner encodes it again and reports how many tokens it got).
Greedy (temperature 0); the runner stops early at an end-of-sequence token, so the decode rate
is generated tokens over the runner's decode time, whatever their count (both are reported).
Rates as the runner's own report computes them: prompt tokens / (prompt eval end - inference
start), generated tokens / (inference end - prompt eval end), in its millisecond timestamps.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("pte")
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("-p", type=int, default=128)
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--reps", type=int, default=1)
    args = ap.parse_args()
    from executorch.extension.llm.runner import GenerationConfig, TextLLMRunner
    from executorch.extension.pybindings import portable_lib
    from tokenizers import Tokenizer

    # one process-wide threadpool (libexecutorch_threadpool.so, shared by the runner's bindings)
    portable_lib._unsafe_reset_threadpool(args.threads)
    got = int(portable_lib._threadpool_get_thread_count())
    if got != args.threads:
        sys.exit(f"et_runner_llm: ExecuTorch's threadpool has {got} threads, asked for {args.threads}")
    tok = Tokenizer.from_file(args.tokenizer)
    text = (REPO / "bench" / "data" / "public_domain_en.txt").read_text()
    ids = tok.encode(text, add_special_tokens=False).ids
    if len(ids) < args.p:
        sys.exit(f"et_runner_llm: the text has {len(ids)} tokens, fewer than -p {args.p}")
    prompt = tok.decode(ids[:args.p])
    runner = TextLLMRunner(args.pte, args.tokenizer)
    pp, tg, counts = [], [], []
    for rep in range(-1, args.reps):  # -1: warm-up
        stats = []
        runner.reset()
        cfg = GenerationConfig(echo=False, max_new_tokens=args.n, temperature=0.0, seq_len=args.p + args.n + 8,
                               warming=False)
        runner.generate(prompt, cfg, token_callback=lambda s: None, stats_callback=stats.append)
        if not stats:
            sys.exit("et_runner_llm: the runner reported no stats")
        s = stats[-1]
        if rep < 0:
            continue
        prefill_ms = s.prompt_eval_end_ms - s.inference_start_ms
        decode_ms = s.inference_end_ms - s.prompt_eval_end_ms
        pp.append(s.num_prompt_tokens * 1e3 / prefill_ms if prefill_ms > 0 else None)
        tg.append(s.num_generated_tokens * 1e3 / decode_ms if decode_ms > 0 else None)
        counts.append((s.num_prompt_tokens, s.num_generated_tokens))
    pp = [x for x in pp if x]
    tg = [x for x in tg if x]
    print(json.dumps({"model": args.pte, "runner": "executorch TextLLMRunner", "et_threadpool_threads": got,
                      "prompt_and_generated_tokens": counts,
                      "results": [{"threads": args.threads,
                                   "prefill_tokens_per_s": statistics.median(pp) if pp else None,
                                   "decode_tokens_per_s": statistics.median(tg) if tg else None,
                                   "prefill_runs": pp, "decode_runs": tg}]}))


if __name__ == "__main__":
    main()
