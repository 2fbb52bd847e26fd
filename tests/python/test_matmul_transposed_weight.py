"""`x @ W.t()` with W a constant (torch.export's default IR: aten.t / transpose / permute, then matmul or mm).

A weight of its own: the XNNPACK delegate gets one fully connected node per product, W its filter as it is
(no transpose per run, no batch matrix multiply). A weight tied to an embedding table (GPT-2's LM head written
as a matmul): the table is also read by the portable embedding lookup, so it reaches the delegate as an input;
kiln computes (W @ x^T)^T as its linear lowering does, so only the activations are transposed, never W.
Every output against eager, kiln's .pte on both backends in both runtimes.
"""
from __future__ import annotations

from pathlib import Path

import torch
from executorch.exir._serialize._program import deserialize_pte_binary

from conftest import et_execute, kiln_lower
from test_functionalize import compare, export_mutating, io_of
from test_xnnpack_payload import decode_graph
from test_xnnpack_runtime import kiln_run

V, K = 10, 8  # W [V, K]: no activation below has these sizes


class OwnWeight(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.W = torch.nn.Parameter(torch.randn(V, K))

    def forward(self, x):
        return x @ self.W.t(), torch.mm(x[0], self.W.transpose(0, 1)), torch.matmul(x[1], self.W.permute(1, 0))


class TiedWeight(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(V, K)

    def forward(self, ids, x):
        return self.emb(ids) * 2.0, x @ self.emb.weight.t()


def payload_graphs(pte: Path, tmp: Path) -> list[dict]:
    program = deserialize_pte_binary(pte.read_bytes()).program
    graphs = []
    for i, d in enumerate(program.execution_plan[0].delegates):
        assert d.id == "XnnpackBackend"
        (tmp / f"payload{i}").mkdir(parents=True, exist_ok=True)
        graphs.append(decode_graph(program.backend_delegate_data[d.processed.index].data, tmp / f"payload{i}"))
    return graphs


def lower_and_check(module, inputs, tmp_path: Path, name: str) -> list[dict]:
    torch.manual_seed(0)
    spec = export_mutating(module, inputs, tmp_path / name, name)
    ins, refs = io_of(spec)
    for backend in ("portable", "xnnpack"):
        pte = kiln_lower(spec, backend)
        compare(et_execute(pte, [x.copy() for x in ins]), refs, f"kiln {backend} .pte of {name} in ExecuTorch's runtime")
        compare(kiln_run(pte, ins, tmp_path), refs, f"kiln {backend} .pte of {name} in kiln's runtime")
    return payload_graphs(kiln_lower(spec, "xnnpack"), tmp_path / f"{name}_payload")


def test_own_weight_is_a_fully_connected_filter(tmp_path):
    torch.manual_seed(0)
    graphs = lower_and_check(OwnWeight(), (torch.randn(2, 3, K),), tmp_path, "own")
    types = [n["xnode_union_type"] for g in graphs for n in g["xnodes"]]
    assert types.count("XNNFullyConnected") == 3, types
    assert "XNNBatchMatrixMultiply" not in types and "XNNStaticTranspose" not in types, types
    for g in graphs:  # each filter is W as it is: [V, K], not transposed (flags 0)
        dims = {v["xvalue_union"]["id_out"]: v["xvalue_union"]["dims"] for v in g["xvalues"]}
        for n in g["xnodes"]:
            if n["xnode_union_type"] == "XNNFullyConnected":
                assert dims[n["xnode_union"]["filter_id"]] == [V, K] and n["xnode_union"]["flags"] == 0, n


def test_tied_weight_is_not_transposed_per_run(tmp_path):
    torch.manual_seed(0)
    ids = torch.tensor([[1, 4, 9]])
    graphs = lower_and_check(TiedWeight(), (ids, torch.randn(2, 3, K)), tmp_path, "tied")
    products = 0
    for g in graphs:
        dims = {v["xvalue_union"]["id_out"]: v["xvalue_union"]["dims"] for v in g["xvalues"]}
        for n in g["xnodes"]:
            u = n["xnode_union"]
            if n["xnode_union_type"] == "XNNStaticTranspose":
                assert dims[u["input_id"]] != [V, K], "W transposed on every run"
            if n["xnode_union_type"] in ("XNNBatchMatrixMultiply", "XNNFullyConnected"):
                operands = [u.get("input1_id"), u.get("input2_id"), u.get("filter_id")]
                products += any(o is not None and dims.get(o) == [V, K] for o in operands)
    assert products == 1, "the LM head's product does not read W as it is"
