// The emitter on small edge graphs: kernel calls in ExecuTorch's out-variant
// convention (the ATen schema's arguments in order, defaults filled, outs,
// then the return slot), one operator entry per distinct kernel, constants
// stored once per distinct content, views of computed tensors as shared
// storage, and, on random graphs, a memory plan under which every read sees
// the bytes its producer wrote (simulated here over the arena byte by byte).
#include "kiln/emit/emitter.h"
#include "test_support.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <span>

namespace kiln::emit {
namespace {

using graph::Argument;
using graph::NamedArgument;
using graph::ValueId;

graph::TensorMeta meta(std::vector<int64_t> sizes) { return test::contiguous_meta(std::move(sizes)); }

NamedArgument T(std::string name, ValueId v) { return {std::move(name), Argument::tensor(v), false}; }
NamedArgument Ints(std::string name, std::vector<int64_t> xs) {
  return {std::move(name), {Argument::Kind::Ints, std::move(xs)}, false};
}

struct EdgeBuilder {
  passes::EdgeProgram p;
  int counter = 0;

  ValueId input(std::vector<int64_t> sizes) {
    ValueId v = p.graph.add_value("in" + std::to_string(counter++), meta(std::move(sizes)));
    p.graph.inputs.push_back(v);
    return v;
  }
  ValueId constant(std::vector<float> data, std::vector<int64_t> sizes) {
    return test::add_float_constant(p, "c" + std::to_string(counter++), data, std::move(sizes));
  }
  std::vector<ValueId> node(std::string target, std::vector<NamedArgument> inputs,
                            std::vector<std::vector<int64_t>> outs, bool out_list = false) {
    graph::Node n;
    n.name = "n" + std::to_string(counter++);
    n.target = std::move(target);
    n.inputs = std::move(inputs);
    std::vector<ValueId> ids;
    for (size_t i = 0; i < outs.size(); ++i) {
      ValueId v = p.graph.add_value(n.name + "_" + std::to_string(i), meta(std::move(outs[i])));
      p.graph.values[static_cast<size_t>(v)].producer = static_cast<int32_t>(p.graph.nodes.size());
      ids.push_back(v);
      if (!out_list) n.outputs.push_back(Argument::tensor(v));
    }
    if (out_list) n.outputs.push_back({Argument::Kind::Tensors, ids});
    p.graph.nodes.push_back(std::move(n));
    return ids;
  }
  ValueId node1(std::string target, std::vector<NamedArgument> inputs, std::vector<int64_t> out) {
    return node(std::move(target), std::move(inputs), {std::move(out)})[0];
  }
  void output(ValueId v) {
    p.outputs.push_back(v);
    p.graph.outputs.push_back(Argument::tensor(v));
  }
};

const pte::KernelCall& kernel(const pte::ExecutionPlan& plan, size_t i) {
  return std::get<pte::KernelCall>(plan.instructions.at(i));
}
std::string op_name(const pte::ExecutionPlan& plan, const pte::KernelCall& k) {
  const auto& op = plan.operators.at(static_cast<size_t>(k.op_index));
  return op.name + "." + op.overload;
}
const pte::TensorValue& tensor_at(const pte::ExecutionPlan& plan, int32_t index) {
  return std::get<pte::TensorValue>(plan.values.at(static_cast<size_t>(index)));
}
std::vector<std::byte> blob_bytes(const pte::DataBlob& blob) {
  std::vector<std::byte> out;
  blob.write([&](std::span<const std::byte> chunk) { out.insert(out.end(), chunk.begin(), chunk.end()); });
  EXPECT_EQ(out.size(), blob.size);
  return out;
}
uint64_t nbytes(const pte::TensorValue& t) {
  uint64_t n = static_cast<uint64_t>(element_size(t.dtype));
  for (int32_t s : t.sizes) n *= static_cast<uint64_t>(s);
  return n;
}

// --- argument lists ---------------------------------------------------------

TEST(Emitter, KernelArgumentsFollowTheOutVariantSchema) {
  // add.out(Tensor self, Tensor other, *, Scalar alpha=1, Tensor(a!) out) -> Tensor(a!):
  // the node lists `other` before `self` and omits alpha.
  EdgeBuilder b;
  ValueId x = b.input({2, 3});
  ValueId y = b.input({2, 3});
  b.output(b.node1("aten.add.Tensor", {T("other", y), T("self", x)}, {2, 3}));
  EmitReport report;
  pte::Program program = emit_program(b.p, &report);

  ASSERT_EQ(program.plans.size(), 1u);
  const auto& plan = program.plans[0];
  ASSERT_EQ(plan.instructions.size(), 1u);
  const auto& k = kernel(plan, 0);
  EXPECT_EQ(op_name(plan, k), "aten::add.out");
  ASSERT_EQ(k.args.size(), 5u);
  ASSERT_EQ(plan.inputs.size(), 2u);
  EXPECT_EQ(k.args[0], plan.inputs[0]);
  EXPECT_EQ(k.args[1], plan.inputs[1]);
  EXPECT_EQ(std::get<int64_t>(plan.values.at(static_cast<size_t>(k.args[2]))), 1);
  ASSERT_EQ(plan.outputs.size(), 1u);
  EXPECT_EQ(k.args[3], plan.outputs[0]);
  EXPECT_EQ(k.args[4], plan.outputs[0]);  // the return slot is the out itself
  EXPECT_EQ(tensor_at(plan, k.args[3]).sizes, (std::vector<int32_t>{2, 3}));
  EXPECT_TRUE(tensor_at(plan, k.args[3]).allocation.has_value());
  EXPECT_EQ(report.kernel_calls, 1);
  EXPECT_EQ(report.operators.at("aten::add.out"), 1);
}

// --- mutable state -------------------------------------------------------------

TEST(Emitter, MutableBufferIsPlannedInitialisedAndWrittenInPlace) {
  // cache [4, 2] (a mutable buffer): r = cache * 2 reads the old cache; index_put_(cache, [pos], v) writes rows;
  // out = new_cache + r. The in-place call's output is the cache's own value and storage, its return slot is the
  // cache, every reader of the old cache runs before it, and the cache's initial bytes are mutable data.
  EdgeBuilder b;
  ValueId pos = b.p.graph.add_value("pos", graph::TensorMeta{ScalarType::Long, {1}, {1}, 0, false, {}});
  b.p.graph.inputs.push_back(pos);
  ValueId v = b.input({1, 2});
  ValueId cache = b.p.graph.add_value("cache", meta({4, 2}));
  std::vector<float> init{1, 2, 3, 4, 5, 6, 7, 8};
  std::vector<std::byte> bytes(init.size() * sizeof(float));
  std::memcpy(bytes.data(), init.data(), bytes.size());
  b.p.mutable_buffers.push_back(
      {cache, passes::ConstantData{nullptr, std::make_shared<const std::vector<std::byte>>(bytes), "cache"}, "cache"});
  ValueId two = b.constant({2.0f}, {1});
  // the write comes first in graph order; the reader of the old cache must still be ordered before it
  ValueId updated = b.node1("aten.index_put_.default",
                            {T("self", cache),
                             {"indices", {Argument::Kind::OptionalTensors, std::vector<std::optional<ValueId>>{pos}}, false},
                             T("values", v)},
                            {4, 2});
  ValueId r = b.node1("aten.mul.Tensor", {T("self", cache), T("other", two)}, {4, 2});
  b.output(b.node1("aten.add.Tensor", {T("self", updated), T("other", r)}, {4, 2}));
  EmitReport report;
  pte::Program program = emit_program(b.p, &report);
  const auto& plan = program.plans.at(0);
  ASSERT_EQ(plan.instructions.size(), 3u);
  EXPECT_EQ(op_name(plan, kernel(plan, 0)), "aten::mul.out");  // the old cache is read first
  const auto& w = kernel(plan, 1);
  EXPECT_EQ(plan.operators.at(static_cast<size_t>(w.op_index)).name, "aten::index_put_");
  EXPECT_EQ(plan.operators.at(static_cast<size_t>(w.op_index)).overload, "");
  ASSERT_EQ(w.args.size(), 5u);  // self, indices, values, accumulate, return slot
  EXPECT_EQ(w.args[4], w.args[0]);
  EXPECT_EQ(kernel(plan, 0).args[0], w.args[0]);             // the same value as the cache the mul reads
  EXPECT_EQ(kernel(plan, 2).args[0], w.args[0]);             // and as the updated cache the add reads
  const auto& t = tensor_at(plan, w.args[0]);
  ASSERT_TRUE(t.allocation.has_value());
  EXPECT_EQ(t.constant_index, 0u);
  ASSERT_GT(t.mutable_index, 0u);
  EXPECT_EQ(blob_bytes(program.mutable_data.at(t.mutable_index)), bytes);
  EXPECT_EQ(report.mutable_buffers, 1);
  // no other planned tensor overlaps the cache's bytes (it lives across calls)
  for (size_t i = 0; i < plan.values.size(); ++i) {
    const auto* o = std::get_if<pte::TensorValue>(&plan.values[i]);
    if (!o || !o->allocation || static_cast<int32_t>(i) == w.args[0]) continue;
    bool overlaps = o->allocation->offset < t.allocation->offset + nbytes(t) &&
                    t.allocation->offset < o->allocation->offset + nbytes(*o);
    EXPECT_FALSE(overlaps) << "value " << i;
  }
}

TEST(Emitter, ZeroInitialisedBufferStoresNoData) {
  // A cache that starts as zeros (a static KV cache) gets planned memory and no mutable data, as
  // ExecuTorch emits it: the runtimes' planned memory starts zeroed. A non-zero buffer keeps its bytes.
  EdgeBuilder b;
  ValueId pos = b.p.graph.add_value("pos", graph::TensorMeta{ScalarType::Long, {1}, {1}, 0, false, {}});
  b.p.graph.inputs.push_back(pos);
  ValueId v = b.input({1, 2});
  auto buffer = [&](const char* name, std::vector<float> init) {
    ValueId c = b.p.graph.add_value(name, meta({4, 2}));
    std::vector<std::byte> bytes(init.size() * sizeof(float));
    std::memcpy(bytes.data(), init.data(), bytes.size());
    b.p.mutable_buffers.push_back(
        {c, passes::ConstantData{nullptr, std::make_shared<const std::vector<std::byte>>(bytes), name}, name});
    return c;
  };
  ValueId zeros = buffer("zeros", std::vector<float>(8, 0.0f));
  ValueId ones = buffer("ones", std::vector<float>(8, 1.0f));
  auto write = [&](ValueId cache) {
    return b.node1("aten.index_put_.default",
                   {T("self", cache),
                    {"indices", {Argument::Kind::OptionalTensors, std::vector<std::optional<ValueId>>{pos}}, false},
                    T("values", v)},
                   {4, 2});
  };
  b.output(b.node1("aten.add.Tensor", {T("self", write(zeros)), T("other", write(ones))}, {4, 2}));
  EmitReport report;
  pte::Program program = emit_program(b.p, &report);
  const auto& plan = program.plans.at(0);
  EXPECT_EQ(report.mutable_buffers, 2);
  EXPECT_EQ(report.zero_initialized_buffers, 1);
  EXPECT_EQ(report.mutable_buffer_bytes, 64u);
  EXPECT_EQ(report.mutable_data_bytes, 32u);
  int with_data = 0, planned_without = 0;
  for (int i = 0; i < 2; ++i) {
    const auto& k = kernel(plan, static_cast<size_t>(i));
    const auto& t = tensor_at(plan, k.args[0]);
    ASSERT_TRUE(t.allocation.has_value());
    EXPECT_EQ(t.constant_index, 0u);
    if (t.mutable_index > 0) {
      ++with_data;
      std::vector<std::byte> one(32);
      for (size_t j = 0; j < 8; ++j) {
        const float f = 1.0f;
        std::memcpy(one.data() + j * 4, &f, 4);
      }
      EXPECT_EQ(blob_bytes(program.mutable_data.at(t.mutable_index)), one);
    } else {
      ++planned_without;
    }
  }
  EXPECT_EQ(with_data, 1);
  EXPECT_EQ(planned_without, 1);
}

TEST(Emitter, MultipleOutsThenATensorListReturn) {
  // native_layer_norm.out(Tensor input, SymInt[] normalized_shape, Tensor? weight, Tensor? bias,
  //                       float eps, *, Tensor(a!) out0, Tensor(b!) out1, Tensor(c!) out2)
  EdgeBuilder b;
  ValueId x = b.input({2, 4});
  ValueId bias = b.constant({0, 0, 0, 0}, {4});
  auto outs = b.node("aten.native_layer_norm.default",
                     {T("input", x), Ints("normalized_shape", {4}), T("bias", bias),
                      {"eps", {Argument::Kind::Float, 1e-5}, false}},
                     {{2, 4}, {2, 1}, {2, 1}});
  b.output(outs[0]);
  pte::Program program = emit_program(b.p);
  const auto& plan = program.plans[0];
  ASSERT_EQ(plan.instructions.size(), 1u);
  const auto& k = kernel(plan, 0);
  EXPECT_EQ(op_name(plan, k), "aten::native_layer_norm.out");
  ASSERT_EQ(k.args.size(), 9u);
  auto value = [&](size_t i) -> const pte::Value& { return plan.values.at(static_cast<size_t>(k.args[i])); };
  EXPECT_EQ(k.args[0], plan.inputs[0]);
  const auto& shape = std::get<pte::IntList>(value(1));
  ASSERT_EQ(shape.items.size(), 1u);
  EXPECT_EQ(std::get<int64_t>(plan.values.at(static_cast<size_t>(shape.items[0]))), 4);
  EXPECT_TRUE(std::holds_alternative<pte::NoneValue>(value(2)));  // weight omitted: None
  EXPECT_GT(std::get<pte::TensorValue>(value(3)).constant_index, 0u);
  EXPECT_EQ(std::get<double>(value(4)), 1e-5);
  EXPECT_EQ(k.args[5], plan.outputs[0]);
  EXPECT_EQ(tensor_at(plan, k.args[6]).sizes, (std::vector<int32_t>{2, 1}));
  EXPECT_EQ(tensor_at(plan, k.args[7]).sizes, (std::vector<int32_t>{2, 1}));
  const auto& ret = std::get<pte::TensorList>(value(8));
  EXPECT_EQ(ret.items, (std::vector<int32_t>{k.args[5], k.args[6], k.args[7]}));
}

TEST(Emitter, TensorListOutIsPassedTwice) {
  // split_with_sizes_copy.out(Tensor self, SymInt[] split_sizes, int dim=0, *, Tensor(a!)[] out) -> ()
  EdgeBuilder b;
  ValueId x = b.input({5, 2});
  auto parts = b.node("aten.split_with_sizes_copy.default", {T("self", x), Ints("split_sizes", {2, 3})},
                      {{2, 2}, {3, 2}}, true);
  b.output(parts[0]);
  b.output(parts[1]);
  pte::Program program = emit_program(b.p);
  const auto& plan = program.plans[0];
  const auto& k = kernel(plan, 0);
  EXPECT_EQ(op_name(plan, k), "aten::split_with_sizes_copy.out");
  ASSERT_EQ(k.args.size(), 5u);
  EXPECT_EQ(std::get<int64_t>(plan.values.at(static_cast<size_t>(k.args[2]))), 0);  // dim's default
  const auto& list = std::get<pte::TensorList>(plan.values.at(static_cast<size_t>(k.args[3])));
  EXPECT_EQ(list.items, (std::vector<int32_t>{plan.outputs[0], plan.outputs[1]}));
  EXPECT_EQ(k.args[4], k.args[3]);
}

// --- operators and constants ------------------------------------------------

TEST(Emitter, ConstantsAreStoredOncePerContent) {
  EdgeBuilder b;
  ValueId x = b.input({2, 2});
  ValueId c1 = b.constant({1, 2, 3, 4}, {2, 2});
  ValueId c2 = b.constant({1, 2, 3, 4}, {2, 2});  // same bytes, a different buffer
  ValueId c3 = b.constant({1, 2, 3, 5}, {2, 2});
  b.constant({9, 9, 9, 9}, {2, 2});  // read by nothing
  ValueId a = b.node1("aten.add.Tensor", {T("self", x), T("other", c1)}, {2, 2});
  ValueId m = b.node1("aten.mul.Tensor", {T("self", a), T("other", c2)}, {2, 2});
  b.output(b.node1("aten.add.Tensor", {T("self", m), T("other", c3)}, {2, 2}));
  EmitReport report;
  pte::Program program = emit_program(b.p, &report);
  const auto& plan = program.plans[0];

  ASSERT_EQ(plan.instructions.size(), 3u);
  EXPECT_EQ(plan.operators.size(), 2u);  // aten::add.out once, aten::mul.out
  EXPECT_EQ(kernel(plan, 0).op_index, kernel(plan, 2).op_index);
  EXPECT_NE(kernel(plan, 0).op_index, kernel(plan, 1).op_index);
  uint32_t i1 = tensor_at(plan, kernel(plan, 0).args[1]).constant_index;
  uint32_t i2 = tensor_at(plan, kernel(plan, 1).args[1]).constant_index;
  uint32_t i3 = tensor_at(plan, kernel(plan, 2).args[1]).constant_index;
  EXPECT_GT(i1, 0u);
  EXPECT_EQ(i1, i2);
  EXPECT_NE(i1, i3);
  ASSERT_EQ(program.constants.size(), 3u);  // [0] reserved, then two distinct contents
  EXPECT_EQ(report.constants, 2);
  EXPECT_EQ(report.deduplicated_constants, 1);
  auto expect_floats = [&](uint32_t index, std::vector<float> want) {
    std::vector<std::byte> bytes = blob_bytes(program.constants.at(index));
    std::vector<float> got(bytes.size() / sizeof(float));
    std::memcpy(got.data(), bytes.data(), bytes.size());
    EXPECT_EQ(got, want);
  };
  expect_floats(i1, {1, 2, 3, 4});
  expect_floats(i3, {1, 2, 3, 5});
  EXPECT_FALSE(tensor_at(plan, kernel(plan, 0).args[1]).allocation.has_value());  // constants are not planned
}

// --- views and memory -------------------------------------------------------

TEST(Emitter, ViewOfAComputedTensorSharesItsStorage) {
  EdgeBuilder b;
  ValueId x = b.input({2, 3});
  ValueId y = b.input({3, 2});
  ValueId a = b.node1("aten.relu.default", {T("self", x)}, {2, 3});
  ValueId v = b.node1("aten.view_copy.default", {T("self", a), Ints("size", {3, 2})}, {3, 2});
  ValueId c = b.node1("aten.neg.default", {T("self", y)}, {3, 2});
  b.output(b.node1("aten.add.Tensor", {T("self", v), T("other", c)}, {3, 2}));
  b.output(b.node1("aten.view_copy.default", {T("self", x), Ints("size", {6})}, {6}));
  EmitReport report;
  pte::Program program = emit_program(b.p, &report);
  const auto& plan = program.plans[0];

  // relu, neg, add and the view of the input (an input's storage is the
  // caller's, so it is copied); the view of relu's result is no instruction.
  ASSERT_EQ(plan.instructions.size(), 4u);
  EXPECT_EQ(report.aliased_views, 1);
  std::vector<std::string> ops;
  for (size_t i = 0; i < 4; ++i) ops.push_back(op_name(plan, kernel(plan, i)));
  EXPECT_EQ(ops, (std::vector<std::string>{"aten::relu.out", "aten::neg.out", "aten::add.out", "aten::view_copy.out"}));
  const auto& relu_out = tensor_at(plan, kernel(plan, 0).args[1]);
  const auto& neg_out = tensor_at(plan, kernel(plan, 1).args[1]);
  const auto& view = tensor_at(plan, kernel(plan, 2).args[0]);
  EXPECT_EQ(view.sizes, (std::vector<int32_t>{3, 2}));
  ASSERT_TRUE(view.allocation && relu_out.allocation && neg_out.allocation);
  EXPECT_EQ(view.allocation->offset, relu_out.allocation->offset);
  // relu's storage stays alive until the view is read, after neg wrote its result.
  uint64_t r0 = relu_out.allocation->offset, n0 = neg_out.allocation->offset;
  EXPECT_TRUE(r0 + 24 <= n0 || n0 + 24 <= r0) << "relu at " << r0 << ", neg at " << n0;
  EXPECT_EQ(plan.non_const_buffer_sizes.size(), 2u);
}

// A random edge graph of 1-D and [1, n] float tensors: relu, add (operands of
// equal shape), cat and view_copy (which may alias).
passes::EdgeProgram random_program(std::mt19937& rng) {
  EdgeBuilder b;
  std::vector<ValueId> vals;
  const int inputs = 1 + static_cast<int>(rng() % 3);
  for (int i = 0; i < inputs; ++i) vals.push_back(b.input({1 + static_cast<int64_t>(rng() % 40)}));
  const int nodes = 4 + static_cast<int>(rng() % 30);
  for (int i = 0; i < nodes; ++i) {
    ValueId x = vals[rng() % vals.size()];
    const auto sizes = b.p.graph.value(x).meta.sizes;
    const int64_t n = b.p.graph.value(x).meta.numel();
    switch (rng() % 4) {
      case 0: vals.push_back(b.node1("aten.relu.default", {T("self", x)}, sizes)); break;
      case 1: {
        std::vector<ValueId> same;
        for (ValueId v : vals)
          if (b.p.graph.value(v).meta.sizes == sizes) same.push_back(v);
        ValueId y = same[rng() % same.size()];
        vals.push_back(b.node1("aten.add.Tensor", {T("self", x), T("other", y)}, sizes));
        break;
      }
      case 2: {
        std::vector<ValueId> flat;
        for (ValueId v : vals)
          if (b.p.graph.value(v).meta.sizes.size() == 1) flat.push_back(v);
        if (flat.empty() || sizes.size() != 1) {
          vals.push_back(b.node1("aten.view_copy.default", {T("self", x), Ints("size", {n})}, {n}));
          break;
        }
        ValueId y = flat[rng() % flat.size()];
        int64_t total = n + b.p.graph.value(y).meta.numel();
        vals.push_back(b.node1("aten.cat.default",
                               {{"tensors", {Argument::Kind::Tensors, std::vector<ValueId>{x, y}}, false}}, {total}));
        break;
      }
      default: {
        std::vector<int64_t> to = sizes.size() == 1 ? std::vector<int64_t>{1, n} : std::vector<int64_t>{n};
        vals.push_back(b.node1("aten.view_copy.default", {T("self", x), Ints("size", to)}, to));
        break;
      }
    }
  }
  std::vector<ValueId> computed(vals.begin() + inputs, vals.end());
  b.output(computed.back());
  for (ValueId v : computed)
    if (v != computed.back() && rng() % 5 == 0) b.output(v);
  return std::move(b.p);
}

// Runs the plan over a tagged arena: every instruction's reads must find the
// tag of the value whose bytes they need (a view: its source's), its outs
// must not overlap its reads; at the end the outputs and inputs are intact.
void simulate(const passes::EdgeProgram& p, const pte::ExecutionPlan& plan, uint64_t seed) {
  const auto& g = p.graph;
  std::vector<ValueId> root(g.values.size());
  for (size_t v = 0; v < root.size(); ++v) root[v] = static_cast<ValueId>(v);
  std::vector<int32_t> pte_index(g.values.size(), -1);
  for (size_t i = 0; i < g.inputs.size(); ++i) pte_index[static_cast<size_t>(g.inputs[i])] = plan.inputs.at(i);
  std::vector<bool> is_input(g.values.size(), false);
  for (ValueId v : g.inputs) is_input[static_cast<size_t>(v)] = true;

  ASSERT_EQ(plan.non_const_buffer_sizes.size(), 2u);
  std::vector<int32_t> arena(static_cast<size_t>(plan.non_const_buffer_sizes[1]), -1);
  auto range = [&](int32_t index) {
    const auto& t = tensor_at(plan, index);
    EXPECT_TRUE(t.allocation.has_value());
    uint64_t begin = t.allocation ? t.allocation->offset : 0;
    EXPECT_LE(begin + nbytes(t), arena.size());
    return std::pair<uint64_t, uint64_t>{begin, std::min<uint64_t>(begin + nbytes(t), arena.size())};
  };
  auto write = [&](ValueId v, int32_t index) {
    auto [b, e] = range(index);
    std::fill(arena.begin() + static_cast<std::ptrdiff_t>(b), arena.begin() + static_cast<std::ptrdiff_t>(e), v);
  };
  auto intact = [&](ValueId v, int32_t index) {
    auto [b, e] = range(index);
    for (uint64_t i = b; i < e; ++i)
      if (arena[i] != root[static_cast<size_t>(v)]) return false;
    return true;
  };
  for (size_t i = 0; i < g.inputs.size(); ++i) write(g.inputs[i], plan.inputs[i]);

  size_t next = 0;  // instruction
  for (const auto& n : g.nodes) {
    std::vector<ValueId> reads;
    for (const auto& in : n.inputs)
      for (ValueId v : in.arg.tensor_ids()) reads.push_back(v);
    ValueId out = n.output_ids().at(0);
    if (n.target == "aten.view_copy.default" && !is_input[static_cast<size_t>(reads[0])]) {
      root[static_cast<size_t>(out)] = root[static_cast<size_t>(reads[0])];  // shared storage, no instruction
      continue;
    }
    ASSERT_LT(next, plan.instructions.size()) << "seed " << seed;
    const auto& k = kernel(plan, next++);
    // The tensors in argument order: reads (a cat's through its list), then the out.
    std::vector<int32_t> read_index;
    if (n.target == "aten.cat.default") {
      read_index = std::get<pte::TensorList>(plan.values.at(static_cast<size_t>(k.args[0]))).items;
    } else {
      read_index.push_back(k.args[0]);
      if (n.target == "aten.add.Tensor") read_index.push_back(k.args[1]);
    }
    ASSERT_EQ(read_index.size(), reads.size()) << n.name;
    const int32_t out_index = k.args.back();
    for (size_t r = 0; r < reads.size(); ++r) {
      auto& known = pte_index[static_cast<size_t>(reads[r])];
      if (known >= 0) {
        EXPECT_EQ(read_index[r], known) << n.name << " reads another value";
      }
      known = read_index[r];
      EXPECT_TRUE(intact(reads[r], read_index[r]))
          << "seed " << seed << ": " << n.name << " (" << n.target << ") reads " << g.value(reads[r]).name
          << ", whose bytes were overwritten";
      auto [rb, re] = range(read_index[r]);
      auto [ob, oe] = range(out_index);
      EXPECT_TRUE(re <= ob || oe <= rb || rb == re) << "seed " << seed << ": " << n.name << " writes over its input";
    }
    pte_index[static_cast<size_t>(out)] = out_index;
    write(out, out_index);
  }
  EXPECT_EQ(next, plan.instructions.size());
  for (size_t i = 0; i < p.outputs.size(); ++i)
    EXPECT_TRUE(intact(p.outputs[i], plan.outputs.at(i))) << "seed " << seed << ": output " << i << " overwritten";
  for (size_t i = 0; i < g.inputs.size(); ++i)
    EXPECT_TRUE(intact(g.inputs[i], plan.inputs[i])) << "seed " << seed << ": input " << i << " overwritten";
}

TEST(Emitter, RandomGraphsPlanMemoryNoReadCanMiss) {
  for (uint64_t seed = 1; seed <= 200; ++seed) {
    std::mt19937 rng(static_cast<uint32_t>(seed));
    passes::EdgeProgram p = random_program(rng);
    EmitReport report;
    pte::Program program = emit_program(p, &report);
    ASSERT_EQ(program.plans.size(), 1u);
    simulate(p, program.plans[0], seed);
    EXPECT_LE(report.planned_bytes, report.naive_bytes);
    if (testing::Test::HasFailure()) return;
  }
}

}  // namespace
}  // namespace kiln::emit
