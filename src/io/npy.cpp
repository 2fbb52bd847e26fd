#include "kiln/io/npy.h"

#include "kiln/core/error.h"
#include "kiln/core/output_file.h"

#include <cstring>
#include <charconv>
#include <limits>
#include <string_view>
#include <cctype>
#include <fstream>
#include <utility>

namespace kiln::io {
namespace {

constexpr char kMagic[] = "\x93NUMPY";

const std::pair<const char*, ScalarType> kDescr[] = {
    {"<f4", ScalarType::Float}, {"<f8", ScalarType::Double}, {"<f2", ScalarType::Half},
    {"<i8", ScalarType::Long},  {"<i4", ScalarType::Int},    {"<i2", ScalarType::Short},
    {"|i1", ScalarType::Char},  {"|u1", ScalarType::Byte},   {"|b1", ScalarType::Bool},
    {"<u2", ScalarType::UInt16}, {"<u4", ScalarType::UInt32}, {"<u8", ScalarType::UInt64},
    {"<c8", ScalarType::ComplexFloat}, {"<c16", ScalarType::ComplexDouble},
};

// The value of 'key': in the header dict, as the raw text up to the next top-level ',' or '}'.
std::string dict_value(const std::string& header, const std::string& key, const std::string& path) {
  auto pos = header.find("'" + key + "'");
  check(pos != std::string::npos, "{}: .npy header has no '{}'", path, key);
  pos = header.find(':', pos);
  check(pos != std::string::npos, "{}: malformed .npy header", path);
  ++pos;
  while (pos < header.size() && header[pos] == ' ') ++pos;
  size_t end = pos;
  int depth = 0;
  while (end < header.size()) {
    char c = header[end];
    if (c == '(' || c == '[') ++depth;
    if (c == ')' || c == ']') --depth;
    if (depth == 0 && (c == ',' || c == '}')) break;
    ++end;
  }
  if (end < header.size() && header[end] == ')') ++end;
  return header.substr(pos, end - pos);
}

}  // namespace

NpyArray read_npy(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  check(f.good(), "{}: cannot open .npy file", path);
  char magic[6];
  f.read(magic, 6);
  check(f.good() && std::string(magic, 6) == std::string(kMagic, 6), "{}: not a .npy file (bad magic)", path);
  unsigned char version[2];
  f.read(reinterpret_cast<char*>(version), 2);
  check(f.good() && version[0] >= 1 && version[0] <= 3, "{}: .npy version {} is not one kiln reads (1.0-3.0)", path,
        static_cast<int>(version[0]));
  uint32_t header_len = 0;
  if (version[0] == 1) {
    unsigned char l[2];
    f.read(reinterpret_cast<char*>(l), 2);
    header_len = l[0] | (l[1] << 8);
  } else {
    unsigned char l[4];
    f.read(reinterpret_cast<char*>(l), 4);
    header_len = l[0] | (l[1] << 8) | (l[2] << 16) | (static_cast<uint32_t>(l[3]) << 24);
  }
  check(f.good() && header_len < (1u << 20), "{}: truncated .npy header", path);
  std::string header(header_len, '\0');
  f.read(header.data(), header_len);
  check(f.good(), "{}: truncated .npy header", path);

  NpyArray a;
  std::string descr = dict_value(header, "descr", path);
  check(descr.size() >= 2, "{}: malformed dtype", path);
  descr = descr.substr(1, descr.size() - 2);
  bool found = false;
  for (const auto& [d, t] : kDescr)
    if (descr == d) {
      a.dtype = t;
      found = true;
    }
  check(found, "{}: dtype '{}' is not supported (kiln reads little-endian bool, int, uint, float and complex arrays)",
        path, descr);
  check(dict_value(header, "fortran_order", path) == "False", "{}: Fortran-order arrays are not supported", path);
  // shape: a tuple of non-negative integers, "()" for a scalar; element count and byte size in checked arithmetic
  std::string shape = dict_value(header, "shape", path);
  auto trim = [](std::string_view v) {
    while (!v.empty() && v.front() == ' ') v.remove_prefix(1);
    while (!v.empty() && v.back() == ' ') v.remove_suffix(1);
    return v;
  };
  std::string_view tuple = trim(shape);
  check(tuple.size() >= 2 && tuple.front() == '(' && tuple.back() == ')', "{}: malformed .npy shape '{}'", path, shape);
  tuple = trim(tuple.substr(1, tuple.size() - 2));
  uint64_t numel = 1;
  while (!tuple.empty()) {
    const size_t comma = tuple.find(',');
    const std::string_view dim = trim(tuple.substr(0, comma));
    tuple = comma == std::string_view::npos ? std::string_view() : trim(tuple.substr(comma + 1));
    int64_t d = -1;
    const auto [end_ptr, ec] = std::from_chars(dim.data(), dim.data() + dim.size(), d);
    check(!dim.empty() && std::isdigit(static_cast<unsigned char>(dim.front())) && ec == std::errc() &&
              end_ptr == dim.data() + dim.size(),
          "{}: .npy shape {} has a dimension '{}' that is not a non-negative integer", path, shape, dim);
    check(a.shape.size() < 64, "{}: .npy shape {} has too many dimensions", path, shape);
    a.shape.push_back(d);
    check(!__builtin_mul_overflow(numel, static_cast<uint64_t>(d), &numel),
          "{}: .npy shape {} has more elements than can be counted", path, shape);
  }
  uint64_t nbytes = 0;
  check(!__builtin_mul_overflow(numel, static_cast<uint64_t>(element_size(a.dtype)), &nbytes) &&
            nbytes <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()),
        "{}: .npy shape {} holds more bytes than can be counted", path, shape);
  const auto data_start = static_cast<uint64_t>(f.tellg());
  f.seekg(0, std::ios::end);
  const auto file_size = static_cast<uint64_t>(f.tellg());
  f.seekg(static_cast<std::streamoff>(data_start));
  check(f.good() && file_size >= data_start && file_size - data_start == nbytes,
        "{}: shape {} of {} needs {} data bytes, the file holds {}", path, shape, descr, nbytes,
        file_size >= data_start ? file_size - data_start : 0);
  a.data.resize(static_cast<size_t>(nbytes));
  f.read(reinterpret_cast<char*>(a.data.data()), static_cast<std::streamsize>(a.data.size()));
  check(static_cast<size_t>(f.gcount()) == a.data.size(), "{}: holds fewer bytes than its shape needs", path);
  return a;
}

void write_npy(const std::string& path, ScalarType dtype, std::span<const int64_t> shape,
               std::span<const std::byte> data) {
  StagedFile f(path);  // removed unless published
  write_npy(f, dtype, shape, data);
  f.publish();
}

void write_npy(StagedFile& f, ScalarType dtype, std::span<const int64_t> shape, std::span<const std::byte> data) {
  const std::string& path = f.target();
  std::vector<std::byte> wide;
  if (dtype == ScalarType::BFloat16) {  // as float32 (NumPy has no bfloat16): the bits shifted up, exact
    check(data.size() % 2 == 0, "internal: {}: a bfloat16 tensor of {} bytes", path, data.size());
    wide.resize(data.size() * 2);
    for (size_t i = 0; i < data.size() / 2; ++i) {
      const float v = bf16_to_float(data.data() + 2 * i);
      std::memcpy(wide.data() + 4 * i, &v, 4);
    }
    data = wide;
    dtype = ScalarType::Float;
  }
  const char* descr = nullptr;
  for (const auto& [d, t] : kDescr)
    if (t == dtype) descr = d;
  check(descr != nullptr, "{}: dtype {} cannot be written as .npy", path, dtype_name(dtype));
  std::string shape_str = "(";
  for (size_t i = 0; i < shape.size(); ++i) shape_str += std::to_string(shape[i]) + (shape.size() == 1 ? "," : (i + 1 < shape.size() ? ", " : ""));
  shape_str += ")";
  std::string header = std::string("{'descr': '") + descr + "', 'fortran_order': False, 'shape': " + shape_str + ", }";
  size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header += '\n';
  f.write(kMagic, 6);
  const char version[2] = {1, 0};
  f.write(version, 2);
  const char len[2] = {static_cast<char>(header.size() & 0xff), static_cast<char>((header.size() >> 8) & 0xff)};
  f.write(len, 2);
  f.write(header);
  f.write(data.data(), data.size());
  f.close();
}

bool float_to_bfloat16(NpyArray& a, ScalarType want) {
  if (a.dtype != ScalarType::Float || want != ScalarType::BFloat16) return false;
  const size_t n = a.data.size() / 4;
  std::vector<std::byte> out(n * 2);
  for (size_t i = 0; i < n; ++i) {
    uint32_t u;
    std::memcpy(&u, a.data.data() + 4 * i, 4);
    uint16_t b;
    if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu) != 0) {
      b = static_cast<uint16_t>((u >> 16) | 0x0040u);  // a NaN stays a (quiet) NaN
    } else {
      b = static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);  // nearest, ties to even
    }
    std::memcpy(out.data() + 2 * i, &b, 2);
  }
  a.data = std::move(out);
  a.dtype = ScalarType::BFloat16;
  return true;
}

}  // namespace kiln::io
