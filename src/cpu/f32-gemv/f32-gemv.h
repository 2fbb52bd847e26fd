// Internal to kiln_cpu: the f32-gemv templates. Each f32-gemv-<isa>.cpp
// instantiates them inside functions compiled for its ISA (see ../isa.h); the
// loops are plain C++ that the compiler vectorizes for that ISA (main loops a
// multiple of 16 long, so that GCC's cheap vectorizer at -O2 takes them).
//
// A few rows (one token): a product is bound by reading W once, so the GEMM's
// register tiles (built for many rows) would only waste work. These stream W's
// rows in place.
#pragma once

#include "../isa.h"

#include <cstdint>

namespace kiln::cpu {
namespace {  // internal linkage: each variant's file keeps its own copy, built for its ISA

// out[0:rows, 0:n] += x[0:rows, 0:k] · W[0:k, 0:n] (row strides ldx, ldw, ldo).
KILN_CPU_INLINE void f32_gemv_axpy_rows(const float* __restrict x, int64_t ldx, int64_t rows, int64_t k,
                                        const float* __restrict w, int64_t ldw, int64_t n, float* __restrict out,
                                        int64_t ldo) {
  const int64_t nv = n & ~int64_t{15};
  int64_t p = 0;
  for (; p + 4 <= k; p += 4) {  // four rows of W per pass over out: a quarter of the out traffic
    const float *w0 = w + p * ldw, *w1 = w0 + ldw, *w2 = w1 + ldw, *w3 = w2 + ldw;
    for (int64_t r = 0; r < rows; ++r) {
      const float x0 = x[r * ldx + p], x1 = x[r * ldx + p + 1], x2 = x[r * ldx + p + 2], x3 = x[r * ldx + p + 3];
      float* o = out + r * ldo;
      for (int64_t j = 0; j < nv; ++j) o[j] += x0 * w0[j] + x1 * w1[j] + x2 * w2[j] + x3 * w3[j];
      for (int64_t j = nv; j < n; ++j) o[j] += x0 * w0[j] + x1 * w1[j] + x2 * w2[j] + x3 * w3[j];
    }
  }
  for (; p < k; ++p) {
    const float* wr = w + p * ldw;
    for (int64_t r = 0; r < rows; ++r) {
      const float xv = x[r * ldx + p];
      float* o = out + r * ldo;
      for (int64_t j = 0; j < nv; ++j) o[j] += xv * wr[j];
      for (int64_t j = nv; j < n; ++j) o[j] += xv * wr[j];
    }
  }
}

// dot(a[0:k], b[0:k]) in 16 partial sums.
KILN_CPU_INLINE float f32_gemv_dot(const float* __restrict a, const float* __restrict b, int64_t k) {
  float acc[16] = {};
  const int64_t kv = k & ~int64_t{15};
  for (int64_t i = 0; i < kv; i += 16)
    for (int j = 0; j < 16; ++j) acc[j] += a[i + j] * b[i + j];
  float sum = 0;
  for (int j = 0; j < 16; ++j) sum += acc[j];
  for (int64_t i = kv; i < k; ++i) sum += a[i] * b[i];
  return sum;
}

// out[r * ldo] = dot(x[r, 0:k], W[0:k, 0]) for r < rows: a one-column W (row stride
// ldw), for which the GEMM's wide register tiles would do 64x the work.
KILN_CPU_INLINE void f32_gemv_dot_rows(const float* __restrict x, int64_t ldx, int64_t rows, int64_t k,
                                       const float* __restrict w, int64_t ldw, float* __restrict out, int64_t ldo) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * ldx;
    float acc[16] = {};
    const int64_t kv = k & ~int64_t{15};
    for (int64_t i = 0; i < kv; i += 16)
      for (int j = 0; j < 16; ++j) acc[j] += xr[i + j] * w[(i + j) * ldw];
    float sum = 0;
    for (int j = 0; j < 16; ++j) sum += acc[j];
    for (int64_t i = kv; i < k; ++i) sum += xr[i] * w[i * ldw];
    out[r * ldo] = sum;
  }
}

// c[r * ldc + j] = a[r] · b[j]: the plain form (each dot product its own horizontal sum).
KILN_CPU_INLINE void f32_gemv_dot_block(const float* __restrict a, int64_t lda, int64_t m, const float* __restrict b,
                                        int64_t ldb, int64_t n, int64_t k, float* __restrict c, int64_t ldc) {
  for (int64_t j = 0; j < n; ++j)
    for (int64_t r = 0; r < m; ++r) c[r * ldc + j] = f32_gemv_dot(a + r * lda, b + j * ldb, k);
}

}  // namespace
}  // namespace kiln::cpu

// The three functions of one variant, compiled with `attr` (a target attribute, or nothing).
#define KILN_DEFINE_F32_GEMV(isa, attr)                                                                            \
  attr void f32_gemv_axpy_rows__##isa(const float* __restrict x, int64_t ldx, int64_t rows, int64_t k,             \
                                      const float* __restrict w, int64_t ldw, int64_t n, float* __restrict out,    \
                                      int64_t ldo) {                                                                \
    f32_gemv_axpy_rows(x, ldx, rows, k, w, ldw, n, out, ldo);                                                      \
  }                                                                                                                \
  attr float f32_gemv_dot__##isa(const float* __restrict a, const float* __restrict b, int64_t k) {                \
    return f32_gemv_dot(a, b, k);                                                                                  \
  }                                                                                                                \
  attr void f32_gemv_dot_rows__##isa(const float* __restrict x, int64_t ldx, int64_t rows, int64_t k,              \
                                     const float* __restrict w, int64_t ldw, float* __restrict out, int64_t ldo) { \
    f32_gemv_dot_rows(x, ldx, rows, k, w, ldw, out, ldo);                                                          \
  }

// dot_block from the template (the AVX-512 variant has its own: f32-gemv-dotblock-avx512.cpp).
#define KILN_DEFINE_F32_DOT_BLOCK(isa, attr)                                                                        \
  attr void f32_gemv_dot_block__##isa(const float* __restrict a, int64_t lda, int64_t m, const float* __restrict b, \
                                      int64_t ldb, int64_t n, int64_t k, float* __restrict c, int64_t ldc) {       \
    f32_gemv_dot_block(a, lda, m, b, ldb, n, k, c, ldc);                                                            \
  }
