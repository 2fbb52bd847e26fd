"""`kiln lower` quantizes weights and embedding tables on several threads (KILN_LOWER_THREADS, default the CPU's
cores): linear weights stream from the .pt2 in blocks of rows that worker threads quantize while the next block is
read, and a table's next block is read while this one is quantized and written. Invariant: the file does not
depend on it. The same tiny Gemma 4 (every feature of E2B: 8da4w linear layers, the tied LM head, both int4
embedding tables streamed from the .pt2), bf16 as E2B is (torchao's bf16 arithmetic) and fp32 (kiln's vectorised
fp32 path, also with mse scales), lowered with one thread and the usual blocks, and with two and three threads
and blocks of a few rows (KILN_LOWER_BLOCK_BYTES, so that the tiny model takes many blocks, some partial): the
files are byte for byte the same. The file's SHA-256 in its metadata against hashlib's."""
from __future__ import annotations

import hashlib
import json
import os

import pytest

from conftest import run_kiln
from test_gemma4 import _export


_SPECS = {}


def _spec(dtype, tmp_path_factory):
    """The tiny Gemma 4 exported once per dtype, in the deployed form (external caches, dynamic)."""
    if dtype not in _SPECS:
        out = tmp_path_factory.mktemp(f"gemma4_threads_{dtype}")
        _SPECS[dtype] = _export(out, "--cache", "external", "--dynamic", "--dtype", dtype)
    return _SPECS[dtype]


def _lower(spec, out, threads, block_bytes, *extra):
    env = dict(os.environ, KILN_LOWER_THREADS=str(threads))
    env.pop("KILN_LOWER_BLOCK_BYTES", None)
    if block_bytes:
        env["KILN_LOWER_BLOCK_BYTES"] = str(block_bytes)
    run_kiln("lower", "--spec", spec, "--recipe", "llm-int4", *extra, "--out", out, "-q", env=env)
    return out.read_bytes()


# bf16 under mse takes the fp32 path (the search runs in fp32): fp32 covers it
@pytest.mark.parametrize("dtype,scales", [("bf16", "minmax"), ("fp32", "minmax"), ("fp32", "mse")])
def test_threads_and_blocks_write_the_same_bytes(dtype, scales, tmp_path_factory, tmp_path):
    path = _spec(dtype, tmp_path_factory)
    extra = ("--quantize-scales", scales)
    one = _lower(path, tmp_path / "one.pte", 1, 0, *extra)
    meta = json.loads((tmp_path / "one.json").read_text())
    # what the file holds: int4 linear layers and both tables as int4 lookups, streamed from the .pt2
    assert meta["delegation"]["quantization"].startswith("8da4w:32"), meta["delegation"]
    assert meta["delegation"]["quantized_nodes"] > 0, meta["delegation"]
    e = meta["embedding_quantization"]
    assert (e["scheme"], len(e["streamed_while_writing"])) == ("4:32", 2), e
    # the SHA-256 kiln computes as it writes (the x86 SHA instructions where the CPU has them) is hashlib's
    assert meta["pte_sha256"] == hashlib.sha256(one).hexdigest()
    # rows of a few hundred bytes, so blocks of 1000 and 2900 bytes hold 1-3 rows and most weights take many blocks
    for threads, block in ((2, 2900), (3, 1000), (2, 0)):
        other = _lower(path, tmp_path / f"t{threads}_{block}.pte", threads, block, *extra)
        assert len(other) == len(one) and other == one, \
            f"{dtype} {scales}: KILN_LOWER_THREADS={threads} KILN_LOWER_BLOCK_BYTES={block} wrote other bytes"


@pytest.mark.parametrize("value", ["0", "two", "65"])
def test_bad_thread_count_is_one_error(value, tmp_path_factory, tmp_path):
    path = _spec("bf16", tmp_path_factory)
    out = tmp_path / "x.pte"
    proc = run_kiln("lower", "--spec", path, "--recipe", "llm-int4", "--out", out, "-q", check=False,
                    env=dict(os.environ, KILN_LOWER_THREADS=value))
    assert proc.returncode == 1, proc
    assert proc.stderr.strip().splitlines() == [
        f"kiln: error: KILN_LOWER_THREADS={value}: expected a number of threads from 1 to 64"], proc.stderr
    assert not out.exists()
