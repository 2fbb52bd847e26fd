"""kiln reads a .pt2 exactly as torch does: torch.export.load is the oracle."""
from __future__ import annotations

import json
import operator
import zlib
from collections import Counter

import torch

from conftest import run_kiln


def torch_view(spec_path):
    spec = json.loads(spec_path.read_text())
    ep = torch.export.load(str(spec_path.parent / spec["exported_program"]))
    return spec, ep


def kiln_view(spec_path):
    return json.loads(run_kiln("inspect", spec_path, "--json", "--checksums").stdout)


def test_node_count_and_operator_histogram_match_torch(tiny_gpt2):
    _, ep = torch_view(tiny_gpt2)
    got = kiln_view(tiny_gpt2)
    # torch re-creates operator.getitem nodes for multi-output ops when it
    # deserializes; the archive (and kiln) hold the multi-output call itself.
    calls = [n for n in ep.graph.nodes if n.op == "call_function" and n.target is not operator.getitem]
    assert got["node_count"] == len(calls)
    assert got["operators"] == dict(Counter(str(n.target) for n in calls))


def test_inputs_and_outputs_match_torch(tiny_gpt2):
    spec, ep = torch_view(tiny_gpt2)
    got = kiln_view(tiny_gpt2)
    placeholders = {n.name: n for n in ep.graph.nodes if n.op == "placeholder"}
    want_inputs = []
    for s in ep.graph_signature.input_specs:
        if s.kind == torch.export.graph_signature.InputKind.USER_INPUT:
            v = placeholders[s.arg.name].meta["val"]
            want_inputs.append({"name": s.arg.name, "dtype": str(v.dtype).removeprefix("torch."), "shape": list(v.shape)})
    out_node = next(n for n in ep.graph.nodes if n.op == "output")
    want_outputs = []
    for arg in out_node.args[0]:
        v = arg.meta["val"]
        want_outputs.append({"name": arg.name, "dtype": str(v.dtype).removeprefix("torch."), "shape": list(v.shape)})
    assert got["inputs"] == want_inputs
    assert got["outputs"] == want_outputs
    # and the spec the front end wrote agrees with both
    assert [i["shape"] for i in spec["inputs"]] == [i["shape"] for i in want_inputs]


def test_every_parameter_name_shape_dtype_and_content_match_torch(tiny_gpt2):
    _, ep = torch_view(tiny_gpt2)
    got = {c["name"]: c for c in kiln_view(tiny_gpt2)["constants"]}
    want = dict(ep.state_dict)
    want.update(ep.constants)
    assert set(got) == set(want)
    for name, t in want.items():
        c = got[name]
        assert c["shape"] == list(t.shape), name
        assert c["dtype"] == str(t.dtype).removeprefix("torch."), name
        assert c["bytes"] == t.numel() * t.element_size(), name
        assert c["crc32"] == zlib.crc32(t.detach().contiguous().numpy().tobytes()), name


def test_parameter_totals_count_tied_weights_once(tiny_gpt2):
    _, ep = torch_view(tiny_gpt2)
    got = kiln_view(tiny_gpt2)["parameters"]
    params = [ep.state_dict[name] for name in ep.graph_signature.parameters]
    # torch.export.load restores tied parameters as views of one storage: count each view once.
    unique = {(p.data_ptr(), tuple(p.shape), p.stride()): p for p in params}.values()
    assert got["tensors"] == len(params)
    assert got["unique_tensors"] == len(unique) < len(params)  # GPT-2 ties wte and lm_head
    assert got["elements"] == sum(p.numel() for p in unique)
    assert got["bytes"] == sum(p.numel() * p.element_size() for p in unique)


def test_text_summary_names_inputs_and_operators(tiny_gpt2):
    out = run_kiln("inspect", tiny_gpt2).stdout
    assert "input_ids" in out and "int64[1, 16]" in out
    assert "operators (" in out
