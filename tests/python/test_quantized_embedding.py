"""kiln lower --quantize-embedding 4|8: embedding tables as ExecuTorch's
quantized_decomposed::embedding_4bit / embedding_byte lookups, and the tied LM
head quantized as an 8da4w linear (--quantize 8da4w), plus --quantize-skip.

Oracles: ExecuTorch's runtime on kiln's file (its quantized kernels library
loaded), and the same quantization computed in PyTorch eager with torchao
(IntxWeightOnlyConfig on the embedding: the rules ExecuTorch's LLM export uses;
Int8DynamicActivationIntxWeightConfig on linear layers, scales rounded to bf16
as ExecuTorch's XNNPACK payload stores them). The embedding lookup is exact
(q * scale in fp32 on both sides), so the fp32 tolerance applies throughout."""
from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch

from conftest import assert_close, run_kiln
from test_xnnpack_runtime import kiln_run

VOCAB, DIM = 96, 64


class TinyLM(torch.nn.Module):
    """Embedding -> MLP -> LM head; the head tied to the embedding or its own linear."""

    def __init__(self, tied: bool, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.embed = torch.nn.Embedding(VOCAB, DIM)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(DIM, 128), torch.nn.GELU(), torch.nn.Linear(128, DIM))
        self.lm_head = torch.nn.Linear(DIM, VOCAB, bias=False)
        if tied:
            self.lm_head.weight = self.embed.weight

    def forward(self, tokens):
        h = self.embed(tokens)
        return self.lm_head(h + self.mlp(h))


def _et_execute(pte, inputs):
    import executorch.kernels.quantized  # noqa: F401  registers quantized_decomposed::embedding_* in the runtime
    from conftest import et_execute

    return et_execute(pte, inputs)


def _export(module, tokens, out, name="tinylm"):
    out.mkdir(parents=True, exist_ok=True)
    torch.export.save(torch.export.export(module, (tokens,)), out / f"{name}.pt2")
    with torch.no_grad():
        y = module(tokens)
    np.save(out / "in.npy", tokens.numpy())
    np.save(out / "out.npy", y.numpy())
    spec = {"name": name, "model_id": f"tests/{name}", "seq_len": int(tokens.shape[-1]),
            "exported_program": f"{name}.pt2", "ir": "default",
            "inputs": [{"name": "tokens", "dtype": "int64", "shape": list(tokens.shape), "reference": "in.npy"}],
            "outputs": [{"name": "logits", "dtype": "float32", "shape": list(y.shape), "reference": "out.npy"}]}
    (out / "model_spec.json").write_text(json.dumps(spec))
    return out / "model_spec.json"


def _torchao_embedding(module: torch.nn.Module, bits: int, group: int):
    """torchao's quantization of every nn.Embedding in `module` (in place), as ExecuTorch's LLM export does."""
    from torchao.quantization import IntxWeightOnlyConfig, PerAxis, PerGroup, quantize_

    cfg = IntxWeightOnlyConfig(weight_dtype=getattr(torch, f"int{bits}"),
                               granularity=PerGroup(group) if group else PerAxis(0))
    quantize_(module, cfg, filter_fn=lambda m, fqn: isinstance(m, torch.nn.Embedding))
    return module


def _torchao_8da4w(module: torch.nn.Module, filter_fn=None, group: int = 32):
    from torchao.quantization import Int8DynamicActivationIntxWeightConfig, PerGroup, quantize_

    quantize_(module, Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int4, weight_granularity=PerGroup(group)),
              filter_fn=filter_fn)
    with torch.no_grad():  # the file keeps bf16 scales: give eager the same ones
        for m in module.modules():
            if isinstance(m, torch.nn.Linear) and hasattr(m.weight, "scale"):
                m.weight.scale.copy_(m.weight.scale.to(torch.bfloat16).to(m.weight.scale.dtype))
    return module


def _untied_copy(model: TinyLM) -> TinyLM:
    """The same weights with the LM head its own parameter (what kiln quantizes twice: table and head)."""
    ref = copy.deepcopy(model)
    ref.lm_head.weight = torch.nn.Parameter(model.embed.weight.detach().clone())
    return ref


def _lower(spec, pte, *flags):
    run_kiln("lower", "--spec", spec, "--backend", "xnnpack", "--out", pte, "-q", *flags)
    return json.loads(pte.with_suffix(".json").read_text())


@pytest.mark.parametrize("bits,group", [(4, 32), (4, 64), (8, 0), (8, 16)])
def test_quantized_embedding_matches_torchao(bits, group, tmp_path):
    model = TinyLM(tied=False, seed=bits + group).eval()
    tokens = torch.randint(0, VOCAB, (1, 12))
    spec = _export(model, tokens, tmp_path / "m")
    flag = f"{bits}:{group}" if group else f"{bits}"
    pte = tmp_path / "q.pte"
    meta = _lower(spec, pte, "--quantize-embedding", flag)
    assert meta["embedding_quantization"]["quantized_embeddings"] == 1, meta["embedding_quantization"]
    ref_model = _torchao_embedding(copy.deepcopy(model), bits, group)
    with torch.no_grad():
        ref = ref_model(tokens).numpy()
        fp32 = model(tokens).numpy()
    assert np.abs(ref - fp32).max() > 1e-4 * np.abs(fp32).max(), "the quantization must be visible"
    et = _et_execute(pte, [tokens.numpy()])[0]
    assert_close(et, ref, f"int{bits} embedding: ExecuTorch's runtime on kiln's file vs torchao eager")
    for engine in ("kiln", "xnnpack"):
        got = kiln_run(pte, [tokens.numpy()], tmp_path, "--engine", engine)[0]
        assert_close(got, ref, f"int{bits} embedding: kiln's runtime ({engine}) vs torchao eager")
    # the table shrank: fp32 [V, D] became int8 or int4 plus fp32 scales
    fp32_pte = tmp_path / "f.pte"
    _lower(spec, fp32_pte)
    saved = fp32_pte.stat().st_size - pte.stat().st_size
    table = VOCAB * DIM * 4
    scales = VOCAB * (DIM // (group or DIM)) * 4
    assert abs(saved - (table - (VOCAB * DIM * bits // 8 + scales))) <= 512, (saved, table)  # tensor metadata and padding aside


@pytest.mark.parametrize("bits", [4])
def test_tied_head_quantized_as_8da4w(bits, tmp_path):
    """Tied embedding + LM head: the table becomes an int4/int8 lookup, the head an 8da4w linear; no fp32 copy left."""
    model = TinyLM(tied=True, seed=7).eval()
    tokens = torch.randint(0, VOCAB, (1, 9))
    spec = _export(model, tokens, tmp_path / "m")
    pte = tmp_path / "q.pte"
    meta = _lower(spec, pte, "--quantize", "8da4w", "--quantize-scales", "minmax", "--quantize-embedding", str(bits))
    assert meta["delegation"]["quantized_nodes"] == 3, meta["delegation"]  # 2 MLP layers + the head
    assert meta["embedding_quantization"]["quantized_embeddings"] == 1
    ref_model = _torchao_8da4w(_torchao_embedding(_untied_copy(model), bits, 32 if bits == 4 else 0))
    with torch.no_grad():
        ref = ref_model(tokens).numpy()
    et = _et_execute(pte, [tokens.numpy()])[0]
    got = kiln_run(pte, [tokens.numpy()], tmp_path)[0]
    assert_close(et, ref, "tied 8da4w: ExecuTorch's runtime on kiln's file vs torchao eager")
    assert_close(got, ref, "tied 8da4w: kiln's runtime on kiln's file vs torchao eager")
    # no fp32 copy of the table remains: against --quantize 8da4w alone (the same 8da4w head, the fp32 table for
    # the lookup), the file lost the fp32 table and gained the quantized one
    head_only = tmp_path / "h.pte"
    _lower(spec, head_only, "--quantize", "8da4w")
    saved = head_only.stat().st_size - pte.stat().st_size
    table = VOCAB * DIM * bits // 8 + VOCAB * (DIM // 32 if bits == 4 else 1) * 4  # the lookup's int table, scales
    assert abs(saved - (VOCAB * DIM * 4 - table)) <= 512, (saved, table)  # tensor metadata aside


def test_tied_head_quantized_lookup_fp32(tmp_path):
    """--quantize 8da4w alone on a tied embedding + LM head: the head is an 8da4w linear and the lookup keeps the
    fp32 table, as torchao quantizes `lm_head` (an nn.Linear) and leaves the nn.Embedding alone; with
    --quantize-skip lm_head the head stays fp32 and reads the lookup's table (one fp32 copy, no int4 head)."""
    model = TinyLM(tied=True, seed=11).eval()
    tokens = torch.randint(0, VOCAB, (1, 9))
    spec = _export(model, tokens, tmp_path / "m")
    pte = tmp_path / "q.pte"
    meta = _lower(spec, pte, "--quantize", "8da4w", "--quantize-scales", "minmax")
    d = meta["delegation"]
    assert (d["quantized_nodes"], d["untied_weights"], d["constants_as_delegate_inputs"]) == (3, 1, 0), d
    assert meta["embedding_quantization"]["quantized_embeddings"] == 0
    ref_model = _torchao_8da4w(_untied_copy(model))  # the head quantized, the embedding fp32
    with torch.no_grad():
        ref = ref_model(tokens).numpy()
        fp32_head = _torchao_8da4w(copy.deepcopy(model), filter_fn=lambda m, fqn: isinstance(m, torch.nn.Linear)
                                   and fqn != "lm_head")(tokens).numpy()
    assert np.abs(ref - fp32_head).max() > 1e-4 * np.abs(ref).max(), "the head's quantization must be visible"
    assert_close(_et_execute(pte, [tokens.numpy()])[0], ref, "tied head 8da4w: ExecuTorch's runtime vs torchao eager")
    for engine in ("kiln", "xnnpack"):
        got = kiln_run(pte, [tokens.numpy()], tmp_path, "--engine", engine)[0]
        assert_close(got, ref, f"tied head 8da4w: kiln's runtime ({engine}) vs torchao eager")
    skip = tmp_path / "s.pte"
    meta = _lower(spec, skip, "--quantize", "8da4w", "--quantize-scales", "minmax", "--quantize-skip", "lm_head")
    d = meta["delegation"]
    assert (d["quantized_nodes"], d["kept_fp32_nodes"], d["untied_weights"]) == (2, 1, 0), d
    assert_close(_et_execute(skip, [tokens.numpy()])[0], fp32_head, "tied head kept fp32: ExecuTorch's runtime")
    assert_close(kiln_run(skip, [tokens.numpy()], tmp_path)[0], fp32_head, "tied head kept fp32: kiln's runtime")
    # the int4 head (weights and bf16 scales) is what the first file has beyond the second
    head = VOCAB * DIM // 2 + VOCAB * (DIM // 32) * 2
    assert abs(pte.stat().st_size - skip.stat().st_size - head) <= 512, (pte.stat().st_size, skip.stat().st_size)


def test_gpt2_quantized_embedding(tmp_path):
    """A GPT-2 (transformers, tiny config, seeded): its token table quantized, the tied head fp32, vs torchao eager."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=256, n_positions=32, n_embd=64, n_layer=2, n_head=4)
    model = GPT2LMHeadModel(cfg).eval()

    class Logits(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, ids):
            return self.m(input_ids=ids, use_cache=False).logits

    tokens = torch.randint(0, cfg.vocab_size, (1, 16))
    spec = _export(Logits(model), tokens, tmp_path / "m", name="gpt2q")
    pte = tmp_path / "q.pte"
    meta = _lower(spec, pte, "--quantize-embedding", "4")
    # the token table is looked up at run time; the position table's lookup of constant positions folds away
    assert meta["embedding_quantization"]["quantized_embeddings"] == 1, meta["embedding_quantization"]
    ref_model = copy.deepcopy(model)
    ref_model.lm_head.weight = torch.nn.Parameter(model.transformer.wte.weight.detach().clone())
    _torchao_embedding(ref_model.transformer.wte, 4, 32)
    with torch.no_grad():
        ref = Logits(ref_model)(tokens).numpy()
    et = _et_execute(pte, [tokens.numpy()])[0]
    got = kiln_run(pte, [tokens.numpy()], tmp_path)[0]
    assert_close(et, ref, "GPT-2 int4 embedding: ExecuTorch's runtime vs torchao eager")
    assert_close(got, ref, "GPT-2 int4 embedding: kiln's runtime vs torchao eager")


def test_quantize_skip_keeps_named_layers_fp32(tmp_path):
    model = TinyLM(tied=False, seed=3).eval()
    tokens = torch.randint(0, VOCAB, (1, 8))
    spec = _export(model, tokens, tmp_path / "m")
    pte = tmp_path / "q.pte"
    proc = run_kiln("lower", "--spec", spec, "--backend", "xnnpack", "--out", pte, "-q", "--quantize", "8da4w",
                    "--quantize-scales", "minmax", "--quantize-skip", "lm_head")
    assert "warning" not in proc.stderr, proc.stderr
    meta = json.loads(pte.with_suffix(".json").read_text())
    assert meta["delegation"]["quantized_nodes"] == 2 and meta["delegation"]["kept_fp32_nodes"] == 1, meta
    ref_model = _torchao_8da4w(copy.deepcopy(model), filter_fn=lambda m, fqn: isinstance(m, torch.nn.Linear)
                               and fqn != "lm_head")
    with torch.no_grad():
        ref = ref_model(tokens).numpy()
    assert_close(_et_execute(pte, [tokens.numpy()])[0], ref, "--quantize-skip: ExecuTorch's runtime vs torchao eager")
    assert_close(kiln_run(pte, [tokens.numpy()], tmp_path)[0], ref, "--quantize-skip: kiln's runtime vs torchao eager")
    # a regex by module path: the MLP's second layer
    meta = _lower(spec, pte, "--quantize", "8da4w", "--quantize-skip", r"^mlp\.2$")
    assert meta["delegation"]["quantized_nodes"] == 2 and meta["delegation"]["kept_fp32_nodes"] == 1


def test_quantize_skip_matching_nothing_warns(tmp_path):
    spec = _export(TinyLM(tied=False).eval(), torch.randint(0, VOCAB, (1, 4)), tmp_path / "m")
    pte = tmp_path / "q.pte"
    proc = run_kiln("lower", "--spec", spec, "--backend", "xnnpack", "--out", pte, "-q", "--quantize", "8da4w",
                    "--quantize-skip", "no_such_layer")
    assert proc.returncode == 0 and "warning" in proc.stderr and "no_such_layer" in proc.stderr, proc.stderr
    assert json.loads(pte.with_suffix(".json").read_text())["delegation"]["quantized_nodes"] == 3


@pytest.mark.parametrize("flags,message", [
    (["--quantize-embedding", "3"], "unknown embedding quantization"),
    (["--quantize-embedding", "4:0"], "bad group size"),
    (["--quantize-embedding", "4:48"], "does not divide"),
    (["--quantize", "8da4w", "--quantize-skip", "(unclosed"], "invalid --quantize-skip"),
    (["--quantize-skip", "lm_head"], "--quantize-skip needs --quantize"),
    (["--quantize", "int3"], "unknown quantization scheme"),
])
def test_bad_quantization_flags_are_one_clear_line(flags, message, tmp_path):
    spec = _export(TinyLM(tied=False).eval(), torch.randint(0, VOCAB, (1, 4)), tmp_path / "m")
    out = tmp_path / "q.pte"
    proc = run_kiln("lower", "--spec", spec, "--backend", "xnnpack", "--out", out, "-q", *flags, check=False)
    assert proc.returncode != 0 and message in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not out.exists()


def test_group_not_dividing_in_features_is_a_clear_error(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(48, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8)).eval()
    x = torch.randn(2, 48)
    out = tmp_path / "m"
    out.mkdir()
    torch.export.save(torch.export.export(model, (x,)), out / "m.pt2")
    np.save(out / "in.npy", x.numpy())
    with torch.no_grad():
        np.save(out / "out.npy", model(x).numpy())
    spec = {"name": "m", "model_id": "tests/m", "seq_len": 2, "exported_program": "m.pt2", "ir": "default",
            "inputs": [{"name": "x", "dtype": "float32", "shape": [2, 48], "reference": "in.npy"}],
            "outputs": [{"name": "y", "dtype": "float32", "shape": [2, 8], "reference": "out.npy"}]}
    (out / "model_spec.json").write_text(json.dumps(spec))
    pte = tmp_path / "q.pte"
    proc = run_kiln("lower", "--spec", out / "model_spec.json", "--backend", "xnnpack", "--out", pte, "-q",
                    "--quantize", "8da4w:32", check=False)
    assert proc.returncode != 0 and "48 input features" in proc.stderr and "group size 32" in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and not pte.exists()
    # keeping that layer fp32 lowers, and the other layer is quantized
    meta = _lower(out / "model_spec.json", pte, "--quantize", "8da4w:32", "--quantize-skip", "^0$")
    assert meta["delegation"]["quantized_nodes"] == 1 and meta["delegation"]["kept_fp32_nodes"] == 1


def test_int8_weight_only_matches_torchao(tmp_path):
    """--quantize int8w: int8 weights per output channel, fp32 activations, in ExecuTorch's form for torchao's
    weight-only int8 (quantized_decomposed::dequantize_per_channel on the portable path, the product in fp32)."""
    from torchao.quantization import IntxWeightOnlyConfig, PerAxis, quantize_

    model = TinyLM(tied=True, seed=11).eval()
    tokens = torch.randint(0, VOCAB, (1, 7))
    spec = _export(model, tokens, tmp_path / "m")
    pte = tmp_path / "q.pte"
    meta = _lower(spec, pte, "--quantize", "int8w", "--quantize-scales", "minmax", "--quantize-embedding", "8")
    assert meta["delegation"]["quantization"] == "int8w" and meta["delegation"]["quantized_nodes"] == 3, meta
    ref_model = _torchao_embedding(_untied_copy(model), 8, 0)
    quantize_(ref_model, IntxWeightOnlyConfig(weight_dtype=torch.int8, granularity=PerAxis(0)),
              filter_fn=lambda m, fqn: isinstance(m, torch.nn.Linear))
    with torch.no_grad():
        ref = ref_model(tokens).numpy()
        fp32 = model(tokens).numpy()
    assert np.abs(ref - fp32).max() > 1e-5 * np.abs(fp32).max(), "the quantization must be visible"
    assert_close(_et_execute(pte, [tokens.numpy()])[0], ref, "int8w: ExecuTorch's runtime vs torchao eager")
    for engine in ("kiln", "xnnpack"):
        got = kiln_run(pte, [tokens.numpy()], tmp_path, "--engine", engine)[0]
        assert_close(got, ref, f"int8w: kiln's runtime ({engine}) vs torchao eager")
    weights = 4 * (VOCAB * DIM + 2 * DIM * 128)
    assert pte.stat().st_size < weights * 0.45, (pte.stat().st_size, weights)
