// The byte-level frame of a .pte file around its flatbuffer, shared by kiln's
// writer (src/pte) and its runtime loader (src/runtime/pte_file.cpp):
//
//   offset 0   u32 root table offset (little endian), then "ET12"
//   offset 8   extended header: "eh00", u32 header length, u64 program size,
//              u64 segment base offset, u64 segment data size; zero padded to
//              the schema's largest alignment (16) — omitted when the file
//              has no segment data
//   ...        the rest of the flatbuffer, up to program size
//   ...        zero padding up to the segment base offset (a multiple of the
//              segment alignment), then the segments, each starting at
//              base + DataSegment.offset
//
// Header-only and exception-free, so the no-exceptions runtime can use it. It
// belongs to neither side: the writer (kiln/pte) and the loader (kiln/runtime)
// both include it, and neither includes the other's headers.
#pragma once

#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>

namespace kiln::format {

static_assert(std::endian::native == std::endian::little, "kiln's .pte code assumes a little-endian host");

// File identifier of the program flatbuffer (bytes 4..7 of the file).
inline constexpr char kProgramIdentifier[5] = "ET12";
// Root offset + identifier: the extended header starts right after them.
inline constexpr size_t kExtendedHeaderOffset = 8;
inline constexpr char kExtendedHeaderMagic[5] = "eh00";
// Magic, length, program size, segment base offset.
inline constexpr uint32_t kExtendedHeaderMinLength = 24;
// ... plus the segment data size, which every 1.x writer includes.
inline constexpr uint32_t kExtendedHeaderLength = 32;
// Largest force_align in the schema: the inserted header is padded to a
// multiple of it so the flatbuffer's internal alignment survives the insert.
inline constexpr uint64_t kSchemaMaxAlignment = 16;
// ExecuTorch's defaults (ExecutorchBackendConfig): where segments start, and
// how constant tensors are aligned inside the constant segment.
inline constexpr uint64_t kDefaultSegmentAlignment = 128;
inline constexpr uint64_t kDefaultTensorAlignment = 16;

struct ExtendedHeader {
  uint32_t length = kExtendedHeaderLength;  // as stored; >= kExtendedHeaderMinLength
  uint64_t program_size = 0;                // flatbuffer bytes, header included
  uint64_t segment_base_offset = 0;         // file offset of segment data; 0 = no segments
  uint64_t segment_data_size = 0;           // bytes from the base to the end of the last segment
};

enum class HeaderParse : uint8_t {
  Ok,
  Absent,     // no "eh00" at byte 8: the flatbuffer is the whole file, no segments
  TooShort,   // the file ends inside the header
  BadLength,  // header length below the minimum
};

inline uint64_t read_le(const std::byte* p, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}

inline void write_le(std::byte* p, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) p[i] = static_cast<std::byte>((v >> (8 * i)) & 0xff);
}

// Reads the extended header from the first bytes of a file. Never reads past
// `file_head`. The segment data size is 0 when the header is too short to hold it.
inline HeaderParse parse_extended_header(std::span<const std::byte> file_head, ExtendedHeader* out) {
  constexpr size_t kMagicEnd = kExtendedHeaderOffset + 4;
  if (file_head.size() < kMagicEnd) return file_head.size() <= kExtendedHeaderOffset ? HeaderParse::Absent
                                                                                       : HeaderParse::TooShort;
  const std::byte* h = file_head.data() + kExtendedHeaderOffset;
  if (std::memcmp(h, kExtendedHeaderMagic, 4) != 0) return HeaderParse::Absent;
  if (file_head.size() < kExtendedHeaderOffset + kExtendedHeaderMinLength) return HeaderParse::TooShort;
  ExtendedHeader eh;
  eh.length = static_cast<uint32_t>(read_le(h + 4, 4));
  if (eh.length < kExtendedHeaderMinLength) return HeaderParse::BadLength;
  eh.program_size = read_le(h + 8, 8);
  eh.segment_base_offset = read_le(h + 16, 8);
  if (eh.length >= kExtendedHeaderLength) {
    if (file_head.size() < kExtendedHeaderOffset + kExtendedHeaderLength) return HeaderParse::TooShort;
    eh.segment_data_size = read_le(h + 24, 8);
  }
  *out = eh;
  return HeaderParse::Ok;
}

// The 32 header bytes as a writer emits them (length is always 32).
inline std::array<std::byte, kExtendedHeaderLength> encode_extended_header(const ExtendedHeader& eh) {
  std::array<std::byte, kExtendedHeaderLength> b{};
  std::memcpy(b.data(), kExtendedHeaderMagic, 4);
  write_le(b.data() + 4, kExtendedHeaderLength, 4);
  write_le(b.data() + 8, eh.program_size, 8);
  write_le(b.data() + 16, eh.segment_base_offset, 8);
  write_le(b.data() + 24, eh.segment_data_size, 8);
  return b;
}

// `value` rounded up to a multiple of `alignment` (> 0).
constexpr uint64_t align_up(uint64_t value, uint64_t alignment) {
  uint64_t r = value % alignment;
  return r == 0 ? value : value + (alignment - r);
}

constexpr bool is_power_of_two(uint64_t v) { return v != 0 && (v & (v - 1)) == 0; }

}  // namespace kiln::format
