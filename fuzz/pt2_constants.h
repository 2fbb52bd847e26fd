// Shared by fuzz/pt2.cpp and fuzz/pt2_graph.cpp: every constant of a program read_pt2 accepted,
// read back the ways kiln lower reads them -- streamed and CRC'd as stored, then, for a bfloat16 or
// float16 program, widened to float32 (widen_to_float, as `kiln lower --dtype fp32` and the xnnpack
// backend do) and read again: streamed whole (stream_constant's widening carries an element split
// across chunks) and by byte ranges (read_constant_range: the stored elements under an unaligned
// range, widened, or the strided gather). A range must equal the same bytes of the whole read
// (abort: a finding). A kiln::Error is a clean refusal; the caller catches it.
#pragma once

#include "kiln/pt2/pt2_reader.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>
#include <vector>

namespace kiln::fuzz {

inline void read_every_constant(kiln::pt2::ExportedProgram& ep) {
  uint64_t sum = 0;
  for (const auto& c : ep.constants) {
    ep.stream_constant(c, [&](std::span<const std::byte> chunk) { sum += chunk.size(); });
    sum += ep.content_crc32(c);
  }
  if (!kiln::pt2::widen_to_float(ep)) return;  // no 16-bit float values: nothing widened to read
  for (const auto& c : ep.constants) {
    const auto nbytes = static_cast<uint64_t>(c.meta.nbytes());
    if (nbytes > (uint64_t{1} << 24)) {  // a large constant: streamed only (the ranges below copy it whole)
      ep.stream_constant(c, [&](std::span<const std::byte> chunk) { sum += chunk.size(); });
      continue;
    }
    std::vector<std::byte> whole(static_cast<size_t>(nbytes));
    ep.read_constant(c, whole);
    sum += ep.content_crc32(c);
    // whole, unaligned inner, the first and the last bytes, one element in the middle
    const uint64_t zero = 0, one = 1, three = 3, four = 4;
    const uint64_t ranges[][2] = {{zero, nbytes},
                                  {nbytes > 2 ? one : zero, nbytes > 2 ? nbytes - 2 : zero},
                                  {zero, std::min(nbytes, three)},
                                  {nbytes - std::min(nbytes, three), std::min(nbytes, three)},
                                  {nbytes / 8 * 4, nbytes >= 4 ? four : zero}};
    for (const auto& [offset, length] : ranges) {
      std::vector<std::byte> part(static_cast<size_t>(length));
      ep.read_constant_range(c, offset, part);
      if (length && std::memcmp(part.data(), whole.data() + offset, static_cast<size_t>(length)) != 0) {
        std::fprintf(stderr, "fuzz: read_constant_range('%s', %llu, %llu) differs from the whole read\n",
                     c.name.c_str(), static_cast<unsigned long long>(offset), static_cast<unsigned long long>(length));
        std::abort();
      }
    }
  }
  (void)sum;
}

}  // namespace kiln::fuzz
