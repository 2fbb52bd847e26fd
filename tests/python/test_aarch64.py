"""kiln for 64-bit Arm (build-aarch64/, `scripts/build --target aarch64`), run under Debian's
qemu-user as two CPUs: a Cortex-A76 (the Raspberry Pi 5: NEON, dotprod, no i8mm) and qemu's
`max` (dotprod and i8mm).

- kiln_cpu_tests (every src/cpu variant the emulated CPU runs against the generic one and the
  reference formulas) passes on both CPUs;
- the variants selected from getauxval(AT_HWCAP/AT_HWCAP2) are the ones each CPU model has
  (qemu documents cortex-a76 as Armv8.2 with dotprod, `max` as every feature it emulates):
  i8mm under max, dotprod on the A76, and KILN_CPU_ISA caps them;
- `kiln run` of tiny GPT-2 and tiny Llama files lowered by the x86 kiln (portable and xnnpack,
  fp32 and 8da4w) gives the x86 kiln's outputs within the fp32 tolerance, and eager PyTorch's
  for fp32;
- `kiln generate` greedy on tiny Llama gives the x86 kiln's tokens;
- `kiln generate --chat` greedy on the tiny Gemma 4 quantized by torchao 8da4w and lowered for XNNPACK (the
  second document's form: external KV cache, one program for prefill and decode; and the cache as buffers),
  with a Gemma-style tokenizer, gives the x86 kiln's tokens, which are torchao eager's.

scripts/test-aarch64 runs the CI set (scripts/test runs it after the cross-build): every case
above, with kiln_cpu_tests filtered to the selection, qd8 and f32 GEMM tests (its whole binary
takes over ten minutes per CPU under emulation here); KILN_AARCH64_ALL=1 (`scripts/test-aarch64
--all`) runs the whole binary.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import (REPO, assert_close, export_named, greedy_chat_reference, kiln_lower, reference_io, run_kiln,
                      spec_of)
from test_gemma4 import QUESTION, gemma_tokenizer  # noqa: F401 (a fixture: the Gemma-style tokenizer)

ALL = os.environ.get("KILN_AARCH64_ALL") == "1"
ARM_BUILD = REPO / "build-aarch64"
SYSROOT = "/usr/aarch64-linux-gnu"
CPUS = ["cortex-a76", "max"]
# what each CPU model has, so what the selection must pick (qemu's CPU models: the A76 is
# Armv8.2-A with the dot product instructions; `max` enables every feature qemu emulates)
EXPECTED = {
    "cortex-a76": {"isa": "dotprod", "qd8_gemm": "qd8_gemm__dotprod", "f32_gemm": "f32_gemm_8x8__neon"},
    "max": {"isa": "i8mm", "qd8_gemm": "qd8_gemm__i8mm", "f32_gemm": "f32_gemm_8x8__neon"},
}


def arm_binary(name: str) -> Path:
    path = ARM_BUILD / name
    if not path.is_file():
        raise AssertionError(f"{path} is missing: build it with scripts/build --target aarch64")
    return path


def qemu(cpu: str, binary: Path, *args, env=None, check=True, timeout=600) -> subprocess.CompletedProcess:
    cmd = ["qemu-aarch64", "-L", SYSROOT, "-cpu", cpu, str(binary), *map(str, args)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


def test_binaries_are_aarch64():
    for name in ("kiln", "kiln_cpu_tests"):
        with open(arm_binary(name), "rb") as f:
            head = f.read(20)
        assert head[:4] == b"\x7fELF" and int.from_bytes(head[18:20], "little") == 183, f"{name} is not an AArch64 ELF"


# -------------------------------------------------------------------- src/cpu variants

# CI: the selection tests, the qd8 products (dotprod / i8mm against the reference formulas)
# and the f32 GEMM tile against the generic one; the whole binary with KILN_AARCH64_ALL=1
CPU_TESTS_CI = "Config.*:Qd8*:*F32Gemm*"


@pytest.mark.parametrize("cpu", CPUS)
def test_cpu_kernels_under_qemu(cpu):
    args = [] if ALL else [f"--gtest_filter={CPU_TESTS_CI}"]
    # the whole binary under emulation takes over ten minutes per CPU on this machine
    proc = qemu(cpu, arm_binary("kiln_cpu_tests"), *args, "--gtest_brief=1", timeout=3600 if ALL else 600)
    assert "PASSED" in proc.stdout, proc.stdout[-2000:]


@pytest.mark.parametrize("isa", ["generic", "neon", "dotprod", "i8mm"])
def test_config_under_each_isa(isa):
    """The selection tables follow KILN_CPU_ISA (the Config tests compare with the variant lists)."""
    env = dict(os.environ, KILN_CPU_ISA=isa)
    proc = qemu("max", arm_binary("kiln_cpu_tests"), "--gtest_filter=Config.*:Qd8Gemm.Selection*", "--gtest_brief=1",
                env=env)
    assert "PASSED" in proc.stdout, proc.stdout[-2000:]


# -------------------------------------------------------------------- models

def _export(tmp_path_factory, model: str, *extra: str) -> Path:
    return export_named(tmp_path_factory.mktemp(f"arm_{model}"), model, "--config", "tiny", "--seq-len", "16", *extra)


@pytest.fixture(scope="module")
def tiny_specs(tmp_path_factory):
    return {"gpt2": _export(tmp_path_factory, "gpt2"), "llama": _export(tmp_path_factory, "llama")}


def _lower(spec: Path, backend: str, quant: str) -> Path:
    if quant == "fp32":
        return kiln_lower(spec, backend)
    out = spec.parent / f"{spec_of(spec)['name']}_{backend}_{quant}.pte"
    run_kiln("lower", "--spec", spec, "--backend", backend, "--quantize", quant, "--out", out, "-q")
    return out


def _run_args(pte: Path, inputs, tmp: Path, tag: str) -> tuple[list, list[Path]]:
    args = ["run", pte]
    for i, x in enumerate(inputs):
        np.save(tmp / f"in{i}.npy", x)
        args += ["--input", tmp / f"in{i}.npy"]
    n_out = len(json.loads(run_kiln("inspect", pte, "--json").stdout)["plans"][0]["outputs"])
    outs = [tmp / f"{tag}_out{i}.npy" for i in range(n_out)]
    for o in outs:
        args += ["--output", o]
    return args, outs


def _bench_json(cpu: str, pte: Path, env=None) -> dict:
    proc = qemu(cpu, arm_binary("kiln"), "bench", pte, "--iters", "1", "--warmup", "0", "--json", env=env)
    return json.loads(proc.stdout)


@pytest.mark.parametrize("cpu", CPUS)
def test_selected_variants_are_the_cpus(tiny_specs, cpu):
    """Under qemu's -cpu max the i8mm variant is selected, on the Cortex-A76 the dotprod one."""
    pte = kiln_lower(tiny_specs["gpt2"], "xnnpack")
    j = _bench_json(cpu, pte, env={k: v for k, v in os.environ.items() if k != "KILN_CPU_ISA"})
    want = EXPECTED[cpu]
    assert (j["isa"], j["best_isa"]) == (want["isa"], want["isa"]), j
    assert j["kernels"]["qd8_gemm"] == want["qd8_gemm"], j["kernels"]
    assert j["kernels"]["f32_gemm"] == want["f32_gemm"], j["kernels"]
    # KILN_CPU_ISA caps the selection
    capped = _bench_json(cpu, pte, env=dict(os.environ, KILN_CPU_ISA="neon"))
    assert capped["isa"] == "neon" and capped["kernels"]["qd8_gemm"] == "qd8_gemm__generic", capped
    if cpu == "max":
        dp = _bench_json(cpu, pte, env=dict(os.environ, KILN_CPU_ISA="dotprod"))
        assert dp["kernels"]["qd8_gemm"] == "qd8_gemm__dotprod", dp


# (model, backend, --quantize, --engine): kiln refuses 8da4w for the portable backend (the
# quantized products are the XNNPACK delegate's), so 8da4w is xnnpack only
RUN_CASES = [(m, b, q, e) for m in ("gpt2", "llama")
             for b, q, e in (("portable", "fp32", "kiln"), ("xnnpack", "fp32", "kiln"), ("xnnpack", "fp32", "xnnpack"),
                             ("xnnpack", "8da4w", "kiln"), ("xnnpack", "8da4w", "xnnpack"))]


@pytest.mark.parametrize("model,backend,quant,engine", RUN_CASES)
@pytest.mark.parametrize("cpu", CPUS)
def test_run_matches_x86(tiny_specs, model, backend, quant, engine, cpu, tmp_path):
    spec = tiny_specs[model]
    pte = _lower(spec, backend, quant)
    ins, refs = reference_io(spec)
    args, x86_outs = _run_args(pte, ins, tmp_path, "x86")
    run_kiln(*args, "--engine", engine)
    arm_args, arm_outs = _run_args(pte, ins, tmp_path, "arm")
    qemu(cpu, arm_binary("kiln"), *arm_args, "--engine", engine)
    what = f"tiny {model} {backend} {quant} --engine {engine} on {cpu}"
    for xo, ao, r in zip(x86_outs, arm_outs, refs, strict=True):
        x, a = np.load(xo), np.load(ao)
        assert_close(a, x, f"{what}: aarch64 vs x86")
        if quant == "fp32":
            assert_close(a, r, f"{what}: aarch64 vs eager PyTorch")


# -------------------------------------------------------------------- generate

def _byte_tokenizer(path: Path):
    """A byte-level BPE tokenizer.json with the 256 byte tokens and no merges (tiny Llama's
    vocabulary is 256), written by the `tokenizers` package."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    assert len(alphabet) == 256
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.save(str(path))


@pytest.fixture(scope="module")
def tiny_llama_llm(tmp_path_factory):
    out = tmp_path_factory.mktemp("arm_llama_llm")
    env = dict(os.environ, PYTHONPATH=str(REPO / "python"))
    subprocess.run([sys.executable, "-m", "kiln_export", "llm", "--arch", "llama", "--config", "tiny",
                    "--max-seq-len", "32", "--out", str(out)], check=True, capture_output=True, env=env)
    _byte_tokenizer(out / "tokenizer.json")
    return out / "model_spec.json"


GEN_CASES = [("xnnpack", "fp32"), ("xnnpack", "8da4w"), ("portable", "fp32")]


@pytest.mark.parametrize("backend,quant", GEN_CASES)
@pytest.mark.parametrize("cpu", CPUS)
def test_generate_greedy_matches_x86(tiny_llama_llm, backend, quant, cpu):
    spec = tiny_llama_llm
    pte = _lower(spec, backend, quant)
    args = ["generate", pte, "--tokenizer", spec.parent / "tokenizer.json", "--prompt", "the quick brown fox",
            "--max-new-tokens", "12", "--temperature", "0", "--ignore-eos", "--json"]
    x86 = json.loads(run_kiln(*args).stdout)
    arm = json.loads(qemu(cpu, arm_binary("kiln"), *args).stdout)
    assert len(x86["tokens"]) >= 12, x86
    assert arm["tokens"] == x86["tokens"], (cpu, backend, quant, arm["tokens"], x86["tokens"])


# -------------------------------------------------------------------- Gemma 4, the second document's form

# The tiny Gemma 4 (sliding window 8, every feature of E2B: tests/python/test_gemma4.py) quantized by torchao
# 8da4w before export and lowered for XNNPACK, in the document's form (the KV cache external: inputs updated in
# place; one program for prefill and decode) and with the cache as buffers; a Gemma-style tokenizer.json
# (SentencePiece-style BPE, byte fallback) and Gemma 4's chat template from test_gemma4. 16 new tokens: the
# 13-token chat prompt and them go round the sliding layers' ring caches.
GEMMA4_FORMS = ["external", "buffers"]
GEMMA4_MAX_SEQ = 32
GEMMA4_NEW = 16


@pytest.fixture(scope="module")
def gemma4_exporting(tmp_path_factory):
    """The two exports (`kiln_export llm --arch gemma4 --dynamic --torchao 8da4w`, about 25 s of CPU each),
    started side by side: {cache form: (folder, process)}."""
    env = dict(os.environ, PYTHONPATH=str(REPO / "python"))
    started = {}
    for cache in GEMMA4_FORMS:
        folder = tmp_path_factory.mktemp(f"arm_gemma4_{cache}")
        with open(folder / "export.log", "w") as log:
            started[cache] = (folder, subprocess.Popen(
                [sys.executable, "-m", "kiln_export", "llm", "--arch", "gemma4", "--config", "tiny", "--max-seq-len",
                 str(GEMMA4_MAX_SEQ), "--seed", "0", "--cache", cache, "--dynamic", "--torchao", "8da4w", "--out",
                 str(folder)], stdout=log, stderr=subprocess.STDOUT, env=env))
    yield started
    for _, proc in started.values():
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def gemma4_torchao_tokens(gemma_tokenizer):
    """(chat prompt ids, torchao eager's greedy tokens): transformers' tiny Gemma 4 with the exporter's seed,
    quantized by torchao in eager as test_gemma4's 8da4w oracle (int4 group scales rounded to bf16 as the
    payload stores them)."""
    sys.path.insert(0, str(REPO / "python"))
    from kiln_export import llm
    from test_llm_programs import _torchao_quantize

    class Args:
        arch, config, gguf, seed = "gemma4", "tiny", None, 0

    model, _, _ = llm.build_model(Args)
    _, hf = gemma_tokenizer
    return greedy_chat_reference(_torchao_quantize(model, "8da4w"), hf, [{"role": "user", "content": QUESTION}],
                                 GEMMA4_NEW)


@pytest.fixture(scope="module")
def gemma4_8da4w(gemma4_exporting, gemma4_torchao_tokens):
    """{cache form: the x86 kiln's 8da4w XNNPACK .pte} (`kiln lower --backend xnnpack` of each export; the
    eager reference is computed while the exports run)."""
    out = {}
    for cache, (folder, proc) in gemma4_exporting.items():
        rc = proc.wait(timeout=900)
        log = (folder / "export.log").read_text()
        assert rc == 0, f"kiln_export llm --arch gemma4 --cache {cache} failed:\n{log[-3000:]}"
        pte = folder / "gemma4_8da4w.pte"
        run_kiln("lower", "--spec", folder / "model_spec.json", "--backend", "xnnpack", "--out", pte, "-q")
        out[cache] = pte
    return out


@pytest.mark.parametrize("cache", GEMMA4_FORMS)
@pytest.mark.parametrize("cpu", CPUS)
def test_gemma4_8da4w_generate_matches_x86(gemma4_8da4w, gemma_tokenizer, gemma4_torchao_tokens, cache, cpu):
    """`kiln generate --chat` greedy on the tiny Gemma 4 8da4w program: the AArch64 kiln under qemu gives the
    x86 kiln's tokens, and both give torchao eager's."""
    folder, _ = gemma_tokenizer
    prompt, want = gemma4_torchao_tokens
    args = ["generate", gemma4_8da4w[cache], "--tokenizer", folder / "tokenizer.json", "--chat", "--prompt",
            QUESTION, "--max-new-tokens", GEMMA4_NEW, "--ignore-eos", "--json"]
    x86 = json.loads(run_kiln(*args).stdout)
    arm = json.loads(qemu(cpu, arm_binary("kiln"), *args).stdout)
    assert x86["prompt_tokens"] == arm["prompt_tokens"] == len(prompt)
    assert x86["tokens"] == want, (cache, x86["tokens"], want)
    assert arm["tokens"] == x86["tokens"], (cpu, cache, arm["tokens"], x86["tokens"])
