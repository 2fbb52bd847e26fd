// Weight quantization at lowering time (kiln lower --quantize), in C++ with
// torchao's rules for Int8DynamicActivationIntxWeightConfig (AFFINE, SYMMETRIC,
// eps None = the smallest normal float):
//   8da4w[:G]  int4 weights per group of G inputs (32 default; 64, 128, 256):
//              scale = max(|w|) / 7.5 over the group, q = clamp(round(w / scale), -8, 7)
//   8da8w      int8 weights per output channel: scale = max(|w|) / 127.5,
//              q = clamp(round(w / scale), -128, 127)
// (round: half to even; w / scale as w * (1 / scale) in fp32, as torchao).
// Activations are quantized per row at run time (int8, asymmetric; see
// kiln/cpu/quant.h). Stored in ExecuTorch's XNNPACK layouts: int4 two per byte,
// the even input in the low nibble, as q + 8, with bf16 scales; int8 as is,
// with fp32 scales.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kiln::backends::xnnpack {

struct QuantScheme {
  enum class Kind : uint8_t { None, Int4Groups, Int8Channels } kind = Kind::None;
  int64_t group = 32;  // Int4Groups
  std::string name() const;  // "8da4w:32", "8da8w", "none"
};

// "8da4w", "8da4w:64", "8da8w"; std::nullopt and *error set otherwise.
std::optional<QuantScheme> parse_quant_scheme(std::string_view text, std::string* error);

struct QuantizedWeights {
  std::vector<std::byte> data;    // int4: [n, k/2] bytes; int8: [n, k]
  std::vector<std::byte> scales;  // int4: bf16 [n, k/group]; int8: fp32 [n]
};

// w: [n, k] row-major fp32. Int4Groups needs k % group == 0 and k even.
QuantizedWeights quantize_weights(const float* w, int64_t n, int64_t k, const QuantScheme& scheme);

}  // namespace kiln::backends::xnnpack
