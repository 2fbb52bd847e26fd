"""Vision and speech model families, built inline with seeded random weights:
a ResNet-style CNN, a MobileNet-style CNN, a ViT and a Whisper-style encoder.

Each is exported with torch.export (the library defaults: BatchNorm trained for a
few steps and then put in eval mode, SDPA attention in transformers) and

  * lowered by kiln for both backends; kiln's .pte runs in ExecuTorch's runtime and in kiln's,
  * lowered by ExecuTorch for both backends; its .pte runs in kiln's runtime,

every run compared with eager PyTorch (DESIGN's fp32 tolerance, 1e-4 * max|ref|).

KILN_TEST_EAGER_ATTN=1 builds the transformers models with attn_implementation='eager'
(for checking the convolution paths on a tree without SDPA lowering).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from conftest import assert_close, et_execute, kiln_lower, reference_io, run_kiln
from inproc import run_pte, run_pte_cli


def export_spec(module: nn.Module, x: torch.Tensor, out: Path, name: str, decompose: bool = False) -> Path:
    """torch.export of `module` on `x` (core ATen with `decompose`), written as the export front end writes a model."""
    out.mkdir(parents=True, exist_ok=True)
    module.eval()
    with torch.no_grad():
        ep = torch.export.export(module, (x,))
        if decompose:
            ep = ep.run_decompositions()
        y = module(x)
    torch.export.save(ep, out / f"{name}.pt2")
    np.save(out / f"{name}_input0.npy", x.numpy())
    np.save(out / f"{name}_expected_output0.npy", y.numpy())
    spec = {"name": name, "model_id": f"tests/{name}", "seq_len": int(x.shape[-1]), "exported_program": f"{name}.pt2",
            "ir": "core_aten" if decompose else "default",
            "inputs": [{"name": "x", "dtype": "float32", "shape": list(x.shape), "reference": f"{name}_input0.npy"}],
            "outputs": [{"name": "y", "dtype": "float32", "shape": list(y.shape),
                         "reference": f"{name}_expected_output0.npy"}]}
    (out / "model_spec.json").write_text(json.dumps(spec))
    return out / "model_spec.json"


def et_lower(spec: Path, backend: str) -> Path:
    """ExecuTorch's own lowering of the spec's .pt2, as bench/reference/lower_with_executorch.py does it
    (to_edge_transform_and_lower, XnnpackPartitioner for xnnpack, to_executorch), in this process:
    the families need eight of them and a fresh interpreter per lowering costs most of their time."""
    from executorch.exir import to_edge_transform_and_lower

    spec_d = json.loads(spec.read_text())
    out = spec.parent / f"{spec_d['name']}_{backend}_et.pte"
    if not out.exists():
        partitioner = None
        if backend == "xnnpack":
            from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

            partitioner = [XnnpackPartitioner()]
        ep = torch.export.load(str(spec.parent / spec_d["exported_program"]))
        out.write_bytes(to_edge_transform_and_lower(ep, partitioner=partitioner).to_executorch().buffer)
    return out


def kiln_run(pte: Path, inputs, tmp: Path, *extra: str) -> list[np.ndarray]:
    """What `kiln run PTE EXTRA` gives: kiln's runtime in this process (tests/python/inproc.py)."""
    return run_pte(pte, inputs, tmp, *extra)


def train_batch_norms(module: nn.Module, shape, steps: int = 3) -> None:
    """A few train-mode forwards on random data, so BatchNorm's running statistics are not the defaults."""
    module.train()
    with torch.no_grad():
        for _ in range(steps):
            module(torch.randn(*shape) * 2 + 0.5)
    module.eval()


# ---------------------------------------------------------------------------
# the models


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return F.relu(y + (x if self.down is None else self.down(x)))


class TinyResNet(nn.Module):
    def __init__(self, classes=10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 5, 2, 2, bias=False), nn.BatchNorm2d(16), nn.ReLU())
        self.pool = nn.MaxPool2d(3, 2, 1)
        self.layer1 = BasicBlock(16, 16, 1)
        self.layer2 = BasicBlock(16, 32, 2)
        self.head_bn = nn.BatchNorm2d(32)  # a norm that follows an add: not foldable
        self.fc = nn.Linear(32, classes)

    def forward(self, x):
        y = self.pool(self.stem(x))
        y = self.layer2(self.layer1(y))
        y = F.adaptive_avg_pool2d(self.head_bn(y), 1).flatten(1)
        return self.fc(y)


class SqueezeExcite(nn.Module):
    def __init__(self, c, r=4):
        super().__init__()
        self.fc1 = nn.Conv2d(c, c // r, 1)
        self.fc2 = nn.Conv2d(c // r, c, 1)

    def forward(self, x):
        s = F.adaptive_avg_pool2d(x, 1)
        return x * F.hardsigmoid(self.fc2(F.relu(self.fc1(s))))


class TinyMobileNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1, bias=False), nn.BatchNorm2d(16), nn.Hardswish())
        self.dw = nn.Sequential(nn.Conv2d(16, 16, 3, 1, 1, groups=16, bias=False), nn.BatchNorm2d(16), nn.ReLU6())
        self.se = SqueezeExcite(16)
        self.pw = nn.Sequential(nn.Conv2d(16, 32, 1, bias=False), nn.BatchNorm2d(32))
        self.dw2 = nn.Conv2d(32, 64, 3, 2, padding=1, groups=32)  # depth multiplier 2
        self.act = nn.Hardswish()
        self.up = nn.ConvTranspose2d(64, 32, 2, stride=2)
        self.gn = nn.GroupNorm(4, 32)
        self.same = nn.Conv2d(32, 16, 4, padding="same", dilation=1)
        self.head = nn.Conv2d(4, 8, 3, padding=1, padding_mode="reflect")

    def forward(self, x):
        y = self.stem(x)
        y = self.se(self.dw(y))
        y = self.pw(y)
        y = self.act(self.dw2(y))
        y = self.gn(self.up(y))
        y = F.interpolate(y, scale_factor=2, mode="bilinear", align_corners=False)
        y = F.avg_pool2d(y, 2)
        y = self.same(y)
        y = F.pixel_shuffle(y, 2)  # 16 -> 4 channels, 2x spatial
        y = F.interpolate(y, size=(12, 12), mode="nearest")
        return self.head(F.pad(y, (1, 1, 1, 1), mode="replicate"))


def vit_model():
    from transformers import ViTConfig, ViTModel

    cfg = ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, image_size=16,
                    patch_size=4, num_channels=3)
    if os.environ.get("KILN_TEST_EAGER_ATTN") == "1":
        cfg._attn_implementation = "eager"

    class Wrapped(nn.Module):
        def __init__(self):
            super().__init__()
            self.m = ViTModel(cfg, add_pooling_layer=False)

        def forward(self, x):
            return self.m(pixel_values=x).last_hidden_state

    return Wrapped()


def whisper_encoder():
    from transformers import WhisperConfig
    from transformers.models.whisper.modeling_whisper import WhisperEncoder

    cfg = WhisperConfig(num_mel_bins=16, d_model=32, encoder_layers=2, encoder_attention_heads=2,
                        encoder_ffn_dim=64, max_source_positions=16, decoder_layers=1, decoder_attention_heads=2,
                        decoder_ffn_dim=64, vocab_size=64)
    if os.environ.get("KILN_TEST_EAGER_ATTN") == "1":
        cfg._attn_implementation = "eager"

    class Wrapped(nn.Module):
        def __init__(self):
            super().__init__()
            self.m = WhisperEncoder(cfg)

        def forward(self, x):
            return self.m(input_features=x).last_hidden_state

    return Wrapped()


def build(name):
    torch.manual_seed(0)
    if name == "resnet":
        m, x = TinyResNet(), torch.randn(1, 3, 32, 32)
        train_batch_norms(m, (4, 3, 32, 32))
    elif name == "mobilenet":
        m, x = TinyMobileNet(), torch.randn(1, 3, 24, 24)
        train_batch_norms(m, (4, 3, 24, 24))
    elif name == "vit":
        m, x = vit_model(), torch.randn(1, 3, 16, 16)
    else:
        m, x = whisper_encoder(), torch.randn(1, 16, 32)
    return m.eval(), x


FAMILIES = ["resnet", "mobilenet", "vit", "whisper"]


@pytest.fixture(scope="module", params=FAMILIES)
def family(request, tmp_path_factory):
    module, x = build(request.param)
    return export_spec(module, x, tmp_path_factory.mktemp(request.param), request.param)


VISION_NODES = {"XNNConv2d", "XNNDepthwiseConv2d", "XNNConvTranspose2d", "XNNMaxPooling2d", "XNNAvgPooling2d",
                "XNNGlobalAvgPooling2d", "XNNStaticResizeBilinear2D", "XNNStaticConstantPad"}


def payload_node_types(pte: Path, tmp: Path) -> set:
    """The XNNGraph node types of every XNNPACK payload in a .pte."""
    from executorch.exir._serialize._program import deserialize_pte_binary
    from test_xnnpack_payload import decode_graph, node_types

    program = deserialize_pte_binary(pte.read_bytes()).program
    types: set = set()
    for i, d in enumerate(program.execution_plan[0].delegates):
        assert d.id == "XnnpackBackend"
        (tmp / f"payload{i}").mkdir(parents=True, exist_ok=True)
        types |= set(node_types(decode_graph(program.backend_delegate_data[d.processed.index].data, tmp / f"payload{i}")))
    return types


@pytest.mark.parametrize("backend", ["portable", "xnnpack"])
def test_family_matches_eager(family, backend, tmp_path):
    name = json.loads(family.read_text())["name"]
    ins, refs = reference_io(family)
    pte = kiln_lower(family, backend)
    assert_close(et_execute(pte, ins)[0], refs[0], f"kiln's {backend} .pte of {name} in ExecuTorch's runtime")
    assert_close(kiln_run(pte, ins, tmp_path)[0], refs[0], f"kiln's {backend} .pte of {name} in kiln's runtime")
    et_pte = et_lower(family, backend)
    assert_close(kiln_run(et_pte, ins, tmp_path)[0], refs[0], f"ExecuTorch's {backend} .pte of {name} in kiln's runtime")
    if backend == "xnnpack":  # the backend's other engine: XNNPACK for every node it has
        for which, p in (("kiln's", pte), ("ExecuTorch's", et_pte)):
            # `kiln run` itself (the CLI's test in this file)
            assert_close(run_pte_cli(p, ins, tmp_path, "--engine", "xnnpack", "--threads", "2")[0], refs[0],
                         f"{which} xnnpack .pte of {name} in kiln's runtime, kiln run --engine xnnpack")
        # kiln delegates the vision nodes ExecuTorch's partitioner delegates. Two differ by design:
        # global average pooling is a mean over H, W (kiln's payload computes it as a fully-connected
        # row sum), and ExecuTorch runs a batch norm no convolution absorbs as a 1x1 depthwise
        # convolution where kiln multiplies and adds per channel.
        kiln_types, et_types = payload_node_types(pte, tmp_path / "kiln"), payload_node_types(et_pte, tmp_path / "et")
        assert (et_types & VISION_NODES) - {"XNNGlobalAvgPooling2d", "XNNDepthwiseConv2d"} <= kiln_types, (et_types,
                                                                                                          kiln_types)
        if name == "mobilenet":
            assert {"XNNDepthwiseConv2d", "XNNConvTranspose2d", "XNNAvgPooling2d",
                    "XNNStaticResizeBilinear2D"} <= kiln_types, kiln_types


def operator_counts(pte: Path) -> dict:
    """Kernel calls per operator in a .pte (read with ExecuTorch's deserializer)."""
    from executorch.exir._serialize._program import deserialize_pte_binary

    prog = deserialize_pte_binary(pte.read_bytes())
    prog = getattr(prog, "program", prog)
    plan = prog.execution_plan[0]
    counts: dict = {}
    for chain in plan.chains:
        for ins in chain.instructions:
            if hasattr(ins.instr_args, "op_index"):
                op = plan.operators[ins.instr_args.op_index]
                key = f"{op.name}.{op.overload}"
                counts[key] = counts.get(key, 0) + 1
    return counts


@pytest.mark.parametrize("ir", ["default", "core_aten"])
def test_batch_norm_is_folded(ir, tmp_path):
    """ResNet's six norms that follow a convolution disappear into its weights (as ExecuTorch's
    XNNPACK lowering folds them; its portable lowering keeps seven kernels); the one after the
    residual add becomes a per-channel multiply-add. No batch-norm kernel is left, and the
    numbers still match eager. In core ATen the norms are _native_batch_norm_legit_no_training."""
    module, x = build("resnet")
    spec = export_spec(module, x, tmp_path / "resnet", "resnet", decompose=ir == "core_aten")
    ins, refs = reference_io(spec)
    pte = kiln_lower(spec, "portable")
    counts = operator_counts(pte)
    assert not [k for k in counts if "batch_norm" in k], counts
    assert counts["aten::convolution.out"] == 6, counts
    assert counts["aten::mul.out"] == 1, counts  # the head norm's scale
    assert_close(kiln_run(pte, ins, tmp_path)[0], refs[0], "folded ResNet in kiln's runtime")


# ---------------------------------------------------------------------------
# operator corners the families do not reach, a few chained per module


class ConvCorners(nn.Module):  # grouped, strided, dilated transposed conv; grouped valid conv; PReLU; ceil-mode pooling
    def __init__(self):
        super().__init__()
        self.up = nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1, output_padding=1, groups=2, dilation=2)
        self.act = nn.PReLU(6, init=0.1)
        self.down = nn.Conv2d(6, 4, 3, stride=(2, 1), padding="valid", groups=2)

    def forward(self, x):
        y = self.down(self.act(self.up(x)))
        return F.max_pool2d(y, 3, stride=2, padding=1, dilation=2, ceil_mode=True)


class Conv1dCorners(nn.Module):  # 'same' with an odd total, reflect padding_mode, transposed 1-D, replicate pad,
    # 1-D max/avg/adaptive pooling
    def __init__(self):
        super().__init__()
        self.same = nn.Conv1d(4, 6, 4, padding="same", dilation=2)
        self.refl = nn.Conv1d(6, 6, 3, padding=2, padding_mode="reflect")
        self.up = nn.ConvTranspose1d(6, 3, 4, stride=2, padding=1)

    def forward(self, x):
        y = self.up(F.relu(self.refl(self.same(x))))
        y = F.max_pool1d(F.pad(y, (2, 3), mode="replicate"), 3, stride=2, padding=1)
        return F.adaptive_avg_pool1d(F.avg_pool1d(y, 2, ceil_mode=True, count_include_pad=False), 4)


class Conv3dNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.c = nn.Conv3d(3, 4, 3, stride=2, padding=1)

    def forward(self, x):
        return self.c(x)


class PoolResizeCorners(nn.Module):
    def forward(self, x):
        y = F.avg_pool2d(x, 3, stride=2, padding=1, ceil_mode=True, count_include_pad=False)
        y = F.adaptive_avg_pool2d(y, (3, 5))
        y = F.interpolate(y, size=(7, 9), mode="bilinear", align_corners=True)
        y = F.interpolate(y, scale_factor=1.5, mode="nearest")
        return F.avg_pool2d(y, 2, divisor_override=3)


class NormShuffleCorners(nn.Module):
    def __init__(self):
        super().__init__()
        self.inorm = nn.InstanceNorm2d(4, affine=True)
        self.gn = nn.GroupNorm(2, 4)

    def forward(self, x):
        y = self.gn(self.inorm(x) * 2.0 + 1.0)
        y = F.pixel_unshuffle(y, 2)
        return F.adaptive_avg_pool2d(y, (2, 2)) + F.pad(y, (1, 1, 1, 1), mode="reflect")[..., 1:3, 1:3]


class AdaptiveMax(nn.Module):
    def forward(self, x):
        return F.adaptive_max_pool2d(x, (2, 3))


class CircularPad(nn.Module):  # wrap around in two dims, then crop one side (a negative pad) and wrap the other
    def forward(self, x):
        y = F.pad(x, (2, 1, 1, 3), mode="circular")
        return F.pad(y, (-1, 2, 0, -2), mode="circular") * 2.0


class DilatedDeconv(nn.Module):  # output padding 2/3 >= stride 3/2 in width: legal for torch (below the
    # dilation), not for XNNPACK's deconvolution, so kiln keeps it on the portable path
    def __init__(self):
        super().__init__()
        self.up = nn.ConvTranspose2d(2, 4, (4, 5), stride=(3, 2), padding=(1, 2), output_padding=(2, 3), groups=2,
                                     dilation=(4, 5))

    def forward(self, x):
        return self.up(x)


# name: (module, input shape, the backend of ExecuTorch's lowering kiln's runtime runs too,
#        whether ExecuTorch's runtime runs kiln's files)
CORNERS = {
    "conv2d_corners": (ConvCorners, (1, 4, 9, 11), "xnnpack", True),
    "conv1d_corners": (Conv1dCorners, (2, 4, 20), "xnnpack", True),
    "conv3d": (Conv3dNet, (1, 3, 6, 7, 8), "portable", False),  # ExecuTorch's portable convolution is 1-D/2-D only
    "pool_resize": (PoolResizeCorners, (1, 3, 11, 13), "portable", True),
    "norm_shuffle": (NormShuffleCorners, (2, 4, 8, 8), "portable", True),  # instance norm: batch-stat batch norm
    "adaptive_max": (AdaptiveMax, (1, 3, 8, 9), None, True),  # ExecuTorch's to_edge rejects adaptive_max_pool2d
    "circular_pad": (CircularPad, (1, 2, 5, 6), "portable", True),
    "dilated_deconv": (DilatedDeconv, (2, 2, 4, 4), "portable", True),  # ExecuTorch's xnnpack file of it fails to run
}


@pytest.mark.parametrize("case", list(CORNERS))
def test_operator_corners(case, tmp_path):
    """kiln's lowering (both backends) in both runtimes; ExecuTorch's lowering in kiln's runtime
    (XNNPACK for the convolution cases: XNNConvTranspose2d, 1-D as 2-D; portable for the rest)."""
    cls, shape, et_too, et_runs = CORNERS[case]
    torch.manual_seed(1)
    spec = export_spec(cls(), torch.randn(*shape), tmp_path / case, case)
    ins, refs = reference_io(spec)
    for backend in ("portable", "xnnpack"):
        pte = kiln_lower(spec, backend)
        if et_runs:
            assert_close(et_execute(pte, ins)[0], refs[0], f"kiln's {backend} .pte of {case} in ExecuTorch's runtime")
        assert_close(kiln_run(pte, ins, tmp_path)[0], refs[0], f"kiln's {backend} .pte of {case} in kiln's runtime")
    if et_too is None:
        return
    et_pte = et_lower(spec, et_too)
    assert_close(kiln_run(et_pte, ins, tmp_path)[0], refs[0], f"ExecuTorch's {et_too} .pte of {case} in kiln's runtime")
    if et_too == "xnnpack":  # kiln delegates the vision nodes ExecuTorch does (PReLU: relu, negate, multiply, subtract)
        kiln_types = payload_node_types(kiln_lower(spec, "xnnpack"), tmp_path / "kiln")
        et_types = payload_node_types(et_pte, tmp_path / "et")
        assert et_types & VISION_NODES <= kiln_types, (et_types, kiln_types)


class Pool3dCorners(nn.Module):  # 3-D pooling: average (ceil mode, padding not counted, divisor override), max
    # (dilation, ceil mode, its indices), adaptive average/max, LPPool3d (avg_pool3d of x**2)
    def forward(self, x):
        v, i = F.max_pool3d(x, (2, 3, 2), stride=(1, 2, 2), padding=(1, 1, 0), dilation=(2, 1, 1), ceil_mode=True,
                            return_indices=True)
        return (F.avg_pool3d(x, 3, stride=2, padding=1, ceil_mode=True, count_include_pad=False),
                F.avg_pool3d(x, (2, 2, 3), stride=1, padding=(1, 0, 1)), F.avg_pool3d(x, 2, divisor_override=3),
                v, i, F.adaptive_avg_pool3d(x, (3, 2, 4)), F.adaptive_max_pool3d(x, (2, 3, 1)), nn.LPPool3d(2, 2)(x),
                # windows of one element in depth or in the plane (a strided slice there: XNNPACK has no 1x1 pooling)
                F.max_pool3d(x, (1, 2, 2), stride=(2, 1, 2)), F.max_pool3d(x, (2, 1, 1), stride=(1, 2, 3)),
                F.avg_pool3d(x, (1, 3, 2), stride=2), F.avg_pool3d(x, (3, 1, 1), stride=(1, 1, 2)),
                F.adaptive_max_pool3d(x, (None, None, None)), F.avg_pool3d(x, (2, 1, 1), divisor_override=3))


def test_pooling_3d(tmp_path):
    """3-D pooling (kiln: two 2-D poolings, depth then plane) on both backends, in both runtimes, every output
    (values and max pooling's indices) against eager."""
    from test_functionalize import export_mutating  # (every output's reference; export_spec keeps the first)

    torch.manual_seed(1)
    spec = export_mutating(Pool3dCorners(), (torch.randn(2, 3, 6, 6, 5),), tmp_path / "pool3d", "pool3d")
    ins, refs = reference_io(spec)
    assert len(refs) == 14
    for backend in ("portable", "xnnpack"):
        pte = kiln_lower(spec, backend)
        for runtime, outs in (("ExecuTorch's", et_execute(pte, ins)), ("kiln's", kiln_run(pte, ins, tmp_path))):
            assert len(outs) == len(refs)
            for k, (got, ref) in enumerate(zip(outs, refs)):
                what = f"kiln's {backend} .pte of 3-D pooling, output {k}, in {runtime} runtime"
                if ref.dtype.kind in "iu":
                    np.testing.assert_array_equal(got, ref, err_msg=what)
                else:
                    assert_close(got, ref, what)


def test_unsupported_operator_fails_cleanly(tmp_path):
    """An operator kiln cannot lower: one line naming the node, the source line and why; no file."""

    # Antialiased bilinear resampling: not lowered (bench/COVERAGE.md, "All of op_db"). This test's operator was
    # 3-d pooling, then max_unpool2d; both are lowered now.
    class Antialiased(nn.Module):
        def forward(self, x):
            return F.interpolate(x, scale_factor=0.5, mode="bilinear", antialias=True)

    spec = export_spec(Antialiased(), torch.randn(1, 2, 8, 8), tmp_path / "circ", "circ")
    proc = run_kiln("lower", "--spec", spec, "--backend", "portable", "-q", check=False)
    assert proc.returncode != 0
    lines = [l for l in proc.stderr.splitlines() if l.strip()]
    assert len(lines) == 1, proc.stderr
    assert "cannot lower node" in lines[0] and "aten._upsample_bilinear2d_aa.vec" in lines[0], lines[0]
    assert "no kernel or decomposition" in lines[0], lines[0]
    assert "test_models_vision.py:" in lines[0], lines[0]
    assert not (tmp_path / "circ" / "circ_portable.pte").exists()
