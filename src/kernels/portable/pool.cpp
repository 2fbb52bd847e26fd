// 2-D pooling: max_pool2d_with_indices.out, avg_pool2d.out, _adaptive_avg_pool2d.out, over [N, C, H, W] or
// [C, H, W] (planes are independent). float32 (float16 / bfloat16 widened); max and average pooling also of
// integer tensors, as torch's CPU kernels compute them (an integer average: the window's sum in int64, divided
// by the count with truncation).
#include "util/register.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

namespace kiln::rt::kernels {
namespace {

struct Pool2d {
  int64_t planes = 1, ih = 0, iw = 0, oh = 0, ow = 0;
  int64_t kh = 1, kw = 1, sh = 1, sw = 1, ph = 0, pw = 0, dh = 1, dw = 1;
};

// an int[2] argument: one value for both dims, or two; `empty_as` when empty (stride=[]: the kernel)
bool pair(KernelContext& ctx, const char* name, const char* what, IntArrayRef v, const int64_t* empty_as,
          int64_t* a, int64_t* b) {
  if (v.empty() && empty_as != nullptr) {
    *a = empty_as[0];
    *b = empty_as[1];
    return true;
  }
  if (v.size() != 1 && v.size() != 2) {
    ctx.fail(Status::InvalidArgument, "%s: %s must have 1 or 2 entries, got %zu", name, what, v.size());
    return false;
  }
  *a = v[0];
  *b = v[v.size() - 1];
  return true;
}

// torch's pooling output size (pooling_output_shape); 0 when the arithmetic overflows int64 (the
// arguments come from the file: the caller then refuses an empty output)
int64_t pooled_size(int64_t in, int64_t k, int64_t pad, int64_t stride, int64_t dil, bool ceil_mode) {
  int64_t span, t;
  if (__builtin_mul_overflow(pad, 2, &span) || __builtin_add_overflow(span, in, &span) ||
      __builtin_mul_overflow(dil, k - 1, &t) || __builtin_sub_overflow(span, t, &span) ||
      __builtin_sub_overflow(span, 1, &span) || __builtin_add_overflow(span, ceil_mode ? stride - 1 : 0, &span))
    return 0;
  // A negative span gives floor(span / stride) + 1 <= 0 outputs: empty, which the caller refuses (computing it
  // exactly overflowed for a span near INT64_MIN and a large stride: found by fuzz_pte).
  if (span < 0) return 0;
  int64_t out;
  if (__builtin_add_overflow(span / stride, 1, &out)) return 0;
  int64_t end;
  if (__builtin_add_overflow(in, pad, &end)) return 0;
  if (ceil_mode && (out - 1) * stride >= end) --out;  // (out - 1) * stride <= span: no overflow
  return out;
}

bool setup(KernelContext& ctx, const char* name, const Tensor& self, IntArrayRef kernel_size, IntArrayRef stride,
           IntArrayRef padding, IntArrayRef dilation, bool ceil_mode, Tensor& out, Pool2d& p, int64_t* shape) {
  if (!in_set(self.dtype, kFloatTypes | kIntTypes)) {
    ctx.fail(Status::NotSupported, "%s: float32, float64 and integer tensors are supported, got %s", name,
             dtype_str(self.dtype));
    return false;
  }
  if (!check_out_dtype(ctx, out, self.dtype, name)) return false;
  if (self.dim != 3 && self.dim != 4) {
    ctx.fail(Status::InvalidArgument, "%s: input must have rank 3 or 4, got %d", name, self.dim);
    return false;
  }
  int64_t k[2];
  if (!pair(ctx, name, "kernel_size", kernel_size, nullptr, &p.kh, &p.kw)) return false;
  k[0] = p.kh;
  k[1] = p.kw;
  const int64_t one[2] = {1, 1}, zero[2] = {0, 0};
  if (!pair(ctx, name, "stride", stride, k, &p.sh, &p.sw) || !pair(ctx, name, "padding", padding, zero, &p.ph, &p.pw) ||
      !pair(ctx, name, "dilation", dilation, one, &p.dh, &p.dw))
    return false;
  if (p.kh < 1 || p.kw < 1 || p.sh < 1 || p.sw < 1 || p.dh < 1 || p.dw < 1 || p.ph < 0 || p.pw < 0 ||
      p.ph > p.kh / 2 || p.pw > p.kw / 2) {
    ctx.fail(Status::InvalidArgument, "%s: kernel, stride and dilation must be positive and padding at most half the kernel",
             name);
    return false;
  }
  p.ih = self.sizes[self.dim - 2];
  p.iw = self.sizes[self.dim - 1];
  p.planes = self.numel / std::max<int64_t>(1, p.ih * p.iw);
  p.oh = pooled_size(p.ih, p.kh, p.ph, p.sh, p.dh, ceil_mode);
  p.ow = pooled_size(p.iw, p.kw, p.pw, p.sw, p.dw, ceil_mode);
  if (p.oh < 1 || p.ow < 1) {
    ctx.fail(Status::InvalidArgument, "%s: the output would be empty", name);
    return false;
  }
  for (int32_t d = 0; d < self.dim - 2; ++d) shape[d] = self.sizes[d];
  shape[self.dim - 2] = p.oh;
  shape[self.dim - 1] = p.ow;
  return resize_out(ctx, out, {shape, static_cast<size_t>(self.dim)}, name);
}

// The first tap k >= 0 of a window starting at `base` (stride `dil` between taps) that is at or after 0, and
// one past the last that is before `size`: base + k * dil in [0, size). Divisions only, no overflow.
int64_t taps_begin(int64_t base, int64_t dil) { return base >= 0 ? 0 : -base / dil + (-base % dil != 0); }
int64_t taps_end(int64_t base, int64_t dil, int64_t size) { return base >= size ? 0 : (size - 1 - base) / dil + 1; }

void max_pool2d_with_indices_out(KernelContext& ctx, const Tensor& self, IntArrayRef kernel_size, IntArrayRef stride,
                                 IntArrayRef padding, IntArrayRef dilation, bool ceil_mode, Tensor& out,
                                 Tensor& indices) {
  const char* name = "aten::max_pool2d_with_indices.out";
  Pool2d p;
  int64_t shape[4];
  if (!setup(ctx, name, self, kernel_size, stride, padding, dilation, ceil_mode, out, p, shape)) return;
  if (indices.dtype != ScalarType::Long) {
    ctx.fail(Status::InvalidArgument, "%s: indices must be int64, got %s", name, dtype_str(indices.dtype));
    return;
  }
  if (!resize_out(ctx, indices, {shape, static_cast<size_t>(self.dim)}, name)) return;
  dispatch<kFloatTypes | kIntTypes>(self.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* x = self.data_as<const T>();
    T* y = out.data_as<T>();
    int64_t* idx = indices.data_as<int64_t>();
    for (int64_t c = 0; c < p.planes; ++c) {
      const T* xp = x + c * p.ih * p.iw;
      for (int64_t oy = 0; oy < p.oh; ++oy) {
        for (int64_t ox = 0; ox < p.ow; ++ox) {
          T best{};
          int64_t at = -1;
          // Only the window's taps inside the input: a kernel of 2^62 taps over a 4x4 input must not loop over
          // every tap (a file's arguments; found by fuzz_pte as a timeout).
          const int64_t by = oy * p.sh - p.ph, bx = ox * p.sw - p.pw;
          const int64_t ky1 = std::min(p.kh, taps_end(by, p.dh, p.ih)), kx1 = std::min(p.kw, taps_end(bx, p.dw, p.iw));
          for (int64_t ky = taps_begin(by, p.dh); ky < ky1; ++ky) {
            const int64_t iy = by + ky * p.dh;
            for (int64_t kx = taps_begin(bx, p.dw); kx < kx1; ++kx) {
              const int64_t ix = bx + kx * p.dw;
              const T v = xp[iy * p.iw + ix];
              bool nan = false;
              if constexpr (std::is_floating_point_v<T>) nan = std::isnan(v);
              if (at < 0 || v > best || nan) {
                best = v;
                at = iy * p.iw + ix;
              }
            }
          }
          const int64_t o = (c * p.oh + oy) * p.ow + ox;
          y[o] = best;
          idx[o] = at;
        }
      }
    }
  });
}

void avg_pool2d_out(KernelContext& ctx, const Tensor& self, IntArrayRef kernel_size, IntArrayRef stride,
                    IntArrayRef padding, bool ceil_mode, bool count_include_pad, std::optional<int64_t> divisor_override,
                    Tensor& out) {
  const char* name = "aten::avg_pool2d.out";
  Pool2d p;
  int64_t shape[4];
  const int64_t one[1] = {1};
  if (!setup(ctx, name, self, kernel_size, stride, padding, IntArrayRef(one, 1), ceil_mode, out, p, shape)) return;
  if (divisor_override && *divisor_override == 0) {
    ctx.fail(Status::InvalidArgument, "%s: divisor must be not zero", name);
    return;
  }
  dispatch<kFloatTypes | kIntTypes>(self.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using Acc = std::conditional_t<std::is_floating_point_v<T>, T, int64_t>;  // eager's: float, double, int64
    const T* x = self.data_as<const T>();
    T* y = out.data_as<T>();
    for (int64_t c = 0; c < p.planes; ++c) {
      const T* xp = x + c * p.ih * p.iw;
      for (int64_t oy = 0; oy < p.oh; ++oy) {
        int64_t y0 = oy * p.sh - p.ph, y1 = std::min(y0 + p.kh, p.ih + p.ph);
        const int64_t span_y = y1 - y0;
        y0 = std::max<int64_t>(y0, 0);
        y1 = std::min(y1, p.ih);
        for (int64_t ox = 0; ox < p.ow; ++ox) {
          int64_t x0 = ox * p.sw - p.pw, x1 = std::min(x0 + p.kw, p.iw + p.pw);
          const int64_t pool = span_y * (x1 - x0);
          x0 = std::max<int64_t>(x0, 0);
          x1 = std::min(x1, p.iw);
          Acc sum = 0;
          for (int64_t iy = y0; iy < y1; ++iy)
            for (int64_t ix = x0; ix < x1; ++ix) {
              if constexpr (std::is_floating_point_v<T>)
                sum += xp[iy * p.iw + ix];
              else  // wrapping, as torch's int64 sum (no signed overflow)
                sum = static_cast<int64_t>(static_cast<uint64_t>(sum) +
                                           static_cast<uint64_t>(static_cast<int64_t>(xp[iy * p.iw + ix])));
            }
          int64_t div = divisor_override ? *divisor_override : count_include_pad ? pool : (y1 - y0) * (x1 - x0);
          T& o = y[(c * p.oh + oy) * p.ow + ox];
          if constexpr (std::is_floating_point_v<T>)
            o = div == 0 ? T(0) : static_cast<T>(sum / static_cast<Acc>(div));
          else if (div == 0 || (div == -1 && sum == std::numeric_limits<int64_t>::min()))
            o = T(0);  // INT64_MIN / -1 would trap (the sums wrap as torch's int64 sums do)
          else
            o = static_cast<T>(sum / div);
        }
      }
    }
  });
}

void adaptive_avg_pool2d_out(KernelContext& ctx, const Tensor& self, IntArrayRef output_size, Tensor& out) {
  const char* name = "aten::_adaptive_avg_pool2d.out";
  if (!in_set(self.dtype, kFloatTypes)) {
    ctx.fail(Status::NotSupported, "%s: only float32 and float64 are supported, got %s", name, dtype_str(self.dtype));
    return;
  }
  if (!check_out_dtype(ctx, out, self.dtype, name)) return;
  if ((self.dim != 3 && self.dim != 4) || output_size.size() != 2 || output_size[0] < 1 || output_size[1] < 1) {
    ctx.fail(Status::InvalidArgument, "%s: expected a rank 3 or 4 input and two positive output sizes", name);
    return;
  }
  const int64_t ih = self.sizes[self.dim - 2], iw = self.sizes[self.dim - 1];
  const int64_t oh = output_size[0], ow = output_size[1];
  const int64_t planes = self.numel / std::max<int64_t>(1, ih * iw);
  int64_t shape[4];
  for (int32_t d = 0; d < self.dim - 2; ++d) shape[d] = self.sizes[d];
  shape[self.dim - 2] = oh;
  shape[self.dim - 1] = ow;
  if (!resize_out(ctx, out, {shape, static_cast<size_t>(self.dim)}, name)) return;
  dispatch<kFloatTypes>(self.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* x = self.data_as<const T>();
    T* y = out.data_as<T>();
    for (int64_t c = 0; c < planes; ++c) {
      const T* xp = x + c * ih * iw;
      for (int64_t oy = 0; oy < oh; ++oy) {
        const int64_t y0 = oy * ih / oh, y1 = ((oy + 1) * ih + oh - 1) / oh;
        for (int64_t ox = 0; ox < ow; ++ox) {
          const int64_t x0 = ox * iw / ow, x1 = ((ox + 1) * iw + ow - 1) / ow;
          T sum = 0;
          for (int64_t iy = y0; iy < y1; ++iy)
            for (int64_t ix = x0; ix < x1; ++ix) sum += xp[iy * iw + ix];
          y[(c * oh + oy) * ow + ox] = sum / static_cast<T>((y1 - y0) * (x1 - x0));
        }
      }
    }
  });
}

}  // namespace

KILN_KERNEL_WIDENS_16_BIT(max_pool2d_with_indices_out, max_pool2d_with_indices_out);
KILN_KERNEL_WIDENS_16_BIT(avg_pool2d_out, avg_pool2d_out);
KILN_KERNEL_WIDENS_16_BIT(_adaptive_avg_pool2d_out, adaptive_avg_pool2d_out);

}  // namespace kiln::rt::kernels
