#!/usr/bin/env python3
"""Operator coverage sweep: PyTorch's OpInfo samples through kiln and ExecuTorch.

    .venv/bin/python bench/coverage/sweep.py [--ops a,b,c] [--max-samples 8] [--kiln-bin build-rel/kiln]
                                             [--out bench/coverage/results.jsonl] [--resume] [--no-et-lower]
    .venv/bin/python bench/coverage/sweep.py --report-only [--out ...]      # COVERAGE.md from the JSON lines

For every selected operator (core ATen operators that have an OpInfo, plus the
non-core operators issue 11 names; `python sweep.py --list` prints them) it
takes up to --max-samples float32 sample inputs of
`torch.testing._internal.common_methods_invocations.op_db` (the first
supported dtype of int64/int32/bool for operators without float32), wraps the
call in a one-operator nn.Module and exports it with torch.export (every
tensor argument is a program input; for operators with weights — conv,
linear, norms, prelu, embedding — the tensors after the first are buffers,
as in a model). Then, per backend (portable, xnnpack):

  kiln lower   `kiln lower --spec` on the saved .pt2 (subprocess, timeout)
  ET lower     to_edge().to_executorch() (portable),
               to_edge_transform_and_lower(XnnpackPartitioner()) (xnnpack)
  each .pte    run in ExecuTorch's runtime (executorch.runtime, in-process)
               and in kiln's runtime (`kiln run`, subprocess, timeout)

and compares every output with eager PyTorch: float within
1e-4 * max|ref| + 1e-5 (NaN where eager has NaN, same infinities), ints and
bools exactly, same shape and dtype.

Each sample's result is one JSON line appended to --out as soon as it is
known, so a partial run is usable and --resume continues it. The sweep runs
in a worker process; if the worker dies (a crash inside ExecuTorch's runtime
on a kiln .pte, say) the driver records the sample and the stage it died in
as a crash and starts a new worker that continues after it.

Statuses per stage: ok, error (a clean failure, its one-line message kept),
wrong (ran, numbers differ from eager), crash (signal, sanitizer report,
non-one exit code, or a multi-line/uncaught failure from kiln), timeout,
skip (an earlier stage failed). kiln crashes and wrong numbers are bugs.

This is a benchmark: it imports torch and executorch as oracles. kiln itself
does not depend on either.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DEFAULT_OUT = REPO / "bench" / "coverage" / "results.jsonl"
BACKENDS = ("portable", "xnnpack")
KILN_TIMEOUT_S = 120

# Operators from issue 11 that are not core ATen (or whose core op has no
# OpInfo of its own name); OpInfo names (with variant after a dot).
ISSUE11_OPS = [
    "nn.functional.scaled_dot_product_attention",
    "nn.functional.conv1d", "nn.functional.conv2d", "nn.functional.conv3d",
    "nn.functional.conv_transpose1d", "nn.functional.conv_transpose2d", "nn.functional.conv_transpose3d",
    "nn.functional.batch_norm", "native_batch_norm", "nn.functional.group_norm", "nn.functional.instance_norm",
    "nn.functional.layer_norm", "nn.functional.linear",
    "nn.functional.max_pool1d", "nn.functional.max_pool2d", "nn.functional.max_pool3d",
    "nn.functional.avg_pool1d", "nn.functional.avg_pool2d", "nn.functional.avg_pool3d",
    "nn.functional.adaptive_avg_pool1d", "nn.functional.adaptive_avg_pool2d", "nn.functional.adaptive_avg_pool3d",
    "nn.functional.adaptive_max_pool1d", "nn.functional.adaptive_max_pool2d", "nn.functional.adaptive_max_pool3d",
    "nn.functional.interpolate.nearest", "nn.functional.interpolate.bilinear", "nn.functional.interpolate.linear",
    "nn.functional.interpolate.bicubic", "nn.functional.interpolate.trilinear", "nn.functional.interpolate.area",
    "nn.functional.interpolate.nearest-exact",
    "nn.functional.upsample_nearest", "nn.functional.upsample_bilinear",
    "nn.functional.pixel_shuffle", "nn.functional.pixel_unshuffle",
    "einsum",
    "nn.functional.hardswish", "nn.functional.hardsigmoid", "nn.functional.silu", "nn.functional.mish",
    "nn.functional.elu", "nn.functional.leaky_relu", "nn.functional.gelu", "nn.functional.relu6",
    "nn.functional.hardtanh", "nn.functional.selu", "nn.functional.celu", "nn.functional.softplus",
    "nn.functional.prelu", "nn.functional.logsigmoid", "nn.functional.tanhshrink",
    "erf", "softmax", "log_softmax", "nn.functional.softmin",
    "max.reduction_with_dim", "max.reduction_no_dim", "max.binary", "min.reduction_with_dim",
    "min.reduction_no_dim", "min.binary", "maximum", "minimum", "amax", "amin",
    "topk", "sort", "argsort", "argmax", "argmin", "cumsum", "cumprod",
    "scatter", "scatter_add", "gather", "index_put", "index_select", "index_add", "index_copy", "index_fill",
    "__getitem__", "masked_fill", "where", "clamp", "clamp_min", "clamp_max", "remainder", "floor_divide",
    "nn.functional.pad.constant", "nn.functional.pad.reflect", "nn.functional.pad.replicate",
    "nn.functional.pad.circular",
    "flip", "roll", "unfold", "nn.functional.unfold", "nn.functional.fold", "bucketize",
    "nn.functional.embedding", "nn.functional.normalize", "nn.functional.rms_norm",
    "matmul", "linalg.vector_norm", "cdist", "nn.functional.pdist",
    "float", "long", "int", "bool", "to",
]

# Hand-built samples for operators that have no OpInfo (recurrent layers):
# name -> list of (constructor, input shapes). Weights are parameters, as in a model.
MODULE_SAMPLES = {
    "nn.LSTM": [("LSTM", dict(input_size=8, hidden_size=16), [(5, 2, 8)]),
                ("LSTM", dict(input_size=8, hidden_size=16, num_layers=2, batch_first=True), [(2, 5, 8)]),
                ("LSTM", dict(input_size=8, hidden_size=16, bidirectional=True), [(5, 2, 8)])],
    "nn.GRU": [("GRU", dict(input_size=8, hidden_size=16), [(5, 2, 8)]),
               ("GRU", dict(input_size=8, hidden_size=16, num_layers=2, batch_first=True), [(2, 5, 8)]),
               ("GRU", dict(input_size=8, hidden_size=16, bidirectional=True), [(5, 2, 8)])],
    "nn.RNN": [("RNN", dict(input_size=8, hidden_size=16), [(5, 2, 8)]),
               ("RNN", dict(input_size=8, hidden_size=16, num_layers=2, nonlinearity="relu"), [(5, 2, 8)])],
}

# Outputs that cannot be compared with eager (random or uninitialized values).
NONDETERMINISTIC = re.compile(r"(^|\.)(bernoulli|normal|rand\w*|multinomial|uniform|exponential|geometric|cauchy|"
                              r"log_normal|empty\w*|new_empty\w*|\w*dropout\w*|rrelu|fractional_max_pool\w*|"
                              r"randn|randint\w*|resize_)$")
# Not operators a model's forward contains.
EXCLUDED = re.compile(r"(^masked\.|^sparse\.|^_refs|backward|^torch\.ops\.aten\._(flash|efficient))")
# Left out of the whole-op_db selection (--all-ops), with why: sparse tensors (a layout neither kiln nor
# ExecuTorch's runtime has), gradient operators (`*backward*`: training, not a forward), and the CUDA-only
# flash / memory-efficient attention kernels (no CPU implementation to export or to compare with). masked.* is in.
ALL_OPS_EXCLUDED = re.compile(r"(^sparse\.|backward|^_refs|^torch\.ops\.aten\._(flash|efficient))")

# Operators whose tensors after the first are weights (exported as buffers).
WEIGHTED = re.compile(r"^nn\.functional\.(conv\w*|linear|batch_norm|group_norm|instance_norm|layer_norm|"
                      r"rms_norm|prelu|embedding)|^native_batch_norm$|^native_layer_norm$|^native_group_norm$|"
                      r"^_native_batch_norm_legit$")


def opinfo_key(o) -> str:
    return o.name + (f".{o.variant_test_name}" if o.variant_test_name else "")


def _core_names():
    import torch

    aten = torch.ops.aten
    names = set()
    for n in dir(aten):
        pk = getattr(aten, n, None)
        if not hasattr(pk, "overloads"):
            continue
        try:
            if any(torch.Tag.core in getattr(pk, ov).tags for ov in pk.overloads()):
                names.add(n)
        except Exception:  # noqa: BLE001 - odd packets
            continue
    return names


def select_ops(wanted: list[str] | None = None, selection: str = "core"):
    """[(key, why, OpInfo or None)].

    selection "core": core-ATen OpInfos, issue 11's list, the module samples (the default);
    "all": every op_db entry with its variants except ALL_OPS_EXCLUDED, plus the module samples;
    "rest": the entries "all" has and "core" does not."""
    from torch.testing._internal.common_methods_invocations import op_db

    core = _core_names()
    rows, seen = [], set()
    for o in op_db:
        key = opinfo_key(o)
        if key in seen:
            continue
        hit = next((c for c in (o.aten_name, o.name.split(".")[-1]) if c in core), None)
        if EXCLUDED.search(key):
            why = None
        elif hit:
            why = f"core aten.{hit}"
        elif key in ISSUE11_OPS or o.name in ISSUE11_OPS:
            why = "issue 11"
        else:
            why = None
        if selection == "core" and why is None:
            continue
        if selection != "core":
            if ALL_OPS_EXCLUDED.search(key) or (selection == "rest" and why is not None):
                continue
            why = why or "op_db"
        seen.add(key)
        rows.append((key, why, o))
    if selection != "rest":
        for name in MODULE_SAMPLES:
            rows.append((name, "issue 11 (module)", None))
    if wanted:
        rows = [r for r in rows if r[0] in wanted or r[0].split(".")[0] in wanted]
    return rows


# ----------------------------------------------------------------------------------------------- samples


def _sample_dtype(o):
    import torch

    dts = o.supported_dtypes("cpu")
    for dt in (torch.float32, torch.int64, torch.int32, torch.bool):
        if dt in dts:
            return dt
    return None


def samples_of(key, o, max_samples, dtypes=None):
    """[(sample description, module, example inputs)] for one operator; deterministic. `dtypes` (names, e.g.
    ["int32", "bool"]): up to max_samples samples of each of them the operator supports, instead of its float32
    ones (int64/int32/bool when it has no float32)."""
    import torch

    torch.manual_seed(0)
    if o is None:
        out = []
        for cls, kw, shapes in MODULE_SAMPLES[key][:max_samples]:
            m = getattr(torch.nn, cls)(**kw).eval()
            ins = tuple(torch.randn(s) for s in shapes)
            out.append((f"{cls}({', '.join(f'{k}={v}' for k, v in kw.items())})", _ModuleOut(m), ins))
        return out
    if dtypes:
        supported = o.supported_dtypes("cpu")
        picked = [getattr(torch, d) for d in dtypes if getattr(torch, d) in supported]
    else:
        picked = [_sample_dtype(o)] if _sample_dtype(o) is not None else []
    out = []
    for dt in picked:
        n = 0
        for s in o.sample_inputs("cpu", dt, requires_grad=False):
            if n >= max_samples:
                break
            out.append(_wrap(key, o, s))
            n += 1
    return out


class _ModuleOut:
    """Marks a ready nn.Module sample."""

    def __init__(self, m):
        self.m = m


def _describe(v):
    import torch

    if isinstance(v, torch.Tensor):
        return f"{str(v.dtype).removeprefix('torch.')}{list(v.shape)}"
    if isinstance(v, (list, tuple)):
        inner = ", ".join(_describe(x) for x in v)
        return f"[{inner}]" if isinstance(v, list) else f"({inner})"
    if isinstance(v, float):
        return f"{v:.4g}"
    return repr(v)


def _wrap(key, o, s):
    """(description, nn.Module, example inputs) for one SampleInput."""
    import torch
    import torch.utils._pytree as pytree

    call = (s.input, tuple(s.args), dict(s.kwargs))
    leaves, spec = pytree.tree_flatten(call)
    weighted = bool(WEIGHTED.search(key))
    inputs, consts, slots = [], [], []
    first = True
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor):
            t = leaf.detach().clone().contiguous()
            if weighted and not first:
                slots.append(("c", len(consts)))
                consts.append(t)
            else:
                slots.append(("i", len(inputs)))
                inputs.append(t)
            first = False
        else:
            slots.append(("v", leaf))
    return sample_desc(s), _OpModule(o.op, spec, slots, consts), tuple(inputs)


def sample_desc(s) -> str:
    """One line naming an OpInfo sample: its input, args and kwargs."""
    desc = f"input={_describe(s.input)}"
    if s.args:
        desc += f" args={_describe(tuple(s.args))}"
    if s.kwargs:
        desc += " kwargs={" + ", ".join(f"{k}={_describe(v)}" for k, v in s.kwargs.items()) + "}"
    return desc


def _op_module_class():
    import torch
    import torch.utils._pytree as pytree

    class OpModule(torch.nn.Module):
        def __init__(self, fn, spec, slots, consts):
            super().__init__()
            self.fn, self.spec, self.slots = fn, spec, slots
            for i, c in enumerate(consts):
                self.register_buffer(f"w{i}", c)

        def forward(self, *xs):
            leaves = []
            for kind, v in self.slots:
                leaves.append(xs[v] if kind == "i" else getattr(self, f"w{v}") if kind == "c" else v)
            inp, args, kwargs = pytree.tree_unflatten(leaves, self.spec)
            return _flat_out(self.fn(inp, *args, **kwargs))

    return OpModule


def _OpModule(fn, spec, slots, consts):  # noqa: N802 - a factory that looks like the class
    global _OP_MODULE
    if _OP_MODULE is None:
        _OP_MODULE = _op_module_class()
    return _OP_MODULE(fn, spec, slots, consts)


_OP_MODULE = None


def _flat_out(r):
    import torch
    import torch.utils._pytree as pytree

    if isinstance(r, torch.Tensor):
        return (r,)
    leaves = pytree.tree_leaves(r)
    if not all(isinstance(x, torch.Tensor) for x in leaves):
        raise NonTensorOutput(f"output has non-tensor values ({type(r).__name__})")
    return tuple(leaves)


class NonTensorOutput(Exception):
    pass


def _module_of(m):
    if isinstance(m, _ModuleOut):
        import torch

        class Flat(torch.nn.Module):
            def __init__(self, inner):
                super().__init__()
                self.inner = inner

            def forward(self, *xs):
                return _flat_out(self.inner(*xs))

        return Flat(m.m)
    return m


# ----------------------------------------------------------------------------------------------- stages


def one_line(msg: str, limit: int = 240) -> str:
    lines = [ln.strip() for ln in str(msg).strip().splitlines() if ln.strip()]
    line = lines[-1] if lines else ""
    for ln in lines:  # kiln's line, or the first line that names the error
        if "error:" in ln:
            line = ln
            break
    line = re.sub(r"/tmp/\S*?/", "", line)
    return line if len(line) <= limit else line[: limit - 3] + "..."


CRASH_MARKS = ("AddressSanitizer", "UndefinedBehaviorSanitizer", "runtime error:", "terminate called",
               "Segmentation fault", "Assertion", "LeakSanitizer")


def kiln_proc(kiln_bin, args, timeout=KILN_TIMEOUT_S):
    """(status, message) of one kiln subprocess: ok / error / crash / timeout."""
    try:
        p = subprocess.run([str(kiln_bin), *map(str, args)], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return "timeout", f"kiln {args[0]} ran past {timeout} s"
    err = p.stderr.strip()
    if p.returncode < 0:
        return "crash", f"kiln {args[0]} killed by signal {-p.returncode}: {one_line(err)}"
    if any(m in err for m in CRASH_MARKS):
        return "crash", f"kiln {args[0]}: {one_line(err)}"
    if p.returncode == 0:
        return "ok", ""
    if p.returncode != 1:
        return "crash", f"kiln {args[0]} exit {p.returncode}: {one_line(err)}"
    lines = [ln for ln in err.splitlines() if ln.strip()]
    if len(lines) != 1 or not lines[0].startswith("kiln: error:"):
        return "crash", f"kiln {args[0]}: not one error line ({len(lines)} lines): {one_line(err)}"
    return "error", one_line(err)


# max |diff| <= RTOL * max|ref| + 1e-5 per output: DESIGN's float32 rule; for 16-bit outputs torch.testing's own
# default rtol of the dtype (one rounding of a result computed wider, or eager's own roundings, is inside it)
RTOL = {"float16": 1e-3, "bfloat16": 1.6e-2}


# Operators whose integer output is a sort order or a top-k selection, unspecified among equal values unless the
# sample asks for a stable sort: such an output is correct when its indices are distinct along some axis and take
# the same values from the input as eager's do (int and 16-bit samples have many ties; float32 ones rarely any).
TIE_ORDER_OPS = ("sort", "argsort", "msort", "topk")


def ties_unspecified(key, desc):
    return key in TIE_ORDER_OPS and "stable=True" not in desc


def _same_order_up_to_ties(o, r, source):
    """True when `o` differs from eager's indices `r` only among equal values of `source` (an input whose shape is
    r's but along one axis): indices distinct and in range along that axis, gathering from `source` exactly what
    `r` gathers (a permutation when the axis keeps its length: sort)."""
    import numpy as np

    if source is None or source.ndim != r.ndim or r.ndim == 0 or o.size == 0:
        return False
    for axis in range(r.ndim):
        if any(source.shape[a] != r.shape[a] for a in range(r.ndim) if a != axis):
            continue
        n = source.shape[axis]
        if o.min() < 0 or o.max() >= n:
            continue
        ordered = np.sort(o, axis=axis)
        if r.shape[axis] > 1 and (np.diff(ordered, axis=axis) == 0).any():
            continue  # an index twice
        a, b = np.take_along_axis(source, o, axis), np.take_along_axis(source, r, axis)
        if np.array_equal(a, b, equal_nan=a.dtype.kind == "f"):
            return True
    return False


def compare(outs, refs, dtypes=(), exact=(), tie_sources=None):
    """None when every output matches eager, else what differs. `dtypes`: eager's dtype names per output (a
    bfloat16 output is compared as float32, NumPy having no bfloat16). `exact`: for 16-bit outputs, eager's
    result of the same inputs in float64 (None where eager cannot give it): eager's 16-bit result carries the
    rounding of every step, and a runtime that computes the steps in float32 (kiln's widened XNNPACK programs,
    or any runtime's float16 arithmetic in float32) can be off eager's by more than one rounding while nearer the
    exact value; an output within the dtype's tolerance of eager's float64 result is correct too. `tie_sources`:
    the sample's inputs when its integer outputs are sort orders with ties unspecified (`ties_unspecified`)."""
    import numpy as np

    if len(outs) != len(refs):
        return f"{len(outs)} outputs, eager has {len(refs)}"
    for i, (o, r) in enumerate(zip(outs, refs)):
        o, r = np.asarray(o), np.asarray(r)
        if o.shape != r.shape:
            return f"output {i}: shape {list(o.shape)}, eager {list(r.shape)}"
        if o.dtype != r.dtype:
            return f"output {i}: dtype {o.dtype}, eager {r.dtype}"
        if r.dtype.kind in "biu":
            if not np.array_equal(o, r):
                if tie_sources is not None and any(_same_order_up_to_ties(o, r, np.asarray(x, dtype=np.float64))
                                                   for x in tie_sources):
                    continue
                bad = int((o != r).sum())
                return f"output {i}: {bad} of {r.size} elements differ (exact compare)"
            continue
        o64, r64 = o.astype(np.float64), r.astype(np.float64)
        if not np.array_equal(np.isnan(o64), np.isnan(r64)):
            return f"output {i}: NaN positions differ"
        inf = np.isinf(r64)
        if not np.array_equal(o64[inf], r64[inf]) or np.isinf(o64[~inf]).any():
            return f"output {i}: infinities differ"
        fin = np.isfinite(r64)
        if fin.any():
            diff = float(np.abs(o64[fin] - r64[fin]).max())
            rtol = RTOL.get(dtypes[i], 1e-4) if i < len(dtypes) else 1e-4
            bound = rtol * float(np.abs(r64[fin]).max()) + 1e-5
            if diff > bound:
                x = np.asarray(exact[i], dtype=np.float64) if i < len(exact) and exact[i] is not None else None
                if x is not None and x.shape == r64.shape and np.isfinite(x[fin]).all():
                    dx = float(np.abs(o64[fin] - x[fin]).max())
                    if dx <= rtol * float(np.abs(x[fin]).max()) + 1e-5:
                        continue  # nearer the exact value than eager's own 16-bit steps allow
                return f"output {i}: max |diff| {diff:.3g} > {bound:.3g}"
    return None


def _float64_eager(module, inputs):
    """Eager's outputs of a 16-bit sample computed in float64 (the module's floating parameters and buffers and
    the floating inputs widened), one numpy array per output; None for an output (or all) eager cannot give."""
    import copy

    import torch

    try:
        m64 = copy.deepcopy(module).double()
        with torch.no_grad():
            outs = m64(*[x.double() if x.is_floating_point() else x.clone() for x in inputs])
        return [o.double().numpy() if isinstance(o, torch.Tensor) and o.is_floating_point() else None for o in outs]
    except Exception:  # noqa: BLE001 - an operator with no float64 kernel, or one whose dtype is an argument
        return []


def et_execute(pte: Path, inputs):
    import torch
    from executorch.runtime import Runtime

    program = Runtime.get().load_program(str(pte))
    method = program.load_method("forward")
    outs = method.execute([x.clone() for x in inputs])
    return [(o.float() if o.dtype == torch.bfloat16 else o).numpy() if isinstance(o, torch.Tensor) else o
            for o in outs], [str(o.dtype).removeprefix("torch.") if isinstance(o, torch.Tensor) else "" for o in outs]


def kiln_execute(kiln_bin, pte: Path, inputs, n_out, work: Path):
    """(status, message, outputs) of `kiln run`."""
    import numpy as np

    args = ["run", pte]
    import torch

    for i, x in enumerate(inputs):  # bfloat16 (no NumPy type) as float32: `kiln run` rounds it back, exactly
        np.save(work / f"in{i}.npy", (x.float() if x.dtype == torch.bfloat16 else x).numpy())
        args += ["--input", work / f"in{i}.npy"]
    for i in range(n_out):
        f = work / f"out{i}.npy"
        f.unlink(missing_ok=True)
        args += ["--output", f]
    st, msg = kiln_proc(kiln_bin, args)
    if st != "ok":
        return st, msg, None
    return "ok", "", [np.load(work / f"out{i}.npy") for i in range(n_out)]


def et_lower(ep, backend: str, out: Path):
    import copy

    from executorch.exir import to_edge, to_edge_transform_and_lower

    ep = copy.deepcopy(ep)
    if backend == "portable":
        prog = to_edge(ep).to_executorch()
    else:
        from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

        prog = to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()]).to_executorch()
    out.write_bytes(prog.buffer)


class Progress:
    """Where the worker is: the driver reads it when the worker dies."""

    def __init__(self, path):
        self.path = path

    def __call__(self, **kw):
        if self.path:
            tmp = self.path + ".tmp"
            with open(tmp, "w") as f:
                json.dump(kw, f)
            os.replace(tmp, self.path)


def run_sample(kiln_bin, module, inputs, work: Path, et_lowering=True, progress=None, backends=BACKENDS,
               et_runtime=True, et_cache: Path | None = None, cache_key: str | None = None, crashed=(),
               decompose=False, ties=False):
    """One sample through every stage; the record (a dict of stages).

    With et_cache and cache_key, ExecuTorch's lowering (the slow part: seconds per
    sample) is kept in et_cache under the key and reused by later runs. `crashed`: in-process
    stages (ExecuTorch's runtime or lowering) that killed an earlier worker on this sample;
    they are recorded as crashes instead of being run again. `ties`: integer outputs are sort orders whose
    order among equal values is unspecified (`ties_unspecified`)."""
    import numpy as np
    import torch

    report = progress or (lambda **kw: None)
    times, mark = {}, [None, time.time()]

    def progress(stage):
        now = time.time()
        if mark[0]:
            times[mark[0]] = round(times.get(mark[0], 0) + now - mark[1], 3)
        mark[0], mark[1] = stage, now
        report(stage=stage)

    rec = {"times": times}
    module = _module_of(module)
    try:
        with torch.no_grad():
            eager = module(*[x.clone() for x in inputs])
            refs = [r.detach().numpy() if r.dtype != torch.bfloat16 else r.float().numpy() for r in eager]
            ref_dtypes = [str(r.dtype).removeprefix("torch.") for r in eager]
        exact = _float64_eager(module, inputs) if any(d in RTOL for d in ref_dtypes) else []
        tie_sources = [(x.float() if x.dtype == torch.bfloat16 else x).numpy() for x in inputs
                       if isinstance(x, torch.Tensor)] if ties else None
    except NonTensorOutput as e:
        rec["export"] = {"status": "unsupported", "msg": str(e)}
        return rec
    except Exception as e:  # noqa: BLE001 - eager itself rejects the sample
        rec["export"] = {"status": "eager_error", "msg": one_line(f"{type(e).__name__}: {e}")}
        return rec
    progress(stage="export")
    try:
        with torch.no_grad():
            ep = torch.export.export(module, tuple(x.clone() for x in inputs), strict=False)
    except Exception as e:  # noqa: BLE001 - torch.export cannot export it
        rec["export"] = {"status": "error", "msg": one_line(f"{type(e).__name__}: {e}")}
        return rec
    if decompose:
        try:
            with torch.no_grad():
                ep = ep.run_decompositions()
        except Exception as e:  # noqa: BLE001 - torch's decompositions fail on it
            rec["export"] = {"status": "error", "msg": one_line(f"run_decompositions: {type(e).__name__}: {e}")}
            return rec
    pt2 = work / "prog.pt2"
    try:
        torch.export.save(ep, str(pt2))
    except Exception as e:  # noqa: BLE001 - torch cannot serialize what it exported (a program with no outputs)
        rec["export"] = {"status": "error", "msg": one_line(f"torch.export.save: {type(e).__name__}: {e}")}
        return rec
    rec["export"] = {"status": "ok"}
    (work / "model_spec.json").write_text(json.dumps({"name": "op", "exported_program": "prog.pt2"}))
    n_out = len(refs)

    def run_both(pte, tag, rec_b):
        if et_runtime:
            stage = f"{tag}: ExecuTorch runtime"
            progress(stage=stage)
            if stage in crashed:  # it killed an earlier worker: recorded, not run again
                rec_b["et_run"] = {"status": "crash", "msg": "ExecuTorch's runtime aborted the process"}
            else:
                try:
                    outs, dtypes = et_execute(pte, inputs)
                    bad = next((f"output {i}: dtype {d}, eager {r}" for i, (d, r) in enumerate(zip(dtypes, ref_dtypes))
                                if d and d != r), None) or compare(outs, refs, ref_dtypes, exact, tie_sources)
                    rec_b["et_run"] = {"status": "wrong", "msg": bad} if bad else {"status": "ok"}
                except Exception as e:  # noqa: BLE001 - ExecuTorch's runtime rejects the program
                    rec_b["et_run"] = {"status": "error", "msg": one_line(f"{type(e).__name__}: {e}")}
        progress(stage=f"{tag}: kiln runtime")
        st, msg, outs = kiln_execute(kiln_bin, pte, inputs, n_out, work)
        if st == "ok":
            bad = compare(outs, refs, ref_dtypes, exact, tie_sources)
            rec_b["kiln_run"] = {"status": "wrong", "msg": bad} if bad else {"status": "ok"}
        else:
            rec_b["kiln_run"] = {"status": st, "msg": msg}

    for backend in backends:
        r = rec[f"kiln_{backend}"] = {}
        pte = work / f"kiln_{backend}.pte"
        pte.unlink(missing_ok=True)
        progress(stage=f"kiln lower {backend}")
        st, msg = kiln_proc(kiln_bin, ["lower", "--spec", work / "model_spec.json", "--backend", backend,
                                       "--out", pte, "-q"])
        r["lower"] = {"status": st, "msg": msg} if msg else {"status": st}
        if st == "ok":
            run_both(pte, f"kiln {backend}", r)
        if et_lowering:
            r = rec[f"et_{backend}"] = {}
            pte = work / f"et_{backend}.pte"
            progress(stage=f"ET lower {backend}")
            cached = et_cache / f"{cache_key}_{backend}" if et_cache and cache_key else None
            if cached and cached.with_suffix(".json").is_file():
                r["lower"] = json.loads(cached.with_suffix(".json").read_text())
                if r["lower"]["status"] == "ok":
                    pte.write_bytes(cached.with_suffix(".pte").read_bytes())
            elif f"ET lower {backend}" in crashed:
                r["lower"] = {"status": "crash", "msg": "ExecuTorch's lowering aborted the process"}
            else:
                try:
                    et_lower(ep, backend, pte)
                    r["lower"] = {"status": "ok"}
                except Exception as e:  # noqa: BLE001 - ExecuTorch cannot lower it
                    r["lower"] = {"status": "error", "msg": one_line(f"{type(e).__name__}: {e}")}
                if cached:
                    if r["lower"]["status"] == "ok":
                        cached.with_suffix(".pte").write_bytes(pte.read_bytes())
                    cached.with_suffix(".json").write_text(json.dumps(r["lower"]))
            if r["lower"]["status"] != "ok":
                continue
            run_both(pte, f"ET {backend}", r)
    progress("done")
    times.pop("done", None)
    return rec


# ----------------------------------------------------------------------------------------------- worker / driver


def done_keys(out: Path):
    keys = set()
    if out.is_file():
        for line in out.read_text().splitlines():
            try:
                r = json.loads(line)
            except ValueError:
                continue
            keys.add((r["op"], r["sample"]))
            if r.get("op_done"):
                keys.add((r["op"], "*"))
    return keys


def worker(args):
    import warnings

    warnings.filterwarnings("ignore")
    import logging

    logging.disable(logging.WARNING)
    out = Path(args.out)
    done = done_keys(out)
    progress = Progress(args.progress)
    kiln_bin = Path(args.kiln_bin).resolve()
    wanted = args.ops.split(",") if args.ops else None
    et_cache = Path(args.et_cache) if args.et_cache else None
    if et_cache:
        et_cache.mkdir(parents=True, exist_ok=True)
    from importlib.metadata import version

    et_version = version("executorch") + "/" + version("torch")
    isa_done = False
    notes_path = Path(str(out) + ".crashes.json")
    crash_notes = json.loads(notes_path.read_text()) if notes_path.is_file() else {}
    with tempfile.TemporaryDirectory(prefix="kiln-cov-") as tmp, open(out, "a") as f:
        work = Path(tmp)
        if args.category == "ops":
            rows = select_ops(wanted, args.selection)
        else:  # categories.py: o is the category's sample generator
            from categories import select

            rows = select(args.category, wanted)
        for key, why, o in rows:
            if (key, "*") in done:
                continue
            if NONDETERMINISTIC.search(key.rstrip("_")):
                f.write(json.dumps({"op": key, "why": why, "sample": -1, "op_done": True,
                                    "skipped": "random or uninitialized output"}) + "\n")
                f.flush()
                continue
            progress(op=key, sample=-1, stage="samples")
            try:
                samples = (samples_of(key, o, args.max_samples, args.dtypes.split(",") if args.dtypes else None)
                           if args.category == "ops" else o(args.max_samples))
            except Exception as e:  # noqa: BLE001 - OpInfo's generator fails
                samples = []
                f.write(json.dumps({"op": key, "why": why, "sample": -1, "op_done": True,
                                    "skipped": one_line(f"sample generation failed: {e}")}) + "\n")
                f.flush()
                continue
            if not samples:
                f.write(json.dumps({"op": key, "why": why, "sample": -1, "op_done": True,
                                    "skipped": "no float32/int/bool samples"}) + "\n")
            for i, (desc, module, inputs) in enumerate(samples):
                if (key, i) in done:
                    continue
                t0 = time.time()
                progress(op=key, why=why, sample=i, desc=desc, stage="start")
                ir = "" if args.ir == "default" else f"|{args.ir}"
                ir += "" if args.category == "ops" else f"|{args.category}"
                ck = hashlib.sha256(f"{key}|{i}|{desc}|{et_version}{ir}".encode()).hexdigest()[:24]
                rec = run_sample(kiln_bin, module, inputs, work, et_lowering=not args.no_et_lower,
                                 et_cache=et_cache, cache_key=ck, crashed=crash_notes.get(f"{key}|{i}", []),
                                 decompose=args.ir == "core_aten", ties=ties_unspecified(key, desc),
                                 progress=lambda **kw: progress(op=key, why=why, sample=i, desc=desc, **kw))
                if not isa_done and rec.get("kiln_portable", {}).get("lower", {}).get("status") == "ok":
                    isa_done = record_isa(kiln_bin, work / "kiln_portable.pte", Path(str(out) + ".isa.json"))
                line = {"op": key, "why": why, "sample": i, "desc": desc[:300], **rec,
                        "seconds": round(time.time() - t0, 2)}
                f.write(json.dumps(line) + "\n")
                f.flush()
                if args.verbose:
                    print(summarize_line(line), flush=True)
            f.write(json.dumps({"op": key, "why": why, "sample": -1, "op_done": True,
                                "samples": len(samples)}) + "\n")
            f.flush()
    return 0


def record_isa(kiln_bin, pte: Path, dest: Path) -> bool:
    """The kernels' ISA kiln's runtime picked (`kiln bench --json`), for the report."""
    try:
        p = subprocess.run([str(kiln_bin), "bench", str(pte), "--iters", "1", "--warmup", "0", "--json"],
                           capture_output=True, text=True, timeout=KILN_TIMEOUT_S)
        j = json.loads(p.stdout)
        dest.write_text(json.dumps({"isa": j.get("isa"), "best_isa": j.get("best_isa")}))
        return True
    except (subprocess.TimeoutExpired, ValueError, OSError):
        return False


def summarize_line(r):
    parts = [f"{r['op']}[{r['sample']}]"]
    for k, v in r.items():
        if k == "times":
            continue
        if isinstance(v, dict) and "status" in v:
            parts.append(f"{k}={v['status']}")
        elif isinstance(v, dict):
            parts.append(k + ":" + ",".join(f"{s}={x['status']}" for s, x in v.items()))
    return " ".join(parts)


def driver(args):
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if not args.resume:
        for p in (out, Path(str(out) + ".crashes.json")):
            p.unlink(missing_ok=True)
    progress = str(out) + ".progress"
    cmd = [sys.executable, __file__, "--worker", "--out", str(out), "--progress", progress,
           "--kiln-bin", args.kiln_bin, "--max-samples", str(args.max_samples)]
    if args.ops:
        cmd += ["--ops", args.ops]
    if args.no_et_lower:
        cmd.append("--no-et-lower")
    if args.dtypes:
        cmd += ["--dtypes", args.dtypes]
    cmd += ["--ir", args.ir, "--category", args.category, "--selection", args.selection]
    cmd += ["--et-cache", args.et_cache]
    if args.verbose:
        cmd.append("--verbose")
    meta = {"command": " ".join(["bench/coverage/sweep.py", *sys.argv[1:]]),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "kiln_bin": args.kiln_bin,
            "max_samples": args.max_samples, "category": args.category, "selection": args.selection}
    (Path(str(out) + ".meta.json")).write_text(json.dumps(meta))
    restarts = 0
    while True:
        p = subprocess.Popen(cmd)
        last, last_t = None, time.time()
        while p.poll() is None:
            time.sleep(1)
            try:
                cur = Path(progress).read_text()
            except OSError:
                cur = None
            if cur != last:
                last, last_t = cur, time.time()
            elif time.time() - last_t > args.sample_timeout:
                p.kill()
                p.wait()
                break
        if p.returncode == 0:
            break
        restarts += 1
        try:
            where = json.loads(Path(progress).read_text())
        except (OSError, ValueError):
            where = {}
        how = "hang" if p.returncode in (-9,) else f"worker died (exit {p.returncode})"
        if "op" not in where or restarts > 50:
            print(f"sweep: worker failed ({how}) with no progress to skip; stopping", file=sys.stderr)
            return 1
        stage = where.get("stage", "?")
        print(f"sweep: {how} in {where['op']}[{where.get('sample')}] at {stage}; recorded as a crash, restarting",
              file=sys.stderr)
        if ("ExecuTorch runtime" in stage or stage.startswith("ET lower")) and where.get("sample", -1) >= 0:
            notes_path = Path(str(out) + ".crashes.json")
            notes = json.loads(notes_path.read_text()) if notes_path.is_file() else {}
            stages = notes.setdefault(f"{where['op']}|{where['sample']}", [])
            if stage not in stages:  # the new worker redoes the sample without this stage
                stages.append(stage)
                notes_path.write_text(json.dumps(notes))
                continue
        with open(out, "a") as f:
            rec = {"op": where["op"], "why": where.get("why", ""), "sample": where.get("sample", -1),
                   "desc": where.get("desc", ""), "worker_crash": {"status": "crash",
                                                                   "msg": f"{how} at stage '{stage}'"}}
            if where.get("sample", -1) == -1:
                rec["op_done"] = True
            f.write(json.dumps(rec) + "\n")
    from report import write_report  # noqa: E402 - beside this file

    write_report(out, Path(args.md))
    return 0


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ops", default="", help="comma-separated OpInfo names (a base name selects its variants)")
    p.add_argument("--max-samples", type=int, default=8, help="samples per operator (default 8)")
    p.add_argument("--kiln-bin", default=os.environ.get("KILN_BIN", str(REPO / "build-rel" / "kiln")))
    p.add_argument("--out", default=str(DEFAULT_OUT), help="JSON lines, one per sample")
    p.add_argument("--md", default=str(REPO / "bench" / "COVERAGE.md"), help="the report written at the end")
    p.add_argument("--resume", action="store_true", help="continue --out instead of starting over")
    p.add_argument("--ir", default="default", choices=["default", "core_aten"],
                   help="the exported program's IR: torch.export's default, or core ATen (run_decompositions())")
    p.add_argument("--category", default="ops", choices=["ops", "inplace", "modules"],
                   help="OpInfo operators; their in-place variants in a module writing an intermediate and a view "
                        "of one; torch.nn modules of module_db (categories.py)")
    p.add_argument("--all-ops", dest="selection", action="store_const", const="all", default="core",
                   help="(--category ops) every OpInfo of op_db with its variants (masked.* too; not sparse.*, "
                        "*backward*, the CUDA-only flash/efficient attention) instead of core ATen + issue 11")
    p.add_argument("--new-ops", dest="selection", action="store_const", const="rest",
                   help="(--category ops) the op_db entries --all-ops adds to the default selection, only")
    p.add_argument("--selection", dest="selection", choices=["core", "all", "rest"], help=argparse.SUPPRESS)
    p.add_argument("--no-et-lower", action="store_true", help="skip ExecuTorch's own lowering (faster)")
    p.add_argument("--dtypes", default="",
                   help="(--category ops) comma-separated dtypes (float32,int32,int64,bool,float16,bfloat16,...): "
                        "--max-samples samples of each one an operator supports, instead of float32 only")
    p.add_argument("--et-cache", default=str(REPO / "bench" / "coverage" / "et_cache"),
                   help="directory keeping ExecuTorch's lowerings between runs ('' for none)")
    p.add_argument("--sample-timeout", type=float, default=600, help="seconds without progress before a hang")
    p.add_argument("--report-only", action="store_true", help="only write bench/COVERAGE.md from --out")
    p.add_argument("--list", action="store_true", help="print the selected operators and exit")
    p.add_argument("--verbose", "-v", action="store_true")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--progress", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.list:
        wanted = args.ops.split(",") if args.ops else None
        if args.category != "ops":
            from categories import select
        for key, why, _ in select_ops(wanted, args.selection) if args.category == "ops" else select(args.category, wanted):
            print(f"{key:50s} {why}")
        return 0
    if args.report_only:
        from report import write_report

        write_report(Path(args.out), Path(args.md))
        return 0
    if args.worker:
        return worker(args)
    if not Path(args.kiln_bin).is_file():
        print(f"sweep: error: kiln binary not found at {args.kiln_bin}", file=sys.stderr)
        return 2
    return driver(args)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.exit(main())
