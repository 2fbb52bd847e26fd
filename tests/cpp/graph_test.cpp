#include "kiln/core/error.h"
#include "kiln/graph/graph.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace kiln::graph {
namespace {

TensorMeta meta(std::vector<int64_t> sizes, std::vector<int64_t> strides, int64_t offset = 0) {
  TensorMeta m;
  m.sizes = std::move(sizes);
  m.strides = std::move(strides);
  m.storage_offset = offset;
  return m;
}

TEST(TensorMeta, ContiguityAndExtent) {
  EXPECT_TRUE(meta({2, 3}, {3, 1}).is_contiguous());
  EXPECT_FALSE(meta({2, 3}, {1, 2}).is_contiguous());  // a transpose
  EXPECT_TRUE(meta({1, 3}, {99, 1}).is_contiguous());  // size-1 dims carry any stride
  EXPECT_EQ(meta({2, 3}, {3, 1}).storage_extent(), 6);
  EXPECT_EQ(meta({3, 2}, {1, 3}, 4).storage_extent(), 4 + 6);
  EXPECT_EQ(meta({0, 3}, {3, 1}).storage_extent(), 0);
  EXPECT_EQ(meta({}, {}).numel(), 1);  // a scalar
  EXPECT_EQ(meta({2, 3}, {3, 1}).nbytes(), 24);
}

TEST(Graph, ValuesAreUniqueByName) {
  Graph g;
  ValueId a = g.add_value("a", meta({2}, {1}));
  EXPECT_EQ(g.find_value("a"), a);
  EXPECT_FALSE(g.find_value("b").has_value());
  EXPECT_THROW(g.add_value("a", meta({2}, {1})), kiln::Error);
}

// The passes hold a value's meta by reference while they add values (Lowerer::meta_of): adding must not move
// the others (a reallocating vector once left such a reference dangling, a segfault lowering Gemma 4).
TEST(Graph, AddingValuesKeepsReferencesToOthersValid) {
  Graph g;
  ValueId a = g.add_value("a", meta({2, 3}, {3, 1}));
  const TensorMeta& am = g.value(a).meta;
  const TensorMeta* before = &am;
  for (int i = 0; i < 100000; ++i) g.add_value("v" + std::to_string(i), meta({i}, {1}));
  EXPECT_EQ(&g.value(a).meta, before);
  EXPECT_EQ(am.sizes, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(g.value(static_cast<ValueId>(100000)).meta.sizes, (std::vector<int64_t>{99999}));
}

TEST(Graph, OperatorHistogramCountsCallSites) {
  Graph g;
  g.nodes.push_back(Node{"n0", "aten.add.Tensor", {}, {}, {}, {}});
  g.nodes.push_back(Node{"n1", "aten.view.default", {}, {}, {}, {}});
  g.nodes.push_back(Node{"n2", "aten.add.Tensor", {}, {}, {}, {}});
  auto h = g.operator_histogram();
  EXPECT_EQ(h.size(), 2u);
  EXPECT_EQ(h["aten.add.Tensor"], 2);
  EXPECT_EQ(h["aten.view.default"], 1);
}

TEST(Argument, TensorIdsSkipMissingOptionals) {
  Argument a;
  a.kind = Argument::Kind::OptionalTensors;
  a.payload = std::vector<std::optional<ValueId>>{std::nullopt, 3, std::nullopt, 5};
  EXPECT_EQ(a.tensor_ids(), (std::vector<ValueId>{3, 5}));
  EXPECT_TRUE(Argument::integer(4).tensor_ids().empty());
}

TEST(Names, KindNamesAsTheExportSchemaSpellsThem) {
  EXPECT_EQ(argument_kind_name(Argument::Kind::None), "none");
  EXPECT_EQ(argument_kind_name(Argument::Kind::OptionalTensors), "optional_tensors");
  EXPECT_EQ(argument_kind_name(Argument::Kind::Device), "device");
  EXPECT_EQ(argument_kind_name(static_cast<Argument::Kind>(200)), "?");
  EXPECT_EQ(input_kind_name(InputSpec::Kind::UserInput), "user_input");
  EXPECT_EQ(input_kind_name(InputSpec::Kind::Token), "token");
  EXPECT_EQ(output_kind_name(OutputSpec::Kind::UserInputMutation), "user_input_mutation");
  EXPECT_EQ(output_kind_name(OutputSpec::Kind::Token), "token");
}

}  // namespace
}  // namespace kiln::graph
