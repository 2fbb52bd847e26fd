"""kiln's grid_sampler_2d kernel against torch: every interpolation (bilinear, nearest, bicubic),
padding (zeros, border, reflection) and align_corners, with grid points inside, on and beyond the
edges, within the coverage sweep's float tolerance (1e-4 * max|ref| + 1e-5)."""
from __future__ import annotations

import itertools

import pytest
import torch

from kernel_harness import Bool, Int, T, out_like, run_kernel

aten = torch.ops.aten


@pytest.mark.parametrize("interp,padding,align", list(itertools.product((0, 1, 2), (0, 1, 2), (False, True))))
def test_grid_sampler_2d(interp, padding, align):
    g = torch.Generator().manual_seed(interp * 10 + padding * 2 + int(align))
    x = torch.randn(2, 3, 5, 7, generator=g)
    grid = torch.rand(2, 4, 6, 2, generator=g) * 3.0 - 1.5  # beyond [-1, 1] on every side
    grid[0, 0, :4] = torch.tensor([[-1.0, -1.0], [1.0, 1.0], [0.0, 0.0], [-1.0, 1.0]])
    want = aten.grid_sampler_2d(x, grid, interp, padding, align)
    got = run_kernel("aten::grid_sampler_2d", "out",
                     [T(x), T(grid), Int(interp), Int(padding), Bool(align), out_like(want)], [5])[0]
    assert got.shape == want.shape
    tol = 1e-4 * want.abs().max().item() + 1e-5
    assert (got - want).abs().max().item() <= tol, (got - want).abs().max().item()


def _sixteen_bit_cases(x, exact=False):
    """(op, overload, args builder, torch result) of the float32 kernels that also take float16 / bfloat16;
    `exact`: torch's results of the same (16-bit) values in float64."""
    from kernel_harness import NONE, Double, Ints

    a = torch.ops.aten
    c = x.shape[1]
    w, b = torch.linspace(0.5, 1.5, c).to(x.dtype), torch.linspace(-0.2, 0.3, c).to(x.dtype)
    mean, var = torch.linspace(-0.1, 0.1, c).to(x.dtype), torch.linspace(0.5, 2.0, c).to(x.dtype)
    n, hw = x.shape[0], x.shape[2] * x.shape[3]
    grid = (torch.linspace(-1.2, 1.2, n * 5 * 4 * 2).reshape(n, 5, 4, 2) * torch.tensor([1.0, -0.7])).to(x.dtype)
    if exact:
        x, w, b, mean, var, grid = (t.double() for t in (x, w, b, mean, var, grid))
    return [
        ("aten::avg_pool2d", "out", lambda o: [T(x), Ints([3, 2]), Ints([2, 1]), Ints([1, 0]), Bool(True), Bool(False),
                                               NONE, *o], [a.avg_pool2d(x, [3, 2], [2, 1], [1, 0], True, False)]),
        ("aten::max_pool2d_with_indices", "out",
         lambda o: [T(x), Ints([2, 2]), Ints([2, 2]), Ints([0, 1]), Ints([1, 1]), Bool(False), *o],
         list(a.max_pool2d_with_indices(x, [2, 2], [2, 2], [0, 1], [1, 1], False))),
        ("aten::_adaptive_avg_pool2d", "out", lambda o: [T(x), Ints([3, 2]), *o], [a._adaptive_avg_pool2d(x, [3, 2])]),
        ("aten::upsample_bilinear2d", "vec_out", lambda o: [T(x), Ints([11, 5]), Bool(False), NONE, *o],
         [a.upsample_bilinear2d.vec(x, [11, 5], False, None)]),
        ("aten::reflection_pad2d", "out", lambda o: [T(x), Ints([1, 2, 2, 1]), *o], [a.reflection_pad2d(x, [1, 2, 2, 1])]),
        ("aten::native_group_norm", "out", lambda o: [T(x), T(w), T(b), Int(n), Int(c), Int(hw), Int(2), Double(1e-5), *o],
         list(a.native_group_norm(x, w, b, n, c, hw, 2, 1e-5))),
        ("aten::_native_batch_norm_legit_no_training", "out",
         lambda o: [T(x), T(w), T(b), T(mean), T(var), Double(0.1), Double(1e-5), *o],
         list(a._native_batch_norm_legit_no_training(x, w, b, mean, var, 0.1, 1e-5))),
        ("aten::grid_sampler_2d", "out", lambda o: [T(x), T(grid), Int(0), Int(1), Bool(False), *o],
         [a.grid_sampler_2d(x, grid, 0, 1, False)]),
    ]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("case", range(8), ids=["avg_pool2d", "max_pool2d", "adaptive_avg_pool2d", "upsample_bilinear2d",
                                                "reflection_pad2d", "group_norm", "batch_norm_no_training",
                                                "grid_sampler_2d"])
def test_float32_kernels_take_16_bit_tensors(dtype, case):
    """Pooling, interpolation, grid sampling, padding and batch/group norm of float16 / bfloat16 tensors (ExecuTorch's portable
    programs of 16-bit CNNs): kiln runs its float32 kernel on widened copies and rounds each out once; against
    torch's CPU kernel of that dtype (float32 arithmetic inside too): outs of the same dtype and shape, within
    two roundings of max|out| (exact for max pooling, whose indices are equal too); where torch's own 16-bit
    kernel rounds inside (grid sampling computes its coordinates in float16), within two roundings of torch's
    float64 result of the same values instead."""
    gen = torch.Generator().manual_seed(case)
    x = (torch.rand(2, 4, 9, 7, generator=gen) * 6 - 3).to(dtype)
    op, overload, build, want = _sixteen_bit_cases(x)[case]
    exact = _sixteen_bit_cases(x, exact=True)[case][3]
    outs = [out_like(t) for t in want]
    args = build(outs)
    got = run_kernel(op, overload, args, list(range(len(args) - len(outs), len(args))))
    ulp = {torch.float16: 2.0 ** -10, torch.bfloat16: 2.0 ** -7}[dtype]
    for g, w, x64 in zip(got, want, exact, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape, (g.dtype, w.dtype, g.shape, w.shape)
        if not w.is_floating_point() or op == "aten::max_pool2d_with_indices" or w.numel() == 0:
            assert torch.equal(g, w)
            continue
        scale = max(float(w.float().abs().max()), 1e-3)
        err = float((g.float() - w.float()).abs().max())
        err64 = float((g.double() - x64).abs().max())
        assert err <= 2 * ulp * scale or (op == "aten::grid_sampler_2d" and err64 <= 2 * ulp * scale), (op, err, err64)
