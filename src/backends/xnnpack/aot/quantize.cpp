// Weight quantization for kiln lower --quantize (see quantize.h for the rules).
#include "kiln/backends/xnnpack/quantize.h"

#include <fmt/format.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>

namespace kiln::backends::xnnpack {
namespace {

uint16_t to_bf16(float f) {  // round to nearest even, as torch's .to(bfloat16)
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// the reference symmetric scale of values v[0..n): max(|min(v,0)|, max(v,0)) / half_range, at least FLT_MIN
float symmetric_scale(const float* v, int64_t n, float half_range) {
  float lo = 0.0f, hi = 0.0f;
  for (int64_t i = 0; i < n; ++i) lo = std::min(lo, v[i]), hi = std::max(hi, v[i]);
  return std::max(std::max(-lo, hi) / half_range, FLT_MIN);
}

int quantize(float w, float inv, int qmin, int qmax) {
  return static_cast<int>(std::clamp(std::nearbyint(w * inv), static_cast<float>(qmin), static_cast<float>(qmax)));
}

}  // namespace

std::string QuantScheme::name() const {
  switch (kind) {
    case Kind::Int4Groups: return fmt::format("8da4w:{}", group);
    case Kind::Int8Channels: return "8da8w";
    case Kind::None: break;
  }
  return "none";
}

std::optional<QuantScheme> parse_quant_scheme(std::string_view text, std::string* error) {
  QuantScheme s;
  std::string_view base = text, group;
  if (auto colon = text.find(':'); colon != std::string_view::npos) {
    base = text.substr(0, colon);
    group = text.substr(colon + 1);
  }
  if (base == "8da8w" && group.empty()) {
    s.kind = QuantScheme::Kind::Int8Channels;
    return s;
  }
  if (base == "8da4w") {
    s.kind = QuantScheme::Kind::Int4Groups;
    if (!group.empty()) {
      if (group == "32") s.group = 32;
      else if (group == "64") s.group = 64;
      else if (group == "128") s.group = 128;
      else if (group == "256") s.group = 256;
      else {
        *error = fmt::format("unknown group size '{}' in --quantize {} (8da4w takes 32, 64, 128 or 256)", group, text);
        return std::nullopt;
      }
    }
    return s;
  }
  *error = fmt::format("unknown quantization scheme '{}' (8da4w[:32|64|128|256] or 8da8w)", text);
  return std::nullopt;
}

QuantizedWeights quantize_weights(const float* w, int64_t n, int64_t k, const QuantScheme& scheme) {
  QuantizedWeights q;
  if (scheme.kind == QuantScheme::Kind::Int4Groups) {
    const int64_t g = scheme.group, groups = k / g;
    q.data.assign(static_cast<size_t>(n * (k / 2)), std::byte{0});
    q.scales.resize(static_cast<size_t>(n * groups) * 2);
    auto* bytes = reinterpret_cast<uint8_t*>(q.data.data());
    for (int64_t j = 0; j < n; ++j)
      for (int64_t b = 0; b < groups; ++b) {
        const float* v = w + j * k + b * g;
        const float scale = symmetric_scale(v, g, 7.5f);
        const float inv = 1.0f / scale;
        const uint16_t s16 = to_bf16(scale);
        std::memcpy(q.scales.data() + static_cast<size_t>(j * groups + b) * 2, &s16, 2);
        for (int64_t i = 0; i < g; ++i) {
          const int64_t col = b * g + i;
          const auto u = static_cast<uint8_t>(quantize(v[i], inv, -8, 7) + 8);
          bytes[j * (k / 2) + col / 2] |= static_cast<uint8_t>((col & 1) ? u << 4 : u);
        }
      }
    return q;
  }
  q.data.resize(static_cast<size_t>(n * k));
  q.scales.resize(static_cast<size_t>(n) * 4);
  auto* out = reinterpret_cast<int8_t*>(q.data.data());
  for (int64_t j = 0; j < n; ++j) {
    const float scale = symmetric_scale(w + j * k, k, 127.5f), inv = 1.0f / scale;
    std::memcpy(q.scales.data() + static_cast<size_t>(j) * 4, &scale, 4);
    for (int64_t i = 0; i < k; ++i) out[j * k + i] = static_cast<int8_t>(quantize(w[j * k + i], inv, -128, 127));
  }
  return q;
}

}  // namespace kiln::backends::xnnpack
