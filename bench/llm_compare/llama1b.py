"""llm_compare.py --model llama1b: Llama 3.2 1B's shape, kiln 8da4w against llama.cpp Q4_0 / Q4_K_M on the same
seeded bf16 weights (issue 38, item 6), where a decode step reads ~0.8 GB and is bandwidth-bound.

    nice -n 10 .venv/bin/python bench/llm_compare/llm_compare.py --model llama1b [--rounds 5] [--threads 1,2]
        [-p 128] [-n 128] [--quantize-embedding 4|8|none] [--json FILE] [--kiln-base BIN]

Artifacts (made when missing, under --work/llama1b_<p+n>):
  python -m kiln_export llm --arch llama --config 1b --dtype bf16 --dynamic --last-logits-only --max-seq-len p+n
      (seeded random weights, transformers' initialisation; bf16 as released models ship)
  kiln lower --backend xnnpack --quantize 8da4w [--quantize-embedding Q]      -> kiln_8da4w.pte
  bench/llm_compare/gguf_llama.py: the .pt2's tensors as a bf16 GGUF (llama.cpp's q/k layout), quantized by
      llama.cpp's own quantizer (llama_model_quantize) to Q4_0 and Q4_K_M; the bf16 GGUF's logits checked
      against transformers' eager fp32 on the same weights (8 tokens) before anything is timed
Cells per thread count, alternating order each round, one fresh process each: kiln_bandwidth (the read
bandwidth, for the roofline), kiln (the CPU's best ISA), kiln with KILN_CPU_ISA=avx2 (left out where AVX2 is
the best: the same code), kiln --kiln-base BIN (optional: another build on the same file, before / after),
llama.cpp Q4_0, Q4_K_M.
Both sides take the prompt in one call (kiln: the --dynamic program; llama.cpp: one batch) and compute the
logits of the last position only.
"""
from __future__ import annotations

import datetime
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import llm_compare as lc

SIDES = [("kiln", "kiln_8da4w", {}), ("kiln avx2", "kiln_8da4w", {"KILN_CPU_ISA": "avx2"}),
         ("llama.cpp Q4_0", "gguf_q4_0", {}), ("llama.cpp Q4_K_M", "gguf_q4_k_m", {})]


def make_artifacts(work: Path, kiln: Path, max_seq: int, qemb: str) -> dict:
    d = work / f"llama1b_{max_seq}"
    spec = d / "model_spec.json"
    if not spec.exists():
        lc.must([lc.PY, "-m", "kiln_export", "llm", "--arch", "llama", "--config", "1b", "--dtype", "bf16",
                 "--dynamic", "--last-logits-only", "--max-seq-len", max_seq, "--out", d, "--name", "llama1b"],
                f"exporting the 1B Llama shape (bf16, seeded, max_seq_len {max_seq}, dynamic T) to {d}")
    suffix = "" if qemb == "none" else f"_emb{qemb}"
    files = {"pt2": d / "llama1b.pt2", "kiln_8da4w": d / f"kiln_8da4w{suffix}.pte",
             "gguf_bf16": d / "llama1b.bf16.gguf", "gguf_q4_0": d / "llama1b.q4_0.gguf",
             "gguf_q4_k_m": d / "llama1b.q4_k_m.gguf"}
    if not files["kiln_8da4w"].exists():
        lc.must([kiln, "lower", "--spec", spec, "--backend", "xnnpack", "--quantize", "8da4w", "--out",
                 files["kiln_8da4w"], "-q"] + ([] if qemb == "none" else ["--quantize-embedding", qemb]),
                "kiln lower --quantize 8da4w" + ("" if qemb == "none" else f" --quantize-embedding {qemb}"))
    check = d / "gguf_check.json"
    if not (files["gguf_q4_k_m"].exists() and check.exists()):
        lc.log("writing the GGUF files (bf16, Q4_0, Q4_K_M) and checking the bf16 one against eager")
        proc = lc.run([lc.PY, lc.HERE / "gguf_llama.py", spec, d, "--types", "bf16,q4_0,q4_k_m", "--check", 8])
        if proc.returncode != 0:
            sys.exit(f"llm_compare: gguf_llama.py failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
        check.write_text(proc.stdout.strip().splitlines()[-1])
    files["check"] = json.loads(check.read_text()).get("check")
    return files


def weight_bytes(files: dict, qemb: str) -> dict:
    """Bytes one decode step reads: llama.cpp, every tensor of the file (the tied token_embd is the LM head);
    kiln, its file less the embedding table, of which the lookup reads one row (the head has its own int4
    copy). The table's bytes: read from the .pte's constants by size (the largest constant of vocab x hidden
    elements)."""
    import gguf

    out = {}
    for key in ("gguf_q4_0", "gguf_q4_k_m"):
        out[key] = sum(int(t.n_bytes) for t in gguf.GGUFReader(str(files[key])).tensors)
    vocab, hidden = 128256, 2048
    table = {"none": vocab * hidden * 4, "8": vocab * hidden + vocab * 4,
             "4": vocab * hidden // 2 + vocab * hidden // 32 * 4}.get(qemb.split(":")[0])
    if ":" in qemb:  # a group size other than 32
        g = int(qemb.split(":")[1])
        table = (vocab * hidden // 2 if qemb.startswith("4") else vocab * hidden) + vocab * hidden // g * 4
    out["kiln_8da4w"] = files["kiln_8da4w"].stat().st_size - table
    out["kiln_table"] = table
    return out


def main(args) -> None:
    threads = [int(t) for t in args.threads.split(",")]
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    kiln = work / "kiln.bin"
    lc.shutil.copy2(args.kiln, kiln)
    lc.shutil.copy2(Path(args.kiln).parent / "kiln_bandwidth", work / "kiln_bandwidth.bin")
    files = make_artifacts(work, kiln, args.p + args.n, args.quantize_embedding)
    wb = weight_bytes(files, args.quantize_embedding)

    sides, bins, avx2_best, side_notes = lc.kiln_sides(SIDES, kiln, getattr(args, "kiln_base", None), work,
                                                       "kiln_8da4w")
    cells = []  # (side, file key, threads)
    for t in threads:
        cells += [("bandwidth", "-", t)] + [(s, k, t) for s, k, _ in sides]
    envs = {s: e for s, _, e in sides}
    results = {c: [] for c in cells}
    errors = {}
    state = {"start": datetime.datetime.now(datetime.timezone.utc).isoformat(), "load0": os.getloadavg(),
             "loads": [], "rounds_done": 0}
    if args.render_json:  # a run's saved cells (--json): the table again, nothing measured
        state = json.loads(Path(args.render_json).read_text())
        for side, key, t, runs in state["cells"]:
            results[(side, key, t)] = [tuple(x) for x in runs]
    for r in range(0 if args.render_json else args.rounds):
        order = cells if r % 2 == 0 else list(reversed(cells))
        for c in order:
            if c in errors:
                continue
            side, key, t = c
            lc.log(f"round {r + 1}/{args.rounds}: {side} {t} thread(s) (load {os.getloadavg()[0]:.2f})")
            state["loads"].append(os.getloadavg()[0])
            if side == "bandwidth":
                cmd = lc.cell_cmd("bandwidth", "", kiln, t, 0, 0, 0)
            elif side.startswith("kiln"):
                cmd = lc.cell_cmd("kiln", files[key], bins.get(side, kiln), t, args.p, args.n, args.reps)
            else:
                cmd = lc.cell_cmd("llama.cpp", files[key], kiln, t, args.p, args.n, args.reps)
            proc = lc.run(cmd, env=envs.get(side))
            if proc.returncode != 0:
                errors[c] = (proc.stderr.strip().splitlines() or ["failed"])[-1][:200]
                lc.log(f"  failed: {errors[c]}")
                continue
            j = json.loads(proc.stdout.strip().splitlines()[-1])
            row = j["results"][0]
            if side == "bandwidth":
                results[c].append((None, row["read_gb_per_s"], None))
            else:
                results[c].append((row["prefill_tokens_per_s"], row["decode_tokens_per_s"], j.get("system_info")))
            lc.log(f"  {results[c][-1][:2]}")
            if args.json:  # after every cell: a run cut short still leaves its cells (--render-json FILE)
                state["rounds_done"] = r + (c == order[-1])
                state["cells"] = [[*k, v] for k, v in results.items()]
                state["load1"] = os.getloadavg()
                Path(args.json).write_text(json.dumps(state, indent=1))
    if not args.render_json:
        state["load1"] = os.getloadavg()
    load0, load1, loads = state["load0"], state["load1"], state["loads"]
    start = datetime.datetime.fromisoformat(state["start"])
    rounds = state.get("rounds_done", args.rounds) if args.render_json else args.rounds

    def med(c, i):
        v = [x[i] for x in results.get(c, []) if x[i]]
        return statistics.median(v) if v else None

    def fmt(v):
        return "—" if v is None else f"{v:.1f}"

    def ratio(a, b):
        return "—" if a is None or b is None else f"{a / b:.2f}×"

    def version(env):
        p = subprocess.run([str(kiln), "--version"], capture_output=True, text=True, env=dict(os.environ, **env))
        return p.stdout.strip()

    commit = lc.run(["git", "-C", lc.REPO, "rev-parse", "--short", "HEAD"]).stdout.strip()
    llama_info = next((x[2] for c in cells for x in results[c] if x[2]), None)
    bw = {t: med(("bandwidth", "-", t), 1) for t in threads}
    qemb = args.quantize_embedding
    md = ["## 1 B Llama shape against llama.cpp (issue 38)", "",
          f"    nice -n 10 .venv/bin/python bench/llm_compare/llm_compare.py --model llama1b --rounds {args.rounds} "
          f"--threads {args.threads} -p {args.p} -n {args.n} --quantize-embedding {qemb}"
          + (f" --kiln-base {args.kiln_base}" if getattr(args, "kiln_base", None) else ""), ""]
    if rounds != args.rounds:
        md += [f"**{rounds} complete round(s)** of the {args.rounds} asked (the run was cut short; the cells of an "
               "incomplete round count too).", ""]
    if args.under_load:
        md += ["**Measured under load**: these numbers show that the script works, not how the runtimes compare.", ""]
    md.append(f"**Date**: {start:%Y-%m-%d %H:%M} UTC. **Machine**: {lc.cpu_isa()}; load average "
              f"{' '.join(f'{x:.2f}' for x in load0)} at the start, {' '.join(f'{x:.2f}' for x in load1)} at the "
              f"end, 1-minute load at the cells' starts median {statistics.median(loads):.1f} (min {min(loads):.1f}, "
              f"max {max(loads):.1f}): the machine's 2 cores are shared with other jobs, so every cell is one "
              f"process per round, niced like the others, the rounds alternating the order. **Software**: kiln "
              f"`{commit}` (`{version({})}`; forced: `{version({'KILN_CPU_ISA': 'avx2'})}`)"
              + (f"; llama.cpp (llama-cpp-python) system info: `{llama_info}`" if llama_info else "") + ".")
    md.append("")
    chk = files.get("check") or {}
    md.append("Model: Llama 3.2 1B's configuration (hidden 2048, 16 layers, 32 heads, 8 KV heads, intermediate 8192, "
              "vocab 128256, tied embeddings; 1.24 B parameters), transformers' seeded random initialisation in bf16. "
              "The same tensors (read from kiln's .pt2) written as a bf16 GGUF with llama.cpp's q/k row permutation "
              "(bench/llm_compare/gguf_llama.py) and quantized by llama.cpp's own quantizer; "
              + (f"the bf16 GGUF's logits on {chk['positions']} tokens against transformers' eager fp32: min cosine "
                 f"{chk['min_cosine']:.6f}, max |diff| {chk['max_abs_diff']:.4f} (logit std {chk['ref_std']:.3f}), "
                 f"argmax {chk['argmax_agree']}/{chk['positions']}"
                 + (f" (where they differ, eager's margin between the two tokens is "
                    f"{chk.get('argmax_disagree_ref_margin', 0):.4f}: a near-tie)"
                    if chk['argmax_agree'] != chk['positions'] else "") + " (bench/llm_compare/test_gguf_llama.py checks the writer "
                 f"at tiny size)." if chk else "the logit check did not run."))
    md.append("")
    md.append(f"Prefill: {args.p} tokens from position 0 in one call (kiln: the program exported with a dynamic "
              f"token count; llama.cpp: one batch), last-position logits only; decode: {args.n} tokens after it, one "
              f"call each. Tokens/s, median over {rounds} rounds of fresh processes, each the median of "
              f"{args.reps} pass(es) after a warm-up pass. Ratio > 1: kiln faster.")
    md.append("")
    md.append("Roofline: weight bytes a decode step reads over the read bandwidth `kiln_bandwidth` measured as a cell "
              "of the same rounds (median; " + ", ".join(f"{fmt(bw[t])} GB/s at {t} thread(s)" for t in threads) +
              "). Bytes per token: kiln "
              f"{wb['kiln_8da4w'] / 1e6:.1f} MB (its file less the embedding table, {wb['kiln_table'] / 1e6:.1f} MB, "
              "of which the lookup reads one row), llama.cpp Q4_0 "
              f"{wb['gguf_q4_0'] / 1e6:.1f} MB and Q4_K_M {wb['gguf_q4_k_m'] / 1e6:.1f} MB (every tensor: the tied "
              "token_embd is the output matrix). The KV cache reads (≤ 256 positions × 16 layers × 2 × 8 × 64 "
              "values) are left out.")
    md.append("")
    md += side_notes
    has_base = bool(bins)
    md.append("| threads | test | kiln | " + ("kiln base | kiln/base | " if has_base else "") +
              "kiln avx2 | llama.cpp Q4_0 | llama.cpp Q4_K_M | kiln/Q4_0 | kiln/Q4_K_M | "
              "roofline kiln | kiln % | Q4_0 % | Q4_K_M % |")
    md.append("|---:|---|---:|" + ("---:|---:|" if has_base else "") + "---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for t in threads:
        for i, test in [(0, f"prefill {args.p}"), (1, f"decode {args.n}")]:
            v = {s: med((s, k, t), i) for s, k, _ in sides}
            v.setdefault("kiln avx2", v["kiln"] if avx2_best else None)
            k, q0, qk = v["kiln"], v["llama.cpp Q4_0"], v["llama.cpp Q4_K_M"]
            roof = ["", "", "", ""]
            if i == 1 and bw.get(t):
                rk = bw[t] * 1e9 / wb["kiln_8da4w"]
                pct = lambda x, key: "—" if x is None else f"{100 * x * wb[key] / (bw[t] * 1e9):.0f}%"
                roof = [f"{rk:.1f}", pct(k, "kiln_8da4w"), pct(q0, "gguf_q4_0"), pct(qk, "gguf_q4_k_m")]
            b = f"{fmt(v['kiln base'])} | {ratio(k, v['kiln base'])} | " if has_base else ""
            md.append(f"| {t} | {test} | {fmt(k)} | {b}{fmt(v['kiln avx2'])} | {fmt(q0)} | {fmt(qk)} | {ratio(k, q0)} | "
                      f"{ratio(k, qk)} | " + " | ".join(roof) + " |")
    md.append("")
    md.append("Files: " + ", ".join(f"`{k}` {Path(v).name} ({Path(v).stat().st_size / 1e6:.1f} MB)"
                                    for k, v in files.items() if k not in ("check",) and Path(v).exists()) +
              f". kiln: `--quantize 8da4w` (int8 activations × int4 weights in groups of 32, bf16 scales, the "
              f"tied LM head its own int4 copy)" + ("" if qemb == "none" else f", `--quantize-embedding {qemb}`") +
              ". llama.cpp's Q4_0 and Q4_K_M as its quantizer makes them (the tied token_embd/output Q6_K in both).")
    if errors:
        md += ["", "Cells that did not run: " + "; ".join(f"{s} {t} thread(s): {e}" for (s, _, t), e in errors.items())]
    text = "\n".join(md) + "\n"
    print(text)
    out = Path(args.out_md)
    if out.name == "results.md":
        out = out.with_name("results_llama1b.md")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
