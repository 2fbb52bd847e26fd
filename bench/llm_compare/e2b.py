"""llm_compare.py --model e2b: Gemma 4 E2B (4.6 B stored parameters, seeded random bf16 weights), kiln's
`--recipe llm-int4` (8da4w linears, int4 token and per-layer embedding tables) against llama.cpp Q4_0 / Q4_K_M on
the same weights (issue 38, item 6).

    nice -n 10 .venv/bin/python bench/llm_compare/llm_compare.py --model e2b [--rounds 5] [--threads 1,2]
        [-p 128] [-n 128] [--e2b-dir DIR] [--e2b-pte FILE] [--gguf-dir DIR] [--json FILE] [--under-load]
        [--kiln-base BIN]

Artifacts (made when missing; by default under --work/e2b_256):
  python -m kiln_export llm --arch gemma4 --config e2b --dtype bf16 --max-seq-len 256   (--e2b-dir: an existing
      export's folder, its model_spec.json and gemma4.pt2)
  kiln lower --spec DIR/model_spec.json --recipe llm-int4                               (--e2b-pte: an existing file)
  bench/llm_compare/gguf_gemma4.py: the .pt2's tensors as a bf16 GGUF (llama.cpp's gemma4 layout), its logits
      checked against transformers' eager fp32 on the same weights (8 tokens), then quantized by llama.cpp's own
      quantizer (llama_model_quantize) to Q4_0 and Q4_K_M; the bf16 GGUF (9 GB) is removed afterwards
      (--gguf-dir: where the GGUF files go)
Cells per thread count, alternating order each round, one fresh process each: kiln_bandwidth (the read
bandwidth, for the roofline), kiln (the CPU's best ISA), kiln with KILN_CPU_ISA=avx2 (left out where AVX2 is
the best: the same code), kiln --kiln-base BIN (optional: another build on the same file, before / after),
llama.cpp Q4_0, Q4_K_M. An export made with --dynamic takes the prompt in one call; otherwise kiln's prefill is
P decode-shaped calls; llama.cpp's prefill is one batch. p + n must fit the program's max_seq_len (256).
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

SIDES = [("kiln", "kiln_pte", {}), ("kiln avx2", "kiln_pte", {"KILN_CPU_ISA": "avx2"}),
         ("llama.cpp Q4_0", "gguf_q4_0", {}), ("llama.cpp Q4_K_M", "gguf_q4_k_m", {})]
VOCAB, HIDDEN, PER_LAYER = 262144, 1536, 35 * 256  # E2B's token table and per-layer table widths


def make_artifacts(args, work: Path, kiln: Path) -> dict:
    d = Path(args.e2b_dir) if args.e2b_dir else work / "e2b_256"
    spec = d / "model_spec.json"
    if not spec.exists():
        lc.must([lc.PY, "-m", "kiln_export", "llm", "--arch", "gemma4", "--config", "e2b", "--dtype", "bf16",
                 "--max-seq-len", 256, "--out", d],
                f"exporting Gemma 4 E2B (bf16, seeded, max_seq_len 256) to {d} (minutes, 9.3 GB)")
    s = json.loads(spec.read_text())
    if s["llm"]["arch"] != "gemma4" or s.get("config") != "e2b":
        sys.exit(f"llm_compare: {spec} is not a Gemma 4 E2B export")
    if args.p + args.n > s["llm"]["max_seq_len"]:
        sys.exit(f"llm_compare: -p {args.p} -n {args.n} exceeds the program's max_seq_len {s['llm']['max_seq_len']}")
    pte = Path(args.e2b_pte) if args.e2b_pte else d / "e2b_int4.pte"
    if not pte.exists():
        lc.must([kiln, "lower", "--spec", spec, "--recipe", "llm-int4", "--out", pte, "-q"],
                "kiln lower --recipe llm-int4")
    g = Path(args.gguf_dir) if args.gguf_dir else d / "gguf"
    name = s["name"]
    files = {"pt2": d / s["exported_program"], "kiln_pte": pte, "gguf_q4_0": g / f"{name}.q4_0.gguf",
             "gguf_q4_k_m": g / f"{name}.q4_k_m.gguf"}
    check = g / "gguf_check.json"
    if not (files["gguf_q4_0"].exists() and files["gguf_q4_k_m"].exists() and check.exists()):
        lc.log("writing the bf16 GGUF, checking it against eager, quantizing it to Q4_0 and Q4_K_M (minutes)")
        proc = lc.run([lc.PY, lc.HERE / "gguf_gemma4.py", spec, g, "--types", "q4_0,q4_k_m", "--check", 8])
        if proc.returncode != 0:
            sys.exit(f"llm_compare: gguf_gemma4.py failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
        check.write_text(proc.stdout.strip().splitlines()[-1])
    files["check"] = json.loads(check.read_text()).get("check")
    return files


def table_bytes(width: int, bits: int = 4, group: int = 32) -> int:
    """An int4 (or int8) lookup table of VOCAB x width with fp32 scales per group, as kiln's
    --quantize-embedding 4:32 stores it."""
    return VOCAB * width * bits // 8 + VOCAB * (width // group) * 4


def weight_bytes(files: dict) -> dict:
    """Bytes one decode step reads. llama.cpp: every tensor of the file but the per-layer table (it reads that
    table's rows for the tokens, not the table; token_embd is also the tied output matrix, read in full). kiln:
    its file less its two int4 lookup tables (the LM head is its own int4 copy), of which a step reads one row."""
    import gguf

    out = {}
    for key in ("gguf_q4_0", "gguf_q4_k_m"):
        out[key] = sum(int(t.n_bytes) for t in gguf.GGUFReader(str(files[key])).tensors
                       if t.name != "per_layer_token_embd.weight")
    meta = Path(files["kiln_pte"]).with_suffix(".json")
    if meta.exists():
        scheme = json.loads(meta.read_text()).get("embedding_quantization", {}).get("scheme")
        if scheme not in (None, "4:32"):
            raise SystemExit(f"llm_compare: {meta}: embedding scheme {scheme}; the byte count assumes 4:32")
    tables = table_bytes(HIDDEN) + table_bytes(PER_LAYER)
    out["kiln_pte"] = Path(files["kiln_pte"]).stat().st_size - tables
    out["kiln_tables"] = tables
    return out


def main(args) -> None:
    threads = [int(t) for t in args.threads.split(",")]
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    kiln = work / "kiln.bin"
    lc.shutil.copy2(args.kiln, kiln)
    lc.shutil.copy2(Path(args.kiln).parent / "kiln_bandwidth", work / "kiln_bandwidth.bin")
    files = make_artifacts(args, work, kiln)
    wb = weight_bytes(files)
    spec = json.loads((Path(files["pt2"]).parent / "model_spec.json").read_text())
    dynamic = bool(spec["llm"].get("dynamic"))

    sides, bins, avx2_best, side_notes = lc.kiln_sides(SIDES, kiln, getattr(args, "kiln_base", None), work,
                                                       "kiln_pte")
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
        return "—" if v is None else f"{v:.2f}"

    def ratio(a, b):
        return "—" if a is None or b is None else f"{a / b:.2f}×"

    def version(env):
        p = subprocess.run([str(kiln), "--version"], capture_output=True, text=True, env=dict(os.environ, **env))
        return p.stdout.strip()

    commit = lc.run(["git", "-C", lc.REPO, "rev-parse", "--short", "HEAD"]).stdout.strip()
    llama_info = next((x[2] for c in cells for x in results[c] if x[2]), None)
    bw = {t: med(("bandwidth", "-", t), 1) for t in threads}
    cmdline = (f"    nice -n 10 .venv/bin/python bench/llm_compare/llm_compare.py --model e2b --rounds {args.rounds} "
               f"--threads {args.threads} -p {args.p} -n {args.n}"
               + (f" --e2b-dir {args.e2b_dir}" if args.e2b_dir else "")
               + (f" --e2b-pte {args.e2b_pte}" if args.e2b_pte else "")
               + (f" --gguf-dir {args.gguf_dir}" if args.gguf_dir else "")
               + (f" --kiln-base {args.kiln_base}" if getattr(args, "kiln_base", None) else ""))
    md = ["## Gemma 4 E2B against llama.cpp (issue 38)", "", cmdline, ""]
    if rounds != args.rounds:
        md += [f"**{rounds} complete round(s)** of the {args.rounds} asked (the run was cut short; the cells of an "
               "incomplete round count too).", ""]
    if args.under_load:
        md += ["**Measured under load**: these numbers show that the script works, not how the runtimes compare.", ""]
    md.append(f"**Date**: {start:%Y-%m-%d %H:%M} UTC. **Machine**: {lc.cpu_isa()}; load average "
              f"{' '.join(f'{x:.2f}' for x in load0)} at the start, {' '.join(f'{x:.2f}' for x in load1)} at the "
              f"end, 1-minute load at the cells' starts median {statistics.median(loads):.1f} (min {min(loads):.1f}, "
              f"max {max(loads):.1f}). **Software**: kiln `{commit}` (`{version({})}`; forced: "
              f"`{version({'KILN_CPU_ISA': 'avx2'})}`)"
              + (f"; llama.cpp (llama-cpp-python) system info: `{llama_info}`" if llama_info else "") + ".")
    md.append("")
    chk = files.get("check") or {}
    md.append("Model: Gemma 4 E2B's text configuration (35 layers, hidden 1536, 8 heads, 1 KV head, head_dim 256 "
              "sliding / 512 global, 20 KV-shared layers with double-wide MLPs, per-layer embeddings 35 × 256, "
              "vocab 262144, tied embeddings; 4.63 B stored parameters), seeded random bf16 weights "
              "(kiln_export's deferred initialisation). The same tensors, read from kiln's .pt2, written as a bf16 "
              "GGUF in llama.cpp's gemma4 layout (bench/llm_compare/gguf_gemma4.py) and quantized by llama.cpp's own "
              "quantizer; "
              + (f"the bf16 GGUF's logits for {chk['positions']} tokens, each at position 0, against transformers' "
                 f"eager fp32 on the same weights: min cosine {chk['min_cosine']:.6f}, max |diff| "
                 f"{chk['max_abs_diff']:.4f} (logit std {chk['ref_std']:.3f}), argmax {chk['argmax_agree']}/"
                 f"{chk['positions']}"
                 + (f" (where they differ, eager's margin between the two tokens is "
                    f"{chk.get('argmax_disagree_ref_margin', 0):.4f})"
                    if chk['argmax_agree'] != chk['positions'] else "")
                 + (f"; the same tokens as one sequence, cosine per position "
                    + ", ".join(f"{c:.4f}" for c in chk["sequence"]["cosine_per_position"])
                    + f", argmax {chk['sequence']['argmax_agree']}/{chk['sequence']['positions']} (the random E2B "
                    "amplifies rounding past position 0; llama.cpp rounds activations to bf16 for bf16 products)"
                    if chk.get("sequence") else "")
                 + ". bench/llm_compare/test_gguf_gemma4.py checks the writer at tiny size, every position." if chk
                 else "the logit check did not run."))
    md.append("")
    md.append(f"Prefill: {args.p} tokens from position 0 (kiln: "
              + ("one call (its program takes 1 to max_seq_len tokens a call, `--dynamic`)" if dynamic else
                 f"{args.p} calls of one token, its E2B program is not --dynamic")
              + f"; llama.cpp: one batch); decode: {args.n} tokens after it, one call each. Tokens/s, median "
              f"over {rounds} rounds of fresh processes, each the median of {args.reps} pass(es) after a warm-up "
              "pass. Ratio > 1: kiln faster.")
    md.append("")
    md.append("Roofline: weight bytes a decode step reads over the read bandwidth `kiln_bandwidth` measured as a cell "
              "of the same rounds (median; " + ", ".join(f"{fmt(bw[t])} GB/s at {t} thread(s)" for t in threads) +
              "). Bytes per token: kiln "
              f"{wb['kiln_pte'] / 1e6:.1f} MB (its file less its int4 token and per-layer tables, "
              f"{wb['kiln_tables'] / 1e6:.1f} MB, of which a step reads one row each), llama.cpp Q4_0 "
              f"{wb['gguf_q4_0'] / 1e6:.1f} MB and Q4_K_M {wb['gguf_q4_k_m'] / 1e6:.1f} MB (every tensor but the "
              "per-layer table, of which it reads the token's row; the tied token_embd is the output matrix). KV "
              "cache reads are left out.")
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
                rk = bw[t] * 1e9 / wb["kiln_pte"]
                pct = lambda x, key: "—" if x is None else f"{100 * x * wb[key] / (bw[t] * 1e9):.0f}%"
                roof = [f"{rk:.2f}", pct(k, "kiln_pte"), pct(q0, "gguf_q4_0"), pct(qk, "gguf_q4_k_m")]
            b = f"{fmt(v['kiln base'])} | {ratio(k, v['kiln base'])} | " if has_base else ""
            md.append(f"| {t} | {test} | {fmt(k)} | {b}{fmt(v['kiln avx2'])} | {fmt(q0)} | {fmt(qk)} | {ratio(k, q0)} | "
                      f"{ratio(k, qk)} | " + " | ".join(roof) + " |")
    md.append("")
    md.append("Files: " + ", ".join(f"`{k}` {Path(v).name} ({Path(v).stat().st_size / 1e6:.1f} MB)"
                                    for k, v in files.items() if k != "check" and Path(v).exists()) +
              ". kiln: `--recipe llm-int4` (8da4w linears and tied LM head: int8 activations × int4 weights in "
              "groups of 32; token and per-layer tables int4 lookups, groups of 32). llama.cpp's Q4_0 and Q4_K_M as "
              "its quantizer makes them (its choices per tensor, e.g. for token_embd and per_layer_token_embd).")
    if errors:
        md += ["", "Cells that did not run: " + "; ".join(f"{s} {t} thread(s): {e}" for (s, _, t), e in errors.items())]
    text = "\n".join(md) + "\n"
    print(text)
    out = Path(args.out_md)
    if out.name == "results.md":
        out = out.with_name("results_e2b.md")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
