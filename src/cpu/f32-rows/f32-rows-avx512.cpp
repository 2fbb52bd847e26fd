// f32-rows, x86-64-v4 (AVX-512): 16 lanes.
#include "../ukernels.h"
#include "f32-rows.h"

#ifdef KILN_CPU_X86
namespace kiln::cpu {

KILN_DEFINE_F32_ROWS(avx512, 16, __attribute__((target("arch=x86-64-v4"))))

}  // namespace kiln::cpu
#endif
