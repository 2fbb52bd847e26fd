// kiln lower --backend portable --quantize 8da4w[:G] | 8da8w: dynamically quantized linear layers in the form
// ExecuTorch's portable runtime runs with its quantized kernel library (executorch.kernels.quantized), no delegate.
// Each linear product y = x @ W^T (mm / addmm on W through permute_copy [1,0], on a constant [K, N], or a tied
// head's mm(W, x^T)) becomes
//
//   s, zp = quantized_decomposed.choose_qparams_per_token_asymmetric(x, int8)       x: [M, K] fp32
//   xq    = quantized_decomposed.quantize_per_token(x, s, zp, -128, 127, int8)
//   x'    = quantized_decomposed.dequantize_per_token(xq, s, zp, -128, 127, int8, float32)
//   y     = quantized_decomposed.mixed_linear(x', Wq, scales, None)                 (+ bias: aten.add)
//
// with Wq the weight as int8 [N, K] (8da4w: the int4 values -8..7, one per byte) and fp32 scales [N, K/G]
// (8da4w) or [N] (8da8w): torchao's 8da4w / 8da8w arithmetic (per-token asymmetric int8 activations, symmetric
// weights), computed as ExecuTorch's kernels compute it. The weights are quantized by the lowering's own
// quantizer (the caller's `quantize`, the same one the XNNPACK path uses), so both backends store the same values.
#pragma once

#include "kiln/graph/graph.h"
#include "kiln/passes/edge_program.h"

#include <cstdint>
#include <functional>
#include <vector>

namespace kiln::passes {

struct PortableQuantizedWeight {
  std::vector<int8_t> q;      // [n, k] row-major
  std::vector<float> scales;  // [n, groups] row-major
};

struct PortableQuantOptions {
  int64_t group = 0;  // inputs per scale; 0: one scale per output channel (8da8w)
  // w: [n, k] row-major fp32 -> its quantized form (k % group == 0 is checked before the call)
  std::function<PortableQuantizedWeight(const float* w, int64_t n, int64_t k)> quantize;
  // true: keep this product's weight fp32 (--quantize-skip); may be empty
  std::function<bool(const graph::Node&, graph::ValueId)> keep_fp32;
};

struct PortableQuantStats {
  int64_t quantized = 0;  // linear products rewritten
  int64_t weights = 0;    // distinct weights quantized
  int64_t kept_fp32 = 0;  // products keep_fp32 kept
};

// Rewrites `program` in place (a dynamic program's size expressions follow the new values). Throws kiln::Error
// with one line when a layer's input count is not a multiple of the group.
PortableQuantStats quantize_linears_portable(EdgeProgram& program, const PortableQuantOptions& options);

}  // namespace kiln::passes
