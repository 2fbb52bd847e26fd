// The ETRecord `kiln lower --etrecord PATH` writes: ExecuTorch 1.5's format
// (executorch.devtools.etrecord.parse_etrecord and Inspector read it), so
// ExecuTorch's devtools map an ETDump of kiln's program (from kiln's runtime or
// ExecuTorch's) back to the model as they do for ExecuTorch's own lowering.
//
// A zip archive of stored entries:
//   ETRECORD_V0                              empty: the identifier
//   exported_program[_state_dict|_constants|_example_inputs]
//                                            the .pt2's ATen program (torch.export serde JSON in the
//                                            schema ExecuTorch's serde reads, 5.4) and its weights
//                                            (torch.save blobs): the reference Inspector runs
//   edge_dialect_exported_program/forward[...]
//                                            kiln's edge graph (what the partitioner and emitter saw),
//                                            every node with its debug handle, the .pt2 node it came
//                                            from (from_node), nn_module_stack and stack_trace
//   export_graph_id                          the graph id from_node names
//   debug_handle_map                         {"forward": {instruction: handle | [handles]}}
//   delegate_map                             {"forward": {instruction: {"name": backend,
//                                            "delegate_map": {"<k>": [handle]}}}}: inside kiln's
//                                            XNNPACK delegates, payload node k (XNode.debug_handle)
//   instruction_id_to_num_outs_map           {"forward": {instruction: outputs}} (delegate calls)
//   representative_inputs, reference_outputs the spec's reference tensors, when it names them
//
// Debug handles are ExecuTorch's: one per node of the .pt2's graph (its position + 1), shared
// by every edge node lowered from that node, so Inspector's numeric comparison runs the .pt2's
// program as its reference. Format notes: docs/PROFILING.md.
#pragma once

#include "kiln/core/output_file.h"
#include "kiln/emit/emitter.h"
#include "kiln/backends/xnnpack/partitioner.h"
#include "kiln/passes/edge_program.h"
#include "kiln/pt2/model_spec.h"
#include "kiln/pt2/pt2_reader.h"

namespace kiln {

struct EtrecordInput {
  const pt2::ExportedProgram* exported = nullptr;             // the .pt2 as read
  const passes::EdgeProgram* edge = nullptr;
  const backends::xnnpack::XnnpackDelegation* delegation = nullptr;  // null for a portable lowering
  const emit::EmitReport* report = nullptr;                    // instruction_node / instruction_region
  const pt2::ModelSpec* spec = nullptr;                        // reference inputs and outputs
};

// Writes the ETRecord into `out` (not published: the caller publishes it with the .pte).
// Throws kiln::Error.
void write_etrecord(const EtrecordInput& in, StagedFile& out);

}  // namespace kiln
