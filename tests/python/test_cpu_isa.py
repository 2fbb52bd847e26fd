"""Every ISA variant of kiln's compute layer (src/cpu: f32-gemm, f32-gemv, f32-vunary,
f32-vbinary, f32-rows), forced in turn with KILN_CPU_ISA, runs the tiny models
(GPT-2, BERT, Llama; kiln's XNNPACK file, both engines, 1 and 2 threads, and a
one-token GPT-2 for the GEMV paths) and matches PyTorch eager. `kiln bench --json`
reports the ISA its kernels were selected for, so the test knows the variable took
effect; an ISA this CPU lacks is skipped (and reported as a skip, not a pass).
"""
from __future__ import annotations

import json
import os

import pytest

from conftest import assert_close, export_model, kiln_lower, reference_io, run_kiln, spec_of
from test_xnnpack_runtime import kiln_run

ISAS = ["generic", "avx2", "avx512", "amx"]  # the x86-64 levels, in order
# amx adds only a qd8-gemm variant (the f32 families run their avx512 ones there), so the fp32 models
# run at the levels below it; the quantized models' tests run at the CPU's best level
MODEL_ISAS = ISAS[:3]


def isa_env(isa: str) -> dict:
    return dict(os.environ, KILN_CPU_ISA=isa)


def active_isa(pte, isa: str) -> tuple[str, str]:
    proc = run_kiln("bench", pte, "--iters", "1", "--warmup", "0", "--json", env=isa_env(isa))
    j = json.loads(proc.stdout)
    return j["isa"], j["best_isa"]


def require_isa(pte, isa: str):
    got, best = active_isa(pte, isa)
    if got != isa:
        pytest.skip(f"this CPU's best ISA is {best}: KILN_CPU_ISA={isa} runs {got}, so {isa} is not tested here")


@pytest.mark.parametrize("isa", ISAS)
def test_isa_variable_selects_kernels(tiny_gpt2, isa):
    """The variable reaches kiln's kernel selection: an ISA the CPU runs is taken as asked."""
    pte = kiln_lower(tiny_gpt2, "xnnpack")
    got, best = active_isa(pte, isa)
    order = ISAS.index
    assert got == (isa if order(isa) <= order(best) else best), (isa, got, best)


@pytest.mark.parametrize("threads", ["1", "2"])
@pytest.mark.parametrize("engine", ["kiln", "xnnpack"])
@pytest.mark.parametrize("isa", MODEL_ISAS)
def test_tiny_models_per_isa(tiny_model, isa, engine, threads, tmp_path):
    pte = kiln_lower(tiny_model, "xnnpack")
    require_isa(pte, isa)
    ins, refs = reference_io(tiny_model)
    s = spec_of(tiny_model)
    outs = kiln_run(pte, ins, tmp_path, "--engine", engine, "--threads", threads, env=isa_env(isa))
    for o, r in zip(outs, refs, strict=True):
        assert_close(o, r, f"{s['name']} ({s['ir']}), KILN_CPU_ISA={isa}, --engine {engine} --threads {threads}")


@pytest.fixture(scope="module")
def tiny_gpt2_one_token(tmp_path_factory):
    return export_model(tmp_path_factory.mktemp("gpt2_tiny_seq1_isa"), "--config", "tiny", "--seq-len", "1")


@pytest.mark.parametrize("isa", MODEL_ISAS)
def test_one_token_per_isa(tiny_gpt2_one_token, isa, tmp_path):
    """One token: fully-connected nodes and the LM head on the streaming GEMV variants."""
    pte = kiln_lower(tiny_gpt2_one_token, "xnnpack")
    require_isa(pte, isa)
    ins, refs = reference_io(tiny_gpt2_one_token)
    out = kiln_run(pte, ins, tmp_path, "--threads", "2", env=isa_env(isa))[0]
    assert_close(out, refs[0], f"tiny GPT-2, one token, KILN_CPU_ISA={isa}")
