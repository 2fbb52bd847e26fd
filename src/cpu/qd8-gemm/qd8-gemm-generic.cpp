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
  if (layout != Qd8Layout::Nibbles) return k;
  const int64_t r = k % 128;
  return k - r + (r & 1) * 64 + r / 2;
}

inline int32_t nibble(const uint8_t* row, int64_t k) {  // w + 8 of input k
  const uint8_t b = row[k / 2];
  return (k & 1) ? (b >> 4) : (b & 0x0f);
}

// Signed rows' sums: one int32 per 32 inputs.
inline int64_t sums_per_row(int64_t k, Qd8Layout layout) { return layout == Qd8Layout::Signed ? (k + 31) / 32 : 0; }

}  // namespace

size_t qd8_rows_bytes(int64_t m, int64_t k, Qd8Layout layout) {
  const size_t data = static_cast<size_t>(m * row_bytes(k, layout));
  return (data + 63) / 64 * 64 + static_cast<size_t>(m) * (sizeof(float) + sizeof(int32_t)) +
         static_cast<size_t>(m * sums_per_row(k, layout)) * sizeof(int32_t) + 64;
}

Qd8Rows qd8_rows_view(const void* workspace, int64_t m, int64_t k, Qd8Layout layout) {
  const int64_t stride = row_bytes(k, layout);
  const auto* data = static_cast<const uint8_t*>(workspace);
  const size_t data_bytes = (static_cast<size_t>(m * stride) + 63) / 64 * 64;
  const auto* scale = reinterpret_cast<const float*>(data + data_bytes);
  const auto* zp = reinterpret_cast<const int32_t*>(scale + m);
  const int64_t ns = sums_per_row(k, layout);
  return Qd8Rows{data, stride, scale, zp, ns ? zp + m : nullptr, ns};
}

namespace {

// Plain rows (q + 128) -> Signed rows in place: q, the sums per 32 inputs, the zero point.
void make_signed(Qd8Rows* rows, int64_t m, int64_t k, int32_t* zp, int32_t* sums) {
  const int64_t ns = (k + 31) / 32;
  for (int64_t r = 0; r < m; ++r) {
    auto* q = const_cast<uint8_t*>(rows->data) + r * rows->stride;
    for (int64_t i = 0; i < k; ++i) q[i] ^= 0x80;  // u8 q + 128 -> the int8 q's bits (padding stays 0)
    for (int64_t c = 0; c < ns; ++c) {
      int32_t t = 0;
      for (int64_t i = 32 * c; i < std::min(k, 32 * c + 32); ++i) t += static_cast<int8_t>(q[i]);
      sums[r * ns + c] = t;
    }
    zp[r] -= 128;
  }
  rows->sums = sums;
  rows->sums_stride = ns;
}

}  // namespace

void qd8_quantize_rows(const float* x, int64_t m, int64_t k, int64_t ldx, Qd8Layout layout, void* workspace,
                       Qd8Rows* out) {
  const int64_t stride = row_bytes(k, layout);
  auto* data = static_cast<uint8_t*>(workspace);
  const size_t data_bytes = (static_cast<size_t>(m * stride) + 63) / 64 * 64;
  auto* scale = reinterpret_cast<float*>(data + data_bytes);
  auto* zp = reinterpret_cast<int32_t*>(scale + m);
#ifdef KILN_CPU_X86
  const Isa isa = qd8_gemm_config().isa;
  if (layout != Qd8Layout::Nibbles && (isa == Isa::Avx512 || isa == Isa::Amx || isa == Isa::Avx2)) {
    const bool is_signed = layout == Qd8Layout::Signed;
    const int64_t ns = sums_per_row(k, layout);
    int32_t* sums = zp + m;
    const auto row = isa == Isa::Avx2 ? qd8_quantize_row__avx2 : qd8_quantize_row__avx512;
    for (int64_t r = 0; r < m; ++r)
      row(x + r * ldx, k, is_signed, data + r * stride, stride, scale + r, zp + r, sums + r * ns);
    *out = Qd8Rows{data, stride, scale, zp, is_signed ? sums : nullptr, ns};
    return;
  }
#endif
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
  if (layout == Qd8Layout::Signed) make_signed(out, m, k, zp, zp + m);
}

void qb4w_weight_sums(const uint8_t* w, const uint16_t* scales, int64_t n, int64_t k, int64_t group, float* out) {
  const int64_t ldw = (k + 1) / 2, groups = k / group;
  for (int64_t j = 0; j < n; ++j) {
    float total = 0.0f;
    for (int64_t g = 0; g < groups; ++g) {
      int32_t sum = 0;
      if (group % 2 == 0) {  // whole bytes: both nibbles of each (the same integer sum, a loop the compiler vectorises)
        const uint8_t* b = w + j * ldw + g * group / 2;
        for (int64_t i = 0; i < group / 2; ++i) sum += (b[i] & 0x0f) + (b[i] >> 4);
        sum -= static_cast<int32_t>(8 * group);
      } else {
        for (int64_t i = g * group; i < (g + 1) * group; ++i) sum += nibble(w + j * ldw, i) - 8;
      }
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

namespace {

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

}  // namespace

size_t qb4w_panel_bytes(int64_t k, int64_t group) {
  return static_cast<size_t>((k / group) * (kQb4wPanel / 2 * group + 2 * kQb4wPanel));
}

size_t qb4w_panels_bytes(int64_t n, int64_t k, int64_t group) {
  return static_cast<size_t>((n + kQb4wPanel - 1) / kQb4wPanel) * qb4w_panel_bytes(k, group);
}

void qb4w_pack_panels(const uint8_t* w, const uint16_t* scales, int64_t n, int64_t k, int64_t group, uint8_t* out) {
  const int64_t ldw = k / 2, groups = k / group, panels = (n + kQb4wPanel - 1) / kQb4wPanel;
  uint8_t* o = out;
  for (int64_t p = 0; p < panels; ++p)
    for (int64_t g = 0; g < groups; ++g) {
      for (int64_t i0 = g * group; i0 < (g + 1) * group; i0 += 8)
        for (int64_t l = 0; l < kQb4wPanel; ++l, o += 4) {
          const int64_t j = p * kQb4wPanel + l;
          if (j >= n) {
            std::memset(o, 0, 4);
            continue;
          }
          // the file's 4 bytes hold inputs i0 .. i0 + 7 (even ones low); byte b of ours holds
          // i0 + b (low) and i0 + 4 + b (high)
          const uint8_t* src = w + j * ldw + i0 / 2;
          o[0] = static_cast<uint8_t>((src[0] & 0x0f) | (src[2] << 4));
          o[1] = static_cast<uint8_t>((src[0] >> 4) | (src[2] & 0xf0));
          o[2] = static_cast<uint8_t>((src[1] & 0x0f) | (src[3] << 4));
          o[3] = static_cast<uint8_t>((src[1] >> 4) | (src[3] & 0xf0));
        }
      auto* sc = reinterpret_cast<uint16_t*>(o);
      for (int64_t l = 0; l < kQb4wPanel; ++l) {
        const int64_t j = p * kQb4wPanel + l;
        sc[l] = j < n ? scales[j * groups + g] : uint16_t{0};
      }
      o += 2 * kQb4wPanel;
    }
}

namespace {

// The panels product, plainly: per output, per group, the dot product of the unsigned
// nibbles with the signed q, less 8 * sum q (what the + 8 added).
void qd8_qb4w_panels__generic(const Qd8Rows& a, int64_t m, int64_t k, const Qb4wPanels& w, int64_t n, int64_t p0,
                              int64_t p1, const float* bias, float* y, int64_t ldy, float lo, float hi) {
  const int64_t G = w.group, groups = k / G;
  const size_t pb = qb4w_panel_bytes(k, G);
  for (int64_t r = 0; r < m; ++r) {
    const auto* q = reinterpret_cast<const int8_t*>(a.data + r * a.stride);
    const int32_t* qs = a.sums + r * a.sums_stride;
    for (int64_t p = p0; p < p1; ++p) {
      const uint8_t* panel = w.data + static_cast<size_t>(p) * pb;
      for (int64_t l = 0; l < kQb4wPanel && p * kQb4wPanel + l < n; ++l) {
        const int64_t j = p * kQb4wPanel + l;
        float acc = 0.0f;
        const uint8_t* gp = panel;
        for (int64_t g = 0; g < groups; ++g) {
          int32_t dot = 0, qsum = 0;
          for (int64_t t = 0; t < G / 8; ++t) {
            const uint8_t* b4 = gp + t * (kQb4wPanel * 4) + l * 4;
            const int8_t* x = q + g * G + 8 * t;
            for (int b = 0; b < 4; ++b) dot += (b4[b] & 0x0f) * x[b] + (b4[b] >> 4) * x[4 + b];
          }
          for (int64_t c = g * G / 32; c < (g + 1) * G / 32; ++c) qsum += qs[c];
          gp += G / 8 * (kQb4wPanel * 4);
          acc += bf16_to_f32(reinterpret_cast<const uint16_t*>(gp)[l]) * static_cast<float>(dot - 8 * qsum);
          gp += 2 * kQb4wPanel;
        }
        float v = a.scale[r] * (acc - static_cast<float>(a.zp[r]) * w.sums[j]) + (bias ? bias[j] : 0.0f);
        y[r * ldy + j] = std::min(std::max(v, lo), hi);
      }
    }
  }
}

}  // namespace

const Qd8GemmVariant qd8_gemm__generic{"qd8_gemm__generic", Isa::Generic, false, qd8_qb4w_gemm__generic,
                                       qd8_qc8w_gemm__generic, qd8_qb4w_panels__generic};

}  // namespace kiln::cpu
