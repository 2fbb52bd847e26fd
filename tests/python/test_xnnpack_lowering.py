"""kiln lower --backend xnnpack: ExecuTorch 1.5's runtime (its XnnpackBackend)
runs kiln's delegated .pte and matches PyTorch eager; the transformer is one
delegate region; no byte-identical constant or named-data blob is stored
twice; GPT-2 small is counted against ExecuTorch's own XNNPACK lowering.

How kiln stores weights (the rule these tests hold it to): every distinct
content has one home. Bytes a portable kernel reads live in the constant
segment, and a delegate that reads the same bytes gets them as a call input
(GPT-2's tied embedding: `embedding` is portable, the LM head reads the same
tensor inside the delegate); bytes only delegates read are named data, keyed
by their content, shared by every delegate that names them.
"""
from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from executorch.exir._serialize._program import deserialize_pte_binary

from conftest import assert_close, et_execute, et_lower, kiln_lower, reference_io, run_kiln, spec_of

ELEMENT_SIZE = {0: 1, 1: 1, 2: 2, 3: 4, 4: 8, 5: 2, 6: 4, 7: 8, 11: 1, 15: 2}  # ScalarType -> bytes


def inspect_json(pte: Path) -> dict:
    return json.loads(run_kiln("inspect", pte, "--json").stdout)


def call_counts(pte: Path) -> tuple[int, int]:
    """(kernel calls, delegate calls) of plan 0, as `kiln inspect --json` counts them."""
    plan = inspect_json(pte)["plans"][0]
    return sum(plan["kernel_calls"].values()), sum(plan["delegate_calls"].values())


def stored_blobs(pte: Path) -> list[tuple[str, bytes]]:
    """Every constant buffer (trimmed to the largest tensor that uses it) and every
    named-data buffer of the file, read with ExecuTorch's deserializer."""
    f = deserialize_pte_binary(pte.read_bytes())
    prog = f.program
    used: dict[int, int] = {}
    for v in prog.execution_plan[0].values:
        t = v.val
        if type(t).__name__ == "Tensor" and t.data_buffer_idx > 0:
            n = math.prod(t.sizes) * ELEMENT_SIZE[int(t.scalar_type)]
            used[t.data_buffer_idx] = max(used.get(t.data_buffer_idx, 0), n)
    blobs = []
    for i, n in sorted(used.items()):
        storage = prog.constant_buffer[i].storage
        assert len(storage) >= n
        blobs.append((f"constant {i}", bytes(storage[:n])))
    store = f.named_data
    if store is not None:
        assert len(store.buffers) == len(store.pte_data), "a named-data buffer is stored twice"
        for key, entry in store.pte_data.items():
            blobs.append((f"named '{key}'", bytes(store.buffers[entry.buffer_index])))
    return blobs


def assert_no_blob_stored_twice(pte: Path) -> list[tuple[str, bytes]]:
    blobs = stored_blobs(pte)
    by_digest: dict[str, list[str]] = {}
    for where, data in blobs:
        by_digest.setdefault(hashlib.sha256(data).hexdigest(), []).append(where)
    twice = {d: w for d, w in by_digest.items() if len(w) > 1}
    assert not twice, f"{pte.name}: byte-identical blobs stored more than once: {list(twice.values())}"
    return blobs


def metadata(pte: Path) -> dict:
    return json.loads(pte.with_suffix(".json").read_text())


def check_delegation_metadata(pte: Path) -> dict:
    """The metadata's delegation block against the file and against itself."""
    meta = metadata(pte)
    d = meta["delegation"]
    kernels, delegates = call_counts(pte)
    assert d["delegate_call_sites"] == delegates == meta["program"]["delegate_calls"] >= 1
    assert kernels == meta["program"]["kernel_calls"]
    assert d["delegated_node_count"] + d["fallback_count"] == meta["lowering"]["edge_nodes"]
    assert sum(d["fallback_ops"].values()) == d["fallback_count"]
    assert set(d["fallback_reasons"]) == set(d["fallback_ops"])
    assert all(reasons and all(isinstance(r, str) and r for r in reasons) for reasons in d["fallback_reasons"].values())
    assert inspect_json(pte)["plans"][0]["delegate_calls"] == {"XnnpackBackend": delegates}
    return d


# ---------------------------------------------------------------------------
# Tiny models, both IR flavors


def test_tiny_models_run_in_executorch_and_match_eager(tiny_model):
    pte = kiln_lower(tiny_model, "xnnpack")
    spec = spec_of(tiny_model)
    ins, refs = reference_io(tiny_model)
    outs = et_execute(pte, ins)
    assert len(outs) == len(refs)
    for o, r in zip(outs, refs):
        assert_close(o, r, f"{spec['name']} ({spec['ir']}) xnnpack")
    d = check_delegation_metadata(pte)
    # The whole network is one region; only the embedding lookup (int64 ids) stays portable.
    assert d["mode"] == "regions"
    assert d["delegate_call_sites"] == 1
    assert d["fallback_ops"] == {"aten.embedding.default": 1}
    assert "no XNNPACK lowering" in d["fallback_reasons"]["aten.embedding.default"][0]
    assert call_counts(pte) == (1, 1)


def test_no_byte_identical_blob_is_stored_twice(tiny_model):
    pte = kiln_lower(tiny_model, "xnnpack")
    blobs = assert_no_blob_stored_twice(pte)
    # Every weight the portable program stores is stored by the delegated one too (once).
    portable = kiln_lower(tiny_model, "portable")
    ours = {hashlib.sha256(b).hexdigest() for _, b in blobs}
    for where, data in stored_blobs(portable):
        assert hashlib.sha256(data).hexdigest() in ours, f"portable {where} ({len(data)} bytes) is missing"
    # Constants only delegates read are not in the constant segment: it holds what
    # the portable embedding reads (its table), nothing else.
    constants = [b for w, b in blobs if w.startswith("constant")]
    assert len(constants) == 1
    spec = spec_of(tiny_model)
    d = metadata(pte)["delegation"]
    if spec["name"] == "gpt2":
        # The tied embedding / LM head: one blob, in the constant segment, read by the
        # embedding kernel and passed to the delegate as an input.
        assert len(constants[0]) == 1000 * 64 * 4
        assert d["constants_as_delegate_inputs"] == 1
    else:
        assert d["constants_as_delegate_inputs"] == 0


def test_per_op_runs_in_executorch_and_matches_eager(tiny_gpt2, tmp_path):
    out = tmp_path / "gpt2_xnnpack_per_op.pte"
    run_kiln("lower", "--spec", tiny_gpt2, "--backend", "xnnpack", "--per-op", "--out", out, "-q")
    ins, refs = reference_io(tiny_gpt2)
    assert_close(et_execute(out, ins)[0], refs[0], f"tiny gpt2 ({spec_of(tiny_gpt2)['ir']}) per-op")
    d = check_delegation_metadata(out)
    regions = metadata(kiln_lower(tiny_gpt2, "xnnpack"))["delegation"]
    assert d["mode"] == "per_op"
    # One delegate call per delegated node, the same nodes as the regions mode delegates.
    assert d["delegate_call_sites"] == d["delegated_node_count"] == regions["delegated_node_count"] > 50
    assert d["fallback_ops"] == regions["fallback_ops"]
    assert_no_blob_stored_twice(out)


# ---------------------------------------------------------------------------
# Regions around nodes XNNPACK cannot run: convex, and each weight stored once


class Branchy(torch.nn.Module):
    """tanh(lin(x)) feeds both a portable cumsum and a delegated multiply that meet
    again (one region for all of them would contain a cycle); a rank-0 amax cannot
    cross a delegate boundary; `lin` is used on both sides of the cumsum."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(16, 16)
        self.lin2 = torch.nn.Linear(16, 16)

    def forward(self, x):
        a = torch.tanh(self.lin(x))
        b = torch.cumsum(a, dim=-1)
        c = a * 2.0
        s = torch.amax(a, dim=(0, 1))
        d = self.lin(b + c) * s
        return torch.sigmoid(self.lin2(d))


def export_module(module: torch.nn.Module, x: torch.Tensor, out: Path, name: str) -> Path:
    """torch.export of `module` on `x` as the export front end writes a model: .pt2, spec, reference I/O."""
    out.mkdir(parents=True, exist_ok=True)
    module.eval()
    ep = torch.export.export(module, (x,))
    torch.export.save(ep, out / f"{name}.pt2")
    with torch.no_grad():
        y = module(x)
    np.save(out / f"{name}_input0.npy", x.numpy())
    np.save(out / f"{name}_expected_output0.npy", y.numpy())
    spec = {"name": name, "model_id": f"tests/{name}", "seq_len": int(x.shape[0]), "exported_program": f"{name}.pt2",
            "ir": "default",
            "inputs": [{"name": "x", "dtype": "float32", "shape": list(x.shape), "reference": f"{name}_input0.npy"}],
            "outputs": [{"name": "y", "dtype": "float32", "shape": list(y.shape),
                         "reference": f"{name}_expected_output0.npy"}]}
    (out / "model_spec.json").write_text(json.dumps(spec))
    return out / "model_spec.json"


def test_regions_around_portable_nodes_are_convex(tmp_path):
    torch.manual_seed(0)
    module = Branchy()
    spec = export_module(module, torch.randn(4, 16), tmp_path / "branchy", "branchy")
    ins, refs = reference_io(spec)
    pte = kiln_lower(spec, "xnnpack")
    assert_close(et_execute(pte, ins)[0], refs[0], "branchy")
    d = check_delegation_metadata(pte)
    # {linear, tanh, mul} | cumsum, amax | {add, linear} | mul by the rank-0 amax | {linear, sigmoid}
    assert d["delegate_call_sites"] == 3
    assert d["fallback_ops"] == {"aten.cumsum.default": 1, "aten.amax.default": 1, "aten.mul.Tensor": 1}
    (why,) = d["fallback_reasons"]["aten.mul.Tensor"]
    assert "rank 0" in why and "amax" in why
    assert call_counts(pte) == (3, 3)
    # `lin` runs in two delegates; its weight is one named-data blob (as is or transposed).
    blobs = assert_no_blob_stored_twice(pte)
    w = module.lin.weight.detach().numpy()
    named = [b for where, b in blobs if where.startswith("named")]
    assert sum(b in (w.tobytes(), np.ascontiguousarray(w.T).tobytes()) for b in named) == 1
    assert not [b for where, b in blobs if where.startswith("constant")]

    per_op = tmp_path / "branchy_per_op.pte"
    run_kiln("lower", "--spec", spec, "--backend", "xnnpack", "--per-op", "--out", per_op, "-q")
    assert_close(et_execute(per_op, ins)[0], refs[0], "branchy per-op")
    assert_no_blob_stored_twice(per_op)


# ---------------------------------------------------------------------------
# GPT-2 small (124M), seq_len 128


def test_gpt2_small_against_eager_and_executorch(gpt2_small):
    spec = spec_of(gpt2_small)
    pte = kiln_lower(gpt2_small, "xnnpack")
    ins, refs = reference_io(gpt2_small)
    assert_close(et_execute(pte, ins)[0], refs[0], f"gpt2 small ({spec['ir']}) xnnpack")

    portable = kiln_lower(gpt2_small, "portable")
    et_pte = et_lower(gpt2_small, "xnnpack")
    kernels, delegates = call_counts(pte)
    et_kernels, et_delegates = call_counts(et_pte)
    size, portable_size, et_size = pte.stat().st_size, portable.stat().st_size, et_pte.stat().st_size
    print(f"\ngpt2 small ({spec['ir']})      kiln xnnpack   ExecuTorch xnnpack")
    print(f"  delegate calls          {delegates:>12}   {et_delegates:>18}")
    print(f"  non-delegate kernels    {kernels:>12}   {et_kernels:>18}")
    print(f"  .pte MB                 {size / 1e6:>12.2f}   {et_size / 1e6:>18.2f}   (kiln portable {portable_size / 1e6:.2f})")

    assert delegates <= 3 and kernels <= 5
    assert size <= 1.01 * portable_size
    d = check_delegation_metadata(pte)
    assert d["fallback_ops"] == {"aten.embedding.default": 1}
    # The tied embedding is stored once: in the constant segment, read by the embedding
    # kernel and handed to the delegate (LM head) as an input.
    blobs = assert_no_blob_stored_twice(pte)
    constants = [b for where, b in blobs if where.startswith("constant")]
    assert [len(b) for b in constants] == [50257 * 768 * 4]
    assert d["constants_as_delegate_inputs"] == 1

    # With ExecuTorch's reference JSON beside the spec, kiln lower prints both side by side.
    proc = run_kiln("lower", "--spec", gpt2_small, "--backend", "xnnpack", "-q")
    line = next(l for l in proc.stdout.splitlines() if "vs ExecuTorch" in l)
    et_meta = json.loads(et_pte.with_suffix(".json").read_text())
    assert f"delegate call sites {delegates} vs {et_meta['delegation']['delegate_call_sites']}" in line


# ---------------------------------------------------------------------------
# The CLI


def test_per_op_needs_the_xnnpack_backend(tiny_gpt2):
    proc = run_kiln("lower", "--spec", tiny_gpt2, "--backend", "portable", "--per-op", check=False)
    assert proc.returncode == 1
    assert len(proc.stderr.strip().splitlines()) == 1 and "--per-op" in proc.stderr


def test_verification_says_what_it_could_not_check(tiny_gpt2, tmp_path):
    out = tmp_path / "g.pte"
    proc = run_kiln("lower", "--spec", tiny_gpt2, "--backend", "xnnpack", "--out", out)
    verify = [l for l in proc.stderr.splitlines() if "verifying" in l]
    assert len(verify) == 1
    assert "kiln's runtime has no XnnpackBackend" in verify[0] or "loading the program with kiln's runtime" in verify[0]
    assert "delegation: 1 XnnpackBackend call site" in proc.stdout
    assert "aten.embedding.default" in proc.stdout
