// The partitioner: which nodes of an edge program a backend runs, grouped
// into as few delegate regions as the graph allows.
//
// A backend is described by two predicates: whether it supports a node, and
// whether a value may cross a region boundary (be a delegate call's input or
// output). The partitioner
//   1. decides where every constant lives (see ConstantHome), so that no
//      weight is stored twice;
//   2. groups the delegated nodes into convex regions: contracting every
//      region into one node must leave the graph acyclic, i.e. no path leaves
//      a region and re-enters it. It starts from one region per node, merges
//      a node with the regions of its producers in topological order, then
//      any two regions, each merge allowed only when no path between the two
//      runs through a third node (checked on the contracted graph's
//      reachability, kept as bitsets); `per_op` skips the merging;
//   3. leaves on the portable path any node whose region would have an input
//      or output the backend cannot take across the boundary, and starts over
//      until every region is well formed.
#pragma once

#include "kiln/graph/graph.h"
#include "kiln/passes/edge_program.h"

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace kiln::partition {

// True when the backend can run `node`; otherwise false with a one-line reason.
using SupportFn = std::function<bool(const graph::Graph&, const graph::Node&, std::string* reason)>;
// nullopt when `value` may be a delegate call's input or output; otherwise why not.
using BoundaryFn = std::function<std::optional<std::string>(const graph::Graph&, graph::ValueId value)>;

struct PartitionOptions {
  bool per_op = false;  // every delegated node is a region of its own
  // Constants the delegate does not read as they are (it quantizes them): their home is
  // Named even when equal bytes live in the constant segment (the fp32 table of a tied
  // LM head, which the embedding lookup reads and the delegate quantizes).
  std::set<graph::ValueId> transformed_constants;
};

// The 128-bit XXH3 of a constant's row-major bytes, seeded with their length:
// equal digests are taken as equal bytes (named-data keys are derived from it).
using ContentDigest = std::array<uint64_t, 2>;

// Where a constant's bytes are stored. Every distinct content has one home:
//  - Segment: some node left on the portable path (or the program's output
//    list) reads these bytes, so they are in the program's constant segment;
//    a delegated node that reads them gets them as a delegate-call input (a
//    constant tensor the backend reads in place, not a second copy);
//  - Named: only delegated nodes read them; they are named data under a key
//    derived from the content digest, shared by every region that reads them.
enum class ConstantHome : uint8_t { Segment, Named };

struct Region {
  std::vector<int32_t> nodes;             // indices into graph.nodes, in graph (execution) order
  std::vector<graph::ValueId> inputs;     // read from outside: computed values, graph inputs, Segment constants
  std::vector<graph::ValueId> outputs;    // computed here and read outside or returned by the program
  std::vector<graph::ValueId> constants;  // Named constants the region's nodes read
};

struct Partition {
  std::vector<Region> regions;         // ordered by their first node
  std::vector<int32_t> region_of;      // per node: index into regions, or -1 (portable path)
  std::vector<std::string> reason;     // per node on the portable path: why it was not delegated
  std::map<graph::ValueId, ConstantHome> constant_home;     // every constant a node reads
  std::map<graph::ValueId, ContentDigest> constant_digest;  // every Named constant (and those compared with them)
  int64_t rounds = 0;                  // partitioning passes until every boundary was acceptable
};

Partition partition_program(const passes::EdgeProgram& program, const SupportFn& supports, const BoundaryFn& boundary,
                            const PartitionOptions& options = {});

// The content digest of constant `v` (streams its bytes once).
ContentDigest content_digest(const passes::EdgeProgram& program, graph::ValueId v);

}  // namespace kiln::partition
