// DelegatedRegion: the partitioner's product, a region of the edge graph that a
// backend runs as one delegate call, with the payload the backend built for it.
// The emitter (kiln/emit/emitter.h) consumes it; it lives here, with the
// partitioner that makes it, so emit depends on partition's type and not the
// reverse. Header-only: emit needs no partitioner code to use it.
#pragma once

#include "kiln/graph/graph.h"
#include "kiln/pte/program_model.h"

#include <cstdint>
#include <string>
#include <vector>

namespace kiln::partition {

// The call's arguments are the values of `inputs` then of `outputs`, in order.
struct DelegatedRegion {
  std::string backend_id;                  // "XnnpackBackend"
  std::vector<int32_t> nodes;              // indices into graph.nodes it replaces
  std::vector<graph::ValueId> inputs;      // computed values, graph inputs or constants, read from outside
  std::vector<graph::ValueId> outputs;     // computed by the region, read after it
  pte::DataBlob payload;                   // the backend's processed blob
  std::vector<pte::NamedBlob> named_data;  // data the payload names (a key given twice is stored once)
  std::vector<pte::CompileSpec> compile_specs;
};

}  // namespace kiln::partition
