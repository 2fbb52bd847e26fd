// f32-vunary, baseline ISA (SSE2 on x86-64, NEON on AArch64): 4 lanes.
#include "../ukernels.h"
#include "f32-vunary.h"

namespace kiln::cpu {

KILN_DEFINE_F32_VUNARY(generic, 4, )

}  // namespace kiln::cpu
