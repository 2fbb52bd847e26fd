"""The Python package `kiln` (python/kiln, src/python/kiln_ext.cpp; issue 40): kiln.lower against `kiln lower`
(same .pte bytes, same metadata), ExecuTorch's runtime and eager; kiln.load reading torch tensors and numpy arrays
in place; errors as the CLI's lines; `pip install .` of a fresh clone into a new venv, then the example scripts.

The package is imported from the build tree (scripts/build: build/python/kiln, beside KILN_BIN)."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import REPO, assert_close, export_named, kiln_lower, reference_io, run_kiln, spec_of

BUILD = Path(os.environ.get("KILN_BIN", REPO / "build" / "kiln")).resolve().parent
PACKAGE = BUILD / "python"
if not any((PACKAGE / "kiln").glob("_kiln*.so")):
    raise RuntimeError(f"kiln's Python module is not built under {PACKAGE}/kiln (scripts/build builds it with "
                       f"-DKILN_PYTHON=ON once nanobind is in .venv: scripts/setup)")
sys.path.insert(0, str(PACKAGE))
import kiln  # noqa: E402

SEED_KEYS = {"model", "model_id", "backend", "exported_program", "pte", "pte_size_mb", "seq_len", "delegation"}


def _without(meta: dict, *keys: str) -> dict:
    return {k: v for k, v in meta.items() if k not in keys}


# ---- lowering ----

@pytest.mark.parametrize("gpt2_small", ["default"], indirect=True)  # one IR flavor
def test_lower_exported_program_is_kiln_lower(gpt2_small, tmp_path):
    """kiln.lower(ep) of GPT-2 small (the ExportedProgram torch.export.load gives for the front end's .pt2,
    serialized in memory by kiln.lower) is the .pte `kiln lower` writes for the .pt2, byte for byte (and so runs
    in ExecuTorch's runtime to eager's logits, tested on the CLI's file)."""
    import torch

    spec = spec_of(gpt2_small)
    ep = torch.export.load(str(gpt2_small.parent / spec["exported_program"]))
    lowered = kiln.lower(ep, name=spec["name"], model_id=spec["model_id"], seq_len=spec["seq_len"])
    cli = kiln_lower(gpt2_small, "portable")
    assert lowered.pte == cli.read_bytes()
    assert lowered.delegation is None
    out = tmp_path / "gpt2.pte"
    meta = lowered.write(out)
    assert SEED_KEYS <= set(meta) and meta["pte"] == str(out) and meta["backend"] == "portable"
    assert meta["model"] == spec["name"] and meta["model_id"] == spec["model_id"] and meta["seq_len"] == spec["seq_len"]
    assert json.loads(out.with_suffix(".json").read_text()) == meta
    assert meta["pte_size_bytes"] == out.stat().st_size
    # ExecuTorch's runtime on these bytes (GPT-2 small, ~75 s of its portable kernels): they are the CLI's, which
    # test_portable_lowering.py::test_gpt2_small_runs_in_executorch_and_matches_eager[default] runs to eager's logits.
    assert out.read_bytes() == cli.read_bytes()


def test_lower_write_is_kiln_lower_out(tiny_gpt2, tmp_path):
    """kiln.lower(spec, "xnnpack").write(path) writes what `kiln lower --spec --out path` does: the same .pte,
    the same metadata (but the timings) and the same debug map; .delegation is the metadata's summary."""
    lowered = kiln.lower(tiny_gpt2, backend="xnnpack")
    mine, theirs = tmp_path / "mine.pte", tmp_path / "theirs.pte"
    meta = lowered.write(mine)
    run_kiln("lower", "--spec", tiny_gpt2, "--backend", "xnnpack", "--out", theirs, "-q")
    assert mine.read_bytes() == theirs.read_bytes() == lowered.pte
    cli_meta = json.loads(theirs.with_suffix(".json").read_text())
    assert _without(meta, "pte", "lowering_seconds") == _without(cli_meta, "pte", "lowering_seconds")
    assert lowered.delegation == cli_meta["delegation"] and lowered.delegation["delegate_call_sites"] >= 1
    assert set(lowered.delegation["fallback_reasons"]) == set(lowered.delegation["fallback_ops"])
    mine_map = json.loads(mine.with_suffix(".debug.json").read_text())
    cli_map = json.loads(theirs.with_suffix(".debug.json").read_text())
    assert mine_map["pte"] == "mine.pte" and _without(mine_map, "pte") == _without(cli_map, "pte")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["mine.pte", "mine.json", "mine.debug.json", "theirs.pte", "theirs.json", "theirs.debug.json"])


def test_lower_exported_program_metadata_is_the_clis(tiny_gpt2, tmp_path):
    """kiln.lower(ExportedProgram).write(path): the metadata and debug map `kiln lower --spec` writes for the
    saved .pt2, key for key, but "exported_program": the CLI names the .pt2 it read, kiln.lower names what it
    was handed (the in-memory program), never the private temporary file it serialized the program to."""
    import torch

    spec = spec_of(tiny_gpt2)
    ep = torch.export.load(str(tiny_gpt2.parent / spec["exported_program"]))
    lowered = kiln.lower(ep, backend="xnnpack", name=spec["name"], model_id=spec["model_id"],
                         seq_len=spec["seq_len"])
    mine, theirs = tmp_path / "mine.pte", tmp_path / "theirs.pte"
    meta = lowered.write(mine)
    run_kiln("lower", "--spec", tiny_gpt2, "--backend", "xnnpack", "--out", theirs, "-q")
    cli_meta = json.loads(theirs.with_suffix(".json").read_text())
    assert mine.read_bytes() == theirs.read_bytes()
    assert Path(cli_meta["exported_program"]).resolve() == (tiny_gpt2.parent / spec["exported_program"]).resolve()
    label = "<torch.export.ExportedProgram in memory>"
    assert meta["exported_program"] == lowered.metadata["exported_program"] == label
    skip = ("pte", "lowering_seconds", "exported_program")
    assert _without(meta, *skip) == _without(cli_meta, *skip)
    mine_map = json.loads(mine.with_suffix(".debug.json").read_text())
    cli_map = json.loads(theirs.with_suffix(".debug.json").read_text())
    assert mine_map["exported_program"] == label and cli_map["exported_program"] == cli_meta["exported_program"]
    assert _without(mine_map, "pte", "exported_program") == _without(cli_map, "pte", "exported_program")
    for text in (mine.with_suffix(".json").read_text(), mine.with_suffix(".debug.json").read_text()):
        assert "kiln-lower-" not in text  # kiln.lower's private directory appears nowhere


def _cli_error(*args) -> str:
    proc = run_kiln(*args, check=False)
    assert proc.returncode == 1 and proc.stderr.startswith("kiln: error: "), proc.stderr
    assert proc.stderr.count("\n") == 1, proc.stderr
    return proc.stderr[len("kiln: error: "):].rstrip("\n")


def test_errors_are_the_cli_lines(tiny_gpt2, tmp_path):
    """Every failure is kiln.Error with the line the CLI prints, and leaves no file."""
    bad = tmp_path / "bad_spec.json"
    bad.write_text(json.dumps({"name": "m", "exported_program": "missing.pt2"}))
    with pytest.raises(kiln.Error) as e:
        kiln.lower(bad)
    assert str(e.value) == _cli_error("lower", "--spec", bad)
    with pytest.raises(kiln.Error) as e:
        kiln.lower(tiny_gpt2, backend="portable", quantize="8da4w:48")
    assert str(e.value) == _cli_error("lower", "--spec", tiny_gpt2, "--quantize", "8da4w:48", "-q")
    with pytest.raises(kiln.Error) as e:
        kiln.lower(tiny_gpt2, backend="xnnpack", quantize="8da3w")
    assert str(e.value) == _cli_error("lower", "--spec", tiny_gpt2, "--backend", "xnnpack", "--quantize", "8da3w", "-q")
    garbage = tmp_path / "garbage.pt2"
    garbage.write_bytes(b"not a zip")
    with pytest.raises(kiln.Error, match="garbage.pt2"):
        kiln.lower(garbage)
    lowered = kiln.lower(tiny_gpt2)
    with pytest.raises(kiln.Error, match=r"x\.bin: the output must end in \.pte"):
        lowered.write(tmp_path / "x.bin")
    with pytest.raises(kiln.Error):
        lowered.write(tmp_path / "no_such_dir" / "x.pte")
    with pytest.raises(kiln.Error):
        kiln.load(b"\0" * 64)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad_spec.json", "garbage.pt2"]


# ---- runtime ----

@pytest.mark.parametrize("backend", ["portable", "xnnpack"])
def test_load_reads_torch_and_numpy_inputs_in_place(tiny_gpt2, backend):
    """module.forward(torch tensor) returns eager's logits as a torch tensor, the runtime having read the
    tensor's own memory (its input pointed at x.data_ptr() while it ran, no copy); numpy in, numpy out, the same."""
    import torch

    ins, outs = reference_io(tiny_gpt2)
    module = kiln.load(kiln.lower(tiny_gpt2, backend=backend).pte, threads=2)
    assert "forward" in module.method_names
    x = torch.from_numpy(ins[0].copy())
    module.forward(torch.zeros_like(x))  # another tensor first: the next call must read x, not that one
    got = module.forward(x)
    assert isinstance(got[0], torch.Tensor)
    assert_close(got[0].numpy(), outs[0], f"kiln.load ({backend}), a torch tensor in")
    call = module.last_call()
    assert call["input_data_ptrs"] == [x.data_ptr()] and call["in_place"] == [True]
    a = ins[0].copy()
    got = module(a)
    assert isinstance(got[0], np.ndarray)
    assert_close(got[0], outs[0], f"kiln.load ({backend}), a numpy array in")
    assert module.last_call()["input_data_ptrs"] == [a.ctypes.data]
    with pytest.raises(kiln.Error, match="dtype"):
        module.forward(ins[0].astype(np.int32))
    with pytest.raises(kiln.Error, match="input"):
        module.forward()


def test_load_keeps_state_and_writes_external_cache_in_place(tmp_path):
    """An LLM program: with its cache in mutable buffers the state stays across forward calls (one token per
    call = the logits eager gives for the whole prefix); with the cache as inputs (external), the runtime updates
    the caller's torch tensors in place, as eager does."""
    import torch

    sys.path.insert(0, str(REPO / "python"))
    from kiln_export import llm

    args = llm.parse(["--arch", "llama", "--config", "tiny", "--max-seq-len", "8", "--out", str(tmp_path)])
    model, _, _ = llm.build_model(args)
    tokens = torch.tensor([[3, 17, 5, 9]])
    with torch.no_grad():
        ref = model(input_ids=tokens).logits[0].numpy()
    for external in (False, True):
        module = llm.make_module(model, 8, last_logits_only=False, external=external)
        ep = llm.export(module, 1, dynamic=False)
        m = kiln.load(kiln.lower(ep, backend="xnnpack"))
        caches = [torch.zeros(s) for s in getattr(module, "cache_shapes", [])] if external else []
        for t in range(tokens.shape[1]):
            outs = m.forward(tokens[:, t:t + 1].clone(), torch.tensor([t]), *caches)
            assert_close(outs[-1][0, -1].numpy(), ref[t], f"step {t} (external cache: {external})")
            if external:
                assert all(m.last_call()["in_place"])
                assert float(caches[0][..., t, :].abs().sum()) > 0  # written in the caller's tensor
                assert float(caches[0][..., t + 1:, :].abs().sum()) == 0


def test_no_torch_import(tiny_gpt2):
    """kiln with numpy only: lowering a spec and running the program never imports torch."""
    code = ("import sys, numpy as np, kiln; l = kiln.lower(sys.argv[1]); m = kiln.load(l.pte); "
            "ins = [np.load(p) for p in sys.argv[2:]]; out = m.forward(*ins); "
            "assert isinstance(out[0], np.ndarray); assert 'torch' not in sys.modules, 'torch imported'; print('ok')")
    spec = spec_of(tiny_gpt2)
    refs = [str(tiny_gpt2.parent / i["reference"]) for i in spec["inputs"]]
    env = dict(os.environ, PYTHONPATH=str(PACKAGE))
    proc = subprocess.run([sys.executable, "-c", code, str(tiny_gpt2), *refs], capture_output=True, text=True, env=env)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]


def test_tokenizer_is_tokenizers(tmp_path):
    """kiln.Tokenizer against the `tokenizers` package on a byte-level BPE trained here."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    text = ["kiln lowers programs, kiln runs programs: héllo wörld 123"] * 20
    tok.train_from_iterator(text, trainers.BpeTrainer(vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.save(str(tmp_path / "tokenizer.json"))
    mine = kiln.Tokenizer(tmp_path / "tokenizer.json")
    for s in ["kiln runs héllo", "wörld 123 programs!", ""]:
        ids = tok.encode(s).ids
        assert mine.encode(s) == ids
        assert mine.decode(ids) == tok.decode(ids)
    with pytest.raises(kiln.Error):
        kiln.Tokenizer(tmp_path / "missing.json")


# ---- documentation: help() and the type stub ----

def _api(source: str) -> dict:
    """A stub's shape: {function: (kind, parameter names)}, {class: {member: (kind, parameter names)}}."""
    import ast

    def shape(f):
        a = f.args
        kind = "property" if any(getattr(d, "id", "") == "property" for d in f.decorator_list) else "def"
        return kind, [p.arg for p in a.posonlyargs + a.args + a.kwonlyargs]

    out: dict = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef):
            out[node.name] = shape(node)
        elif isinstance(node, ast.ClassDef):
            out[node.name] = {m.name: shape(m) for m in node.body if isinstance(m, ast.FunctionDef)}
    return out


def test_type_stub_is_the_extension_module():
    """python/kiln/_kiln.pyi (shipped in the wheel) describes kiln._kiln as it is: nanobind's own stub generator
    on the built module gives the same functions, classes, members, properties and parameter counts, and the
    same parameter names where the binding names them."""
    from nanobind.stubgen import StubGen

    sg = StubGen(kiln._kiln, include_private=True, include_docstrings=False, quiet=True)
    sg.put(kiln._kiln)
    real = _api(sg.get())
    mine = _api((Path(kiln.__file__).parent / "_kiln.pyi").read_text())
    assert set(real) == set(mine)

    def same(a, b, where):
        assert a[0] == b[0] and len(a[1]) == len(b[1]), (where, a, b)
        for x, y in zip(a[1], b[1]):
            assert x == y or x.startswith("arg"), (where, a, b)  # arg, arg0...: a parameter nanobind leaves unnamed

    for name, want in real.items():
        if isinstance(want, dict):
            assert set(want) == set(mine[name]), name
            for member, m in want.items():
                same(m, mine[name][member], f"{name}.{member}")
        else:
            same(want, mine[name], name)


def test_help_documents_every_parameter():
    """help(kiln.lower) (and load, generate, Tokenizer) names every parameter it takes, and what it returns."""
    import inspect

    for fn in (kiln.lower, kiln.load, kiln.generate, kiln.Tokenizer, kiln.LoweredProgram.write):
        doc = inspect.getdoc(fn) or ""
        for p in inspect.signature(fn).parameters:
            if p != "self":
                assert re.search(rf"\b{p}\b", doc), f"{fn.__qualname__}: parameter {p} undocumented"
    for fn in (kiln.lower, kiln.load):
        assert "Returns:" in inspect.getdoc(fn) and "Raises:" in inspect.getdoc(fn)


# ---- pip install . of a fresh clone into a new venv, then the examples ----

@pytest.fixture(scope="module")
def venv_python(tmp_path_factory) -> tuple[Path, Path]:
    """`git clone` of this repository, `pip install .` of it into a new venv (the build backend, numpy and torch
    seen from .venv's site-packages through a .pth: nothing downloaded; the extension module scripts/build made,
    packaged as it is with -C cmake.define.KILN_PYTHON_PREBUILT, so CI does not compile kiln twice).
    (the venv's python, the clone)"""
    tmp = tmp_path_factory.mktemp("pip_install")
    clone, venv = tmp / "clone", tmp / "venv"
    subprocess.run(["git", "clone", "-q", "--depth", "1", f"file://{REPO}", str(clone)], check=True)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next((venv / "lib").glob("python3*/site-packages"))
    (site / "kiln_dev_venv.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")  # .venv's packages, pip too
    py = venv / "bin" / "python"
    t0 = time.perf_counter()
    proc = subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-build-isolation", str(clone),
                           "-C", f"cmake.define.KILN_PYTHON_PREBUILT={PACKAGE / 'kiln'}"],
                          capture_output=True, text=True, cwd=tmp)
    assert proc.returncode == 0, proc.stderr[-4000:]
    print(f"pip install . (fresh clone, prebuilt module): {time.perf_counter() - t0:.1f} s")
    where = subprocess.run([str(py), "-c", "import kiln; print(kiln.__file__)"], capture_output=True, text=True,
                           cwd=tmp, check=True).stdout.strip()
    assert where.startswith(str(venv)), where
    return py, clone


def test_pip_install_then_lower_example(venv_python, tiny_gpt2, tmp_path):
    """examples/lower_to_executorch.py from the clone with the venv's kiln: its .pte is `kiln lower`'s, its
    metadata carries the seed's keys, it prints the delegation summary."""
    py, clone = venv_python
    spec = json.loads(tiny_gpt2.read_text())
    (tmp_path / "model_spec.json").write_text(
        json.dumps({**spec, "exported_program": str(tiny_gpt2.parent / spec["exported_program"])}))
    for backend in ("portable", "xnnpack"):
        proc = subprocess.run([str(py), str(clone / "examples" / "lower_to_executorch.py"), "--spec",
                               str(tmp_path / "model_spec.json"), "--backend", backend], capture_output=True,
                              text=True, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr[-3000:]
        pte = tmp_path / f"{spec['name']}_{backend}.pte"
        meta = json.loads(pte.with_suffix(".json").read_text())
        assert SEED_KEYS <= set(meta) and meta["pte"] == str(pte) and meta["backend"] == backend
        assert pte.read_bytes() == kiln_lower(tiny_gpt2, backend).read_bytes()
        if backend == "xnnpack":
            d = meta["delegation"]
            assert f"XNNPACK delegate call sites: {d['delegate_call_sites']}" in proc.stdout
            assert f"fallback call_function operators: {d['fallback_count']}" in proc.stdout


def test_pip_install_then_llm_example(venv_python, tmp_path):
    """examples/llm_generate.py (SmolLM2 exported with an external cache in Python, kiln.lower 8da4w in memory,
    kiln.generate streaming) from the clone with the venv's kiln: its text is `kiln generate --chat`'s greedy
    text on the .pte it wrote."""
    py, clone = venv_python
    prompt, n = "What is the capital of France?", 12
    proc = subprocess.run([str(py), str(clone / "examples" / "llm_generate.py"), "--out", str(tmp_path),
                           "--prompt", prompt, "--max-seq-len", "64", "--max-new-tokens", str(n)],
                          capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    cli = json.loads(run_kiln("generate", tmp_path / "smollm2.pte", "--chat", "--prompt", prompt,
                              "--max-new-tokens", n, "--json").stdout)
    assert proc.stdout.strip() == cli["text"].strip() and cli["generated_tokens"] >= 1


def test_llm_runner_reads_bfloat16_logits(tmp_path):
    """A bfloat16 LLM whose program returns bfloat16 logits (kept bf16 on the portable backend; or widened for
    XNNPACK, its float32 logits rounded once at the edge, `--io-dtype program`): kiln's LLM runner (what `kiln
    generate` and kiln.generate sample from) widens them exactly, once refused as "not float logits". Token by
    token against eager: the kept program against bf16 eager (2e-2 of max|logit|, bf16's own roundings), the
    widened one against fp32 eager of the same weights (one bf16 rounding, 2^-8)."""
    import copy as copy_

    import torch

    from test_bf16_lowering import TOKENS, MAX_SEQ, _export, _model

    spec = _export(tmp_path / "llama")
    bf16, llm = _model("bf16")
    f32 = llm.make_module(copy_.deepcopy(bf16).float(), MAX_SEQ, False).eval()
    b16 = llm.make_module(bf16, MAX_SEQ, False).eval()
    with torch.no_grad():
        want32 = [f32(torch.tensor([[t]]), torch.tensor([i])).reshape(-1).numpy() for i, t in enumerate(TOKENS)]
        want16 = [b16(torch.tensor([[t]]), torch.tensor([i])).float().reshape(-1).numpy() for i, t in enumerate(TOKENS)]
    kept, wide = tmp_path / "kept.pte", tmp_path / "wide.pte"
    run_kiln("lower", "--spec", spec, "--backend", "portable", "--dtype", "bf16", "--out", kept, "-q")
    run_kiln("lower", "--spec", spec, "--backend", "xnnpack", "--out", wide, "-q")
    assert json.loads(wide.with_suffix(".json").read_text())["dtype"]["io"] == "bfloat16"
    for pte, want, bound in ((kept, want16, 2e-2), (wide, want32, 2.0 ** -8)):
        runner = kiln._kiln.load_runner(str(pte), 1, "kiln")
        for i, (t, w) in enumerate(zip(TOKENS, want, strict=True)):
            got = runner.feed([t])
            assert got.dtype == np.float32 and got.shape == w.shape
            rel = float(np.abs(got - w).max()) / float(np.abs(w).max())
            assert rel <= bound, f"{pte.name}, token {i}: {rel:.3g} of max|logit| from eager"
