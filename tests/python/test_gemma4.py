"""Gemma 4 (transformers' Gemma4ForCausalLM) exported by `python -m kiln_export llm --arch gemma4`, lowered by kiln
and run in kiln's runtime and in ExecuTorch's, in every form the exporter writes: the KV cache as the program's
mutable buffers or as external inputs updated in place, each with one token a call or with a dynamic token count
(a prompt in chunks of up to the sliding window, then one token a call).

The tiny configuration has every feature of E2B (sliding and global layers with head_dim 16 and 32, KV-shared
layers, per-layer input embeddings, partial RoPE on global layers, q/k/v norms, logit soft-capping, one KV head,
tied embeddings) with a sliding window of 8, so the prompt (11 tokens) and 33 generated tokens go round the
sliding layers' ring caches five times.

Oracle: transformers itself, with no cache at all: its greedy tokens (`generate`), and the logits of one eager
forward over the whole sequence (its own causal and sliding-window masks), row by row against each call's
logits (DESIGN's fp32 tolerance). 8da4w (`--torchao 8da4w` in the deployed form, kiln's own `--quantize 8da4w`
in every form; XNNPACK, kiln refuses quantized programs for the portable backend): the same model quantized by
torchao in eager, its greedy tokens and one forward over them (its int8 activations are per token, so rows do
not depend on how the calls are cut).

kiln's runtime also runs ExecuTorch's own lowering of the deployed form's .pt2 (portable and XNNPACK).
Decode attention reads only the sliding window's live positions (NaN everywhere else in the caches never reaches
the logits; `kiln profile` reports the positions each layer read). `kiln generate` with a Gemma-style
tokenizer.json and a Gemma-4-style chat template gives transformers' greedy tokens in every form.

The llm export writes core-ATen functional IR (run_decompositions({})), so Gemma 4's in-place `mul_`
(`hidden_states *= self.layer_scalar`) arrives as a functional mul: nothing here waits for kiln's own
functionalization.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import REPO, assert_close, greedy_chat_reference, run_export, run_kiln

MAX_SEQ = 48
WINDOW = 8  # the tiny configuration's sliding window (asserted below)
PROMPT = [3, 17, 42, 5, 99, 7, 11, 200, 13, 14, 15]  # longer than the window
NEW = 33  # 32 decode steps after the prefill's token
FORMS = [("buffers", False), ("buffers", True), ("external", False), ("external", True)]
FORM_IDS = [f"{c}-{'dynamic' if d else 'static'}" for c, d in FORMS]


def _export(out: Path, *extra: str) -> Path:
    run_export("llm", "--arch", "gemma4", "--config", "tiny", "--max-seq-len", MAX_SEQ, "--seed", "0", "--out", out,
               *extra)
    return out / "model_spec.json"


@pytest.fixture(scope="module")
def reference():
    """(model, tokens: PROMPT + transformers' greedy tokens, logits of one cache-free forward [len, vocab])."""
    import torch

    sys.path.insert(0, str(REPO / "python"))
    from kiln_export import llm

    class Args:
        arch, config, gguf, seed = "gemma4", "tiny", None, 0

    model, _, _ = llm.build_model(Args)
    assert model.config.sliding_window == WINDOW
    with torch.no_grad():
        ids = model.generate(torch.tensor([PROMPT]), max_new_tokens=NEW, do_sample=False, pad_token_id=0,
                             eos_token_id=None)
        tokens = ids[0].tolist()
        logits = model(torch.tensor([tokens]), use_cache=False).logits[0].numpy()
    assert len(tokens) == len(PROMPT) + NEW <= MAX_SEQ
    return model, tokens, logits


_EXPORTS: dict = {}


def _exported(tmp_path_factory, cache: str, dynamic: bool, *extra: str) -> Path:
    """Each form exported once per session."""
    key = (cache, dynamic, extra)
    if key not in _EXPORTS:
        out = tmp_path_factory.mktemp(f"gemma4_{cache}_{'dyn' if dynamic else 'static'}{''.join(extra)}")
        _EXPORTS[key] = _export(out, "--cache", cache, *(["--dynamic"] if dynamic else []), *extra)
    return _EXPORTS[key]


def _calls(tokens, dynamic: bool):
    """(tokens, first position) per call, every token but the last fed: one a call, or (dynamic) the prompt in
    chunks of up to the window (8 then 3), then one a call."""
    feed = tokens[:-1]
    if not dynamic:
        return [([t], i) for i, t in enumerate(feed)]
    n = len(PROMPT)
    return [(feed[0:WINDOW], 0), (feed[WINDOW:n], WINDOW)] + [([t], i) for i, t in enumerate(feed) if i >= n]


def _kiln_calls(pte: Path, calls, caches: int, work: Path):
    """kiln run --steps, one step per call; external caches never set (`--input keep`). Logits per call."""
    work.mkdir(exist_ok=True)
    args = []
    for k, (t, p) in enumerate(calls):
        np.save(work / f"t{k}.npy", np.array([t], dtype=np.int64))
        np.save(work / f"p{k}.npy", np.arange(p, p + len(t), dtype=np.int64))
        args += ["-i", work / f"t{k}.npy", "-i", work / f"p{k}.npy"] + ["-i", "keep"] * caches
        args += [x for j in range(caches) for x in ("-o", work / f"c{k}_{j}.npy")] + ["-o", work / f"o{k}.npy"]
    run_kiln("run", pte, "--steps", len(calls), *args)
    return [np.load(work / f"o{k}.npy") for k in range(len(calls))]


def _et_calls(pte: Path, calls, cache_shapes):
    """ExecuTorch's runtime, one Method over all calls; external caches: each call's returned caches are the
    next call's inputs (zeros at the first)."""
    import torch
    from executorch.runtime import Runtime

    method = Runtime.get().load_program(str(pte)).load_method("forward")
    caches = [torch.zeros(s) for s in cache_shapes]
    got = []
    for t, p in calls:
        outs = method.execute([torch.tensor([t]), torch.arange(p, p + len(t)), *caches])
        assert len(outs) == len(caches) + 1
        caches = [o.clone() for o in outs[:-1]]
        got.append(outs[-1].numpy().copy())
    return got


def _check(got, calls, tokens, ref_logits, what):
    """Each call's logits rows against the cache-free forward's rows at its positions; the greedy tokens."""
    rows = {}
    for (t, p), g in zip(calls, got, strict=True):
        assert g.shape == (1, len(t), ref_logits.shape[-1]), (what, g.shape)
        for r in range(len(t)):
            rows[p + r] = g[0, r]
    assert sorted(rows) == list(range(len(tokens) - 1))
    for i in range(len(tokens) - 1):
        assert_close(rows[i], ref_logits[i], f"{what}: position {i}")
    greedy = [int(rows[i].argmax()) for i in range(len(PROMPT) - 1, len(tokens) - 1)]
    assert greedy == tokens[len(PROMPT):], f"{what}: greedy tokens {greedy} != transformers {tokens[len(PROMPT):]}"


def test_export_forms_own_the_caches_e2b_keeps(reference, tmp_path_factory):
    """The spec of each form: KV-shared layers own no cache, sliding-window layers a ring of the window (one token
    a call) or of window + chunk - 1 positions (--dynamic, chunks of up to the window), global ones max_seq_len;
    external caches are the inputs after tokens and positions, each layer's own head_dim."""
    model, _, _ = reference
    cfg = model.config
    assert cfg.kv_sharing_modes == [None, "store", "store", "reuse", "reuse"]
    for cache, dynamic in FORMS:
        s = json.loads(_exported(tmp_path_factory, cache, dynamic).read_text())
        ring = WINDOW + (WINDOW - 1 if dynamic else 0)
        want = [{"layer": 0, "kind": "sliding", "positions": ring, "kv_heads": 1, "head_dim": 16},
                {"layer": 1, "kind": "sliding", "positions": ring, "kv_heads": 1, "head_dim": 16},
                {"layer": 2, "kind": "full", "positions": MAX_SEQ, "kv_heads": 1, "head_dim": 32}]
        assert s["llm"]["cache_layers"] == want, (cache, dynamic, s["llm"])
        assert s["inputs"][0]["shape"] == [1, WINDOW if dynamic else 1]
        shapes = [i["shape"] for i in s["inputs"][2:]]
        assert shapes == ([[1, 1, c["positions"], c["head_dim"]] for c in want for _ in "kv"] if cache == "external"
                          else []), shapes


def test_e2b_and_e4b_configurations_construct():
    """E2B's and E4B's configurations build transformers' model (bf16; on the meta device: 9 GB of storage is not
    for CI): E2B has its published 4.63 B stored parameters, 2.75 B of them in the two embedding tables, and keeps
    the KV of 15 layers (12 sliding with head_dim 256, 3 global with 512): 36 KB a token in fp32."""
    import torch

    sys.path.insert(0, str(REPO / "python"))
    from kiln_export import gemma4

    m = gemma4.build("e2b", 0, "eager", device="meta")
    assert m.dtype == torch.bfloat16
    total = sum(p.numel() for p in m.parameters())
    tables = m.model.embed_tokens.weight.numel() + m.model.embed_tokens_per_layer.weight.numel()
    assert round(total / 1e9, 2) == 4.63 and round(tables / 1e9, 2) == 2.75, (total, tables)
    assert tuple(m.model.embed_tokens_per_layer.weight.shape) == (262144, 8960)
    plan = gemma4.cache_plan(m.config, 4096, 1)
    assert [l for l, *_ in plan] == list(range(15))
    assert sum(2 * h * d * 4 for _, _, _, h, d in plan) == 36864
    assert {(k, n, d) for _, k, n, _, d in plan} == {("sliding", 512, 256), ("full", 4096, 512)}
    assert [m.model.layers[i].mlp.intermediate_size for i in (14, 15)] == [6144, 12288]
    e4b = gemma4.build("e4b", 0, "eager", device="meta")
    assert e4b.config.num_hidden_layers == 42 and e4b.config.hidden_size == 2560
    assert len(gemma4.cache_plan(e4b.config, 4096, 1)) == 42 - 18


@pytest.mark.parametrize("backend", ["portable", "xnnpack"])
@pytest.mark.parametrize("form", FORMS, ids=FORM_IDS)
def test_prefill_and_32_decode_steps_both_runtimes(reference, tmp_path_factory, tmp_path, form, backend):
    cache, dynamic = form
    _, tokens, ref_logits = reference
    spec = _exported(tmp_path_factory, cache, dynamic)
    s = json.loads(spec.read_text())
    pte = tmp_path / f"gemma4_{backend}.pte"
    run_kiln("lower", "--spec", spec, "--backend", backend, "--out", pte, "-q")
    meta = json.loads(pte.with_suffix(".json").read_text())
    if cache == "buffers":  # K and V of the three layers that own a cache are the program's state
        assert meta["state"]["mutable_buffers"] == 6, meta["state"]
    shapes = [i["shape"] for i in s["inputs"][2:]]
    calls = _calls(tokens, dynamic)
    what = f"{cache}, {'dynamic' if dynamic else 'static'}, {backend}"
    _check(_kiln_calls(pte, calls, len(shapes), tmp_path / "kiln"), calls, tokens, ref_logits, f"kiln runtime ({what})")
    _check(_et_calls(pte, calls, shapes), calls, tokens, ref_logits, f"ExecuTorch runtime ({what})")


@pytest.fixture(scope="module")
def torchao_reference(reference):
    """(tokens: PROMPT + torchao eager's greedy tokens, the logits of one forward over them): the tiny model
    quantized 8da4w by torchao in eager (int4 scales rounded to bf16 as the payload stores them)."""
    import copy

    import torch

    from test_llm_programs import _torchao_quantize

    model, _, fp32 = reference
    quantized = _torchao_quantize(copy.deepcopy(model), "8da4w")
    with torch.no_grad():
        tokens = quantized.generate(torch.tensor([PROMPT]), max_new_tokens=NEW, do_sample=False, pad_token_id=0,
                                    eos_token_id=None)[0].tolist()
        logits = quantized(torch.tensor([tokens]), use_cache=False).logits[0].numpy()
    # the quantization moves the logits far outside the tests' 5% bound (~80% of max|logit| on the random tiny
    # model), and all 32 greedy tokens differ from the fp32 model's
    n = len(PROMPT)  # the rows both sequences share
    assert float(np.abs(logits[:n] - fp32[:n]).max()) > 0.1 * float(np.abs(fp32).max()), \
        "the quantization must be visible"
    return tokens, logits


@pytest.mark.parametrize("form", [("external", True)], ids=["external-dynamic"])
def test_8da4w_xnnpack_matches_torchao_eager(torchao_reference, tmp_path_factory, tmp_path, form):
    """`--torchao 8da4w` (int4 weights in groups of 32, int8 dynamic activations), lowered for XNNPACK, in the
    deployed form (external caches, one program for prefill and decode): both runtimes against the same model
    quantized by torchao in eager (scales rounded to bf16 as the payload stores them): its greedy tokens (the
    prompt in two calls and 32 decode steps) and the logits of one forward over them, within the bounds of
    test_llm_programs' torchao test. (One form exported so: each export takes CPU time; the other forms are
    quantized by kiln's own --quantize in the next test.)"""
    cache, dynamic = form
    tokens, want = torchao_reference
    spec = _exported(tmp_path_factory, cache, dynamic, "--torchao", "8da4w")
    s = json.loads(spec.read_text())
    assert s["torchao_quantization"] == "8da4w"
    pte = tmp_path / "gemma4_8da4w.pte"
    run_kiln("lower", "--spec", spec, "--backend", "xnnpack", "--out", pte, "-q")
    d = json.loads(pte.with_suffix(".json").read_text())["delegation"]
    assert "quantized in the .pt2" in d["quantization"], d
    calls = _calls(tokens, dynamic)
    shapes = [i["shape"] for i in s["inputs"][2:]]
    for what, got in (("kiln's runtime", _kiln_calls(pte, calls, len(shapes), tmp_path / "kiln")),
                      ("ExecuTorch's runtime", _et_calls(pte, calls, shapes))):
        rows = np.concatenate([g[0] for g in got])
        assert rows.shape == want[:-1].shape
        # per-token int8 activations: a last-bit difference in a norm can move one value by an int8 step, and
        # the KV cache carries it to later positions: 43 positions here (test_llm_programs: 10, within 1%).
        # On torchao's own greedy tokens both runtimes are within 5e-7 of max|logit| (on the fp32 model's
        # tokens one such step reached 1.3% at position 30 in both); a wrong quantization is far outside 5%.
        rel = [float(np.abs(g - w).max()) / float(np.abs(w).max()) for g, w in zip(rows, want[:-1])]
        worst = int(np.argmax(rel))
        assert rel[worst] <= 0.05, f"8da4w {cache}, {what}: {rel[worst]:.3g} of max|logit| at position {worst}"
        print(f"8da4w {cache}, {what}: worst {rel[worst]:.3g} of max|logit| at position {worst}")
        agree = np.mean([int(g.argmax()) == int(w.argmax()) for g, w in zip(rows, want[:-1])])
        assert agree >= 0.9, f"8da4w {cache}, {what}: argmax agrees at {agree:.0%} of positions"
        greedy = [int(r.argmax()) for r in rows[len(PROMPT) - 1:]]
        assert greedy == tokens[len(PROMPT):], f"8da4w {cache}, {what}: greedy {greedy} != torchao eager's"


@pytest.mark.parametrize("form", FORMS, ids=FORM_IDS)
def test_kiln_8da4w_every_form_matches_torchao_eager(torchao_reference, tmp_path_factory, tmp_path, form):
    """kiln's own quantizer (`kiln lower --backend xnnpack --quantize 8da4w --quantize-scales minmax`, torchao's
    rules) on each fp32 form's .pt2 (no export of its own): both runtimes give torchao eager's greedy tokens over
    the prompt and 32 decode steps, and its logits within the bounds of the --torchao test above."""
    cache, dynamic = form
    tokens, want = torchao_reference
    spec = _exported(tmp_path_factory, cache, dynamic)
    s = json.loads(spec.read_text())
    pte = tmp_path / "gemma4_8da4w.pte"
    run_kiln("lower", "--spec", spec, "--backend", "xnnpack", "--quantize", "8da4w", "--quantize-scales", "minmax",
             "--out", pte, "-q")
    d = json.loads(pte.with_suffix(".json").read_text())["delegation"]
    assert d["quantized_nodes"] > 0, d
    calls = _calls(tokens, dynamic)
    shapes = [i["shape"] for i in s["inputs"][2:]]
    for what, got in (("kiln's runtime", _kiln_calls(pte, calls, len(shapes), tmp_path / "kiln")),
                      ("ExecuTorch's runtime", _et_calls(pte, calls, shapes))):
        rows = np.concatenate([g[0] for g in got])
        assert rows.shape == want[:-1].shape
        rel = [float(np.abs(g - w).max()) / float(np.abs(w).max()) for g, w in zip(rows, want[:-1])]
        worst = int(np.argmax(rel))
        what = f"kiln --quantize 8da4w, {cache}, {'dynamic' if dynamic else 'static'}, {what}"
        print(f"{what}: worst {rel[worst]:.3g} of max|logit| at position {worst}")  # 5e-7 (both runtimes)
        assert rel[worst] <= 0.05, f"{what}: {rel[worst]:.3g} of max|logit| at position {worst}"
        greedy = [int(r.argmax()) for r in rows[len(PROMPT) - 1:]]
        assert greedy == tokens[len(PROMPT):], f"{what}: greedy {greedy} != torchao eager's"


# CI runs the XNNPACK lowering only (the deployed form; ExecuTorch's lowering is 30-60 s a backend):
# KILN_FULL_TESTS=1 adds the portable one.
@pytest.mark.parametrize("backend", ["xnnpack", "portable"] if os.environ.get("KILN_FULL_TESTS") else ["xnnpack"])
def test_kiln_runtime_runs_executorchs_lowering(reference, tmp_path_factory, tmp_path, backend):
    """kiln's runtime on ExecuTorch's own lowering (to_edge_transform_and_lower, XnnpackPartitioner for xnnpack)
    of the deployed form's .pt2 (external caches, a dynamic token count): the prompt in two calls and 32 decode
    steps against transformers, as for kiln's own files. (One form: ExecuTorch takes ~30 s of CPU to lower the
    tiny model, per backend.)"""
    import torch
    from executorch.exir import to_edge_transform_and_lower

    _, tokens, ref_logits = reference
    spec = _exported(tmp_path_factory, "external", True)
    s = json.loads(spec.read_text())
    ep = torch.export.load(str(spec.parent / s["exported_program"]))
    parts = []
    if backend == "xnnpack":
        from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

        parts = [XnnpackPartitioner()]
    pte = tmp_path / f"gemma4_{backend}_et.pte"
    pte.write_bytes(to_edge_transform_and_lower(ep, partitioner=parts, constant_methods=s["constant_methods"])
                    .to_executorch().buffer)
    assert (b"XnnpackBackend" in pte.read_bytes()) == (backend == "xnnpack")
    calls = _calls(tokens, True)
    got = _kiln_calls(pte, calls, len(s["inputs"]) - 2, tmp_path / "kiln")
    what = f"kiln runtime on ExecuTorch's {backend} lowering"
    if backend == "portable":
        _check(got, calls, tokens, ref_logits, what)
        return
    # ExecuTorch's XNNPACK lowering is 2e-4 of max|logit| from transformers at position 0 (outside DESIGN's fp32
    # tolerance, in ExecuTorch's runtime as in kiln's): the oracle is ExecuTorch's runtime on its own file, call
    # by call, and transformers' greedy tokens
    for k, (g, e) in enumerate(zip(got, _et_calls(pte, calls, [i["shape"] for i in s["inputs"][2:]]), strict=True)):
        assert_close(g, e, f"{what}: call {k}, against ExecuTorch's runtime")
    rows = np.concatenate([g[0] for g in got])
    greedy = [int(r.argmax()) for r in rows[len(PROMPT) - 1:]]
    assert greedy == tokens[len(PROMPT):], f"{what}: greedy tokens {greedy} != transformers {tokens[len(PROMPT):]}"

def _outside_the_window(layers, p: int):
    """Per cache layer, the slots a decode step at position p must not read: on a sliding layer's ring of R
    slots (slot s then holds position p - ((p - s) mod R)), those more than the window behind p; on a global
    layer, the positions after p. Also the slot the step writes (its row is written before it is read)."""
    out = []
    for c in layers:
        slots = np.arange(c["positions"])
        if c["kind"] == "sliding":
            hide = (p - slots) % c["positions"] >= WINDOW
            hide[p % c["positions"]] = True
        else:
            hide = slots >= p
        out.append(hide)
    return out


@pytest.mark.parametrize("dynamic", [True, False], ids=["dynamic", "static"])
def test_decode_reads_only_the_window(reference, tmp_path_factory, tmp_path, dynamic):
    """A decode step of kiln's XNNPACK backend reads, of a sliding-window layer's ring, only the window's live
    positions (the dynamic form's ring of 15 holds 7 positions outside the window of 8, on either side of the
    window when it wraps), and of a global layer only the positions written so far. Shown as in
    test_llm_programs' live-positions test: every decode step at a position >= 2 x window, from the caches a
    correct run left, with NaN in K and V at every slot it must not read (and at the slot it writes). ExecuTorch's
    runtime on the same program and inputs reads them (NaN logits); kiln's gives transformers' logits."""
    _, tokens, ref_logits = reference
    spec = _exported(tmp_path_factory, "external", dynamic)
    s = json.loads(spec.read_text())
    layers = s["llm"]["cache_layers"]
    pte = tmp_path / "gemma4_xnnpack.pte"
    run_kiln("lower", "--spec", spec, "--backend", "xnnpack", "--out", pte, "-q")
    calls = _calls(tokens, dynamic)
    ncache = 2 * len(layers)
    _kiln_calls(pte, calls, ncache, tmp_path / "kiln")  # the caches each call returns: kiln/c{call}_{cache}.npy
    work = tmp_path / "nan"
    work.mkdir()
    steps, args, poisoned = [], [], []
    for k, (t, p) in enumerate(calls):
        if p < 2 * WINDOW:
            continue
        assert len(t) == 1 and k > 0
        hide = _outside_the_window(layers, p)
        caches = []
        for j in range(ncache):
            c = np.load(tmp_path / "kiln" / f"c{k - 1}_{j}.npy")
            c[:, :, hide[j // 2]] = np.nan
            np.save(work / f"c{k}_{j}.npy", c)
            caches.append(c)
        if dynamic and not poisoned:  # the ring holds positions outside the window
            assert any(h.sum() > 1 for h, c in zip(hide, layers) if c["kind"] == "sliding")
        np.save(work / f"t{k}.npy", np.array([t], dtype=np.int64))
        np.save(work / f"p{k}.npy", np.array([p], dtype=np.int64))
        args += ["-i", work / f"t{k}.npy", "-i", work / f"p{k}.npy"] + [x for j in range(ncache)
                                                                         for x in ("-i", work / f"c{k}_{j}.npy")]
        args += [x for j in range(ncache) for x in ("-o", work / f"out{k}_{j}.npy")] + ["-o", work / f"o{k}.npy"]
        steps.append((k, p))
        poisoned.append(caches)
    assert len(steps) == len(tokens) - 1 - 2 * WINDOW
    run_kiln("run", pte, "--steps", len(steps), *args)

    import torch
    from executorch.runtime import Runtime

    method = Runtime.get().load_program(str(pte)).load_method("forward")
    for (k, p), caches in zip(steps, poisoned, strict=True):
        got = np.load(work / f"o{k}.npy")
        assert np.isfinite(got).all(), f"position {p}: kiln read a slot outside the window"
        assert_close(got[0, 0], ref_logits[p], f"position {p}, NaN outside the window")
        et = method.execute([torch.tensor([calls[k][0]]), torch.tensor([p]), *map(torch.from_numpy, caches)])
        assert np.isnan(et[-1].numpy()).any(), f"position {p}: ExecuTorch's runtime should read the NaN slots"


def test_profile_shows_the_window(reference, tmp_path_factory, tmp_path):
    """`kiln profile --tokens 1` of the buffers form at position 2 x window + 1 (the warmup steps fill the
    positions before it) reports the positions each layer's attention read: on the sliding layers (layers 0, 1
    and the KV-shared 3 of the tiny configuration) the window of transformers' config (8) of their ring of
    window + chunk - 1 = 15 slots, on the global layers (2 and the KV-shared 4) the p + 1 positions written so far
    of max_seq_len. Window and layer kinds are read from transformers' config, not from the export."""
    model, _, _ = reference
    window = model.config.sliding_window
    kinds = model.config.layer_types
    assert window == WINDOW and "sliding_attention" in kinds and "full_attention" in kinds
    spec = _exported(tmp_path_factory, "buffers", True)
    assert json.loads(spec.read_text())["llm"]["sliding_window"] == window
    pte = tmp_path / "gemma4_xnnpack.pte"
    run_kiln("lower", "--spec", spec, "--backend", "xnnpack", "--out", pte, "-q")
    p = 2 * window + 1
    cmd = ("profile", pte, "--tokens", "1", "--warmup", p, "--iters", "1")
    prof = json.loads(run_kiln(*cmd, "--json").stdout)
    assert prof["phase"] == "decode" and prof["step_positions"] == [p]
    read: dict = {}
    for r in prof["rows"]:
        if "positions_read" in r:
            read.setdefault(r["module"], set()).add((r["positions_read"], r["cache_positions"]))
    ring = window + window - 1  # the dynamic form's chunks are up to the window
    sliding, full = {(window, ring)}, {(p + 1, MAX_SEQ)}
    want = {f"model.model.layers.{i}.self_attn": sliding if k == "sliding_attention" else full
            for i, k in enumerate(kinds)}
    assert read == want, read
    text = run_kiln(*cmd).stdout
    assert f"{window:>6} of {ring:<6} model.model.layers.0.self_attn" in text, text


# ---- kiln generate: a Gemma-style tokenizer.json trained here by the tokenizers package (SentencePiece-style:
# "▁" for spaces, BPE with byte fallback, Gemma's <pad> <eos> <bos> <unk> ids, its turn markers as special tokens,
# <unused…> tokens to the model's vocabulary) and a Gemma-4-style chat template (a system turn, assistant turns
# as "model" with their thinking dropped, the empty thought channel after the generation prompt). Oracles:
# transformers' apply_chat_template (jinja2) for the prompt's ids, transformers' greedy `generate` for the new
# tokens, the tokenizers package for their bytes and text, ExecuTorch's TextLLMRunner on the buffers forms.

VOCAB = 512  # the tiny configuration's
CHAT_NEW = 32
QUESTION = "Hello there!"  # a chat prompt of 13 tokens

# Gemma 4's chat format: <bos><|turn>system\n...<turn|>\n<|turn>user\n...<turn|>\n<|turn>model\n
GEMMA4_TEMPLATE = """{{- bos_token -}}
{%- set ns = namespace(system='', first=0) -%}
{%- if messages and messages[0]['role'] in ['system', 'developer'] -%}
    {%- set ns.system = messages[0]['content'] | trim -%}
    {%- set ns.first = 1 -%}
{%- endif -%}
{%- set thinking = enable_thinking | default(false) -%}
{%- if thinking or ns.system -%}
    {{- '<|turn>system\\n' -}}
    {%- if thinking -%}{{- '<|think|>' -}}{%- endif -%}
    {{- ns.system -}}
    {{- '<turn|>\\n' -}}
{%- endif -%}
{%- for message in messages[ns.first:] -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{- raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') -}}
    {%- endif -%}
    {%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}
    {%- set content = message['content'] -%}
    {%- if role == 'model' and '<channel|>' in content -%}
        {%- set content = content.split('<channel|>') | last -%}
    {%- endif -%}
    {{- '<|turn>' + role + '\\n' + content | trim + '<turn|>\\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{- '<|turn>model\\n' -}}
    {%- if not thinking -%}{{- '<|channel>thought\\n<channel|>' -}}{%- endif -%}
{%- endif -%}
"""

SPECIAL = ["<pad>", "<eos>", "<bos>", "<unk>", "<|turn>", "<turn|>", "<|think|>", "<|channel>", "<channel|>"]
CORPUS = (["<|turn>user\nHello there! What is the capital of France?<turn|>\n<|turn>model\n<|channel>thought\n"
           "<channel|>Paris is the capital of France.<turn|>\n",
           "<|turn>system\nBe brief.<turn|>\n<|turn>user\nWrite a haiku about the sea.<turn|>\n<|turn>model\n"] * 40
          + ["the quick brown fox jumps over the lazy dog", "hello world, hello tokens, hello again",
             "naïve café — déjà vu", "  indented   lines\nand new lines\n"] * 10)


@pytest.fixture(scope="module")
def gemma_tokenizer(tmp_path_factory):
    """(folder with tokenizer.json, tokenizer_config.json and chat_template.jinja, transformers' tokenizer)."""
    from tokenizers import Tokenizer, decoders, models, normalizers, trainers
    from transformers import PreTrainedTokenizerFast

    out = tmp_path_factory.mktemp("gemma_tokenizer")
    tok = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>", fuse_unk=True))
    tok.normalizer = normalizers.Replace(" ", "▁")
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    byte_tokens = [f"<0x{b:02X}>" for b in range(256)]
    # trained on the text between the special tokens, as the encoder sees it (it takes them out first)
    pieces = [p for line in CORPUS for p in re.split("|".join(map(re.escape, SPECIAL)), line) if p]
    tok.train_from_iterator(pieces, trainers.BpeTrainer(vocab_size=400, special_tokens=SPECIAL + byte_tokens,
                                                        show_progress=False))
    # the rest of the model's vocabulary: Gemma's <unused…> special tokens
    tok.add_special_tokens([f"<unused{k}>" for k in range(VOCAB - tok.get_vocab_size())])
    assert tok.get_vocab_size() == VOCAB
    j = json.loads(tok.to_str())
    j["added_tokens"] = [t for t in j["added_tokens"] if t["content"] not in byte_tokens]  # vocabulary entries
    (out / "trained.json").write_text(json.dumps(j))
    hf = PreTrainedTokenizerFast(tokenizer_file=str(out / "trained.json"), bos_token="<bos>", eos_token="<eos>",
                                 pad_token="<pad>", unk_token="<unk>")
    hf.chat_template = GEMMA4_TEMPLATE
    hf.save_pretrained(out)
    assert [hf.convert_tokens_to_ids(t) for t in SPECIAL[:4]] == [0, 1, 2, 3]  # Gemma's pad, eos, bos, unk
    return out, hf


def test_chat_prompt_ids_match_transformers(gemma_tokenizer, reference, tmp_path):
    """kiln's chat template engine and tokenizer give transformers' prompt ids (a user turn, and a conversation
    with a system turn and an assistant turn whose thinking the template drops); the prompt is longer than the
    sliding window (the dynamic forms prefill it in two calls) and leaves the 32 new tokens room in the cache."""
    folder, hf = gemma_tokenizer
    model, _, _ = reference
    assert len(hf) == model.config.vocab_size == VOCAB
    chats = [[{"role": "user", "content": QUESTION}],
             [{"role": "system", "content": " Be brief. "}, {"role": "user", "content": "Hello there!"},
              {"role": "assistant", "content": "<|channel>thought\nhmm<channel|>Hi. How can I help?"},
              {"role": "user", "content": "Write a haiku\nabout the sea?"}]]
    for chat in chats:
        ref = hf.apply_chat_template(chat, add_generation_prompt=True)
        ref = list(ref["input_ids"] if hasattr(ref, "keys") else ref)
        (tmp_path / "m.json").write_text(json.dumps(chat))
        got = json.loads(run_kiln("tokenize", "--tokenizer", folder / "tokenizer.json", "--messages",
                                  tmp_path / "m.json", "--json").stdout)["ids"]
        assert got == ref, (hf.decode(got), hf.decode(ref))
    first = hf.apply_chat_template(chats[0], add_generation_prompt=True)
    first = list(first["input_ids"] if hasattr(first, "keys") else first)
    assert WINDOW < len(first) <= MAX_SEQ - CHAT_NEW, len(first)


def _token_bytes(hf, ids) -> bytes:
    """The bytes of the tokens as the tokenizer's vocabulary has them: "<0xAB>" one byte, "▁" a space; special
    tokens none."""
    out = b""
    for i in ids:
        piece = hf.convert_ids_to_tokens(i)
        if piece in SPECIAL or piece.startswith("<unused"):
            continue
        m = re.fullmatch(r"<0x([0-9A-F]{2})>", piece)
        out += bytes([int(m.group(1), 16)]) if m else piece.replace("▁", " ").encode()
    return out


@pytest.mark.parametrize("form", FORMS, ids=FORM_IDS)
def test_generate_gives_transformers_greedy_tokens(gemma_tokenizer, reference, kiln_bin, tmp_path_factory, tmp_path,
                                                   form):
    """`kiln generate --chat` (greedy, 32 new tokens past any end of turn) gives transformers' greedy tokens; it
    streams each token's bytes (the random model's tokens include byte-fallback ones that form no UTF-8: the
    bytes the tokenizers package's vocabulary gives them), and `kiln tokenize --decode` of them is the tokenizers
    package's text (its ByteFallback decoder turns such runs into U+FFFD). It reads the cache's size from get_max_context_len (the dynamic
    forms' get_max_seq_len is the prefill chunk, ExecuTorch's runner convention) and refuses a 33rd token past
    it. ExecuTorch's TextLLMRunner on the buffers forms: the same text up to its first end of sequence."""
    cache, dynamic = form
    folder, hf = gemma_tokenizer
    model, _, _ = reference
    spec = _exported(tmp_path_factory, cache, dynamic)
    methods = json.loads(spec.read_text())["constant_methods"]
    assert methods["get_max_context_len"] == MAX_SEQ
    assert methods["get_max_seq_len"] == (WINDOW if dynamic else MAX_SEQ)
    pte = tmp_path / "gemma4.pte"
    run_kiln("lower", "--spec", spec, "--backend", "xnnpack", "--out", pte, "-q")
    chat = [{"role": "user", "content": QUESTION}]
    prompt, ref = greedy_chat_reference(model, hf, chat, CHAT_NEW)
    got = json.loads(run_kiln("generate", pte, "--tokenizer", folder / "tokenizer.json", "--chat", "--prompt",
                              QUESTION, "--max-new-tokens", CHAT_NEW, "--ignore-eos", "--json").stdout)
    assert got["prompt_tokens"] == len(prompt)
    assert got["tokens"] == ref, (got["tokens"], ref)
    args = ["generate", pte, "--tokenizer", folder / "tokenizer.json", "--chat", "--prompt", QUESTION,
            "--max-new-tokens", CHAT_NEW, "--ignore-eos"]
    streamed = subprocess.run([str(kiln_bin), *map(str, args)], capture_output=True, check=True).stdout
    assert streamed == _token_bytes(hf, ref) + b"\n"
    text = json.loads(run_kiln("tokenize", "--tokenizer", folder / "tokenizer.json", "--decode", ",".join(map(str, ref)),
                               "--no-special", "--json").stdout)["text"]
    assert text == hf.decode(ref, skip_special_tokens=True)
    # the context is MAX_SEQ positions, not the prefill chunk: the prompt and 32 tokens fit, and no more
    room = MAX_SEQ - len(prompt)
    more = json.loads(run_kiln("generate", pte, "--tokenizer", folder / "tokenizer.json", "--chat", "--prompt",
                               QUESTION, "--max-new-tokens", room + 5, "--ignore-eos", "--json").stdout)
    assert len(more["tokens"]) == room + 1 and more["tokens"][:CHAT_NEW] == ref  # the last one needs no cache row

    if cache == "buffers":  # ExecuTorch's own LLM runner (external caches are not its convention)
        _check_executorch_runner(pte, prompt, ref, model.config.eos_token_id, tmp_path)


def _check_executorch_runner(pte, prompt, ref, eos, tmp_path):
    """ExecuTorch's TextLLMRunner on the same .pte, greedy: the same tokens up to its first end of sequence. Its
    Python callback takes whole characters and the random model's tokens are mostly byte-fallback pieces, so
    the runner gets a tokenizer that spells token i as the one character U+4E00 + i (a BPE vocabulary with no
    merges, written by the tokenizers package): the prompt's ids in, the tokens' ids out."""
    from executorch.extension.llm.runner import GenerationConfig, TextLLMRunner
    from tokenizers import Tokenizer, models

    spell = {chr(0x4E00 + i): i for i in range(VOCAB)}
    Tokenizer(models.BPE(vocab=spell, merges=[])).save(str(tmp_path / "ids.json"))
    pieces = []
    runner = TextLLMRunner(str(pte), str(tmp_path / "ids.json"))
    runner.generate("".join(chr(0x4E00 + i) for i in prompt), GenerationConfig(echo=False, max_new_tokens=CHAT_NEW,
                                                                              temperature=0.0),
                    token_callback=pieces.append)
    got = [spell[c] for c in "".join(pieces)]
    end = next((i for i, t in enumerate(ref) if t == eos), None)
    want = ref[:end + 1] if end is not None else ref
    # without an end of sequence the runner's count may stop one short
    assert got == want if end is not None else (got == want[:len(got)] and len(got) >= CHAT_NEW - 1), (got, want)
