#!/usr/bin/env python3
"""Exploratory: which of SmolLM2's linear layers carry the int4 error (issue 39, item 2d).

    .venv/bin/python bench/quality/layer_error.py [--work artifacts/quality]

Weight-only fake quantization in PyTorch eager (fp32 activations, no int8 activation rounding: an approximation of
kiln's 8da4w, which also rounds activations per token to int8), on the evaluation text and windows of
bench/quality/quality.py, against its cached fp32 eager reference (artifacts/quality/reference_512.npz: run quality.py
--only fp32 first). int4: symmetric groups of 32 on [-8, 7], each group's bf16 scale the one of a clipping-ratio
search (20 ratios of max|w| / 7.5 from 0.5 to 1.0, least squared error; close to kiln's default mse rule, not the same
code); int8: symmetric per output channel, max|w| / 127.5 (bf16 scale not applied: fp32). The tied LM head is
quantized as its own copy (the lookup stays fp32, as in kiln's 8da4w). Each configuration: perplexity, mean KL to
fp32, top-1 agreement. Not a test and not kiln's quantizer: a map of where the error is.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "python"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import quality  # noqa: E402

TYPES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head"]


def bf16(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.bfloat16).float()


def int4_groups(w: torch.Tensor, group: int = 32) -> torch.Tensor:
    g = w.reshape(-1, group).double()
    amax = g.abs().amax(1, keepdim=True).clamp_min(1e-12)
    best, best_err = None, None
    for r in torch.linspace(0.5, 1.0, 20, dtype=torch.float64):
        s = bf16((amax * r / 7.5).float()).double().clamp_min(1e-12)
        q = (g / s).round().clamp(-8, 7) * s
        err = ((q - g) ** 2).sum(1, keepdim=True)
        if best is None:
            best, best_err = q, err
        else:
            take = err < best_err
            best = torch.where(take, q, best)
            best_err = torch.where(take, err, best_err)
    return best.float().reshape(w.shape)


def int8_channels(w: torch.Tensor) -> torch.Tensor:
    s = w.abs().amax(1, keepdim=True).clamp_min(1e-12) / 127.5
    return (w / s).round().clamp(-128, 127) * s


def load_model_and_reference(work: str, window: int):
    """SmolLM2 in fp32 eager with its LM head untied (its own Linear holding a copy of the table, so quantizing it
    leaves the lookup fp32), the evaluation windows, quality.py's cached fp32 reference for them (checked to be for
    these tokens), the targets and their count."""
    torch.set_num_threads(2)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from kiln_export import llm

    folder, fname = os.path.split(llm.smollm2_gguf())
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=fname)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=fname, dtype=torch.float32,
                                                 attn_implementation=llm.ATTN_IMPLEMENTATION).eval()
    ids = tok(quality.TEXT.read_text(), add_special_tokens=False)["input_ids"]
    wins = quality.windows(ids, window)
    cached = Path(work) / f"reference_{window}.npz"
    key = np.frombuffer(hashlib.sha256(repr((ids, window)).encode()).digest(), dtype=np.uint8)
    with np.load(cached) as z:
        assert np.array_equal(z["key"], key), "the reference is for other tokens: run quality.py --only fp32"
        ref = [z[f"w{i}"] for i in range(len(wins))]
    targets = [np.array(w[1:]) for w in wins]
    n = sum(len(t) for t in targets)
    head = torch.nn.Linear(model.config.hidden_size, model.config.vocab_size, bias=False)
    head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone())
    model.lm_head = head
    return model, wins, ref, targets, n


def score(model, wins, ref, targets, n) -> tuple[float, float, float]:
    """Perplexity, mean KL(fp32 || model) and top-1 agreement with fp32 over the windows."""
    nll, kl, agree = 0.0, 0.0, 0
    with torch.no_grad():
        for w, r, t in zip(wins, ref, targets, strict=True):
            lp = quality.log_softmax(model(torch.tensor([w])).logits[0, :-1].numpy())
            nll -= float(lp[np.arange(len(t)), t].sum())
            kl += float((np.exp(r.astype(np.float64)) * (r - lp)).sum())
            agree += int((lp.argmax(-1) == r.argmax(-1)).sum())
    return math.exp(nll / n), kl / n, agree / n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work", default=str(REPO / "artifacts" / "quality"))
    ap.add_argument("--window", type=int, default=512)
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    args = ap.parse_args()
    model, wins, ref, targets, n = load_model_and_reference(args.work, args.window)
    linears = {name: m for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    fp32 = {name: m.weight.detach().clone() for name, m in linears.items()}
    q4 = {name: int4_groups(w) for name, w in fp32.items()}
    q8 = {name: int8_channels(w) for name, w in fp32.items()}

    def kind(name: str) -> str:
        return name.rsplit(".", 1)[-1]

    def evaluate(label: str, scheme) -> dict:
        t0 = time.time()
        for name, m in linears.items():
            m.weight.data = {"fp32": fp32, "int4": q4, "int8": q8}[scheme(name)][name]
        ppl, kl, top1 = score(model, wins, ref, targets, n)
        res = {"config": label, "perplexity": ppl, "kl": kl, "top1": top1, "seconds": time.time() - t0}
        print(f"layer_error: {label}: perplexity {res['perplexity']:.3f}, KL {res['kl']:.4f}, top-1 "
              f"{100 * res['top1']:.1f}% ({res['seconds']:.0f} s)", file=sys.stderr, flush=True)
        return res

    results = [evaluate("fp32 (the control: the reference's own numbers)", lambda nm: "fp32"),
               evaluate("every linear int4 (8da4w-like, weight-only)", lambda nm: "int4")]
    for t in TYPES:
        results.append(evaluate(f"only {t} int4, the rest fp32", lambda nm, t=t: "int4" if kind(nm) == t else "fp32"))
    results.append(evaluate("every linear int4 but the LM head int8", lambda nm: "int8" if nm == "lm_head" else "int4"))
    results.append(evaluate("every linear int4 but the LM head and down_proj int8",
                            lambda nm: "int8" if kind(nm) in ("lm_head", "down_proj") else "int4"))
    results.append(evaluate("every linear int4 but the LM head, down_proj and v_proj int8",
                            lambda nm: "int8" if kind(nm) in ("lm_head", "down_proj", "v_proj") else "int4"))
    results.append(evaluate("every linear int8", lambda nm: "int8"))
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
    print("| configuration (weight-only fake quantization) | perplexity | vs fp32 | mean KL | top-1 |")
    print("|---|---:|---:|---:|---:|")
    for r in results:
        print(f"| {r['config']} | {r['perplexity']:.3f} | {r['perplexity'] / results[0]['perplexity']:.3f}x | {r['kl']:.4f} | "
              f"{100 * r['top1']:.1f}% |")


if __name__ == "__main__":
    main()
