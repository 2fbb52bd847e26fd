// kiln_consumer PTE INPUT.npy OUTPUT.npy [--threads T] [--engine kiln|xnnpack]
// Runs the .pte's forward on one .npy input through kiln::Module and writes its
// first output as .npy. Uses only the installed package's public headers.
#include "kiln/runtime/module.h"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace {

struct Npy {
  kiln::ScalarType dtype = kiln::ScalarType::Float;
  std::vector<int64_t> shape;
  std::vector<char> data;
};

// A C-order little-endian .npy of float32 or int64 (what the export front end writes).
bool read_npy(const char* path, Npy* out) {
  std::ifstream f(path, std::ios::binary);
  std::vector<char> b((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  if (b.size() < 10 || std::memcmp(b.data(), "\x93NUMPY", 6) != 0) return false;
  size_t header_len = b[6] == 1 ? static_cast<uint8_t>(b[8]) | (static_cast<uint8_t>(b[9]) << 8) : 0;
  size_t start = b[6] == 1 ? 10 : 12;
  if (b[6] != 1) header_len = static_cast<uint8_t>(b[8]) | (static_cast<uint8_t>(b[9]) << 8) |
                              (static_cast<uint8_t>(b[10]) << 16) | (static_cast<size_t>(static_cast<uint8_t>(b[11])) << 24);
  if (b.size() < start + header_len) return false;
  std::string h(b.data() + start, header_len);
  if (h.find("'fortran_order': False") == std::string::npos) return false;
  if (h.find("'<f4'") != std::string::npos) out->dtype = kiln::ScalarType::Float;
  else if (h.find("'<i8'") != std::string::npos) out->dtype = kiln::ScalarType::Long;
  else return false;
  size_t p = h.find("'shape': (");
  if (p == std::string::npos) return false;
  p += 10;
  while (p < h.size() && h[p] != ')') {
    if (h[p] >= '0' && h[p] <= '9') {
      char* end = nullptr;
      out->shape.push_back(std::strtoll(h.c_str() + p, &end, 10));
      p = static_cast<size_t>(end - h.c_str());
    } else {
      ++p;
    }
  }
  out->data.assign(b.begin() + static_cast<std::ptrdiff_t>(start + header_len), b.end());
  return true;
}

bool write_npy_f32(const char* path, const kiln::TensorView& t) {
  std::string shape;
  for (int64_t s : t.shape) shape += std::to_string(s) + ", ";
  if (t.shape.size() > 1) shape.resize(shape.size() - 1);  // "(1, 16, 5)" vs "(5,)"
  std::string h = "{'descr': '<f4', 'fortran_order': False, 'shape': (" + shape + "), }";
  while ((10 + h.size() + 1) % 64 != 0) h += ' ';
  h += '\n';
  std::ofstream f(path, std::ios::binary);
  f.write("\x93NUMPY\x01\x00", 8);
  const uint16_t len = static_cast<uint16_t>(h.size());
  const char len_bytes[2] = {static_cast<char>(len & 0xff), static_cast<char>(len >> 8)};
  f.write(len_bytes, 2);
  f.write(h.data(), static_cast<std::streamsize>(h.size()));
  f.write(static_cast<const char*>(t.data), static_cast<std::streamsize>(t.nbytes()));
  return f.good();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: kiln_consumer PTE INPUT.npy OUTPUT.npy [--threads T] [--engine kiln|xnnpack]\n");
    return 2;
  }
  kiln::ModuleOptions options;
  for (int i = 4; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--threads") == 0) options.threads = static_cast<size_t>(std::atoi(argv[i + 1]));
    if (std::strcmp(argv[i], "--engine") == 0) options.engine = argv[i + 1];
  }
  Npy input;
  if (!read_npy(argv[2], &input)) {
    std::fprintf(stderr, "kiln_consumer: %s: not a float32/int64 C-order .npy\n", argv[2]);
    return 1;
  }
  kiln::Module module(argv[1], options);
  if (module.load() != kiln::Status::Ok) {
    std::fprintf(stderr, "kiln_consumer: %s: %s\n", argv[1], module.error_message());
    return 1;
  }
  kiln::TensorView in{input.dtype, input.shape, input.data.data()};
  auto out = module.forward({&in, 1});
  if (!out.ok()) {
    std::fprintf(stderr, "kiln_consumer: forward: %s (%s)\n", module.error_message(), kiln::rt::status_name(out.status()));
    return 1;
  }
  const kiln::TensorView& logits = out.value()[0];
  if (logits.dtype != kiln::ScalarType::Float || !write_npy_f32(argv[3], logits)) {
    std::fprintf(stderr, "kiln_consumer: cannot write %s\n", argv[3]);
    return 1;
  }
  std::printf("ran %s: %zu output(s), output 0 has %lld elements\n", argv[1], out.value().size(),
              static_cast<long long>(logits.numel()));
  return 0;
}
