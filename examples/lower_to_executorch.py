#!/usr/bin/env python3
"""The GPT-2 lowering tutorial's script with kiln in place of ExecuTorch's Python lowering.

    python examples/lower_to_executorch.py --spec artifacts/gpt2/model_spec.json --backend portable
    python examples/lower_to_executorch.py --spec artifacts/gpt2/model_spec.json --backend xnnpack

Reads model_spec.json, finds the exported .pt2 program, lowers it (kiln.lower: no partitioner for
portable, XNNPACK delegate regions for xnnpack), writes <name>_<backend>.pte beside the spec and the
metadata JSON with the same stem (model, model_id, backend, exported_program, pte, pte_size_mb,
seq_len, delegation, and kiln's own keys), and prints the delegation summary: delegate call sites and
the fallback operators by target, with kiln's reason for each.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import kiln


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="Lower a kiln model spec's exported program to an ExecuTorch .pte")
    p.add_argument("--spec", required=True, help="model_spec.json (the export front end's)")
    p.add_argument("--backend", required=True, choices=["portable", "xnnpack"])
    p.add_argument("--out", default=None, help="output .pte (default: <spec dir>/<name>_<backend>.pte)")
    p.add_argument("--quantize", default=None, help="xnnpack: 8da4w[:G] or 8da8w")
    args = p.parse_args(argv)

    spec_path = Path(args.spec)
    try:
        spec = json.loads(spec_path.read_text())
        out = Path(args.out) if args.out else spec_path.parent / f"{spec['name']}_{args.backend}.pte"
        program = kiln.lower(spec_path, backend=args.backend, quantize=args.quantize)
        metadata = program.write(out)
    except (OSError, ValueError, KeyError) as e:
        print(f"lower_to_executorch: error: {spec_path}: {e}", file=sys.stderr)
        return 1
    except kiln.Error as e:
        print(f"lower_to_executorch: error: {e}", file=sys.stderr)
        return 1

    print(f"{metadata['model']} ({args.backend}) -> {metadata['pte']} ({metadata['pte_size_mb']:.2f} MB)")
    delegation = program.delegation
    if delegation is not None:
        print(f"  XNNPACK delegate call sites: {delegation['delegate_call_sites']}")
        print(f"  fallback call_function operators: {delegation['fallback_count']}")
        for target, count in sorted(delegation["fallback_ops"].items(), key=lambda kv: (-kv[1], kv[0])):
            reasons = delegation["fallback_reasons"].get(target, [])
            print(f"    {count:4}  {target}" + (f": {reasons[0]}" if reasons else ""))
    print(f"  metadata: {out.with_suffix('.json')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
