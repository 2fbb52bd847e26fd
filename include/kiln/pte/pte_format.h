// The .pte frame constants and header codec, as the writer spells them
// (kiln::pte::...). They live in kiln/format/pte_frame.h, shared with the
// runtime's loader; this header only makes them visible under kiln::pte.
#pragma once

#include "kiln/format/pte_frame.h"

namespace kiln::pte {
using namespace kiln::format;  // NOLINT: the frame's names, unchanged for the writer
}  // namespace kiln::pte
