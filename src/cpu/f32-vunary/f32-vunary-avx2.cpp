// f32-vunary, x86-64-v3 (AVX2, FMA): 8 lanes.
#include "../ukernels.h"
#include "f32-vunary.h"

#ifdef KILN_CPU_X86
namespace kiln::cpu {

KILN_DEFINE_F32_VUNARY(avx2, 8, __attribute__((target("arch=x86-64-v3"))))

}  // namespace kiln::cpu
#endif
