"""kiln's runtime runs XNNPACK-delegated programs itself (its XnnpackBackend):
kiln's own and ExecuTorch's, and matches PyTorch eager.

Every run is checked against the outputs eager PyTorch produced at export
(DESIGN's fp32 tolerance). The backend has two engines (kiln's GEMM/GEMV and
fused rows, or Debian's XNNPACK for every node it implements) and a thread
pool; each is exercised.
Damaged payloads must give one clear line and a non-zero exit.
"""
from __future__ import annotations

import json
import os
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from executorch.exir._serialize._program import deserialize_pte_binary, serialize_pte_binary
from executorch.exir.schema import DataLocation

from conftest import assert_close, et_lower, export_model, kiln_lower, reference_io, run_kiln, spec_of
from inproc import run_pte, run_pte_cli

ALLOC_CHECK = Path(__file__).resolve().parents[2] / "build" / "kiln_alloc_check"


def kiln_run(pte: Path, inputs, tmp: Path, *extra: str, **kw) -> list[np.ndarray]:
    """What `kiln run PTE EXTRA` gives for the inputs: kiln's runtime in this process (the Python binding,
    tests/python/inproc.py) where it can, `kiln run` on .npy files otherwise (kw: subprocess options, e.g. env)."""
    return run_pte(pte, inputs, tmp, *extra, **kw)


@pytest.mark.parametrize("engine", ["kiln", "xnnpack"])
@pytest.mark.parametrize("producer", ["kiln", "executorch"])
def test_tiny_models_match_eager(tiny_model, producer, engine, tmp_path):
    """GPT-2, BERT and Llama graphs (layer norm, RMS norm, GELU, SiLU, rotary slices and
    concatenations, masks), through kiln's fused rows and GEMMs or through XNNPACK."""
    pte = kiln_lower(tiny_model, "xnnpack") if producer == "kiln" else et_lower(tiny_model, "xnnpack")
    ins, refs = reference_io(tiny_model)
    s = spec_of(tiny_model)
    for o, r in zip(kiln_run(pte, ins, tmp_path, "--engine", engine), refs, strict=True):
        assert_close(o, r, f"{producer} XNNPACK .pte of {s['name']} ({s['ir']}) in kiln's runtime, --engine {engine}")


@pytest.mark.parametrize("engine", ["xnnpack", "kiln"])
@pytest.mark.parametrize("threads", ["1", "2"])
@pytest.mark.parametrize("producer", ["kiln", "executorch"])
def test_engines_and_threads(tiny_gpt2, producer, engine, threads, tmp_path):
    """Both engines, with and without the thread pool."""
    pte = kiln_lower(tiny_gpt2, "xnnpack") if producer == "kiln" else et_lower(tiny_gpt2, "xnnpack")
    ins, refs = reference_io(tiny_gpt2)
    out = kiln_run(pte, ins, tmp_path, "--engine", engine, "--threads", threads)[0]
    assert_close(out, refs[0], f"{producer} tiny GPT-2, --engine {engine} --threads {threads}")


@pytest.fixture(scope="module", params=[1, 5])
def tiny_gpt2_few_tokens(request, tmp_path_factory) -> Path:
    """Tiny GPT-2 at seq_len 1 and 5: fully-connected nodes with fewer than 16 rows,
    which the backend runs as streaming GEMVs (the LM head too)."""
    out = tmp_path_factory.mktemp(f"gpt2_tiny_seq{request.param}")
    return export_model(out, "--config", "tiny", "--seq-len", str(request.param))


@pytest.mark.parametrize("engine", ["kiln", "xnnpack"])
@pytest.mark.parametrize("producer", ["kiln", "executorch"])
def test_few_tokens_match_eager(tiny_gpt2_few_tokens, producer, engine, tmp_path):
    spec = tiny_gpt2_few_tokens
    pte = kiln_lower(spec, "xnnpack") if producer == "kiln" else et_lower(spec, "xnnpack")
    ins, refs = reference_io(spec)
    out = kiln_run(pte, ins, tmp_path, "--engine", engine, "--threads", "2")[0]
    assert_close(out, refs[0], f"{producer} tiny GPT-2 seq_len {ins[0].shape[1]}, --engine {engine}")


class SoftCapGelu(torch.nn.Module):
    """Gemma's final logit soft cap, then a per-row scale and a tanh GELU: one chain of elementwise
    operations over rows far wider than the fused rows' 512-column chunks."""

    def __init__(self, rows: int):
        super().__init__()
        self.register_buffer("scale", torch.linspace(0.5, 1.5, rows).reshape(rows, 1))

    def forward(self, x):
        y = torch.tanh(x / 30.0) * 30.0 * self.scale
        return torch.nn.functional.gelu(y, approximate="tanh") + x


@pytest.mark.parametrize("rows,cols", [(1, 40000), (3, 10000)])
def test_long_elementwise_rows_split_over_threads(rows, cols, tmp_path):
    """Fewer rows than the pool has tasks, each row tens of thousands wide (a one-token LM head's logits
    through Gemma's soft cap): the tasks split the rows' column chunks, also across row ends (3 x 10000:
    7 tasks over 60 chunks, the last chunk of each row part-full). Eager's outputs at 1 and 2 threads, and
    the same bits at both (every element gets the same operations in the same order)."""
    from test_xnnpack_lowering import export_module
    torch.manual_seed(0)
    spec = export_module(SoftCapGelu(rows), torch.randn(rows, cols) * 40.0, tmp_path / "softcap", "softcap")
    pte = kiln_lower(spec, "xnnpack")
    ins, refs = reference_io(spec)
    # `kiln run` in fresh processes: an output the chain failed to write would hold no earlier call's values
    two = run_pte_cli(pte, ins, tmp_path, "--threads", "2")[0]
    one = run_pte_cli(pte, ins, tmp_path, "--threads", "1")[0]
    assert_close(one, refs[0], f"soft cap + GELU chain {rows}x{cols}, 1 thread")
    assert_close(two, refs[0], f"soft cap + GELU chain {rows}x{cols}, 2 threads")
    assert np.array_equal(one, two), f"{rows}x{cols}: 1 and 2 threads differ"


def test_per_op_program_matches_eager(tiny_gpt2, tmp_path):
    """One delegate per node: many small payloads, values crossing delegate boundaries (through `kiln run`
    itself, the CLI's own test in this file)."""
    pte = tmp_path / "gpt2_xnnpack_per_op.pte"
    run_kiln("lower", "--spec", tiny_gpt2, "--backend", "xnnpack", "--per-op", "--out", pte, "-q")
    ins, refs = reference_io(tiny_gpt2)
    assert_close(run_pte_cli(pte, ins, tmp_path)[0], refs[0], "per-op tiny GPT-2 in kiln's runtime (kiln run)")


@pytest.mark.parametrize("engine", ["kiln", "xnnpack"])
@pytest.mark.parametrize("producer", ["kiln", "executorch"])
def test_gpt2_small_matches_eager(gpt2_small, producer, engine, tmp_path):
    pte = kiln_lower(gpt2_small, "xnnpack") if producer == "kiln" else et_lower(gpt2_small, "xnnpack")
    ins, refs = reference_io(gpt2_small)
    out = kiln_run(pte, ins, tmp_path, "--threads", "2", "--engine", engine)[0]
    assert_close(out, refs[0], f"{producer} XNNPACK GPT-2 small ({spec_of(gpt2_small)['ir']}) in kiln's runtime, "
                               f"--engine {engine}")


@pytest.mark.parametrize("config", ["KILN_FMA512_PIPES=1", "KILN_FMA512_PIPES=2", "KILN_CPU_ISA=avx2"])
def test_tied_lm_head_packed_once_matches_eager(tiny_gpt2, config, tmp_path):
    """The tied LM head of a static program with many rows (16 here). Where the selected GEMM packs its B
    once (the AVX-512 tiles: 4x64, or 6x64 where KILN_FMA512_PIPES=2 on a CPU with AVX-512), the table is
    packed as Wᵀ's panels at the first call and the logits written in rows; elsewhere (the AVX2 tile, forced
    with KILN_CPU_ISA=avx2) W · xᵀ is transposed. Both match eager, at the first call and the next (which
    reads the packed copy), and the profile names the path the configuration `kiln --version` reports
    selects."""
    name, value = config.split("=")
    env = dict(os.environ, **{name: value})
    pte = kiln_lower(tiny_gpt2, "xnnpack")
    ins, refs = reference_io(tiny_gpt2)
    np.save(tmp_path / "ids.npy", ins[0])
    run_kiln("run", pte, "--steps", "2", "--threads", "2", "--input", tmp_path / "ids.npy", "--input",
             tmp_path / "ids.npy", "--output", tmp_path / "first.npy", "--output", tmp_path / "second.npy", env=env)
    for call in ("first", "second"):
        assert_close(np.load(tmp_path / f"{call}.npy"), refs[0], f"tiny GPT-2, {call} call, {config}")
    version = run_kiln("--version", env=env).stdout
    packs_once = "f32_gemm_6x64__avx512" in version or "f32_gemm_4x64__avx512" in version
    profile = run_kiln("profile", pte, "-i", tmp_path / "ids.npy", "--iters", "2", env=env).stdout
    assert ("kiln LM head (x · Wᵀ, W packed once)" in profile) == packs_once, profile
    assert ("kiln LM head (x · Wᵀ, tiled)" in profile) == (not packs_once), profile


@pytest.mark.parametrize("engine", ["kiln", "xnnpack"])
def test_bench_reports_the_backends_steps(tiny_gpt2, engine):
    """`kiln bench --profile` on a delegated program breaks the delegate into its steps:
    with --engine xnnpack, XNNPACK's nodes and kiln's for the rest; with kiln's engine,
    its fused rows and GEMMs."""
    pte = kiln_lower(tiny_gpt2, "xnnpack")
    j = json.loads(run_kiln("bench", pte, "--iters", "3", "--threads", "2", "--profile", "--engine", engine,
                            "--json").stdout)
    for key in ("load_ms", "first_run_ms", "median_ms", "min_ms", "peak_rss_mb"):
        assert j[key] > 0, key
    labels = set(j["profile"])
    if engine == "xnnpack":
        assert any(k.startswith("XnnpackBackend: xnnpack FullyConnected") for k in labels), labels
        assert any(k.startswith("XnnpackBackend: kiln batch matmul") for k in labels), labels  # the library lacks it
    else:
        assert not any(k.startswith("XnnpackBackend: xnnpack ") for k in labels), labels
        assert any(k.startswith("XnnpackBackend: kiln fused rows:") for k in labels), labels
        assert any(k.startswith("XnnpackBackend: kiln fully connected") for k in labels), labels
        # transformers' tanh GELU (nine operations in the graph) runs as one: the chain's own tanh is gone
        assert any(k.startswith("XnnpackBackend: kiln fused rows: gelu_tanh") for k in labels), labels
        assert not any(" tanh" in k for k in labels), labels
        # and attention's scaling, mask and softmax as one (GPT-2's outputs against eager: the tests above)
        assert any(k.startswith("XnnpackBackend: kiln fused rows: scaled_softmax") for k in labels), labels
        assert not any(" softmax" in k for k in labels), labels
    assert all(v["ms_per_run"] >= 0 and v["calls"] >= 1 for v in j["profile"].values())


def test_execute_allocates_no_heap_memory(tiny_gpt2):
    pte = kiln_lower(tiny_gpt2, "xnnpack")
    proc = subprocess.run([str(ALLOC_CHECK), str(pte)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["hook_counted"] >= 1
    assert result["allocations_during_execute"] == 0


# ---------------------------------------------------------------- damaged payloads

def _payload(pte_bytes: bytes):
    """(program, payload bytes, where they live) of the first delegate."""
    f = deserialize_pte_binary(pte_bytes)
    prog = f.program
    proc = prog.execution_plan[0].delegates[0].processed
    assert proc.location == DataLocation.INLINE, "kiln stores payloads inline"
    return f, prog.backend_delegate_data[proc.index]


def _rewrite_payload(pte: Path, out: Path, edit) -> Path:
    f, blob = _payload(pte.read_bytes())
    blob.data = edit(bytearray(blob.data))
    out.write_bytes(bytes(serialize_pte_binary(f)))
    return out


def _flatbuffer_field_edit(data: bytearray) -> bytearray:
    """Points the first node's first stored value id at a value that does not exist
    (the flatbuffer stays valid; only the graph is wrong). Walks the flatbuffer by
    the schema's field slots: XNNGraph.xnodes is field 1, XNode.xnode_union field 1."""
    fb_off = struct.unpack_from("<I", data, 10)[0]
    root = fb_off + struct.unpack_from("<I", data, fb_off)[0]
    vt = root - struct.unpack_from("<i", data, root)[0]
    xnodes_field = struct.unpack_from("<H", data, vt + 4 + 2 * 1)[0]  # field 1: xnodes
    vec = root + xnodes_field + struct.unpack_from("<I", data, root + xnodes_field)[0]
    node0 = vec + 4 + struct.unpack_from("<I", data, vec + 4)[0]
    nvt = node0 - struct.unpack_from("<i", data, node0)[0]
    union_field = struct.unpack_from("<H", data, nvt + 4 + 2 * 1)[0]  # field 1: xnode_union (field 0 is its type)
    table = node0 + union_field + struct.unpack_from("<I", data, node0 + union_field)[0]
    tvt = table - struct.unpack_from("<i", data, table)[0]
    vt_len = struct.unpack_from("<H", data, tvt)[0]
    for slot in range(min(3, (vt_len - 4) // 2)):  # the first present id field
        field = struct.unpack_from("<H", data, tvt + 4 + 2 * slot)[0]
        if field:
            struct.pack_into("<I", data, table + field, 0x00FFFFF0)
            return data
    raise AssertionError("the first node stores no value id")


DAMAGE = {
    "truncated header": lambda d: d[:20],
    "flatbuffer outside payload": lambda d: d[:14] + struct.pack("<I", 1 << 30) + d[18:],
    "corrupt flatbuffer": lambda d: d[:struct.unpack_from("<I", d, 10)[0]] + bytes(64) + d[struct.unpack_from("<I", d, 10)[0] + 64:],
    "undefined value id": _flatbuffer_field_edit,
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_damaged_payload_is_one_clear_error(tiny_gpt2, damage, tmp_path):
    pte = kiln_lower(tiny_gpt2, "xnnpack")
    bad = _rewrite_payload(pte, tmp_path / "bad.pte", DAMAGE[damage])
    ins, _ = reference_io(tiny_gpt2)
    np.save(tmp_path / "in.npy", ins[0])
    out = tmp_path / "out.npy"
    proc = run_kiln("run", bad, "--input", tmp_path / "in.npy", "--output", out, check=False)
    assert proc.returncode == 1, (proc.returncode, proc.stderr[-2000:])
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "XnnpackBackend" in lines[0], proc.stderr
    assert not out.exists()


def test_damaged_payloads_never_crash(tiny_gpt2, tmp_path):
    """Seeded byte and word damage all over the payload's header and graph, run by the
    sanitizer build: every run ends with the eager answer's shape or one error line."""
    import random

    from test_runtime_robustness import Case, _asan_bin, _assert_no_problems, run_cases

    asan = _asan_bin()
    pte = kiln_lower(tiny_gpt2, "xnnpack")
    f, blob = _payload(pte.read_bytes())
    original = bytes(blob.data)
    fb_end = struct.unpack_from("<I", original, 10)[0] + struct.unpack_from("<I", original, 14)[0]
    rng = random.Random(6)
    cases = []
    for n in range(120):
        d = bytearray(original)
        if n % 2:
            pos = rng.randrange(0, fb_end - 4) & ~3
            struct.pack_into("<I", d, pos, rng.choice([0, 1, 0xFFFFFFFF, 0x7FFFFFFF, rng.randrange(1 << 32)]))
            what = f"word at {pos}"
        else:
            pos = rng.randrange(0, fb_end)
            d[pos] ^= 1 << rng.randrange(8)
            what = f"bit flip at {pos}"
        blob.data = bytes(d)
        cases.append(Case(f"payload{n}", bytes(serialize_pte_binary(f)), what))
    ins, _ = reference_io(tiny_gpt2)
    np.save(tmp_path / "ids.npy", ins[0])
    tally = run_cases(asan, tmp_path / "ids.npy", cases, tmp_path)
    _assert_no_problems(tally)
    assert tally["ok"] + tally["error"] == len(cases)
    assert tally["error"] > 0  # the damage reached the backend's checks
