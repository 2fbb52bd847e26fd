// qd8 x qb4w / qc8w, AArch64 NEON + dot product (FEAT_DotProd: SDOT; Cortex-A76 and up):
// signed products by SDOT (vdotq_s32: four lanes, each the dot of 4 bytes by 4 bytes).
// The whole file is compiled for the ISA (its helpers have internal linkage).
//
// Activations are stored as q + 128 (quant.h); XOR 0x80 gives back the signed q. The
// int4 weights (w + 8 in a nibble) XOR 0x88 put w in each nibble as a 4-bit two's
// complement, so (byte << 4) is 16 w_even and (byte & 0xf0) is 16 w_odd as signed
// bytes: SDOT then sums 16 q w exactly (|16 q w| <= 2^14, int32 accumulators), and
// the power-of-two 1/16 comes out exactly at the end. With signed activations the
// zero point enters as y = s_x (sum_g s_g dot_g - z sum_w) with z = zp - 128 (the
// weight sums are quant.h's scale-weighted sums), the same value as the generic
// variant's s_x (sum_g s_g (dot_g + 128 sum_g w) - zp sum_w) without the large
// cancelling terms.
#include "../ukernels.h"  // (before the target pragma: declarations only)
#ifdef KILN_CPU_ARM64
#pragma GCC target("arch=armv8.2-a+dotprod")
#include "qd8-gemm-neon.h"

namespace kiln::cpu {
namespace {

struct SdotProduct {
  // acc (4 lanes) += products of 16 signed activation bytes by 16 signed weight bytes
  static KILN_CPU_INLINE int32x4_t dot(int32x4_t acc, int8x16_t a, int8x16_t w) { return vdotq_s32(acc, a, w); }
};

}  // namespace

const Qd8GemmVariant qd8_gemm__dotprod{"qd8_gemm__dotprod", Isa::Dotprod, false,
                                       by_row_blocks<Neon<SdotProduct>, Qb4wWeights>,
                                       by_row_blocks<Neon<SdotProduct>, Qc8wWeights>, nullptr};

}  // namespace kiln::cpu
#endif
