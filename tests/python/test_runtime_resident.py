"""kiln's runtime maps a .pte and reads its constants in place: an embedding lookup brings into memory the rows of
the tokens it gathers, not the table (issue 38: Gemma 4 E2B's per-layer table is 2.35 B elements, and
`kiln generate` on it must stay within 1.8 GB).

A tiny model whose two embedding tables (a token table and a Gemma-4-style per-layer input table, 50 MB in fp32)
are nearly all of the file, lowered by kiln for the portable backend and for XNNPACK (fp32 tables; its linear
weights copied into the backend's weight memory), and for the portable backend with `--quantize-embedding 8`
(int8 tables, ExecuTorch's embedding_byte lookups), then run in kiln's runtime (kiln.load, in this process) over a
few calls with different tokens. Oracle: PyTorch eager on the same tokens (fp32 tables), ExecuTorch's runtime on
the same file (int8 tables), to DESIGN's fp32 tolerance. Invariant:
the program file's mapping, read from /proc/self/smaps after the calls, holds far fewer resident bytes than the
tables (the pages of the rows read, plus the program's flatbuffer and small constants), where a runtime that
copied, converted or scanned a table at load would hold all of it.
"""
from __future__ import annotations

import ctypes
import os
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import REPO, assert_close

PACKAGE = Path(os.environ.get("KILN_BIN", REPO / "build" / "kiln")).resolve().parent / "python"
if not any((PACKAGE / "kiln").glob("_kiln*.so")):
    raise RuntimeError(f"kiln's Python module is not built under {PACKAGE}/kiln (scripts/build builds it)")
sys.path.insert(0, str(PACKAGE))
import kiln  # noqa: E402

VOCAB = 32768
DIM = 64
PER_LAYER = 320  # five "layers" of 64, as Gemma 4's per-layer table [vocab, layers * width]
CALLS = [[3, 17, 42, 5, 30001, 7, 11, 200], [1000, 2, 9, 16384, 77, 5, 5, 31000], [12, 24000, 4, 8, 15, 16, 23, 42]]


def _model():
    import torch

    class TwoTables(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(VOCAB, DIM)
            self.per_layer = torch.nn.Embedding(VOCAB, PER_LAYER)
            self.proj = torch.nn.Linear(PER_LAYER, DIM)
            self.out = torch.nn.Linear(DIM, 32)

        def forward(self, tokens):
            h = self.embed(tokens) + self.proj(self.per_layer(tokens))
            return self.out(torch.nn.functional.gelu(h))

    torch.manual_seed(0)
    return TwoTables().eval()


def _resident_kb(path: Path) -> int:
    """Rss (kB) of this process's mappings of `path`, from /proc/self/smaps."""
    total, inside = 0, False
    target = str(path.resolve())
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split(maxsplit=5)
            if len(head) >= 5 and "-" in head[0] and not head[0].endswith(":"):
                inside = len(head) == 6 and head[5].strip() == target
            elif inside and head and head[0] == "Rss:":
                total += int(head[1])
    return total


def _cached_fraction(path: Path) -> float:
    """The fraction of the file's pages in the page cache (mincore on a fresh read-only mapping)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    size, page = path.stat().st_size, os.sysconf("SC_PAGE_SIZE")
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = libc.mmap(None, size, 1, 1, fd, 0)  # PROT_READ, MAP_SHARED
        assert addr not in (None, ctypes.c_void_p(-1).value), "mmap failed"
        vec = ctypes.create_string_buffer((size + page - 1) // page)
        try:
            assert libc.mincore(addr, size, vec) == 0, "mincore failed"
        finally:
            libc.munmap(addr, size)
    finally:
        os.close(fd)
    return sum(b & 1 for b in vec.raw) / len(vec.raw)


def _drop_from_page_cache(path: Path) -> None:
    """Writes the file back and drops its pages from the page cache, so that what a mapping of it holds
    afterwards is what was read through it (a cached file's pages are mapped in blocks around each fault,
    whose size depends on the kernel and the filesystem: up to 2 MiB with large folios)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    if _cached_fraction(path) > 0.05:
        pytest.skip(f"this filesystem keeps {path.name} in memory after POSIX_FADV_DONTNEED (tmpfs?): what a run "
                    f"reads cannot be told from what is cached")


FORMS = {  # form: kiln.lower's arguments
    "portable": dict(backend="portable"),
    "xnnpack": dict(backend="xnnpack"),
    "portable-int8-tables": dict(backend="portable", quantize_embedding="8"),
}


@pytest.mark.parametrize("form", list(FORMS))
def test_lookups_touch_rows_not_tables(form, tmp_path):
    import torch

    from conftest import et_execute

    model = _model()
    ep = torch.export.export(model, (torch.tensor([CALLS[0]]),))
    pte = tmp_path / "two_tables.pte"
    kiln.lower(ep, **FORMS[form]).write(pte)
    table_bytes = VOCAB * (DIM + PER_LAYER) * (1 if "int8" in form else 4)
    assert pte.stat().st_size > table_bytes  # the tables are in the file (and nearly all of it)

    _drop_from_page_cache(pte)
    module = kiln.load(pte)
    for call in CALLS:
        tokens = np.array([call], dtype=np.int64)
        got = module.forward(tokens)[0]
        if "int8" in form:  # the tables the file holds are int8: ExecuTorch's runtime on the same file
            import executorch.kernels.quantized  # noqa: F401  registers quantized_decomposed::embedding_byte

            ref = et_execute(pte, [tokens])[0]
        else:
            with torch.no_grad():
                ref = model(torch.from_numpy(tokens)).numpy()
        assert_close(got, ref, f"{form} two-table model, tokens {call}")

    resident = _resident_kb(pte) * 1024
    assert resident > 0, "the program file is not mapped by this process (the measurement would prove nothing)"
    # Each row read faults in its pages (no readahead: the runtime advises gathered tables MADV_RANDOM) and at
    # most the kernel's fault-around window (64 KiB of cached pages) of each table; the flatbuffer and the
    # program's other constants are under 1 MiB. A runtime that copied, converted or scanned a table would
    # hold all of it.
    rows = len({t for call in CALLS for t in call})
    bound = rows * 2 * (64 << 10) + (1 << 20)
    assert table_bytes > 3 * bound  # the bound tells reading rows from reading the tables
    assert resident <= bound, (
        f"{form}: {resident} bytes of the {pte.stat().st_size}-byte program are resident after {len(CALLS)} calls "
        f"reading {rows} rows of each table (at most {bound} expected; the tables are {table_bytes} bytes): the "
        f"runtime touched whole tables, not the rows read")
    del module
