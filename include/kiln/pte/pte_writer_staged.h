// write_pte into a StagedFile (kiln/core/output_file.h) the caller publishes, with its companions
// (kiln lower publishes the .pte, its metadata and its debug map as one set).
#pragma once

#include "kiln/core/output_file.h"
#include "kiln/pte/pte_writer.h"

namespace kiln::pte {

// Writes `program` into `file` and closes it; does not publish it. Throws kiln::Error as write_pte does.
void write_pte(const Program& program, StagedFile& file, const WriteOptions& opts = {});

}  // namespace kiln::pte
