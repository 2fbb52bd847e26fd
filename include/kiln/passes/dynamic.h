// Dynamic shapes in edge form. A .pt2 exported with dynamic_shapes is lowered
// at its upper bounds (every tensor planned at its largest size) and again with
// each symbol one smaller; the edge graphs must agree node for node, and what
// differs between them is what depends on the symbols: tensor sizes (a
// DYNAMIC_BOUND tensor in the .pte) and integer arguments (view sizes, slice
// ends: Int values the program computes at run time with sym_size and
// executorch_prim instructions). A third lowering checks that every such
// dependence is the linear expression the first two imply.
#pragma once

#include "kiln/graph/graph.h"
#include "kiln/passes/edge_program.h"

#include <map>
#include <string>
#include <utility>
#include <vector>

namespace kiln::passes {

struct DynamicShapes {
  std::vector<graph::Symbol> symbols;
  // Where the program reads each symbol at run time: a user input and its dim.
  struct Source {
    graph::ValueId input = 0;
    int64_t dim = 0;
  };
  std::vector<Source> sources;  // one per symbol
  // Every tensor with a dynamic dim: an expression per dim (constants for the static ones).
  std::map<graph::ValueId, std::vector<graph::SymExpr>> sizes;
  // (node index, argument name) -> the argument's ints as expressions (an Int: one),
  // for arguments with at least one dynamic item.
  std::map<std::pair<int32_t, std::string>, std::vector<graph::SymExpr>> int_args;

  bool is_dynamic(graph::ValueId v) const { return sizes.contains(v); }
};

// Lowers a dynamic program (ep read at its upper bounds; ep.graph.symbols not
// empty) to edge form with its DynamicShapes. Throws kiln::Error with one line
// when a dependence on a symbol is not one kiln can express.
EdgeProgram to_edge_dynamic(const pt2::ExportedProgram& ep, LoweringStats* stats = nullptr,
                            const EdgeOptions& options = {});

}  // namespace kiln::passes
