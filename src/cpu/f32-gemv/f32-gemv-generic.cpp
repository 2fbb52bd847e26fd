// f32-gemv, baseline ISA (SSE2 on x86-64, NEON on AArch64): 4-wide vectors.
#include "../ukernels.h"
#include "f32-gemv.h"

namespace kiln::cpu {

KILN_DEFINE_F32_GEMV(generic, )
KILN_DEFINE_F32_DOT_BLOCK(generic, )

}  // namespace kiln::cpu
