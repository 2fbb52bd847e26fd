// Per-row int8 activation quantization with NEON (the AArch64 baseline, so no runtime
// selection: qd8_quantize_rows calls it on every AArch64 CPU). The same operations as
// the generic loop in qd8-gemm-generic.cpp, element for element, so the bytes, scale
// and zero point are identical (tests/cpu/qd8_gemm_test.cpp checks them against the
// reference quantizer's formulas):
//   min / max: FMINNM / FMAXNM (a NaN input is ignored, as std::min / std::max ignore it
//   in second place; a -0 minimum gives the same scale and zero point as +0),
//   q = clamp(round-half-even(x * (1 / s)) + z, -128, 127): FMUL, FRINTN, FADD, FMAX/FMIN;
// the nibble layout's even / odd split is LD2's deinterleave.
#include "../ukernels.h"

#ifdef KILN_CPU_ARM64
#include <arm_neon.h>

#include <algorithm>
#include <cfloat>
#include <cmath>

namespace kiln::cpu {
namespace {

// 16 quantized values of one vector group -> q + 128 as bytes
KILN_CPU_INLINE uint8x16_t quantize16(float32x4_t v0, float32x4_t v1, float32x4_t v2, float32x4_t v3,
                                      float32x4_t inv, float32x4_t z) {
  const float32x4_t qlo = vdupq_n_f32(-128.0f), qhi = vdupq_n_f32(127.0f);
  const int32x4_t off = vdupq_n_s32(128);
  auto q = [&](float32x4_t v) KILN_CPU_LAMBDA {
    const float32x4_t r = vminq_f32(vmaxq_f32(vaddq_f32(vrndnq_f32(vmulq_f32(v, inv)), z), qlo), qhi);
    return vreinterpretq_u32_s32(vaddq_s32(vcvtq_s32_f32(r), off));
  };
  const uint16x8_t h0 = vcombine_u16(vmovn_u32(q(v0)), vmovn_u32(q(v1)));
  const uint16x8_t h1 = vcombine_u16(vmovn_u32(q(v2)), vmovn_u32(q(v3)));
  return vcombine_u8(vmovn_u16(h0), vmovn_u16(h1));
}

KILN_CPU_INLINE uint8_t quantize1(float x, float inv, float z) {
  const float q = std::clamp(std::nearbyint(x * inv) + z, -128.0f, 127.0f);
  return static_cast<uint8_t>(static_cast<int32_t>(q) + 128);
}

}  // namespace

void qd8_quantize_row__neon(const float* x, int64_t k, bool nibbles, uint8_t* dst, float* scale, int32_t* zp) {
  float32x4_t vlo = vdupq_n_f32(0.0f), vhi = vdupq_n_f32(0.0f);
  int64_t i = 0;
  for (; i + 4 <= k; i += 4) {
    const float32x4_t v = vld1q_f32(x + i);
    vlo = vminnmq_f32(vlo, v);
    vhi = vmaxnmq_f32(vhi, v);
  }
  float lo = vminnmvq_f32(vlo), hi = vmaxnmvq_f32(vhi);
  for (; i < k; ++i) {
    lo = std::min(lo, x[i]);
    hi = std::max(hi, x[i]);
  }
  const float s = std::max((hi - lo) / 255.0f, FLT_MIN);
  const float z = std::clamp(-128.0f - std::nearbyint(lo / s), -128.0f, 127.0f);
  const float inv = 1.0f / s;
  const float32x4_t vinv = vdupq_n_f32(inv), vz = vdupq_n_f32(z);
  i = 0;
  if (nibbles) {
    // per 128 inputs: the 64 even ones at bytes 0..63, the 64 odd ones at 64..127
    for (; i + 32 <= k; i += 32) {
      const float32x4x2_t p0 = vld2q_f32(x + i), p1 = vld2q_f32(x + i + 8), p2 = vld2q_f32(x + i + 16),
                          p3 = vld2q_f32(x + i + 24);
      uint8_t* base = dst + (i - i % 128) + (i % 128) / 2;
      vst1q_u8(base, quantize16(p0.val[0], p1.val[0], p2.val[0], p3.val[0], vinv, vz));
      vst1q_u8(base + 64, quantize16(p0.val[1], p1.val[1], p2.val[1], p3.val[1], vinv, vz));
    }
    for (; i < k; ++i) {
      const int64_t r = i % 128;
      dst[i - r + (r & 1) * 64 + r / 2] = quantize1(x[i], inv, z);
    }
  } else {
    for (; i + 16 <= k; i += 16)
      vst1q_u8(dst + i, quantize16(vld1q_f32(x + i), vld1q_f32(x + i + 4), vld1q_f32(x + i + 8),
                                   vld1q_f32(x + i + 12), vinv, vz));
    for (; i < k; ++i) dst[i] = quantize1(x[i], inv, z);
  }
  *scale = s;
  *zp = 128 + static_cast<int32_t>(z);
}

}  // namespace kiln::cpu
#endif
