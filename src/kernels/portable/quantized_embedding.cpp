// Quantized embedding lookup: ExecuTorch's quantized_decomposed::embedding_byte
// and embedding_4bit (the form ExecuTorch's LLM export and kiln lower
// --quantize-embedding emit), out variants with and without an output dtype.
//
//   weight   int8 (or uint8) [V, D]            embedding_byte
//            uint8 [V, D/2], two values a byte: embedding_4bit; element 2i in
//            the high nibble, 2i+1 in the low one, each stored as q + 8
//   scales   [V] or [V, D/G] (float, half or bfloat16): one per group of G
//   zero_points  None or like scales
//   out[..., j] = (q[idx, j] - zp[idx, j/G]) * scale[idx, j/G]
//
// quant_min/quant_max are metadata (as in ExecuTorch) and only checked for order.
// The dequantization is computed here, not in src/cpu: it touches D values per
// token (576 for SmolLM2), far below what a vectorized family would pay back.
#include "util/dtype.h"
#include "util/register.h"
#include "util/shape_checks.h"
#include "util/strided_copy.h"

namespace kiln::rt::kernels {
namespace {

float param_at(const Tensor& t, int64_t i) {
  switch (t.dtype) {
    case ScalarType::Half: return half_bits_to_float(t.data_as<const uint16_t>()[i]);
    case ScalarType::BFloat16: return bf16_bits_to_float(t.data_as<const uint16_t>()[i]);
    default: return t.data_as<const float>()[i];
  }
}

bool params_dtype_ok(ScalarType dt) {
  return dt == ScalarType::Float || dt == ScalarType::Half || dt == ScalarType::BFloat16;
}

void quantized_embedding(KernelContext& ctx, const char* op, int bits, const Tensor& weight, const Tensor& scales,
                         const Tensor* zero_points, int64_t quant_min, int64_t quant_max, const Tensor& indices,
                         std::optional<ScalarType> dtype, Tensor& out) {
  if (!check_index_dtype(ctx, op, "indices", indices)) return;
  if (weight.dim != 2) {
    ctx.fail(Status::InvalidArgument, "%s: weight must be 2-D, got shape %s", op, ShapeText(weight.shape()).buf);
    return;
  }
  const bool byte_ok = bits == 4 ? weight.dtype == ScalarType::Byte
                                 : weight.dtype == ScalarType::Char || weight.dtype == ScalarType::Byte;
  if (!byte_ok) {
    ctx.fail(Status::InvalidArgument, "%s: weight must be %s, got %s", op, bits == 4 ? "uint8" : "int8 or uint8",
             dtype_str(weight.dtype));
    return;
  }
  const int64_t rows = weight.sizes[0], dim = weight.sizes[1] * (8 / bits);
  if (!params_dtype_ok(scales.dtype) || (scales.dim != 1 && scales.dim != 2) || scales.sizes[0] != rows) {
    ctx.fail(Status::InvalidArgument, "%s: weight_scales must be float, half or bfloat16 of shape [%lld] or [%lld, G], "
             "got %s %s", op, static_cast<long long>(rows), static_cast<long long>(rows), dtype_str(scales.dtype),
             ShapeText(scales.shape()).buf);
    return;
  }
  const int64_t groups = scales.dim == 2 ? scales.sizes[1] : 1;
  if (groups <= 0 || dim % groups != 0) {
    ctx.fail(Status::InvalidArgument, "%s: %lld groups do not divide the embedding dim %lld", op,
             static_cast<long long>(groups), static_cast<long long>(dim));
    return;
  }
  if (zero_points && (!params_dtype_ok(zero_points->dtype) || zero_points->numel != scales.numel)) {
    ctx.fail(Status::InvalidArgument, "%s: weight_zero_points must be None or shaped like weight_scales", op);
    return;
  }
  if (quant_min > quant_max) {
    ctx.fail(Status::InvalidArgument, "%s: quant_min %lld > quant_max %lld", op, static_cast<long long>(quant_min),
             static_cast<long long>(quant_max));
    return;
  }
  // Without a dtype the out variant computes in the scales' dtype (ExecuTorch's rule); kiln's outputs are float.
  const ScalarType want = dtype ? *dtype : scales.dtype;
  if (want != ScalarType::Float || out.dtype != ScalarType::Float) {
    ctx.fail(Status::NotSupported, "%s: only a float output is supported, got %s", op, dtype_str(out.dtype));
    return;
  }
  int64_t shape[kMaxDims];
  if (!embedding_shape(ctx, op, indices, dim, shape)) return;
  if (!prepare_out(ctx, op, out, {shape, static_cast<size_t>(indices.dim + 1)}) ||
      !check_no_overlap(ctx, op, out, indices, "indices") || !check_no_overlap(ctx, op, out, weight, "weight"))
    return;
  if (auto bad = index_outside(indices, 0, rows)) {
    ctx.fail(Status::OutOfRange, "%s: index %lld out of range for %lld embeddings", op, static_cast<long long>(*bad),
             static_cast<long long>(rows));
    return;
  }
  const int64_t group = dim / groups, packed = weight.sizes[1];
  const auto* w = static_cast<const uint8_t*>(weight.data);
  const bool signed8 = weight.dtype == ScalarType::Char;
  auto* o = static_cast<float*>(out.data);
  for (int64_t t = 0; t < indices.numel; ++t, o += dim) {
    const int64_t r = read_index(indices, t);
    const uint8_t* row = w + r * packed;
    for (int64_t g = 0; g < groups; ++g) {
      const float s = param_at(scales, r * groups + g);
      const float zp = zero_points ? param_at(*zero_points, r * groups + g) : 0.0f;
      for (int64_t j = g * group; j < (g + 1) * group; ++j) {
        int32_t q;
        if (bits == 4) q = static_cast<int32_t>((j & 1) ? (row[j >> 1] & 0x0f) : (row[j >> 1] >> 4)) - 8;
        else q = signed8 ? static_cast<int32_t>(static_cast<int8_t>(row[j])) : static_cast<int32_t>(row[j]);
        o[j] = (static_cast<float>(q) - zp) * s;
      }
    }
  }
}

// The four ops, each by its id: int8 (embedding_byte) or int4 (embedding_4bit) tables, with or without an output
// dtype; the op's name (from its schema) leads its errors.
using ::kiln::ops::OpId;
constexpr int bits_of(OpId op) {
  return op == OpId::qd_embedding_4bit_out || op == OpId::qd_embedding_4bit_dtype_out ? 4 : 8;
}

template <OpId kOp>
void embedding_dtype_out(KernelContext& ctx, const Tensor& weight, const Tensor& scales, const Tensor* zero_points,
                         int64_t quant_min, int64_t quant_max, const Tensor& indices, std::optional<ScalarType> dtype,
                         Tensor& out) {
  quantized_embedding(ctx, ::kiln::ops::op_name(kOp).data(), bits_of(kOp), weight, scales, zero_points, quant_min,
                      quant_max, indices, dtype, out);
}

template <OpId kOp>
void embedding_out(KernelContext& ctx, const Tensor& weight, const Tensor& scales, const Tensor* zero_points,
                   int64_t quant_min, int64_t quant_max, const Tensor& indices, Tensor& out) {
  embedding_dtype_out<kOp>(ctx, weight, scales, zero_points, quant_min, quant_max, indices, std::nullopt, out);
}

}  // namespace

KILN_KERNEL(qd_embedding_byte_out, embedding_out<OpId::qd_embedding_byte_out>);
KILN_KERNEL(qd_embedding_byte_dtype_out, embedding_dtype_out<OpId::qd_embedding_byte_dtype_out>);
KILN_KERNEL(qd_embedding_4bit_out, embedding_out<OpId::qd_embedding_4bit_out>);
KILN_KERNEL(qd_embedding_4bit_dtype_out, embedding_dtype_out<OpId::qd_embedding_4bit_dtype_out>);

}  // namespace kiln::rt::kernels

// quantized_decomposed::dequantize_per_channel.out: out = (input - zp[c]) * scale[c] along `axis`
// (ExecuTorch's weight-only int8 linear: the weight dequantized before an fp32 product).
namespace kiln::rt::kernels {
namespace {

void dequantize_per_channel_out(KernelContext& ctx, const Tensor& input, const Tensor& scales,
                                const Tensor* zero_points, int64_t axis, int64_t quant_min, int64_t quant_max,
                                ScalarType dtype, std::optional<ScalarType> out_dtype, Tensor& out) {
  const char* op = "quantized_decomposed::dequantize_per_channel.out";
  if (input.dtype != dtype || (dtype != ScalarType::Char && dtype != ScalarType::Byte)) {
    ctx.fail(Status::InvalidArgument, "%s: input must be int8 or uint8 and match dtype, got %s", op,
             dtype_str(input.dtype));
    return;
  }
  if (!normalize_dim(ctx, op, axis, input.dim, &axis)) return;
  const int64_t channels = input.dim == 0 ? 1 : input.sizes[axis];
  if (!params_dtype_ok(scales.dtype) || scales.numel != channels ||
      (zero_points && (zero_points->numel != channels ||
                       (zero_points->dtype != ScalarType::Long && zero_points->dtype != ScalarType::Int &&
                        !params_dtype_ok(zero_points->dtype))))) {
    ctx.fail(Status::InvalidArgument, "%s: scales (and zero points) must have one value per channel (%lld)", op,
             static_cast<long long>(channels));
    return;
  }
  if (quant_min > quant_max || (out_dtype && *out_dtype != ScalarType::Float) || out.dtype != ScalarType::Float) {
    ctx.fail(Status::NotSupported, "%s: a float output and quant_min <= quant_max are required", op);
    return;
  }
  if (!prepare_out(ctx, op, out, input.shape()) || !check_no_overlap(ctx, op, out, input, "input")) return;
  int64_t inner = 1;
  for (int64_t d = axis + 1; d < input.dim; ++d) inner *= input.sizes[d];
  auto zp_at = [&](int64_t c) -> float {
    if (!zero_points) return 0.0f;
    if (zero_points->dtype == ScalarType::Long) return static_cast<float>(zero_points->data_as<const int64_t>()[c]);
    if (zero_points->dtype == ScalarType::Int) return static_cast<float>(zero_points->data_as<const int32_t>()[c]);
    return param_at(*zero_points, c);
  };
  const auto* in = static_cast<const uint8_t*>(input.data);
  const bool signed8 = input.dtype == ScalarType::Char;
  auto* o = static_cast<float*>(out.data);
  for (int64_t i = 0; i < input.numel; ++i) {
    const int64_t c = (i / inner) % channels;
    const float q = signed8 ? static_cast<float>(static_cast<int8_t>(in[i])) : static_cast<float>(in[i]);
    o[i] = (q - zp_at(c)) * param_at(scales, c);
  }
}

}  // namespace

KILN_KERNEL(qd_dequantize_per_channel_out, dequantize_per_channel_out);

}  // namespace kiln::rt::kernels
