"""kiln bench-llm on a tiny Llama (random seeded weights): kiln's own .pte and
ExecuTorch's lowering of the same program (XnnpackPartitioner, its constant
methods given as ExecuTorch's LLM export does). Its JSON has every key, one row
per thread count, one positive rate per repetition, and the cache/vocab the
model was exported with; bad input is one clear line and exit 1. No timing
thresholds."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from conftest import REPO, export_model, run_export, run_kiln

MAX_SEQ = 32


@pytest.fixture(scope="module")
def llm_ptes(tmp_path_factory):
    """{'kiln': kiln's xnnpack .pte, 'executorch': ExecuTorch's xnnpack .pte} of one tiny Llama, and its config."""
    import torch
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    sys.path.insert(0, str(REPO / "python"))
    from kiln_export import llm

    out = tmp_path_factory.mktemp("bench_llm")
    run_export("llm", "--arch", "llama", "--config", "tiny", "--max-seq-len", MAX_SEQ, "--out", out)
    spec = out / "model_spec.json"
    kiln_pte = out / "kiln.pte"
    run_kiln("lower", "--spec", spec, "--backend", "xnnpack", "--out", kiln_pte, "-q")
    cfg = llm.tiny_config("llama", "tiny")
    ep = torch.export.load(str(out / json.loads(spec.read_text())["exported_program"]))
    methods = json.loads(spec.read_text())["constant_methods"]  # what ExecuTorch's LLM runner reads
    assert methods["get_max_seq_len"] == MAX_SEQ
    et_pte = out / "et.pte"
    et_pte.write_bytes(to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()],
                                                   constant_methods=methods).to_executorch().buffer)
    return {"kiln": kiln_pte, "executorch": et_pte}, cfg


@pytest.mark.parametrize("which", ["kiln", "executorch"])
def test_bench_llm_json(llm_ptes, which):
    ptes, cfg = llm_ptes
    proc = run_kiln("bench-llm", ptes[which], "-p", "8", "-n", "6", "--threads", "1,2", "--reps", "3", "--json")
    j = json.loads(proc.stdout)
    assert j["max_seq_len"] == MAX_SEQ and j["vocab"] == cfg.vocab_size and j["tokens_per_call"] == 1
    assert (j["prefill_tokens"], j["decode_tokens"], j["reps"]) == (8, 6, 3)
    assert "one token per forward call" in j["note"] and j["load_ms"] > 0
    assert [r["threads"] for r in j["results"]] == [1, 2]
    for r in j["results"]:
        assert len(r["prefill_runs"]) == 3 and len(r["decode_runs"]) == 3, r
        assert all(v > 0 for v in r["prefill_runs"] + r["decode_runs"]), r
        assert sorted(r["prefill_runs"])[1] == r["prefill_tokens_per_s"], r  # the median of three
        assert sorted(r["decode_runs"])[1] == r["decode_tokens_per_s"], r


def test_bench_llm_table_and_skipped_tests(llm_ptes):
    ptes, _ = llm_ptes
    table = run_kiln("bench-llm", ptes["kiln"], "-p", "4", "-n", "4", "--threads", "2", "--reps", "1").stdout
    assert "one token per forward call" in table
    rows = [l for l in table.splitlines() if l.startswith("|") and ("pp4" in l or "tg4" in l)]
    assert len(rows) == 2 and all(float(l.split("|")[3]) > 0 for l in rows), table
    # -n 0: prefill only; a full cache exactly (-p = max_seq_len) fits
    j = json.loads(run_kiln("bench-llm", ptes["kiln"], "-p", str(MAX_SEQ), "-n", "0", "--reps", "1", "--json").stdout)
    assert j["results"][0]["decode_tokens_per_s"] is None and j["results"][0]["prefill_tokens_per_s"] > 0


def test_bench_llm_bad_input_is_one_clear_line(llm_ptes, tmp_path):
    ptes, _ = llm_ptes
    gpt2_spec = export_model(tmp_path / "gpt2", "--config", "tiny", "--seq-len", "16")
    gpt2_pte = tmp_path / "gpt2.pte"
    run_kiln("lower", "--spec", gpt2_spec, "--backend", "portable", "--out", gpt2_pte, "-q")
    pte = ptes["kiln"]
    cases = [
        ([gpt2_pte], "not an LLM program"),
        ([tmp_path / "missing.pte"], "missing.pte"),
        ([pte, "-p", str(MAX_SEQ), "-n", "1"], "do not fit the model's KV cache (32 positions)"),
        ([pte, "-p", "0", "-n", "0"], "not both 0"),
        ([pte, "--reps", "0"], "--reps must be >= 1"),
    ] + [([pte, "--threads", bad], "--threads: ") for bad in ["0", "1,,2", "a", "", "2,", "-1", "1.5", "99999"]]
    for args, message in cases:
        proc = run_kiln("bench-llm", *args, check=False)
        assert proc.returncode == 1 and message in proc.stderr, (args, proc.returncode, proc.stderr)
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
