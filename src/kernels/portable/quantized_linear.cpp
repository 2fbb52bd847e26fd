// Dynamically quantized linear layers on the portable path: the four kernels of ExecuTorch's quantized
// library (kernels/quantized) that `kiln lower --backend portable --quantize 8da4w|8da8w` emits per layer:
//
//   s, zp = choose_qparams_per_token_asymmetric(x, int8)         per row of x [.., K]: s double, zp int64 [.., 1]
//   xq    = quantize_per_token(x, s, zp, -128, 127, int8)        q = clamp(zp + round_half_even(x * (1/s)))
//   x'    = dequantize_per_token(xq, s, zp, -128, 127, int8, float)   x' = (q - zp) * s
//   y     = mixed_linear(x' [M, K], Wq [N, K] int8, scales [N] | [N, K/G] float, None)
//           y[i, j] = sum over groups g of (sum_{k in g} x'[i, k] * Wq[j, k]) * scales[j, g]
//
// Numerics are ExecuTorch's kernels' (op_choose_qparams.cpp, op_quantize.cpp, op_dequantize.cpp,
// op_mixed_linear.cpp with vec_quantized_matmul_transb_int8), operation by operation:
//   scale = (double(max(row max, 0)) - min(row min, 0)) / 255 in double; 0.1 when it is 0 as a float or its
//   float reciprocal is infinite; below 6.1e-5 it becomes 6.1e-5 (and min/max are scaled to match); the zero
//   point comes from whichever end (min or max) has the smaller error term, clamped to [qmin, qmax] or
//   rounded (half to even) from its float value. quantize: inv = 1 / float(s) in float, q = zp + nearbyint(inv * x)
//   clamped. dequantize: float(q - zp) * float(s). mixed_linear: a float partial sum per group times its scale,
//   added in group order. (NaN inputs: ExecuTorch's casts are undefined there; kiln quantizes a NaN to the
//   zero point, i.e. to 0, and a row's NaNs do not enter its min and max.)
// These touch K values per output (mixed_linear: M x N x K multiply-adds, no packing): kiln's XNNPACK path is
// the fast route (int8 x int4 GEMMs in src/cpu); this is the form ExecuTorch's portable runtime runs too.
#include "util/dtype.h"
#include "util/register.h"
#include "util/shape_checks.h"

#include <cmath>

namespace kiln::rt::kernels {
namespace {

constexpr float kSmallScale = 6.1e-5f;  // ExecuTorch's SMALL_SCALE_THRESHOLD

// ExecuTorch's calculate_scale_and_zero_point.
void scale_and_zero_point(float lo, float hi, int32_t qmin, int32_t qmax, double* scale_out, int64_t* zp_out) {
  lo = std::min(lo, 0.0f);
  hi = std::max(hi, 0.0f);
  double scale = (static_cast<double>(hi) - lo) / (qmax - qmin);
  if (static_cast<float>(scale) == 0.0f || std::isinf(1.0f / static_cast<float>(scale))) scale = 0.1;
  if (scale < kSmallScale) {
    const float original = static_cast<float>(scale);
    scale = kSmallScale;
    if (lo == 0.0f) {
      hi = kSmallScale * static_cast<float>(qmax - qmin);
    } else if (hi == 0.0f) {
      lo = -kSmallScale * static_cast<float>(qmax - qmin);
    } else {
      const float amplifier = kSmallScale / original;
      lo *= amplifier;
      hi *= amplifier;
    }
  }
  const double from_min = qmin - lo / scale, from_max = qmax - hi / scale;
  const double err_min = std::abs(qmin) - std::abs(lo / scale), err_max = std::abs(qmax) - std::abs(hi / scale);
  const double initial = err_min < err_max ? from_min : from_max;
  int64_t zp;
  if (initial < qmin) zp = qmin;
  else if (initial > qmax) zp = qmax;
  else zp = static_cast<int64_t>(std::nearbyint(static_cast<float>(initial)));
  *scale_out = scale;
  *zp_out = zp;
}

// Rows of a per-token tensor: the product of every dim but the last (checked), and the last.
bool token_rows(KernelContext& ctx, const char* op, const Tensor& t, int64_t* rows, int64_t* width) {
  if (t.dim < 1) {
    ctx.fail(Status::InvalidArgument, "%s: input must have at least one dimension", op);
    return false;
  }
  int64_t n = 1;
  if (!checked_numel(ctx, op, {t.sizes, static_cast<size_t>(t.dim - 1)}, &n)) return false;
  *rows = n;
  *width = t.sizes[t.dim - 1];
  return true;
}

// The result shape of choose_qparams: the input's, its last dim 1.
void qparams_shape(const Tensor& t, int64_t (&shape)[kMaxDims]) {
  for (int i = 0; i < t.dim; ++i) shape[i] = t.sizes[i];
  shape[t.dim - 1] = 1;
}

void choose_qparams_per_token_asymmetric_out(KernelContext& ctx, const Tensor& input, ScalarType dtype,
                                             Tensor& scale_out, Tensor& zero_point_out) {
  const char* op = "quantized_decomposed::choose_qparams_per_token_asymmetric.out";
  (void)dtype;  // ExecuTorch's kernel always chooses int8 parameters ([-128, 127]), whatever the dtype says
  if (input.dtype != ScalarType::Float) {
    ctx.fail(Status::InvalidArgument, "%s: input must be float, got %s", op, dtype_str(input.dtype));
    return;
  }
  if (scale_out.dtype != ScalarType::Double || zero_point_out.dtype != ScalarType::Long) {
    ctx.fail(Status::InvalidArgument, "%s: scale_out must be double and zero_point_out int64, got %s and %s", op,
             dtype_str(scale_out.dtype), dtype_str(zero_point_out.dtype));
    return;
  }
  int64_t rows = 0, width = 0;
  if (!token_rows(ctx, op, input, &rows, &width)) return;
  int64_t shape[kMaxDims];
  qparams_shape(input, shape);
  const std::span<const int64_t> s{shape, static_cast<size_t>(input.dim)};
  if (!prepare_out(ctx, op, scale_out, s) || !prepare_out(ctx, op, zero_point_out, s) ||
      !check_no_overlap(ctx, op, scale_out, input, "input") ||
      !check_no_overlap(ctx, op, zero_point_out, input, "input") ||
      !check_no_overlap(ctx, op, zero_point_out, scale_out, "scale_out"))
    return;
  const auto* x = input.data_as<const float>();
  auto* scales = scale_out.data_as<double>();
  auto* zps = zero_point_out.data_as<int64_t>();
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = x + r * width;
    float lo = 0.0f, hi = 0.0f;  // the interval always holds 0 (ExecuTorch extends it to 0 after min/max)
    for (int64_t k = 0; k < width; ++k) {
      lo = std::min(lo, row[k]);  // a NaN compares false: it enters neither end
      hi = std::max(hi, row[k]);
    }
    scale_and_zero_point(lo, hi, -128, 127, &scales[r], &zps[r]);
  }
}

// quant bounds of a per-token dtype
bool quant_range_ok(KernelContext& ctx, const char* op, ScalarType dtype, int64_t qmin, int64_t qmax) {
  int64_t lo = 0, hi = 0;
  if (dtype == ScalarType::Char) {
    lo = -128;
    hi = 127;
  } else if (dtype == ScalarType::Byte) {
    lo = 0;
    hi = 255;
  } else {
    ctx.fail(Status::NotSupported, "%s: dtype %s is not supported (int8 or uint8)", op, dtype_str(dtype));
    return false;
  }
  if (qmin < lo || qmax > hi || qmin > qmax) {
    ctx.fail(Status::InvalidArgument, "%s: quant range [%lld, %lld] is not within %s's [%lld, %lld]", op,
             static_cast<long long>(qmin), static_cast<long long>(qmax), dtype_str(dtype),
             static_cast<long long>(lo), static_cast<long long>(hi));
    return false;
  }
  return true;
}

// The per-token parameters: one scale (double or float) and one zero point (int64 or int32) per row.
bool token_params_ok(KernelContext& ctx, const char* op, const Tensor& scales, const Tensor& zero_points,
                     int64_t rows) {
  if ((scales.dtype != ScalarType::Double && scales.dtype != ScalarType::Float) ||
      (zero_points.dtype != ScalarType::Long && zero_points.dtype != ScalarType::Int) || scales.numel != rows ||
      zero_points.numel != rows) {
    ctx.fail(Status::InvalidArgument,
             "%s: scales (double or float) and zero_points (int64 or int32) need one value per token (%lld), got "
             "%s %s and %s %s", op, static_cast<long long>(rows), dtype_str(scales.dtype),
             ShapeText(scales.shape()).buf, dtype_str(zero_points.dtype), ShapeText(zero_points.shape()).buf);
    return false;
  }
  return true;
}

// What quantize_per_token and dequantize_per_token check alike: `input`'s rows of tokens, the quantized range of
// `dtype`, a scale and a zero point per row, `out` of `out_dtype` shaped as `input` and apart from it. Fails ctx and
// returns false at the first that does not hold.
bool per_token_ok(KernelContext& ctx, const char* op, const Tensor& input, const Tensor& scales,
                  const Tensor& zero_points, int64_t quant_min, int64_t quant_max, ScalarType dtype,
                  ScalarType out_dtype, Tensor& out, int64_t* rows, int64_t* width) {
  return token_rows(ctx, op, input, rows, width) && quant_range_ok(ctx, op, dtype, quant_min, quant_max) &&
         token_params_ok(ctx, op, scales, zero_points, *rows) && check_out_dtype(ctx, out, out_dtype, op) &&
         prepare_out(ctx, op, out, input.shape()) && check_no_overlap(ctx, op, out, input, "input");
}

float scale_at(const Tensor& s, int64_t i) {
  return s.dtype == ScalarType::Double ? static_cast<float>(s.data_as<const double>()[i]) : s.data_as<const float>()[i];
}
int32_t zero_point_at(const Tensor& z, int64_t i) {
  return z.dtype == ScalarType::Long ? static_cast<int32_t>(z.data_as<const int64_t>()[i]) : z.data_as<const int32_t>()[i];
}

void quantize_per_token_out(KernelContext& ctx, const Tensor& input, const Tensor& scales, const Tensor& zero_points,
                            int64_t quant_min, int64_t quant_max, ScalarType dtype, Tensor& out) {
  const char* op = "quantized_decomposed::quantize_per_token.out";
  if (input.dtype != ScalarType::Float) {
    ctx.fail(Status::InvalidArgument, "%s: input must be float, got %s", op, dtype_str(input.dtype));
    return;
  }
  int64_t rows = 0, width = 0;
  if (!per_token_ok(ctx, op, input, scales, zero_points, quant_min, quant_max, dtype, dtype, out, &rows, &width))
    return;
  const auto* x = input.data_as<const float>();
  const auto lo = static_cast<float>(quant_min), hi = static_cast<float>(quant_max);
  auto quantize_row = [&](auto* o) {
    for (int64_t r = 0; r < rows; ++r) {
      const float inv = 1.0f / scale_at(scales, r);
      const auto zp = static_cast<float>(zero_point_at(zero_points, r));
      for (int64_t k = 0; k < width; ++k) {
        const int64_t i = r * width + k;
        // ExecuTorch: int32(zp) + nearbyint(float(inv * x)), a float sum, then clamped as an integer
        float q = zp + std::nearbyint(inv * x[i]);
        if (std::isnan(q)) q = zp;
        q = std::min(std::max(q, lo), hi);
        o[i] = static_cast<std::remove_reference_t<decltype(*o)>>(q);
      }
    }
  };
  if (dtype == ScalarType::Char) quantize_row(out.data_as<int8_t>());
  else quantize_row(out.data_as<uint8_t>());
}

void dequantize_per_token_out(KernelContext& ctx, const Tensor& input, const Tensor& scales,
                              const Tensor& zero_points, int64_t quant_min, int64_t quant_max, ScalarType dtype,
                              ScalarType output_dtype, Tensor& out) {
  const char* op = "quantized_decomposed::dequantize_per_token.out";
  if (input.dtype != dtype) {
    ctx.fail(Status::InvalidArgument, "%s: input is %s but dtype says %s", op, dtype_str(input.dtype),
             dtype_str(dtype));
    return;
  }
  if (output_dtype != ScalarType::Float) {
    ctx.fail(Status::NotSupported, "%s: only a float output is supported, got %s", op, dtype_str(output_dtype));
    return;
  }
  int64_t rows = 0, width = 0;
  if (!per_token_ok(ctx, op, input, scales, zero_points, quant_min, quant_max, dtype, output_dtype, out, &rows, &width))
    return;
  auto* o = out.data_as<float>();
  auto dequantize = [&](const auto* q) {
    for (int64_t r = 0; r < rows; ++r) {
      const float s = scale_at(scales, r);
      const int32_t zp = zero_point_at(zero_points, r);
      for (int64_t k = 0; k < width; ++k) {
        const int64_t i = r * width + k;
        o[i] = static_cast<float>(static_cast<int32_t>(q[i]) - zp) * s;
      }
    }
  };
  if (dtype == ScalarType::Char) dequantize(input.data_as<const int8_t>());
  else dequantize(input.data_as<const uint8_t>());
}

void mixed_linear_out(KernelContext& ctx, const Tensor& input, const Tensor& weight, const Tensor& weight_scales,
                      const Tensor* weight_zero_points, std::optional<ScalarType> dtype, Tensor& out) {
  const char* op = "quantized_decomposed::mixed_linear.out";
  if (input.dim != 2 || weight.dim != 2 || (weight_scales.dim != 1 && weight_scales.dim != 2)) {
    ctx.fail(Status::InvalidArgument, "%s: input and weight must be 2-D and weight_scales 1-D or 2-D, got %s, %s, %s",
             op, ShapeText(input.shape()).buf, ShapeText(weight.shape()).buf, ShapeText(weight_scales.shape()).buf);
    return;
  }
  if (input.dtype != ScalarType::Float || weight.dtype != ScalarType::Char || weight_scales.dtype != input.dtype) {
    ctx.fail(Status::InvalidArgument, "%s: input and weight_scales must be float and weight int8, got %s, %s, %s", op,
             dtype_str(input.dtype), dtype_str(weight.dtype), dtype_str(weight_scales.dtype));
    return;
  }
  if (weight_zero_points != nullptr) {  // as in ExecuTorch's kernel: symmetric weights only
    ctx.fail(Status::NotSupported, "%s: weight zero points are not supported", op);
    return;
  }
  if ((dtype && *dtype != ScalarType::Float) || out.dtype != ScalarType::Float) {
    ctx.fail(Status::NotSupported, "%s: only a float output is supported, got %s", op, dtype_str(out.dtype));
    return;
  }
  const int64_t m = input.sizes[0], k = input.sizes[1], n = weight.sizes[0];
  if (weight.sizes[1] != k || weight_scales.sizes[0] != n) {
    ctx.fail(Status::InvalidArgument, "%s: input %s, weight %s and weight_scales %s do not agree", op,
             ShapeText(input.shape()).buf, ShapeText(weight.shape()).buf, ShapeText(weight_scales.shape()).buf);
    return;
  }
  const int64_t stored_groups = weight_scales.dim == 2 ? weight_scales.sizes[1] : 1;
  if (stored_groups <= 0 && k > 0) {
    ctx.fail(Status::InvalidArgument, "%s: weight_scales %s has no group for %lld inputs", op,
             ShapeText(weight_scales.shape()).buf, static_cast<long long>(k));
    return;
  }
  const int64_t shape[2] = {m, n};
  int64_t result_numel = 0;
  if (!checked_numel(ctx, op, shape, &result_numel) || !prepare_out(ctx, op, out, shape) || !check_no_overlap(ctx, op, out, input, "input") ||
      !check_no_overlap(ctx, op, out, weight, "weight") || !check_no_overlap(ctx, op, out, weight_scales, "weight_scales"))
    return;
  // ExecuTorch: the group size g = ceil(K / scales per row); a row's scales are read ceil(K / g) apart (<= stored)
  const int64_t group = stored_groups > 0 ? (k + stored_groups - 1) / stored_groups : 1;
  const int64_t group_count = group > 0 ? (k + group - 1) / group : 0;
  const auto* x = input.data_as<const float>();
  const auto* w = weight.data_as<const int8_t>();
  const auto* s = weight_scales.data_as<const float>();
  auto* y = out.data_as<float>();
  for (int64_t i = 0; i < m; ++i) {
    const float* xi = x + i * k;
    for (int64_t j = 0; j < n; ++j) {
      const int8_t* wj = w + j * k;
      const float* sj = s + j * stored_groups;
      float sum = 0.0f;
      for (int64_t g = 0; g < group_count; ++g) {
        float partial = 0.0f;
        const int64_t end = std::min(k, (g + 1) * group);
        for (int64_t c = g * group; c < end; ++c) partial += xi[c] * static_cast<float>(wj[c]);
        sum += partial * sj[g];
      }
      y[i * n + j] = sum;
    }
  }
}

}  // namespace

KILN_KERNEL(qd_choose_qparams_per_token_asymmetric_out, choose_qparams_per_token_asymmetric_out);
KILN_KERNEL(qd_quantize_per_token_out, quantize_per_token_out);
KILN_KERNEL(qd_dequantize_per_token_out, dequantize_per_token_out);
KILN_KERNEL(qd_mixed_linear_out, mixed_linear_out);

}  // namespace kiln::rt::kernels
