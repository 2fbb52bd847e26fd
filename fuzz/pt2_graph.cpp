// libFuzzer target for the serialized graph (src/pt2/pt2_reader.cpp): the input is the
// archive's text files, cut at NUL bytes --
//   models/model.json \0 data/weights/model_weights_config.json \0
//   data/constants/model_constants_config.json \0 weight_0 \0 weight_1 \0 ...
// -- which the harness stores in a well-formed zip (archive_format, byteorder and the
// payloads as data/weights/weight_N and data/constants/tensor_N), so that mutations reach
// the JSON readers instead of failing the zip's checksums. Then read_pt2 and every
// constant's bytes, as in pt2.cpp. The seeds (fuzz/make_seeds.py) are small exported
// programs cut this way.
#include "fuzz_input.h"
#include "kiln/core/error.h"
#include "kiln/pt2/pt2_reader.h"
#include "pt2_constants.h"

#include <zlib.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace {

void put16(std::string& s, uint32_t v) {
  s.push_back(static_cast<char>(v & 0xff));
  s.push_back(static_cast<char>((v >> 8) & 0xff));
}
void put32(std::string& s, uint32_t v) {
  put16(s, v & 0xffff);
  put16(s, v >> 16);
}

// A zip of stored (uncompressed) entries: local headers, data, central directory, end record.
std::string stored_zip(const std::vector<std::pair<std::string, std::string_view>>& entries) {
  std::string out, central;
  for (const auto& [name, body] : entries) {
    const uint32_t crc = static_cast<uint32_t>(
        crc32(0, reinterpret_cast<const Bytef*>(body.data()), static_cast<uInt>(body.size())));
    const auto offset = static_cast<uint32_t>(out.size());
    const auto n = static_cast<uint32_t>(body.size());
    put32(out, 0x04034b50);
    put16(out, 20), put16(out, 0), put16(out, 0), put16(out, 0), put16(out, 0x21);  // version, flags, stored, time, date
    put32(out, crc), put32(out, n), put32(out, n);
    put16(out, static_cast<uint32_t>(name.size())), put16(out, 0);
    out += name;
    out.append(body.data(), body.size());
    put32(central, 0x02014b50);
    put16(central, 20), put16(central, 20), put16(central, 0), put16(central, 0), put16(central, 0), put16(central, 0x21);
    put32(central, crc), put32(central, n), put32(central, n);
    put16(central, static_cast<uint32_t>(name.size())), put16(central, 0), put16(central, 0);
    put16(central, 0), put16(central, 0), put32(central, 0), put32(central, offset);
    central += name;
  }
  const auto cd_offset = static_cast<uint32_t>(out.size());
  out += central;
  put32(out, 0x06054b50);
  put16(out, 0), put16(out, 0);
  put16(out, static_cast<uint32_t>(entries.size())), put16(out, static_cast<uint32_t>(entries.size()));
  put32(out, static_cast<uint32_t>(central.size())), put32(out, cd_offset), put16(out, 0);
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > (1u << 20)) return 0;
  const std::vector<std::string_view> parts = kiln::fuzz::split_at_nul(data, size);
  if (parts.size() > 64) return 0;
  std::vector<std::pair<std::string, std::string_view>> entries = {
      {"model/archive_format", "pt2"}, {"model/byteorder", "little"}, {"model/models/model.json", parts[0]}};
  if (parts.size() > 1) entries.emplace_back("model/data/weights/model_weights_config.json", parts[1]);
  if (parts.size() > 2) entries.emplace_back("model/data/constants/model_constants_config.json", parts[2]);
  for (size_t i = 3; i < parts.size(); ++i) {
    entries.emplace_back("model/data/weights/weight_" + std::to_string(i - 3), parts[i]);
    entries.emplace_back("model/data/constants/tensor_" + std::to_string(i - 3), parts[i]);
  }
  const std::string zip = stored_zip(entries);
  const char* path = kiln::fuzz::write_input(zip.data(), zip.size());
  try {
    kiln::pt2::ExportedProgram ep = kiln::pt2::read_pt2(path);
    kiln::fuzz::read_every_constant(ep);
  } catch (const kiln::Error&) {
  }
  return 0;
}
