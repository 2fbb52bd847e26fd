"""XNNPACK delegate payloads built by kiln, run by ExecuTorch 1.5's XnnpackBackend.

Hand-made edge-graph regions are described in JSON, turned into a program of
XNNPACK delegate calls by tests/xnnpack/xnnpack_region_smoke.cpp (kiln's
payload builder + .pte writer), executed with `executorch.runtime`, and
compared with PyTorch eager on the same inputs and weights:

(a) y = x @ W^T + b (permute_copy + addmm) as one fully connected node with W
    in named data, laid out as ExecuTorch's own lowering of nn.Linear;
(b) an attention-like chain: permute, bmm, mul by a scalar, softmax, bmm;
(c) two delegate calls sharing one weight through named data, stored once;
(d) a GPT-2 style block as one region, and every row of the support table on
    small shapes;
(e) the format: kiln's schema against ExecuTorch's, the XNNHeader, and the
    graph decoded with ExecuTorch's schema (external ids, flags, constants);
(f) what the builder and the support check refuse, and why.
"""
from __future__ import annotations

import itertools
import json
import math
import re
import struct
import subprocess
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import assert_close

UINT32_MAX = 0xFFFFFFFF
UINT64_MAX = 0xFFFFFFFFFFFFFFFF


def _xnn_schema() -> Path:
    import executorch.backends.xnnpack.serialization as ser  # a namespace package: no __file__

    return Path(next(iter(ser.__path__))) / "schema.fbs"


@pytest.fixture(scope="session")
def smoke(kiln_bin) -> Path:
    path = kiln_bin.parent / "kiln_xnnpack_smoke"
    if not path.is_file():
        raise RuntimeError(f"kiln_xnnpack_smoke not found next to {kiln_bin}; build the test tools first")
    return path


# ---------------------------------------------------------------------------
# A small builder of edge graphs: every node is also evaluated eagerly with the
# same ATen operator, which gives its output shapes and the op-by-op reference.


class Ref(str):
    """The name of a graph value, as a node argument."""


def _aten(target: str):
    if target.startswith("dim_order_ops."):  # ExecuTorch's dim-order copies act as clones here
        return lambda self, **_: torch.ops.aten.clone.default(self)
    ns, op, overload = target.split(".")
    return getattr(getattr(getattr(torch.ops, ns), op), overload)


class Graph:
    def __init__(self, tmp: Path, seed: int = 0):
        self.tmp = tmp
        self.rng = np.random.default_rng(seed)
        self.values, self.constants, self.nodes = [], [], []
        self.inputs, self.eager, self.regions = [], {}, []
        self.const_names, self.counter = [], itertools.count()

    def _value(self, name: str, t: torch.Tensor) -> Ref:
        self.values.append({"name": name, "shape": list(t.shape), "dtype": str(t.dtype).replace("torch.", "")})
        self.eager[name] = t
        return Ref(name)

    def input(self, name: str, shape, low=-1.0, high=1.0, dtype=np.float32) -> Ref:
        a = self.rng.uniform(low, high, size=shape).astype(dtype)
        self.inputs.append(name)
        return self._value(name, torch.from_numpy(a))

    def const(self, name: str, array: np.ndarray, key: str | None = None) -> Ref:
        path = self.tmp / f"{name}.npy"
        np.save(path, array)
        self.constants.append({"value": name, "npy": str(path), "key": name if key is None else key})
        self.const_names.append(name)
        return self._value(name, torch.from_numpy(array.copy()))

    def random_const(self, name: str, shape, key: str | None = None, scale=0.5) -> Ref:
        return self.const(name, (self.rng.standard_normal(shape) * scale).astype(np.float32), key)

    def _eager_arg(self, a):
        if isinstance(a, Ref):
            return self.eager[a]
        if isinstance(a, list) and a and all(isinstance(x, Ref) for x in a):
            return [self.eager[x] for x in a]
        return a

    def _json_arg(self, a):
        if isinstance(a, Ref):
            return {"t": str(a)}
        if isinstance(a, list) and a and all(isinstance(x, Ref) for x in a):
            return {"ts": [str(x) for x in a]}
        return a

    def op(self, target: str, /, **args):
        """Adds a node; returns its output (a Ref, or a tuple/list of Refs)."""
        result = _aten(target)(**{k: self._eager_arg(v) for k, v in args.items()})
        n = next(self.counter)
        name = f"n{n}_{target.split('.')[1]}"

        def out(t, i):
            return self._value(f"{name}_out{i}", t)

        if isinstance(result, torch.Tensor):
            ret = out(result, 0)
            json_outs = [str(ret)]
        elif isinstance(result, list):  # one tensor-list output
            ret = [out(t, i) for i, t in enumerate(result)]
            json_outs = [[str(r) for r in ret]]
        else:  # several outputs
            ret = tuple(out(t, i) for i, t in enumerate(result))
            json_outs = [str(r) for r in ret]
        self.nodes.append({"name": name, "target": target, "args": {k: self._json_arg(v) for k, v in args.items()},
                           "outputs": json_outs})
        return ret

    def op_unevaluated(self, target: str, shape, /, **args) -> Ref:
        """Adds a node torch cannot evaluate (for refusals); its one output has `shape`."""
        name = f"n{next(self.counter)}_{target.split('.')[1]}"
        out = self._value(f"{name}_out0", torch.zeros(shape))
        self.nodes.append({"name": name, "target": target, "args": {k: self._json_arg(v) for k, v in args.items()},
                           "outputs": [str(out)]})
        return out

    def region(self, nodes, inputs, outputs, constants):
        self.regions.append({"nodes": nodes, "inputs": [str(x) for x in inputs], "outputs": [str(x) for x in outputs],
                             "constants": [str(x) for x in constants]})

    def spec(self, outputs, regions=None) -> dict:
        regions = regions if regions is not None else self.regions or [
            {"nodes": [n["name"] for n in self.nodes], "inputs": list(self.inputs),
             "outputs": [str(o) for o in outputs], "constants": list(self.const_names)}]
        return {"values": self.values, "constants": self.constants, "nodes": self.nodes, "inputs": self.inputs,
                "outputs": [str(o) for o in outputs], "regions": regions}


class Built:
    def __init__(self, pte: Path, stats: dict, payloads: list[bytes]):
        self.pte, self.stats, self.payloads = pte, stats, payloads


def build(smoke: Path, tmp: Path, spec: dict, name: str = "prog") -> Built:
    spec_path = tmp / f"{name}.json"
    spec_path.write_text(json.dumps(spec))
    pte = tmp / f"{name}.pte"
    pdir = tmp / f"{name}_payloads"
    pdir.mkdir(exist_ok=True)
    proc = subprocess.run([str(smoke), str(spec_path), str(pte), "--payloads", str(pdir)], capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stderr
    stats = json.loads(proc.stdout)
    payloads = [(pdir / f"payload_{i}.bin").read_bytes() for i in range(len(spec["regions"]))]
    return Built(pte, stats, payloads)


def build_error(smoke: Path, tmp: Path, spec: dict) -> str:
    spec_path = tmp / "bad.json"
    spec_path.write_text(json.dumps(spec))
    proc = subprocess.run([str(smoke), str(spec_path), str(tmp / "bad.pte")], capture_output=True, text=True)
    assert proc.returncode == 1, (proc.returncode, proc.stdout)
    assert not (tmp / "bad.pte").exists()
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    return lines[0]


def et_run(pte: Path, inputs):
    from executorch.runtime import Runtime

    method = Runtime.get().load_program(str(pte)).load_method("forward")
    return [o.numpy() for o in method.execute([torch.as_tensor(x) for x in inputs])]


def run_and_compare(smoke, tmp, g: Graph, outputs, refs=None, name="prog") -> Built:
    """Builds the graph as one region (or g's regions), runs it in ExecuTorch, compares with `refs`
    (default: the op-by-op eager values of `outputs`) at DESIGN's fp32 tolerance."""
    built = build(smoke, tmp, g.spec(outputs), name)
    got = et_run(built.pte, [g.eager[i] for i in g.inputs])
    refs = refs if refs is not None else [g.eager[o] for o in outputs]
    assert len(got) == len(refs)
    for i, (a, r) in enumerate(zip(got, refs)):
        assert_close(a, r.detach().numpy(), f"{name} output {i}")
    return built


# ---------------------------------------------------------------------------
# Reading payloads: the XNNHeader, and the graph decoded with ExecuTorch's schema.


def parse_header(payload: bytes) -> dict:
    assert payload[0:4] == b"\0\0\0\0" and payload[4:8] == b"XH00"
    (length,) = struct.unpack_from("<H", payload, 8)
    fb_off, fb_size, c_off = struct.unpack_from("<III", payload, 10)
    (c_size,) = struct.unpack_from("<Q", payload, 22)
    return {"length": length, "fb_offset": fb_off, "fb_size": fb_size, "const_offset": c_off, "const_size": c_size}


def decode_graph(payload: bytes, tmp: Path) -> dict:
    h = parse_header(payload)
    fb = payload[h["fb_offset"]:h["fb_offset"] + h["fb_size"]]
    assert fb[4:8] == b"XN01"
    out = tmp / "decoded"
    out.mkdir(exist_ok=True)
    (out / "graph.bin").write_bytes(fb)
    proc = subprocess.run(["flatc", "--json", "--strict-json", "--raw-binary", "--defaults-json", "-o", str(out),
                           str(_xnn_schema()), "--", str(out / "graph.bin")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    text = re.sub(r"(?<=[\s:\[,])(-?)inf\b", r"\1Infinity", (out / "graph.json").read_text())  # flatc writes inf
    return json.loads(text)


def node_types(graph: dict) -> list[str]:
    return [n["xnode_union_type"] for n in graph["xnodes"]]


def check_payload_invariants(payload: bytes, graph: dict, n_in: int, n_out: int, named_keys: set):
    """What ExecuTorch's XNNHeader::Parse and XNNCompiler rely on."""
    h = parse_header(payload)
    assert h["length"] == 30 and h["fb_offset"] == 32
    assert h["const_offset"] % 16 == 0 and h["const_offset"] >= h["fb_offset"] + h["fb_size"]
    assert h["const_offset"] + h["const_size"] == len(payload)
    assert graph["num_externs"] == n_in + n_out
    values = [v["xvalue_union"] for v in graph["xvalues"]]
    assert all(v["xvalue_union_type"] == "XNNTensorValue" for v in graph["xvalues"])
    assert sorted(v["id_out"] for v in values) == list(range(len(values)))
    by_ext = {v["external_id"]: v for v in values if v["external_id"] != UINT32_MAX}
    assert sorted(by_ext) == list(range(n_in + n_out))
    for e, v in by_ext.items():
        assert v["flags"] == (1 if e < n_in else 2) and v["constant_buffer_idx"] == 0
    for v in values:
        if v["external_id"] == UINT32_MAX:
            assert v["flags"] == 0
        assert v["num_dims"] == len(v["dims"]) >= 1
    assert graph["input_ids"] == [by_ext[i]["id_out"] for i in range(n_in)]
    assert graph["output_ids"] == [by_ext[n_in + j]["id_out"] for j in range(n_out)]
    cd = graph["constant_data"]
    assert cd[0]["offset"] == 0 and cd[0]["size"] == 0 and "named_key" not in cd[0]
    assert h["const_size"] == 0  # every constant is named data (kept alive by the program, unlike the payload)
    for c in cd[1:]:
        assert c["offset"] == UINT64_MAX and c["named_key"] in named_keys
    assert len({c["named_key"] for c in cd[1:]}) == len(cd) - 1
    for v in values:
        idx = v["constant_buffer_idx"]
        assert 0 <= idx < len(cd)
        if idx:
            assert cd[idx]["size"] == 4 * math.prod(v["dims"])
    ids = {v["id_out"] for v in values}
    for n in graph["xnodes"]:
        for k, x in n["xnode_union"].items():
            if k.endswith("_id") and x != UINT32_MAX:
                assert x in ids, (n, k)


def pte_named_data(pte: Path) -> dict:
    """key -> bytes of the program's named data, read by ExecuTorch's deserializer."""
    from executorch.exir._serialize._program import deserialize_pte_binary

    f = deserialize_pte_binary(pte.read_bytes())
    store = f.named_data
    if store is None:
        return {}
    out = {k: bytes(store.buffers[e.buffer_index]) for k, e in store.pte_data.items()}
    assert len(store.buffers) == len(out), "a named data buffer is stored twice"
    return out


# ---------------------------------------------------------------------------
# (a) y = x @ W^T + b


def linear_graph(tmp, in_f=24, out_f=40, rows=6):
    g = Graph(tmp, seed=1)
    x = g.input("x", (rows, in_f))
    w = g.random_const("W", (out_f, in_f), key="weights/W")
    b = g.random_const("b", (out_f,), key="weights/b")
    wt = g.op("aten.permute_copy.default", self=w, dims=[1, 0])
    y = g.op("aten.addmm.default", self=b, mat1=x, mat2=wt)
    return g, x, w, b, y


def test_linear_is_one_fully_connected(smoke, tmp_path):
    g, x, w, b, y = linear_graph(tmp_path)
    ref = torch.nn.functional.linear(g.eager[x], g.eager[w], g.eager[b])
    built = run_and_compare(smoke, tmp_path, g, [y], [ref])
    graph = decode_graph(built.payloads[0], tmp_path)
    assert node_types(graph) == ["XNNFullyConnected"]
    fc = graph["xnodes"][0]["xnode_union"]
    values = {v["xvalue_union"]["id_out"]: v["xvalue_union"] for v in graph["xvalues"]}
    assert fc["flags"] == 0 and values[fc["filter_id"]]["dims"] == [40, 24]  # W as is: [out, in]
    assert values[fc["bias_id"]]["dims"] == [40]
    assert values[fc["input1_id"]]["flags"] == 1 and values[fc["output_id"]]["flags"] == 2
    keys = {c.get("named_key") for c in graph["constant_data"][1:]}
    assert keys == {"weights/W", "weights/b"}
    assert built.stats["regions"][0]["absorbed_nodes"] == 1
    check_payload_invariants(built.payloads[0], graph, 1, 1, keys)
    named = pte_named_data(built.pte)
    assert named["weights/W"] == np.load(tmp_path / "W.npy").tobytes()
    assert named["weights/b"] == np.load(tmp_path / "b.npy").tobytes()


def _canonical(graph: dict) -> list:
    """The graph with value ids replaced by what the values are."""
    values = {v["xvalue_union"]["id_out"]: v["xvalue_union"] for v in graph["xvalues"]}
    cd = graph["constant_data"]

    def describe(i):
        if i == UINT32_MAX:
            return None
        v = values[i]
        if v["constant_buffer_idx"]:
            c = cd[v["constant_buffer_idx"]]
            return ("constant", tuple(v["dims"]), c["size"], "named_key" in c and c["named_key"] != "")
        if v["external_id"] != UINT32_MAX:
            return ("external", v["external_id"], v["flags"], tuple(v["dims"]))
        return ("internal", tuple(v["dims"]))

    return [(n["xnode_union_type"],
             sorted((k, describe(x) if k.endswith("_id") else x) for k, x in n["xnode_union"].items()))
            for n in graph["xnodes"]]


def test_linear_payload_matches_executorch_lowering(smoke, tmp_path):
    """ExecuTorch's own XNNPACK lowering of nn.Linear gives the same graph, value for value."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower
    from executorch.exir._serialize._program import deserialize_pte_binary

    g, x, w, b, y = linear_graph(tmp_path)
    built = build(smoke, tmp_path, g.spec([y]))
    lin = torch.nn.Linear(24, 40)
    with torch.no_grad():
        lin.weight.copy_(g.eager[w])
        lin.bias.copy_(g.eager[b])
    ep = torch.export.export(lin, (g.eager[x],))
    et = to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()]).to_executorch()
    program = deserialize_pte_binary(et.buffer).program
    (delegate,) = program.execution_plan[0].delegates
    assert delegate.id == "XnnpackBackend"
    et_payload = program.backend_delegate_data[delegate.processed.index].data
    (tmp_path / "et").mkdir()
    et_graph = decode_graph(et_payload, tmp_path / "et")
    kiln_graph = decode_graph(built.payloads[0], tmp_path)
    assert _canonical(kiln_graph) == _canonical(et_graph)
    assert parse_header(built.payloads[0])["const_size"] == parse_header(et_payload)["const_size"] == 0


# ---------------------------------------------------------------------------
# (b) attention-like chain


def test_attention_chain(smoke, tmp_path):
    g = Graph(tmp_path, seed=2)
    bsz, s, d = 3, 7, 16
    q, k, v = (g.input(n, (bsz, s, d)) for n in "qkv")
    kt = g.op("aten.permute_copy.default", self=k, dims=[0, 2, 1])
    scores = g.op("aten.bmm.default", self=q, mat2=kt)
    scaled = g.op("aten.mul.Scalar", self=scores, other=1.0 / math.sqrt(d))
    probs = g.op("aten._softmax.default", self=scaled, dim=-1, half_to_float=False)
    out = g.op("aten.bmm.default", self=probs, mat2=v)
    qt, ktt, vt = (g.eager[n] for n in (q, k, v))
    ref = torch.softmax(qt @ ktt.transpose(1, 2) / math.sqrt(d), dim=-1) @ vt
    ref_sdpa = torch.nn.functional.scaled_dot_product_attention(qt, ktt, vt)
    assert torch.allclose(ref, ref_sdpa, atol=1e-6)
    built = run_and_compare(smoke, tmp_path, g, [out], [ref])
    graph = decode_graph(built.payloads[0], tmp_path)
    assert node_types(graph) == ["XNNStaticTranspose", "XNNBatchMatrixMultiply", "XNNMultiply", "XNNSoftmax",
                                 "XNNBatchMatrixMultiply"]
    assert graph["xnodes"][0]["xnode_union"]["perm"] == [0, 2, 1]
    check_payload_invariants(built.payloads[0], graph, 3, 1, set(pte_named_data(built.pte)))
    # The scalar is a [1] constant in named data, keyed by its content; the payload carries no data.
    assert parse_header(built.payloads[0])["const_size"] == 0
    (key, data), = pte_named_data(built.pte).items()
    assert key.startswith("xnnpack/const/") and data == np.float32(1.0 / math.sqrt(d)).tobytes()
    mul = graph["xnodes"][2]["xnode_union"]
    values = {v["xvalue_union"]["id_out"]: v["xvalue_union"] for v in graph["xvalues"]}
    scalar = values[mul["input2_id"]]
    assert scalar["dims"] == [1] and graph["constant_data"][scalar["constant_buffer_idx"]]["named_key"] == key


# ---------------------------------------------------------------------------
# (c) two delegate calls sharing one weight


def test_two_regions_share_one_weight(smoke, tmp_path):
    g = Graph(tmp_path, seed=3)
    d = 32
    x = g.input("x", (5, d))
    w = g.random_const("W", (d, d), key="shared/W")
    b1 = g.random_const("b1", (d,))
    b2 = g.random_const("b2", (d,))
    wt1 = g.op("aten.permute_copy.default", self=w, dims=[1, 0])
    h = g.op("aten.addmm.default", self=b1, mat1=x, mat2=wt1)
    a = g.op("aten.tanh.default", self=h)
    wt2 = g.op("aten.permute_copy.default", self=w, dims=[1, 0])
    y = g.op("aten.addmm.default", self=b2, mat1=a, mat2=wt2)
    names = [n["name"] for n in g.nodes]
    g.region(names[:3], [x], [a], [w, b1])
    g.region(names[3:], [a], [y], [w, b2])
    xt, wt, b1t, b2t = (g.eager[n] for n in (x, w, b1, b2))
    ref = torch.nn.functional.linear(torch.tanh(torch.nn.functional.linear(xt, wt, b1t)), wt, b2t)
    built = run_and_compare(smoke, tmp_path, g, [y], [ref])
    assert [r["named_keys"] for r in built.stats["regions"]] == [["shared/W", "b1"], ["shared/W", "b2"]]
    named = pte_named_data(built.pte)
    assert sorted(named) == ["b1", "b2", "shared/W"]
    assert named["shared/W"] == np.load(tmp_path / "W.npy").tobytes()
    # Both payloads name the one copy.
    for i, p in enumerate(built.payloads):
        (tmp_path / f"r{i}").mkdir()
        graph = decode_graph(p, tmp_path / f"r{i}")
        assert node_types(graph) in (["XNNFullyConnected", "XNNTanh"], ["XNNFullyConnected"])
        assert "shared/W" in {c.get("named_key") for c in graph["constant_data"]}
        check_payload_invariants(p, graph, 1, 1, set(named))
    # The weight's bytes appear once in the file.
    data = built.pte.read_bytes()
    assert data.count(named["shared/W"]) == 1


# ---------------------------------------------------------------------------
# A GPT-2 style block as one region, against torch.nn.functional


def test_transformer_block_region(smoke, tmp_path):
    g = Graph(tmp_path, seed=4)
    s, d, heads = 8, 32, 4
    hd = d // heads
    x = g.input("x", (1, s, d), -2.0, 2.0)
    ln1_w, ln1_b = g.random_const("ln1_w", (d,)), g.random_const("ln1_b", (d,))
    ln2_w, ln2_b = g.random_const("ln2_w", (d,)), g.random_const("ln2_b", (d,))
    # attention and MLP weights stored [in, out] (GPT-2's Conv1D), the projection [out, in] (nn.Linear)
    attn_w, attn_b = g.random_const("attn_w", (d, 3 * d), scale=0.2), g.random_const("attn_b", (3 * d,))
    proj_w, proj_b = g.random_const("proj_w", (d, d), scale=0.2), g.random_const("proj_b", (d,))
    fc_w, fc_b = g.random_const("fc_w", (d, 4 * d), scale=0.2), g.random_const("fc_b", (4 * d,))
    mp_w, mp_b = g.random_const("mp_w", (4 * d, d), scale=0.2), g.random_const("mp_b", (d,))
    mask = g.const("mask", np.triu(np.full((s, s), -1e9, dtype=np.float32), 1))

    def linear_t(h, w, b):  # weight stored [out, in]: permute_copy + addmm
        return g.op("aten.addmm.default", self=b, mat1=h, mat2=g.op("aten.permute_copy.default", self=w, dims=[1, 0]))

    xf = g.op("aten.view_copy.default", self=x, size=[s, d])
    ln1 = g.op("aten.native_layer_norm.default", input=xf, normalized_shape=[d], weight=ln1_w, bias=ln1_b, eps=1e-5)[0]
    qkv = g.op("aten.addmm.default", self=attn_b, mat1=ln1, mat2=attn_w)
    q, k, v = g.op("aten.split_with_sizes_copy.default", self=qkv, split_sizes=[d, d, d], dim=1)

    def heads_of(t):
        return g.op("aten.permute_copy.default", self=g.op("aten.view_copy.default", self=t, size=[s, heads, hd]),
                    dims=[1, 0, 2])

    qh, kh, vh = heads_of(q), heads_of(k), heads_of(v)
    scores = g.op("aten.bmm.default", self=qh, mat2=g.op("aten.permute_copy.default", self=kh, dims=[0, 2, 1]))
    scaled = g.op("aten.mul.Scalar", self=scores, other=1.0 / math.sqrt(hd))
    probs = g.op("aten._softmax.default", self=g.op("aten.add.Tensor", self=scaled, other=mask), dim=-1,
                 half_to_float=False)
    ctx = g.op("aten.bmm.default", self=probs, mat2=vh)
    ctx2 = g.op("aten.view_copy.default", self=g.op("aten.permute_copy.default", self=ctx, dims=[1, 0, 2]),
                size=[s, d])
    h1 = g.op("aten.add.Tensor", self=xf, other=linear_t(ctx2, proj_w, proj_b))
    ln2 = g.op("aten.native_layer_norm.default", input=h1, normalized_shape=[d], weight=ln2_w, bias=ln2_b, eps=1e-5)[0]
    act = g.op("aten.gelu.default", self=g.op("aten.addmm.default", self=fc_b, mat1=ln2, mat2=fc_w), approximate="tanh")
    mlp = g.op("aten.addmm.default", self=mp_b, mat1=act, mat2=mp_w)
    out = g.op("aten.view_copy.default", self=g.op("aten.add.Tensor", self=h1, other=mlp), size=[1, s, d])

    F = torch.nn.functional
    e = g.eager
    xt = e[x][0]
    a = F.layer_norm(xt, (d,), e[ln1_w], e[ln1_b], 1e-5) @ e[attn_w] + e[attn_b]
    qt, kt, vt = (t.view(s, heads, hd).transpose(0, 1) for t in a.split(d, dim=1))
    att = F.scaled_dot_product_attention(qt, kt, vt, is_causal=True).transpose(0, 1).reshape(s, d)
    h = xt + F.linear(att, e[proj_w], e[proj_b])
    m = F.gelu(F.layer_norm(h, (d,), e[ln2_w], e[ln2_b], 1e-5) @ e[fc_w] + e[fc_b], approximate="tanh")
    ref = (h + m @ e[mp_w] + e[mp_b]).unsqueeze(0)

    built = run_and_compare(smoke, tmp_path, g, [out], [ref], name="block")
    graph = decode_graph(built.payloads[0], tmp_path)
    types = node_types(graph)
    assert types.count("XNNFullyConnected") == 4 + 4  # 4 linears + 2 means per layer norm
    assert types.count("XNNBatchMatrixMultiply") == 2 and types.count("XNNSoftmax") == 1
    assert built.stats["regions"][0]["absorbed_nodes"] == 1
    check_payload_invariants(built.payloads[0], graph, 1, 1, set(pte_named_data(built.pte)))


# ---------------------------------------------------------------------------
# (d) the support table, row by row


def _unary(target, low=-2.0, high=2.0, **extra):
    def make(g):
        x = g.input("x", (2, 3, 5), low, high)
        return [g.op(target, self=x, **extra)]
    return make


def _binary(target, a_shape=(2, 3, 4), b_shape=(4,), **extra):
    def make(g):
        a = g.input("a", a_shape)
        b = g.input("b", b_shape, 0.5, 1.5)
        return [g.op(target, self=a, other=b, **extra)]
    return make


def _scalar(target, other, **extra):
    def make(g):
        x = g.input("x", (3, 4), 0.5, 2.0)
        return [g.op(target, self=x, other=other, **extra)]
    return make


def _pow(e):
    def make(g):
        x = g.input("x", (3, 4), 0.5, 2.0)
        return [g.op("aten.pow.Tensor_Scalar", self=x, exponent=e)]
    return make


def _mm_dynamic(g):
    a, b = g.input("a", (5, 6)), g.input("b", (6, 7))
    return [g.op("aten.mm.default", self=a, mat2=b)]


def _mm_folded_weight(g):  # mat2 a constant [K, N]: transpose-weights flag
    a = g.input("a", (5, 6))
    w = g.random_const("wkn", (6, 7))
    return [g.op("aten.mm.default", self=a, mat2=w)]


def _mm_tied(g):  # kiln's tied-weight linear: permute(mm(W, permute(x)))
    x = g.input("x", (5, 6))
    w = g.random_const("wtied", (9, 6))
    xt = g.op("aten.permute_copy.default", self=x, dims=[1, 0])
    yt = g.op("aten.mm.default", self=w, mat2=xt)
    return [g.op("aten.permute_copy.default", self=yt, dims=[1, 0])]


def _mm_const_first(g):  # constant first operand, no permutes to absorb
    x = g.input("x", (6, 5))
    w = g.random_const("wfirst", (9, 6))
    return [g.op("aten.mm.default", self=w, mat2=x)]


def _addmm_dynamic_bias(g):
    a, bias = g.input("a", (5, 6)), g.input("bias", (5, 7))
    w = g.random_const("w", (6, 7))
    return [g.op("aten.addmm.default", self=bias, mat1=a, mat2=w)]


def _addmm_dynamic_weight(g):
    a, w, bias = g.input("a", (5, 6)), g.input("w", (6, 7)), g.input("bias", (7,))
    return [g.op("aten.addmm.default", self=bias, mat1=a, mat2=w)]


def _bmm(g):
    a, b = g.input("a", (2, 3, 4)), g.input("b", (2, 4, 5))
    return [g.op("aten.bmm.default", self=a, mat2=b)]


def _reduce(target, dims, keepdim):
    def make(g):
        x = g.input("x", (2, 3, 4, 5))
        return [g.op(target, self=x, dim=dims, keepdim=keepdim)]
    return make


def _layer_norm(normalized, affine=True, stats=False):
    def make(g):
        x = g.input("x", (2, 5, 3, 8), -3.0, 3.0)
        w = g.random_const("ln_w", normalized) if affine else None
        b = g.random_const("ln_b", normalized) if affine else None
        out, mean, rstd = g.op("aten.native_layer_norm.default", input=x, normalized_shape=list(normalized),
                               weight=w, bias=b, eps=1e-5)
        return [out, mean, rstd] if stats else [out]
    return make


def _layer_norm_dynamic_affine(g):  # weight and bias computed at run time, over two dims
    x = g.input("x", (4, 3, 8), -3.0, 3.0)
    w = g.op("aten.sigmoid.default", self=g.input("w", (3, 8)))
    b = g.op("aten.neg.default", self=g.input("b", (3, 8)))
    return [g.op("aten.native_layer_norm.default", input=x, normalized_shape=[3, 8], weight=w, bias=b, eps=1e-6)[0]]


def _view(target, shape_in, **extra):
    def make(g):
        x = g.input("x", shape_in)
        return [g.op(target, self=x, **extra)]
    return make


def _split(g):
    x = g.input("x", (2, 9, 3))
    parts = g.op("aten.split_with_sizes_copy.default", self=x, split_sizes=[2, 3, 4], dim=1)
    return parts


def _split_partly_used(g):
    x = g.input("x", (2, 9, 3))
    parts = g.op("aten.split_with_sizes_copy.default", self=x, split_sizes=[2, 3, 4], dim=-2)
    return [g.op("aten.neg.default", self=parts[2])]


def _cat(n):
    def make(g):
        xs = [g.input(f"x{i}", (2, i + 1, 3)) for i in range(n)]
        return [g.op("aten.cat.default", tensors=xs, dim=1)]
    return make


def _pad(g):
    x = g.input("x", (2, 3, 4))
    return [g.op("aten.constant_pad_nd.default", self=x, pad=[1, 2, 0, 3], value=0.25)]


def _expand(g):
    x = g.input("x", (1, 3, 1))
    return [g.op("aten.expand_copy.default", self=x, size=[4, 2, 3, 5])]


def _expand_noop(g):
    x = g.input("x", (3, 5))
    return [g.op("aten.expand_copy.default", self=x, size=[1, 3, 5])]


def _chain_with_constants(g):  # constants as binary operands, rank-0 constant, internal values
    x = g.input("x", (4, 6))
    s = g.const("s0", np.array(1.5, dtype=np.float32))
    c = g.random_const("c", (6,))
    y = g.op("aten.mul.Tensor", self=x, other=s)
    z = g.op("aten.add.Tensor", self=y, other=c)
    return [g.op("aten.sigmoid.default", self=z), z]


def _gpt2_mlp(g):  # view -> linear -> gelu(tanh) -> linear -> view, weights as permute_copy of constants
    x = g.input("x", (1, 4, 8))
    w1, b1 = g.random_const("fc_w", (32, 8)), g.random_const("fc_b", (32,))
    w2, b2 = g.random_const("proj_w", (8, 32)), g.random_const("proj_b", (8,))
    x2 = g.op("aten.view_copy.default", self=x, size=[4, 8])
    h = g.op("aten.addmm.default", self=b1, mat1=x2, mat2=g.op("aten.permute_copy.default", self=w1, dims=[1, 0]))
    a = g.op("aten.gelu.default", self=h, approximate="tanh")
    y = g.op("aten.addmm.default", self=b2, mat1=a, mat2=g.op("aten.permute_copy.default", self=w2, dims=[1, 0]))
    return [g.op("aten.view_copy.default", self=y, size=[1, 4, 8])]


def _conv(shape, w_shape, bias=True, transposed=False, **kw):
    def make(g):
        x = g.input("x", shape)
        w = g.random_const("w", w_shape)
        oc = w_shape[1] * kw.get("groups", 1) if transposed else w_shape[0]
        # the payload stores the filter in XNNPACK's layout (and the bias) under content keys
        wa = np.load(g.constants[-1]["npy"])
        if transposed:  # [IC, OC, kh, kw] (one group) -> [OC, kh, kw, IC]
            g.__dict__.setdefault("stored", {})[g.constants[-1]["value"]] = wa.transpose(1, 2, 3, 0)
        elif w_shape[1] == 1 and kw.get("groups", 1) > 1:  # depthwise -> [1, kh, kw, OC]
            g.__dict__.setdefault("stored", {})[g.constants[-1]["value"]] = wa[:, 0].transpose(1, 2, 0)[None]
        else:  # [OC, IC, (kh,) kw] -> [OC, kh, kw, IC]
            g.__dict__.setdefault("stored", {})[g.constants[-1]["value"]] = (wa if wa.ndim == 4 else wa[:, :, None]).transpose(0, 2, 3, 1)
        b = g.random_const("b", (oc,)) if bias else None
        if bias:
            g.__dict__.setdefault("stored", {})[g.constants[-1]["value"]] = np.load(g.constants[-1]["npy"])
        spatial = len(shape) - 2
        args = dict(stride=[1] * spatial, padding=[0] * spatial, dilation=[1] * spatial, output_padding=[0] * spatial,
                    groups=1)
        args.update(kw)
        return [g.op("aten.convolution.default", input=x, weight=w, bias=b, transposed=transposed, **args)]
    return make


def _max_pool(g):
    x = g.input("x", (1, 3, 8, 9))
    values, _ = g.op("aten.max_pool2d_with_indices.default", self=x, kernel_size=[3, 3], stride=[2, 2],
                     padding=[1, 1], dilation=[1, 1], ceil_mode=False)
    return [values]


def _avg_pool(g):
    x = g.input("x", (1, 3, 8, 8))
    return [g.op("aten.avg_pool2d.default", self=x, kernel_size=[2, 2], stride=[2, 2], padding=[0, 0],
                 ceil_mode=False, count_include_pad=True, divisor_override=None)]


def _resize(align_corners):
    def make(g):
        x = g.input("x", (1, 3, 5, 6))
        return [g.op("aten.upsample_bilinear2d.vec", input=x, output_size=[9, 11], align_corners=align_corners,
                     scale_factors=None)]
    return make


CASES = {
    "conv2d": _conv((1, 4, 7, 9), (6, 2, 3, 3), stride=[2, 1], padding=[1, 2], dilation=[1, 2], groups=2),
    "conv2d_depthwise": _conv((1, 4, 6, 6), (8, 1, 3, 3), bias=False, padding=[1, 1], groups=4),
    "conv2d_transposed": _conv((1, 4, 5, 5), (4, 3, 3, 3), transposed=True, stride=[2, 2], padding=[1, 1],
                               output_padding=[1, 1]),
    "conv1d": _conv((2, 3, 10), (5, 3, 3), padding=[1]),
    "max_pool2d": _max_pool, "avg_pool2d": _avg_pool,
    "resize_bilinear": _resize(False), "resize_bilinear_align_corners": _resize(True),
    "add_broadcast": _binary("aten.add.Tensor"),
    "add_alpha": _binary("aten.add.Tensor", alpha=2.5),
    "sub_alpha": _binary("aten.sub.Tensor", (3, 1, 4), (2, 1), alpha=0.5),
    "mul": _binary("aten.mul.Tensor", (2, 3, 4), (3, 1)),
    "div": _binary("aten.div.Tensor"),
    "maximum": _binary("aten.maximum.default"),
    "minimum": _binary("aten.minimum.default"),
    "add_scalar": _scalar("aten.add.Scalar", 0.75, alpha=2),
    "sub_scalar": _scalar("aten.sub.Scalar", 3),
    "rsub_scalar": _scalar("aten.rsub.Scalar", 1.0, alpha=0.5),
    "mul_scalar": _scalar("aten.mul.Scalar", -1.25),
    "div_scalar": _scalar("aten.div.Scalar", 4.0),
    "pow_1": _pow(1.0), "pow_2": _pow(2.0), "pow_3": _pow(3), "pow_half": _pow(0.5),
    "pow_minus_half": _pow(-0.5), "pow_minus_1": _pow(-1.0),
    "neg": _unary("aten.neg.default"), "abs": _unary("aten.abs.default"), "exp": _unary("aten.exp.default"),
    "log": _unary("aten.log.default", 0.1, 3.0), "sqrt": _unary("aten.sqrt.default", 0.1, 3.0),
    "rsqrt": _unary("aten.rsqrt.default", 0.1, 3.0), "tanh": _unary("aten.tanh.default"),
    "sigmoid": _unary("aten.sigmoid.default"), "sin": _unary("aten.sin.default"), "cos": _unary("aten.cos.default"),
    "relu": _unary("aten.relu.default"),
    "clamp": _unary("aten.clamp.default", min=-0.5, max=1.0),
    "clamp_min": _unary("aten.clamp.default", min=0.25),
    "gelu": _unary("aten.gelu.default", -4.0, 4.0),
    "gelu_tanh": _unary("aten.gelu.default", -4.0, 4.0, approximate="tanh"),
    "softmax": _unary("aten._softmax.default", -4.0, 4.0, dim=2, half_to_float=False),
    "mm_dynamic": _mm_dynamic, "mm_folded_weight": _mm_folded_weight, "mm_tied": _mm_tied,
    "mm_const_first": _mm_const_first, "addmm_dynamic_bias": _addmm_dynamic_bias,
    "addmm_dynamic_weight": _addmm_dynamic_weight, "bmm": _bmm,
    "mean_last": _reduce("aten.mean.dim", [-1], True),
    "mean_trailing_2": _reduce("aten.mean.dim", [3, 2], False),
    "mean_all_keepdim": _reduce("aten.mean.dim", None, True),
    "sum_trailing_3": _reduce("aten.sum.dim_IntList", [1, 2, 3], True),
    "layer_norm": _layer_norm((8,)),
    "layer_norm_stats": _layer_norm((8,), stats=True),
    "layer_norm_2d_plain": _layer_norm((3, 8), affine=False, stats=True),
    "layer_norm_2d_affine": _layer_norm((3, 8)),
    "layer_norm_dynamic_affine": _layer_norm_dynamic_affine,
    "permute": _view("aten.permute_copy.default", (2, 3, 4, 5), dims=[3, 1, 0, 2]),
    "view": _view("aten.view_copy.default", (2, 3, 4), size=[6, -1]),
    "unsqueeze": _view("aten.unsqueeze_copy.default", (2, 3), dim=1),
    "squeeze": _view("aten.squeeze_copy.dims", (2, 1, 3, 1), dim=[1, 3]),
    "alias": _view("aten.alias_copy.default", (2, 3)),
    "to_dim_order_copy": _view("dim_order_ops._to_dim_order_copy.default", (2, 3), non_blocking=False,
                               dim_order=None),
    "clone_dim_order": _view("dim_order_ops._clone_dim_order.default", (2, 3), non_blocking=False,
                             dim_order=[0, 1]),
    "slice": _view("aten.slice_copy.Tensor", (4, 10, 3), dim=1, start=-7, end=8, step=1),
    "slice_open": _view("aten.slice_copy.Tensor", (4, 10, 3), dim=0, start=None, end=None),
    "select": _view("aten.select_copy.int", (4, 10, 3), dim=1, index=-3),
    "split": _split, "split_partly_used": _split_partly_used,
    "cat_1": _cat(1), "cat_2": _cat(2), "cat_5": _cat(5), "cat_7": _cat(7),
    "constant_pad": _pad, "expand": _expand, "expand_noop": _expand_noop,
    "constants_in_chain": _chain_with_constants, "gpt2_mlp": _gpt2_mlp,
    "elu": _unary("aten.elu.default", -3.0, 3.0, alpha=0.7, scale=1, input_scale=1),
    "leaky_relu": _unary("aten.leaky_relu.default", -3.0, 3.0, negative_slope=0.2),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_support_table_case(smoke, tmp_path, case):
    g = Graph(tmp_path, seed=zlib.crc32(case.encode()) % 1000)
    outputs = CASES[case](g)
    built = run_and_compare(smoke, tmp_path, g, outputs, name=case)
    graph = decode_graph(built.payloads[0], tmp_path)
    named = pte_named_data(built.pte)
    check_payload_invariants(built.payloads[0], graph, len(g.inputs), len(outputs), set(named))
    for c in g.constants:  # every weight in named data, under the key the caller gave, with its bytes
        stored = getattr(g, "stored", {})
        if c["value"] in stored:  # re-laid out by the lowering (convolution filters): its bytes under a content key
            assert np.ascontiguousarray(stored[c["value"]], dtype=np.float32).tobytes() in named.values()
            continue
        assert named[c["key"]] == np.load(c["npy"]).tobytes()
    assert len(graph["xnodes"]) == built.stats["regions"][0]["xnodes"] >= 1


def test_cases_cover_the_support_table(smoke, tmp_path):
    proc = subprocess.run([str(smoke), "--table"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    table = {r["target"] for r in json.loads(proc.stdout)}
    covered = set()
    for make in CASES.values():
        g = Graph(tmp_path)
        make(g)
        covered |= {n["target"] for n in g.nodes}
    assert table - covered == set()


def test_lowerings_use_the_expected_nodes(smoke, tmp_path):
    """A few lowerings whose shape matters: absorbed transposes, chained concatenation, mean as FC."""
    expect = {
        "mm_tied": ["XNNFullyConnected"],
        "mm_folded_weight": ["XNNFullyConnected"],
        "mm_dynamic": ["XNNBatchMatrixMultiply"],
        "cat_7": ["XNNConcatenate5", "XNNConcatenate3"],
        "mean_last": ["XNNFullyConnected"],
        "gpt2_mlp": ["XNNStaticReshape", "XNNFullyConnected"] + ["XNNSquare", "XNNMultiply", "XNNMultiply",
                                                                  "XNNAdd", "XNNMultiply", "XNNTanh", "XNNAdd",
                                                                  "XNNMultiply", "XNNMultiply"]
                    + ["XNNFullyConnected", "XNNStaticReshape"],
        "split_partly_used": ["XNNStaticSlice", "XNNNegate"],
    }
    for case, types in expect.items():
        g = Graph(tmp_path)
        outputs = CASES[case](g)
        built = build(smoke, tmp_path, g.spec(outputs), case)
        (tmp_path / case).mkdir()
        graph = decode_graph(built.payloads[0], tmp_path / case)
        assert node_types(graph) == types, case
        if case == "mm_folded_weight":
            assert graph["xnodes"][0]["xnode_union"]["flags"] == 1  # transpose weights: [K, N] as stored
        if case == "mm_tied":
            fc = graph["xnodes"][0]["xnode_union"]
            values = {v["xvalue_union"]["id_out"]: v["xvalue_union"] for v in graph["xvalues"]}
            assert fc["flags"] == 0 and values[fc["filter_id"]]["dims"] == [9, 6]
            assert values[fc["input1_id"]]["flags"] == 1 and values[fc["output_id"]]["flags"] == 2


# ---------------------------------------------------------------------------
# (e) the schema


def test_schema_is_binary_compatible_with_executorch(kiln_bin, tmp_path):
    from conftest import REPO

    dump_tool = kiln_bin.parent / "kiln_schema_dump"
    dumps = []
    for name, fbs in (("kiln", REPO / "schema" / "xnnpack_graph.fbs"), ("executorch", _xnn_schema())):
        out = tmp_path / name
        proc = subprocess.run(["flatc", "-b", "--schema", "-o", str(out), str(fbs)], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        proc = subprocess.run([str(dump_tool), str(out / (fbs.stem + ".bfbs"))], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        dumps.append(proc.stdout)
    assert "file_identifier XN01" in dumps[0] and "union XNodeUnion" in dumps[0]
    assert dumps[0] == dumps[1]
    text = (REPO / "schema" / "xnnpack_graph.fbs").read_text()
    assert "force_align: 16" in text and "Copyright" not in text


# ---------------------------------------------------------------------------
# (f) refusals


def test_support_check_reasons(smoke, tmp_path):
    g = Graph(tmp_path)
    x = g.input("x", (2, 3, 4))
    i = g.input("i", (2, 3), dtype=np.int64)
    w = g.random_const("w", (4, 5))
    m = g.op("aten.view_copy.default", self=x, size=[6, 4])
    bad = {
        g.op("aten._softmax.default", self=x, dim=0, half_to_float=False): "softmax over a dim other than the last",
        g.op("aten.addmm.default", self=g.random_const("bias", (5,)), mat1=m, mat2=w, alpha=2.0): "alpha",
        g.op("aten.slice_copy.Tensor", self=x, dim=2, start=0, end=4, step=2): "step",
        g.op("aten.add.Tensor", self=i, other=i): "int64",
        g.op("aten.mean.dim", self=x, dim=[1], keepdim=True): "trailing",
        g.op("aten.pow.Tensor_Scalar", self=x, exponent=2.5): "exponent",
        g.op("aten.erf.default", self=x): "no XNNPACK lowering",
        g.op("aten.constant_pad_nd.default", self=x, pad=[-1, 0]): "negative",
        g.op_unevaluated("aten.mm.default", (2, 3, 4), self=x, mat2=x): "rank 2",
    }
    good = g.op("aten._softmax.default", self=x, dim=-1, half_to_float=False)
    spec_path = tmp_path / "check.json"
    spec_path.write_text(json.dumps(g.spec([good])))
    proc = subprocess.run([str(smoke), "--check", str(spec_path)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    result = {r["name"]: r for r in json.loads(proc.stdout)}
    outputs_of = {n["outputs"][0]: n["name"] for n in g.nodes}
    for out, words in bad.items():
        r = result[outputs_of[str(out)]]
        assert not r["supported"] and words in r["reason"], r
    assert result[outputs_of[str(good)]]["supported"] and result[outputs_of[str(good)]]["reason"] == ""
    assert result[outputs_of[str(m)]]["supported"]


def test_builder_refusals(smoke, tmp_path):
    g = Graph(tmp_path)
    x = g.input("x", (3, 4))
    y = g.op("aten.tanh.default", self=x)
    z = g.op("aten.neg.default", self=y)
    e = g.op("aten.exp.default", self=z)
    names = [n["name"] for n in g.nodes]

    def region(nodes, inputs, outputs, constants=()):
        return [{"nodes": nodes, "inputs": inputs, "outputs": outputs, "constants": list(constants)}]

    cases = [
        # z read by exp outside the region, but not a region output
        (region(names[:2], ["x"], [str(y)]), "is read by node"),
        # exp reads z, which is not a region input and nothing in the region computes
        (region([names[2]], [], [str(e)]), "not a region input"),
        # a region output nothing in the region computes
        (region(names[:1], ["x"], [str(z)]), "is not computed by a region node"),
        # the same value twice
        (region(names, ["x", "x"], [str(e)]), "listed twice"),
        # an input nothing reads
        (region(names[1:], [str(y), "x"], [str(e)]), "not read by any region node"),
    ]
    for regions, words in cases:
        msg = build_error(smoke, tmp_path, g.spec([e], regions))
        assert words in msg, msg

    # An unsupported node inside a region names the node and the reason.
    g2 = Graph(tmp_path)
    x2 = g2.input("x", (3, 4))
    s2 = g2.op("aten._softmax.default", self=x2, dim=0, half_to_float=False)
    msg = build_error(smoke, tmp_path, g2.spec([s2]))
    assert "cannot run in XNNPACK" in msg and "softmax" in msg
