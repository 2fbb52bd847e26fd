// .pte format: the extended header codec, the writer's layout rules, and the
// loader reading back what the writer wrote or rejecting damaged copies.
#include "kiln/core/error.h"
#include "kiln/pte/pte_format.h"
#include "kiln/pte/pte_writer.h"
#include "kiln/fb/kiln_program_generated.h"
#include "kiln/runtime/pte_file.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;
using namespace kiln;
using namespace kiln::pte;

std::vector<std::byte> read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::vector<char> chars((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::byte> out(chars.size());
  std::memcpy(out.data(), chars.data(), chars.size());
  return out;
}

void write_file(const fs::path& p, const std::vector<std::byte>& bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

std::vector<std::byte> pattern(size_t n, unsigned seed) {
  std::vector<std::byte> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<std::byte>((i * 31 + seed) & 0xff);
  return v;
}

// A blob that streams `bytes` in chunks of `chunk` bytes.
DataBlob chunked_blob(std::vector<std::byte> bytes, size_t chunk) {
  auto owned = std::make_shared<std::vector<std::byte>>(std::move(bytes));
  DataBlob b;
  b.size = owned->size();
  b.write = [owned, chunk](const std::function<void(std::span<const std::byte>)>& sink) {
    for (size_t off = 0; off < owned->size(); off += chunk)
      sink(std::span<const std::byte>(*owned).subspan(off, std::min(chunk, owned->size() - off)));
  };
  return b;
}

TensorValue float_tensor(std::vector<int32_t> sizes) {
  TensorValue t;
  t.dtype = ScalarType::Float;
  t.sizes = std::move(sizes);
  return t;
}

// forward(x[2,3]) = x @ w + c, constants of 48 and 16 bytes (see tests/pte/pte_writer_smoke.cpp),
// plus a constant of 5 bytes so the next one needs padding, two delegates and two named blobs.
Program sample_program() {
  Program p;
  p.constants.push_back(DataBlob::from_bytes(pattern(48, 1)));   // 1: w
  p.constants.push_back(chunked_blob(pattern(5, 2), 2));         // 2: odd-sized, forces padding
  p.constants.push_back(DataBlob::from_bytes(pattern(16, 3)));   // 3: c
  ExecutionPlan plan;
  TensorValue x = float_tensor({2, 3});
  TensorValue w = float_tensor({3, 4});
  w.constant_index = 1;
  TensorValue out0 = float_tensor({2, 4});
  out0.allocation = Allocation{1, 0};
  TensorValue c = float_tensor({4});
  c.constant_index = 3;
  TensorValue out1 = float_tensor({2, 4});
  out1.allocation = Allocation{1, 32};
  plan.values = {x, w, out0, c, int64_t{1}, out1, IntList{{4}}, NoneValue{}, OptionalTensorList{{0, -1}}};
  plan.inputs = {0};
  plan.outputs = {5};
  plan.operators = {{"aten::mm", "out"}, {"aten::add", "out"}};
  plan.instructions = {KernelCall{0, {0, 1, 2, 2}}, KernelCall{1, {2, 3, 4, 5, 5}}, DelegateCall{0, {5, 5}},
                       DelegateCall{1, {5}}, DelegateCall{2, {5}}};
  plan.non_const_buffer_sizes = {0, 64};
  plan.delegates = {{"BackendA", 0, {{"k", {7}}}}, {"BackendB", 1, {}}, {"BackendA", 0, {}}};
  p.delegate_payloads = {chunked_blob(pattern(1000, 4), 333), DataBlob{}};
  p.named_data = {{"weights.a", DataBlob::from_bytes(pattern(300, 5))},
                  {"weights.b", DataBlob::from_bytes(pattern(7, 6))}};
  p.plans.push_back(std::move(plan));
  return p;
}

class PteTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("kiln_pte_test_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

// Opens `path`, expecting failure; returns the message.
std::string open_error(const fs::path& path, rt::Status expected = rt::Status::InvalidProgram) {
  rt::ErrorMessage error;
  auto r = rt::PteFile::open(path.c_str(), &error);
  EXPECT_FALSE(r.ok()) << path;
  if (!r.ok()) {
    EXPECT_EQ(r.status(), expected) << error.c_str();
  }
  return error.c_str();
}

TEST(ExtendedHeader, EncodesTheDocumentedLayout) {
  ExtendedHeader eh;
  eh.program_size = 0x0102030405060708ull;
  eh.segment_base_offset = 0x1122334455667788ull;
  eh.segment_data_size = 0xa0b0c0d0e0f00010ull;
  auto b = encode_extended_header(eh);
  ASSERT_EQ(b.size(), 32u);
  EXPECT_EQ(std::memcmp(b.data(), "eh00", 4), 0);
  EXPECT_EQ(read_le(b.data() + 4, 4), 32u);  // header length
  EXPECT_EQ(read_le(b.data() + 8, 8), eh.program_size);
  EXPECT_EQ(read_le(b.data() + 16, 8), eh.segment_base_offset);
  EXPECT_EQ(read_le(b.data() + 24, 8), eh.segment_data_size);
  EXPECT_EQ(b[8], std::byte{0x08});  // little endian
}

TEST(ExtendedHeader, ParsesWhatItEncodes) {
  ExtendedHeader eh;
  eh.program_size = 21200;
  eh.segment_base_offset = 21248;
  eh.segment_data_size = 993536;
  std::vector<std::byte> file(64);
  std::memcpy(file.data() + 4, "ET12", 4);
  auto h = encode_extended_header(eh);
  std::memcpy(file.data() + 8, h.data(), h.size());
  ExtendedHeader back;
  ASSERT_EQ(parse_extended_header(file, &back), HeaderParse::Ok);
  EXPECT_EQ(back.length, 32u);
  EXPECT_EQ(back.program_size, 21200u);
  EXPECT_EQ(back.segment_base_offset, 21248u);
  EXPECT_EQ(back.segment_data_size, 993536u);
}

TEST(ExtendedHeader, OlderShortHeaderHasNoSegmentDataSize) {
  std::vector<std::byte> file(40);
  std::memcpy(file.data() + 8, "eh00", 4);
  write_le(file.data() + 12, 24, 4);
  write_le(file.data() + 16, 1000, 8);
  write_le(file.data() + 24, 1024, 8);
  write_le(file.data() + 32, 777, 8);  // beyond the 24-byte header: not a field
  ExtendedHeader eh;
  ASSERT_EQ(parse_extended_header(file, &eh), HeaderParse::Ok);
  EXPECT_EQ(eh.length, 24u);
  EXPECT_EQ(eh.program_size, 1000u);
  EXPECT_EQ(eh.segment_base_offset, 1024u);
  EXPECT_EQ(eh.segment_data_size, 0u);
}

TEST(ExtendedHeader, RejectsAbsentShortAndTruncatedHeaders) {
  std::vector<std::byte> file(64);
  ExtendedHeader eh;
  EXPECT_EQ(parse_extended_header(file, &eh), HeaderParse::Absent);  // no magic
  std::memcpy(file.data() + 8, "eh00", 4);
  write_le(file.data() + 12, 16, 4);
  EXPECT_EQ(parse_extended_header(file, &eh), HeaderParse::BadLength);
  write_le(file.data() + 12, 32, 4);
  EXPECT_EQ(parse_extended_header(std::span(file).first(30), &eh), HeaderParse::TooShort);
  EXPECT_EQ(parse_extended_header(std::span(file).first(36), &eh), HeaderParse::TooShort);  // length 32 needs 40
  EXPECT_EQ(parse_extended_header(std::span(file).first(40), &eh), HeaderParse::Ok);
  EXPECT_EQ(parse_extended_header(std::span(file).first(6), &eh), HeaderParse::Absent);
}

TEST(ExtendedHeader, AlignUp) {
  EXPECT_EQ(align_up(0, 128), 0u);
  EXPECT_EQ(align_up(1, 128), 128u);
  EXPECT_EQ(align_up(32128, 128), 32128u);
  EXPECT_EQ(align_up(21200, 128), 21248u);
  EXPECT_EQ(align_up(32, 16), 32u);
  EXPECT_TRUE(is_power_of_two(16));
  EXPECT_FALSE(is_power_of_two(24));
}

TEST_F(PteTest, WriterLayoutFollowsExecuTorchRules) {
  const fs::path path = dir_ / "sample.pte";
  write_pte(sample_program(), path.string());
  ASSERT_TRUE(fs::exists(path));
  EXPECT_FALSE(fs::exists(path.string() + ".tmp"));
  const auto bytes = read_file(path);

  ExtendedHeader eh;
  ASSERT_EQ(parse_extended_header(bytes, &eh), HeaderParse::Ok);
  EXPECT_EQ(eh.length, 32u);
  EXPECT_GE(read_le(bytes.data(), 4), 40u);  // the root table lies after the inserted header
  EXPECT_EQ(eh.segment_base_offset, align_up(eh.program_size, 128));
  EXPECT_EQ(eh.segment_base_offset + eh.segment_data_size, bytes.size());  // no padding after the last segment
  EXPECT_EQ(std::memcmp(bytes.data() + 4, "ET12", 4), 0);

  rt::ErrorMessage error;
  auto opened = rt::PteFile::open(path.c_str(), &error);
  ASSERT_TRUE(opened.ok()) << error.c_str();
  const rt::PteFile& f = opened.value();
  const fb::Program& p = f.program();

  // Segments: constants, the one non-empty delegate payload (used twice, stored once), two named blobs.
  ASSERT_EQ(f.segment_count(), 4u);
  uint64_t prev_end = 0;
  for (uint32_t i = 0; i < 4; ++i) {
    const fb::DataSegment* s = p.segments()->Get(i);
    EXPECT_EQ(s->offset(), align_up(prev_end, 128)) << "segment " << i;
    prev_end = s->offset() + s->size();
  }
  EXPECT_EQ(prev_end, eh.segment_data_size);

  // Constant segment: offsets[0] is the empty reserved slot; each constant but the last padded to 16.
  ASSERT_NE(p.constant_segment(), nullptr);
  EXPECT_EQ(p.constant_segment()->segment_index(), 0u);
  std::vector<uint64_t> offsets(p.constant_segment()->offsets()->begin(), p.constant_segment()->offsets()->end());
  EXPECT_EQ(offsets, (std::vector<uint64_t>{0, 0, 48, 64}));
  EXPECT_EQ(p.segments()->Get(0)->size(), 80u);
  ASSERT_EQ(f.constant_count(), 4u);
  EXPECT_EQ(f.constant(0).value().size(), 0u);
  auto c1 = f.constant(1).value();
  EXPECT_TRUE(std::equal(c1.begin(), c1.end(), pattern(48, 1).begin()));
  auto c2 = f.constant(2).value();  // 5 bytes + 11 of zero padding
  ASSERT_EQ(c2.size(), 16u);
  EXPECT_TRUE(std::equal(c2.begin(), c2.begin() + 5, pattern(5, 2).begin()));
  for (size_t i = 5; i < 16; ++i) EXPECT_EQ(c2[i], std::byte{0});
  auto c3 = f.constant(3).value();
  EXPECT_TRUE(std::equal(c3.begin(), c3.end(), pattern(16, 3).begin()));
  EXPECT_EQ(f.constant(4).status(), rt::Status::OutOfRange);

  // Delegates: payload 0 in segment 1 for both users; the empty payload inline.
  const fb::ExecutionPlan* plan = f.plan("forward").value();
  ASSERT_EQ(plan->delegates()->size(), 3u);
  EXPECT_EQ(plan->delegates()->Get(0)->processed()->location(), fb::DataLocation::SEGMENT);
  EXPECT_EQ(plan->delegates()->Get(0)->processed()->index(), 1u);
  EXPECT_EQ(plan->delegates()->Get(2)->processed()->index(), 1u);
  EXPECT_EQ(plan->delegates()->Get(1)->processed()->location(), fb::DataLocation::INLINE);
  EXPECT_EQ(p.backend_delegate_data()->size(), 1u);
  auto payload = f.delegate_payload(0, 2).value();
  auto expected_payload = pattern(1000, 4);
  EXPECT_TRUE(std::equal(payload.begin(), payload.end(), expected_payload.begin(), expected_payload.end()));
  EXPECT_EQ(f.delegate_payload(0, 1).value().size(), 0u);
  EXPECT_EQ(plan->delegates()->Get(0)->compile_specs()->Get(0)->key()->str(), "k");

  // Named data by key.
  auto a = f.named_data("weights.a").value();
  auto expected_a = pattern(300, 5);
  EXPECT_TRUE(std::equal(a.begin(), a.end(), expected_a.begin(), expected_a.end()));
  EXPECT_EQ(f.named_data("weights.b").value().size(), 7u);
  EXPECT_EQ(f.named_data("weights.c").status(), rt::Status::NotFound);

  // Values as written.
  ASSERT_EQ(plan->values()->size(), 9u);
  const fb::Tensor* out1 = plan->values()->Get(5)->val_as_Tensor();
  ASSERT_NE(out1, nullptr);
  EXPECT_EQ(out1->allocation_info()->memory_id(), 1u);
  EXPECT_EQ(out1->allocation_info()->memory_offset_low(), 32u);
  EXPECT_EQ(std::vector<uint8_t>(out1->dim_order()->begin(), out1->dim_order()->end()), (std::vector<uint8_t>{0, 1}));
  EXPECT_EQ(plan->values()->Get(4)->val_as_Int()->int_val(), 1);
  EXPECT_EQ(plan->values()->Get(6)->val_as_IntList()->items()->Get(0), 4);
  EXPECT_EQ(plan->values()->Get(7)->val_type(), fb::KernelTypes::Null);
  EXPECT_EQ(plan->values()->Get(8)->val_as_OptionalTensorList()->items()->Get(1), -1);
  EXPECT_EQ(plan->chains()->Get(0)->instructions()->size(), 5u);
}

TEST_F(PteTest, ProgramWithoutSegmentDataHasNoHeader) {
  Program p;
  ExecutionPlan plan;
  plan.values = {int64_t{3}};
  plan.outputs = {0};
  p.plans.push_back(plan);
  const fs::path path = dir_ / "bare.pte";
  write_pte(p, path.string());
  auto bytes = read_file(path);
  ExtendedHeader eh;
  EXPECT_EQ(parse_extended_header(bytes, &eh), HeaderParse::Absent);
  auto f = rt::PteFile::open(path.c_str());
  ASSERT_TRUE(f.ok());
  EXPECT_FALSE(f->has_extended_header());
  EXPECT_EQ(f->segment_count(), 1u);  // the empty constant segment, as ExecuTorch writes it
  EXPECT_EQ(f->constant_count(), 1u);
}

TEST_F(PteTest, LargeBlobIsStreamedInPieces) {
  Program p = sample_program();
  size_t calls = 0;
  const uint64_t big = 3u << 20;
  DataBlob blob;
  blob.size = big;
  blob.write = [&](const std::function<void(std::span<const std::byte>)>& sink) {
    std::vector<std::byte> chunk(64 << 10);
    for (uint64_t off = 0; off < big; off += chunk.size()) {
      for (size_t i = 0; i < chunk.size(); ++i) chunk[i] = static_cast<std::byte>((off + i) % 253);
      sink(chunk);
      ++calls;
    }
  };
  p.constants.push_back(blob);
  const fs::path path = dir_ / "big.pte";
  write_pte(p, path.string());
  EXPECT_EQ(calls, big / (64 << 10));
  auto f = rt::PteFile::open(path.c_str());
  ASSERT_TRUE(f.ok());
  auto c = f->constant(4).value();
  ASSERT_EQ(c.size(), big);
  for (uint64_t i = 0; i < big; i += 4099) ASSERT_EQ(c[i], static_cast<std::byte>(i % 253)) << i;
}

TEST_F(PteTest, FailedWriteLeavesNoFileBehind) {
  const fs::path path = dir_ / "out.pte";
  write_file(path, pattern(10, 9));  // an older file at the destination survives a failed write
  Program p = sample_program();
  DataBlob liar;
  liar.size = 100;
  liar.write = [](const std::function<void(std::span<const std::byte>)>& sink) {
    std::vector<std::byte> half(50);
    sink(half);
  };
  p.constants.push_back(liar);
  try {
    write_pte(p, path.string());
    FAIL() << "expected kiln::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("constant 4 streamed 50 bytes but declares 100"), std::string::npos)
        << e.what();
  }
  EXPECT_FALSE(fs::exists(path.string() + ".tmp"));
  EXPECT_EQ(read_file(path), pattern(10, 9));
}

TEST_F(PteTest, WriterRejectsInconsistentPrograms) {
  const fs::path path = dir_ / "bad.pte";
  auto expect_error = [&](Program p, const std::string& needle) {
    try {
      write_pte(p, path.string());
      ADD_FAILURE() << "no error, expected: " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
    EXPECT_FALSE(fs::exists(path));
    EXPECT_FALSE(fs::exists(path.string() + ".tmp"));
  };
  Program p = sample_program();
  std::get<KernelCall>(p.plans[0].instructions[0]).args[1] = 42;
  expect_error(p, "names value 42");
  p = sample_program();
  std::get<TensorValue>(p.plans[0].values[1]).constant_index = 9;
  expect_error(p, "constant 9 out of range");
  p = sample_program();
  std::get<TensorValue>(p.plans[0].values[5]).allocation->offset = 40;
  expect_error(p, "exceed planned buffer 1");
  p = sample_program();
  p.delegate_payloads.push_back(DataBlob::from_bytes(pattern(3, 0)));
  expect_error(p, "delegate payload 2 is not used");
  p = sample_program();
  p.named_data.push_back(p.named_data[0]);
  expect_error(p, "appears twice");
}

TEST_F(PteTest, LoaderRejectsDamagedFiles) {
  const fs::path good = dir_ / "good.pte";
  write_pte(sample_program(), good.string());
  const auto bytes = read_file(good);
  ExtendedHeader eh;
  ASSERT_EQ(parse_extended_header(bytes, &eh), HeaderParse::Ok);
  const fs::path bad = dir_ / "bad.pte";

  auto damaged = bytes;
  std::memcpy(damaged.data() + 4, "ET11", 4);
  write_file(bad, damaged);
  EXPECT_NE(open_error(bad).find("file identifier is 'ET11'"), std::string::npos);

  write_file(bad, std::vector<std::byte>(bytes.begin(), bytes.begin() + static_cast<long>(bytes.size() - 1)));
  EXPECT_NE(open_error(bad).find("of segment data at byte"), std::string::npos);

  write_file(bad, std::vector<std::byte>(bytes.begin(), bytes.begin() + 20));
  EXPECT_NE(open_error(bad).find("ends inside the extended header"), std::string::npos);

  write_file(bad, std::vector<std::byte>(bytes.begin(), bytes.begin() + 4));
  EXPECT_NE(open_error(bad).find("too short"), std::string::npos);

  damaged = bytes;
  write_le(damaged.data() + 16, bytes.size() + 1, 8);  // program size past the end
  write_file(bad, damaged);
  EXPECT_NE(open_error(bad).find("exceeds the"), std::string::npos);

  damaged = bytes;
  write_le(damaged.data(), 0x7ffffff0, 4);  // root offset out of the buffer
  write_file(bad, damaged);
  EXPECT_NE(open_error(bad).find("fails verification"), std::string::npos);

  // A segment's offset moved past the end of the file: find DataSegment 3's offset field in the flatbuffer.
  {
    auto f = rt::PteFile::open(good.c_str());
    ASSERT_TRUE(f.ok());
    const auto* seg = reinterpret_cast<const flatbuffers::Table*>(f->program().segments()->Get(3));
    const uint8_t* field = seg->GetAddressOf(fb::DataSegment::VT_OFFSET);
    ASSERT_NE(field, nullptr);
    size_t at = static_cast<size_t>(reinterpret_cast<const std::byte*>(field) - f->bytes().data());
    damaged = bytes;
    write_le(damaged.data() + at, 1u << 30, 8);
  }
  write_file(bad, damaged);
  std::string msg = open_error(bad);
  EXPECT_NE(msg.find("segment 3 starts past the end of the"), std::string::npos) << msg;

  EXPECT_NE(open_error(dir_ / "missing.pte", rt::Status::AccessFailed).find("cannot open"), std::string::npos);
}

}  // namespace
