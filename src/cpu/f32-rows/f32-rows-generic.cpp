// f32-rows, baseline ISA (SSE2 on x86-64, NEON on AArch64): 4 lanes.
#include "../ukernels.h"
#include "f32-rows.h"

namespace kiln::cpu {

KILN_DEFINE_F32_ROWS(generic, 4, )

}  // namespace kiln::cpu
