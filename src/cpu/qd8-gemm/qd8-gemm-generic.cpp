// qd8 x qb4w / qc8w, the baseline: activation quantization, weight sums, and the
// generic products (plain loops over the same layouts the vector variants read;
// the reference every variant is tested against, and the Arm path until NEON).
#include "../ukernels.h"
#include "kiln/cpu/quant.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>

namespace kiln::cpu {

float bf16_to_f32(uint16_t b) {
  uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // NaN stays NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

namespace {

int64_t row_bytes(int64_t k, Qd8Layout layout) {
  const int64_t align = layout == Qd8Layout::Nibbles ? 128 : 64;
  return std::max<int64_t>(align, (k + align - 1) / align * align);
}

// Where input k of a row lies in the layout.
inline int64_t position(int64_t k, Qd8Layout layout) {
  if (layout == Qd8Layout::Plain) return k;
  const int64_t r = k % 128;
  return k - r + (r & 1) * 64 + r / 2;
}

inline int32_t nibble(const uint8_t* row, int64_t k) {  // w + 8 of input k
  const uint8_t b = row[k / 2];
  return (k & 1) ? (b >> 4) : (b & 0x0f);
}

}  // namespace

size_t qd8_rows_bytes(int64_t m, int64_t k, Qd8Layout layout) {
  const size_t data = static_cast<size_t>(m * row_bytes(k, layout));
  return (data + 63) / 64 * 64 + static_cast<size_t>(m) * (sizeof(float) + sizeof(int32_t)) + 64;
}

Qd8Rows qd8_rows_view(const void* workspace, int64_t m, int64_t k, Qd8Layout layout) {
  const int64_t stride = row_bytes(k, layout);
  const auto* data = static_cast<const uint8_t*>(workspace);
  const size_t data_bytes = (static_cast<size_t>(m * stride) + 63) / 64 * 64;
  const auto* scale = reinterpret_cast<const float*>(data + data_bytes);
  return Qd8Rows{data, stride, scale, reinterpret_cast<const int32_t*>(scale + m)};
}

void qd8_quantize_rows(const float* x, int64_t m, int64_t k, int64_t ldx, Qd8Layout layout, void* workspace,
                       Qd8Rows* out) {
  const int64_t stride = row_bytes(k, layout);
  auto* data = static_cast<uint8_t*>(workspace);
  const size_t data_bytes = (static_cast<size_t>(m * stride) + 63) / 64 * 64;
  auto* scale = reinterpret_cast<float*>(data + data_bytes);
  auto* zp = reinterpret_cast<int32_t*>(scale + m);
  for (int64_t r = 0; r < m; ++r) {
    const float* xr = x + r * ldx;
#ifdef KILN_CPU_ARM64
    std::memset(data + r * stride, 0, static_cast<size_t>(stride));
    qd8_quantize_row__neon(xr, k, layout == Qd8Layout::Nibbles, data + r * stride, scale + r, zp + r);
    continue;
#endif
    float lo = 0.0f, hi = 0.0f;  // min(min(x), 0), max(max(x), 0)
    for (int64_t i = 0; i < k; ++i) {
      lo = std::min(lo, xr[i]);
      hi = std::max(hi, xr[i]);
    }
    const float s = std::max((hi - lo) / 255.0f, FLT_MIN);  // the reference quantizer: eps None is the smallest normal
    const float z = std::clamp(-128.0f - std::nearbyint(lo / s), -128.0f, 127.0f);
    const float inv = 1.0f / s;
    uint8_t* qr = data + r * stride;
    std::memset(qr, 0, static_cast<size_t>(stride));
    for (int64_t i = 0; i < k; ++i) {
      const float q = std::clamp(std::nearbyint(xr[i] * inv) + z, -128.0f, 127.0f);
      qr[position(i, layout)] = static_cast<uint8_t>(static_cast<int32_t>(q) + 128);
    }
    scale[r] = s;
    zp[r] = 128 + static_cast<int32_t>(z);
  }
  *out = Qd8Rows{data, stride, scale, zp};
}

void qb4w_weight_sums(const uint8_t* w, const uint16_t* scales, int64_t n, int64_t k, int64_t group, float* out) {
  const int64_t ldw = (k + 1) / 2, groups = k / group;
  for (int64_t j = 0; j < n; ++j) {
    float total = 0.0f;
    for (int64_t g = 0; g < groups; ++g) {
      int32_t sum = 0;
      for (int64_t i = g * group; i < (g + 1) * group; ++i) sum += nibble(w + j * ldw, i) - 8;
      total += bf16_to_f32(scales[j * groups + g]) * static_cast<float>(sum);
    }
    out[j] = total;
  }
}

void qc8w_weight_sums(const int8_t* w, const float* scales, int64_t n, int64_t k, float* out) {
  for (int64_t j = 0; j < n; ++j) {
    int64_t sum = 0;
    for (int64_t i = 0; i < k; ++i) sum += w[j * k + i];
    out[j] = scales[j] * static_cast<float>(sum);
  }
}

void qd8_qb4w_gemm__generic(const Qd8Rows& a, int64_t m, int64_t k, const Qb4wWeights& w, int64_t n0, int64_t n1,
                            const float* bias, float* y, int64_t ldy, float lo, float hi) {
  const int64_t ldw = (k + 1) / 2, groups = k / w.group;
  for (int64_t r = 0; r < m; ++r) {
    const uint8_t* q = a.data + r * a.stride;
    for (int64_t j = n0; j < n1; ++j) {
      const uint8_t* wr = w.data + j * ldw;
      float acc = 0.0f;
      for (int64_t g = 0; g < groups; ++g) {
        int32_t dot = 0;  // sum of (q + 128) * w over the group
        for (int64_t i = g * w.group; i < (g + 1) * w.group; ++i)
          dot += static_cast<int32_t>(q[position(i, Qd8Layout::Nibbles)]) * (nibble(wr, i) - 8);
        acc += bf16_to_f32(w.scales[j * groups + g]) * static_cast<float>(dot);
      }
      float v = a.scale[r] * (acc - static_cast<float>(a.zp[r]) * w.sums[j]) + (bias ? bias[j] : 0.0f);
      y[r * ldy + j] = std::min(std::max(v, lo), hi);
    }
  }
}

void qd8_qc8w_gemm__generic(const Qd8Rows& a, int64_t m, int64_t k, const Qc8wWeights& w, int64_t n0, int64_t n1,
                            const float* bias, float* y, int64_t ldy, float lo, float hi) {
  for (int64_t r = 0; r < m; ++r) {
    const uint8_t* q = a.data + r * a.stride;
    for (int64_t j = n0; j < n1; ++j) {
      const int8_t* wr = w.data + j * k;
      int32_t dot = 0;
      for (int64_t i = 0; i < k; ++i) dot += static_cast<int32_t>(q[i]) * wr[i];
      float v = a.scale[r] * (w.scales[j] * static_cast<float>(dot) - static_cast<float>(a.zp[r]) * w.sums[j]) +
                (bias ? bias[j] : 0.0f);
      y[r * ldy + j] = std::min(std::max(v, lo), hi);
    }
  }
}

}  // namespace kiln::cpu
