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
