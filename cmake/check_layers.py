#!/usr/bin/env python3
"""Layer check (ctest `layer_boundaries`): every #include in src/ and include/kiln/
must be allowed by the dependency table below, and no file may include another
library's private headers (headers under src/ belong to the directory they sit
in). Fails listing each offending line.

Rules, by path prefix (the longest matching prefix applies):
  kiln/<dir>/...   public headers a library may include, as include prefixes
  "x.h" (quoted, not kiln/...) must be a file of the including file's own
                   library (resolved against the including file's directory or
                   its library's root; the longest table prefix is the library): private headers stay private.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(sys.argv[1]).resolve() if len(sys.argv) > 1 else Path(__file__).resolve().parents[1]

CORE = ("kiln/core/",)
FRONT = CORE + ("kiln/graph/", "kiln/pt2/")
RUNTIME_API = ("kiln/core/dtype.h", "kiln/runtime/", "kiln/format/")

ALLOWED: dict[str, tuple[str, ...]] = {
    "src/core/": CORE,
    "include/kiln/core/": CORE,
    "src/cpu/": CORE + ("kiln/cpu/",),
    "include/kiln/cpu/": CORE + ("kiln/cpu/",),
    "src/graph/": FRONT,
    "include/kiln/graph/": FRONT,
    "src/pt2/": FRONT,
    "include/kiln/pt2/": FRONT,
    "src/io/": CORE + ("kiln/io/",),
    # the tokenizer: its own header only (no runtime or compiler dependency)
    "src/tokenizer/": ("kiln/tokenizer/",),
    "src/llm/": ("kiln/llm/", "kiln/tokenizer/", "kiln/runtime/"),
    "include/kiln/llm/": ("kiln/llm/", "kiln/tokenizer/", "kiln/runtime/"),
    "include/kiln/tokenizer/": (),
    "include/kiln/io/": CORE + ("kiln/io/",),
    # passes fold constants with kiln's kernels through the runtime's kernel API
    "src/passes/": FRONT + ("kiln/passes/", "kiln/ops/", "kiln/runtime/kernel.h", "kiln/runtime/evalue.h", "kiln/runtime/tensor.h",
                            "kiln/runtime/status.h"),
    "include/kiln/passes/": FRONT + ("kiln/passes/",),
    # the writer: its model, the shared frame, the generated schema
    "src/pte/": CORE + ("kiln/pte/", "kiln/format/", "kiln/fb/"),
    "include/kiln/pte/": CORE + ("kiln/pte/", "kiln/format/"),
    # emit consumes the partitioner's region type, nothing else of partition
    "src/emit/": FRONT + ("kiln/passes/", "kiln/pte/", "kiln/emit/", "kiln/partition/delegated_region.h"),
    "include/kiln/emit/": FRONT + ("kiln/passes/", "kiln/pte/", "kiln/emit/", "kiln/partition/delegated_region.h"),
    # the generic partitioner: no backend in it
    "src/partition/": FRONT + ("kiln/passes/", "kiln/pte/", "kiln/partition/"),
    "include/kiln/partition/": FRONT + ("kiln/passes/", "kiln/pte/", "kiln/partition/"),
    # the XNNPACK ahead-of-time half: its partitioner over the generic one, support table, payload builder
    "src/backends/xnnpack/aot/": FRONT + ("kiln/passes/", "kiln/pte/", "kiln/partition/", "kiln/backends/xnnpack/payload.h",
                                          "kiln/backends/xnnpack/support.h", "kiln/backends/xnnpack/quantize.h",
                                          "kiln/backends/xnnpack/partitioner.h", "kiln/fb/"),
    "include/kiln/backends/xnnpack/partitioner.h": FRONT + ("kiln/passes/", "kiln/pte/", "kiln/partition/",
                                                            "kiln/backends/xnnpack/payload.h"),
    "include/kiln/backends/xnnpack/payload.h": FRONT + ("kiln/passes/", "kiln/pte/", "kiln/backends/xnnpack/"),
    "include/kiln/backends/xnnpack/support.h": FRONT + ("kiln/passes/", "kiln/backends/xnnpack/"),
    "include/kiln/backends/xnnpack/quantize.h": FRONT,
    "include/kiln/backends/xnnpack/runtime.h": RUNTIME_API,
    # the XNNPACK backend: the runtime's API, the compute layer, its payload schema
    "src/backends/xnnpack/runtime/": RUNTIME_API + ("kiln/cpu/", "kiln/backends/xnnpack/runtime.h", "kiln/fb/"),
    # the runtime's public headers: no writer header, no generated header
    "include/kiln/runtime/": RUNTIME_API,
    # the executor: its API and the generated .pte schema; never a kernel
    # (the operator table: the debug-output log names a kernel call's out arguments by its schema)
    "src/runtime/": RUNTIME_API + ("kiln/fb/", "kiln/ops/"),
    # kiln::Module (the kiln_runtime library an application links): the executor's API and the
    # backends it registers, above both
    "src/module/": RUNTIME_API + ("kiln/backends/xnnpack/runtime.h",),
    # the operator table: shared by the compiler and the kernels
    "src/ops/": ("kiln/ops/",),
    "include/kiln/ops/": ("kiln/ops/",),
    # the portable kernels: the runtime's API, the operator table, the compute layer
    "src/kernels/": RUNTIME_API + ("kiln/cpu/", "kiln/ops/"),
    "include/kiln/format/": (),
    "src/compiler/": FRONT + ("kiln/passes/", "kiln/pte/", "kiln/emit/", "kiln/partition/", "kiln/compiler/",
                              "kiln/runtime/", "kiln/format/", "kiln/backends/xnnpack/runtime.h",
                              "kiln/backends/xnnpack/partitioner.h",
                              # --calibrate: the text's tokens and the quantizer's scale search; --etrecord: the
                              # spec's reference inputs and outputs (.npy)
                              "kiln/backends/xnnpack/quantize.h", "kiln/tokenizer/", "kiln/io/"),
    "include/kiln/compiler/": FRONT + ("kiln/passes/", "kiln/pte/", "kiln/emit/", "kiln/partition/", "kiln/compiler/",
                                       "kiln/backends/xnnpack/partitioner.h", "kiln/backends/xnnpack/quantize.h"),
    "src/cli/": ("kiln/",),  # the front end may use every library's public headers
    "src/python/": ("kiln/",),  # the Python package's extension module, a front end like the CLI
    # the graph view (kiln view): reads .pt2 and .pte files (the runtime's verified loader,
    # the generated program and XNNPACK payload schemas, the operator table for out arguments)
    "src/view/": FRONT + ("kiln/view/", "kiln/runtime/pte_file.h", "kiln/runtime/status.h", "kiln/format/",
                          "kiln/fb/", "kiln/ops/"),
    "include/kiln/view/": ("kiln/view/",),
}

INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.M)


def rule_for(rel: str) -> tuple[str, tuple[str, ...]] | None:
    best = None
    for prefix, allowed in ALLOWED.items():
        if rel.startswith(prefix) and (best is None or len(prefix) > len(best[0])):
            best = (prefix, allowed)
    return best


def selftest() -> int:
    """The check must catch what it is for: copy the tree, break one rule of each kind, expect each reported."""
    import shutil
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        for d in ("src", "include"):
            shutil.copytree(ROOT / d, Path(tmp) / d)
        breaks = {
            "include/kiln/runtime/pte_file.h": '#include "kiln/fb/kiln_program_generated.h"',
            "src/runtime/program.cpp": '#include "../kernels/util/kernel_util.h"',
            "src/partition/partitioner.cpp": '#include "kiln/emit/emitter.h"',
            "src/cpu/f32-gemm/sgemm.cpp": '#include "kiln/runtime/tensor.h"',
        }
        for f, line in breaks.items():
            with open(Path(tmp) / f, "a") as out:
                out.write("\n" + line + "\n")
        proc = subprocess.run([sys.executable, __file__, tmp], capture_output=True, text=True)
        missed = [f for f in breaks if f not in proc.stdout]
        if proc.returncode == 0 or missed:
            print(f"selftest: the check missed {missed or 'everything'}:\n{proc.stdout}")
            return 1
    print(f"selftest: all {len(breaks)} injected violations reported")
    return 0


def library_of(rel: str) -> str | None:
    """The directory rule a file falls under: src/runtime/kernels/ is not src/runtime/."""
    dirs = [p for p in ALLOWED if p.endswith("/") and rel.startswith(p)]
    return max(dirs, key=len) if dirs else None


def main() -> int:
    errors: list[str] = []
    files = [p for d in ("src", "include/kiln") for p in (ROOT / d).rglob("*") if p.suffix in (".h", ".cpp", ".cc")]
    for path in sorted(files):
        rel = path.relative_to(ROOT).as_posix()
        rule = rule_for(rel)
        if rule is None:
            errors.append(f"{rel}: no rule in cmake/check_layers.py's table (add the directory)")
            continue
        _, allowed = rule
        text = path.read_text(errors="replace")
        for m in INCLUDE.finditer(text):
            inc = m.group(1)
            line = text.count("\n", 0, m.start()) + 1
            if inc.startswith("kiln/"):
                if not any(inc == a or (a.endswith("/") and inc.startswith(a)) for a in allowed):
                    errors.append(f"{rel}:{line}: includes {inc}, which its layer may not use")
                continue
            # relative to the file, or to its library's root (a library's own include directory)
            lib = library_of(rel)
            candidates = [(path.parent / inc).resolve()] + ([(ROOT / lib / inc).resolve()] if lib else [])
            same_library = any(t.is_file() and ROOT in t.parents and library_of(t.relative_to(ROOT).as_posix()) == lib
                               for t in candidates)
            if not same_library:
                errors.append(f"{rel}:{line}: includes \"{inc}\": a private header must sit in the including file's "
                              "own directory (another library's private headers are off limits)")
    for e in errors:
        print(e)
    if errors:
        print(f"{len(errors)} layer violation(s)")
        return 1
    print(f"layer check: {len(files)} files, every include allowed")
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[2] == "--selftest":
        sys.exit(selftest())
    sys.exit(main())
