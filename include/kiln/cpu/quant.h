// kiln's quantized compute: dynamic int8 activations (qd8) times int4 weights
// in groups (qb4w, "8da4w") or per-channel int8 weights (qc8w, "8da8w").
//
// Activations: each row is quantized on its own, asymmetric int8, exactly as
// torchao's choose_qparams_affine(ASYMMETRIC, int8, eps None: FLT_MIN) +
// quantize_affine do:
//   lo = min(min(x), 0), hi = max(max(x), 0), scale = max((hi - lo) / 255, FLT_MIN),
//   zp = clamp(-128 - round(lo / scale), -128, 127),
//   q = clamp(round(x * (1 / scale)) + zp, -128, 127)    (round: half to even)
// and stored as the unsigned byte q + 128 (what the u8 x s8 dot-product
// instructions take), zero-padded: see Qd8Rows.
//
// Weights, in ExecuTorch's XNNPACK serialization layouts (used in place):
//   qb4w: [n, ceil(k/2)] bytes, element k of a row in the low nibble (k even)
//         or the high nibble (k odd) of byte k/2, stored as w + 8 (w in -8..7);
//         one bf16 scale per group of `group` inputs ([n, k/group], raw bits);
//         w_real = scale * w.
//   qc8w: [n, k] int8, one fp32 scale per row.
// and, for the variants that have them, qb4w repacked once at load into kiln's
// own panels (Qb4wPanels below): 32 outputs per panel, so that one vector of
// weights meets one broadcast word of activations (no horizontal sums).
// The products:
//   y[m, j] = s_x[m] * sum_k (q[m,k] - zp[m]) * w_real[j,k] + bias[j], clamped to [lo, hi]
// computed as integer dot products per group, scaled in fp32.
#pragma once

#include "kiln/cpu/config.h"

#include <cstddef>
#include <cstdint>
#include <span>

namespace kiln::cpu {

enum class Qd8Layout : uint8_t {
  Plain,     // byte k of a row is input k (for qc8w); rows padded to 64 bytes
  Nibbles,   // per 128 inputs: the 64 even ones, then the 64 odd ones (for qb4w,
             // matching the weights' low/high nibbles); rows padded to 128 bytes
  Signed,    // byte k of a row is q itself (int8, no +128), rows padded to 64 bytes, and
             // per row the sums of q over each 32 inputs (for the qb4w panels: their
             // weights are the unsigned w + 8, so the products subtract 8 * sum q)
};

// A block of quantized activation rows (made by qd8_quantize_rows).
struct Qd8Rows {
  const uint8_t* data = nullptr;  // q + 128, row r at data + r * stride; padding bytes are 0
  int64_t stride = 0;             // bytes per row
  const float* scale = nullptr;   // per row
  const int32_t* zp = nullptr;    // per row: the offset the products subtract from the stored
                                  // bytes: 128 + zero point (Plain, Nibbles), the zero point (Signed)
  const int32_t* sums = nullptr;  // Signed: row r's sums of q per 32 inputs at sums + r * sums_stride
  int64_t sums_stride = 0;
};

// Bytes of workspace qd8_quantize_rows needs for m rows of k inputs.
size_t qd8_rows_bytes(int64_t m, int64_t k, Qd8Layout layout);

// Quantizes x[m, k] (row stride ldx) into `workspace` (qd8_rows_bytes, 64-byte
// aligned) and describes the result in *out.
void qd8_quantize_rows(const float* x, int64_t m, int64_t k, int64_t ldx, Qd8Layout layout, void* workspace,
                       Qd8Rows* out);

// The Qd8Rows that qd8_quantize_rows(…, m, k, …, layout, workspace, …) describes.
Qd8Rows qd8_rows_view(const void* workspace, int64_t m, int64_t k, Qd8Layout layout);

// Per output row j of the weights: sum over groups of scale * (sum of w in the
// group), the term the asymmetric activations' zero point multiplies. Computed
// once per weight (at load); out[n].
void qb4w_weight_sums(const uint8_t* w, const uint16_t* scales_bf16, int64_t n, int64_t k, int64_t group, float* out);
void qc8w_weight_sums(const int8_t* w, const float* scales, int64_t n, int64_t k, float* out);

// y[0:m, n0:n1] (row stride ldy) for weight rows n0 <= j < n1; bias may be null.
// qb4w: group is a multiple of 32 that divides k.
struct Qb4wWeights {
  const uint8_t* data;       // [n, ceil(k/2)]
  const uint16_t* scales;    // [n, k / group], bf16 bits
  const float* sums;         // qb4w_weight_sums
  int64_t group;
};
struct Qc8wWeights {
  const int8_t* data;        // [n, k]
  const float* scales;       // [n]
  const float* sums;         // qc8w_weight_sums
};
// qb4w in panels (made at load from the file's layout by qb4w_pack_panels; the
// file's pages can then leave memory). Panel p holds outputs 32p .. 32p + 31 (past n:
// zero weights and scales). Per group g of the panel, in order:
//   for each 8 inputs i0 = g * group + 8t: two 64-byte vectors (outputs 0-15, 16-31),
//     whose byte 4l + b holds output l's weights w + 8 for input i0 + b (low nibble)
//     and i0 + 4 + b (high nibble);
//   then the group's 32 bf16 scales (64 bytes).
// So a vector of low (or high) nibbles times a broadcast 4 bytes of activations is one
// u8 x s8 dot product per output.
struct Qb4wPanels {
  const uint8_t* data;       // qb4w_panels_bytes, 64-byte aligned
  const float* sums;         // qb4w_weight_sums, [n]
  int64_t group;
};
constexpr int64_t kQb4wPanel = 32;  // outputs per panel
size_t qb4w_panel_bytes(int64_t k, int64_t group);  // one panel
size_t qb4w_panels_bytes(int64_t n, int64_t k, int64_t group);
void qb4w_pack_panels(const uint8_t* w, const uint16_t* scales_bf16, int64_t n, int64_t k, int64_t group, uint8_t* out);
// y[0:m, 32 p0 : min(n, 32 p1)] from Signed rows.
using Qd8Qb4wPanelsFn = void (*)(const Qd8Rows& a, int64_t m, int64_t k, const Qb4wPanels& w, int64_t n, int64_t p0,
                                 int64_t p1, const float* bias, float* y, int64_t ldy, float lo, float hi);

using Qd8Qb4wGemmFn = void (*)(const Qd8Rows& a, int64_t m, int64_t k, const Qb4wWeights& w, int64_t n0, int64_t n1,
                               const float* bias, float* y, int64_t ldy, float lo, float hi);
using Qd8Qc8wGemmFn = void (*)(const Qd8Rows& a, int64_t m, int64_t k, const Qc8wWeights& w, int64_t n0, int64_t n1,
                               const float* bias, float* y, int64_t ldy, float lo, float hi);

struct Qd8GemmVariant {
  const char* name;   // e.g. "qd8_gemm__avx512vnni"
  Isa isa;
  bool vnni;          // needs AVX-512 VNNI (vpdpbusd) besides the ISA level
  Qd8Qb4wGemmFn qb4w;
  Qd8Qc8wGemmFn qc8w;
  Qd8Qb4wPanelsFn qb4w_panels;  // null: this variant reads qb4w in the file's layout (qb4w above)
};

std::span<const Qd8GemmVariant> qd8_gemm_variants();  // all built in, widest first, runnable or not
bool qd8_gemm_runnable(const Qd8GemmVariant& v);       // this CPU runs it
const Qd8GemmVariant& qd8_gemm_config();               // the selected one (KILN_CPU_ISA caps it)

// bf16 bits -> float (the top 16 bits of an fp32); float -> bf16 bits, rounded
// to nearest even (as torch's .to(bfloat16)).
float bf16_to_f32(uint16_t b);
uint16_t f32_to_bf16(float f);

}  // namespace kiln::cpu
