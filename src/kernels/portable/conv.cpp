// convolution.out: 1-D, 2-D and 3-D convolutions and transposed convolutions
// (groups, stride, padding, dilation, output_padding), float32 (float16 / bfloat16 widened; integer types and
// float64 by direct loops, below).
//
// Every case is a GEMM per (batch, group) through kiln::cpu::sgemm:
//   forward     out_g[OCg, P] = W_g[OCg, K] · col[K, P]        (K = Cg·kd·kh·kw, P output pixels)
//   transposed  colT[Pin, M] = x_gᵀ[Pin, Cg] · W_g[Cg, M], then scattered into out (M = OCg·kd·kh·kw)
// The im2col columns are built a block of pixels (and of K) at a time in a stack
// buffer, so the kernel allocates nothing; a 1x1 stride-1 unpadded convolution
// reads the input as its columns directly. Spatial ranks 1 and 2 run as rank 3
// with leading sizes of one.
#include "kiln/cpu/gemm.h"
#include "util/dtype.h"
#include "util/register.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <new>
#include <type_traits>

namespace kiln::rt::kernels {
namespace {

constexpr int64_t kColFloats = 16384;  // 64 KiB of columns per block (stack)

struct ConvGeom {
  int64_t n = 1, c = 1, oc = 1, groups = 1;
  int64_t in[3] = {1, 1, 1}, out[3] = {1, 1, 1}, k[3] = {1, 1, 1};
  int64_t stride[3] = {1, 1, 1}, pad[3] = {0, 0, 0}, dil[3] = {1, 1, 1}, opad[3] = {0, 0, 0};
  int64_t in_pixels() const { return in[0] * in[1] * in[2]; }
  int64_t out_pixels() const { return out[0] * out[1] * out[2]; }
  int64_t kernel_size() const { return k[0] * k[1] * k[2]; }
};

// One list argument of length `spatial` (or 1, repeated) into the geometry's last `spatial` slots.
bool spatial_list(KernelContext& ctx, const char* name, const char* what, IntArrayRef v, int64_t spatial,
                  int64_t dflt, int64_t (&dst)[3]) {
  if (v.size() != 1 && static_cast<int64_t>(v.size()) != spatial && !v.empty()) {
    ctx.fail(Status::InvalidArgument, "%s: %s has %zu entries for %lld spatial dims", name, what, v.size(),
             static_cast<long long>(spatial));
    return false;
  }
  for (int64_t d = 0; d < spatial; ++d) {
    int64_t x = v.empty() ? dflt : v[v.size() == 1 ? 0 : static_cast<size_t>(d)];
    dst[3 - spatial + d] = x;
  }
  return true;
}

// Forward convolution of one (batch, group): x_g [Cg, in pixels], w_g [OCg, K], y_g [OCg, out pixels].
void conv_group(const ConvGeom& g, const float* x, const float* w, float* y) {
  const int64_t cg = g.c / g.groups, ocg = g.oc / g.groups;
  const int64_t K = cg * g.kernel_size(), P = g.out_pixels();
  const bool pointwise = g.kernel_size() == 1 && g.stride[0] == 1 && g.stride[1] == 1 && g.stride[2] == 1 &&
                         g.pad[0] == 0 && g.pad[1] == 0 && g.pad[2] == 0;
  if (pointwise) {  // the input is the column matrix
    cpu::sgemm(ocg, P, K, 1.0f, w, K, x, P, false, y, P);
    return;
  }
  alignas(64) float col[kColFloats];
  const int64_t pc = std::min<int64_t>(P, std::max<int64_t>(64, kColFloats / std::max<int64_t>(K, 1)));
  const int64_t kc = std::max<int64_t>(1, std::min<int64_t>(K, kColFloats / pc));
  const int64_t kvol = g.kernel_size();
  for (int64_t p0 = 0; p0 < P; p0 += pc) {
    const int64_t np = std::min(pc, P - p0);
    for (int64_t k0 = 0; k0 < K; k0 += kc) {
      const int64_t nk = std::min(kc, K - k0);
      for (int64_t kk = 0; kk < nk; ++kk) {
        const int64_t row = k0 + kk;
        const int64_t ci = row / kvol, kr = row % kvol;
        const int64_t kd = kr / (g.k[1] * g.k[2]), kh = (kr / g.k[2]) % g.k[1], kw = kr % g.k[2];
        const float* xc = x + ci * g.in_pixels();
        float* dst = col + kk * np;
        for (int64_t j = 0; j < np; ++j) {
          const int64_t p = p0 + j;
          const int64_t od = p / (g.out[1] * g.out[2]), oh = (p / g.out[2]) % g.out[1], ow = p % g.out[2];
          const int64_t id = od * g.stride[0] - g.pad[0] + kd * g.dil[0];
          const int64_t ih = oh * g.stride[1] - g.pad[1] + kh * g.dil[1];
          const int64_t iw = ow * g.stride[2] - g.pad[2] + kw * g.dil[2];
          const bool inside = id >= 0 && id < g.in[0] && ih >= 0 && ih < g.in[1] && iw >= 0 && iw < g.in[2];
          dst[j] = inside ? xc[(id * g.in[1] + ih) * g.in[2] + iw] : 0.0f;
        }
      }
      cpu::sgemm(ocg, np, nk, 1.0f, w + k0, K, col, np, k0 > 0, y + p0, P);
    }
  }
}

// Transposed convolution of one (batch, group): x_g [Cg, in pixels], w_g [Cg, M] (rows of the
// full weight), y_g [OCg, out pixels], zeroed by the caller; ldw: the weight's row length (M).
void conv_transpose_group(const ConvGeom& g, const float* x, const float* w, float* y) {
  const int64_t cg = g.c / g.groups, ocg = g.oc / g.groups;
  const int64_t kvol = g.kernel_size(), M = ocg * kvol, Pin = g.in_pixels(), Pout = g.out_pixels();
  alignas(64) float xt[kColFloats];
  alignas(64) float colt[kColFloats];
  const int64_t pc = std::max<int64_t>(1, std::min<int64_t>({Pin, 64, kColFloats / std::max<int64_t>(cg, 1)}));
  const int64_t mc = std::max<int64_t>(1, std::min<int64_t>(M, kColFloats / pc));
  for (int64_t p0 = 0; p0 < Pin; p0 += pc) {
    const int64_t np = std::min(pc, Pin - p0);
    for (int64_t c = 0; c < cg; ++c)
      for (int64_t j = 0; j < np; ++j) xt[j * cg + c] = x[c * Pin + p0 + j];
    for (int64_t m0 = 0; m0 < M; m0 += mc) {
      const int64_t nm = std::min(mc, M - m0);
      cpu::sgemm(np, nm, cg, 1.0f, xt, cg, w + m0, M, false, colt, nm);
      for (int64_t j = 0; j < np; ++j) {
        const int64_t p = p0 + j;
        const int64_t id = p / (g.in[1] * g.in[2]), ih = (p / g.in[2]) % g.in[1], iw = p % g.in[2];
        const float* src = colt + j * nm;
        for (int64_t mm = 0; mm < nm; ++mm) {
          const int64_t m = m0 + mm;
          const int64_t oc = m / kvol, kr = m % kvol;
          const int64_t kd = kr / (g.k[1] * g.k[2]), kh = (kr / g.k[2]) % g.k[1], kw = kr % g.k[2];
          const int64_t od = id * g.stride[0] - g.pad[0] + kd * g.dil[0];
          const int64_t oh = ih * g.stride[1] - g.pad[1] + kh * g.dil[1];
          const int64_t ow = iw * g.stride[2] - g.pad[2] + kw * g.dil[2];
          if (od < 0 || od >= g.out[0] || oh < 0 || oh >= g.out[1] || ow < 0 || ow >= g.out[2]) continue;
          y[oc * Pout + (od * g.out[1] + oh) * g.out[2] + ow] += src[mm];
        }
      }
    }
  }
}

// Integer and float64 convolution (torch's CPU convolution takes integer tensors: int64 programs do it), direct
// loops. Integers: the products summed modulo 2^64 (unsigned: no signed overflow) and the result cast to T, which
// wraps as torch's integer arithmetic does; float64: summed in double (kiln's GEMMs are float32's). False when the
// per-row sums cannot be allocated.
template <typename T>
bool conv_direct(const ConvGeom& g, bool transposed, const T* x, const T* w, const T* bias, T* y) {
  using Acc = std::conditional_t<std::is_floating_point_v<T>, T, uint64_t>;
  const int64_t cg = g.c / g.groups, ocg = g.oc / g.groups, kvol = g.kernel_size();
  const int64_t Pin = g.in_pixels(), Pout = g.out_pixels();
  auto widen = [](T a) -> Acc {
    if constexpr (std::is_floating_point_v<T>) return a;
    else return static_cast<uint64_t>(static_cast<int64_t>(a));
  };
  auto mul = [&](T a, T b) -> Acc { return widen(a) * widen(b); };
  std::unique_ptr<Acc[]> acc(new (std::nothrow) Acc[static_cast<size_t>(std::max<int64_t>(Pout, 1))]);
  if (!acc) return false;
  for (int64_t b = 0; b < g.n; ++b)
    for (int64_t gi = 0; gi < g.groups; ++gi)
      for (int64_t o = 0; o < ocg; ++o) {
        std::fill(acc.get(), acc.get() + Pout, Acc{0});
        const int64_t oc = gi * ocg + o;
        for (int64_t c = 0; c < cg; ++c) {
          const T* xc = x + (b * g.c + gi * cg + c) * Pin;
          const T* wk = transposed ? w + ((gi * cg + c) * ocg + o) * kvol : w + (oc * cg + c) * kvol;
          for (int64_t kr = 0; kr < kvol; ++kr) {
            const int64_t kd = kr / (g.k[1] * g.k[2]), kh = (kr / g.k[2]) % g.k[1], kw = kr % g.k[2];
            if (transposed) {  // each input pixel adds to the output pixel it reaches through this tap
              for (int64_t p = 0; p < Pin; ++p) {
                const int64_t id = p / (g.in[1] * g.in[2]), ih = (p / g.in[2]) % g.in[1], iw = p % g.in[2];
                const int64_t od = id * g.stride[0] - g.pad[0] + kd * g.dil[0];
                const int64_t oh = ih * g.stride[1] - g.pad[1] + kh * g.dil[1];
                const int64_t ow = iw * g.stride[2] - g.pad[2] + kw * g.dil[2];
                if (od < 0 || od >= g.out[0] || oh < 0 || oh >= g.out[1] || ow < 0 || ow >= g.out[2]) continue;
                acc[static_cast<size_t>((od * g.out[1] + oh) * g.out[2] + ow)] += mul(xc[p], wk[kr]);
              }
            } else {  // each output pixel reads the input pixel under this tap
              for (int64_t p = 0; p < Pout; ++p) {
                const int64_t od = p / (g.out[1] * g.out[2]), oh = (p / g.out[2]) % g.out[1], ow = p % g.out[2];
                const int64_t id = od * g.stride[0] - g.pad[0] + kd * g.dil[0];
                const int64_t ih = oh * g.stride[1] - g.pad[1] + kh * g.dil[1];
                const int64_t iw = ow * g.stride[2] - g.pad[2] + kw * g.dil[2];
                if (id < 0 || id >= g.in[0] || ih < 0 || ih >= g.in[1] || iw < 0 || iw >= g.in[2]) continue;
                acc[static_cast<size_t>(p)] += mul(xc[(id * g.in[1] + ih) * g.in[2] + iw], wk[kr]);
              }
            }
          }
        }
        const Acc bv = bias != nullptr ? widen(bias[oc]) : Acc{0};
        T* row = y + (b * g.oc + oc) * Pout;
        for (int64_t p = 0; p < Pout; ++p) {
          if constexpr (std::is_floating_point_v<T>) row[p] = acc[static_cast<size_t>(p)] + bv;
          else row[p] = static_cast<T>(static_cast<int64_t>(acc[static_cast<size_t>(p)] + bv));
        }
      }
  return true;
}

void convolution_out(KernelContext& ctx, const Tensor& input, const Tensor& weight, const Tensor* bias,
                     IntArrayRef stride, IntArrayRef padding, IntArrayRef dilation, bool transposed,
                     IntArrayRef output_padding, int64_t groups, Tensor& out) {
  const char* name = "aten::convolution.out";
  const ScalarType dt = input.dtype;
  const bool direct = in_set(dt, kIntTypes) || dt == ScalarType::Double;
  if ((dt != ScalarType::Float && dt != ScalarType::Half && dt != ScalarType::BFloat16 && !direct) ||
      weight.dtype != dt || (bias != nullptr && bias->dtype != dt)) {
    ctx.fail(Status::NotSupported, "%s: floating or integer input, weight and bias of one dtype are "
             "supported, got input %s and weight %s", name, dtype_str(input.dtype), dtype_str(weight.dtype));
    return;
  }
  if (!check_out_dtype(ctx, out, dt, name)) return;
  const int32_t rank = input.dim;
  if (rank < 3 || rank > 5 || weight.dim != rank) {
    ctx.fail(Status::InvalidArgument, "%s: input and weight must both have rank 3, 4 or 5 (got %d and %d)", name,
             input.dim, weight.dim);
    return;
  }
  if (!input.is_contiguous() || !weight.is_contiguous()) {
    ctx.fail(Status::NotSupported, "%s: tensors must be contiguous (channels-first)", name);
    return;
  }
  const int64_t spatial = rank - 2;
  ConvGeom g;
  g.n = input.sizes[0];
  g.c = input.sizes[1];
  g.groups = groups;
  if (groups < 1 || g.c % groups != 0) {
    ctx.fail(Status::InvalidArgument, "%s: %lld input channels are not divisible into %lld groups", name,
             static_cast<long long>(g.c), static_cast<long long>(groups));
    return;
  }
  if (!spatial_list(ctx, name, "stride", stride, spatial, 1, g.stride) ||
      !spatial_list(ctx, name, "padding", padding, spatial, 0, g.pad) ||
      !spatial_list(ctx, name, "dilation", dilation, spatial, 1, g.dil) ||
      !spatial_list(ctx, name, "output_padding", output_padding, spatial, 0, g.opad))
    return;
  for (int64_t d = 0; d < spatial; ++d) {
    g.in[3 - spatial + d] = input.sizes[2 + d];
    g.k[3 - spatial + d] = weight.sizes[2 + d];
  }
  for (int d = 0; d < 3; ++d) {
    if (g.stride[d] < 1 || g.dil[d] < 1 || g.pad[d] < 0 || g.opad[d] < 0) {
      ctx.fail(Status::InvalidArgument, "%s: stride and dilation must be positive, padding non-negative", name);
      return;
    }
  }
  if (transposed) {
    if (weight.sizes[0] != g.c) {
      ctx.fail(Status::InvalidArgument, "%s: transposed weight has %lld input channels, input has %lld", name,
               static_cast<long long>(weight.sizes[0]), static_cast<long long>(g.c));
      return;
    }
    g.oc = weight.sizes[1] * groups;
    for (int d = 0; d < 3; ++d) {
      // (in - 1) * stride - 2 * pad + dil * (k - 1) + opad + 1, checked: the arguments come from the file
      int64_t a, b, c;
      if (__builtin_mul_overflow(g.in[d] - 1, g.stride[d], &a) || __builtin_mul_overflow(g.pad[d], 2, &b) ||
          __builtin_sub_overflow(a, b, &a) || __builtin_mul_overflow(g.dil[d], g.k[d] - 1, &c) ||
          __builtin_add_overflow(a, c, &a) || __builtin_add_overflow(a, g.opad[d], &a) ||
          __builtin_add_overflow(a, 1, &g.out[d])) {
        ctx.fail(Status::InvalidArgument, "%s: the output size overflows 64 bits", name);
        return;
      }
    }
  } else {
    g.oc = weight.sizes[0];
    if (weight.sizes[1] * groups != g.c || g.oc % groups != 0) {
      ctx.fail(Status::InvalidArgument, "%s: weight of %lld x %lld channels does not fit %lld input channels in %lld groups",
               name, static_cast<long long>(weight.sizes[0]), static_cast<long long>(weight.sizes[1]),
               static_cast<long long>(g.c), static_cast<long long>(groups));
      return;
    }
    for (int d = 0; d < 3; ++d) {
      // floor((in + 2 * pad - dil * (k - 1) - 1) / stride) + 1, checked: the arguments come from the file
      int64_t a, c;
      if (__builtin_mul_overflow(g.pad[d], 2, &a) || __builtin_add_overflow(a, g.in[d], &a) ||
          __builtin_mul_overflow(g.dil[d], g.k[d] - 1, &c) || __builtin_sub_overflow(a, c, &a) ||
          __builtin_sub_overflow(a, 1, &a)) {
        ctx.fail(Status::InvalidArgument, "%s: the output size overflows 64 bits", name);
        return;
      }
      g.out[d] = a < 0 ? 0 : a / g.stride[d] + 1;  // a negative span: no output (floor, as PyTorch)
    }
  }
  for (int d = 0; d < 3; ++d) {
    if (g.out[d] < 1) {
      ctx.fail(Status::InvalidArgument, "%s: the output would be empty (input smaller than the kernel)", name);
      return;
    }
  }
  if (bias != nullptr && bias->numel != g.oc) {
    ctx.fail(Status::InvalidArgument, "%s: bias has %lld elements, expected %lld", name,
             static_cast<long long>(bias->numel), static_cast<long long>(g.oc));
    return;
  }
  int64_t shape[5] = {g.n, g.oc, 1, 1, 1};
  for (int64_t d = 0; d < spatial; ++d) shape[2 + d] = g.out[3 - spatial + d];
  if (!resize_out(ctx, out, {shape, static_cast<size_t>(rank)}, name)) return;
  if (out.numel == 0) return;
  if (direct) {
    bool ok = true;
    dispatch<kIntTypes | kFloatTypes>(dt, [&](auto tag) {
      using T = typename decltype(tag)::type;
      if constexpr (!std::is_same_v<T, float>)  // float32 takes the GEMM path below
        ok = conv_direct<T>(g, transposed, input.data_as<const T>(), weight.data_as<const T>(),
                      bias != nullptr ? bias->data_as<const T>() : nullptr, out.data_as<T>());
    });
    if (!ok) ctx.fail(Status::OutOfMemory, "%s: out of memory for a direct convolution's sums", name);
    return;
  }
  // float16 / bfloat16: the operands widened, the float32 result rounded once (nearest even), as torch's CPU
  // convolution of those types accumulates in float32. The only path of this kernel that allocates: whole-tensor
  // copies a 16-bit program's convolution needs (its float32 programs allocate nothing here).
  std::unique_ptr<float[]> wide_x, wide_w, wide_b, wide_y;
  const float* x = input.data_as<const float>();
  const float* w = weight.data_as<const float>();
  const float* bv = bias != nullptr ? bias->data_as<const float>() : nullptr;
  float* y = out.data_as<float>();
  if (dt != ScalarType::Float) {
    auto widen = [&](const Tensor& t, std::unique_ptr<float[]>& buf) -> const float* {
      buf.reset(new (std::nothrow) float[static_cast<size_t>(std::max<int64_t>(t.numel, 1))]);
      if (!buf) return nullptr;
      const auto* h = t.data_as<const uint16_t>();
      for (int64_t i = 0; i < t.numel; ++i)
        buf[static_cast<size_t>(i)] = dt == ScalarType::Half ? half_bits_to_float(h[i]) : bf16_bits_to_float(h[i]);
      return buf.get();
    };
    x = widen(input, wide_x);
    w = widen(weight, wide_w);
    if (bias != nullptr) bv = widen(*bias, wide_b);
    wide_y.reset(new (std::nothrow) float[static_cast<size_t>(out.numel)]);
    y = wide_y.get();
    if (!x || !w || (bias != nullptr && !bv) || !y) {
      ctx.fail(Status::OutOfMemory, "%s: out of memory widening a %s convolution", name, dtype_str(dt));
      return;
    }
  }
  const int64_t cg = g.c / groups, ocg = g.oc / groups, Pin = g.in_pixels(), Pout = g.out_pixels();
  if (transposed) std::memset(y, 0, static_cast<size_t>(out.numel) * sizeof(float));
  for (int64_t b = 0; b < g.n; ++b) {
    for (int64_t gi = 0; gi < groups; ++gi) {
      const float* xg = x + (b * g.c + gi * cg) * Pin;
      float* yg = y + (b * g.oc + gi * ocg) * Pout;
      if (transposed) conv_transpose_group(g, xg, w + gi * cg * ocg * g.kernel_size(), yg);
      else conv_group(g, xg, w + gi * ocg * cg * g.kernel_size(), yg);
    }
  }
  if (bias != nullptr) {
    for (int64_t b = 0; b < g.n; ++b)
      for (int64_t o = 0; o < g.oc; ++o) {
        float* row = y + (b * g.oc + o) * Pout;
        const float v = bv[o];
        for (int64_t p = 0; p < Pout; ++p) row[p] += v;
      }
  }
  if (dt != ScalarType::Float) {
    auto* h = out.data_as<uint16_t>();
    for (int64_t i = 0; i < out.numel; ++i)
      h[i] = dt == ScalarType::Half ? float_to_half_bits(y[i]) : float_to_bf16_bits(y[i]);
  }
}

}  // namespace

KILN_KERNEL(convolution_out, convolution_out);

}  // namespace kiln::rt::kernels
