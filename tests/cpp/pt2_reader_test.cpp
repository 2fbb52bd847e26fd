// The .pt2 reader on small archives built here with libzip, in the layout
// torch.export.save writes: strided weights, tied storage, malformed fields.
#include "kiln/core/error.h"
#include "kiln/pt2/pt2_reader.h"
#include "test_support.h"

#include <gtest/gtest.h>
#include <zip.h>

#include <cstring>
#include <filesystem>
#include <map>
#include <string>

namespace kiln::pt2 {
namespace {

namespace fs = std::filesystem;

using test::write_zip;

std::string floats(std::initializer_list<float> xs) {
  std::string s(xs.size() * sizeof(float), '\0');
  std::memcpy(s.data(), std::data(xs), s.size());
  return s;
}

// A tensor_meta JSON (float32, dtype code 7 in the export schema).
std::string meta_json(const std::string& sizes, const std::string& strides, int offset = 0) {
  return R"({"dtype": 7, "sizes": )" + sizes + R"(, "strides": )" + strides + R"(, "storage_offset": {"as_int": )" +
         std::to_string(offset) + R"(}, "requires_grad": false, "device": {"type": "cpu", "index": null}, "layout": 7})";
}

// out = add(x, w) where w [3,2] is stored transposed (strides [1,3]) in a [2,3] storage,
// and v is a second parameter tied to the same storage, contiguous [2,3].
std::map<std::string, std::string> archive_files(const std::string& arg_override = "") {
  std::string x_arg = arg_override.empty() ? R"({"as_tensor": {"name": "x"}})" : arg_override;
  std::string model = R"({
    "graph_module": {
      "graph": {
        "inputs": [{"as_tensor": {"name": "p_w"}}, {"as_tensor": {"name": "p_v"}}, {"as_tensor": {"name": "x"}}],
        "outputs": [{"as_tensor": {"name": "add"}}],
        "nodes": [{"target": "torch.ops.aten.add.Tensor", "name": "add",
                   "inputs": [{"name": "self", "arg": )" + x_arg + R"(, "kind": 1},
                              {"name": "other", "arg": {"as_tensor": {"name": "p_w"}}, "kind": 1},
                              {"name": "alpha", "arg": {"as_float": "Infinity"}, "kind": 2}],
                   "outputs": [{"as_tensor": {"name": "add"}}], "metadata": {}}],
        "tensor_values": {
          "x": )" + meta_json(R"([{"as_int": 3}, {"as_int": 2}])", R"([{"as_int": 2}, {"as_int": 1}])") + R"(,
          "p_w": )" + meta_json(R"([{"as_int": 3}, {"as_int": 2}])", R"([{"as_int": 1}, {"as_int": 3}])") + R"(,
          "p_v": )" + meta_json(R"([{"as_int": 2}, {"as_int": 3}])", R"([{"as_int": 3}, {"as_int": 1}])") + R"(,
          "add": )" + meta_json(R"([{"as_int": 3}, {"as_int": 2}])", R"([{"as_int": 2}, {"as_int": 1}])") + R"(
        },
        "sym_int_values": {}, "sym_bool_values": {}, "is_single_tensor_return": false
      },
      "signature": {
        "input_specs": [
          {"parameter": {"arg": {"name": "p_w"}, "parameter_name": "w"}},
          {"parameter": {"arg": {"name": "p_v"}, "parameter_name": "v"}},
          {"user_input": {"arg": {"as_tensor": {"name": "x"}}}}],
        "output_specs": [{"user_output": {"arg": {"as_tensor": {"name": "add"}}}}]
      }
    },
    "schema_version": {"major": 8, "minor": 20}, "torch_version": "2.13.0+cpu", "verifiers": ["TRAINING"]
  })";
  std::string weights = R"({"config": {
      "w": {"path_name": "weight_0", "is_param": true, "use_pickle": false, "tensor_meta": )" +
                        meta_json(R"([{"as_int": 3}, {"as_int": 2}])", R"([{"as_int": 1}, {"as_int": 3}])") + R"(},
      "v": {"path_name": "weight_0", "is_param": true, "use_pickle": false, "tensor_meta": )" +
                        meta_json(R"([{"as_int": 2}, {"as_int": 3}])", R"([{"as_int": 3}, {"as_int": 1}])") + R"(}}})";
  return {{"m/models/model.json", model},
          {"m/data/weights/model_weights_config.json", weights},
          {"m/data/weights/weight_0", floats({0, 1, 2, 3, 4, 5})},
          {"m/archive_format", "pt2"},
          {"m/byteorder", "little"}};
}

std::vector<float> read_floats(const ExportedProgram& ep, const ConstantTensor& c) {
  std::vector<float> out(static_cast<size_t>(c.meta.numel()));
  ep.read_constant(c, std::as_writable_bytes(std::span<float>(out)));
  return out;
}

std::string error_of(const std::string& path) {
  try {
    read_pt2(path);
  } catch (const kiln::Error& e) {
    return e.what();
  }
  return "";
}

TEST(Pt2Reader, ReadsGraphSignatureAndStridedTiedWeights) {
  std::string path = write_zip("reader_ok", archive_files());
  ExportedProgram ep = read_pt2(path);
  ASSERT_EQ(ep.graph.nodes.size(), 1u);
  EXPECT_EQ(ep.graph.nodes[0].target, "aten.add.Tensor");
  EXPECT_EQ(ep.dialect, "TRAINING");
  EXPECT_EQ(ep.schema_version, "8.20");
  ASSERT_EQ(ep.signature.inputs.size(), 3u);
  EXPECT_EQ(ep.signature.inputs[2].kind, graph::InputSpec::Kind::UserInput);
  const auto* alpha = ep.graph.nodes[0].input("alpha");
  ASSERT_NE(alpha, nullptr);
  EXPECT_TRUE(alpha->keyword);
  EXPECT_TRUE(std::isinf(std::get<double>(alpha->arg.payload)));

  const ConstantTensor* w = ep.find_constant("w");
  const ConstantTensor* v = ep.find_constant("v");
  ASSERT_TRUE(w && v);
  EXPECT_EQ(w->entry, v->entry);  // tied: one storage entry
  // w is the transpose of the [2,3] storage 0..5; read row-major: 0 3 1 4 2 5.
  EXPECT_EQ(read_floats(ep, *w), (std::vector<float>{0, 3, 1, 4, 2, 5}));
  EXPECT_EQ(read_floats(ep, *v), (std::vector<float>{0, 1, 2, 3, 4, 5}));
  fs::remove(path);
}

TEST(Pt2Reader, UnknownArgumentKindIsAnErrorNamingTheNode) {
  std::string path = write_zip("reader_badarg", archive_files(R"({"as_mystery": 1})"));
  std::string msg = error_of(path);
  EXPECT_NE(msg.find("unknown argument kind 'as_mystery'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("node 'add'"), std::string::npos) << msg;
  fs::remove(path);
}

TEST(Pt2Reader, ShortWeightIsAnError) {
  auto files = archive_files();
  files["m/data/weights/weight_0"] = floats({0, 1, 2});
  std::string path = write_zip("reader_short", files);
  std::string msg = error_of(path);
  EXPECT_NE(msg.find("holds 12 bytes but its metadata needs 24"), std::string::npos) << msg;
  fs::remove(path);
}

TEST(Pt2Reader, MissingGraphIsAnError) {
  auto files = archive_files();
  files.erase("m/models/model.json");
  std::string path = write_zip("reader_nograph", files);
  EXPECT_NE(error_of(path).find("no serialized graph"), std::string::npos);
  fs::remove(path);
}

TEST(Pt2Reader, DanglingTensorReferenceIsAnError) {
  std::string path = write_zip("reader_dangling", archive_files(R"({"as_tensor": {"name": "nope"}})"));
  EXPECT_NE(error_of(path).find("unknown tensor 'nope'"), std::string::npos);
  fs::remove(path);
}

TEST(Pt2Reader, NotAZipIsAnError) {
  fs::path path = fs::temp_directory_path() / "reader_notzip.pt2";
  FILE* f = std::fopen(path.c_str(), "wb");
  std::fputs("this is not a zip archive", f);
  std::fclose(f);
  EXPECT_NE(error_of(path.string()).find("not a readable .pt2 archive"), std::string::npos);
  fs::remove(path);
}

}  // namespace
}  // namespace kiln::pt2
