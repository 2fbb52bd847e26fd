#!/usr/bin/env python3
"""Peak memory of quantizing and lowering a 1B-parameter Llama to 8da4w: kiln vs torchao + ExecuTorch (outside CI;
issue 14's "memory at scale").

    .venv/bin/python bench/quant/memory_1b.py --work DIR [--max-seq-len 128] [--et-limit-gb 20] [--et-timeout 1800]
        [--no-et] [--md FILE]

The model: Llama 3.2 1B's configuration (1.24B parameters, 16 layers, width 2048, vocabulary 128256, tied
embeddings) with seeded random weights, exported once by `python -m kiln_export llm --arch llama --config 1b`
(a ~5 GB fp32 .pt2). Rows:
  export      the export itself (PyTorch; once per model)
  kiln        `kiln lower --backend xnnpack --quantize 8da4w` of that .pt2 (read, quantize, lower, write, verify)
  ExecuTorch  the same module: torchao quantize_(Int8DynamicActivationIntxWeightConfig(int4, PerGroup(32))),
              strict torch.export, to_edge_transform_and_lower(XnnpackPartitioner), to_executorch, write
Peak RSS is the process's own high-water mark (wait4's ru_maxrss) for export and kiln. ExecuTorch's child is
watched instead (its RSS sampled every 0.5 s): past --et-limit-gb or --et-timeout it is killed and the row says
so, so that the measurement cannot take the 24 GB machine down.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PY = str(REPO / ".venv" / "bin" / "python") if (REPO / ".venv" / "bin" / "python").exists() else sys.executable


def log(msg: str) -> None:
    print(f"memory_1b: {msg}", file=sys.stderr, flush=True)


def timed(cmd) -> tuple[float, float, int, str]:
    """(wall s, peak RSS MB by wait4, exit code, stderr tail)"""
    env = dict(os.environ, PYTHONPATH=str(REPO / "python"))
    t0 = time.perf_counter()
    proc = subprocess.Popen([str(c) for c in cmd], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    err = proc.stderr.read().decode(errors="replace")
    _, status, usage = os.wait4(proc.pid, 0)
    return time.perf_counter() - t0, usage.ru_maxrss / 1024, os.waitstatus_to_exitcode(status), err[-2000:]


def rss_mb(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def watched(cmd, limit_mb: float, timeout_s: float) -> tuple[float, float, str]:
    """(wall s, peak sampled RSS MB, outcome)"""
    env = dict(os.environ, PYTHONPATH=str(REPO / "python"))
    t0 = time.perf_counter()
    proc = subprocess.Popen([str(c) for c in cmd], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env,
                            start_new_session=True)
    peak, outcome = 0.0, None
    while proc.poll() is None:
        peak = max(peak, rss_mb(proc.pid))
        elapsed = time.perf_counter() - t0
        if peak > limit_mb or elapsed > timeout_s:
            outcome = (f"killed at {peak / 1024:.1f} GB RSS after {elapsed:.0f} s (limit {limit_mb / 1024:.0f} GB)"
                       if peak > limit_mb else f"killed after {elapsed:.0f} s (timeout), {peak / 1024:.1f} GB RSS")
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            break
        time.sleep(0.5)
    if outcome is None:
        outcome = "ok" if proc.returncode == 0 else f"failed (exit {proc.returncode}): " + \
            proc.stderr.read().decode(errors="replace").strip().splitlines()[-1][:200]
    return time.perf_counter() - t0, peak, outcome


def et_child(spec_path: str, out: str) -> int:
    """ExecuTorch's route, in its own process (run by watched())."""
    import torch
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower
    from torchao.quantization import Int8DynamicActivationIntxWeightConfig, PerGroup, quantize_
    from transformers import AutoModelForCausalLM

    sys.path.insert(0, str(REPO / "python"))
    from kiln_export import llm

    spec = json.loads(Path(spec_path).read_text())
    torch.manual_seed(0)
    cfg = llm.tiny_config("llama", "1b")
    cfg._attn_implementation = llm.ATTN_IMPLEMENTATION
    model = AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.float32).eval()
    module = llm.make_module(model, int(spec["constant_methods"]["get_max_seq_len"]), False).eval()
    quantize_(module, Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int4, weight_granularity=PerGroup(32)))
    ep = torch.export.export(module, (torch.tensor([[1]]), torch.tensor([0])), strict=True)
    prog = to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()]).to_executorch()
    Path(out + ".tmp").write_bytes(prog.buffer)
    os.replace(out + ".tmp", out)
    return 0


def main() -> int:
    if len(sys.argv) == 4 and sys.argv[1] == "--et-child":
        return et_child(sys.argv[2], sys.argv[3])
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--work", required=True, type=Path)
    p.add_argument("--kiln", type=Path, default=Path(os.environ.get("KILN_BIN", REPO / "build" / "kiln")))
    p.add_argument("--max-seq-len", type=int, default=128)
    p.add_argument("--et-limit-gb", type=float, default=20.0)
    p.add_argument("--et-timeout", type=float, default=1800.0)
    p.add_argument("--no-et", action="store_true")
    p.add_argument("--md", type=Path, default=None)
    a = p.parse_args()
    a.work.mkdir(parents=True, exist_ok=True)
    spec = a.work / "model_spec.json"
    rows = []
    if not spec.exists():
        log("exporting Llama 1B (python -m kiln_export llm --arch llama --config 1b) ...")
        wall, peak, rc, err = timed([PY, "-m", "kiln_export", "llm", "--arch", "llama", "--config", "1b",
                                     "--max-seq-len", a.max_seq_len, "--out", a.work, "--name", "llama1b"])
        if rc != 0:
            sys.exit(f"memory_1b: export failed:\n{err}")
        rows.append(("export (PyTorch, once per model)", wall, peak, "ok"))
    pt2 = json.loads(spec.read_text())["exported_program"]
    pt2_path = (a.work / pt2) if not os.path.isabs(pt2) else Path(pt2)
    out = a.work / "llama1b_kiln_8da4w.pte"
    log("kiln lower --quantize 8da4w ...")
    wall, peak, rc, err = timed([a.kiln, "lower", "--spec", spec, "--backend", "xnnpack", "--quantize", "8da4w",
                                 "--out", out, "-q"])
    rows.append(("kiln lower --quantize 8da4w", wall, peak, "ok" if rc == 0 else f"failed: {err.strip()[-200:]}"))
    if not a.no_et:
        log(f"ExecuTorch: quantize_ + export + to_edge_transform_and_lower (killed past {a.et_limit_gb} GB) ...")
        wall, peak, outcome = watched([PY, __file__, "--et-child", spec, a.work / "llama1b_et_8da4w.pte"],
                                      a.et_limit_gb * 1024, a.et_timeout)
        rows.append(("ExecuTorch: torchao quantize_ + export + lower", wall, peak, outcome))
    sizes = {"fp32 .pt2": pt2_path, "kiln 8da4w .pte": out, "ExecuTorch 8da4w .pte": a.work / "llama1b_et_8da4w.pte"}
    lines = ["| step | wall s | peak RSS MB | outcome |", "|---|---:|---:|---|"]
    for name, wall, peak, outcome in rows:
        lines.append(f"| {name} | {wall:.1f} | {peak:.0f} | {outcome} |")
    lines.append("")
    lines.append("Files: " + ", ".join(f"{k} {v.stat().st_size / 1e6:.1f} MB" for k, v in sizes.items() if v.exists()))
    text = "\n".join(lines) + "\n"
    print(text)
    if a.md:
        a.md.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
