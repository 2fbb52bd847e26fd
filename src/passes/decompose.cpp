// to_edge: exported program (default IR or core ATen) -> kiln's edge form.
//
// One walk over the source graph in order. Each source node is rewritten into
// zero or more edge nodes (core-ATen functional ops from the op table, views as
// *_copy ops, every tensor contiguous); no-ops (dropout in eval, asserts,
// same-dtype conversions, contiguous/clone/alias) bind their output to their
// input. Every emitted node whose inputs are all constant is folded on the
// spot with kiln's kernels when that does not grow the program; views of
// constants become constants sharing the same bytes. Dead nodes and unused
// constants are dropped at the end.

#include "lowerer.h"

#include "kiln/passes/functionalize.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <numeric>
#include <set>

namespace kiln::passes {

std::vector<std::byte> EdgeProgram::constant_bytes(graph::ValueId v) const {
  const ConstantData& c = constants.at(v);
  if (c.bytes) return *c.bytes;
  std::vector<std::byte> out(static_cast<size_t>(c.source->meta.nbytes()));
  exported->read_constant(*c.source, out);
  return out;
}

EdgeProgram to_edge(const pt2::ExportedProgram& ep, LoweringStats* stats, const EdgeOptions& options) {
  if (needs_functionalization(ep.graph)) {  // the default IR's in-place operators (functionalize.h)
    auto functional = std::make_shared<pt2::ExportedProgram>(ep);
    functionalize(*functional);
    EdgeProgram edge = detail::Lowerer(*functional, stats, options).run();
    edge.functionalized = std::move(functional);  // edge.exported and its constants point into it
    return edge;
  }
  return detail::Lowerer(ep, stats, options).run();
}

}  // namespace kiln::passes
