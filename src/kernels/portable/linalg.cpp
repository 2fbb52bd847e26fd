// Matrix kernels: mm, bmm, addmm. The fp32 products run on kiln::cpu::sgemm (src/cpu/f32-gemm);
// other dtypes use a straightforward blocked loop (float accumulation for
// float16/bfloat16, wrapping integer arithmetic for integers).
#include "kiln/cpu/gemm.h"
#include "util/register.h"

#include <cstring>
#include <type_traits>

namespace kiln::rt::kernels {

using cpu::sgemm;

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

// A [m, k] · B [k', n] needs k' == k.
bool check_inner_dims(KernelContext& ctx, const Tensor& a, const Tensor& b, const char* name) {
  if (b.sizes[0] == a.sizes[1]) return true;
  ctx.fail(Status::InvalidArgument, "%s: shapes [%lld, %lld] and [%lld, %lld] cannot be multiplied", name,
           static_cast<long long>(a.sizes[0]), static_cast<long long>(a.sizes[1]), static_cast<long long>(b.sizes[0]),
           static_cast<long long>(b.sizes[1]));
  return false;
}

// mm.out: (self [m,k], mat2 [k,n], out [m,n])
void mm_out(KernelContext& ctx, const Tensor& self, const Tensor& mat2, Tensor& out_t) {
  const char* name = "aten::mm.out";
  const Tensor *a = &self, *b = &mat2;
  Tensor* out = &out_t;
  if (!check_rank(ctx, *a, 2, "self", name) || !check_rank(ctx, *b, 2, "mat2", name)) return;
  const int64_t m = a->sizes[0], k = a->sizes[1], n = b->sizes[1];
  if (!check_matmul_dtypes(ctx, *a, *b, *out, name, m * k * n == 0)) return;
  if (!check_inner_dims(ctx, *a, *b, name)) return;
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
void bmm_out(KernelContext& ctx, const Tensor& self, const Tensor& mat2, Tensor& out_t) {
  const char* name = "aten::bmm.out";
  const Tensor *a = &self, *b = &mat2;
  Tensor* out = &out_t;
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
void addmm_out(KernelContext& ctx, const Tensor& self, const Tensor& mat1, const Tensor& mat2, Scalar beta,
               Scalar alpha, Tensor& out_t) {
  const char* name = "aten::addmm.out";
  const Tensor *bias = &self, *a = &mat1, *b = &mat2;
  Tensor* out = &out_t;
  if (!check_rank(ctx, *a, 2, "mat1", name) || !check_rank(ctx, *b, 2, "mat2", name)) return;
  if (!check_matmul_dtypes(ctx, *a, *b, *out, name)) return;
  if (bias->dtype != a->dtype) {
    ctx.fail(Status::InvalidArgument, "%s: self and mat2 must have the same dtype, got %s and %s", name,
             dtype_str(bias->dtype), dtype_str(a->dtype));
    return;
  }
  const int64_t m = a->sizes[0], k = a->sizes[1], n = b->sizes[1];
  if (!check_inner_dims(ctx, *a, *b, name)) return;
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


}  // namespace

KILN_KERNEL(mm_out, mm_out);
KILN_KERNEL(bmm_out, bmm_out);
KILN_KERNEL(addmm_out, addmm_out);

}  // namespace kiln::rt::kernels
