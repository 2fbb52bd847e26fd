// The partitioner (include/kiln/partition/partitioner.h): constant homes,
// convex regions by contraction with reachability bitsets, boundary checks.
#include "kiln/partition/partitioner.h"

#include "kiln/core/error.h"

#include <xxhash.h>

#include <algorithm>
#include <bit>
#include <memory>
#include <numeric>
#include <set>

namespace kiln::partition {
namespace {

using graph::ValueId;

std::vector<ValueId> reads_of(const graph::Node& n) {
  std::vector<ValueId> out;
  for (const auto& in : n.inputs)
    for (ValueId v : in.arg.tensor_ids()) out.push_back(v);
  return out;
}

// A fixed-size set of unit indices.
class Bits {
 public:
  explicit Bits(size_t n = 0) : words_((n + 63) / 64, 0) {}
  void set(size_t i) { words_[i / 64] |= uint64_t{1} << (i % 64); }
  void reset(size_t i) { words_[i / 64] &= ~(uint64_t{1} << (i % 64)); }
  bool test(size_t i) const { return (words_[i / 64] >> (i % 64)) & 1u; }
  void clear() { std::fill(words_.begin(), words_.end(), 0); }
  Bits& operator|=(const Bits& o) {
    for (size_t w = 0; w < words_.size(); ++w) words_[w] |= o.words_[w];
    return *this;
  }
  template <typename F>
  bool any_of(F&& f) const {  // f(i) over set bits until it returns true
    for (size_t w = 0; w < words_.size(); ++w)
      for (uint64_t bits = words_[w]; bits != 0; bits &= bits - 1)
        if (f(w * 64 + static_cast<size_t>(std::countr_zero(bits)))) return true;
    return false;
  }

 private:
  std::vector<uint64_t> words_;
};

class Partitioner {
 public:
  Partitioner(const passes::EdgeProgram& p, const SupportFn& supports, const BoundaryFn& boundary,
              const PartitionOptions& options)
      : p_(p), g_(p.graph), supports_(supports), boundary_(boundary), options_(options) {}

  Partition run() {
    index_graph();
    const size_t n = g_.nodes.size();
    delegated_.assign(n, false);
    result_.reason.assign(n, "");
    for (size_t i = 0; i < n; ++i) {
      std::string why;
      delegated_[i] = supports_(g_, g_.nodes[i], &why);
      if (!delegated_[i]) result_.reason[i] = why.empty() ? "not supported by the backend" : why;
    }
    // Each round either accepts every region boundary or moves at least one
    // more node to the portable path, so this ends within n rounds.
    while (true) {
      ++result_.rounds;
      decide_homes();
      std::vector<Region> regions = group();
      if (accept_boundaries(regions)) {
        result_.regions = std::move(regions);
        break;
      }
    }
    result_.region_of.assign(n, -1);
    for (size_t r = 0; r < result_.regions.size(); ++r)
      for (int32_t i : result_.regions[r].nodes) result_.region_of[static_cast<size_t>(i)] = static_cast<int32_t>(r);
    return std::move(result_);
  }

 private:
  // ---- the graph: producers, readers, what the program returns ----------------
  void index_graph() {
    const size_t n = g_.nodes.size();
    producer_.assign(g_.values.size(), -1);
    readers_.assign(g_.values.size(), {});
    preds_.assign(n, {});
    succs_.assign(n, {});
    for (size_t i = 0; i < n; ++i)
      for (ValueId v : g_.nodes[i].output_ids()) producer_.at(static_cast<size_t>(v)) = static_cast<int32_t>(i);
    for (size_t i = 0; i < n; ++i) {
      for (ValueId v : reads_of(g_.nodes[i])) {
        auto& r = readers_.at(static_cast<size_t>(v));
        if (r.empty() || r.back() != static_cast<int32_t>(i)) r.push_back(static_cast<int32_t>(i));
        int32_t q = p_.is_constant(v) ? -1 : producer_[static_cast<size_t>(v)];
        if (q < 0) continue;
        check(q < static_cast<int32_t>(i), "node '{}' reads '{}' before it is computed", g_.nodes[i].name,
              g_.value(v).name);
        auto& pr = preds_[i];
        if (std::find(pr.begin(), pr.end(), q) == pr.end()) {
          pr.push_back(q);
          succs_[static_cast<size_t>(q)].push_back(static_cast<int32_t>(i));
        }
      }
    }
    for (ValueId v : p_.outputs) returned_.insert(v);
    for (const auto& o : g_.outputs)
      for (ValueId v : o.tensor_ids()) returned_.insert(v);
  }

  // ---- constant homes ----------------------------------------------------------
  const ContentDigest& digest(ValueId v) {
    auto it = result_.constant_digest.find(v);
    if (it == result_.constant_digest.end()) it = result_.constant_digest.emplace(v, content_digest(p_, v)).first;
    return it->second;
  }

  void decide_homes() {
    std::set<ValueId> portable, delegated;
    for (size_t i = 0; i < g_.nodes.size(); ++i)
      for (ValueId v : reads_of(g_.nodes[i]))
        if (p_.is_constant(v)) (delegated_[i] ? delegated : portable).insert(v);
    for (ValueId v : returned_)
      if (p_.is_constant(v)) portable.insert(v);
    // Bytes a portable reader needs live in the constant segment; a delegated
    // reader of the same bytes (the same value or an equal one) reads them there.
    std::map<int64_t, std::vector<ValueId>> portable_by_size;
    for (ValueId v : portable) portable_by_size[g_.value(v).meta.nbytes()].push_back(v);
    auto& home = result_.constant_home;
    home.clear();
    for (ValueId v : portable) home[v] = ConstantHome::Segment;
    for (ValueId v : delegated) {
      if (home.contains(v)) continue;
      ConstantHome h = ConstantHome::Named;
      if (options_.transformed_constants.contains(v)) {
        digest(v);
        home[v] = h;
        continue;
      }
      if (auto same = portable_by_size.find(g_.value(v).meta.nbytes()); same != portable_by_size.end()) {
        const ContentDigest d = digest(v);
        for (ValueId u : same->second)
          if (digest(u) == d) h = ConstantHome::Segment;
      }
      if (h == ConstantHome::Named) digest(v);  // its named-data key
      home[v] = h;
    }
  }

  // ---- regions -------------------------------------------------------------------
  int32_t find(int32_t u) {
    while (parent_[static_cast<size_t>(u)] != u) {
      parent_[static_cast<size_t>(u)] = parent_[static_cast<size_t>(parent_[static_cast<size_t>(u)])];
      u = parent_[static_cast<size_t>(u)];
    }
    return u;
  }

  // A path from unit a to unit b through some other unit.
  bool indirect_path(int32_t a, int32_t b) const {
    const auto bb = static_cast<size_t>(b);
    return desc_[static_cast<size_t>(a)].any_of([&](size_t x) { return x != bb && desc_[x].test(bb); });
  }

  // Contracts units a and b into one when that leaves the unit graph acyclic.
  bool try_merge(int32_t a, int32_t b) {
    if (a == b || indirect_path(a, b) || indirect_path(b, a)) return false;
    const auto ua = static_cast<size_t>(a), ub = static_cast<size_t>(b);
    Bits merged = desc_[ua];
    merged |= desc_[ub];
    merged.reset(ua);
    merged.reset(ub);
    for (int32_t x : live_) {
      auto ux = static_cast<size_t>(x);
      if (x == a || x == b || !(desc_[ux].test(ua) || desc_[ux].test(ub))) continue;
      desc_[ux] |= merged;
      desc_[ux].reset(ub);
      desc_[ux].set(ua);
    }
    desc_[ua] = std::move(merged);
    desc_[ub].clear();
    parent_[ub] = a;
    live_.erase(std::find(live_.begin(), live_.end(), b));
    return true;
  }

  std::vector<Region> group() {
    const size_t n = g_.nodes.size();
    parent_.resize(n);
    std::iota(parent_.begin(), parent_.end(), 0);
    live_.resize(n);
    std::iota(live_.begin(), live_.end(), 0);
    if (!options_.per_op) {
      // Strict descendants of every node (units start as single nodes).
      desc_.assign(n, Bits(n));
      for (size_t i = n; i-- > 0;)
        for (int32_t s : succs_[i]) {
          desc_[i].set(static_cast<size_t>(s));
          desc_[i] |= desc_[static_cast<size_t>(s)];
        }
      // Along the data flow: a node joins the regions of its producers.
      for (size_t i = 0; i < n; ++i) {
        if (!delegated_[i]) continue;
        for (int32_t q : preds_[i])
          if (delegated_[static_cast<size_t>(q)]) {
            int32_t a = find(q), b = find(static_cast<int32_t>(i));
            if (a != b) try_merge(std::min(a, b), std::max(a, b));
          }
      }
      // Then any two regions with no path between them through the rest.
      for (bool merged = true; merged;) {
        merged = false;
        std::vector<int32_t> regions;
        for (int32_t u : live_)
          if (delegated_[static_cast<size_t>(u)]) regions.push_back(u);
        for (size_t x = 0; x < regions.size() && !merged; ++x)
          for (size_t y = x + 1; y < regions.size() && !merged; ++y) merged = try_merge(regions[x], regions[y]);
      }
    }
    // Regions ordered by their first node; nodes in graph order.
    std::map<int32_t, std::vector<int32_t>> members;
    for (size_t i = 0; i < n; ++i)
      if (delegated_[i]) members[find(static_cast<int32_t>(i))].push_back(static_cast<int32_t>(i));
    std::vector<std::vector<int32_t>> node_lists;
    for (auto& [rep, nodes] : members) node_lists.push_back(std::move(nodes));
    std::sort(node_lists.begin(), node_lists.end(), [](const auto& a, const auto& b) { return a[0] < b[0]; });
    std::vector<Region> regions;
    for (auto& nodes : node_lists) regions.push_back(describe(std::move(nodes)));
    return regions;
  }

  Region describe(std::vector<int32_t> nodes) {
    Region r;
    std::set<int32_t> in_region(nodes.begin(), nodes.end());
    std::set<ValueId> seen;
    for (int32_t i : nodes) {
      for (ValueId v : reads_of(g_.nodes[static_cast<size_t>(i)])) {
        if (!seen.insert(v).second) continue;
        if (p_.is_constant(v)) {
          (result_.constant_home.at(v) == ConstantHome::Named ? r.constants : r.inputs).push_back(v);
        } else if (!in_region.contains(producer_[static_cast<size_t>(v)])) {
          r.inputs.push_back(v);
        }
      }
    }
    for (int32_t i : nodes)
      for (ValueId v : g_.nodes[static_cast<size_t>(i)].output_ids()) {
        const auto& readers = readers_[static_cast<size_t>(v)];
        bool outside = returned_.contains(v) || std::any_of(readers.begin(), readers.end(), [&](int32_t q) {
                         return !in_region.contains(q);
                       });
        if (outside) r.outputs.push_back(v);
      }
    r.nodes = std::move(nodes);
    return r;
  }

  // Moves to the portable path every node whose region boundary the backend
  // cannot take; true when there was none.
  bool accept_boundaries(const std::vector<Region>& regions) {
    bool accepted = true;
    auto exclude = [&](int32_t i, std::string why) {
      if (!delegated_[static_cast<size_t>(i)]) return;
      delegated_[static_cast<size_t>(i)] = false;
      result_.reason[static_cast<size_t>(i)] = std::move(why);
      accepted = false;
    };
    for (const Region& r : regions) {
      std::set<int32_t> in_region(r.nodes.begin(), r.nodes.end());
      for (ValueId v : r.inputs) {
        auto why = boundary_(g_, v);
        if (!why) continue;
        std::string what = p_.is_constant(v) ? fmt::format("reads constant '{}', which the portable path also reads "
                                                           "(so it would be a delegate input), but {}",
                                                           g_.value(v).name, *why)
                                             : fmt::format("reads '{}' from outside its delegate region, but {}",
                                                           g_.value(v).name, *why);
        for (int32_t q : readers_[static_cast<size_t>(v)])
          if (in_region.contains(q)) exclude(q, what);
      }
      for (ValueId v : r.outputs) {
        auto why = boundary_(g_, v);
        if (!why) continue;
        exclude(producer_[static_cast<size_t>(v)],
                fmt::format("computes '{}', which is read outside its delegate region, but {}", g_.value(v).name,
                            *why));
      }
    }
    return accepted;
  }

  const passes::EdgeProgram& p_;
  const graph::Graph& g_;
  const SupportFn& supports_;
  const BoundaryFn& boundary_;
  PartitionOptions options_;
  Partition result_;

  std::vector<int32_t> producer_;               // per value: node index, or -1
  std::vector<std::vector<int32_t>> readers_;   // per value: node indices
  std::vector<std::vector<int32_t>> preds_, succs_;  // per node: nodes it reads from / that read it
  std::set<ValueId> returned_;
  std::vector<bool> delegated_;
  std::vector<int32_t> parent_;  // union-find over nodes: a region's representative
  std::vector<int32_t> live_;    // representatives
  std::vector<Bits> desc_;       // per representative: the representatives reachable from it
};

}  // namespace

ContentDigest content_digest(const passes::EdgeProgram& program, graph::ValueId v) {
  const passes::ConstantData& c = program.constants.at(v);
  // owned: a constant's bytes can fail to stream (a damaged archive, a bad KILN_LOWER_THREADS in a widening)
  std::unique_ptr<XXH3_state_t, XXH_errorcode (*)(XXH3_state_t*)> owner(XXH3_createState(), XXH3_freeState);
  XXH3_state_t* state = owner.get();
  check(state != nullptr, "out of memory hashing constant '{}'", program.graph.value(v).name);
  uint64_t size = 0;
  auto sink = [&](std::span<const std::byte> s) {
    XXH3_128bits_update(state, s.data(), s.size());
    size += s.size();
  };
  uint64_t expected = c.generated ? c.generated->size
                      : c.bytes   ? c.bytes->size()
                                  : static_cast<uint64_t>(c.source->meta.nbytes());
  XXH3_128bits_reset_withSeed(state, expected);
  if (c.generated) c.generated->write(sink);
  else if (c.bytes) sink(*c.bytes);
  else program.exported->stream_constant(*c.source, sink);
  XXH128_hash_t h = XXH3_128bits_digest(state);
  check(size == expected, "constant '{}' streamed {} bytes, expected {}", program.graph.value(v).name, size, expected);
  return {h.high64, h.low64};
}

Partition partition_program(const passes::EdgeProgram& program, const SupportFn& supports, const BoundaryFn& boundary,
                            const PartitionOptions& options) {
  return Partitioner(program, supports, boundary, options).run();
}

}  // namespace kiln::partition
