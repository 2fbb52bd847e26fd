// grid_sampler_2d.out, float32 and float64: samples input [N, C, H, W] at the normalized (x, y) points of
// grid [N, Ho, Wo, 2] into out [N, C, Ho, Wo]. Interpolation 0 bilinear, 1 nearest, 2 bicubic;
// padding 0 zeros, 1 border, 2 reflection; align_corners maps -1/1 to the corner pixels' centres
// (otherwise to their outer edges). The coordinate rules are torch's (GridSampler.h).
#include "util/register.h"

#include <algorithm>
#include <cmath>

namespace kiln::rt::kernels {
namespace {

enum Interp : int64_t { kBilinear = 0, kNearest = 1, kBicubic = 2 };
enum Padding : int64_t { kZeros = 0, kBorder = 1, kReflection = 2 };

// [-1, 1] -> pixel coordinates
template <typename F>
F unnormalize(F c, int64_t size, bool align_corners) {
  const auto s = static_cast<F>(size);
  return align_corners ? (c + 1) / 2 * (s - 1) : ((c + 1) * s - 1) / 2;
}

template <typename F>
F clip(F c, int64_t size) { return std::min(static_cast<F>(size - 1), std::max(c, F(0))); }

// reflects c into [twice_low / 2, twice_high / 2]
template <typename F>
F reflect(F c, int64_t twice_low, int64_t twice_high) {
  if (twice_low == twice_high) return 0;
  const F lo = static_cast<F>(twice_low) / 2;
  const F span = static_cast<F>(twice_high - twice_low) / 2;
  c = std::fabs(c - lo);
  const F extra = std::fmod(c, span);
  const auto flips = static_cast<int64_t>(std::floor(c / span));
  return flips % 2 == 0 ? extra + lo : span - extra + lo;
}

// the padding's coordinate transform (zeros: none; the bounds check drops what falls outside)
template <typename F>
F pad_coordinate(F c, int64_t size, int64_t padding, bool align_corners) {
  if (padding == kBorder) return clip(c, size);
  if (padding == kReflection) {
    c = align_corners ? reflect(c, 0, 2 * (size - 1)) : reflect(c, -1, 2 * size - 1);
    return clip(c, size);
  }
  return c;
}

bool inside(int64_t y, int64_t x, int64_t h, int64_t w) { return y >= 0 && y < h && x >= 0 && x < w; }

// torch's cubic convolution coefficients, A = -0.75
template <typename F>
void cubic_coefficients(F t, F c[4]) {
  constexpr F A = F(-0.75);
  auto near = [](F x) { return ((A + 2) * x - (A + 3)) * x * x + 1; };
  auto far = [](F x) { return ((A * x - 5 * A) * x + 8 * A) * x - 4 * A; };
  c[0] = far(t + F(1));
  c[1] = near(t);
  c[2] = near(F(1) - t);
  c[3] = far(F(2) - t);
}

void grid_sampler_2d_out(KernelContext& ctx, const Tensor& input, const Tensor& grid, int64_t interpolation_mode,
                         int64_t padding_mode, bool align_corners, Tensor& out) {
  const char* name = "aten::grid_sampler_2d.out";
  if (!in_set(input.dtype, kFloatTypes) || grid.dtype != input.dtype) {
    ctx.fail(Status::NotSupported, "%s: float32 or float64 input and grid of one dtype are supported, got %s and %s", name,
             dtype_str(input.dtype), dtype_str(grid.dtype));
    return;
  }
  if (input.dim != 4 || grid.dim != 4 || grid.sizes[3] != 2 || grid.sizes[0] != input.sizes[0]) {
    ctx.fail(Status::InvalidArgument, "%s: expected input [N, C, H, W] and grid [N, Ho, Wo, 2]", name);
    return;
  }
  if (interpolation_mode < kBilinear || interpolation_mode > kBicubic || padding_mode < kZeros ||
      padding_mode > kReflection) {
    ctx.fail(Status::InvalidArgument, "%s: unknown interpolation mode %lld or padding mode %lld", name,
             static_cast<long long>(interpolation_mode), static_cast<long long>(padding_mode));
    return;
  }
  if (!check_out_dtype(ctx, out, input.dtype, name)) return;
  const int64_t N = input.sizes[0], C = input.sizes[1], H = input.sizes[2], W = input.sizes[3];
  const int64_t Ho = grid.sizes[1], Wo = grid.sizes[2];
  const int64_t shape[4] = {N, C, Ho, Wo};
  if (!resize_out(ctx, out, {shape, 4}, name)) return;
  dispatch<kFloatTypes>(input.dtype, [&](auto tag) {  // float64 computes its coordinates in double, as torch's
    using F = typename decltype(tag)::type;
    const F* x = input.data_as<const F>();
    const F* g = grid.data_as<const F>();
    F* y = out.data_as<F>();
    const int64_t plane = H * W, oplane = Ho * Wo;
    for (int64_t n = 0; n < N; ++n) {
      const F* xn = x + n * C * plane;
      F* yn = y + n * C * oplane;
      for (int64_t p = 0; p < oplane; ++p) {
        const F gx = g[(n * oplane + p) * 2], gy = g[(n * oplane + p) * 2 + 1];
        if (interpolation_mode == kBicubic) {
          // taps at floor - 1 .. floor + 2, each coordinate padded on its own
          const F ix = unnormalize(gx, W, align_corners), iy = unnormalize(gy, H, align_corners);
          const F fx = std::floor(ix), fy = std::floor(iy);
          F cx[4], cy[4];
          cubic_coefficients(ix - fx, cx);
          cubic_coefficients(iy - fy, cy);
          int64_t tx[4], ty[4];
          for (int64_t k = 0; k < 4; ++k) {
            tx[k] = static_cast<int64_t>(pad_coordinate(fx - 1 + static_cast<F>(k), W, padding_mode, align_corners));
            ty[k] = static_cast<int64_t>(pad_coordinate(fy - 1 + static_cast<F>(k), H, padding_mode, align_corners));
          }
          for (int64_t c = 0; c < C; ++c) {
            const F* xc = xn + c * plane;
            F acc = 0;
            for (int64_t j = 0; j < 4; ++j) {
              F row = 0;
              for (int64_t i = 0; i < 4; ++i)
                row += cx[i] * (inside(ty[j], tx[i], H, W) ? xc[ty[j] * W + tx[i]] : F(0));
              acc += cy[j] * row;
            }
            yn[c * oplane + p] = acc;
          }
          continue;
        }
        const F ix = pad_coordinate(unnormalize(gx, W, align_corners), W, padding_mode, align_corners);
        const F iy = pad_coordinate(unnormalize(gy, H, align_corners), H, padding_mode, align_corners);
        if (interpolation_mode == kNearest) {
          const auto nx = static_cast<int64_t>(std::nearbyint(ix)), ny = static_cast<int64_t>(std::nearbyint(iy));
          const bool in = inside(ny, nx, H, W);
          for (int64_t c = 0; c < C; ++c) yn[c * oplane + p] = in ? xn[c * plane + ny * W + nx] : F(0);
          continue;
        }
        // bilinear: the four neighbours, each dropped when outside
        const F fx = std::floor(ix), fy = std::floor(iy);
        const auto x0 = static_cast<int64_t>(fx), y0 = static_cast<int64_t>(fy);
        const F wx1 = ix - fx, wy1 = iy - fy, wx0 = 1 - wx1, wy0 = 1 - wy1;
        const int64_t xs[4] = {x0, x0 + 1, x0, x0 + 1}, ys[4] = {y0, y0, y0 + 1, y0 + 1};
        const F ws[4] = {wx0 * wy0, wx1 * wy0, wx0 * wy1, wx1 * wy1};
        bool ok[4];
        for (int k = 0; k < 4; ++k) ok[k] = inside(ys[k], xs[k], H, W);
        for (int64_t c = 0; c < C; ++c) {
          const F* xc = xn + c * plane;
          F acc = 0;
          for (int k = 0; k < 4; ++k)
            if (ok[k]) acc += ws[k] * xc[ys[k] * W + xs[k]];
          yn[c * oplane + p] = acc;
        }
      }
    }
  });
}

}  // namespace

KILN_KERNEL_WIDENS_16_BIT(grid_sampler_2d_out, grid_sampler_2d_out);

}  // namespace kiln::rt::kernels
