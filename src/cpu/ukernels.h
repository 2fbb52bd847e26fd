// Internal to kiln_cpu: every micro-kernel variant, by the name that is its
// spec (family, tile, ISA). config.cpp puts them in the selection tables;
// nothing else calls them directly (the tables are the public way in).
#pragma once

#include "isa.h"
#include "kiln/cpu/config.h"
#include "kiln/cpu/quant.h"

#include <cstdint>

namespace kiln::cpu {

// f32-gemm: C[m, n] = alpha * A[m, k] · B[k, n] + (accumulate ? C : 0); m, n, k >= 1.
#define KILN_DECLARE_F32_GEMM(name)                                                                            \
  void name(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda, const float* b,          \
            int64_t ldb, bool accumulate, float* c, int64_t ldc)

// The _bt forms take b as Bᵀ, [n, k] with row stride ldb; the _packed forms, B as panels (gemm.h's sgemm_pack_b).
KILN_DECLARE_F32_GEMM(f32_gemm_6x8__generic);
KILN_DECLARE_F32_GEMM(f32_gemm_6x8__generic_bt);
KILN_DECLARE_F32_GEMM(f32_gemm_6x8__generic_packed);
#ifdef KILN_CPU_X86
KILN_DECLARE_F32_GEMM(f32_gemm_4x24__avx2);
KILN_DECLARE_F32_GEMM(f32_gemm_4x24__avx2_bt);
KILN_DECLARE_F32_GEMM(f32_gemm_4x24__avx2_packed);
KILN_DECLARE_F32_GEMM(f32_gemm_4x64__avx512);
KILN_DECLARE_F32_GEMM(f32_gemm_4x64__avx512_bt);
KILN_DECLARE_F32_GEMM(f32_gemm_4x64__avx512_packed);
KILN_DECLARE_F32_GEMM(f32_gemm_6x64__avx512);
KILN_DECLARE_F32_GEMM(f32_gemm_6x64__avx512_bt);
KILN_DECLARE_F32_GEMM(f32_gemm_6x64__avx512_packed);
// FMA rate probes (config.cpp's cpu_fma512_pipes): flops per second of thread CPU time, `rounds` x 128 FMAs
double f32_fma_probe__avx512(long rounds);
double f32_fma_probe__avx2(long rounds);
#endif
#ifdef KILN_CPU_ARM64
KILN_DECLARE_F32_GEMM(f32_gemm_8x8__neon);
KILN_DECLARE_F32_GEMM(f32_gemm_8x8__neon_bt);
KILN_DECLARE_F32_GEMM(f32_gemm_8x8__neon_packed);
#endif

// f32-gemv: the streaming products for a few rows (see kiln/cpu/config.h).
#define KILN_DECLARE_F32_GEMV(isa)                                                                             \
  void f32_gemv_axpy_rows__##isa(const float* x, int64_t ldx, int64_t rows, int64_t k, const float* w,          \
                                 int64_t ldw, int64_t n, float* out, int64_t ldo);                               \
  float f32_gemv_dot__##isa(const float* a, const float* b, int64_t k);                                          \
  void f32_gemv_dot_rows__##isa(const float* x, int64_t ldx, int64_t rows, int64_t k, const float* w,           \
                                int64_t ldw, float* out, int64_t ldo);                                           \
  void f32_gemv_dot_block__##isa(const float* a, int64_t lda, int64_t m, const float* b, int64_t ldb, int64_t n, \
                                 int64_t k, float* c, int64_t ldc)

KILN_DECLARE_F32_GEMV(generic);
#ifdef KILN_CPU_X86
KILN_DECLARE_F32_GEMV(avx2);
KILN_DECLARE_F32_GEMV(avx512);
#endif

// f32-vunary: out[i] = f(in[i]) (see kiln/cpu/config.h); f32-vbinary: out[i] = a op b
// in three forms; f32-rows: row softmax, 2-D transpose.
#define KILN_DECLARE_F32_VUNARY_FN(op, isa) void f32_v##op##__##isa(const float* in, float* out, int64_t n);
#define KILN_DECLARE_F32_VUNARY(isa)                          \
  KILN_F32_VUNARY_OPS(KILN_DECLARE_F32_VUNARY_FN, isa)        \
  void f32_vclamp__##isa(const float* in, float* out, int64_t n, float lo, float hi)

#define KILN_DECLARE_F32_VBINARY_OP(op, isa)                                        \
  void f32_v##op##_vv__##isa(const float* a, const float* b, float* out, int64_t n); \
  void f32_v##op##_vs__##isa(const float* a, const float* b, float* out, int64_t n); \
  void f32_v##op##_sv__##isa(const float* a, const float* b, float* out, int64_t n);
#define KILN_DECLARE_F32_VBINARY(isa) KILN_F32_VBINARY_OPS(KILN_DECLARE_F32_VBINARY_OP, isa) static_assert(true)

#define KILN_DECLARE_F32_ROWS(isa)                                   \
  void f32_softmax__##isa(const float* in, float* out, int64_t n);   \
  void f32_softmax_scaled__##isa(const float* in, float scale, const float* add, float* out, int64_t n); \
  void f32_transpose__##isa(const float* in, int64_t ldi, int64_t rows, int64_t cols, float* out, int64_t ldo)

KILN_DECLARE_F32_VUNARY(generic);
KILN_DECLARE_F32_VBINARY(generic);
KILN_DECLARE_F32_ROWS(generic);
#ifdef KILN_CPU_X86
KILN_DECLARE_F32_VUNARY(avx2);
KILN_DECLARE_F32_VBINARY(avx2);
KILN_DECLARE_F32_ROWS(avx2);
KILN_DECLARE_F32_VUNARY(avx512);
KILN_DECLARE_F32_VBINARY(avx512);
KILN_DECLARE_F32_ROWS(avx512);
#endif

// The CPU has AMX-TILE and AMX-INT8 and the kernel granted this process the tile state
// (config.cpp; asks once; false off x86-64 Linux): what the amx variant checks before any tile
// instruction.
bool amx_permitted();

// qd8 x qb4w / qc8w products (see kiln/cpu/quant.h): each variant's row of the selection
// table, defined in its file next to its products (which have internal linkage).
extern const Qd8GemmVariant qd8_gemm__generic;
#ifdef KILN_CPU_X86
extern const Qd8GemmVariant qd8_gemm__avx2;
extern const Qd8GemmVariant qd8_gemm__avx512;
extern const Qd8GemmVariant qd8_gemm__avx512vnni;
extern const Qd8GemmVariant qd8_gemm__amx;
// AVX-512 activation quantization, Plain or Signed rows (qd8_quantize_rows calls it when the
// selected qd8 variant is an AVX-512 one): one row of k inputs into dst (row_bytes, zeroed
// past k), the same results as the generic loop; Signed: q itself and its sums per 32 inputs.
void qd8_quantize_row__avx512(const float* x, int64_t k, bool signed_rows, uint8_t* dst, int64_t row_bytes,
                              float* scale, int32_t* zp, int32_t* sums);
// The same with AVX2 (when the selected qd8 variant is the AVX2 one).
void qd8_quantize_row__avx2(const float* x, int64_t k, bool signed_rows, uint8_t* dst, int64_t row_bytes,
                            float* scale, int32_t* zp, int32_t* sums);
#endif
#ifdef KILN_CPU_ARM64
extern const Qd8GemmVariant qd8_gemm__dotprod;
extern const Qd8GemmVariant qd8_gemm__i8mm;
// NEON activation quantization (the baseline on AArch64; qd8_quantize_rows calls it): one row of
// k inputs into dst (row_bytes zeroed bytes), the same results as the generic loop.
void qd8_quantize_row__neon(const float* x, int64_t k, bool nibbles, uint8_t* dst, float* scale, int32_t* zp);
#endif

}  // namespace kiln::cpu
