// Functionalization: torch.export's default IR is not functional (`x *= s`
// reaches the graph as aten.mul_.Tensor, `h[:, :4] += r` as an add_ on a slice
// of h). functionalize() rewrites such a graph into torch's functional form,
// the one run_decompositions() writes and kiln's lowering reads:
//
//  - every in-place operator (`aten.X_.overload`, `aten.__iX__.*`, an `out=`
//    overload) becomes its functional variant, found by name (strip the `_`;
//    an out= overload's functional target from the operator table), and the
//    mutated tensor's later readers (and the node's own result, an alias of it)
//    read the new value;
//  - a write into a view (slice, select, view/reshape, transpose/permute,
//    squeeze/unsqueeze, diagonal, as_strided, split, ...) is written back into
//    its base (slice_scatter / select_scatter / the inverse reshape or
//    permutation, or an index_put through the view's index map for any other
//    view), and every alias of that base read afterwards is regenerated from
//    the new base, as in eager;
//  - a user input or buffer whose contents change gets a USER_INPUT_MUTATION /
//    BUFFER_MUTATION output with its final value (first, in placeholder order,
//    as run_decompositions() lists them), so ExecuTorch's conventions for
//    mutated inputs and mutable buffers apply (rewrites_state.cpp).
#pragma once

#include "kiln/pt2/pt2_reader.h"

#include <string>
#include <string_view>

namespace kiln::passes {

// "aten.mul_.Tensor" -> "aten.mul.Tensor", "aten.__iand__.Tensor" -> "aten.__and__.Tensor";
// "" for a target that is not an in-place overload.
std::string inplace_functional_target(std::string_view target);

// True when the graph has an operator that writes one of its arguments.
bool needs_functionalization(const graph::Graph& g);

// Rewrites ep.graph and ep.signature into the functional form (see above).
// Throws kiln::Error naming the node for a write kiln cannot express (into an
// expanded view, into a parameter, an in-place change of a tensor's shape).
void functionalize(pt2::ExportedProgram& ep);

}  // namespace kiln::passes
