#!/usr/bin/env python3
"""GPT-2 small (124M, seeded weights, seq_len 128): .pte sizes and lowering times, kiln vs torchao + ExecuTorch
(outside CI; issue 14's "GPT-2 small sizes side by side").

    .venv/bin/python bench/quant/gpt2_sizes.py --work DIR [--md FILE] [--no-et]

kiln: `python -m kiln_export gpt2` once (the fp32 .pt2), then `kiln lower --backend xnnpack` plain, with
`--quantize 8da4w` and with `--quantize 8da8w` (wall time of the command: read, quantize, lower, write, verify).
ExecuTorch: the same module and weights; transformers' GPT-2 computes its projections with `Conv1D` (a matmul
by W[in, out]), which torchao's `quantize_` does not touch, so each `Conv1D` is first replaced by the
`nn.Linear` with the transposed weight (the same product); then `quantize_` (Int8DynamicActivationIntxWeightConfig:
int4 PerGroup(32), or int8 PerAxis(0)) on every linear layer, the LM head included, `torch.export`,
`to_edge_transform_and_lower(XnnpackPartitioner)`, `to_executorch`; its time is quantize + export + lower + write.
Both files hold the 50257 x 768 embedding once in fp32 (a lookup) and, quantized, the tied LM head as its own
quantized weight. The table counts each file's delegate calls (`kiln inspect --json` of the .pte).

Then, for 8da4w and 8da8w, each file (kiln's, ExecuTorch's) runs in each runtime (kiln's, ExecuTorch's) on the
spec's 128 tokens, against torchao eager on the same weights (bench/quant/torchao_ref.py, int4 scales rounded to
bf16 as both files store them): max |diff| / max |logit|, argmax agreement over the positions, and kiln's runtime
against ExecuTorch's on the same file.
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
sys.path.insert(0, str(REPO / "bench" / "quant"))


def log(msg: str) -> None:
    print(f"gpt2_sizes: {msg}", file=sys.stderr, flush=True)


def regions(kiln: Path, pte: Path) -> int | None:
    """Delegate calls of the file's first plan, as `kiln inspect --json` counts them."""
    proc = subprocess.run([str(kiln), "inspect", str(pte), "--json"], capture_output=True, text=True)
    if proc.returncode != 0:
        return None
    return sum(json.loads(proc.stdout)["plans"][0]["delegate_calls"].values())


def et_lower(scheme: str, out: Path) -> float:
    import torch
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    from kiln_export.models import build_gpt2

    module, example, _ = build_gpt2("small", 128, 0, None)
    t0 = time.perf_counter()
    if scheme != "fp32":
        from torchao_ref import conv1d_to_linear, quantize_like_kiln, untie_head

        conv1d_to_linear(module)
        untie_head(module.model.lm_head)  # quantize_ quantizes the head; the lookup keeps the fp32 table
        quantize_like_kiln(module, scheme, bf16_scales=False)  # ExecuTorch rounds its scales itself
    with torch.no_grad():
        ep = torch.export.export(module, example, strict=False)
    prog = to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()]).to_executorch()
    tmp = out.with_suffix(".tmp")
    tmp.write_bytes(prog.buffer)
    os.replace(tmp, out)
    return time.perf_counter() - t0


def agreement(kiln: Path, work: Path, scheme: str, files: dict[str, Path]) -> list[tuple]:
    """Each file (by its producer) in each runtime against torchao eager on the same weights (int4 scales
    rounded to bf16, as both files store them): max |diff| / max |logit| and the share of the 128
    positions whose argmax agrees; and the two runtimes on the same file against each other."""
    import numpy as np
    import torch
    from executorch.runtime import Runtime

    from kiln_export.models import build_gpt2
    from torchao_ref import conv1d_to_linear, quantize_like_kiln, untie_head

    module, example, _ = build_gpt2("small", 128, 0, None)
    conv1d_to_linear(module)
    untie_head(module.model.lm_head)
    quantize_like_kiln(module, scheme)
    with torch.no_grad():
        want = module(*example).numpy()
    scale = float(np.abs(want).max())
    x = example[0].numpy()
    np.save(work / "agree_in.npy", x)
    rows = []
    for producer, pte in files.items():
        et = Runtime.get().load_program(str(pte)).load_method("forward").execute([example[0]])[0].numpy()
        out = work / "agree_out.npy"
        subprocess.run([str(kiln), "run", str(pte), "--input", str(work / "agree_in.npy"), "--output", str(out)],
                       check=True, stdout=subprocess.DEVNULL)
        ki = np.load(out)
        for runtime, got in (("ExecuTorch", et), ("kiln", ki)):
            rows.append((scheme, producer, runtime, float(np.abs(got - want).max()) / scale,
                         float(np.mean(got.argmax(-1) == want.argmax(-1))),
                         float(np.abs(ki - et).max()) / scale if runtime == "kiln" else None))
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--work", required=True, type=Path)
    p.add_argument("--kiln", type=Path, default=Path(os.environ.get("KILN_BIN", REPO / "build" / "kiln")))
    p.add_argument("--md", type=Path, default=None)
    p.add_argument("--no-et", action="store_true", help="kiln's rows only")
    a = p.parse_args(argv)
    a.work.mkdir(parents=True, exist_ok=True)
    pt2 = a.work / "gpt2.pt2"
    if not pt2.exists():
        log("exporting GPT-2 small (python -m kiln_export gpt2) ...")
        env = dict(os.environ, PYTHONPATH=str(REPO / "python"))
        subprocess.run([sys.executable, "-m", "kiln_export", "gpt2", "--out", str(a.work)], check=True, env=env)
    rows = []
    for scheme in ("fp32", "8da4w", "8da8w"):
        out = a.work / f"gpt2_kiln_{scheme}.pte"
        cmd = [str(a.kiln), "lower", "--spec", str(a.work / "model_spec.json"), "--backend", "xnnpack", "--out", str(out)]
        if scheme != "fp32":
            cmd += ["--quantize", scheme]
        log(" ".join(cmd))
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        rows.append(("kiln", scheme, out.stat().st_size, time.perf_counter() - t0, regions(a.kiln, out)))
        if not a.no_et:
            eout = a.work / f"gpt2_et_{scheme}.pte"
            log(f"ExecuTorch {scheme} (torchao quantize_ + export + to_edge_transform_and_lower) ...")
            secs = et_lower(scheme, eout)
            rows.append(("ExecuTorch", scheme, eout.stat().st_size, secs, regions(a.kiln, eout)))
    agree = []
    if not a.no_et:
        for scheme in ("8da4w", "8da8w"):
            log(f"{scheme}: both files in both runtimes against torchao eager ...")
            agree += agreement(a.kiln, a.work, scheme, {"kiln": a.work / f"gpt2_kiln_{scheme}.pte",
                                                         "ExecuTorch": a.work / f"gpt2_et_{scheme}.pte"})
    lines = ["| program | scheme | file MB | delegate calls | lowering s |", "|---|---|---:|---:|---:|"]
    for side, scheme, size, secs, nreg in rows:
        lines.append(f"| {side} | {scheme} | {size / 1e6:.1f} | {nreg if nreg is not None else '?'} | {secs:.2f} |")
    if agree:
        lines += ["", "| scheme | file | runtime | max diff / max logit vs torchao eager | argmax agrees | "
                      "kiln vs ExecuTorch runtime, same file |", "|---|---|---|---:|---:|---:|"]
        for scheme, producer, runtime, err, same, cross in agree:
            lines.append(f"| {scheme} | {producer} | {runtime} | {err:.4f} | {same:.3f} | "
                         f"{'' if cross is None else f'{cross:.4f}'} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if a.md:
        a.md.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
