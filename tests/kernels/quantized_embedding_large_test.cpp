// quantized_decomposed::embedding_byte / embedding_4bit on a table of Gemma 4 E2B's per-layer size
// ([262144, 8960]: 2.35e9 elements, more than 2^31) without allocating it: the table is a sparse file mapped
// read-only (its pages are holes, read as zeros, except the rows this test writes), so the kernel's row offsets
// are computed in 64 bits or the lookup of the last rows reads the wrong bytes (or faults). Oracle: the format's
// definition, out[j] = q[row, j] * scale[row, j / G], with q written here.
#include "kiln/runtime/kernel.h"
#include "kiln/runtime/tensor.h"

#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

using namespace kiln;
using namespace kiln::rt;

namespace {

constexpr int64_t kRows = 262144, kDim = 8960;  // Gemma 4 E2B's per-layer table: vocab x (35 layers x 256)

// A sparse file of `bytes` mapped shared and writable (nothing is allocated but the pages written).
struct SparseMap {
  std::string path;
  void* map = MAP_FAILED;
  size_t bytes = 0;
  explicit SparseMap(size_t n) : bytes(n) {
    const char* tmp = std::getenv("TMPDIR");
    path = std::string(tmp && *tmp ? tmp : "/tmp") + "/kiln_qemb_XXXXXX";
    int fd = ::mkstemp(path.data());
    if (fd < 0) return;
    if (::ftruncate(fd, static_cast<off_t>(n)) == 0)
      map = ::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ::close(fd);
  }
  ~SparseMap() {
    if (map != MAP_FAILED) ::munmap(map, bytes);
    ::unlink(path.c_str());
  }
  uint8_t* data() { return static_cast<uint8_t*>(map); }
};

// The value written at (row, column j): a pattern over the whole int range of the format.
int qvalue(int64_t row, int64_t j, int bits) {
  const int span = bits == 4 ? 16 : 256, low = bits == 4 ? -8 : -128;
  return static_cast<int>((row * 7 + j * 13) % span) + low;
}

void run_lookup(int bits) {
  const int64_t packed = bits == 4 ? kDim / 2 : kDim, group = 32, groups = kDim / group;
  SparseMap table(static_cast<size_t>(kRows) * static_cast<size_t>(packed));
  ASSERT_NE(table.map, MAP_FAILED) << "cannot map a sparse file in " << table.path;
  // rows past 2^31 / D (the last ones: byte offsets above 2^31 for int8) and one row near the start
  const std::vector<int64_t> rows = {kRows - 1, kRows - 2, (int64_t{1} << 31) / kDim + 1, 3};
  SparseMap scale_map(static_cast<size_t>(kRows * groups) * sizeof(float));  // 294 MB of scales, mostly holes
  ASSERT_NE(scale_map.map, MAP_FAILED);
  auto* scales = static_cast<float*>(scale_map.map);
  for (int64_t r : rows) {
    uint8_t* row = table.data() + static_cast<size_t>(r) * static_cast<size_t>(packed);
    for (int64_t j = 0; j < kDim; ++j) {
      const int q = qvalue(r, j, bits);
      if (bits == 8) row[j] = static_cast<uint8_t>(static_cast<int8_t>(q));
      else row[j / 2] |= static_cast<uint8_t>((j & 1) ? (q + 8) : (q + 8) << 4);  // even column: high nibble
    }
    for (int64_t g = 0; g < groups; ++g) scales[static_cast<size_t>(r * groups + g)] = 0.25f + 0.5f * static_cast<float>(g);
  }
  Tensor w, s, idx, out;
  const int64_t wshape[] = {kRows, packed}, sshape[] = {kRows, groups}, ishape[] = {static_cast<int64_t>(rows.size())};
  const int64_t oshape[] = {static_cast<int64_t>(rows.size()), kDim};
  ASSERT_EQ(make_contiguous_tensor(w, bits == 4 ? ScalarType::Byte : ScalarType::Char, wshape, table.data(),
                                   table.bytes),
            Status::Ok);
  EXPECT_EQ(w.numel, kRows * packed);  // int8: 2,348,810,240 elements, past 2^31
  ASSERT_EQ(make_contiguous_tensor(s, ScalarType::Float, sshape, scales, scale_map.bytes), Status::Ok);
  std::vector<int64_t> indices = rows;
  ASSERT_EQ(make_contiguous_tensor(idx, ScalarType::Long, ishape, indices.data(), indices.size() * 8), Status::Ok);
  std::vector<float> o(rows.size() * static_cast<size_t>(kDim), -1.0f);
  ASSERT_EQ(make_contiguous_tensor(out, ScalarType::Float, oshape, o.data(), o.size() * 4), Status::Ok);

  KernelFn fn = find_kernel(bits == 4 ? "quantized_decomposed::embedding_4bit" : "quantized_decomposed::embedding_byte",
                            "out");
  ASSERT_NE(fn, nullptr);
  EValue ew = EValue::from_tensor(&w), es = EValue::from_tensor(&s), ez, emin = EValue::from_int(bits == 4 ? -8 : -128),
         emax = EValue::from_int(bits == 4 ? 7 : 127), ei = EValue::from_tensor(&idx), eo = EValue::from_tensor(&out);
  std::vector<EValue*> args = {&ew, &es, &ez, &emin, &emax, &ei, &eo};
  KernelContext ctx;
  fn(ctx, args);
  ASSERT_TRUE(ctx.ok()) << ctx.message();
  for (size_t t = 0; t < rows.size(); ++t)
    for (int64_t j = 0; j < kDim; ++j) {
      const float want = static_cast<float>(qvalue(rows[t], j, bits)) * scales[static_cast<size_t>(rows[t] * groups + j / group)];
      ASSERT_EQ(o[t * static_cast<size_t>(kDim) + static_cast<size_t>(j)], want) << "row " << rows[t] << ", column " << j;
    }
}

TEST(QuantizedEmbeddingLarge, ByteTablePast2To31Elements) { run_lookup(8); }
TEST(QuantizedEmbeddingLarge, FourBitTableOfGemma4PerLayerSize) { run_lookup(4); }

}  // namespace
