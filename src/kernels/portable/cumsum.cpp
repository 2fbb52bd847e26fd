// cumsum along one dim, in the out dtype: a double running sum for floating
// dtypes, wrapping int64 for integers (as torch's out= variant), chunk by chunk
// through a stack buffer.
#include "util/reduce.h"
#include "util/register.h"

#include <optional>

namespace kiln::rt::kernels {

namespace {

// cumsum.out: (self, int dim, ScalarType? dtype, out)
void cumsum(KernelContext& ctx, const Tensor& in, int64_t dim_arg, std::optional<ScalarType> dtype, Tensor& out) {
  const char* name = "aten::cumsum.out";
  if (dtype && !check_out_dtype(ctx, out, *dtype, name)) return;
  const ScalarType compute = out.dtype;
  if (compute == ScalarType::Bool) {
    ctx.fail(Status::InvalidArgument, "%s: not implemented for dtype bool", name);
    return;
  }
  int32_t dim;
  if (!wrap_dim(ctx, dim_arg, in.dim, name, &dim)) return;
  if (!resize_out(ctx, out, in.shape(), name)) return;
  if (in.numel == 0) return;
  const Lines l = lines_along(in, dim);
  dispatch<kRealTypes>(compute, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using L = sum_load_t<T>;  // the running sum's type too (sum_acc_t<T>, bool aside)
    alignas(64) L buf[kChunk];
    for_each_line(l, [&](int64_t base) {
      L acc = 0;
      for_each_chunk(l.n, [&](int64_t s, int64_t m) {
        load_chunk<L>(in, base + s * l.inner, l.inner, m, compute, buf);
        for (int64_t i = 0; i < m; ++i) {
          acc = add_as<T>(acc, buf[i]);
          buf[i] = acc;
        }
        store_as<L>(buf, elem_ptr(out, base + s * l.inner), out.dtype, l.inner, m);
      });
    });
  });
}

}  // namespace

KILN_KERNEL(cumsum_out, cumsum);

}  // namespace kiln::rt::kernels
