// Copies and dtype conversion: alias_copy, clone, _to_copy, the dim-order
// clone/copy, copy (src broadcast into self's shape and dtype), and the dim-order
// empty (a shape, no contents).
//
// Inputs and outs are contiguous; a same-dtype copy moves bytes, a conversion
// goes through util/strided_copy.h's row converters. These copies (not the dim-order empty) also take
// complex64 / complex128 tensors, the only kernels that do: a program may convert to complex and return it.
#include "util/register.h"
#include "util/shape_checks.h"

#include <optional>

namespace kiln::rt::kernels {
namespace {

// alias_copy, clone and the dim-order clone: out <- self, same dtype and shape.
void same_shape_copy(KernelContext& ctx, const char* op, const Tensor& self, Tensor& out) {
  if (prepare_same_dtype_out(ctx, op, self, out, self.shape())) copy_bytes(self, out);
}

// _to_copy and the dim-order copy: out <- self in out's dtype, self's shape.
void converting_copy(KernelContext& ctx, const char* op, const Tensor& self, Tensor& out) {
  if (prepare_out(ctx, op, out, self.shape())) convert_into(ctx, op, self, out);
}

void alias_copy_out(KernelContext& ctx, const Tensor& self, Tensor& out) {
  same_shape_copy(ctx, "aten::alias_copy.out", self, out);
}

void clone_out(KernelContext& ctx, const Tensor& self, std::optional<MemoryFormat> memory_format, Tensor& out) {
  const char* op = "aten::clone.out";
  if (check_memory_format(ctx, op, memory_format)) same_shape_copy(ctx, op, self, out);
}

void to_copy_out(KernelContext& ctx, const Tensor& self, bool /*non_blocking*/,
                 std::optional<MemoryFormat> memory_format, Tensor& out) {
  const char* op = "aten::_to_copy.out";
  if (check_memory_format(ctx, op, memory_format)) converting_copy(ctx, op, self, out);
}

// The dim_order argument of the dim-order ops: None or the identity (contiguous).
bool check_dim_order(KernelContext& ctx, const char* op, std::optional<IntArrayRef> dim_order, int32_t rank) {
  if (!dim_order) return true;
  const IntArrayRef order = *dim_order;
  if (order.size() != static_cast<size_t>(rank)) {
    ctx.fail(Status::InvalidArgument, "%s: dim_order %s does not match a %d-d tensor", op, ShapeText(order).buf, rank);
    return false;
  }
  bool seen[kMaxDims] = {};
  bool identity = true;
  for (size_t i = 0; i < order.size(); ++i) {
    const int64_t d = order[i];
    if (d < 0 || d >= rank || seen[d]) {
      ctx.fail(Status::InvalidArgument, "%s: dim_order %s is not a permutation", op, ShapeText(order).buf);
      return false;
    }
    seen[d] = true;
    identity = identity && d == static_cast<int64_t>(i);
  }
  if (!identity) {
    ctx.fail(Status::NotSupported, "%s: dim_order %s is not supported (contiguous only)", op, ShapeText(order).buf);
    return false;
  }
  return true;
}

void clone_dim_order_out(KernelContext& ctx, const Tensor& self, bool /*non_blocking*/,
                         std::optional<IntArrayRef> dim_order, Tensor& out) {
  const char* op = "dim_order_ops::_clone_dim_order.out";
  if (check_dim_order(ctx, op, dim_order, self.dim)) same_shape_copy(ctx, op, self, out);
}

void to_dim_order_copy_out(KernelContext& ctx, const Tensor& self, bool /*non_blocking*/,
                           std::optional<IntArrayRef> dim_order, Tensor& out) {
  const char* op = "dim_order_ops::_to_dim_order_copy.out";
  if (check_dim_order(ctx, op, dim_order, self.dim)) converting_copy(ctx, op, self, out);
}

// copy.out: src broadcast to self's shape, converted to self's dtype.
void copy_out(KernelContext& ctx, const Tensor& self, const Tensor& src, bool /*non_blocking*/, Tensor& out) {
  const char* op = "aten::copy.out";
  if (!check_out_dtype(ctx, out, self.dtype, op)) return;
  int64_t src_strides[kMaxDims], dst_strides[kMaxDims];
  if (!broadcast_strides(src.dim, src.sizes, self.dim, self.sizes, src_strides)) {
    ctx.fail(Status::InvalidArgument, "%s: src of shape %s does not broadcast to %s", op, ShapeText(src.shape()).buf,
             ShapeText(self.shape()).buf);
    return;
  }
  if (!prepare_out(ctx, op, out, self.shape())) return;
  contiguous_strides(self.dim, self.sizes, dst_strides);
  copy_region(ctx, op, out, 0, dst_strides, src, 0, src_strides, self.dim, self.sizes);
}

// _empty_dim_order.out: out takes `size`; its contents are left as they are (uninitialized).
void empty_dim_order_out(KernelContext& ctx, IntArrayRef size, std::optional<IntArrayRef> dim_order, Tensor& out) {
  const char* op = "dim_order_ops::_empty_dim_order.out";
  int64_t numel = 0;
  if (checked_numel(ctx, op, size, &numel) && check_dim_order(ctx, op, dim_order, static_cast<int32_t>(size.size())))
    prepare_out(ctx, op, out, size);
}

}  // namespace

KILN_KERNEL_COMPLEX(alias_copy_out, alias_copy_out);
KILN_KERNEL_COMPLEX(clone_out, clone_out);
KILN_KERNEL_COMPLEX(to_copy_out, to_copy_out);
KILN_KERNEL_COMPLEX(dim_order_clone_dim_order_out, clone_dim_order_out);
KILN_KERNEL_COMPLEX(dim_order_to_dim_order_copy_out, to_dim_order_copy_out);
KILN_KERNEL_COMPLEX(copy_out, copy_out);
KILN_KERNEL(dim_order_empty_dim_order_out, empty_dim_order_out);

}  // namespace kiln::rt::kernels
