"""python -m kiln_export MODEL --out DIR [...]: export a model to DIR/<model>.pt2 + model_spec.json."""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time


def _parse(argv):
    p = argparse.ArgumentParser(
        prog="python -m kiln_export",
        description="Export a model with torch.export into a .pt2 archive and a "
        "model_spec.json that `kiln lower` and `kiln inspect` read.",
    )
    p.add_argument("model", choices=["gpt2", "bert", "llama", "qwen3", "gemma3"],
                   help="model family to export (transformers GPT2LMHeadModel, BertModel, LlamaForCausalLM, "
                   "Qwen3ForCausalLM, Gemma3ForCausalLM; all but GPT-2 with their default SDPA attention)")
    p.add_argument("--out", required=True, help="output directory (created if missing)")
    p.add_argument("--config", default="small", choices=["small", "tiny"],
                   help="small = the full-size configuration (GPT-2 124M, BERT base, 12-layer Llama/Qwen3/Gemma3); "
                   "tiny = 2 layers, width 64 (default: small)")
    p.add_argument("--seq-len", type=int, default=128, help="static sequence length (default: 128)")
    p.add_argument("--seed", type=int, default=0, help="weight and input seed (default: 0)")
    p.add_argument("--checkpoint", default=None,
                   help="local Hugging Face checkpoint directory (default: seeded random weights)")
    p.add_argument("--decompose", action="store_true",
                   help="write core-ATen IR (after run_decompositions()) instead of the default IR")
    return p.parse_args(argv)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["llm"]:  # decoders with a KV cache: kiln_export/llm.py
        from .llm import main as llm_main

        return llm_main(argv[1:])
    args = _parse(argv)
    import numpy as np
    import torch

    from .models import BUILDERS

    t0 = time.perf_counter()
    try:
        module, example, extra = BUILDERS[args.model](args.config, args.seq_len, args.seed,
                                                     args.checkpoint)
    except (ValueError, OSError) as e:
        print(f"kiln_export: error: {e}", file=sys.stderr)
        return 2
    os.makedirs(args.out, exist_ok=True)
    name = args.model
    print(f"kiln_export: exporting {name} ({args.config}, seq_len {args.seq_len}) ...", flush=True)
    with torch.no_grad():
        ep = torch.export.export(module, example, strict=False)
        if args.decompose:
            ep = ep.run_decompositions()
        ref = module(*example)

    pt2 = os.path.join(args.out, f"{name}.pt2")
    # Save into a private temp directory under the final name (torch names the
    # archive's root folder after the file), then rename: a failure leaves nothing.
    tmpdir = tempfile.mkdtemp(prefix=f".{name}.export.", dir=args.out)
    try:
        tmp = os.path.join(tmpdir, f"{name}.pt2")
        torch.export.save(ep, tmp)
        os.replace(tmp, pt2)
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)

    input_files = []
    for i, t in enumerate(example):
        fn = f"{name}_input{i}.npy"
        np.save(os.path.join(args.out, fn), t.numpy())
        input_files.append(fn)
    ref_fn = f"{name}_expected_output0.npy"
    np.save(os.path.join(args.out, ref_fn), ref.detach().numpy())

    spec = {
        "name": name,
        "model_id": extra["model_id"],
        "config": args.config,
        "seq_len": args.seq_len,
        "exported_program": os.path.basename(pt2),
        "ir": "core_aten" if args.decompose else "default",
        "seed": args.seed,
        "checkpoint": args.checkpoint,
        "inputs": [
            {"name": "input_ids", "dtype": "int64", "shape": list(example[0].shape),
             "reference": input_files[0]}
        ],
        "outputs": [
            {"name": "logits" if name != "bert" else "last_hidden_state", "dtype": "float32",
             "shape": list(ref.shape),
             "reference": ref_fn}
        ],
        "torch_version": torch.__version__,
    }
    spec_path = os.path.join(args.out, "model_spec.json")
    with open(spec_path + ".tmp", "w") as f:
        json.dump(spec, f, indent=2)
        f.write("\n")
    os.replace(spec_path + ".tmp", spec_path)
    dt = time.perf_counter() - t0
    print(f"kiln_export: wrote {pt2} ({os.path.getsize(pt2) / 1e6:.1f} MB) and {spec_path} "
          f"in {dt:.1f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
