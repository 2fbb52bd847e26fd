"""The real-size export path at tiny size (issue 38, item 2): kiln_export's .pt2 writer (pt2_writer.save) and the
deferred weights of Gemma 4's real configurations (gemma4.build_deferred), which together write E2B's bf16 .pt2
without the model ever whole in memory (bench/RESULTS.md, "Real size", has the real-size run).

Oracle: torch.export.save and torch.export.load. The writer's archive holds the same entries with the same bytes
as torch.export.save's, and loads back (torch.export.load) as the same program: same graph, same weights. A
program exported with deferred (fake) weights and written with their values equals torch's own export and save of
the real model holding those values.
"""
from __future__ import annotations

import os
import subprocess
import sys
import zipfile

import pytest

from conftest import REPO

sys.path.insert(0, str(REPO / "python"))


def _same_program(a, b):
    import torch

    assert str(a.graph) == str(b.graph)
    assert a.graph_signature == b.graph_signature
    assert sorted(a.state_dict) == sorted(b.state_dict) and sorted(a.constants) == sorted(b.constants)
    for name in a.state_dict:
        x, y = a.state_dict[name], b.state_dict[name]
        assert x.dtype == y.dtype and torch.equal(x, y), name
    for name in a.constants:
        assert torch.equal(a.constants[name], b.constants[name]), name


def _entries(path):
    with zipfile.ZipFile(path) as z:  # the archive's root folder is named after the file
        return {n.split("/", 1)[1]: z.read(n) for n in z.namelist()}


@pytest.mark.parametrize("arch", ["llama", "gemma4"])
def test_writer_archive_equals_torch_export_save(arch, tmp_path, monkeypatch):
    import torch
    from torch.export.pt2_archive import _package

    from kiln_export import llm, pt2_writer

    class Args:
        config, gguf, seed, dtype = "tiny", None, 0, "bf16"

    Args.arch = arch
    model, _, _ = llm.build_model(Args)
    ep = llm.export(llm.make_module(model, 16, False), 1, False)
    torch.export.save(ep, tmp_path / "a.pt2")

    def no_copies(_):
        raise AssertionError("the writer copied a tensor's bytes")

    monkeypatch.setattr(_package, "_get_raw_tensor_bytes", no_copies)
    pt2_writer.save(ep, tmp_path / "b.pt2")
    a, b = _entries(tmp_path / "a.pt2"), _entries(tmp_path / "b.pt2")
    assert sorted(a) == sorted(b)
    assert [n for n in a if a[n] != b[n]] == []
    _same_program(torch.export.load(tmp_path / "b.pt2"), ep)


def test_deferred_weights_equal_torchs_export_of_those_weights(tmp_path):
    """gemma4.build_deferred (fake linear and embedding weights, their values given as the archive is written)
    against torch's own route: the real model given the same values, exported and saved by torch."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensor

    from kiln_export import gemma4, llm, pt2_writer

    model, materialize = gemma4.build_deferred("tiny", 0, llm.ATTN_IMPLEMENTATION, dtype=torch.bfloat16)
    ep = llm.export(llm.make_module(model, 16, False), 1, False)
    fakes = [n for n, t in ep.state_dict.items() if isinstance(t, FakeTensor)]
    assert len(fakes) > 10 and "model.lm_head.weight" in fakes  # the tied head: one tensor, written once
    pt2_writer.save(ep, tmp_path / "deferred.pt2", materialize=materialize)
    deferred = torch.export.load(tmp_path / "deferred.pt2")
    assert deferred.state_dict["model.lm_head.weight"].data_ptr() == \
        deferred.state_dict["model.model.embed_tokens.weight"].data_ptr()
    assert float(deferred.state_dict["model.model.layers.0.self_attn.q_proj.weight"].float().std()) > 0.01

    real = gemma4.build("tiny", 0, llm.ATTN_IMPLEMENTATION, dtype=torch.bfloat16)
    wrapper = llm.make_module(real, 16, False)
    with torch.no_grad():  # the deferred program's weight values, put in the real model
        params = dict(wrapper.named_parameters(remove_duplicate=False))
        for n in fakes:
            params[n].copy_(deferred.state_dict[n])
    torch.export.save(llm.export(wrapper, 1, False), tmp_path / "real.pt2")
    _same_program(deferred, torch.export.load(tmp_path / "real.pt2"))


def test_deferred_weights_only_for_seeded_gemma4(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO / "python"))
    cmd = [sys.executable, "-m", "kiln_export", "llm", "--arch", "llama", "--config", "tiny", "--max-seq-len", "8",
           "--deferred-weights", "--out", str(tmp_path / "x")]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    assert proc.returncode == 2 and "--deferred-weights is for --arch gemma4" in proc.stderr, proc.stderr[-2000:]
    assert not (tmp_path / "x" / "llama.pt2").exists()
