// The XNNPACK backend's memory for the weights a one-token step streams (backend_state.h).
#include "builder.h"
#include "kiln/cpu/gemm.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>

namespace kiln::backends::xnnpack::detail {

namespace {
struct WeightChunk {
  uint8_t* base = nullptr;
  size_t size = 0, used = 0;
  ~WeightChunk() { std::free(base); }
};
}  // namespace

Status copy_to_weight_memory(State& owner, const rt::PteFile* file, std::span<const std::byte> bytes,
                                     bool release, const float** out, ErrorMessage* error) {
  *out = reinterpret_cast<const float*>(bytes.data());
  if (!rt::huge_pages_enabled()) return Status::Ok;
  const uint8_t*& copy = owner.weight_copies[bytes.data()];
  if (!copy) {
    uint8_t* buf = nullptr;
    std::shared_ptr<void> chunk = weight_memory(bytes.size(), &buf);
    if (!buf) return fail(error, Status::OutOfMemory, "out of memory copying weights into huge-page memory");
    owner.weight_chunks.push_back(std::move(chunk));
    std::memcpy(buf, bytes.data(), bytes.size());
    copy = buf;
    if (release && file) file->release_pages(bytes);
  }
  *out = reinterpret_cast<const float*>(copy);
  return Status::Ok;
}

Status table_panels_once(State& owner, const rt::PteFile* file, const float* w, int64_t n, int64_t k,
                         const float** out, ErrorMessage* error) {
  const float*& packed = owner.lm_head_panels[w];
  if (!packed) {
    const size_t size = (static_cast<size_t>(cpu::sgemm_packed_floats(k, n)) * sizeof(float) + kArenaAlign - 1) /
                        kArenaAlign * kArenaAlign;
    auto* buf = static_cast<float*>(std::aligned_alloc(kArenaAlign, size));
    if (!buf) return fail(error, Status::OutOfMemory, "out of memory packing the LM head's weights");
    owner.owned.emplace_back(buf, &std::free);
    const int64_t chunk = cpu::sgemm_panel_width() * 16;  // rows of W a step (GPT-2: 3 MB), whole panels
    for (int64_t j = 0; j < n; j += chunk) {
      const int64_t rows = std::min(chunk, n - j);
      cpu::sgemm_pack_b(k, rows, w + j * k, k, true, buf + j * k);  // panel j starts at j * k (sgemm_pack_b)
      if (file)
        file->release_pages(std::span<const std::byte>(reinterpret_cast<const std::byte*>(w + j * k),
                                                       static_cast<size_t>(rows * k) * sizeof(float)));
    }
    packed = buf;
  }
  *out = packed;
  return Status::Ok;
}

std::shared_ptr<void> weight_memory(size_t bytes, uint8_t** out) {
  constexpr size_t kHuge = size_t{2} << 20, kChunk = size_t{16} << 20;
  static std::mutex mu;
  static std::weak_ptr<WeightChunk> current;  // the chunk being carved (null: none with room)
  *out = nullptr;
  bytes = (bytes + kArenaAlign - 1) / kArenaAlign * kArenaAlign;
  std::lock_guard<std::mutex> lock(mu);
  std::shared_ptr<WeightChunk> c = current.lock();
  if (!c || c->size - c->used < bytes) {
    auto fresh = std::make_shared<WeightChunk>();
    fresh->size = std::max(kChunk, (bytes + kHuge - 1) / kHuge * kHuge);
    fresh->base = static_cast<uint8_t*>(std::aligned_alloc(kHuge, fresh->size));
    if (!fresh->base) return nullptr;
    // advice only: where THP is off ("never") the pages stay 4 KiB and nothing else changes
    if (rt::huge_pages_enabled()) ::madvise(fresh->base, fresh->size, MADV_HUGEPAGE);
    if (!c || fresh->size - bytes > c->size - c->used) current = fresh;  // carve on from the one with more room
    c = std::move(fresh);
  }
  *out = c->base + c->used;
  c->used += bytes;
  return c;
}

}  // namespace kiln::backends::xnnpack::detail
