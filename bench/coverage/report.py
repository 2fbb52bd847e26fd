"""bench/COVERAGE.md from the sweep's JSON lines (bench/coverage/sweep.py)."""
from __future__ import annotations

import json
import platform
import re
from collections import Counter, defaultdict
from pathlib import Path

BACKENDS = ("portable", "xnnpack")


def load(path: Path):
    """(records by op in first-seen order, per-op notes). A later line for a sample replaces an earlier one."""
    samples: dict[str, dict[int, dict]] = defaultdict(dict)
    notes: dict[str, str] = {}
    why: dict[str, str] = {}
    for line in path.read_text().splitlines():
        try:
            r = json.loads(line)
        except ValueError:
            continue
        op = r["op"]
        why.setdefault(op, r.get("why", ""))
        samples.setdefault(op, {})
        if r.get("op_done"):
            if r.get("skipped"):
                notes[op] = r["skipped"]
            if "worker_crash" in r:
                notes[op] = "CRASH: " + r["worker_crash"]["msg"]
            continue
        samples[op][r["sample"]] = r
    return samples, notes, why


# Why kiln refuses a sample ExecuTorch lowers, by sweep entry (operator, in-place variant or module): every such
# sample must have one (issue 35). A refusal whose entry is not here is listed as UNEXPLAINED.
REFUSAL_REASONS = {
    "nonzero": "data-dependent output size: kiln plans every tensor's size ahead of time",
    # the whole-op_db sweep (--all-ops, 2026-12-05)
    "argwhere": "data-dependent output size (nonzero's): kiln plans every tensor's size ahead of time",
    "view_as_complex": "complex dtypes: kiln has none (ExecuTorch's own program of it fails in its runtime too)",
    "stft": "complex output (an FFT): kiln has no complex dtypes and no FFT",
    "fft.fft": "FFT with complex values: kiln has no complex dtypes and no FFT",
    "fft.hfft": "FFT with complex values: kiln has no complex dtypes and no FFT",
    "fft.rfft": "FFT with complex values: kiln has no complex dtypes and no FFT",
    "fft.rfft2": "FFT with complex values: kiln has no complex dtypes and no FFT",
    "fft.rfftn": "FFT with complex values: kiln has no complex dtypes and no FFT",
    "fft.irfft": "FFT with complex values: kiln has no complex dtypes and no FFT",
    "fft.irfft2": "FFT with complex values: kiln has no complex dtypes and no FFT",
    "fft.irfftn": "FFT with complex values: kiln has no complex dtypes and no FFT",
    "quantile": "sort + interpolation not written yet; ExecuTorch's own program of it fails in its runtime",
    "nanquantile": "sort + interpolation not written yet; ExecuTorch's own program of it fails in its runtime",
    "_upsample_bilinear2d_aa": "antialiased bilinear resize: not done (a resize_dim with antialias weights, "
                               "rewrites_conv.cpp, outside this change)",
    "_chunk_cat": "not done (FSDP's gradient-bucketing op, not a model forward's)",
    # float64 (--dtypes float64, 2026-12-06): refused for that dtype only (float32 and 16-bit lower)
    "nn.functional.interpolate.linear": "float64 only: the resize's tap weights are float32 constants, so kiln "
                                        "refuses rather than compute a float64 resize at float32 precision",
    "nn.functional.interpolate.bicubic": "float64 only: the resize's tap weights are float32 constants, so kiln "
                                         "refuses rather than compute a float64 resize at float32 precision",
    "nn.functional.interpolate.trilinear": "float64 only: the resize's tap weights are float32 constants, so kiln "
                                           "refuses rather than compute a float64 resize at float32 precision",
    "nn.functional.scaled_dot_product_attention": "float64 only: kiln's attention rewrite computes in float32 (its "
                                                  "masks and softmax), so it refuses rather than lose float64's precision",
    # uint8 (--dtypes uint8,int8,int16, 2026-12-06): refused for integer tensors only
    "nn.functional.interpolate.bilinear": "uint8 only: eager's uint8 kernel computes with int16 fixed-point weights "
                                          "and rounds between its passes; ExecuTorch's uint8 kernel gives other "
                                          "numbers (its own program is wrong in its runtime), so kiln refuses it",
    "nn.functional.upsample_bilinear": "uint8 only: eager's uint8 kernel computes with int16 fixed-point weights "
                                       "and rounds between its passes; ExecuTorch's uint8 kernel gives other "
                                       "numbers (its own program is wrong in its runtime), so kiln refuses it",
    "resize_": "an in-place shape change of an input: kiln's functionalization does not carry it (a view rewrite "
               "returned the old shape, so it stays refused)",
}


def refusals_of(samples):
    """(op, backend, ExecuTorch's .pte correct in its runtime?, kiln's error, reason) for every sample ExecuTorch
    lowers and kiln does not."""
    out = []
    for op, rs in samples.items():
        for b in BACKENDS:
            bad = [r for r in rs.values() if st(r, "et", b, "lower") == "ok" and st(r, "kiln", b, "lower") != "ok"]
            if not bad:
                continue
            ok = sum(1 for r in bad if st(r, "et", b, "et_run") == "ok")
            msg = Counter(r.get(f"kiln_{b}", {}).get("lower", {}).get("msg", "") for r in bad).most_common(1)[0][0]
            out.append((op, b, f"{len(bad)} ({ok} correct in ET)", shorten(msg),
                        REFUSAL_REASONS.get(op, "UNEXPLAINED")))
    return out


def st(r, producer, backend, stage):
    return r.get(f"{producer}_{backend}", {}).get(stage, {}).get("status")


def isa_of(kiln_bin: str | None) -> str:
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
        flags = next(ln for ln in Path("/proc/cpuinfo").read_text().splitlines() if ln.startswith("flags"))
        has = [f for f in ("avx512f", "avx2", "fma") if f" {f}" in flags]
        cpu += f" ({', '.join(has)})" if has else ""
    except (OSError, StopIteration):
        pass
    return f"{platform.machine()}, {cpu}"


def bugs_of(samples):
    """kiln's bugs, and ExecuTorch's wrong numbers: two lists of (op, sample, where, message).

    kiln's: a kiln crash or hang anywhere; a wrong number from kiln's .pte in either runtime;
    kiln's .pte failing to run where ExecuTorch's own .pte of the sample runs correctly; kiln's
    runtime giving a wrong number on an ExecuTorch .pte that ExecuTorch's runtime gets right; a
    dead worker."""
    kiln, et = [], []
    for op, rs in samples.items():
        for i, r in sorted(rs.items()):
            if "worker_crash" in r:
                kiln.append((op, i, "worker", r["worker_crash"]["msg"]))
            for b in BACKENDS:
                k, e = r.get(f"kiln_{b}", {}), r.get(f"et_{b}", {})
                et_ok = e.get("et_run", {}).get("status") == "ok"
                for stage in ("lower", "et_run", "kiln_run"):
                    x = k.get(stage, {})
                    s = x.get("status")
                    own = s == "error" and stage == "lower" and "does not load" in x.get("msg", "")
                    # ExecuTorch's runtime aborting on kiln's program is ExecuTorch's when it aborts on its own too
                    et_too = stage == "et_run" and s == "crash" and e.get("et_run", {}).get("status") == "crash"
                    if et_too:
                        et.append((op, i, f"kiln {b} .pte: et_run", "crash: ExecuTorch's runtime aborts on "
                                   "ExecuTorch's own program of this sample too"))
                    elif s in ("crash", "timeout", "wrong") or own or (s == "error" and stage != "lower" and et_ok):
                        kiln.append((op, i, f"kiln {b} .pte: {stage}", f"{s}: {shorten(x.get('msg', ''), 10**6)}"))
                x = e.get("kiln_run", {})
                if x.get("status") in ("crash", "timeout") or (x.get("status") == "wrong" and et_ok):
                    kiln.append((op, i, f"ET {b} .pte: kiln_run", f"{x['status']}: {shorten(x.get('msg', ''), 10**6)}"))
                if e.get("et_run", {}).get("status") in ("wrong", "crash"):
                    et.append((op, i, f"ET {b} .pte: et_run", f"{e['et_run']['status']}: {e['et_run'].get('msg', '')}"))
                if e.get("lower", {}).get("status") == "crash":
                    et.append((op, i, f"ET {b} lowering", f"crash: {e['lower'].get('msg', '')}"))
    return kiln, et


def write_report(jsonl: Path, md: Path):
    samples, notes, why = load(jsonl)
    meta = {}
    mp = Path(str(jsonl) + ".meta.json")
    if mp.is_file():
        meta = json.loads(mp.read_text())
    rows = []
    tot = Counter()
    missing = []  # (op, backend, kiln's error)
    et_unrun = []  # (op, backend, kiln's runtime error on ExecuTorch's .pte)
    for op, rs in samples.items():
        n = len(rs)
        exported = sum(1 for r in rs.values() if r.get("export", {}).get("status") == "ok")
        export_fail = sum(1 for r in rs.values() if r.get("export", {}).get("status") == "error")
        cells = [op, str(n), str(exported)]
        tot["samples"] += n
        tot["exported"] += exported
        tot["export_fail"] += export_fail
        for b in BACKENDS:
            kl = sum(1 for r in rs.values() if st(r, "kiln", b, "lower") == "ok")
            ke = sum(1 for r in rs.values() if st(r, "kiln", b, "et_run") == "ok")
            kk = sum(1 for r in rs.values() if st(r, "kiln", b, "kiln_run") == "ok")
            el = sum(1 for r in rs.values() if st(r, "et", b, "lower") == "ok")
            ee = sum(1 for r in rs.values() if st(r, "et", b, "et_run") == "ok")
            ek = sum(1 for r in rs.values() if st(r, "et", b, "kiln_run") == "ok")
            cells += [f"{kl}/{ke}/{kk}", f"{el}/{ee}/{ek}"]
            for k, v in zip(("kl", "ke", "kk", "el", "ee", "ek"), (kl, ke, kk, el, ee, ek)):
                tot[f"{b}_{k}"] += v
            if exported and ke == kk == exported:
                tot[f"{b}_kiln_ops"] += 1
            if exported and ee == exported:
                tot[f"{b}_et_ops"] += 1
            if ee > ke:
                errs = Counter(r.get(f"kiln_{b}", {}).get("lower", {}).get("msg")
                               or r.get(f"kiln_{b}", {}).get("et_run", {}).get("msg", "")
                               for r in rs.values()
                               if st(r, "et", b, "et_run") == "ok" and st(r, "kiln", b, "et_run") != "ok")
                msg = errs.most_common(1)[0][0] if errs else ""
                missing.append((op, b, ee, ke, shorten(msg)))
            if ee > ek:
                errs = Counter(r.get(f"et_{b}", {}).get("kiln_run", {}).get("msg", "")
                               for r in rs.values()
                               if st(r, "et", b, "et_run") == "ok" and st(r, "et", b, "kiln_run") != "ok")
                msg = errs.most_common(1)[0][0] if errs else ""
                et_unrun.append((op, b, ee, ek, shorten(msg)))
        note = notes.get(op, "")
        if not note and n and exported < n:
            reasons = Counter(r.get("export", {}).get("msg", "") for r in rs.values()
                              if r.get("export", {}).get("status") != "ok")
            note = "not exported: " + shorten(reasons.most_common(1)[0][0], 90)
        cells.append(esc(note))
        rows.append(cells)
    bugs = bugs_of(samples)

    category = meta.get("category", "ops")
    lines = [TITLES[category], ""]
    lines.append(f"Generated by `bench/coverage/report.py` from `{jsonl.name}`"
                 f" ({meta.get('date', '?')}); command: `{meta.get('command', 'bench/coverage/sweep.py')}`")
    lines.append(f"(--max-samples {meta.get('max_samples', '?')}, kiln binary `{meta.get('kiln_bin', '?')}`).")
    isa = {}
    ip = Path(str(jsonl) + ".isa.json")
    if ip.is_file():
        isa = json.loads(ip.read_text())
    lines.append(f"Machine: {isa_of(meta.get('kiln_bin'))}; kiln's kernels: ISA {isa.get('isa', '?')} "
                 f"(the CPU's best: {isa.get('best_isa', '?')}; `kiln bench --json`).")
    if meta.get("partial"):
        lines += ["", f"**PARTIAL SWEEP**: {meta['partial']}"]
    lines += ["", WHAT[category] + " is exported (`torch.export`, default IR), lowered by kiln (`kiln lower`) and by ExecuTorch (portable: `to_edge().to_executorch()`; xnnpack: "
              "`to_edge_transform_and_lower(XnnpackPartitioner())`), and each `.pte` runs in ExecuTorch's runtime "
              "and in kiln's (`kiln run`), compared with eager (float32: 1e-4·max|ref| + 1e-5; float16 / bfloat16 outputs: torch.testing's rtol of the dtype, 1e-3 / 1.6e-2, in place of 1e-4; ints/bools exact).",
              "",
              "Cells `L/E/K`: samples the producer **L**owers / whose .pte is correct in **E**xecuTorch's runtime /"
              " correct in **K**iln's runtime.", ""]
    lines.append("## Totals")
    lines.append("")
    lines.append(f"{len(samples)} operators, {tot['samples']} samples, {tot['exported']} exported "
                 f"({tot['export_fail']} that torch.export itself cannot export; the rest eager rejects or return "
                 "non-tensors).")
    lines.append("")
    lines.append("| backend | kiln lowers | kiln .pte correct in ET | kiln .pte correct in kiln | ET lowers | "
                 "ET .pte correct in ET | ET .pte correct in kiln |")
    lines.append("|---|---|---|---|---|---|---|")
    for b in BACKENDS:
        lines.append(f"| {b} | {tot[f'{b}_kl']} | {tot[f'{b}_ke']} | {tot[f'{b}_kk']} | {tot[f'{b}_el']} | "
                     f"{tot[f'{b}_ee']} | {tot[f'{b}_ek']} |")
    bugs, et_wrong = bugs
    lines.append("")
    lines.append("Operators with every exported sample correct: " + "; ".join(
        f"{b}: kiln {tot[f'{b}_kiln_ops']} (its .pte in both runtimes), ExecuTorch {tot[f'{b}_et_ops']} (its .pte in "
        "its runtime)" for b in BACKENDS) + ".")
    lines += ["", "## kiln bugs: crashes, hangs, wrong numbers, programs that do not run", ""]
    if bugs:
        lines.append("| operator | sample | where | what |")
        lines.append("|---|---|---|---|")
        for op, i, where, msg in bugs:
            lines.append(f"| {op} | {i} | {where} | {esc(shorten(msg, 200))} |")
    else:
        lines.append("None: no kiln crash, hang or wrong number in this run.")
    if et_wrong:
        lines += ["", "ExecuTorch's own wrong numbers and aborts (not kiln's):", "",
                  "| operator | sample | where | what |", "|---|---|---|---|"]
        for op, i, where, msg in et_wrong:
            lines.append(f"| {op} | {i} | {where} | {esc(shorten(msg, 160))} |")
    lines += ["", "## Operators ExecuTorch handles that kiln does not", "",
              "Per backend: samples whose ExecuTorch .pte is correct in ExecuTorch's runtime vs kiln's, and kiln's "
              "(most common) error.", "",
              "| operator | backend | ET correct | kiln correct | kiln's error |", "|---|---|---|---|---|"]
    for op, b, ee, ke, msg in merge_backends(missing):
        lines.append(f"| {op} | {b} | {ee} | {ke} | {esc(msg)} |")
    lines += ["", "## Samples ExecuTorch lowers that kiln refuses, and why", "",
              "Every one has a reason (`REFUSAL_REASONS` in bench/coverage/report.py); UNEXPLAINED marks a gap.", "",
              "| entry | backend | samples | kiln's error | reason |", "|---|---|---|---|---|"]
    for op, b, cnt, msg, reason in merge_backends(refusals_of(samples)):
        lines.append(f"| {op} | {b} | {cnt} | {esc(msg)} | {esc(reason)} |")
    lines += ["", "## ExecuTorch programs kiln's runtime does not run correctly", "",
              "Per backend: samples whose ExecuTorch .pte is correct in ExecuTorch's runtime vs in kiln's, and kiln's "
              "(most common) error.", "",
              "| operator | backend | correct in ET | correct in kiln | kiln's error |", "|---|---|---|---|---|"]
    for op, b, ee, ek, msg in merge_backends(et_unrun):
        lines.append(f"| {op} | {b} | {ee} | {ek} | {esc(msg)} |")
    lines += ["", "## Per operator", "",
              "| operator | samples | exported | kiln portable | ET portable | kiln xnnpack | ET xnnpack | note |",
              "|---|---|---|---|---|---|---|---|"]
    for c in rows:
        lines.append("| " + " | ".join(c) + " |")
    lines.append("")
    if md.is_file() and CATEGORY_BEGIN in md.read_text():  # keep COVERAGE.md's per-category section
        old = md.read_text()
        block = old[old.index(CATEGORY_BEGIN): old.index(CATEGORY_END) + len(CATEGORY_END)]
        at = lines.index("## kiln bugs: crashes, hangs, wrong numbers, programs that do not run")
        lines[at:at] = [block, ""]
    md.write_text("\n".join(lines))
    return md


TITLES = {"ops": "# Operator coverage: PyTorch OpInfo samples through kiln and ExecuTorch",
          "inplace": "# In-place coverage: OpInfo in-place variants through kiln and ExecuTorch",
          "modules": "# Module coverage: torch.nn modules (module_db) through kiln and ExecuTorch"}
WHAT = {"ops": "Each sample of `torch.testing._internal.common_methods_invocations.op_db` (float32; int/bool for "
               "operators without float32), as a one-operator program,",
        "inplace": "Each sample of an `op_db` operator that has an in-place variant (float32; int/bool for operators "
                   "without float32), inside a module that applies the in-place variant to an intermediate (a clone "
                   "of the input) and to a select view of another (row 1 of a stack of two copies) and returns the "
                   "intermediate and the view's base (bench/coverage/categories.py),",
        "modules": "Each sample of `torch.testing._internal.common_modules.module_db` (eval mode, float32; the "
                   "module's parameters and buffers as in a model) and of the parametrizations it lacks (weight norm; "
                   "bench/coverage/categories.py),"}


def totals_table(jsonl: Path) -> list[str]:
    """The totals of one results file: its sample counts and the per-backend table (COVERAGE.md's per-category
    section)."""
    samples, _, _ = load(jsonl)
    tot = Counter()
    for rs in samples.values():
        tot["samples"] += len(rs)
        tot["exported"] += sum(1 for r in rs.values() if r.get("export", {}).get("status") == "ok")
        for b in BACKENDS:
            for k, (prod, stage) in {"kl": ("kiln", "lower"), "ke": ("kiln", "et_run"), "kk": ("kiln", "kiln_run"),
                                     "el": ("et", "lower"), "ee": ("et", "et_run"), "ek": ("et", "kiln_run")}.items():
                tot[f"{b}_{k}"] += sum(1 for r in rs.values() if st(r, prod, b, stage) == "ok")
    lines = [f"{len(samples)} entries, {tot['samples']} samples, {tot['exported']} exported.", "",
             "| backend | kiln lowers | kiln .pte correct in ET | kiln .pte correct in kiln | ET lowers | "
             "ET .pte correct in ET | ET .pte correct in kiln |", "|---|---|---|---|---|---|---|"]
    for b in BACKENDS:
        lines.append(f"| {b} | {tot[f'{b}_kl']} | {tot[f'{b}_ke']} | {tot[f'{b}_kk']} | {tot[f'{b}_el']} | "
                     f"{tot[f'{b}_ee']} | {tot[f'{b}_ek']} |")
    refused = refusals_of(samples)
    unexplained = sorted({op for op, _, _, _, reason in refused if reason == "UNEXPLAINED"})
    lines += ["", f"Entries with samples ExecuTorch lowers and kiln refuses: {len({r[0] for r in refused})}, each with "
              "its reason in the full report" + (f"; UNEXPLAINED: {', '.join(unexplained)}" if unexplained else "") + "."]
    return lines


CATEGORY_BEGIN, CATEGORY_END = "<!-- categories -->", "<!-- /categories -->"


def write_categories(main_md: Path, reports: list[tuple[str, Path, str]]):
    """The per-category totals (category title, results file, its full report's path) in COVERAGE.md, between
    the category markers (replaced on a re-run; inserted before '## kiln bugs' the first time)."""
    lines = [CATEGORY_BEGIN, "## Per category", ""]
    for title, jsonl, md in reports:
        meta = json.loads(Path(str(jsonl) + ".meta.json").read_text())
        partial = "; " + meta["partial"] if meta.get("partial") else ""
        lines += [f"### {title}", "", f"Command: `{meta['command']}` ({meta['date']}{partial}). "
                  f"Full report, per entry and every kiln bug: [{md}]({md}).", ""]
        lines += totals_table(jsonl) + [""]
    lines.append(CATEGORY_END)
    text = main_md.read_text()
    block = "\n".join(lines)
    if CATEGORY_BEGIN in text:
        head, rest = text.split(CATEGORY_BEGIN, 1)
        text = head + block + rest.split(CATEGORY_END, 1)[1]
    else:
        head, sep, rest = text.partition("## kiln bugs")
        text = head + block + "\n\n" + sep + rest if sep else text + "\n" + block + "\n"
    main_md.write_text(text)


def merge_backends(rows):
    """One row 'both' where portable and xnnpack have the same counts and error."""
    out, seen = [], {}
    for op, b, *rest in rows:
        key = (op, *rest)
        if key in seen and out[seen[key]][1] != b:
            out[seen[key]] = (op, "both", *rest)
            continue
        seen[key] = len(out)
        out.append((op, b, *rest))
    return out


def esc(cell: str) -> str:
    return cell.replace("|", "\\|")


def shorten(msg: str, limit: int = 140) -> str:
    msg = re.sub(r"^kiln: error: (\S*?\.(pte|json): )?", "", msg or "")
    msg = re.sub(r" at sweep\.py:\d+", "", msg)
    msg = re.sub(r"kiln has no kernel or decomposition for this operator.*", "no kernel or decomposition", msg)
    msg = re.sub(r"method 'forward': ", "", msg)
    msg = re.sub(r"\s+", " ", msg)
    return msg if len(msg) <= limit else msg[: limit - 3] + "..."


if __name__ == "__main__":
    import sys

    write_report(Path(sys.argv[1]), Path(sys.argv[2]) if len(sys.argv) > 2 else Path("bench/COVERAGE.md"))
