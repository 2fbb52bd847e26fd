// The partitioner on hand-made and random graphs: regions are convex,
// maximal (no two could merge without a cycle), their boundaries are exactly
// what crosses them, constants have one home, and boundary refusals move
// nodes to the portable path with a reason.
#include "kiln/partition/partitioner.h"
#include "test_support.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <random>
#include <set>

namespace kiln::partition {
namespace {

using graph::Argument;
using graph::ValueId;

constexpr std::string_view kUnsupported = "test.unsupported.default";

graph::TensorMeta meta(std::vector<int64_t> sizes) { return test::contiguous_meta(std::move(sizes)); }

struct TestProgram {
  passes::EdgeProgram p;
  int counter = 0;

  ValueId input(std::vector<int64_t> sizes = {2, 3}) {
    ValueId v = p.graph.add_value("in" + std::to_string(counter++), meta(std::move(sizes)));
    p.graph.inputs.push_back(v);
    return v;
  }
  ValueId constant(std::vector<float> data, std::vector<int64_t> sizes = {2, 3}) {
    return test::add_float_constant(p, "c" + std::to_string(counter++), data, std::move(sizes));
  }
  ValueId node(std::string_view target, std::vector<ValueId> reads, std::vector<int64_t> sizes = {2, 3}) {
    graph::Node n;
    n.name = "n" + std::to_string(counter++);
    n.target = std::string(target);
    for (size_t i = 0; i < reads.size(); ++i) n.inputs.push_back({"in" + std::to_string(i), Argument::tensor(reads[i]), false});
    ValueId out = p.graph.add_value(n.name + "_out", meta(std::move(sizes)));
    p.graph.values[static_cast<size_t>(out)].producer = static_cast<int32_t>(p.graph.nodes.size());
    n.outputs.push_back(Argument::tensor(out));
    p.graph.nodes.push_back(std::move(n));
    return out;
  }
  ValueId supported(std::vector<ValueId> reads) { return node("test.supported.default", std::move(reads)); }
  ValueId unsupported(std::vector<ValueId> reads) { return node(kUnsupported, std::move(reads)); }
  void output(ValueId v) {
    p.outputs.push_back(v);
    p.graph.outputs.push_back(Argument::tensor(v));
  }
  int32_t producer(ValueId v) const { return p.graph.value(v).producer; }
};

const SupportFn kSupports = [](const graph::Graph&, const graph::Node& n, std::string* reason) {
  if (n.target != kUnsupported) return true;
  *reason = "test: unsupported";
  return false;
};
const BoundaryFn kAnyBoundary = [](const graph::Graph&, ValueId) -> std::optional<std::string> { return std::nullopt; };
const BoundaryFn kNoRank0 = [](const graph::Graph& g, ValueId v) -> std::optional<std::string> {
  if (g.value(v).meta.sizes.empty()) return "rank 0";
  return std::nullopt;
};

std::vector<ValueId> reads_of(const graph::Node& n) {
  std::vector<ValueId> out;
  for (const auto& in : n.inputs)
    for (ValueId v : in.arg.tensor_ids()) out.push_back(v);
  return out;
}

// Units: node i on the portable path is unit i; region r is unit n + r.
struct Contracted {
  size_t units = 0;
  std::vector<std::set<size_t>> succ;
  std::vector<bool> live;
};

Contracted contract(const passes::EdgeProgram& p, const Partition& part) {
  const auto& g = p.graph;
  const size_t n = g.nodes.size();
  Contracted c;
  c.units = n + part.regions.size();
  c.succ.assign(c.units, {});
  c.live.assign(c.units, true);
  auto unit = [&](size_t i) { return part.region_of[i] < 0 ? i : n + static_cast<size_t>(part.region_of[i]); };
  for (size_t i = 0; i < n; ++i)
    if (part.region_of[i] >= 0) c.live[i] = false;
  for (size_t i = 0; i < n; ++i)
    for (ValueId v : reads_of(g.nodes[i])) {
      int32_t q = p.is_constant(v) ? -1 : g.value(v).producer;
      if (q >= 0 && unit(static_cast<size_t>(q)) != unit(i)) c.succ[unit(static_cast<size_t>(q))].insert(unit(i));
    }
  return c;
}

bool acyclic(const Contracted& c) {
  std::vector<int> indegree(c.units, 0);
  for (size_t u = 0; u < c.units; ++u)
    for (size_t s : c.succ[u]) ++indegree[s];
  std::vector<size_t> ready;
  for (size_t u = 0; u < c.units; ++u)
    if (indegree[u] == 0) ready.push_back(u);
  size_t seen = 0;
  while (!ready.empty()) {
    size_t u = ready.back();
    ready.pop_back();
    ++seen;
    for (size_t s : c.succ[u])
      if (--indegree[s] == 0) ready.push_back(s);
  }
  return seen == c.units;
}

// A path from a to b that passes through at least one other unit.
bool indirect_path(const Contracted& c, size_t a, size_t b) {
  std::vector<bool> seen(c.units, false);
  std::vector<size_t> stack;
  for (size_t s : c.succ[a])
    if (s != b) stack.push_back(s);
  while (!stack.empty()) {
    size_t u = stack.back();
    stack.pop_back();
    if (u == b) return true;
    if (seen[u]) continue;
    seen[u] = true;
    for (size_t s : c.succ[u]) stack.push_back(s);
  }
  return false;
}

// Every invariant a partition must satisfy.
void expect_well_formed(const TestProgram& t, const Partition& part, bool per_op, bool permissive) {
  const auto& p = t.p;
  const auto& g = p.graph;
  const size_t n = g.nodes.size();
  ASSERT_EQ(part.region_of.size(), n);
  std::set<ValueId> returned(p.outputs.begin(), p.outputs.end());
  std::vector<int> seen(n, 0);
  for (size_t r = 0; r < part.regions.size(); ++r) {
    const Region& region = part.regions[r];
    ASSERT_FALSE(region.nodes.empty());
    EXPECT_TRUE(std::is_sorted(region.nodes.begin(), region.nodes.end()));
    if (per_op) {
      EXPECT_EQ(region.nodes.size(), 1u);
    }
    if (r > 0) {
      EXPECT_LT(part.regions[r - 1].nodes[0], region.nodes[0]);
    }
    std::set<int32_t> inside(region.nodes.begin(), region.nodes.end());
    std::set<ValueId> inputs, outputs, constants;
    for (int32_t i : region.nodes) {
      ++seen[static_cast<size_t>(i)];
      EXPECT_EQ(part.region_of[static_cast<size_t>(i)], static_cast<int32_t>(r));
      EXPECT_NE(g.nodes[static_cast<size_t>(i)].target, kUnsupported);
      for (ValueId v : reads_of(g.nodes[static_cast<size_t>(i)])) {
        if (p.is_constant(v)) (part.constant_home.at(v) == ConstantHome::Named ? constants : inputs).insert(v);
        else if (!inside.contains(g.value(v).producer)) inputs.insert(v);
      }
      for (ValueId v : g.nodes[static_cast<size_t>(i)].output_ids()) {
        bool outside = returned.contains(v);
        for (size_t j = 0; j < n; ++j)
          if (!inside.contains(static_cast<int32_t>(j))) {
            auto rd = reads_of(g.nodes[j]);
            outside |= std::find(rd.begin(), rd.end(), v) != rd.end();
          }
        if (outside) outputs.insert(v);
      }
    }
    EXPECT_EQ(std::set<ValueId>(region.inputs.begin(), region.inputs.end()), inputs);
    EXPECT_EQ(region.inputs.size(), inputs.size());
    EXPECT_EQ(std::set<ValueId>(region.outputs.begin(), region.outputs.end()), outputs);
    EXPECT_EQ(region.outputs.size(), outputs.size());
    EXPECT_EQ(std::set<ValueId>(region.constants.begin(), region.constants.end()), constants);
  }
  for (size_t i = 0; i < n; ++i) {
    EXPECT_LE(seen[i], 1);
    if (part.region_of[i] < 0) {
      EXPECT_FALSE(part.reason[i].empty()) << g.nodes[i].name;
    }
    if (permissive && g.nodes[i].target != kUnsupported) {
      EXPECT_GE(part.region_of[i], 0) << g.nodes[i].name;
    }
  }
  // Constant homes: Segment exactly for bytes a portable node reads.
  std::set<ValueId> portable_reads;
  for (size_t i = 0; i < n; ++i)
    if (part.region_of[i] < 0)
      for (ValueId v : reads_of(g.nodes[i]))
        if (p.is_constant(v)) portable_reads.insert(v);
  for (const auto& [v, home] : part.constant_home) {
    bool same_bytes_portable = std::any_of(portable_reads.begin(), portable_reads.end(), [&](ValueId u) {
      return p.constant_bytes(u) == p.constant_bytes(v);
    });
    EXPECT_EQ(home == ConstantHome::Segment, same_bytes_portable) << g.value(v).name;
  }
  Contracted c = contract(p, part);
  EXPECT_TRUE(acyclic(c)) << "regions are not convex";
  if (!per_op) {
    // Maximal: merging any two regions would create a cycle.
    for (size_t a = 0; a < part.regions.size(); ++a)
      for (size_t b = a + 1; b < part.regions.size(); ++b)
        EXPECT_TRUE(indirect_path(c, n + a, n + b) || indirect_path(c, n + b, n + a))
            << "regions " << a << " and " << b << " could be one";
  }
}

TEST(Partitioner, NodeAfterAPortableDetourStartsANewRegion) {
  // a -> u (portable) -> c and a -> b -> c: {a, b, c} would contain a cycle.
  TestProgram t;
  ValueId x = t.input();
  ValueId a = t.supported({x});
  ValueId u = t.unsupported({a});
  ValueId b = t.supported({a});
  ValueId c = t.supported({u, b});
  t.output(c);
  Partition part = partition_program(t.p, kSupports, kAnyBoundary);
  expect_well_formed(t, part, false, true);
  ASSERT_EQ(part.regions.size(), 2u);
  EXPECT_EQ(part.regions[0].nodes, (std::vector<int32_t>{t.producer(a), t.producer(b)}));
  EXPECT_EQ(part.regions[0].outputs, (std::vector<ValueId>{a, b}));
  EXPECT_EQ(part.regions[1].nodes, (std::vector<int32_t>{t.producer(c)}));
  EXPECT_EQ(part.regions[1].inputs, (std::vector<ValueId>{u, b}));
  EXPECT_EQ(part.reason[static_cast<size_t>(t.producer(u))], "test: unsupported");
}

TEST(Partitioner, IndependentRegionsMerge) {
  // Two branches from x; one passes through a portable node afterwards.
  TestProgram t;
  ValueId x = t.input();
  ValueId t1 = t.supported({x});
  ValueId u1 = t.unsupported({t1});
  ValueId t2 = t.supported({x});
  t.output(u1);
  t.output(t2);
  Partition part = partition_program(t.p, kSupports, kAnyBoundary);
  expect_well_formed(t, part, false, true);
  ASSERT_EQ(part.regions.size(), 1u);
  EXPECT_EQ(part.regions[0].outputs, (std::vector<ValueId>{t1, t2}));
}

PartitionOptions per_op_options() {
  PartitionOptions o;
  o.per_op = true;
  return o;
}

TEST(Partitioner, PerOpDelegatesEachNodeAlone) {
  TestProgram t;
  ValueId x = t.input();
  ValueId a = t.supported({x});
  ValueId b = t.supported({a, x});
  ValueId u = t.unsupported({b});
  t.output(t.supported({u, a}));
  Partition part = partition_program(t.p, kSupports, kAnyBoundary, per_op_options());
  expect_well_formed(t, part, true, true);
  EXPECT_EQ(part.regions.size(), 3u);
}

TEST(Partitioner, ConstantsHaveOneHome) {
  TestProgram t;
  ValueId x = t.input();
  ValueId w = t.constant({1, 2, 3, 4, 5, 6});
  ValueId w_again = t.constant({1, 2, 3, 4, 5, 6});  // equal bytes, another value
  ValueId k = t.constant({6, 5, 4, 3, 2, 1});
  ValueId u = t.unsupported({x, w});   // the portable path reads w
  ValueId s = t.supported({u, w, k});  // so the region reads w as an input, k as named data
  ValueId s2 = t.supported({s, w_again});
  t.output(s2);
  Partition part = partition_program(t.p, kSupports, kAnyBoundary);
  expect_well_formed(t, part, false, true);
  EXPECT_EQ(part.constant_home.at(w), ConstantHome::Segment);
  EXPECT_EQ(part.constant_home.at(w_again), ConstantHome::Segment);
  EXPECT_EQ(part.constant_home.at(k), ConstantHome::Named);
  ASSERT_EQ(part.regions.size(), 1u);
  EXPECT_EQ(part.regions[0].inputs, (std::vector<ValueId>{u, w, w_again}));
  EXPECT_EQ(part.regions[0].constants, (std::vector<ValueId>{k}));
  EXPECT_EQ(part.constant_digest.at(k), content_digest(t.p, k));
  EXPECT_NE(content_digest(t.p, k), content_digest(t.p, w));
  EXPECT_EQ(content_digest(t.p, w_again), content_digest(t.p, w));
}

TEST(Partitioner, ConstantsTheDelegateTransformsStayNamed) {
  // a tied weight's copy that the delegate quantizes: its bytes equal a constant the portable
  // path reads, but the region keeps it as named data (the delegate never reads it as it is)
  TestProgram t;
  ValueId x = t.input();
  ValueId w = t.constant({1, 2, 3, 4, 5, 6});
  ValueId w_copy = t.constant({1, 2, 3, 4, 5, 6});
  ValueId u = t.unsupported({x, w});
  t.output(t.supported({u, w_copy}));
  PartitionOptions o;
  o.transformed_constants = {w_copy};
  Partition part = partition_program(t.p, kSupports, kAnyBoundary, o);
  EXPECT_EQ(part.constant_home.at(w), ConstantHome::Segment);
  EXPECT_EQ(part.constant_home.at(w_copy), ConstantHome::Named);
  ASSERT_EQ(part.regions.size(), 1u);
  EXPECT_EQ(part.regions[0].inputs, (std::vector<ValueId>{u}));
  EXPECT_EQ(part.regions[0].constants, (std::vector<ValueId>{w_copy}));
  EXPECT_EQ(part.constant_digest.at(w_copy), content_digest(t.p, w));
  // without the option the copy is read from the constant segment, as a delegate input
  Partition plain = partition_program(t.p, kSupports, kAnyBoundary);
  EXPECT_EQ(plain.constant_home.at(w_copy), ConstantHome::Segment);
}

TEST(Partitioner, BoundaryRefusalsMoveNodesToThePortablePath) {
  // s reads a rank-0 value computed on the portable path: it cannot be a delegate input.
  TestProgram t;
  ValueId x = t.input();
  ValueId a = t.supported({x});
  ValueId scalar = t.node(kUnsupported, {a}, {});
  ValueId s = t.supported({a, scalar});
  ValueId y = t.supported({s});
  t.output(y);
  Partition part = partition_program(t.p, kSupports, kNoRank0);
  expect_well_formed(t, part, false, false);
  EXPECT_EQ(part.region_of[static_cast<size_t>(t.producer(s))], -1);
  EXPECT_NE(part.reason[static_cast<size_t>(t.producer(s))].find("rank 0"), std::string::npos);
  EXPECT_GE(part.region_of[static_cast<size_t>(t.producer(a))], 0);
  EXPECT_GE(part.region_of[static_cast<size_t>(t.producer(y))], 0);
  EXPECT_GE(part.rounds, 2);
  for (const Region& r : part.regions) {
    for (ValueId v : r.inputs) {
      EXPECT_FALSE(t.p.graph.value(v).meta.sizes.empty());
    }
    for (ValueId v : r.outputs) {
      EXPECT_FALSE(t.p.graph.value(v).meta.sizes.empty());
    }
  }
}

TEST(Partitioner, RandomGraphsGiveConvexMaximalRegions) {
  std::mt19937 rng(1234);
  for (int round = 0; round < 300; ++round) {
    TestProgram t;
    std::vector<ValueId> pool;
    int inputs = 1 + static_cast<int>(rng() % 3);
    for (int i = 0; i < inputs; ++i) pool.push_back(t.input());
    for (int i = 0; i < 3; ++i) pool.push_back(t.constant({float(i), 1, 2, 3, 4, float(rng() % 3)}));
    int nodes = 5 + static_cast<int>(rng() % 40);
    int unsupported_percent = static_cast<int>(rng() % 60);
    std::vector<ValueId> computed;
    for (int i = 0; i < nodes; ++i) {
      std::vector<ValueId> reads;
      int arity = 1 + static_cast<int>(rng() % 3);
      for (int k = 0; k < arity; ++k) {
        // Prefer recent values, so the graphs are deep as well as wide.
        size_t span = std::min<size_t>(pool.size(), 6);
        size_t pick = rng() % 4 == 0 ? rng() % pool.size() : pool.size() - 1 - rng() % span;
        reads.push_back(pool[pick]);
      }
      bool unsupported = static_cast<int>(rng() % 100) < unsupported_percent;
      ValueId out = unsupported ? t.unsupported(reads) : t.supported(reads);
      pool.push_back(out);
      computed.push_back(out);
    }
    t.output(computed.back());
    for (ValueId v : computed)
      if (rng() % 5 == 0 && v != computed.back()) t.output(v);
    SCOPED_TRACE("round " + std::to_string(round));
    expect_well_formed(t, partition_program(t.p, kSupports, kAnyBoundary), false, true);
    expect_well_formed(t, partition_program(t.p, kSupports, kAnyBoundary, per_op_options()), true, true);
    if (HasFailure()) return;
  }
}

}  // namespace
}  // namespace kiln::partition
