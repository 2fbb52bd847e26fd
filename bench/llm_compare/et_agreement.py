"""Does ExecuTorch's runtime decode kiln's LLM file as kiln's runtime does? (issue 38, item 5)

    .venv/bin/python bench/llm_compare/et_agreement.py FILE.pte --tokenizer tokenizer.json \
        --prompt-file PROMPT.txt [-n 32] [--kiln build/kiln]

kiln's side is `kiln generate --json` (greedy, --ignore-eos); ExecuTorch's side loads the same file with its
Python bindings (portable_lib, plus its quantized kernels for the quantized embedding tables), feeds the prompt's
tokens (the `tokenizers` package's ids, as kiln's tokenizer gives them: the count is checked) one call per token
for a program that takes one token per call, or all at once, then N greedy steps. Prints one JSON object: both
token lists, the first step where they differ (null when none), wall times and ExecuTorch's peak RSS.
"""
from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("pte")
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--prompt-file", required=True)
    ap.add_argument("-n", type=int, default=32)
    ap.add_argument("--kiln", default="build/kiln")
    ap.add_argument("--tokens-per-call", type=int, default=1)
    args = ap.parse_args()

    t0 = time.time()
    out = subprocess.run([args.kiln, "generate", args.pte, "--tokenizer", args.tokenizer, "--prompt-file",
                          args.prompt_file, "--max-new-tokens", str(args.n), "--ignore-eos", "--json"],
                         check=True, capture_output=True, text=True).stdout
    kiln = json.loads(out)
    kiln_s = time.time() - t0

    import numpy as np
    import torch
    from tokenizers import Tokenizer
    import executorch.kernels.quantized  # noqa: F401  (registers quantized_decomposed.embedding_4bit/byte)
    from executorch.extension.pybindings.portable_lib import _load_for_executorch

    ids = Tokenizer.from_file(args.tokenizer).encode(open(args.prompt_file).read()).ids
    if len(ids) != kiln["prompt_tokens"]:
        sys.exit(f"prompt: {len(ids)} tokens here, {kiln['prompt_tokens']} in kiln generate")
    t0 = time.time()
    m = _load_for_executorch(args.pte)
    pos = 0
    logits = None
    step = args.tokens_per_call
    for i in range(0, len(ids), step):
        chunk = ids[i:i + step]
        logits = m.forward((torch.tensor([chunk], dtype=torch.long),
                            torch.tensor([pos] if step == 1 else list(range(pos, pos + len(chunk))),
                                         dtype=torch.long)))[0]
        pos += len(chunk)
    et_tokens = []
    for _ in range(args.n):
        nxt = int(np.argmax(logits.float().numpy().reshape(-1, logits.shape[-1])[-1]))
        et_tokens.append(nxt)
        logits = m.forward((torch.tensor([[nxt]], dtype=torch.long), torch.tensor([pos], dtype=torch.long)))[0]
        pos += 1
    et_s = time.time() - t0
    k = kiln["tokens"][:args.n]
    first = next((i for i, (a, b) in enumerate(zip(k, et_tokens)) if a != b), None)
    print(json.dumps({"prompt_tokens": len(ids), "steps": args.n, "kiln_tokens": k, "executorch_tokens": et_tokens,
                      "first_difference": first, "agree": first is None and len(k) == len(et_tokens),
                      "kiln_wall_s": round(kiln_s, 1), "executorch_wall_s": round(et_s, 1),
                      "executorch_peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)}))


if __name__ == "__main__":
    main()
