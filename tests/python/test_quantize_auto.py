"""kiln lower --quantize auto --max-size MB (backends/xnnpack/quantize.h: plan_mixed_precision): each linear layer
8da4w or 8da8w by its measured sensitivity, within a size budget, in ExecuTorch's XNNPACK format (qb4w with bf16
scales, qc8w).

Oracles: ExecuTorch's runtime runs every auto file unchanged and kiln's runtime agrees with it on the same file; the
delegate payloads (decoded with ExecuTorch's XNNPACK schema by flatc) hold exactly the per-layer forms the metadata
reports; the file's size on disk is within the budget; PyTorch eager gives the fp32 reference, against which a larger
budget's file is no worse than a smaller one's. The model is test_calibrate's tiny LM (RMSNorms with outlier
channels, gated MLP, LM head)."""
from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest
import torch

from conftest import assert_close, et_execute, run_kiln
from test_calibrate import EVAL, T, TinyLM, V, _byte_tokenizer
from test_xnnpack_runtime import kiln_run


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    out = tmp_path_factory.mktemp("quantize_auto")
    model = TinyLM().eval()
    example = (torch.zeros(1, T, dtype=torch.long), torch.arange(T))
    torch.export.save(torch.export.export(model, example), out / "m.pt2")
    spec = {"name": "m", "model_id": "tests/quantize_auto", "seq_len": T, "exported_program": "m.pt2",
            "ir": "default",
            "inputs": [{"name": "tokens", "dtype": "int64", "shape": [1, T]},
                       {"name": "input_pos", "dtype": "int64", "shape": [T]}],
            "outputs": [{"name": "logits", "dtype": "float32", "shape": [1, T, V]}]}
    (out / "model_spec.json").write_text(json.dumps(spec))
    ids = _byte_tokenizer(out / "tokenizer.json").encode(EVAL).ids
    windows = [np.array([ids[i:i + T]], dtype=np.int64) for i in range(0, len(ids) - T + 1, T)]
    with torch.no_grad():
        refs = [model(torch.from_numpy(w), torch.arange(T)).numpy() for w in windows]
    return out, windows, refs


def _lower(spec_dir, pte, *args, check=True):
    proc = run_kiln("lower", "--spec", spec_dir / "model_spec.json", "--backend", "xnnpack", "--out", pte, *args,
                    check=check)
    return proc


def _filters(pte, tmp) -> Counter:
    """(n, k, datatype) of every quantized filter the file's XNNPACK payloads hold"""
    from executorch.exir._serialize._program import deserialize_pte_binary
    from test_xnnpack_payload import decode_graph

    program = deserialize_pte_binary(pte.read_bytes()).program
    found: Counter = Counter()
    for i, d in enumerate(program.execution_plan[0].delegates):
        assert d.id == "XnnpackBackend"
        (tmp / f"payload{i}").mkdir(parents=True, exist_ok=True)
        graph = decode_graph(program.backend_delegate_data[d.processed.index].data, tmp / f"payload{i}")
        for v in graph["xvalues"]:
            if v["xvalue_union_type"] != "XNNQuantizedTensorValue":
                continue
            t = v["xvalue_union"]["tensor_value"]
            if t["datatype"] in ("xnn_datatype_qbint4", "xnn_datatype_qcint8"):
                found[(*t["dims"], t["datatype"])] += 1
    return found


def _error(pte, windows, refs) -> float:
    """mean squared error of the file's logits (ExecuTorch's runtime) against fp32 eager, over the eval windows"""
    return float(np.mean([np.mean((et_execute(pte, [w, np.arange(T)])[0] - r) ** 2)
                          for w, r in zip(windows, refs, strict=True)]))


def test_auto_within_budget_matches_its_metadata_and_both_runtimes(tiny, tmp_path):
    out, windows, refs = tiny
    # the extremes: every layer int4 / int8 (what the estimate's bounds are checked against)
    sizes = {}
    for scheme in ("8da4w", "8da8w"):
        _lower(out, tmp_path / f"{scheme}.pte", "--quantize", scheme, "-q")
        sizes[scheme] = (tmp_path / f"{scheme}.pte").stat().st_size
    probe = _lower(out, tmp_path / "probe.pte", "--quantize", "auto", "--max-size", "10")
    meta = json.loads((tmp_path / "probe.json").read_text())["quantize_auto"]
    assert meta["int8_layers"] == len(meta["layers"]) == 4, meta  # a budget above all-int8: every layer int8
    assert "auto: 4 of 4 linear layers 8da8w" in probe.stdout, probe.stdout
    # the estimate bounds the written files (the allowance for the graph covers it) and is not far above them
    assert sizes["8da4w"] <= meta["all_int4_bytes"] <= sizes["8da4w"] + 32 * 1024, (sizes, meta)
    assert sizes["8da8w"] <= meta["all_int8_bytes"] <= sizes["8da8w"] + 32 * 1024, (sizes, meta)
    lo, hi = meta["all_int4_bytes"], meta["all_int8_bytes"]
    budgets = [lo, lo + (hi - lo) // 3, lo + 2 * (hi - lo) // 3, hi]
    errors, int8_counts = [], []
    for b in budgets:
        mb = f"{b / 1e6:.6f}"
        pte = tmp_path / f"auto_{b}.pte"
        _lower(out, pte, "--quantize", "auto", "--max-size", mb, "-q")
        m = json.loads(pte.with_suffix(".json").read_text())
        a = m["quantize_auto"]
        assert a["max_size_bytes"] == b and pte.stat().st_size <= b and a["estimate_bytes"] <= b, (b, a)
        # the payloads hold the forms the metadata reports, layer by layer (shape and datatype)
        want = Counter((L["n"], L["k"], "xnn_datatype_qcint8" if L["scheme"] == "8da8w" else "xnn_datatype_qbint4")
                       for L in a["layers"])
        assert _filters(pte, tmp_path / f"p{b}") == want, (b, a["layers"])
        assert m["delegation"]["quantized_nodes"] == 4
        # ExecuTorch's runtime runs the file; kiln's runtime agrees with it
        for w in windows[:2]:
            et = et_execute(pte, [w, np.arange(T)])[0]
            got = kiln_run(pte, [w, np.arange(T)], tmp_path)[0]
            assert_close(got, et, f"auto at {mb} MB: kiln's runtime vs ExecuTorch's runtime, same file")
        errors.append(_error(pte, windows, refs))
        int8_counts.append(a["int8_layers"])
    print(f"auto: int8 layers {int8_counts}, logits mse vs fp32 {errors}")
    assert int8_counts[0] == 0 and int8_counts[-1] == 4 and int8_counts == sorted(int8_counts), int8_counts
    assert 0 < int8_counts[1] < 4 or 0 < int8_counts[2] < 4, int8_counts  # the middle budgets mix the two
    for small, big in zip(errors, errors[1:]):
        assert big <= small, f"a larger budget's file is worse against fp32: {errors}"
    assert errors[-1] < 0.2 * errors[0], errors


@pytest.mark.parametrize("args,message", [
    (["--quantize", "auto", "--max-size", "0.01"], "the smallest file --quantize auto can write is"),
    (["--quantize", "auto"], "--quantize auto needs --max-size"),
    (["--quantize", "8da4w", "--max-size", "1"], "--max-size applies to --quantize auto only"),
    (["--quantize", "auto", "--max-size", "-3"], "--max-size -3"),
])
def test_bad_budget_is_one_clear_line(tiny, tmp_path, args, message):
    out, _, _ = tiny
    pte = tmp_path / "bad.pte"
    proc = _lower(out, pte, *args, "-q", check=False)
    assert proc.returncode == 1 and proc.stderr.startswith("kiln: error: ") and message in proc.stderr, proc.stderr
    assert proc.stderr.count("\n") == 1, proc.stderr
    assert not pte.exists()


def test_budget_below_all_int4_names_the_minimum(tiny, tmp_path):
    out, _, _ = tiny
    _lower(out, tmp_path / "ok.pte", "--quantize", "auto", "--max-size", "10", "-q")
    minimum = json.loads((tmp_path / "ok.json").read_text())["quantize_auto"]["all_int4_bytes"]
    proc = _lower(out, tmp_path / "bad.pte", "--quantize", "auto", "--max-size", f"{(minimum - 2000) / 1e6:.4f}",
                  "-q", check=False)
    assert proc.returncode == 1 and f"is {minimum / 1e6:.2f} MB" in proc.stderr, (minimum, proc.stderr)
    assert not (tmp_path / "bad.pte").exists()
