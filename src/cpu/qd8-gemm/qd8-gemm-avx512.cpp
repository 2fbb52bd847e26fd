// qd8 x qb4w / qc8w, x86-64-v4 (AVX-512 F/BW/DQ/VL), products by vpmaddubsw + vpmaddwd.
// The whole file is compiled for the ISA (its helpers have internal linkage).
#include "../ukernels.h"  // (before the target pragma: declarations only)
#ifdef KILN_CPU_X86
KILN_CPU_TARGET_BEGIN("arch=x86-64-v4")
#include "qd8-gemm-avx512.h"

const kiln::cpu::Qd8GemmVariant kiln::cpu::qd8_gemm__avx512 = avx512_variant<false>("qd8_gemm__avx512");

KILN_CPU_TARGET_END
#endif
