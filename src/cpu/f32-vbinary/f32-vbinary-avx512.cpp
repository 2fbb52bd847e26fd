// f32-vbinary, x86-64-v4 (AVX-512): 16 lanes.
#include "../ukernels.h"
#include "f32-vbinary.h"

#ifdef KILN_CPU_X86
namespace kiln::cpu {

KILN_DEFINE_F32_VBINARY(avx512, 16, __attribute__((target("arch=x86-64-v4"))))

}  // namespace kiln::cpu
#endif
