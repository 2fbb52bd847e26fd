// The scalar instructions of dynamic programs: aten::sym_size.int (a tensor's
// size, read at run time) and ExecuTorch's executorch_prim arithmetic on the
// Int values shape arguments are computed from. Their calls carry
// [inputs..., result]: the result slot is the value they write (the executor
// passes it, see Program::load_method). Not operator-table rows: these take and
// return Scalars, not tensors, so they have no out-variant schema.
#include "kiln/runtime/kernel.h"

#include <cstring>
#include <string_view>

namespace kiln::rt::kernels {
namespace {

bool check_args(KernelContext& ctx, std::span<EValue*> args, size_t n, const char* op) {
  if (args.size() != n) {
    ctx.fail(Status::InvalidProgram, "%s: %zu arguments, expected %zu", op, args.size(), n);
    return false;
  }
  return true;
}

void sym_size_int(KernelContext& ctx, std::span<EValue*> args) {
  const char* op = "aten::sym_size.int";
  if (!check_args(ctx, args, 3, op)) return;
  if (!args[0]->is_tensor() || args[1]->tag != EValue::Tag::Int || args[2]->tag != EValue::Tag::Int) {
    ctx.fail(Status::InvalidProgram, "%s: expects (Tensor, int) -> int", op);
    return;
  }
  const Tensor& t = args[0]->tensor();
  int64_t d = args[1]->to_int();
  if (d < 0) d += t.dim;
  if (d < 0 || d >= t.dim) {
    ctx.fail(Status::InvalidArgument, "%s: dim %lld out of range for a rank-%d tensor", op,
             static_cast<long long>(args[1]->to_int()), t.dim);
    return;
  }
  args[2]->scalar.i = t.sizes[d];
}

enum class Arith { Add, Sub, Mul, FloorDiv, Mod, Max, Min };

template <Arith A>
void scalar_arith(KernelContext& ctx, std::span<EValue*> args) {
  const char* op = "executorch_prim arithmetic";
  if (!check_args(ctx, args, 3, op)) return;
  int64_t a = 0, b = 0;
  if (!args[0]->scalar_as_int(&a) || !args[1]->scalar_as_int(&b) || args[2]->tag != EValue::Tag::Int) {
    // Double operands: ExecuTorch's prims accept them; kiln emits and runs integer shape arithmetic.
    ctx.fail(Status::NotSupported, "%s: kiln's runtime computes integer (SymInt) values only", op);
    return;
  }
  int64_t r = 0;
  switch (A) {
    case Arith::Add: r = a + b; break;
    case Arith::Sub: r = a - b; break;
    case Arith::Mul: r = a * b; break;
    case Arith::Max: r = a > b ? a : b; break;
    case Arith::Min: r = a < b ? a : b; break;
    case Arith::FloorDiv:
    case Arith::Mod: {
      if (b == 0) {
        ctx.fail(Status::InvalidArgument, "%s: division by zero", op);
        return;
      }
      int64_t q = a / b;
      if ((a % b != 0) && ((a < 0) != (b < 0))) --q;  // Python's floor division
      r = A == Arith::FloorDiv ? q : a - q * b;
      break;
    }
  }
  args[2]->scalar.i = r;
}

// executorch_prim::et_view.default(Tensor self, int[] size) -> Tensor: ExecuTorch's view in
// dynamic programs. The result has no memory of its own: it is `self`'s bytes under `size`
// (one -1 entry inferred), set per call.
void et_view(KernelContext& ctx, std::span<EValue*> args) {
  const char* op = "executorch_prim::et_view";
  if (!check_args(ctx, args, 3, op)) return;
  if (!args[0]->is_tensor() || args[1]->tag != EValue::Tag::IntList || !args[2]->is_tensor()) {
    ctx.fail(Status::InvalidProgram, "%s: expects (Tensor, int[]) -> Tensor", op);
    return;
  }
  const Tensor& self = args[0]->tensor();
  Tensor& out = args[2]->tensor();
  std::span<const int64_t> size = args[1]->ints;
  if (size.size() > static_cast<size_t>(kMaxDims) || out.dtype != self.dtype || !self.is_contiguous()) {
    ctx.fail(Status::InvalidProgram, "%s: the view's rank, dtype or input layout is not supported", op);
    return;
  }
  int64_t shape[kMaxDims];
  int64_t known = 1;
  int inferred = -1;
  for (size_t d = 0; d < size.size(); ++d) {
    shape[d] = size[d];
    if (shape[d] == -1 && inferred < 0) { inferred = static_cast<int>(d); continue; }
    if (shape[d] < 0) {
      ctx.fail(Status::InvalidArgument, "%s: size %lld at dim %zu", op, static_cast<long long>(shape[d]), d);
      return;
    }
    known *= shape[d];
  }
  if (inferred >= 0) shape[inferred] = known == 0 ? 0 : self.numel / known;
  int64_t numel = 1;
  for (size_t d = 0; d < size.size(); ++d) numel *= shape[d];
  if (numel != self.numel) {
    ctx.fail(Status::InvalidArgument, "%s: a view of %lld elements as %lld", op, static_cast<long long>(self.numel),
             static_cast<long long>(numel));
    return;
  }
  out.data = self.data;
  out.capacity_bytes = self.nbytes();
  out.dim = static_cast<int32_t>(size.size());
  for (int32_t d = 0; d < out.dim; ++d) out.dim_order[d] = static_cast<uint8_t>(d);
  if (resize_tensor(out, std::span<const int64_t>(shape, size.size())) != Status::Ok)
    ctx.fail(Status::InvalidArgument, "%s: the view does not fit its input", op);
}

struct PrimEntry {
  std::string_view name, overload;
  KernelFn fn;
};

constexpr PrimEntry kPrims[] = {
    {"aten::sym_size", "int", sym_size_int},
    {"executorch_prim::add", "Scalar", scalar_arith<Arith::Add>},
    {"executorch_prim::sub", "Scalar", scalar_arith<Arith::Sub>},
    {"executorch_prim::mul", "Scalar", scalar_arith<Arith::Mul>},
    {"executorch_prim::floordiv", "Scalar", scalar_arith<Arith::FloorDiv>},
    {"executorch_prim::mod", "Scalar", scalar_arith<Arith::Mod>},
    {"executorch_prim::mod", "int", scalar_arith<Arith::Mod>},
    {"executorch_prim::sym_max", "Scalar", scalar_arith<Arith::Max>},
    {"executorch_prim::sym_min", "Scalar", scalar_arith<Arith::Min>},
    {"executorch_prim::et_view", "default", et_view},
};

}  // namespace

KernelFn find_prim_kernel(std::string_view name, std::string_view overload) {
  for (const PrimEntry& e : kPrims)
    if (e.name == name && e.overload == overload) return e.fn;
  return nullptr;
}

size_t prim_kernel_count() { return sizeof(kPrims) / sizeof(kPrims[0]); }

}  // namespace kiln::rt::kernels
