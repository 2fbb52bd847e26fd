// to_edge_dynamic (kiln/passes/dynamic.h): a dynamic program's edge form and
// its symbolic sizes, found by lowering the program at several values of its
// symbols and comparing the edge graphs (the passes themselves stay static:
// every rewrite sees concrete sizes, and what changes with a symbol is what
// the program must compute at run time). Programs with state (mutable buffers,
// updated inputs) go the same way: their in-place writes are nodes like others,
// with sizes (rows written) that may change with a symbol.
#include "kiln/passes/dynamic.h"

#include "kiln/core/error.h"
#include "kiln/passes/op_table.h"

#include <algorithm>
#include <cstring>
#include <future>
#include <memory>
#include <optional>

namespace kiln::passes {
namespace {

using graph::Argument;
using graph::SymExpr;
using graph::ValueId;

// The ints an argument carries (an Int: one), or nothing for other kinds.
std::optional<std::vector<int64_t>> ints_of(const Argument& a) {
  if (a.kind == Argument::Kind::Int) return std::vector<int64_t>{std::get<int64_t>(a.payload)};
  if (a.kind == Argument::Kind::Ints) return std::get<std::vector<int64_t>>(a.payload);
  return std::nullopt;
}

bool same_payload(const Argument& x, const Argument& y) {
  if (x.kind == Argument::Kind::Device) {
    const auto& a = std::get<graph::Device>(x.payload);
    const auto& b = std::get<graph::Device>(y.payload);
    return a.type == b.type && a.index == b.index;
  }
  return std::visit(
      [&](const auto& a) {
        using T = std::decay_t<decltype(a)>;
        if constexpr (std::is_same_v<T, graph::Device>) return true;
        else if constexpr (std::is_same_v<T, std::monostate>) return std::holds_alternative<T>(y.payload);
        else return std::holds_alternative<T>(y.payload) && std::get<T>(y.payload) == a;
      },
      x.payload);
}

struct Lowered {
  pt2::SymbolBinding binding;
  std::unique_ptr<pt2::ExportedProgram> ep;  // kept: its constants stream from it
  EdgeProgram edge;
};

[[noreturn]] void refuse(const std::string& what) {
  fail("dynamic shapes: {}; kiln lowers sizes that are linear in the symbols and "
       "programs whose operators do not change with them",
       what);
}

// The edge graphs agree but for ints and sizes; returns nothing, throws otherwise.
void check_same_structure(const EdgeProgram& a, const EdgeProgram& b, const std::string& at) {
  const auto& ga = a.graph;
  const auto& gb = b.graph;
  if (ga.nodes.size() != gb.nodes.size() || ga.values.size() != gb.values.size())
    refuse(fmt::format("the program lowers to {} nodes at the upper bounds but {} at {}", ga.nodes.size(),
                       gb.nodes.size(), at));
  if (ga.inputs != gb.inputs || a.outputs != b.outputs || a.mutable_buffers.size() != b.mutable_buffers.size())
    refuse(fmt::format("the program's inputs or outputs differ at {}", at));
  for (size_t i = 0; i < ga.nodes.size(); ++i) {
    const auto& na = ga.nodes[i];
    const auto& nb = gb.nodes[i];
    if (na.target != nb.target || na.inputs.size() != nb.inputs.size() || na.output_ids() != nb.output_ids())
      refuse(fmt::format("node '{}' ({}) lowers differently at {} ({})", na.name, na.target, at, nb.target));
    for (size_t k = 0; k < na.inputs.size(); ++k) {
      const auto& x = na.inputs[k];
      const auto& y = nb.inputs[k];
      if (x.name != y.name || x.arg.kind != y.arg.kind)
        refuse(fmt::format("node '{}' ({}) argument '{}' changes kind at {}", na.name, na.target, x.name, at));
      auto ix = ints_of(x.arg), iy = ints_of(y.arg);
      if (ix) {
        if (ix->size() != iy->size())
          refuse(fmt::format("node '{}' ({}) argument '{}' changes length at {}", na.name, na.target, x.name, at));
        continue;
      }
      if (!same_payload(x.arg, y.arg))
        refuse(fmt::format("node '{}' ({}) argument '{}' depends on a symbol and is not an int", na.name, na.target,
                           x.name));
    }
  }
  for (size_t v = 0; v < ga.values.size(); ++v) {
    const auto& ma = ga.values[v].meta;
    const auto& mb = gb.values[v].meta;
    if (ma.dtype != mb.dtype || ma.sizes.size() != mb.sizes.size())
      refuse(fmt::format("tensor '{}' changes dtype or rank at {}", ga.values[v].name, at));
  }
  for (const auto& [v, c] : a.constants) {
    auto it = b.constants.find(v);
    if (it == b.constants.end()) refuse(fmt::format("tensor '{}' is constant at the upper bounds only", ga.value(v).name));
    if (ga.value(v).meta.sizes != gb.value(v).meta.sizes)
      refuse(fmt::format("constant '{}' changes size with a symbol", ga.value(v).name));
    if (c.source && it->second.source && c.source->name == it->second.source->name) continue;
    if (a.constant_bytes(v) != b.constant_bytes(v))
      refuse(fmt::format("constant '{}' ({}) is computed from a dynamic size", ga.value(v).name, c.name));
  }
  if (a.constants.size() != b.constants.size()) refuse(fmt::format("the program's constants differ at {}", at));
}

std::string binding_text(const pt2::SymbolBinding& b) {
  std::string s;
  for (const auto& [k, v] : b) s += fmt::format("{}{}={}", s.empty() ? "" : ", ", k, v);
  return s;
}

}  // namespace

EdgeProgram to_edge_dynamic(const pt2::ExportedProgram& ep, LoweringStats* stats, const EdgeOptions& options) {
  const auto& symbols = ep.graph.symbols;
  check(!symbols.empty(), "internal: to_edge_dynamic on a static program");
  pt2::SymbolBinding upper;
  for (const auto& s : symbols) upper[s.name] = s.max;
  // The program at other sizes (each its own read of the .pt2 and its own edge form): lowered on threads of
  // their own while this one lowers it at the bounds (nothing is shared but the immutable op tables).
  auto lower_at = [&ep, &options](pt2::SymbolBinding b) {
    Lowered l;
    l.binding = std::move(b);
    l.ep = std::make_unique<pt2::ExportedProgram>(pt2::read_pt2(ep.path, &l.binding));
    if (ep.widened_from)  // read as the program was given (kiln lower --dtype fp32)
      pt2::widen_to_float(*l.ep, ep.io_widened ? pt2::WidenIo::Widen : pt2::WidenIo::Keep);
    l.edge = to_edge(*l.ep, nullptr, options);
    return l;
  };
  // Slopes: each symbol one smaller than its bound, the others at theirs.
  std::vector<std::future<Lowered>> slope_points(symbols.size());
  for (size_t k = 0; k < symbols.size(); ++k) {
    if (symbols[k].min == symbols[k].max) continue;  // a fixed size: nothing depends on it
    pt2::SymbolBinding b = upper;
    b[symbols[k].name] = symbols[k].max - 1;
    slope_points[k] = std::async(std::launch::async, lower_at, std::move(b));
  }
  // A third point checks the expressions: every symbol at another value of its range.
  pt2::SymbolBinding third = upper;
  bool have_third = false;
  for (const auto& s : symbols) {
    if (s.max - s.min < 2) continue;  // two values: the line through them is exact
    third[s.name] = std::clamp<int64_t>(2, s.min, s.max - 2);
    have_third = true;
  }
  std::future<Lowered> third_point;
  if (have_third) third_point = std::async(std::launch::async, lower_at, third);

  EdgeProgram base = to_edge(ep, stats, options);
  const auto& g = base.graph;
  std::vector<std::vector<std::vector<int64_t>>> size_slope(symbols.size());  // [symbol][value][dim]
  std::vector<std::map<std::pair<int32_t, std::string>, std::vector<int64_t>>> int_slope(symbols.size());
  for (size_t k = 0; k < symbols.size(); ++k) {
    size_slope[k].resize(g.values.size());
    for (size_t v = 0; v < g.values.size(); ++v) size_slope[k][v].assign(g.values[v].meta.sizes.size(), 0);
    if (!slope_points[k].valid()) continue;
    Lowered l = slope_points[k].get();
    check_same_structure(base, l.edge, binding_text(l.binding));
    for (size_t v = 0; v < g.values.size(); ++v)
      for (size_t d = 0; d < g.values[v].meta.sizes.size(); ++d)
        size_slope[k][v][d] = g.values[v].meta.sizes[d] - l.edge.graph.values[v].meta.sizes[d];
    for (size_t i = 0; i < g.nodes.size(); ++i)
      for (size_t a = 0; a < g.nodes[i].inputs.size(); ++a) {
        auto x = ints_of(g.nodes[i].inputs[a].arg);
        if (!x) continue;
        auto y = *ints_of(l.edge.graph.nodes[i].inputs[a].arg);
        std::vector<int64_t> slope(x->size());
        bool any = false;
        for (size_t j = 0; j < x->size(); ++j) any = (slope[j] = (*x)[j] - y[j]) != 0 || any;
        if (any) int_slope[k][{static_cast<int32_t>(i), g.nodes[i].inputs[a].name}] = std::move(slope);
      }
  }

  auto make_expr = [&](int64_t at_upper, const std::vector<int64_t>& slopes) {
    SymExpr e;
    e.constant = at_upper;
    for (size_t k = 0; k < symbols.size(); ++k) {
      if (slopes[k] == 0) continue;
      e.constant -= slopes[k] * symbols[k].max;
      e.terms.emplace_back(symbols[k].name, slopes[k]);
    }
    std::sort(e.terms.begin(), e.terms.end());
    return e;
  };

  auto shapes = std::make_shared<DynamicShapes>();
  shapes->symbols = symbols;
  for (size_t v = 0; v < g.values.size(); ++v) {
    const auto& sizes = g.values[v].meta.sizes;
    std::vector<SymExpr> dims;
    bool dynamic = false;
    for (size_t d = 0; d < sizes.size(); ++d) {
      std::vector<int64_t> slopes;
      for (size_t k = 0; k < symbols.size(); ++k) slopes.push_back(size_slope[k][v][d]);
      dims.push_back(make_expr(sizes[d], slopes));
      dynamic = dynamic || !dims.back().is_constant();
    }
    if (dynamic) shapes->sizes[static_cast<ValueId>(v)] = std::move(dims);
  }
  for (size_t i = 0; i < g.nodes.size(); ++i)
    for (const auto& in : g.nodes[i].inputs) {
      auto x = ints_of(in.arg);
      if (!x) continue;
      std::pair<int32_t, std::string> key{static_cast<int32_t>(i), in.name};
      bool dynamic = false;
      for (size_t k = 0; k < symbols.size(); ++k) dynamic = dynamic || int_slope[k].contains(key);
      if (!dynamic) continue;
      std::vector<SymExpr> items;
      for (size_t j = 0; j < x->size(); ++j) {
        std::vector<int64_t> slopes;
        for (size_t k = 0; k < symbols.size(); ++k) {
          auto it = int_slope[k].find(key);
          slopes.push_back(it == int_slope[k].end() ? 0 : it->second[j]);
        }
        items.push_back(make_expr((*x)[j], slopes));
      }
      shapes->int_args[key] = std::move(items);
    }
  for (const auto& [v, c] : base.constants)
    check(!shapes->is_dynamic(v), "dynamic shapes: constant '{}' has a dynamic size", g.value(v).name);
  for (const auto& b : base.mutable_buffers)
    if (shapes->is_dynamic(b.value)) refuse(fmt::format("mutable buffer '{}' has a dynamic size", b.name));

  if (have_third) {
    Lowered l = third_point.get();
    check_same_structure(base, l.edge, binding_text(l.binding));
    for (const auto& [v, dims] : shapes->sizes)
      for (size_t d = 0; d < dims.size(); ++d)
        if (dims[d].eval(third) != l.edge.graph.value(v).meta.sizes[d])
          refuse(fmt::format("the size of '{}' dim {} is {} at {}, not {}", g.value(v).name, d,
                             l.edge.graph.value(v).meta.sizes[d], binding_text(third), dims[d].str()));
    for (const auto& [key, items] : shapes->int_args) {
      const auto* in = l.edge.graph.nodes[static_cast<size_t>(key.first)].input(key.second);
      auto y = *ints_of(in->arg);
      for (size_t j = 0; j < items.size(); ++j)
        if (items[j].eval(third) != y[j])
          refuse(fmt::format("argument '{}' of node '{}' is {} at {}, not {}", key.second,
                             g.nodes[static_cast<size_t>(key.first)].name, y[j], binding_text(third), items[j].str()));
    }
    // Sizes and ints that did not change between the first two points must not change here either.
    for (size_t v = 0; v < g.values.size(); ++v)
      if (!shapes->is_dynamic(static_cast<ValueId>(v)) && g.values[v].meta.sizes != l.edge.graph.values[v].meta.sizes)
        refuse(fmt::format("the size of '{}' changes at {} only", g.values[v].name, binding_text(third)));
  }

  // Where each symbol is read at run time: a user input dim of exactly that size.
  for (const auto& s : symbols) {
    DynamicShapes::Source src{-1, -1};
    SymExpr want;
    want.terms.emplace_back(s.name, 1);
    for (ValueId in : g.inputs) {
      auto it = shapes->sizes.find(in);
      if (it == shapes->sizes.end()) continue;
      for (size_t d = 0; d < it->second.size() && src.input < 0; ++d)
        if (it->second[d] == want) src = {in, static_cast<int64_t>(d)};
      if (src.input >= 0) break;
    }
    bool used = false;
    for (const auto& [v, dims] : shapes->sizes)
      for (const auto& e : dims)
        for (const auto& t : e.terms) used = used || t.first == s.name;
    for (const auto& [key, items] : shapes->int_args)
      for (const auto& e : items)
        for (const auto& t : e.terms) used = used || t.first == s.name;
    if (used && src.input < 0) refuse(fmt::format("symbol '{}' is not the size of any input's dim", s.name));
    shapes->sources.push_back(src);
  }
  if (!shapes->sizes.empty()) base.dynamic = std::move(shapes);
  return base;
}

}  // namespace kiln::passes
