// Internal to kiln_passes: evaluating edge nodes ahead of time with kiln's
// own portable kernels (the same ones the runtime executes), for constant folding.
#pragma once

#include "kiln/passes/edge_program.h"
#include "kiln/passes/op_table.h"

#include <optional>
#include <string>
#include <vector>

namespace kiln::passes {

// Runs `node` (all tensor inputs constant) and returns each output's
// row-major bytes; nullopt (with `why` set) if kiln has no kernel for it or
// the kernel rejects the arguments, in which case the node stays in the program.
std::optional<std::vector<std::vector<std::byte>>> evaluate_constant_node(const EdgeProgram& program,
                                                                          const graph::Node& node,
                                                                          const OpSchema& schema, std::string* why);

}  // namespace kiln::passes
