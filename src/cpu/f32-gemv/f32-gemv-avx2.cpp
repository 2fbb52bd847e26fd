// f32-gemv, x86-64-v3 (AVX2, FMA): 8-wide vectors.
#include "../ukernels.h"
#include "f32-gemv.h"

#ifdef KILN_CPU_X86
namespace kiln::cpu {

KILN_DEFINE_F32_GEMV(avx2, __attribute__((target("arch=x86-64-v3"))))
KILN_DEFINE_F32_DOT_BLOCK(avx2, __attribute__((target("arch=x86-64-v3"))))

}  // namespace kiln::cpu
#endif
