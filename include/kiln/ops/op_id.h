// OpId: one identifier per line of aten_ops.def, and the table's data by id.
#pragma once

#include "kiln/ops/schema.h"

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace kiln::ops {

enum class OpId : uint16_t {
#define KILN_OP(id, target, schema) id,
#include "kiln/ops/aten_ops.def"
#undef KILN_OP
  Count,
};

constexpr size_t kNumOps = static_cast<size_t>(OpId::Count);

struct OpInfo {
  std::string_view id;      // "gelu_out"
  std::string_view target;  // "aten.gelu.default" ("" if kiln never emits it)
  std::string_view schema;  // the schema text
};

// Rows of the table in OpId order; the array is sized by OpId::Count and checked
// against the number of KILN_OP lines at compile time (op_id.cpp).
extern const OpInfo kOps[kNumOps];

inline const OpInfo& op_info(OpId id) { return kOps[static_cast<size_t>(id)]; }

// The parsed schema of an op (parsed once, on first use; a line that does not parse
// is reported by check_op_table and by the op-table unit test).
const Schema& op_schema(OpId id);

// "aten::gelu.out": the out variant's qualified name with its overload.
std::string_view op_name(OpId id);

// The op whose out variant is `name`.`overload` ("aten::gelu", "out").
std::optional<OpId> find_op(std::string_view name, std::string_view overload);

// Every line parses and no two lines name the same out variant or target:
// nullptr when the table is sound, else a static description of the first problem
// (the line's id is written to *bad).
const char* check_op_table(OpId* bad);

}  // namespace kiln::ops
