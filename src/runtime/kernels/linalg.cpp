// Matrix kernels: mm, bmm, addmm, and the fp32 GEMM core they share.
//
// The GEMM (Goto-style, simplified for inference shapes): K is cut into blocks
// of KC; for each block, B is packed one NR-wide column panel at a time into a
// stack buffer (32 KiB, 192 KiB for AVX-512: L1 / L2 resident; packing also avoids
// the cache-set conflicts that power-of-two row strides cause), and every
// MR-row tile of A sweeps that panel with an MR x NR register tile of
// accumulators. A is read in place (its M x KC block stays in L2 across all
// panels). The micro-kernel is written with GCC/Clang vector extensions, so the
// same source compiles to AVX-512, AVX2+FMA or the baseline ISA (SSE2 / NEON);
// the variant is picked once at run time. Single-threaded.
// Other dtypes use a straightforward blocked loop (float accumulation for
// float16/bfloat16, wrapping integer arithmetic for integers).
#include "gemm.h"
#include "kernel_tables.h"
#include "kernel_util.h"

#include <cstring>
#include <type_traits>

namespace kiln::rt::kernels {
namespace {

#define KILN_ALWAYS_INLINE inline __attribute__((always_inline))

template <int kBytes>
struct VecOf {
  typedef float type __attribute__((vector_size(kBytes)));
  typedef float unaligned __attribute__((vector_size(kBytes), aligned(4)));  // aliases float, as GCC's vectors do
};

// Vector loads/stores through references (vector values never cross a function boundary: psabi).
template <typename V>
KILN_ALWAYS_INLINE void load_v(V& v, const float* p) {
  using U = typename VecOf<sizeof(V)>::unaligned;
  v = *reinterpret_cast<const U*>(p);
}
template <typename V>
KILN_ALWAYS_INLINE void store_v(float* p, const V& v) {
  using U = typename VecOf<sizeof(V)>::unaligned;
  *reinterpret_cast<U*>(p) = v;
}

// Copies B[0:kc, 0:nr] (row stride ldb) into bp as kc rows of NR floats, zero-padding columns >= nr.
template <int NR>
KILN_ALWAYS_INLINE void pack_b(const float* b, int64_t ldb, int64_t kc, int64_t nr, float* bp) {
  if (nr == NR) {
    for (int64_t k = 0; k < kc; ++k) std::memcpy(bp + k * NR, b + k * ldb, sizeof(float) * NR);
  } else {
    for (int64_t k = 0; k < kc; ++k) {
      int64_t j = 0;
      for (; j < nr; ++j) bp[k * NR + j] = b[k * ldb + j];
      for (; j < NR; ++j) bp[k * NR + j] = 0.0f;
    }
  }
}

// One MR x NR tile: C[0:mr, 0:nr] = alpha * A[0:mr, 0:kc] · Bp + (load_c ? C : 0).
// Rows of A past mr repeat the last valid row (their results are discarded).
template <int MR, int NV, typename V>
KILN_ALWAYS_INLINE void micro_tile(int64_t kc, const float* a, int64_t lda, int64_t mr, const float* bp, float* c,
                                   int64_t ldc, int64_t nr, float alpha, bool load_c) {
  constexpr int VL = static_cast<int>(sizeof(V) / sizeof(float));
  constexpr int NR = NV * VL;
  const float* ar[MR];
  for (int i = 0; i < MR; ++i) ar[i] = a + (i < mr ? i : mr - 1) * lda;
  V acc[MR][NV];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NV; ++j) acc[i][j] = V{};
  for (int64_t k = 0; k < kc; ++k) {
    V bv[NV];
#pragma GCC unroll 8
    for (int j = 0; j < NV; ++j) load_v<V>(bv[j], bp + k * NR + j * VL);
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
      const float a_ik = ar[i][k];
      const V av = a_ik - V{};  // a broadcast (x - 0 folds to x; x + 0 would not: -0 + 0 = +0)
#pragma GCC unroll 8
      for (int j = 0; j < NV; ++j) acc[i][j] += av * bv[j];
    }
  }
  if (mr == MR && nr == NR) {
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 8
      for (int j = 0; j < NV; ++j) {
        V r = acc[i][j] * alpha;
        if (load_c) {
          V old;
          load_v<V>(old, c + i * ldc + j * VL);
          r += old;
        }
        store_v<V>(c + i * ldc + j * VL, r);
      }
    }
    return;
  }
  alignas(64) float tile[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NV; ++j) store_v<V>(&tile[i][j * VL], acc[i][j]);
  for (int64_t i = 0; i < mr; ++i)
    for (int64_t j = 0; j < nr; ++j) {
      const float r = alpha * tile[i][j];
      c[i * ldc + j] = load_c ? c[i * ldc + j] + r : r;
    }
}

// KC: rows of a packed B panel; the default keeps the panel at 32 KiB (L1).
template <int MR, int NV, typename V, int64_t KC = 32 * 1024 / (NV * static_cast<int64_t>(sizeof(V)))>
KILN_ALWAYS_INLINE void sgemm_blocked(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                                      const float* b, int64_t ldb, bool accumulate, float* c, int64_t ldc) {
  constexpr int VL = static_cast<int>(sizeof(V) / sizeof(float));
  constexpr int NR = NV * VL;
  alignas(64) float bp[KC * NR];
  for (int64_t pc = 0; pc < k; pc += KC) {
    const int64_t kc = k - pc < KC ? k - pc : KC;
    const bool load_c = accumulate || pc > 0;
    for (int64_t jr = 0; jr < n; jr += NR) {
      const int64_t nr = n - jr < NR ? n - jr : NR;
      pack_b<NR>(b + pc * ldb + jr, ldb, kc, nr, bp);
      for (int64_t ir = 0; ir < m; ir += MR) {
        const int64_t mr = m - ir < MR ? m - ir : MR;
        if (ir + MR < m) {  // the next tile's rows of C: ldc apart, too far for the hardware prefetcher
          const int64_t next_mr = m - ir - MR < MR ? m - ir - MR : MR;
          for (int64_t i = 0; i < next_mr; ++i)
            for (int64_t j = 0; j < nr; j += 16) __builtin_prefetch(c + (ir + MR + i) * ldc + jr + j, 1, 3);
        }
        micro_tile<MR, NV, V>(kc, a + ir * lda + pc, lda, mr, bp, c + ir * ldc + jr, ldc, nr, alpha, load_c);
      }
    }
  }
}

using SgemmFn = void (*)(int64_t, int64_t, int64_t, float, const float*, int64_t, const float*, int64_t, bool,
                         float*, int64_t);

// Register tiles: MR rows x NV vectors. The baseline ISA has 16 vector registers
// (SSE2 / NEON: 6 x 8 floats, 12 accumulators), AVX2 has 16 (6 x 16), AVX-512 has
// 32 (4 x 64: 16 accumulators, 4 B vectors, one broadcast; with KC = 768 the
// 192 KiB B panel sits in L2, which feeds it fast enough, and C is revisited
// less: GPT-2's K = 768 layers accumulate in one pass. Measured on the AVX-512
// machine against KC = 128/192/256/384: 2-5% faster, bench/kernels/gemm_bench.cpp).
void sgemm_generic(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda, const float* b,
                   int64_t ldb, bool accumulate, float* c, int64_t ldc) {
  sgemm_blocked<6, 2, VecOf<16>::type>(m, n, k, alpha, a, lda, b, ldb, accumulate, c, ldc);
}

#if defined(__x86_64__) && defined(__GNUC__)
#define KILN_GEMM_X86 1
__attribute__((target("avx2,fma"))) void sgemm_avx2(int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                                                    int64_t lda, const float* b, int64_t ldb, bool accumulate,
                                                    float* c, int64_t ldc) {
  sgemm_blocked<6, 2, VecOf<32>::type>(m, n, k, alpha, a, lda, b, ldb, accumulate, c, ldc);
}

__attribute__((target("avx512f,fma"))) void sgemm_avx512(int64_t m, int64_t n, int64_t k, float alpha,
                                                         const float* a, int64_t lda, const float* b, int64_t ldb,
                                                         bool accumulate, float* c, int64_t ldc) {
  sgemm_blocked<4, 4, VecOf<64>::type, 768>(m, n, k, alpha, a, lda, b, ldb, accumulate, c, ldc);
}
#endif

// The function for an ISA, or nullptr when this build or CPU lacks it.
SgemmFn sgemm_fn(SgemmIsa isa) {
  switch (isa) {
    case SgemmIsa::Generic: return sgemm_generic;
#ifdef KILN_GEMM_X86
    case SgemmIsa::Avx2:
      __builtin_cpu_init();
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? sgemm_avx2 : nullptr;
    case SgemmIsa::Avx512:
      __builtin_cpu_init();
      return __builtin_cpu_supports("avx512f") ? sgemm_avx512 : nullptr;
#endif
    default: return nullptr;
  }
}

SgemmIsa pick_isa() {
  for (SgemmIsa isa : {SgemmIsa::Avx512, SgemmIsa::Avx2})
    if (sgemm_fn(isa) != nullptr) return isa;
  return SgemmIsa::Generic;
}

struct SgemmChoice {
  SgemmIsa isa;
  SgemmFn fn;
};

const SgemmChoice& sgemm_choice() {
  static const SgemmChoice choice = [] {
    const SgemmIsa isa = pick_isa();
    return SgemmChoice{isa, sgemm_fn(isa)};
  }();
  return choice;
}

// Degenerate sizes, handled the same on every path; false when there is nothing more to do.
bool sgemm_needs_work(int64_t m, int64_t n, int64_t k, bool accumulate, float* c, int64_t ldc) {
  if (m <= 0 || n <= 0) return false;
  if (k <= 0) {
    if (!accumulate)
      for (int64_t i = 0; i < m; ++i) std::memset(c + i * ldc, 0, sizeof(float) * static_cast<size_t>(n));
    return false;
  }
  return true;
}

}  // namespace

void sgemm(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda, const float* b, int64_t ldb,
           bool accumulate, float* c, int64_t ldc) {
  if (sgemm_needs_work(m, n, k, accumulate, c, ldc))
    sgemm_choice().fn(m, n, k, alpha, a, lda, b, ldb, accumulate, c, ldc);
}

bool sgemm_with(SgemmIsa isa, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                const float* b, int64_t ldb, bool accumulate, float* c, int64_t ldc) {
  SgemmFn fn = sgemm_fn(isa);
  if (fn == nullptr) return false;
  if (sgemm_needs_work(m, n, k, accumulate, c, ldc)) fn(m, n, k, alpha, a, lda, b, ldb, accumulate, c, ldc);
  return true;
}

SgemmIsa sgemm_isa() { return sgemm_choice().isa; }

const char* sgemm_isa_name(SgemmIsa isa) {
  switch (isa) {
    case SgemmIsa::Avx512: return "avx512";
    case SgemmIsa::Avx2: return "avx2";
    default: return "generic";
  }
}

namespace {

// ---------------------------------------------------------------------------
// Other dtypes: C = alpha * A·B + (accumulate ? C : 0) in accumulator type Acc,
// j-blocked so the accumulator row is a stack buffer.

template <typename T>
using mm_acc_t = std::conditional_t<is_float_v<T>, compute_t<T>, int64_t>;

template <typename A>
inline A wrap_mul_add(A acc, A x, A y) {
  if constexpr (std::is_same_v<A, int64_t>) {
    return static_cast<int64_t>(static_cast<uint64_t>(acc) + static_cast<uint64_t>(x) * static_cast<uint64_t>(y));
  } else {
    return acc + x * y;
  }
}

template <typename T>
void gemm_generic(int64_t m, int64_t n, int64_t k, mm_acc_t<T> alpha, const T* a, const T* b, bool accumulate, T* c) {
  using Acc = mm_acc_t<T>;
  alignas(64) Acc acc[kChunk];
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j0 = 0; j0 < n; j0 += kChunk) {
      const int64_t nb = n - j0 < kChunk ? n - j0 : kChunk;
      for (int64_t j = 0; j < nb; ++j) acc[j] = 0;
      for (int64_t p = 0; p < k; ++p) {
        const Acc x = convert<Acc>(a[i * k + p]);
        const T* brow = b + p * n + j0;
        for (int64_t j = 0; j < nb; ++j) acc[j] = wrap_mul_add<Acc>(acc[j], x, convert<Acc>(brow[j]));
      }
      T* crow = c + i * n + j0;
      for (int64_t j = 0; j < nb; ++j) {
        Acc r = wrap_mul_add<Acc>(Acc(0), alpha, acc[j]);
        if (accumulate) r = wrap_mul_add<Acc>(r, convert<Acc>(crow[j]), Acc(1));
        crow[j] = convert<T>(r);
      }
    }
  }
}

// One matrix product of any supported dtype (A [m,k], B [k,n], C [m,n], contiguous).
template <typename T>
void matmul(int64_t m, int64_t n, int64_t k, const Scalar& alpha, const T* a, const T* b, bool accumulate, T* c) {
  if constexpr (std::is_same_v<T, float>) {
    sgemm(m, n, k, alpha.as<float>(), a, k, b, n, accumulate, c, n);
  } else {
    gemm_generic<T>(m, n, k, alpha.as<mm_acc_t<T>>(), a, b, accumulate, c);
  }
}

constexpr unsigned kMatmulTypes = kRealTypes;  // everything but bool, as torch on CPU

// `empty`: the product has no multiply-adds (torch then accepts any dtype, bool too).
bool check_matmul_dtypes(KernelContext& ctx, const Tensor& a, const Tensor& b, const Tensor& out, const char* name,
                         bool empty = false) {
  if (a.dtype != b.dtype) {
    ctx.fail(Status::InvalidArgument, "%s: expected both matrices to have the same dtype, got %s and %s", name,
             dtype_str(a.dtype), dtype_str(b.dtype));
    return false;
  }
  if (!empty && !in_set(a.dtype, kMatmulTypes)) {
    ctx.fail(Status::InvalidArgument, "%s: not implemented for dtype %s", name, dtype_str(a.dtype));
    return false;
  }
  return check_out_dtype(ctx, out, a.dtype, name);
}

bool check_rank(KernelContext& ctx, const Tensor& t, int32_t rank, const char* what, const char* name) {
  if (t.dim == rank) return true;
  ctx.fail(Status::InvalidArgument, "%s: %s must have rank %d, got %d", name, what, rank, t.dim);
  return false;
}

#define KILN_NARGS(n, name) \
  if (!check_nargs(ctx, args, n, name)) return

// mm.out: (self [m,k], mat2 [k,n], out [m,n])
void mm(KernelContext& ctx, std::span<EValue*> args) {
  const char* name = "aten::mm.out";
  KILN_NARGS(3, name);
  Tensor* a = tensor_arg(ctx, args, 0, name);
  Tensor* b = a ? tensor_arg(ctx, args, 1, name) : nullptr;
  Tensor* out = b ? tensor_arg(ctx, args, 2, name) : nullptr;
  if (out == nullptr) return;
  if (!check_rank(ctx, *a, 2, "self", name) || !check_rank(ctx, *b, 2, "mat2", name)) return;
  const int64_t m = a->sizes[0], k = a->sizes[1], n = b->sizes[1];
  if (!check_matmul_dtypes(ctx, *a, *b, *out, name, m * k * n == 0)) return;
  if (b->sizes[0] != k) {
    ctx.fail(Status::InvalidArgument, "%s: shapes [%lld, %lld] and [%lld, %lld] cannot be multiplied", name,
             static_cast<long long>(m), static_cast<long long>(k), static_cast<long long>(b->sizes[0]),
             static_cast<long long>(n));
    return;
  }
  const int64_t shape[2] = {m, n};
  if (!resize_out(ctx, *out, shape, name)) return;
  if (m * k * n == 0) {
    std::memset(out->data, 0, out->nbytes());  // zero bits are zero in every dtype
    return;
  }
  Scalar one;
  one.i = 1;
  dispatch<kMatmulTypes>(a->dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    matmul<T>(m, n, k, one, a->data_as<const T>(), b->data_as<const T>(), false, out->data_as<T>());
  });
}

// bmm.out: (self [b,m,k], mat2 [b,k,n], out [b,m,n])
void bmm(KernelContext& ctx, std::span<EValue*> args) {
  const char* name = "aten::bmm.out";
  KILN_NARGS(3, name);
  Tensor* a = tensor_arg(ctx, args, 0, name);
  Tensor* b = a ? tensor_arg(ctx, args, 1, name) : nullptr;
  Tensor* out = b ? tensor_arg(ctx, args, 2, name) : nullptr;
  if (out == nullptr) return;
  if (!check_rank(ctx, *a, 3, "self", name) || !check_rank(ctx, *b, 3, "mat2", name)) return;
  const int64_t batch = a->sizes[0], m = a->sizes[1], k = a->sizes[2], n = b->sizes[2];
  if (!check_matmul_dtypes(ctx, *a, *b, *out, name, batch * m * k * n == 0)) return;
  if (b->sizes[0] != batch || b->sizes[1] != k) {
    char s1[160], s2[160];
    ctx.fail(Status::InvalidArgument, "%s: batched shapes %s and %s cannot be multiplied", name,
             format_shape(s1, sizeof(s1), a->shape()), format_shape(s2, sizeof(s2), b->shape()));
    return;
  }
  const int64_t shape[3] = {batch, m, n};
  if (!resize_out(ctx, *out, shape, name)) return;
  if (batch * m * k * n == 0) {
    std::memset(out->data, 0, out->nbytes());
    return;
  }
  Scalar one;
  one.i = 1;
  dispatch<kMatmulTypes>(a->dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* pa = a->data_as<const T>();
    const T* pb = b->data_as<const T>();
    T* pc = out->data_as<T>();
    for (int64_t i = 0; i < batch; ++i) matmul<T>(m, n, k, one, pa + i * m * k, pb + i * k * n, false, pc + i * m * n);
  });
}

// addmm.out: (self (broadcastable to [m,n]), mat1 [m,k], mat2 [k,n], Scalar beta, Scalar alpha, out [m,n])
void addmm(KernelContext& ctx, std::span<EValue*> args) {
  const char* name = "aten::addmm.out";
  KILN_NARGS(6, name);
  Tensor* bias = tensor_arg(ctx, args, 0, name);
  Tensor* a = bias ? tensor_arg(ctx, args, 1, name) : nullptr;
  Tensor* b = a ? tensor_arg(ctx, args, 2, name) : nullptr;
  Tensor* out = b ? tensor_arg(ctx, args, 5, name) : nullptr;
  if (out == nullptr) return;
  Scalar beta, alpha;
  if (!scalar_arg(ctx, args, 3, name, &beta) || !scalar_arg(ctx, args, 4, name, &alpha)) return;
  if (!check_rank(ctx, *a, 2, "mat1", name) || !check_rank(ctx, *b, 2, "mat2", name)) return;
  if (!check_matmul_dtypes(ctx, *a, *b, *out, name)) return;
  if (bias->dtype != a->dtype) {
    ctx.fail(Status::InvalidArgument, "%s: self and mat2 must have the same dtype, got %s and %s", name,
             dtype_str(bias->dtype), dtype_str(a->dtype));
    return;
  }
  const int64_t m = a->sizes[0], k = a->sizes[1], n = b->sizes[1];
  if (b->sizes[0] != k) {
    ctx.fail(Status::InvalidArgument, "%s: shapes [%lld, %lld] and [%lld, %lld] cannot be multiplied", name,
             static_cast<long long>(m), static_cast<long long>(k), static_cast<long long>(b->sizes[0]),
             static_cast<long long>(n));
    return;
  }
  const int64_t shape[2] = {m, n};
  int64_t bshape[kMaxDims];
  int32_t bnd;
  if (bias->dim > 2 || !broadcast_shape(bias->shape(), shape, bshape, &bnd) || bshape[0] != m || bshape[1] != n) {
    char s1[160];
    ctx.fail(Status::InvalidArgument, "%s: self of shape %s cannot be broadcast to [%lld, %lld]", name,
             format_shape(s1, sizeof(s1), bias->shape()), static_cast<long long>(m), static_cast<long long>(n));
    return;
  }
  if (!resize_out(ctx, *out, shape, name)) return;
  dispatch<kMatmulTypes>(a->dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using C = mm_acc_t<T>;
    const C beta_c = beta.as<C>();
    const bool use_bias = beta_c != C(0);  // beta = 0: self is ignored (NaN included), as torch
    if (use_bias) {
      // out = beta * self, broadcast
      const ElementwisePlan plan = make_plan(*out, {bias});
      map_elements<compute_t<T>, compute_t<T>>(
          plan, [beta_c](compute_t<T> x) { return static_cast<compute_t<T>>(wrap_mul_add<C>(C(0), beta_c, x)); });
    }
    matmul<T>(m, n, k, alpha, a->data_as<const T>(), b->data_as<const T>(), use_bias, out->data_as<T>());
  });
}

#undef KILN_NARGS

const KernelEntry kLinalg[] = {
    {"aten::mm", "out", mm},
    {"aten::bmm", "out", bmm},
    {"aten::addmm", "out", addmm},
};

}  // namespace

std::span<const KernelEntry> linear_algebra_kernels() { return kLinalg; }

}  // namespace kiln::rt::kernels
