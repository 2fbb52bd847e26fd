// Internal to kiln_cpu: the loop structure every vector qd8 product shares (AVX2, AVX-512,
// NEON), whatever its instructions: activation rows in blocks whose size is a compile-time
// constant (so a block's accumulators stay in registers), the block's row pointers, and
// the per-output epilogue y = s_x (dot - z sum_w) + bias, clamped. ISA-neutral code only;
// each variant's file includes it after its target pragma (everything here has internal
// linkage, so each file gets its own copy built for its ISA).
#pragma once

#include "../isa.h"
#include "kiln/cpu/quant.h"

#include <cstdint>
#include <type_traits>

namespace kiln::cpu {
namespace {

// A block of MR activation rows, as a value whose type carries MR (decltype(rows)::value).
template <int MR>
using RowBlock = std::integral_constant<int, MR>;

// body(RowBlock<4>{}, m0) for each whole block of 4 rows from m0 = 0, then
// body(RowBlock<r>{}, m0) once for the r = 1 .. 3 rows left.
template <class Body>
KILN_CPU_INLINE void for_row_blocks(int64_t m, Body&& body) {
  int64_t m0 = 0;
  for (; m0 + 4 <= m; m0 += 4) body(RowBlock<4>{}, m0);
  switch (m - m0) {
    case 3: body(RowBlock<3>{}, m0); break;
    case 2: body(RowBlock<2>{}, m0); break;
    case 1: body(RowBlock<1>{}, m0); break;
    default: break;
  }
}

}  // namespace
}  // namespace kiln::cpu
