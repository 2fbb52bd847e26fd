// to_edge, graph in, graph out: small programs in the default export IR are
// built here node by node (as the .pt2 reader would produce them; weights in
// a small zip written with libzip), lowered, and the edge graph's targets,
// arguments and constants compared with what ATen's decompositions and
// ExecuTorch's edge dialect prescribe; folded constants against values
// computed here.
#include "kiln/core/error.h"
#include "kiln/passes/edge_program.h"
#include "test_support.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <string>

namespace kiln::passes {
namespace {

namespace fs = std::filesystem;
using graph::Argument;
using graph::NamedArgument;
using graph::ValueId;

graph::TensorMeta meta(std::vector<int64_t> sizes, ScalarType dtype = ScalarType::Float) {
  return test::contiguous_meta(std::move(sizes), dtype);
}

NamedArgument T(std::string name, ValueId v) { return {std::move(name), Argument::tensor(v), false}; }
NamedArgument I(std::string name, int64_t x) { return {std::move(name), Argument::integer(x), false}; }
NamedArgument F(std::string name, double x) { return {std::move(name), {Argument::Kind::Float, x}, false}; }
NamedArgument B(std::string name, bool x) { return {std::move(name), {Argument::Kind::Bool, x}, false}; }
NamedArgument Ints(std::string name, std::vector<int64_t> xs) {
  return {std::move(name), {Argument::Kind::Ints, std::move(xs)}, false};
}
NamedArgument DType(std::string name, ScalarType t) { return {std::move(name), {Argument::Kind::ScalarType, t}, false}; }

// An exported program in the making: inputs, parameters (their bytes in a
// zip entry each; tied parameters name one entry), nodes and outputs.
class Source {
 public:
  ~Source() {
    if (!path_.empty()) fs::remove(path_);
  }

  ValueId input(std::vector<int64_t> sizes, ScalarType dtype = ScalarType::Float) {
    std::string name = "x" + std::to_string(counter_++);
    ValueId v = ep_.graph.add_value(name, meta(std::move(sizes), dtype));
    ep_.graph.inputs.push_back(v);
    ep_.signature.inputs.push_back({graph::InputSpec::Kind::UserInput, name, "", true});
    return v;
  }

  // A parameter holding `data`; `entry` names its storage (the same entry for tied parameters).
  ValueId param(std::vector<int64_t> sizes, std::vector<float> data, std::string entry = "") {
    std::string name = "p" + std::to_string(counter_++);
    if (entry.empty()) entry = "data/weights/" + name;
    ValueId v = ep_.graph.add_value("p_" + name, meta(sizes));
    ep_.graph.inputs.push_back(v);
    ep_.signature.inputs.push_back({graph::InputSpec::Kind::Parameter, "p_" + name, name, true});
    std::string bytes(data.size() * sizeof(float), '\0');
    std::memcpy(bytes.data(), data.data(), bytes.size());
    auto [it, fresh] = entries_.emplace(entry, bytes);
    EXPECT_TRUE(fresh || it->second == bytes) << "tied parameters must hold the same bytes";
    ep_.constants.push_back({name, pt2::ConstantTensor::Kind::Parameter, meta(sizes), entry, bytes.size()});
    return v;
  }

  // A node of `target` with `inputs`, returning one tensor per entry of `outs`.
  std::vector<ValueId> call(std::string target, std::vector<NamedArgument> inputs,
                            std::vector<graph::TensorMeta> outs) {
    graph::Node n;
    n.name = "n" + std::to_string(counter_++);
    n.target = std::move(target);
    n.inputs = std::move(inputs);
    n.stack_trace = "File \"model.py\", line 7, in forward";
    std::vector<ValueId> ids;
    for (size_t i = 0; i < outs.size(); ++i) {
      ValueId v = ep_.graph.add_value(n.name + "_" + std::to_string(i), std::move(outs[i]));
      ep_.graph.values[static_cast<size_t>(v)].producer = static_cast<int32_t>(ep_.graph.nodes.size());
      n.outputs.push_back(Argument::tensor(v));
      ids.push_back(v);
    }
    ep_.graph.nodes.push_back(std::move(n));
    return ids;
  }
  ValueId call1(std::string target, std::vector<NamedArgument> inputs, graph::TensorMeta out) {
    return call(std::move(target), std::move(inputs), {std::move(out)})[0];
  }

  void output(ValueId v) {
    ep_.graph.outputs.push_back(Argument::tensor(v));
    ep_.signature.outputs.push_back({graph::OutputSpec::Kind::UserOutput, ep_.graph.value(v).name, ""});
  }

  // The program, its weights in a zip archive on disk.
  const pt2::ExportedProgram& finish() {
    static int serial = 0;
    std::map<std::string, std::string> files = entries_;
    if (files.empty()) files["empty"] = "";  // libzip writes no file for an empty archive
    path_ = test::write_zip("kiln_decompose_" + std::to_string(serial++), files);
    ep_.path = path_;
    ep_.dialect = "TRAINING";
    ep_.archive = std::make_shared<const pt2::Pt2Archive>(path_);
    return ep_;
  }

 private:
  pt2::ExportedProgram ep_;
  std::map<std::string, std::string> entries_;
  std::string path_;
  int counter_ = 0;
};

std::vector<std::string> targets(const EdgeProgram& p) {
  std::vector<std::string> out;
  for (const auto& n : p.graph.nodes) out.push_back(n.target);
  return out;
}

std::vector<std::string> input_names(const graph::Node& n) {
  std::vector<std::string> out;
  for (const auto& in : n.inputs) out.push_back(in.name);
  return out;
}

const Argument& arg(const graph::Node& n, std::string_view name) {
  const auto* a = n.input(name);
  if (a == nullptr) throw std::runtime_error("node " + n.name + " has no argument " + std::string(name));
  return a->arg;
}

ValueId tensor(const graph::Node& n, std::string_view name) {
  const Argument& a = arg(n, name);
  EXPECT_EQ(a.kind, Argument::Kind::Tensor) << name;
  return std::get<ValueId>(a.payload);
}

std::vector<int64_t> ints(const graph::Node& n, std::string_view name) {
  return std::get<std::vector<int64_t>>(arg(n, name).payload);
}

std::vector<float> floats_of(const EdgeProgram& p, ValueId v) {
  std::vector<std::byte> bytes = p.constant_bytes(v);
  std::vector<float> out(bytes.size() / sizeof(float));
  std::memcpy(out.data(), bytes.data(), bytes.size());
  return out;
}

// The edge value the program outputs in position i.
ValueId output(const EdgeProgram& p, size_t i = 0) { return p.outputs.at(i); }
const graph::Node& producer_of(const EdgeProgram& p, ValueId v) {
  int32_t i = p.graph.value(v).producer;
  EXPECT_GE(i, 0) << p.graph.value(v).name << " has no producer";
  return p.graph.nodes.at(static_cast<size_t>(i));
}

// --- linear ---------------------------------------------------------------

TEST(Decompose, LinearWithAWeightBecomesAddmmAgainstItsFoldedTranspose) {
  Source s;
  ValueId w = s.param({2, 3}, {0, 1, 2, 3, 4, 5});
  ValueId b = s.param({2}, {10, 20});
  ValueId x = s.input({4, 3});
  s.output(s.call1("aten.linear.default", {T("input", x), T("weight", w), T("bias", b)}, meta({4, 2})));
  LoweringStats stats;
  EdgeProgram p = to_edge(s.finish(), &stats);

  ASSERT_EQ(targets(p), std::vector<std::string>{"aten.addmm.default"});
  const auto& mm = p.graph.nodes[0];
  EXPECT_EQ(input_names(mm), (std::vector<std::string>{"self", "mat1", "mat2"}));
  EXPECT_EQ(tensor(mm, "mat1"), p.graph.inputs.at(0));
  ASSERT_TRUE(p.is_constant(tensor(mm, "self")));
  EXPECT_EQ(floats_of(p, tensor(mm, "self")), (std::vector<float>{10, 20}));
  // mat2 = W^T [3, 2], computed ahead of time: W's only reader is this node.
  ValueId wt = tensor(mm, "mat2");
  ASSERT_TRUE(p.is_constant(wt));
  EXPECT_EQ(p.graph.value(wt).meta.sizes, (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(floats_of(p, wt), (std::vector<float>{0, 3, 1, 4, 2, 5}));
  EXPECT_EQ(output(p), mm.output_ids().at(0));
  EXPECT_EQ(p.graph.value(output(p)).meta.sizes, (std::vector<int64_t>{4, 2}));
  EXPECT_EQ(stats.folded_nodes, 1);
  EXPECT_EQ(p.constants.size(), 2u);  // the bias and W^T; W itself is no longer read
}

TEST(Decompose, LinearOnAnActivationIsPermuteCopyThenMm) {
  Source s;
  ValueId x = s.input({4, 3});
  ValueId w = s.input({2, 3});
  s.output(s.call1("aten.linear.default", {T("input", x), T("weight", w)}, meta({4, 2})));
  EdgeProgram p = to_edge(s.finish());

  ASSERT_EQ(targets(p), (std::vector<std::string>{"aten.permute_copy.default", "aten.mm.default"}));
  const auto& perm = p.graph.nodes[0];
  const auto& mm = p.graph.nodes[1];
  EXPECT_EQ(tensor(perm, "self"), p.graph.inputs.at(1));
  EXPECT_EQ(ints(perm, "dims"), (std::vector<int64_t>{1, 0}));
  EXPECT_EQ(p.graph.value(perm.output_ids()[0]).meta.sizes, (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(tensor(mm, "self"), p.graph.inputs.at(0));
  EXPECT_EQ(tensor(mm, "mat2"), perm.output_ids()[0]);
  EXPECT_TRUE(p.constants.empty());
}

TEST(Decompose, BatchedLinearFlattensRowsAroundMm) {
  Source s;
  ValueId w = s.param({2, 3}, {1, 0, 0, 0, 1, 0});
  ValueId x = s.input({2, 4, 3});
  s.output(s.call1("aten.linear.default", {T("input", x), T("weight", w)}, meta({2, 4, 2})));
  EdgeProgram p = to_edge(s.finish());

  ASSERT_EQ(targets(p),
            (std::vector<std::string>{"aten.view_copy.default", "aten.mm.default", "aten.view_copy.default"}));
  EXPECT_EQ(ints(p.graph.nodes[0], "size"), (std::vector<int64_t>{8, 3}));
  EXPECT_EQ(tensor(p.graph.nodes[1], "self"), p.graph.nodes[0].output_ids()[0]);
  EXPECT_EQ(floats_of(p, tensor(p.graph.nodes[1], "mat2")), (std::vector<float>{1, 0, 0, 1, 0, 0}));
  EXPECT_EQ(ints(p.graph.nodes[2], "size"), (std::vector<int64_t>{2, 4, 2}));
  EXPECT_EQ(output(p), p.graph.nodes[2].output_ids()[0]);
}

TEST(Decompose, TiedWeightIsStoredOnceAndTransposedAtRunTime) {
  // Two parameters over one storage (an embedding tied to the LM head, say):
  // neither linear may fold its own transposed copy of the weight.
  Source s;
  std::vector<float> data{1, 2, 3, 4, 5, 6};
  ValueId w1 = s.param({2, 3}, data, "data/weights/tied");
  ValueId w2 = s.param({2, 3}, data, "data/weights/tied");
  ValueId x = s.input({4, 3});
  ValueId y1 = s.call1("aten.linear.default", {T("input", x), T("weight", w1)}, meta({4, 2}));
  ValueId y2 = s.call1("aten.linear.default", {T("input", x), T("weight", w2)}, meta({4, 2}));
  s.output(y1);
  s.output(y2);
  LoweringStats stats;
  EdgeProgram p = to_edge(s.finish(), &stats);

  // x @ W^T computed as (W @ x^T)^T.
  std::vector<std::string> one{"aten.permute_copy.default", "aten.mm.default", "aten.permute_copy.default"};
  std::vector<std::string> both = one;
  both.insert(both.end(), one.begin(), one.end());
  ASSERT_EQ(targets(p), both);
  EXPECT_EQ(stats.folded_nodes, 0);
  for (size_t k : {size_t{0}, size_t{3}}) {
    const auto& xt = p.graph.nodes[k];
    const auto& mm = p.graph.nodes[k + 1];
    const auto& yt = p.graph.nodes[k + 2];
    EXPECT_EQ(tensor(xt, "self"), p.graph.inputs.at(0));
    ValueId wv = tensor(mm, "self");
    ASSERT_TRUE(p.is_constant(wv));
    EXPECT_NE(p.constants.at(wv).source, nullptr);  // the .pt2's weight, not a computed copy
    EXPECT_EQ(p.graph.value(wv).meta.sizes, (std::vector<int64_t>{2, 3}));
    EXPECT_EQ(tensor(mm, "mat2"), xt.output_ids()[0]);
    EXPECT_EQ(tensor(yt, "self"), mm.output_ids()[0]);
    EXPECT_EQ(ints(yt, "dims"), (std::vector<int64_t>{1, 0}));
  }
  for (const auto& [v, c] : p.constants) EXPECT_EQ(c.bytes, nullptr) << p.graph.value(v).name;
}

// --- normalization ----------------------------------------------------------

TEST(Decompose, LayerNormBecomesNativeLayerNorm) {
  Source s;
  ValueId g = s.param({4}, {1, 1, 1, 1});
  ValueId b = s.param({4}, {0, 0, 0, 0});
  ValueId x = s.input({2, 4});
  s.output(s.call1("aten.layer_norm.default",
                   {T("input", x), Ints("normalized_shape", {4}), T("weight", g), T("bias", b), F("eps", 1e-6),
                    B("cudnn_enable", true)},
                   meta({2, 4})));
  EdgeProgram p = to_edge(s.finish());

  ASSERT_EQ(targets(p), std::vector<std::string>{"aten.native_layer_norm.default"});
  const auto& n = p.graph.nodes[0];
  EXPECT_EQ(input_names(n), (std::vector<std::string>{"input", "normalized_shape", "weight", "bias", "eps"}));
  EXPECT_EQ(ints(n, "normalized_shape"), (std::vector<int64_t>{4}));
  EXPECT_EQ(std::get<double>(arg(n, "eps").payload), 1e-6);
  // native_layer_norm returns (out, mean, rstd); mean and rstd keep the
  // normalized dims as size 1.
  auto outs = n.output_ids();
  ASSERT_EQ(outs.size(), 3u);
  EXPECT_EQ(p.graph.value(outs[0]).meta.sizes, (std::vector<int64_t>{2, 4}));
  EXPECT_EQ(p.graph.value(outs[1]).meta.sizes, (std::vector<int64_t>{2, 1}));
  EXPECT_EQ(p.graph.value(outs[2]).meta.sizes, (std::vector<int64_t>{2, 1}));
  EXPECT_EQ(output(p), outs[0]);
}

// --- views and no-ops -------------------------------------------------------

TEST(Decompose, ViewsBecomeCopiesAndNoOpsDisappear) {
  Source s;
  ValueId x = s.input({2, 3, 4});
  ValueId v = s.call1("aten.view.default", {T("self", x), Ints("size", {6, 4})}, meta({6, 4}));
  ValueId t = s.call1("aten.transpose.int", {T("self", v), I("dim0", 0), I("dim1", -1)}, meta({4, 6}));
  ValueId c = s.call1("aten.clone.default", {T("self", t)}, meta({4, 6}));
  ValueId u = s.call1("aten.unsqueeze.default", {T("self", c), I("dim", 0)}, meta({1, 4, 6}));
  ValueId e = s.call1("aten.expand.default", {T("self", u), Ints("size", {3, -1, -1})}, meta({3, 4, 6}));
  ValueId d = s.call1("aten.dropout.default", {T("input", e), F("p", 0.1), B("train", false)}, meta({3, 4, 6}));
  ValueId sel = s.call1("aten.select.int", {T("self", d), I("dim", 0), I("index", 1)}, meta({4, 6}));
  ValueId full = s.call1("aten.slice.Tensor",
                         {T("self", sel), I("dim", 0), I("start", 0), I("end", std::numeric_limits<int64_t>::max())},
                         meta({4, 6}));
  ValueId part = s.call1("aten.slice.Tensor", {T("self", full), I("dim", 1), I("start", 0), I("end", 3)}, meta({4, 3}));
  ValueId same = s.call1("aten._to_copy.default", {T("self", part), DType("dtype", ScalarType::Float)}, meta({4, 3}));
  ValueId conv = s.call1("aten._to_copy.default", {T("self", same), DType("dtype", ScalarType::Long)},
                         meta({4, 3}, ScalarType::Long));
  s.output(conv);
  LoweringStats stats;
  EdgeProgram p = to_edge(s.finish(), &stats);

  ASSERT_EQ(targets(p), (std::vector<std::string>{"aten.view_copy.default", "aten.permute_copy.default",
                                                  "aten.unsqueeze_copy.default", "aten.expand_copy.default",
                                                  "aten.select_copy.int", "aten.slice_copy.Tensor",
                                                  "dim_order_ops._to_dim_order_copy.default"}));
  const auto& nodes = p.graph.nodes;
  for (size_t i = 1; i < nodes.size(); ++i)  // a chain: each reads the one before
    EXPECT_EQ(tensor(nodes[i], "self"), nodes[i - 1].output_ids()[0]) << nodes[i].target;
  EXPECT_EQ(tensor(nodes[0], "self"), p.graph.inputs.at(0));
  EXPECT_EQ(ints(nodes[0], "size"), (std::vector<int64_t>{6, 4}));
  EXPECT_EQ(ints(nodes[1], "dims"), (std::vector<int64_t>{1, 0}));  // transpose(0, -1) of a matrix
  EXPECT_EQ(std::get<int64_t>(arg(nodes[2], "dim").payload), 0);
  EXPECT_EQ(ints(nodes[3], "size"), (std::vector<int64_t>{3, 4, 6}));  // -1 resolved
  EXPECT_EQ(std::get<int64_t>(arg(nodes[4], "index").payload), 1);
  EXPECT_EQ(std::get<int64_t>(arg(nodes[5], "dim").payload), 1);
  EXPECT_EQ(std::get<int64_t>(arg(nodes[5], "end").payload), 3);
  EXPECT_EQ(p.graph.value(output(p)).meta.dtype, ScalarType::Long);
  EXPECT_EQ(p.graph.value(output(p)).meta.sizes, (std::vector<int64_t>{4, 3}));
  // Every edge tensor is contiguous.
  for (const auto& val : p.graph.values) EXPECT_TRUE(val.meta.is_contiguous()) << val.name;
}

// --- scalar operands ----------------------------------------------------------

TEST(Decompose, PythonNumberOperandsSelectScalarOverloads) {
  Source s;
  ValueId x = s.input({2, 3});
  ValueId y = s.input({2, 3});
  ValueId a = s.call1("aten.add.Tensor", {T("self", x), F("other", 2.5)}, meta({2, 3}));
  ValueId m = s.call1("aten.mul.Tensor", {T("self", a), I("other", 3)}, meta({2, 3}));
  ValueId t = s.call1("aten.add.Tensor", {T("self", m), T("other", y)}, meta({2, 3}));
  s.output(t);
  EdgeProgram p = to_edge(s.finish());

  ASSERT_EQ(targets(p), (std::vector<std::string>{"aten.add.Scalar", "aten.mul.Scalar", "aten.add.Tensor"}));
  const auto& add = p.graph.nodes[0];
  EXPECT_EQ(arg(add, "other").kind, Argument::Kind::Float);
  EXPECT_EQ(std::get<double>(arg(add, "other").payload), 2.5);
  EXPECT_EQ(std::get<int64_t>(arg(p.graph.nodes[1], "other").payload), 3);
  EXPECT_EQ(tensor(p.graph.nodes[2], "other"), p.graph.inputs.at(1));
}

// --- dead code and folding ----------------------------------------------------

TEST(Decompose, DeadNodesAndUnusedConstantsAreRemoved) {
  Source s;
  ValueId unused = s.param({2, 3}, {1, 2, 3, 4, 5, 6});
  ValueId x = s.input({2, 3});
  ValueId dead = s.call1("aten.relu.default", {T("self", x)}, meta({2, 3}));
  s.call1("aten.add.Tensor", {T("self", dead), T("other", unused)}, meta({2, 3}));
  s.output(s.call1("aten.neg.default", {T("self", x)}, meta({2, 3})));
  LoweringStats stats;
  EdgeProgram p = to_edge(s.finish(), &stats);

  EXPECT_EQ(targets(p), std::vector<std::string>{"aten.neg.default"});
  EXPECT_EQ(stats.source_nodes, 3);
  EXPECT_EQ(stats.removed_nodes, 2);
  EXPECT_EQ(stats.edge_nodes, 1);
  EXPECT_TRUE(p.constants.empty());
  EXPECT_EQ(p.graph.value(output(p)).producer, 0);
}

TEST(Decompose, ConstantSubgraphsFoldToTheirValues) {
  Source s;
  ValueId c1 = s.param({2, 3}, {1, 2, 3, 4, 5, 6});
  ValueId c2 = s.param({2, 3}, {0.5f, -1, 2, -3, 4, 0});
  ValueId x = s.input({2, 3});
  ValueId sum = s.call1("aten.add.Tensor", {T("self", c1), T("other", c2)}, meta({2, 3}));
  ValueId neg = s.call1("aten.neg.default", {T("self", sum)}, meta({2, 3}));
  ValueId scaled = s.call1("aten.mul.Tensor", {T("self", neg), F("other", 2.0)}, meta({2, 3}));
  s.output(s.call1("aten.mul.Tensor", {T("self", x), T("other", scaled)}, meta({2, 3})));
  LoweringStats stats;
  EdgeProgram p = to_edge(s.finish(), &stats);

  ASSERT_EQ(targets(p), std::vector<std::string>{"aten.mul.Tensor"});
  EXPECT_EQ(stats.folded_nodes, 3);
  ValueId folded = tensor(p.graph.nodes[0], "other");
  ASSERT_TRUE(p.is_constant(folded));
  EXPECT_EQ(floats_of(p, folded), (std::vector<float>{-3, -2, -10, -2, -18, -12}));  // -(c1 + c2) * 2
  EXPECT_EQ(p.constants.size(), 1u);
}

TEST(Decompose, ConstantOutputHoldsTheFoldedValue) {
  // bind_outputs clones a constant output with _clone_dim_order, and the
  // clone, a view-like copy of a constant, folds too: the output is the
  // folded constant itself.
  Source s;
  ValueId c1 = s.param({3}, {1, 2, 3});
  ValueId c2 = s.param({3}, {4, 5, 6});
  s.input({3});
  s.output(s.call1("aten.add.Tensor", {T("self", c1), T("other", c2)}, meta({3})));
  LoweringStats stats;
  EdgeProgram p = to_edge(s.finish(), &stats);

  EXPECT_TRUE(p.graph.nodes.empty());
  ASSERT_TRUE(p.is_constant(output(p)));
  EXPECT_EQ(floats_of(p, output(p)), (std::vector<float>{5, 7, 9}));
  EXPECT_EQ(stats.folded_nodes, 2);
}

TEST(Decompose, InputReturnedAsItIsIsCopiedOut) {
  Source s;
  ValueId x = s.input({2, 2});
  ValueId c = s.call1("aten.contiguous.default", {T("self", x)}, meta({2, 2}));
  s.output(c);
  s.output(s.call1("aten.relu.default", {T("self", x)}, meta({2, 2})));
  EdgeProgram p = to_edge(s.finish());

  ASSERT_EQ(targets(p),
            (std::vector<std::string>{"aten.relu.default", "dim_order_ops._clone_dim_order.default"}));
  const auto& copy = producer_of(p, output(p, 0));
  EXPECT_EQ(copy.target, "dim_order_ops._clone_dim_order.default");
  EXPECT_EQ(tensor(copy, "self"), p.graph.inputs.at(0));
  EXPECT_EQ(producer_of(p, output(p, 1)).target, "aten.relu.default");
}

// --- attention (rewrites_attention.cpp) ---------------------------------------

TEST(Decompose, SdpaWithGqaAndCausalIsBmmSoftmaxBmmWithoutRepeatingKv) {
  // q [1, 4, 3, 2], k/v [1, 2, 3, 2]: each K/V head serves two query heads.
  Source s;
  ValueId q = s.input({1, 4, 3, 2}), k = s.input({1, 2, 3, 2}), v = s.input({1, 2, 3, 2});
  s.output(s.call1("aten.scaled_dot_product_attention.default",
                   {T("query", q), T("key", k), T("value", v), B("is_causal", true), F("scale", 0.5),
                    B("enable_gqa", true)},
                   meta({1, 4, 3, 2})));
  EdgeProgram p = to_edge(s.finish());

  EXPECT_EQ(targets(p), (std::vector<std::string>{
                            "aten.view_copy.default", "aten.view_copy.default", "aten.view_copy.default",
                            "aten.permute_copy.default", "aten.bmm.default", "aten.view_copy.default",
                            "aten.mul.Scalar", "aten.add.Tensor", "aten._softmax.default", "aten.view_copy.default",
                            "aten.bmm.default", "aten.view_copy.default"}));
  // q's two heads per group become the rows of one bmm against their K/V head.
  const auto& scores = p.graph.nodes[4];
  EXPECT_EQ(p.graph.value(tensor(scores, "self")).meta.sizes, (std::vector<int64_t>{2, 6, 2}));
  EXPECT_EQ(p.graph.value(tensor(scores, "mat2")).meta.sizes, (std::vector<int64_t>{2, 2, 3}));
  EXPECT_EQ(std::get<double>(arg(p.graph.nodes[6], "other").payload), 0.5);
  // The causal mask is one folded constant [3, 3]: 0 on and below the diagonal, -inf above.
  ValueId mask = tensor(p.graph.nodes[7], "other");
  ASSERT_TRUE(p.is_constant(mask));
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(floats_of(p, mask), (std::vector<float>{0, -inf, -inf, 0, 0, -inf, 0, 0, 0}));
  EXPECT_EQ(p.graph.value(tensor(p.graph.nodes[7], "self")).meta.sizes, (std::vector<int64_t>{1, 2, 2, 3, 3}));
}

TEST(Decompose, SdpaBooleanConstantMaskFoldsToAnAdditiveOne) {
  Source s;
  ValueId q = s.input({1, 1, 2, 4});
  ValueId w = s.param({2, 2}, {1, -1, 1, 1});
  ValueId keep = s.call1("aten.ge.Scalar", {T("self", w), F("other", 0.0)}, meta({2, 2}, ScalarType::Bool));
  s.output(s.call1("aten.scaled_dot_product_attention.default",
                   {T("query", q), T("key", q), T("value", q), T("attn_mask", keep)}, meta({1, 1, 2, 4})));
  EdgeProgram p = to_edge(s.finish());

  std::vector<std::string> ts = targets(p);
  ASSERT_EQ(std::count(ts.begin(), ts.end(), "aten.where.self"), 0);
  const graph::Node* add = nullptr;
  for (const auto& n : p.graph.nodes)
    if (n.target == "aten.add.Tensor") add = &n;
  ASSERT_NE(add, nullptr);
  ValueId mask = tensor(*add, "other");
  ASSERT_TRUE(p.is_constant(mask));
  EXPECT_EQ(floats_of(p, mask), (std::vector<float>{0, -std::numeric_limits<float>::infinity(), 0, 0}));
  // default scale 1/sqrt(E)
  for (const auto& n : p.graph.nodes) {
    if (n.target == "aten.mul.Scalar") {
      EXPECT_EQ(std::get<double>(arg(n, "other").payload), 0.5);
    }
  }
}

TEST(Decompose, SafeSoftmaxOverAFiniteMaskIsASoftmax) {
  // SDPA's decomposition: where(!any(!(x == -inf), -1), zeros, softmax(x)) with
  // x = bmm + a constant causal mask (no row all -inf): the softmax alone.
  Source s;
  ValueId a = s.input({1, 2, 2}), b = s.input({1, 2, 2});
  ValueId mm = s.call1("aten.bmm.default", {T("self", a), T("mat2", b)}, meta({1, 2, 2}));
  ValueId c = s.param({2, 2}, {0, -std::numeric_limits<float>::infinity(), 0, 0});
  ValueId x = s.call1("aten.add.Tensor", {T("self", mm), T("other", c)}, meta({1, 2, 2}));
  ValueId sm = s.call1("aten._softmax.default", {T("self", x), I("dim", -1), B("half_to_float", false)}, meta({1, 2, 2}));
  ValueId eq = s.call1("aten.eq.Scalar", {T("self", x), F("other", -std::numeric_limits<double>::infinity())},
                       meta({1, 2, 2}, ScalarType::Bool));
  ValueId n0 = s.call1("aten.logical_not.default", {T("self", eq)}, meta({1, 2, 2}, ScalarType::Bool));
  ValueId any = s.call1("aten.any.dim", {T("self", n0), I("dim", -1), B("keepdim", true)}, meta({1, 2, 1}, ScalarType::Bool));
  ValueId n1 = s.call1("aten.logical_not.default", {T("self", any)}, meta({1, 2, 1}, ScalarType::Bool));
  ValueId z = s.call1("aten.full_like.default", {T("self", sm), I("fill_value", 0)}, meta({1, 2, 2}));
  s.output(s.call1("aten.where.self", {T("condition", n1), T("self", z), T("other", sm)}, meta({1, 2, 2})));
  EdgeProgram p = to_edge(s.finish());
  EXPECT_EQ(targets(p), (std::vector<std::string>{"aten.bmm.default", "aten.add.Tensor", "aten._softmax.default"}));

  // With a mask row that is all -inf the where stays (eager gives 0 there, not NaN).
  Source s2;
  ValueId a2 = s2.input({1, 2, 2}), b2 = s2.input({1, 2, 2});
  ValueId mm2 = s2.call1("aten.bmm.default", {T("self", a2), T("mat2", b2)}, meta({1, 2, 2}));
  const float ninf = -std::numeric_limits<float>::infinity();
  ValueId c2 = s2.param({2, 2}, {ninf, ninf, 0, 0});
  ValueId x2 = s2.call1("aten.add.Tensor", {T("self", mm2), T("other", c2)}, meta({1, 2, 2}));
  ValueId sm2 = s2.call1("aten._softmax.default", {T("self", x2), I("dim", -1), B("half_to_float", false)}, meta({1, 2, 2}));
  ValueId eq2 = s2.call1("aten.eq.Scalar", {T("self", x2), F("other", -std::numeric_limits<double>::infinity())},
                         meta({1, 2, 2}, ScalarType::Bool));
  ValueId n02 = s2.call1("aten.logical_not.default", {T("self", eq2)}, meta({1, 2, 2}, ScalarType::Bool));
  ValueId any2 = s2.call1("aten.any.dim", {T("self", n02), I("dim", -1), B("keepdim", true)}, meta({1, 2, 1}, ScalarType::Bool));
  ValueId n12 = s2.call1("aten.logical_not.default", {T("self", any2)}, meta({1, 2, 1}, ScalarType::Bool));
  ValueId z2 = s2.call1("aten.full_like.default", {T("self", sm2), I("fill_value", 0)}, meta({1, 2, 2}));
  s2.output(s2.call1("aten.where.self", {T("condition", n12), T("self", z2), T("other", sm2)}, meta({1, 2, 2})));
  EdgeProgram p2 = to_edge(s2.finish());
  EXPECT_EQ(targets(p2).back(), "aten.where.self");
}

TEST(Decompose, SdpaWithDropoutIsRefused) {
  Source s;
  ValueId q = s.input({1, 2, 4});
  s.output(s.call1("aten.scaled_dot_product_attention.default",
                   {T("query", q), T("key", q), T("value", q), F("dropout_p", 0.1)}, meta({1, 2, 4})));
  try {
    to_edge(s.finish());
    FAIL() << "lowered attention with dropout";
  } catch (const Error& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("dropout_p=0.1"), std::string::npos) << what;
    EXPECT_NE(what.find("model.py:7"), std::string::npos) << what;
  }
}

// --- refusals -----------------------------------------------------------------

// --- data movement (rewrites_data.cpp) --------------------------------------

TEST(Decompose, MatmulWithOneDOperandsIsMmBetweenViews) {
  {  // [K] . [K]: a dot product, [1, K] x [K, 1] viewed as 0-d
    Source s;
    ValueId a = s.input({3});
    ValueId b = s.input({3});
    s.output(s.call1("aten.matmul.default", {T("self", a), T("other", b)}, meta({})));
    EdgeProgram p = to_edge(s.finish());
    ASSERT_EQ(targets(p), (std::vector<std::string>{"aten.view_copy.default", "aten.view_copy.default",
                                                    "aten.mm.default", "aten.view_copy.default"}));
    EXPECT_EQ(ints(p.graph.nodes[0], "size"), (std::vector<int64_t>{1, 3}));
    EXPECT_EQ(ints(p.graph.nodes[1], "size"), (std::vector<int64_t>{3, 1}));
    EXPECT_EQ(ints(p.graph.nodes[3], "size"), (std::vector<int64_t>{}));
  }
  {  // [2, 4, 3] . [3]: one mm over the rows, the column dropped
    Source s;
    ValueId a = s.input({2, 4, 3});
    ValueId b = s.input({3});
    s.output(s.call1("aten.matmul.default", {T("self", a), T("other", b)}, meta({2, 4})));
    EdgeProgram p = to_edge(s.finish());
    ASSERT_EQ(targets(p), (std::vector<std::string>{"aten.view_copy.default", "aten.view_copy.default",
                                                    "aten.mm.default", "aten.view_copy.default"}));
    EXPECT_EQ(p.graph.value(output(p)).meta.sizes, (std::vector<int64_t>{2, 4}));
  }
  {  // [3] . [2, 3, 5]: a row broadcast over the batch, bmm
    Source s;
    ValueId a = s.input({3});
    ValueId b = s.input({2, 3, 5});
    s.output(s.call1("aten.matmul.default", {T("self", a), T("other", b)}, meta({2, 5})));
    EdgeProgram p = to_edge(s.finish());
    auto ts = targets(p);
    EXPECT_NE(std::find(ts.begin(), ts.end(), "aten.bmm.default"), ts.end());
    EXPECT_EQ(p.graph.value(output(p)).meta.sizes, (std::vector<int64_t>{2, 5}));
  }
}

TEST(Decompose, CircularPadIsCatOfWrappedSlicesAfterCropping) {
  Source s;
  ValueId x = s.input({2, 3, 4});
  s.output(s.call1("aten.pad.default", {T("self", x), Ints("pad", {1, 2, -1, 0}),
                                        {"mode", {Argument::Kind::String, std::string("circular")}, false}},
                   meta({2, 2, 7})));
  EdgeProgram p = to_edge(s.finish());
  // crop dim 1 to [1, 3); dim 2: x[..., 3:4], x, x[..., 0:2]; dim 1 is not padded after the crop
  ASSERT_EQ(targets(p), (std::vector<std::string>{"aten.slice_copy.Tensor", "aten.slice_copy.Tensor",
                                                  "aten.slice_copy.Tensor", "aten.cat.default"}));
  EXPECT_EQ(std::get<int64_t>(arg(p.graph.nodes[0], "start").payload), 1);
  EXPECT_EQ(std::get<int64_t>(arg(p.graph.nodes[1], "start").payload), 3);
  EXPECT_EQ(std::get<int64_t>(arg(p.graph.nodes[2], "end").payload), 2);
  EXPECT_EQ(p.graph.value(output(p)).meta.sizes, (std::vector<int64_t>{2, 2, 7}));
}

TEST(Decompose, IndexAddIsAnAccumulatingIndexPutOfScaledSource) {
  Source s;
  ValueId x = s.input({3, 4});
  ValueId idx = s.input({5}, ScalarType::Long);
  ValueId src = s.input({3, 5});
  s.output(s.call1("aten.index_add.default", {T("self", x), I("dim", -1), T("index", idx), T("source", src),
                                              I("alpha", 2)},
                   meta({3, 4})));
  EdgeProgram p = to_edge(s.finish());
  ASSERT_EQ(targets(p), (std::vector<std::string>{"aten.mul.Scalar", "aten.index_put.default"}));
  const auto& put = p.graph.nodes[1];
  EXPECT_TRUE(std::get<bool>(arg(put, "accumulate").payload));
  const auto& indices = std::get<std::vector<std::optional<ValueId>>>(arg(put, "indices").payload);
  ASSERT_EQ(indices.size(), 2u);
  EXPECT_FALSE(indices[0].has_value());
  EXPECT_EQ(indices[1], std::optional<ValueId>(p.graph.inputs.at(1)));
}

TEST(Decompose, UnknownOperatorIsOneClearError) {
  Source s;
  ValueId x = s.input({2});
  s.output(s.call1("aten.frobnicate.default", {T("self", x)}, meta({2})));
  try {
    to_edge(s.finish());
    FAIL() << "lowered an operator kiln does not know";
  } catch (const Error& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("aten.frobnicate.default"), std::string::npos) << what;
    EXPECT_NE(what.find("'n1'"), std::string::npos) << what;
    EXPECT_NE(what.find("model.py:7"), std::string::npos) << what;
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
  }
}

TEST(Decompose, TrainingDropoutIsRefused) {
  Source s;
  ValueId x = s.input({2});
  s.output(s.call1("aten.dropout.default", {T("input", x), F("p", 0.5), B("train", true)}, meta({2})));
  EXPECT_THROW(to_edge(s.finish()), Error);
}

}  // namespace
}  // namespace kiln::passes
