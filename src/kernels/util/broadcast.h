// numpy broadcasting of shapes for kiln's portable kernels (size-0 dims included).
#pragma once

#include "args.h"

#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <span>

namespace kiln::rt::kernels {

// Broadcasts shapes a and b into out; false when they are incompatible.
inline bool broadcast_shape(std::span<const int64_t> a, std::span<const int64_t> b, int64_t* out, int32_t* out_dim) {
  size_t n = a.size() > b.size() ? a.size() : b.size();
  if (n > static_cast<size_t>(kMaxDims)) return false;
  for (size_t k = 0; k < n; ++k) {
    int64_t sa = k < a.size() ? a[a.size() - 1 - k] : 1;
    int64_t sb = k < b.size() ? b[b.size() - 1 - k] : 1;
    if (sa != sb && sa != 1 && sb != 1) return false;
    out[n - 1 - k] = sa == 1 ? sb : sa;
  }
  *out_dim = static_cast<int32_t>(n);
  return true;
}

// Broadcast shape of several tensors; fails through ctx when incompatible.
inline bool broadcast_tensors_shape(KernelContext& ctx, std::initializer_list<const Tensor*> ts, int64_t* out,
                                    int32_t* out_dim, const char* op) {
  *out_dim = 0;
  for (const Tensor* t : ts) {
    int64_t tmp[kMaxDims];
    int32_t nd;
    if (!broadcast_shape(std::span<const int64_t>(out, static_cast<size_t>(*out_dim)), t->shape(), tmp, &nd)) {
      char s1[160], s2[160];
      ctx.fail(Status::InvalidArgument, "%s: shapes %s and %s are not broadcastable", op,
               format_shape(s1, sizeof(s1), std::span<const int64_t>(out, static_cast<size_t>(*out_dim))),
               format_shape(s2, sizeof(s2), t->shape()));
      return false;
    }
    std::memcpy(out, tmp, sizeof(int64_t) * static_cast<size_t>(nd));
    *out_dim = nd;
  }
  return true;
}

}  // namespace kiln::rt::kernels
