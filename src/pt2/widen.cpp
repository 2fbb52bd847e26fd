// widen_to_float (pt2_reader.h): a bfloat16 / float16 program as float32, its constants widened as read.
#include "kiln/core/error.h"
#include "kiln/pt2/pt2_reader.h"

namespace kiln::pt2 {

std::optional<ScalarType> widen_to_float(ExportedProgram& ep) {
  auto half = [](ScalarType t) { return t == ScalarType::BFloat16 || t == ScalarType::Half; };
  std::optional<ScalarType> from;
  auto see = [&](ScalarType t, std::string_view where) {
    if (!half(t)) return false;
    check(!from || *from == t, "{}: the program has both bfloat16 and float16 values ({} is {}): kiln widens one "
                               "16-bit float type to float32 per program",
          ep.path, where, dtype_name(t));
    from = t;
    return true;
  };
  for (auto& v : ep.graph.values)
    if (see(v.meta.dtype, v.name)) v.meta.dtype = ScalarType::Float;
  for (auto& c : ep.constants)
    if (see(c.meta.dtype, c.name)) {
      c.stored_dtype = c.meta.dtype;
      c.meta.dtype = ScalarType::Float;
    }
  for (auto& n : ep.graph.nodes)
    for (auto& a : n.inputs)
      if (a.arg.kind == graph::Argument::Kind::ScalarType) {
        auto& t = std::get<ScalarType>(a.arg.payload);
        if (see(t, n.name)) t = ScalarType::Float;
      }
  if (from) ep.widened_from = from;
  return from;
}

}  // namespace kiln::pt2
