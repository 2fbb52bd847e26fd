"""The oracle for dynamically quantized products (torchao's 8da4w / 8da8w: each activation row quantized to int8
on the fly, scale and zero point per row, times int4 / int8 weights), exact about what it compares.

Two programs that compute the same fp32 activation quantize it to the same int8 row, and then the product
differs only by fp32 accumulation order: DESIGN's fp32 tolerance (1e-4 x max|ref|) holds. That breaks two ways:

- the activation itself comes out of earlier fp32 arithmetic (a GELU, a matmul, a residual add) that rounds
  differently in each program (and in PyTorch's own kernels from one CPU to the next): one value on the other
  side of a .5 moves every output of the next product by scale x |w|. So a program's quantized products are
  checked one at a time, each against torchao eager fed that program's own input to it: the program returns
  the input of every quantized linear as an extra output (`Taps`), and the stage that linear starts is
  recomputed in eager from it (`check_stages`).
- the quantizer's own arithmetic: XNNPACK (ExecuTorch's runtime) gets its scale as 255 / (max - min), torchao as
  (max - min) / 255 then 1 / scale, a last-bit difference that matters only for a value within a hair of a
  rounding boundary. For those (`near_boundary`: within EPS of an int8 step of k + .5, a few in a thousand)
  the bound grows, per output, by what flipping each can do: act_scale x |w_dequantized| summed over them;
  their share is bounded (MAX_NEAR: a few percent), so the allowance stays a few steps and a real error (a
  weight scale off by one bf16 step, a wrong zero point, a swapped nibble) still fails.
"""
from __future__ import annotations

import numpy as np
import torch

EPS = 1e-3        # of one int8 step: how near k + .5 an activation must lie to round either way in another program
MAX_NEAR = 0.05   # the share of activations allowed that near: about 2 x EPS for spread values, but a GELU's
                  # outputs crowd at its minimum (-0.17), and when that lies near k + .5 steps, 2% of a row is near
LIPSCHITZ = {torch.nn.ReLU: 1.0, torch.nn.SiLU: 1.1, torch.nn.GELU: 1.13}  # max |f'|: an input error's reach


def per_token_qparams(x: np.ndarray):
    """torchao's per-token asymmetric int8 (choose_qparams_affine, quantize_affine; kiln's src/cpu/qd8-gemm
    follows it): per row, scale = (max(x, 0) - min(x, 0)) / 255, zero point = -128 - round(min / scale),
    q = clamp(round(x / scale) + zero point). Returns (scale [rows], x / scale in int8 steps, q before the clamp)."""
    x = np.asarray(x, np.float32).reshape(-1, np.shape(x)[-1])
    lo = np.minimum(x.min(1), np.float32(0))
    hi = np.maximum(x.max(1), np.float32(0))
    s = np.maximum((hi - lo) / np.float32(255), np.finfo(np.float32).tiny).astype(np.float32)
    t = x.astype(np.float64) * (np.float32(1) / s).astype(np.float64)[:, None]
    zp = np.clip(-128 - np.rint(lo.astype(np.float64) / s), -128, 127)
    return s, t, np.rint(t) + zp[:, None], lo.astype(np.float64) / s


def _near_half(v):
    return np.abs(v - np.floor(v) - 0.5) < EPS


def near_boundary(x: np.ndarray):
    """(scale [rows], mask [rows, k]): the activations another program may quantize one step away: those within
    EPS of a rounding boundary, and where the zero point itself is that near (-128 - round(min / scale)), the
    values at the clamped ends (the zero point moves them, and only them)."""
    s, t, q, lo_steps = per_token_qparams(x)
    near = _near_half(t)
    near |= _near_half(lo_steps)[:, None] & ((q >= 127) | (q <= -128))
    return s, near


def _is_linear(m) -> bool:  # nn.Linear (torchao's tensor subclass weights) or torchao's older module swap
    return isinstance(m, torch.nn.Linear) or type(m).__name__ == "Int8DynActInt4WeightLinear"


def dequantized_weight(linear) -> np.ndarray:
    """The [out, in] fp32 weight a torchao-quantized linear computes with."""
    w = linear.weight
    if type(linear).__name__ == "Int8DynActInt4WeightLinear":  # int8 buffer, per-group scales and zero points
        g = linear.groupsize
        w = (w.float() - linear.zeros.float().repeat_interleave(g, 1)) * linear.scales.float().repeat_interleave(g, 1)
    return (w.dequantize() if hasattr(w, "dequantize") else w).detach().float().numpy()


def flip_allowance(x: np.ndarray, weight: np.ndarray):
    """Per output of x @ weight.T: the most flipping the near-boundary activations of x by one step can move it
    (act_scale x |w| summed over them); and how many of x's activations are near."""
    s, near = near_boundary(x)
    allow = (near * s[:, None]).astype(np.float64) @ np.abs(weight.astype(np.float64)).T
    return allow.reshape(*np.shape(x)[:-1], weight.shape[0]), int(near.sum()), int(near.size)


def assert_quantized_close(got, ref, allow, what: str, near=(0, 1)):
    """max |got - ref| within DESIGN's fp32 tolerance (1e-4 x max|ref|), plus per output `allow` (what a flipped
    activation rounding can cause); the near-boundary share bounded by MAX_NEAR."""
    n_near, n_all = near
    assert n_near <= MAX_NEAR * n_all, f"{what}: {n_near} of {n_all} activations within {EPS} step of a rounding " \
                                       f"boundary (more than {MAX_NEAR:.0%}): the oracle would not be exact"
    got = np.asarray(got, np.float64)
    ref = np.asarray(ref, np.float64)
    assert got.shape == ref.shape, (what, got.shape, ref.shape)
    tol = 1e-4 * float(np.abs(ref).max())
    diff = np.abs(got - ref)
    over = diff - (tol + np.broadcast_to(allow, diff.shape))
    if (over > 0).any():
        at = np.unravel_index(int(np.argmax(over)), diff.shape)
        raise AssertionError(
            f"{what}: |diff| {diff[at]:.3g} at {tuple(int(i) for i in at)} > fp32 tolerance {tol:.3g} + "
            f"{float(np.broadcast_to(allow, diff.shape)[at]):.3g} for the {n_near} of {n_all} activations near a "
            f"rounding boundary (max |diff| {diff.max():.3g})")


class Taps(torch.nn.Module):
    """A Sequential of Linear and elementwise layers that also returns the input of every Linear after the
    first: (input of Linear 2, ..., input of Linear n, output). A runtime's values there let each quantized
    product be checked against eager fed that runtime's own activations (`check_stages`)."""

    def __init__(self, seq: torch.nn.Sequential):
        super().__init__()
        self.seq = seq

    def forward(self, x):
        taps = []
        for i, m in enumerate(self.seq):
            if _is_linear(m) and i > 0:
                taps.append(x)
            x = m(x)
        return (*taps, x)


def _stages(qseq: torch.nn.Sequential):
    """The Sequential cut before every Linear: [(the quantized Linear, the elementwise layers after it)]."""
    stages = []
    for m in qseq:
        if _is_linear(m):
            stages.append((m, []))
        else:
            assert stages and type(m) in LIPSCHITZ, f"the oracle does not know {type(m).__name__}"
            stages[-1][1].append(m)
    return stages


def check_stage(linear, inp: np.ndarray, stage, got, what: str, lipschitz: float = 1.0):
    """A runtime's output `got` of a stage that starts with the quantized `linear` (torchao's module) on the
    runtime's own input `inp` to it, against `stage` (a function of a tensor: the linear and what follows it,
    with max |d stage / d linear's output| <= lipschitz) in eager on the same input."""
    inp = np.asarray(inp, np.float32)
    with torch.no_grad():
        ref = stage(torch.from_numpy(inp)).numpy()
    allow, n_near, n_all = flip_allowance(inp, dequantized_weight(linear))
    assert_quantized_close(got, ref, allow * lipschitz, what, (n_near, n_all))
    return ref


def check_stages(qseq: torch.nn.Sequential, x: np.ndarray, outs, what: str):
    """`outs`: a runtime's outputs of Taps(the Sequential) on x. Each stage (a quantized Linear and the
    elementwise layers after it), in eager (torchao, `qseq`) on the runtime's own input to it, against the
    runtime's output of it."""
    stages = _stages(qseq)
    assert len(outs) == len(stages), (what, len(outs), len(stages))
    inp = x
    for i, ((lin, acts), got) in enumerate(zip(stages, outs)):
        def stage(t, lin=lin, acts=acts):
            t = lin(t)
            for a in acts:
                t = a(t)
            return t

        lip = float(np.prod([LIPSCHITZ[type(a)] for a in acts]))
        check_stage(lin, inp, stage, got, f"{what}, linear {i + 1} of {len(stages)}", lip)
        inp = got
