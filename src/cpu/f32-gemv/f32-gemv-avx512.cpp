// f32-gemv, x86-64-v4 (AVX-512): 16-wide vectors.
#include "../ukernels.h"
#include "f32-gemv.h"

#ifdef KILN_CPU_X86
namespace kiln::cpu {

KILN_DEFINE_F32_GEMV(avx512, __attribute__((target("arch=x86-64-v4"))))

}  // namespace kiln::cpu
#endif
