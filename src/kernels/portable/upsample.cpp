// Resizing and spatial padding, float32 and float64 (float16/bfloat16 widened; nearest resizing and the pads any
// dtype): upsample_nearest2d.vec_out,
// upsample_bilinear2d.vec_out (align_corners both ways), pixel_shuffle.out,
// reflection_pad{1,2}d.out, replication_pad{1,2}d.out. Source indices follow
// torch's CPU kernels (area_pixel_compute_scale / source_index).
#include "util/register.h"

#include <algorithm>
#include <cmath>

namespace kiln::rt::kernels {
namespace {

// float32 / float64 input and out of one dtype (any dtype with any_dtype: nearest resizing only copies)
bool float_io(KernelContext& ctx, const char* name, const Tensor& self, const Tensor& out, int32_t min_rank,
              bool any_dtype = false) {
  if (any_dtype ? !is_supported_dtype(self.dtype) : !in_set(self.dtype, kFloatTypes)) {
    ctx.fail(Status::NotSupported, "%s: dtype %s is not supported", name, dtype_str(self.dtype));
    return false;
  }
  if (self.dim < min_rank) {
    ctx.fail(Status::InvalidArgument, "%s: input must have rank >= %d, got %d", name, min_rank, self.dim);
    return false;
  }
  return check_out_dtype(ctx, out, self.dtype, name);
}

// The output size and the per-dim scale torch passes down (scale factor given, or none: 0).
bool upsample_sizes(KernelContext& ctx, const char* name, const Tensor& in, std::optional<IntArrayRef> output_size,
                    std::optional<FloatArrayRef> scale_factors, int64_t* oh, int64_t* ow, double* sh, double* sw) {
  const int64_t ih = in.sizes[in.dim - 2], iw = in.sizes[in.dim - 1];
  *sh = *sw = 0.0;
  if (output_size && !output_size->empty()) {
    if (output_size->size() != 2) {
      ctx.fail(Status::InvalidArgument, "%s: output_size must have 2 entries", name);
      return false;
    }
    *oh = (*output_size)[0];
    *ow = (*output_size)[1];
  } else if (scale_factors && scale_factors->size() == 2) {
    *sh = (*scale_factors)[0];
    *sw = (*scale_factors)[1];
    *oh = static_cast<int64_t>(std::floor(static_cast<double>(ih) * *sh));
    *ow = static_cast<int64_t>(std::floor(static_cast<double>(iw) * *sw));
  } else {
    ctx.fail(Status::InvalidArgument, "%s: either output_size or two scale_factors must be given", name);
    return false;
  }
  if (*oh < 1 || *ow < 1) {
    ctx.fail(Status::InvalidArgument, "%s: the output would be empty", name);
    return false;
  }
  return true;
}

// in/out, or 1/scale when a scale factor was given (torch's compute_scales_value), in the type torch computes it
// in: float for float32 data and for every nearest index, double for float64's linear weights
template <typename F = float>
F scale_of(int64_t in, int64_t out, double scale, bool align_corners) {
  if (align_corners) return out > 1 ? static_cast<F>(in - 1) / static_cast<F>(out - 1) : F(0);
  return scale > 0 ? static_cast<F>(1.0 / scale) : static_cast<F>(in) / static_cast<F>(out);
}

bool resize_spatial(KernelContext& ctx, const char* name, const Tensor& in, Tensor& out, int64_t h, int64_t w) {
  int64_t shape[kMaxDims];
  for (int32_t d = 0; d < in.dim; ++d) shape[d] = in.sizes[d];
  shape[in.dim - 2] = h;
  shape[in.dim - 1] = w;
  return resize_out(ctx, out, {shape, static_cast<size_t>(in.dim)}, name);
}

// What both upsampling kernels start with: float input and out of rank >= 3, the output size (given, or
// the input's scaled), out resized; the input's spatial size, its count of [H, W] planes, the scale factors.
struct Upsample2d {
  int64_t oh, ow, ih, iw, planes;
  double sh, sw;  // the scale factors given (0: none)
};

bool upsample_setup(KernelContext& ctx, const char* name, const Tensor& input, std::optional<IntArrayRef> output_size,
                    std::optional<FloatArrayRef> scale_factors, Tensor& out, Upsample2d* u, bool any_dtype) {
  if (!float_io(ctx, name, input, out, 3, any_dtype)) return false;
  if (!upsample_sizes(ctx, name, input, output_size, scale_factors, &u->oh, &u->ow, &u->sh, &u->sw)) return false;
  if (!resize_spatial(ctx, name, input, out, u->oh, u->ow)) return false;
  u->ih = input.sizes[input.dim - 2];
  u->iw = input.sizes[input.dim - 1];
  u->planes = input.numel / std::max<int64_t>(1, u->ih * u->iw);
  return true;
}

void upsample_nearest2d_vec_out(KernelContext& ctx, const Tensor& input, std::optional<IntArrayRef> output_size,
                                std::optional<FloatArrayRef> scale_factors, Tensor& out) {
  Upsample2d u;
  if (!upsample_setup(ctx, "aten::upsample_nearest2d.vec_out", input, output_size, scale_factors, out, &u,
                      /*any_dtype=*/true))
    return;
  const int64_t oh = u.oh, ow = u.ow, ih = u.ih, iw = u.iw, planes = u.planes;
  const float fh = scale_of(ih, oh, u.sh, false), fw = scale_of(iw, ow, u.sw, false);
  dispatch(input.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* x = input.data_as<const T>();
    T* y = out.data_as<T>();
    for (int64_t c = 0; c < planes; ++c)
      for (int64_t oy = 0; oy < oh; ++oy) {
        const int64_t iy = std::min(static_cast<int64_t>(std::floor(static_cast<float>(oy) * fh)), ih - 1);
        const T* row = x + (c * ih + iy) * iw;
        T* dst = y + (c * oh + oy) * ow;
        for (int64_t ox = 0; ox < ow; ++ox)
          dst[ox] = row[std::min(static_cast<int64_t>(std::floor(static_cast<float>(ox) * fw)), iw - 1)];
      }
  });
}

template <typename F>
struct Lerp {
  int64_t i0, i1;
  F l0, l1;
};

template <typename F>
Lerp<F> lerp_of(int64_t o, int64_t in, F scale, bool align_corners) {
  F src = align_corners ? scale * static_cast<F>(o) : scale * (static_cast<F>(o) + F(0.5)) - F(0.5);
  if (src < 0) src = 0;
  const auto i0 = std::min(static_cast<int64_t>(src), in - 1);
  const int64_t i1 = i0 + (i0 < in - 1 ? 1 : 0);
  const F l1 = std::min(std::max(src - static_cast<F>(i0), F(0)), F(1));
  return {i0, i1, F(1) - l1, l1};
}

void upsample_bilinear2d_vec_out(KernelContext& ctx, const Tensor& input, std::optional<IntArrayRef> output_size,
                                 bool align_corners, std::optional<FloatArrayRef> scale_factors, Tensor& out) {
  Upsample2d u;
  if (!upsample_setup(ctx, "aten::upsample_bilinear2d.vec_out", input, output_size, scale_factors, out, &u, false))
    return;
  const int64_t oh = u.oh, ow = u.ow, ih = u.ih, iw = u.iw, planes = u.planes;
  dispatch<kFloatTypes>(input.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;  // float32 computes its weights in float, float64 in double
    const T fh = scale_of<T>(ih, oh, u.sh, align_corners), fw = scale_of<T>(iw, ow, u.sw, align_corners);
    const T* x = input.data_as<const T>();
    T* y = out.data_as<T>();
    for (int64_t c = 0; c < planes; ++c) {
      const T* xp = x + c * ih * iw;
      for (int64_t oy = 0; oy < oh; ++oy) {
        const Lerp<T> ly = lerp_of<T>(oy, ih, fh, align_corners);
        T* dst = y + (c * oh + oy) * ow;
        for (int64_t ox = 0; ox < ow; ++ox) {
          const Lerp<T> lx = lerp_of<T>(ox, iw, fw, align_corners);
          dst[ox] = ly.l0 * (lx.l0 * xp[ly.i0 * iw + lx.i0] + lx.l1 * xp[ly.i0 * iw + lx.i1]) +
                    ly.l1 * (lx.l0 * xp[ly.i1 * iw + lx.i0] + lx.l1 * xp[ly.i1 * iw + lx.i1]);
        }
      }
    }
  });
}

void pixel_shuffle_out(KernelContext& ctx, const Tensor& self, int64_t r, Tensor& out) {
  const char* name = "aten::pixel_shuffle.out";
  if (!float_io(ctx, name, self, out, 3)) return;
  const int64_t c = self.sizes[self.dim - 3], h = self.sizes[self.dim - 2], w = self.sizes[self.dim - 1];
  if (r < 1 || c % (r * r) != 0) {
    ctx.fail(Status::InvalidArgument, "%s: %lld channels are not divisible by upscale_factor^2 (%lld)", name,
             static_cast<long long>(c), static_cast<long long>(r * r));
    return;
  }
  int64_t shape[kMaxDims];
  for (int32_t d = 0; d < self.dim; ++d) shape[d] = self.sizes[d];
  const int64_t oc = c / (r * r);
  shape[self.dim - 3] = oc;
  shape[self.dim - 2] = h * r;
  shape[self.dim - 1] = w * r;
  if (!resize_out(ctx, out, {shape, static_cast<size_t>(self.dim)}, name)) return;
  const int64_t batch = self.numel / std::max<int64_t>(1, c * h * w);
  dispatch<kFloatTypes>(self.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* x = self.data_as<const T>();
    T* y = out.data_as<T>();
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t o = 0; o < oc; ++o)
        for (int64_t yy = 0; yy < h * r; ++yy)
          for (int64_t xx = 0; xx < w * r; ++xx) {
            const int64_t ci = o * r * r + (yy % r) * r + (xx % r);
            y[((b * oc + o) * h * r + yy) * w * r + xx] = x[((b * c + ci) * h + yy / r) * w + xx / r];
          }
  });
}

enum class PadMode { Reflect, Replicate };

// Pads the last `nd` (1 or 2) dims; padding is (left, right[, top, bottom]) as torch gives it.
void pad_out(KernelContext& ctx, const char* name, PadMode mode, int32_t nd, const Tensor& self, IntArrayRef padding,
             Tensor& out) {
  // a copy of elements: any dtype (float16 / bfloat16 come widened, register below)
  if (self.dim < nd + 1) {
    ctx.fail(Status::InvalidArgument, "%s: input must have rank >= %d, got %d", name, nd + 1, self.dim);
    return;
  }
  if (!is_supported_dtype(self.dtype)) {
    ctx.fail(Status::NotSupported, "%s: dtype %s is not supported", name, dtype_str(self.dtype));
    return;
  }
  if (!check_out_dtype(ctx, out, self.dtype, name)) return;
  if (static_cast<int32_t>(padding.size()) != 2 * nd) {
    ctx.fail(Status::InvalidArgument, "%s: padding must have %d entries, got %zu", name, 2 * nd, padding.size());
    return;
  }
  const int64_t iw = self.sizes[self.dim - 1], ih = nd == 2 ? self.sizes[self.dim - 2] : 1;
  const int64_t pl = padding[0], pr = padding[1], pt = nd == 2 ? padding[2] : 0, pb = nd == 2 ? padding[3] : 0;
  if (mode == PadMode::Reflect && (pl >= iw || pr >= iw || pt >= ih || pb >= ih || pl < 0 || pr < 0 || pt < 0 || pb < 0)) {
    ctx.fail(Status::InvalidArgument, "%s: padding must be non-negative and smaller than the input size", name);
    return;
  }
  const int64_t ow = iw + pl + pr, oh = ih + pt + pb;
  if (ow < 1 || oh < 1) {
    ctx.fail(Status::InvalidArgument, "%s: the output would be empty", name);
    return;
  }
  int64_t shape[kMaxDims];
  for (int32_t d = 0; d < self.dim; ++d) shape[d] = self.sizes[d];
  shape[self.dim - 1] = ow;
  if (nd == 2) shape[self.dim - 2] = oh;
  if (!resize_out(ctx, out, {shape, static_cast<size_t>(self.dim)}, name)) return;
  auto src = [mode](int64_t i, int64_t n) {
    if (mode == PadMode::Replicate) return std::min(std::max<int64_t>(i, 0), n - 1);
    if (i < 0) return -i;
    if (i >= n) return 2 * (n - 1) - i;
    return i;
  };
  const int64_t planes = self.numel / std::max<int64_t>(1, ih * iw);
  dispatch(self.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* x = self.data_as<const T>();
    T* y = out.data_as<T>();
    for (int64_t c = 0; c < planes; ++c)
      for (int64_t oy = 0; oy < oh; ++oy) {
        const T* row = x + (c * ih + src(oy - pt, ih)) * iw;
        T* dst = y + (c * oh + oy) * ow;
        for (int64_t ox = 0; ox < ow; ++ox) dst[ox] = row[src(ox - pl, iw)];
      }
  });
}

void reflection_pad1d_out(KernelContext& ctx, const Tensor& self, IntArrayRef padding, Tensor& out) {
  pad_out(ctx, "aten::reflection_pad1d.out", PadMode::Reflect, 1, self, padding, out);
}
void reflection_pad2d_out(KernelContext& ctx, const Tensor& self, IntArrayRef padding, Tensor& out) {
  pad_out(ctx, "aten::reflection_pad2d.out", PadMode::Reflect, 2, self, padding, out);
}
void replication_pad1d_out(KernelContext& ctx, const Tensor& self, IntArrayRef padding, Tensor& out) {
  pad_out(ctx, "aten::replication_pad1d.out", PadMode::Replicate, 1, self, padding, out);
}
void replication_pad2d_out(KernelContext& ctx, const Tensor& self, IntArrayRef padding, Tensor& out) {
  pad_out(ctx, "aten::replication_pad2d.out", PadMode::Replicate, 2, self, padding, out);
}

}  // namespace

KILN_KERNEL_WIDENS_16_BIT(upsample_nearest2d_vec_out, upsample_nearest2d_vec_out);
KILN_KERNEL_WIDENS_16_BIT(upsample_bilinear2d_vec_out, upsample_bilinear2d_vec_out);
KILN_KERNEL_WIDENS_16_BIT(pixel_shuffle_out, pixel_shuffle_out);
KILN_KERNEL_WIDENS_16_BIT(reflection_pad1d_out, reflection_pad1d_out);
KILN_KERNEL_WIDENS_16_BIT(reflection_pad2d_out, reflection_pad2d_out);
KILN_KERNEL_WIDENS_16_BIT(replication_pad1d_out, replication_pad1d_out);
KILN_KERNEL_WIDENS_16_BIT(replication_pad2d_out, replication_pad2d_out);

}  // namespace kiln::rt::kernels
