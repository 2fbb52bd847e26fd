#!/usr/bin/env python3
"""SmolLM2-135M-Instruct .pte sizes and lowering times: kiln vs ExecuTorch (outside CI).

    python bench/quant/size_bench.py --work DIR [--max-seq-len 512] [--md bench/quant/SIZES.md] [--no-et]

kiln: `kiln lower --backend xnnpack` on the fp32 .pt2 from `python -m kiln_export llm --arch smollm2`,
with --quantize 8da4w and --quantize-embedding 4|8 (wall time of the command: read, quantize, lower, write,
verify). ExecuTorch: bench/quant/et_8da4w.py (torchao quantize_ + torch.export + to_edge_transform_and_lower
with XnnpackPartitioner + to_executorch), with and without its embedding quantization; its time is
quantize + export + lower (loading the model excluded). The GGUF the weights come from (Q4_1) is the size goal.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "python"))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--work", required=True, type=Path)
    p.add_argument("--kiln", type=Path, default=Path(os.environ.get("KILN_BIN", REPO / "build" / "kiln")))
    p.add_argument("--max-seq-len", type=int, default=512)
    p.add_argument("--md", type=Path, default=None)
    p.add_argument("--no-et", action="store_true", help="kiln's rows only")
    a = p.parse_args(argv)

    from kiln_export import llm

    spec = a.work / "smollm2" / "model_spec.json"
    if not spec.exists():
        env = dict(os.environ, PYTHONPATH=str(REPO / "python"))
        subprocess.run([sys.executable, "-m", "kiln_export", "llm", "--arch", "smollm2", "--max-seq-len",
                        str(a.max_seq_len), "--out", str(spec.parent)], check=True, env=env)
    gguf = Path(llm.smollm2_gguf())
    rows = [("GGUF Q4_1 (the weights' source, llama.cpp)", gguf.stat().st_size, None)]
    for name, flags in [("kiln fp32", []), ("kiln 8da4w", ["--quantize", "8da4w"]),
                        ("kiln 8da4w + --quantize-embedding 4", ["--quantize", "8da4w", "--quantize-embedding", "4"]),
                        ("kiln 8da4w + --quantize-embedding 8", ["--quantize", "8da4w", "--quantize-embedding", "8"]),
                        ("kiln 8da8w + --quantize-embedding 8", ["--quantize", "8da8w", "--quantize-embedding", "8"])]:
        pte = a.work / f"{name.replace(' ', '_').replace('-', '')}.pte"
        t0 = time.perf_counter()
        subprocess.run([str(a.kiln), "lower", "--spec", str(spec), "--backend", "xnnpack", "--out", str(pte), "-q",
                        *flags], check=True, capture_output=True)
        rows.append((name, pte.stat().st_size, time.perf_counter() - t0))
        print(rows[-1], flush=True)
    if not a.no_et:
        import et_8da4w

        for emb in (0, 4):
            info = et_8da4w.build(a.work, a.max_seq_len, embedding=emb, group=32)
            label = "ExecuTorch torchao 8da4w" + (f" + embedding int{emb} (quant fusion)" if emb else "")
            rows.append((label, info["pte_bytes"], info["seconds"]["quantize_export_lower"]))
            print(rows[-1], info["seconds"], flush=True)

    goal = gguf.stat().st_size
    lines = ["SmolLM2-135M-Instruct, XNNPACK .pte sizes (max_seq_len "
             f"{a.max_seq_len}) and lowering wall time on this machine:", "",
             "| file | size (MB) | vs GGUF Q4_1 | lowering (s) |", "|---|---:|---:|---:|"]
    for name, size, secs in rows:
        lines.append(f"| {name} | {size / 1e6:.1f} | {100 * (size / goal - 1):+.1f}% | "
                     f"{'' if secs is None else f'{secs:.1f}'} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if a.md:
        a.md.write_text(text)
    (a.work / "sizes.json").write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
