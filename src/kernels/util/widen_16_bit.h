// Float32 kernels run for float16 / bfloat16 tensors (register.h: KILN_KERNEL_WIDENS_16_BIT): every 16-bit
// tensor argument widened into a float32 copy, the kernel run on the copies, each out argument rounded back
// to its 16-bit type (nearest, ties to even) -- what torch's CPU kernels of those types do for the operators
// marked so (pooling, interpolation, padding, batch and group norm: arithmetic in float32, one rounding at
// the end). The 16-bit path allocates its copies; a float32 call is passed through untouched.
#pragma once

#include "kiln/runtime/evalue.h"
#include "kiln/runtime/kernel.h"
#include "kiln/runtime/tensor.h"

#include "dtype.h"

#include <algorithm>
#include <array>
#include <cstddef>
#include <memory>
#include <new>
#include <span>

namespace kiln::rt::kernels {

inline void run_widened_16_bit(KernelContext& ctx, std::span<EValue*> args, size_t num_outs, KernelFn f) {
  ScalarType narrow = ScalarType::Float;
  for (EValue* e : args) {
    if (e == nullptr || !e->is_tensor()) continue;
    const ScalarType d = e->tensor().dtype;
    if (d != ScalarType::Half && d != ScalarType::BFloat16) continue;
    if (narrow != ScalarType::Float && narrow != d) return f(ctx, args);  // mixed: the kernel's own error
    narrow = d;
  }
  constexpr size_t kMax = 16;
  if (narrow == ScalarType::Float || args.size() > kMax || num_outs > args.size()) return f(ctx, args);
  std::array<Tensor, kMax> wide;
  std::array<EValue, kMax> values;
  std::array<EValue*, kMax> call{};
  std::array<std::unique_ptr<float[]>, kMax> bufs;
  const size_t first_out = args.size() - num_outs;
  for (size_t i = 0; i < args.size(); ++i) {
    call[i] = args[i];
    if (args[i] == nullptr || !args[i]->is_tensor() || args[i]->tensor().dtype != narrow) continue;
    const Tensor& t = args[i]->tensor();
    // the elements the tensor's memory holds (a strided view reads within them; an out may be resized up to them)
    const size_t n = std::max(static_cast<size_t>(t.numel), t.capacity_bytes / 2);
    bufs[i].reset(new (std::nothrow) float[std::max<size_t>(n, 1)]);
    if (!bufs[i]) {
      ctx.fail(Status::OutOfMemory, "out of memory widening a %s argument to float32", dtype_str(narrow));
      return;
    }
    if (i < first_out && t.data != nullptr) {
      const auto* h = static_cast<const uint16_t*>(t.data);
      for (size_t k = 0; k < n; ++k) bufs[i][k] = narrow == ScalarType::Half ? half_bits_to_float(h[k]) : bf16_bits_to_float(h[k]);
    }
    wide[i] = t;
    wide[i].dtype = ScalarType::Float;
    wide[i].data = bufs[i].get();
    wide[i].capacity_bytes = n * sizeof(float);
    values[i] = EValue::from_tensor(&wide[i]);
    call[i] = &values[i];
  }
  f(ctx, std::span<EValue*>(call.data(), args.size()));
  if (!ctx.ok()) return;
  for (size_t i = first_out; i < args.size(); ++i) {
    if (!bufs[i]) continue;
    Tensor& t = args[i]->tensor();
    if (!t.same_shape(wide[i].shape()) && resize_tensor(t, wide[i].shape()) != Status::Ok) {
      ctx.fail(Status::InvalidArgument, "out argument %zu cannot take the result's %lld elements", i,
               static_cast<long long>(wide[i].numel));
      return;
    }
    auto* h = static_cast<uint16_t*>(t.data);
    for (int64_t k = 0; k < wide[i].numel; ++k)
      h[k] = narrow == ScalarType::Half ? float_to_half_bits(bufs[i][static_cast<size_t>(k)])
                                        : float_to_bf16_bits(bufs[i][static_cast<size_t>(k)]);
  }
}

}  // namespace kiln::rt::kernels
