// kiln's CPU compute layer: which micro-kernel variant of each family runs.
//
// Every family (f32-gemm, f32-gemv, ...) has variants, one per register tile
// and ISA (src/cpu/<family>/<family>-<tile>-<isa>.cpp). One selection table per
// family is filled once, at first use, from the CPU's features: the widest ISA
// the CPU runs, or the one the environment variable KILN_CPU_ISA names
// (generic | avx2 | avx512; capped to what the CPU runs, so an AVX-512 machine
// can measure and test its AVX2 path). An unknown or unsupported value prints
// one warning line to stderr and the best available ISA is used.
//
// Tests and benchmarks list a family's variants and call one directly.
#pragma once

#include <cstdint>
#include <span>

namespace kiln::cpu {

// ISA levels, in order: a CPU that runs one runs every level below it.
//   Generic: the baseline ISA of the build (SSE2 on x86-64, NEON on AArch64)
//   Avx2:    x86-64-v3 (AVX2, FMA, BMI1/2, F16C, ...)
//   Avx512:  x86-64-v4 (AVX-512 F, BW, CD, DQ, VL)
enum class Isa : uint8_t { Generic, Avx2, Avx512 };

const char* isa_name(Isa isa);               // "generic", "avx2", "avx512"
bool parse_isa(const char* name, Isa* isa);  // false for an unknown name
bool isa_supported(Isa isa);                 // this build has code for it and this CPU runs it
Isa best_isa();                              // the widest supported ISA
Isa active_isa();                            // what the tables were filled for (KILN_CPU_ISA or best_isa)

// The ISA for a KILN_CPU_ISA value (null or empty: none given) on a CPU whose
// best is `best`; *warning (may be null) is set when the value is unknown or
// names an ISA above `best`.
Isa resolve_isa(const char* request, Isa best, bool* warning);

// ---------------------------------------------------------------- f32-gemm

// C[m, n] = alpha * A[m, k] · B[k, n] + (accumulate ? C : 0), row-major with row
// strides lda, ldb, ldc; m, n, k >= 1 (sgemm() in gemm.h handles the rest).
using F32GemmFn = void (*)(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                           const float* b, int64_t ldb, bool accumulate, float* c, int64_t ldc);

struct F32GemmVariant {
  const char* name;  // e.g. "f32_gemm_4x64__avx512"
  Isa isa;
  int mr, nr;        // register tile: rows of A, columns of B
  int64_t kc;        // K block (rows of a packed B panel)
  F32GemmFn gemm;
};

std::span<const F32GemmVariant> f32_gemm_variants();  // all built in, widest first, runnable or not
const F32GemmVariant& f32_gemm_config();              // the selected one

// ---------------------------------------------------------------- f32-gemv

// Streaming products for a few rows (one token): each reads W once, in place.
//  axpy_rows: out[0:rows, 0:n] += x[0:rows, 0:k] · W[0:k, 0:n] (row strides ldx, ldw, ldo)
//  dot:       dot(a[0:k], b[0:k])
//  dot_rows:  out[r * ldo] = x[r, 0:k] · W[0:k, 0] for r < rows (one column of W, row stride ldw)
// No aliasing between inputs and outputs.
using F32AxpyRowsFn = void (*)(const float* x, int64_t ldx, int64_t rows, int64_t k, const float* w, int64_t ldw,
                               int64_t n, float* out, int64_t ldo);
using F32DotFn = float (*)(const float* a, const float* b, int64_t k);
using F32DotRowsFn = void (*)(const float* x, int64_t ldx, int64_t rows, int64_t k, const float* w, int64_t ldw,
                              float* out, int64_t ldo);

struct F32GemvVariant {
  const char* name;  // e.g. "f32_gemv__avx512"
  Isa isa;
  F32AxpyRowsFn axpy_rows;
  F32DotFn dot;
  F32DotRowsFn dot_rows;
};

std::span<const F32GemvVariant> f32_gemv_variants();  // all built in, widest first, runnable or not
const F32GemvVariant& f32_gemv_config();              // the selected one

}  // namespace kiln::cpu
