// kiln's CPU compute layer: which micro-kernel variant of each family runs.
//
// Every family (f32-gemm, f32-gemv, ...) has variants, one per register tile
// and ISA (src/cpu/<family>/<family>-<tile>-<isa>.cpp). One selection table per
// family is filled once, at first use, from the CPU's features: the widest ISA
// the CPU runs, or the one the environment variable KILN_CPU_ISA names
// (generic | avx2 | avx512 | amx on x86-64, generic | neon | dotprod | i8mm on AArch64;
// capped to what the CPU runs, so an AVX-512 machine
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
//   Amx:     Avx512 + AVX-512 VNNI + AMX-TILE + AMX-INT8 (Sapphire Rapids and later), and the
//            kernel's grant of the tile state (Linux: arch_prctl(ARCH_REQ_XCOMP_PERM,
//            XFEATURE_XTILEDATA), asked once per process by the first check): only qd8-gemm
//            has an Amx variant; the other families run their Avx512 ones at this level
// and on AArch64 (getauxval(AT_HWCAP / AT_HWCAP2)):
//   Neon:    Armv8-A Advanced SIMD with FMA (HWCAP_ASIMD; every AArch64 core): kiln's hand-tiled
//            NEON variants (Generic is the same ISA, compiled from the portable templates)
//   Dotprod: Neon + SDOT/UDOT (HWCAP_ASIMDDP; Cortex-A76 / Raspberry Pi 5, Armv8.2+)
//   I8mm:    Dotprod + SMMLA/USDOT (HWCAP2_I8MM; Armv8.6+, e.g. Cortex-X2, Neoverse V1/N2)
// The two families' levels never mix: a name from the other family is unsupported here.
enum class Isa : uint8_t { Generic, Avx2, Avx512, Amx, Neon, Dotprod, I8mm };

const char* isa_name(Isa isa);               // "generic", "avx2", "avx512", "amx", "neon", "dotprod", "i8mm"
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
  F32GemmFn gemm_bt;  // the same with b given as Bᵀ, [n, k] (sgemm_bt)
  F32GemmFn gemm_packed;  // the same with B as panels of nr columns, packed once (sgemm_pack_b; ldb: nonzero
                          // when B streams from memory, see sgemm_packed)
  // Picked only on cores with two full-width 512-bit FMA pipes, as measured (cpu_fma512_pipes), and
  // skipped there by the variant it tunes: such a core consumes a 4 x 64 tile's B faster than L2 delivers
  // it, so its panel must fit L1, and its tile is written with intrinsics (bench/RESULTS.md, issue 42).
  bool two_pipes = false;
  // Callers with a constant B (linear layers' weights) pack it once for this row (sgemm_pack_b, at load)
  // rather than per call: measured faster for it (bench/RESULTS.md, issue 42): both AVX-512 rows (the
  // 6x64 on an Intel Xeon, the 4x64 on AMD's Zen 4: GPT-2 small 6-7% faster at 128 tokens). The AVX2,
  // NEON and generic rows keep the per-call packing they were measured with (AVX2 on Zen 4: mixed,
  // -6% to +5% per shape in kiln_gemm_bench).
  bool pack_once = false;
};

// The core's full-width (512-bit) FMA pipes, measured once: 2 where 512-bit FMAs run at about twice the
// 256-bit ones' rate in flops (Intel's server cores), else 1 (AMD's Zen 4 splits them in halves; a CPU
// without AVX-512: 0). KILN_FMA512_PIPES=1|2 overrides the measurement (tests, benchmarks).
int cpu_fma512_pipes();

std::span<const F32GemmVariant> f32_gemm_variants();  // all built in, widest first, runnable or not
const F32GemmVariant& f32_gemm_config();              // the selected one
bool f32_gemm_for_this_cpu(const F32GemmVariant& v);  // false: a row tuned for other cores (two_pipes)

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
//  dot_block: c[r * ldc + j] = a[r, 0:k] · b[j, 0:k] for r < m, j < n (row strides lda, ldb): a few rows
//             against many (attention's q · Kᵀ over a cache), 16 dot products per horizontal sum
using F32DotBlockFn = void (*)(const float* a, int64_t lda, int64_t m, const float* b, int64_t ldb, int64_t n,
                               int64_t k, float* c, int64_t ldc);

struct F32GemvVariant {
  const char* name;  // e.g. "f32_gemv__avx512"
  Isa isa;
  F32AxpyRowsFn axpy_rows;
  F32DotFn dot;
  F32DotRowsFn dot_rows;
  F32DotBlockFn dot_block;
};

std::span<const F32GemvVariant> f32_gemv_variants();  // all built in, widest first, runnable or not
const F32GemvVariant& f32_gemv_config();              // the selected one

// ---------------------------------------------------------------- f32-vunary

// out[i] = f(in[i]) for i < n (n >= 0); out == in (in place) is allowed, other
// overlap is not. exp, tanh, sigmoid: kiln/cpu/math.h's exp_f/tanh_f/sigmoid_f
// polynomials (fused multiply-adds where the ISA has FMA); sqrt, rsqrt = 1/sqrt, square, neg, abs:
// IEEE; gelu = x/2 (1 + erf(x/sqrt 2)), log, sin, cos: libm per element;
// clamp = min(max(x, lo), hi) with NaN kept.
using F32VUnaryFn = void (*)(const float* in, float* out, int64_t n);
using F32VClampFn = void (*)(const float* in, float* out, int64_t n, float lo, float hi);

// The maps, once: X(op, args...) for each. The variant's fields, every ISA's
// functions (f32_v<op>__<isa>, src/cpu/f32-vunary/) and the selection table
// (config.cpp) are all made from this list.
#define KILN_F32_VUNARY_OPS(X, ...)                                                                         \
  X(exp, __VA_ARGS__) X(tanh, __VA_ARGS__) X(sigmoid, __VA_ARGS__) X(sqrt, __VA_ARGS__) X(rsqrt, __VA_ARGS__) \
  X(square, __VA_ARGS__) X(neg, __VA_ARGS__) X(abs, __VA_ARGS__) X(gelu, __VA_ARGS__) X(log, __VA_ARGS__)    \
  X(sin, __VA_ARGS__) X(cos, __VA_ARGS__) X(gelu_tanh, __VA_ARGS__)

#define KILN_F32_VUNARY_FIELD(op, ...) F32VUnaryFn op;
struct F32VUnaryVariant {
  const char* name;  // e.g. "f32_vunary__avx512"
  Isa isa;
  int lanes;         // vector width in floats
  KILN_F32_VUNARY_OPS(KILN_F32_VUNARY_FIELD, )
  F32VClampFn clamp;
};
#undef KILN_F32_VUNARY_FIELD

std::span<const F32VUnaryVariant> f32_vunary_variants();  // all built in, widest first, runnable or not
const F32VUnaryVariant& f32_vunary_config();              // the selected one

// ---------------------------------------------------------------- f32-vbinary

// out[i] = x op y for i < n, in three forms: vv (x = a[i], y = b[i]), vs (x = a[i],
// y = b[0]) and sv (x = a[0], y = b[i]). out may be a or b (in place).
// add/sub/mul/div: IEEE; max = x < y ? y : x, min = y < x ? y : x (a NaN x is kept,
// a NaN y is not).
using F32VBinaryFn = void (*)(const float* a, const float* b, float* out, int64_t n);

struct F32VBinaryForms {
  F32VBinaryFn vv, vs, sv;
};

// The operators, once, like KILN_F32_VUNARY_OPS.
#define KILN_F32_VBINARY_OPS(X, ...) \
  X(add, __VA_ARGS__) X(sub, __VA_ARGS__) X(mul, __VA_ARGS__) X(div, __VA_ARGS__) X(max, __VA_ARGS__) X(min, __VA_ARGS__)

#define KILN_F32_VBINARY_FIELD(op, ...) F32VBinaryForms op;
struct F32VBinaryVariant {
  const char* name;  // e.g. "f32_vbinary__avx512"
  Isa isa;
  int lanes;
  KILN_F32_VBINARY_OPS(KILN_F32_VBINARY_FIELD, )
};
#undef KILN_F32_VBINARY_FIELD

std::span<const F32VBinaryVariant> f32_vbinary_variants();  // all built in, widest first, runnable or not
const F32VBinaryVariant& f32_vbinary_config();              // the selected one

// ---------------------------------------------------------------- f32-rows

// softmax of one row: out = e^(in - max) / sum (exp as math.h's exp_f; the sum in
// a fixed order: 16 partial sums, then the tail). out may be in.
using F32SoftmaxFn = void (*)(const float* in, float* out, int64_t n);
// softmax(in * scale + add) of one row (add: n floats, or null); out may be in, not add
using F32SoftmaxScaledFn = void (*)(const float* in, float scale, const float* add, float* out, int64_t n);
// out[j * ldo + i] = in[i * ldi + j] for i < rows, j < cols (in and out do not overlap)
using F32TransposeFn = void (*)(const float* in, int64_t ldi, int64_t rows, int64_t cols, float* out, int64_t ldo);

struct F32RowsVariant {
  const char* name;  // e.g. "f32_rows__avx512"
  Isa isa;
  int lanes;
  F32SoftmaxFn softmax;
  F32SoftmaxScaledFn softmax_scaled;
  F32TransposeFn transpose;
};

std::span<const F32RowsVariant> f32_rows_variants();  // all built in, widest first, runnable or not
const F32RowsVariant& f32_rows_config();              // the selected one

}  // namespace kiln::cpu
