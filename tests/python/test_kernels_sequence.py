"""kiln's sequence/indexing kernels against torch eager: max/min (dim and all),
argmin, sort, topk, scatter (src, value, add, reduce), remainder, fmod,
clamp.Tensor, roll, unfold_copy, bucketize.

Each case runs one kernel through the kernel_runner binary and compares its
outs with what torch computes for the same inputs (exactly: these ops select
or move values, or compute one rounding per element).
"""
from __future__ import annotations

import pytest
import torch

from kernel_harness import NONE, Bool, Double, Int, Ints, KernelError, Str, T, out_like, run_kernel

aten = torch.ops.aten
ERR = ("invalid argument", "out of range", "not supported")


def ids(v):
    return str(v).removeprefix("torch.") if isinstance(v, torch.dtype) else None


def rand(shape, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    lo, hi = (0, 100) if dtype == torch.uint8 else (-50, 50)
    return torch.randint(lo, hi, shape, generator=g).to(dtype)


def distinct(shape, dtype, seed=0):
    """A random permutation of 0..n-1 (distinct values: orderings are unique)."""
    n = 1
    for s in shape:
        n *= s
    g = torch.Generator().manual_seed(seed)
    return (torch.randperm(n, generator=g).to(torch.float64) - n // 2).reshape(shape).to(dtype)


def check(got, want):
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    assert got.shape == want.shape, (got.shape, want.shape)
    assert torch.equal(got, want) or (got.is_floating_point() and torch.allclose(got, want, equal_nan=True, rtol=0,
                                                                                 atol=0)), (got, want)


def expect_error(op, overload, args):
    with pytest.raises(KernelError) as e:
        run_kernel(op, overload, args, [])
    assert e.value.status in ERR, e.value


# ---------------------------------------------------------------------------
# max / min / argmin


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int64, torch.int8, torch.bool], ids=ids)
@pytest.mark.parametrize("shape,dim", [((3, 5), 1), ((3, 5), 0), ((2, 3, 4), -2), ((4,), 0), ((), 0)])
@pytest.mark.parametrize("keepdim", [False, True])
def test_max_min_dim(dtype, shape, dim, keepdim):
    x = rand(shape, dtype)
    for op, overload, fn in (("aten::max", "dim_max", torch.max), ("aten::min", "dim_min", torch.min)):
        v, i = fn(x, dim, keepdim)
        got_v, got_i = run_kernel(op, overload, [T(x), Int(dim), Bool(keepdim), out_like(v), out_like(i)], [3, 4])
        check(got_v, v)
        if dtype != torch.bool:  # bool has ties everywhere: torch's index among ties is unspecified
            check(got_i, i)


def test_max_min_dim_nan():
    x = torch.tensor([[1.0, float("nan"), 3.0, float("nan")], [2.0, 5.0, -1.0, 0.0]])
    for op, overload, fn in (("aten::max", "dim_max", torch.max), ("aten::min", "dim_min", torch.min)):
        v, i = fn(x, 1)
        got_v, got_i = run_kernel(op, overload, [T(x), Int(1), Bool(False), out_like(v), out_like(i)], [3, 4])
        check(got_v, v)
        check(got_i, i)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int32, torch.uint8], ids=ids)
@pytest.mark.parametrize("shape", [(3, 5), (7,), ()])
def test_max_min_all(dtype, shape):
    x = rand(shape, dtype)
    for op, fn in (("aten::max", torch.max), ("aten::min", torch.min)):
        want = fn(x)
        check(run_kernel(op, "unary_out", [T(x), out_like(want)], [1])[0], want)


def test_max_min_all_empty_fails():
    expect_error("aten::max", "unary_out", [T(torch.zeros(0)), T(torch.zeros(()))])


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64], ids=ids)
@pytest.mark.parametrize("dim,keepdim", [(None, False), (None, True), (1, False), (0, True), (-1, True)])
def test_argmin(dtype, dim, keepdim):
    x = distinct((4, 6), dtype)
    want = torch.argmin(x, dim, keepdim)
    args = [T(x), NONE if dim is None else Int(dim), Bool(keepdim), out_like(want)]
    check(run_kernel("aten::argmin", "out", args, [3])[0], want)


# ---------------------------------------------------------------------------
# sort / topk


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int64, torch.int16, torch.bool], ids=ids)
@pytest.mark.parametrize("shape,dim", [((4, 7), -1), ((4, 7), 0), ((2, 3, 5), 1), ((9,), 0), ((), 0)])
@pytest.mark.parametrize("descending", [False, True])
def test_sort(dtype, shape, dim, descending):
    x = rand(shape, dtype)  # ties included: kiln's sort is stable, compared with torch's stable sort
    v, i = torch.sort(x, dim=dim, descending=descending, stable=True)
    got_v, got_i = run_kernel("aten::sort", "values", [T(x), Int(dim), Bool(descending), out_like(v), out_like(i)],
                              [3, 4])
    check(got_v, v)
    check(got_i, i)


@pytest.mark.parametrize("descending", [False, True])
def test_sort_nan(descending):
    x = torch.tensor([3.0, float("nan"), -1.0, float("inf"), float("nan"), 0.0])
    v, i = torch.sort(x, descending=descending, stable=True)
    got_v, got_i = run_kernel("aten::sort", "values", [T(x), Int(0), Bool(descending), out_like(v), out_like(i)],
                              [3, 4])
    check(got_v, v)
    check(got_i, i)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int32], ids=ids)
@pytest.mark.parametrize("shape,dim,k", [((4, 9), -1, 3), ((4, 9), 0, 2), ((2, 6, 3), 1, 6), ((5,), 0, 0),
                                         ((5,), 0, 1)])
@pytest.mark.parametrize("largest", [True, False])
def test_topk(dtype, shape, dim, k, largest):
    x = distinct(shape, dtype)
    v, i = torch.topk(x, k, dim, largest, True)
    args = [T(x), Int(k), Int(dim), Bool(largest), Bool(True), out_like(v), out_like(i)]
    got_v, got_i = run_kernel("aten::topk", "values", args, [5, 6])
    check(got_v, v)
    check(got_i, i)


def test_topk_k_too_large_fails():
    x = torch.zeros(4)
    expect_error("aten::topk", "values", [T(x), Int(5), Int(0), Bool(True), Bool(True), T(torch.zeros(5)),
                                          T(torch.zeros(5, dtype=torch.int64))])


# ---------------------------------------------------------------------------
# scatter


def unique_index(shape, dim, size, seed=0):
    """An index along `dim` with distinct targets in each line (assignment order does not matter)."""
    g = torch.Generator().manual_seed(seed)
    lines = torch.stack([torch.randperm(size, generator=g)[: shape[dim]] for _ in range(torch.Size(shape).numel()
                                                                                       // shape[dim])])
    moved = list(shape[:dim]) + list(shape[dim + 1:]) + [shape[dim]]
    return lines.reshape(moved).movedim(-1, dim).contiguous()


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool], ids=ids)
@pytest.mark.parametrize("shape,ishape,dim", [((4, 5), (3, 5), 0), ((4, 5), (4, 2), 1), ((3, 4, 5), (2, 3, 4), 2)])
def test_scatter_src_and_value(dtype, shape, ishape, dim):
    x = rand(shape, dtype)
    index = unique_index(ishape, dim, shape[dim])
    src = rand(shape, dtype, seed=2)
    want = torch.scatter(x, dim, index, src)
    check(run_kernel("aten::scatter", "src_out", [T(x), Int(dim), T(index), T(src), out_like(want)], [4])[0], want)
    value = True if dtype == torch.bool else 3
    want = torch.scatter(x, dim, index, value)
    got = run_kernel("aten::scatter", "value_out", [T(x), Int(dim), T(index), Bool(value) if dtype == torch.bool
                                                    else Int(value), out_like(want)], [4])[0]
    check(got, want)


@pytest.mark.parametrize("dtype", [torch.float64, torch.int32], ids=ids)
@pytest.mark.parametrize("dim", [0, 1])
def test_scatter_add(dtype, dim):
    x = rand((4, 5), dtype)
    index = torch.randint(0, x.shape[dim], (6, 5) if dim == 0 else (4, 7), generator=torch.Generator().manual_seed(1))
    index = index[:4] if dim == 0 else index[:, :5]  # repeated targets, accumulated
    src = rand((6, 7), dtype, seed=3)
    want = torch.scatter_add(x, dim, index, src)
    check(run_kernel("aten::scatter_add", "out", [T(x), Int(dim), T(index), T(src), out_like(want)], [4])[0], want)


@pytest.mark.parametrize("reduce", ["sum", "prod", "amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False])
def test_scatter_reduce(reduce, include_self):
    x = rand((4, 5), torch.float64)
    index = torch.randint(0, 4, (3, 5), generator=torch.Generator().manual_seed(5))
    src = rand((3, 5), torch.float64, seed=6)
    want = torch.scatter_reduce(x, 0, index, src, reduce, include_self=include_self)
    args = [T(x), Int(0), T(index), T(src), Str(reduce), Bool(include_self), out_like(want)]
    got = run_kernel("aten::scatter_reduce", "two_out", args, [6])[0]
    assert torch.allclose(got, want, rtol=1e-12, atol=0), (got, want)


@pytest.mark.parametrize("index", [torch.tensor([[4]]), torch.tensor([[-1]]), torch.zeros(1, 1, dtype=torch.int16)])
def test_scatter_errors(index):
    x = torch.zeros(4, 5)
    expect_error("aten::scatter", "src_out", [T(x), Int(0), T(index), T(torch.ones(4, 5)), T(torch.zeros(4, 5))])


# ---------------------------------------------------------------------------
# remainder / fmod / clamp.Tensor


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64, torch.int8], ids=ids)
@pytest.mark.parametrize("fn,op", [(torch.remainder, "aten::remainder"), (torch.fmod, "aten::fmod")])
def test_remainder_fmod(dtype, fn, op):
    a = rand((3, 4), dtype) * 3
    b = rand((4,), dtype, seed=1)
    if not dtype.is_floating_point:
        b = torch.where(b == 0, torch.ones_like(b), b)
    want = fn(a, b)
    got = run_kernel(op, "Tensor_out", [T(a), T(b), out_like(want)], [2])[0]
    if dtype.is_floating_point:
        assert torch.allclose(got, want, rtol=1e-6, atol=1e-6), (got, want)
    else:
        check(got, want)
    for s in (3, -2):
        want = fn(a, s)
        got = run_kernel(op, "Scalar_out", [T(a), Int(s), out_like(want)], [2])[0]
        if dtype.is_floating_point:
            assert torch.allclose(got, want, rtol=1e-6, atol=1e-6), (got, want)
        else:
            check(got, want)


def test_remainder_int_by_zero_fails():
    a = torch.tensor([1, 2])
    expect_error("aten::remainder", "Tensor_out", [T(a), T(torch.tensor([1, 0])), T(torch.zeros(2, dtype=torch.int64))])


@pytest.mark.parametrize("dtype", [torch.float32, torch.int32], ids=ids)
@pytest.mark.parametrize("which", ["both", "min", "max"])
def test_clamp_tensor(dtype, which):
    x = rand((3, 4), dtype) * 2
    lo = rand((4,), dtype, seed=1) - 1 if which != "max" else None
    hi = rand((3, 1), dtype, seed=2) + 1 if which != "min" else None
    want = torch.clamp(x, lo, hi)
    args = [T(x), NONE if lo is None else T(lo), NONE if hi is None else T(hi), out_like(want)]
    check(run_kernel("aten::clamp", "Tensor_out", args, [3])[0], want)


# ---------------------------------------------------------------------------
# roll / unfold_copy / bucketize


@pytest.mark.parametrize("dtype", [torch.float32, torch.int8], ids=ids)
@pytest.mark.parametrize("shifts,dims", [((2,), (0,)), ((-1, 3), (1, 0)), ((5,), ()), ((1, 1), (1, 1)), ((7,), (-1,))])
def test_roll(dtype, shifts, dims):
    x = distinct((3, 4), dtype)
    want = torch.roll(x, shifts, dims)
    check(run_kernel("aten::roll", "out", [T(x), Ints(shifts), Ints(dims), out_like(want)], [3])[0], want)


@pytest.mark.parametrize("shape,dim,size,step", [((10,), 0, 3, 2), ((3, 8), 1, 4, 1), ((6, 2), 0, 2, 3),
                                                 ((2, 5, 3), 1, 5, 5), ((4,), 0, 0, 1)])
def test_unfold_copy(shape, dim, size, step):
    x = distinct(shape, torch.float32)
    want = x.unfold(dim, size, step).contiguous()
    args = [T(x), Int(dim), Int(size), Int(step), out_like(want)]
    check(run_kernel("aten::unfold_copy", "out", args, [4])[0], want)


@pytest.mark.parametrize("right", [False, True])
@pytest.mark.parametrize("out_int32", [False, True])
def test_bucketize(right, out_int32):
    b = torch.tensor([-1.0, 0.0, 0.5, 2.0])
    x = torch.tensor([[-3.0, -1.0, 0.0, 0.25], [0.5, 1.0, 2.0, 9.0]])
    want = torch.bucketize(x, b, out_int32=out_int32, right=right)
    args = [T(x), T(b), Bool(out_int32), Bool(right), out_like(want)]
    check(run_kernel("aten::bucketize", "Tensor_out", args, [4])[0], want)
