#include "kiln/io/npy.h"

#include "kiln/core/error.h"

#include <cctype>
#include <filesystem>
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
  check(found, "{}: dtype '{}' is not supported (kiln reads little-endian bool, int, uint and float arrays)", path, descr);
  check(dict_value(header, "fortran_order", path) == "False", "{}: Fortran-order arrays are not supported", path);
  std::string shape = dict_value(header, "shape", path);
  int64_t numel = 1;
  for (size_t i = 0; i < shape.size();) {
    if (!std::isdigit(static_cast<unsigned char>(shape[i]))) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < shape.size() && std::isdigit(static_cast<unsigned char>(shape[j]))) ++j;
    a.shape.push_back(std::stoll(shape.substr(i, j - i)));
    numel *= a.shape.back();
    i = j;
  }
  a.data.resize(static_cast<size_t>(numel) * static_cast<size_t>(element_size(a.dtype)));
  f.read(reinterpret_cast<char*>(a.data.data()), static_cast<std::streamsize>(a.data.size()));
  check(static_cast<size_t>(f.gcount()) == a.data.size(), "{}: holds fewer bytes than its shape needs", path);
  return a;
}

void write_npy(const std::string& path, ScalarType dtype, std::span<const int64_t> shape,
               std::span<const std::byte> data) {
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
  std::string tmp = path + ".kiln-tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    check(f.good(), "{}: cannot write", path);
    f.write(kMagic, 6);
    const char version[2] = {1, 0};
    f.write(version, 2);
    const char len[2] = {static_cast<char>(header.size() & 0xff), static_cast<char>((header.size() >> 8) & 0xff)};
    f.write(len, 2);
    f.write(header.data(), static_cast<std::streamsize>(header.size()));
    f.write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size()));
    f.close();
    if (!f.good()) {
      std::filesystem::remove(tmp);
      fail("{}: write failed", path);
    }
  }
  std::filesystem::rename(tmp, path);
}

}  // namespace kiln::io
