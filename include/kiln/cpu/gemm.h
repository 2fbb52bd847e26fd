// kiln's fp32 matrix multiply (mm, bmm, addmm and any kernel or backend that
// needs a GEMM). Cache-blocked and register-tiled; the f32-gemm variant for the
// widest ISA the CPU runs (or KILN_CPU_ISA's, see config.h) is chosen once.
// Allocates nothing; it packs B panels on the stack (at most 192 KiB).
#pragma once

#include "kiln/cpu/config.h"

#include <cstdint>

namespace kiln::cpu {

// C[m, n] = alpha * A[m, k] · B[k, n] + (accumulate ? C : 0), all row-major with
// leading dimensions (row strides, in elements) lda, ldb, ldc. C must not alias A or B.
void sgemm(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda, const float* b, int64_t ldb,
           bool accumulate, float* c, int64_t ldc);

// C[m, n] = alpha * A[m, k] · Bᵀ + (accumulate ? C : 0) with b = Bᵀ given [n, k] (row stride ldb): a
// linear layer's weights as files hold them, without a transposed copy (B's panels are packed from it).
void sgemm_bt(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda, const float* b, int64_t ldb,
              bool accumulate, float* c, int64_t ldc);

// B packed once (a constant's layout for many products: a linear layer's weights, packed at load) as the
// selected variant's panels of sgemm_panel_width() columns, each k rows of that many floats, columns past
// n zero: sgemm_packed_floats(k, n) floats. From B [k, n] (row stride ldb), or from Bᵀ [n, k] if
// `transposed`. The products then read B in place, nothing packed per call.
bool sgemm_pack_once();  // the selected variant's pack_once: callers with a constant B should pack it
int64_t sgemm_panel_width();
int64_t sgemm_packed_floats(int64_t k, int64_t n);
void sgemm_pack_b(int64_t k, int64_t n, const float* b, int64_t ldb, bool transposed, float* packed);
// The same with a given panel width (a variant's nr: tests, benchmarks).
void sgemm_pack_b_width(int64_t nr, int64_t k, int64_t n, const float* b, int64_t ldb, bool transposed,
                        float* packed);
// sgemm over packed B: C[m, n] = alpha * A[m, k] · B[:, j0 : j0 + n] + (accumulate ? C : 0), where `packed`
// is sgemm_pack_b's output advanced by j0 * k floats and j0 is a multiple of sgemm_panel_width().
// `b_streams`: B comes from memory, as a linear layer's weights do however few of their columns one call
// takes (the tile then prefetches B's next block among its FMAs, not in a burst before it); false: the
// variant judges by B's size here (over 1 MiB: from memory).
void sgemm_packed(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda, const float* packed,
                  bool accumulate, float* c, int64_t ldc, bool b_streams = false);

// The code paths of sgemm are the ISA levels of config.h.
using SgemmIsa = Isa;

SgemmIsa sgemm_isa();                                            // f32_gemm_config().isa
inline const char* sgemm_isa_name(SgemmIsa isa) { return isa_name(isa); }  // "generic", "avx2", "avx512"

// sgemm on one given code path (benchmarks, cross-checks); false, computing
// nothing, when this build or CPU lacks it.
bool sgemm_with(SgemmIsa isa, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                const float* b, int64_t ldb, bool accumulate, float* c, int64_t ldc);
bool sgemm_bt_with(SgemmIsa isa, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                   const float* b, int64_t ldb, bool accumulate, float* c, int64_t ldc);

}  // namespace kiln::cpu
