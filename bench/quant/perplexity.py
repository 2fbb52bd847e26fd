#!/usr/bin/env python3
"""SmolLM2-135M-Instruct perplexity on bench/data/public_domain_en.txt, fp32 and quantized (outside CI).

    python bench/quant/perplexity.py --work DIR [--max-tokens N] [--window 512] [--md bench/quant/PERPLEXITY.md]

Rows (the same tokens, the same windows, teacher forcing one token per call on the T=1 KV-cache program
that `python -m kiln_export llm` writes, except eager which runs each window at once):
  fp32 eager            transformers on the GGUF's weights
  kiln fp32             kiln lower --backend xnnpack, kiln's runtime (`kiln run --steps`)
  kiln 8da4w            kiln lower --quantize 8da4w (linear layers, the tied LM head included)
  kiln 8da4w + emb4     ... --quantize-embedding 4
  kiln 8da8w            kiln lower --quantize 8da8w
  torchao 8da4w (ET)    bench/quant/et_8da4w.py's .pte, ExecuTorch's runtime
  torchao 8da4w (ET), kiln's runtime   the same file in kiln's runtime (`kiln run --steps`)
  torchao 8da8w (ET), and in kiln's runtime   the same for 8da8w (et-8da8w, et-8da8w-kiln; not by default)
  torchao 8da4w .pt2, kiln's lowering   kiln_export llm --torchao 8da4w (quantize_ before torch.export), then
                        kiln lower, kiln's runtime (ao-8da4w-kiln, ao-8da8w-kiln; not by default)
The text is cut into windows of --window tokens (each starts at position 0 with the cache reset);
perplexity = exp(mean negative log-likelihood of every token after the first of each window).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
TEXT = REPO / "bench" / "data" / "public_domain_en.txt"
sys.path.insert(0, str(REPO / "python"))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def log_softmax_at(logits: np.ndarray, target: int) -> float:
    x = logits.astype(np.float64)
    m = x.max()
    return float(x[target] - m - math.log(np.exp(x - m).sum()))


def windows(ids: list[int], window: int) -> list[list[int]]:
    return [ids[i:i + window] for i in range(0, len(ids), window) if len(ids[i:i + window]) >= 2]


def nll_eager(model, wins) -> tuple[float, int]:
    import torch

    total, n = 0.0, 0
    with torch.no_grad():
        for w in wins:
            logits = model(input_ids=torch.tensor([w]), use_cache=False).logits[0].numpy()
            for i in range(len(w) - 1):
                total -= log_softmax_at(logits[i], w[i + 1])
                n += 1
    return total, n


def nll_kiln(kiln: Path, pte: Path, wins, tmp: Path) -> tuple[float, int]:
    total, n = 0.0, 0
    tmp.mkdir(parents=True, exist_ok=True)
    for w in wins:
        args = []
        steps = len(w) - 1
        for i in range(steps):
            np.save(tmp / f"t{i}.npy", np.array([[w[i]]], dtype=np.int64))
            np.save(tmp / f"p{i}.npy", np.array([i], dtype=np.int64))
            args += ["--input", str(tmp / f"t{i}.npy"), "--input", str(tmp / f"p{i}.npy")]
        outs = []
        for i in range(steps):
            outs += ["--output", str(tmp / f"o{i}.npy")]
        proc = subprocess.run([str(kiln), "run", str(pte), "--steps", str(steps), *args, *outs],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"kiln run failed: {proc.stderr[-2000:]}")
        for i in range(steps):
            logits = np.load(tmp / f"o{i}.npy").reshape(-1)
            total -= log_softmax_at(logits, w[i + 1])
            n += 1
    return total, n


def nll_executorch(pte: Path, wins) -> tuple[float, int]:
    import torch
    import executorch.kernels.quantized  # noqa: F401  (quantized embedding kernels, when the file has them)
    from executorch.runtime import Runtime

    program = Runtime.get().load_program(str(pte))
    total, n = 0.0, 0
    for w in wins:
        method = program.load_method("forward")  # a fresh cache per window
        for i in range(len(w) - 1):
            out = method.execute([torch.tensor([[w[i]]], dtype=torch.long), torch.tensor([i], dtype=torch.long)])
            total -= log_softmax_at(out[0].numpy().reshape(-1), w[i + 1])
            n += 1
    return total, n


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--work", required=True, type=Path, help="folder for the export, the .pte files, step files")
    p.add_argument("--kiln", type=Path, default=Path(os.environ.get("KILN_BIN", REPO / "build" / "kiln")))
    p.add_argument("--max-seq-len", type=int, default=512)
    p.add_argument("--window", type=int, default=512)
    p.add_argument("--max-tokens", type=int, default=0, help="score only the first N tokens (0: the whole text)")
    p.add_argument("--rows", default="eager,kiln-fp32,kiln-8da4w,kiln-8da4w-emb4,kiln-8da8w,et-8da4w,et-8da4w-kiln")
    p.add_argument("--md", type=Path, default=None, help="write the table here (markdown)")
    a = p.parse_args(argv)
    if a.window > a.max_seq_len:
        p.error("--window must not exceed --max-seq-len")
    rows = a.rows.split(",")

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from kiln_export import llm

    folder, fname = os.path.split(llm.smollm2_gguf())
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=fname)
    ids = tok(TEXT.read_text(), add_special_tokens=False)["input_ids"]
    total_tokens = len(ids)
    if a.max_tokens:
        ids = ids[:a.max_tokens]
    wins = windows(ids, a.window)
    print(f"text: {total_tokens} tokens; scoring {len(ids)} in {len(wins)} window(s) of <= {a.window}", flush=True)

    spec = a.work / "smollm2" / "model_spec.json"
    if not spec.exists():
        env = dict(os.environ, PYTHONPATH=str(REPO / "python"))
        subprocess.run([sys.executable, "-m", "kiln_export", "llm", "--arch", "smollm2", "--max-seq-len",
                        str(a.max_seq_len), "--out", str(spec.parent)], check=True, env=env)
    def ao_spec(scheme: str) -> Path:
        """The torchao-quantized export (kiln_export llm --torchao): quantize_ before torch.export, as ExecuTorch's
        LLM export does; kiln lower then keeps the file's own int4/int8 weights."""
        s = a.work / f"smollm2-ao-{scheme}" / "model_spec.json"
        if not s.exists():
            env = dict(os.environ, PYTHONPATH=str(REPO / "python"))
            subprocess.run([sys.executable, "-m", "kiln_export", "llm", "--arch", "smollm2", "--max-seq-len",
                            str(a.max_seq_len), "--torchao", scheme, "--out", str(s.parent)], check=True, env=env)
        return s

    kiln_flags = {"kiln-fp32": [], "kiln-8da4w": ["--quantize", "8da4w"],
                  "kiln-8da4w-emb4": ["--quantize", "8da4w", "--quantize-embedding", "4"],
                  "kiln-8da8w": ["--quantize", "8da8w"]}
    results = []
    et_info = {}  # ExecuTorch's files by weight bits, each built once for both of its rows
    for row in rows:
        t0 = time.perf_counter()
        if row == "eager":
            model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=fname, dtype=torch.float32,
                                                         attn_implementation=llm.ATTN_IMPLEMENTATION).eval()
            total, n = nll_eager(model, wins)
            label, size = "fp32 eager (transformers)", None
        elif row in kiln_flags:
            pte = a.work / f"{row}.pte"
            subprocess.run([str(a.kiln), "lower", "--spec", str(spec), "--backend", "xnnpack", "--out", str(pte), "-q",
                            *kiln_flags[row]], check=True, capture_output=True)
            total, n = nll_kiln(a.kiln, pte, wins, a.work / "steps")
            label, size = f"kiln {' '.join(kiln_flags[row]) or 'fp32'} (kiln's runtime)", pte.stat().st_size
        elif row in ("ao-8da4w-kiln", "ao-8da8w-kiln"):
            scheme = row[3:8]
            pte = a.work / f"{row}.pte"
            subprocess.run([str(a.kiln), "lower", "--spec", str(ao_spec(scheme)), "--backend", "xnnpack", "--out",
                            str(pte), "-q"], check=True, capture_output=True)
            total, n = nll_kiln(a.kiln, pte, wins, a.work / "steps")
            label, size = f"torchao {scheme} .pt2, kiln's lowering and runtime", pte.stat().st_size
        elif row in ("et-8da4w", "et-8da4w-kiln", "et-8da8w", "et-8da8w-kiln"):
            import et_8da4w

            weights = 4 if row.startswith("et-8da4w") else 8
            if weights not in et_info:
                et_info[weights] = et_8da4w.build(a.work, a.max_seq_len, embedding=0, group=32, weights=weights)
            info = et_info[weights]
            if row.endswith("-kiln"):
                total, n = nll_kiln(a.kiln, Path(info["pte"]), wins, a.work / "steps")
                label = f"torchao 8da{weights}w, ExecuTorch's lowering, kiln's runtime"
            else:
                total, n = nll_executorch(Path(info["pte"]), wins)
                label = f"torchao 8da{weights}w, ExecuTorch's lowering and runtime"
            size = info["pte_bytes"]
        else:
            p.error(f"unknown row {row}")
        ppl = math.exp(total / n)
        results.append({"row": label, "ppl": ppl, "tokens": n, "pte_mb": size / 1e6 if size else None,
                        "seconds": time.perf_counter() - t0})
        print(f"{label}: perplexity {ppl:.4f} over {n} tokens ({time.perf_counter() - t0:.0f} s)", flush=True)

    lines = [f"SmolLM2-135M-Instruct perplexity on `bench/data/public_domain_en.txt` ({len(ids)} of {total_tokens} "
             f"tokens, windows of {a.window}, one token per call):", "",
             "| model | perplexity | vs fp32 eager | .pte MB |", "|---|---:|---:|---:|"]
    base = results[0]["ppl"] if results and rows[0] == "eager" else None
    for r in results:
        rel = f"{100 * (r['ppl'] / base - 1):+.2f}%" if base else ""
        mb = f"{r['pte_mb']:.1f}" if r["pte_mb"] else ""
        lines.append(f"| {r['row']} | {r['ppl']:.3f} | {rel} | {mb} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if a.md:
        a.md.write_text(text)
    (a.work / "perplexity.json").write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
