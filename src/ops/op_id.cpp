#include "kiln/ops/op_id.h"

#include <array>

namespace kiln::ops {

const OpInfo kOps[kNumOps] = {
#define KILN_OP(id, target, schema) {#id, target, schema},
#include "kiln/ops/aten_ops.def"
#undef KILN_OP
};

namespace {

// The count guard: as many rows as enumerators (a row added without its id, or the
// other way round, does not compile).
constexpr size_t kRows = 0
#define KILN_OP(id, target, schema) +1
#include "kiln/ops/aten_ops.def"
#undef KILN_OP
    ;
static_assert(kRows == kNumOps, "aten_ops.def: every KILN_OP line is one OpId");

struct Parsed {
  Schema schema[kNumOps];
  bool ok[kNumOps];
  ParseError error[kNumOps];
  // "ns::name.overload", into names[]
  char names[kNumOps][96];
  std::string_view name[kNumOps];
};

const Parsed& parsed() {
  static const Parsed* p = [] {
    static Parsed q;
    for (size_t i = 0; i < kNumOps; ++i) {
      q.ok[i] = parse_schema(kOps[i].schema, &q.schema[i], &q.error[i]);
      const Schema& s = q.schema[i];
      size_t n = 0;
      auto put = [&](std::string_view part) {
        for (char c : part)
          if (n + 1 < sizeof(q.names[i])) q.names[i][n++] = c;
      };
      put(s.ns);
      put("::");
      put(s.name);
      if (!s.overload.empty()) {
        put(".");
        put(s.overload);
      }
      q.names[i][n] = '\0';
      q.name[i] = std::string_view(q.names[i], n);
    }
    return &q;
  }();
  return *p;
}

}  // namespace

const Schema& op_schema(OpId id) { return parsed().schema[static_cast<size_t>(id)]; }

std::string_view op_name(OpId id) { return parsed().name[static_cast<size_t>(id)]; }

std::optional<OpId> find_op(std::string_view name, std::string_view overload) {
  const Parsed& p = parsed();
  for (size_t i = 0; i < kNumOps; ++i) {
    const Schema& s = p.schema[i];
    if (s.overload != overload || name.size() != s.ns.size() + 2 + s.name.size()) continue;
    if (name.substr(0, s.ns.size()) == s.ns && name.substr(s.ns.size(), 2) == "::" &&
        name.substr(s.ns.size() + 2) == s.name)
      return static_cast<OpId>(i);
  }
  return std::nullopt;
}

const char* check_op_table(OpId* bad) {
  const Parsed& p = parsed();
  for (size_t i = 0; i < kNumOps; ++i) {
    *bad = static_cast<OpId>(i);
    if (!p.ok[i]) return p.error[i].what;
    if (p.schema[i].num_outs == 0 && !p.schema[i].inplace) return "the schema has no out argument (only out variants run)";
    for (size_t j = 0; j < i; ++j) {
      if (p.name[i] == p.name[j]) return "two lines name the same out variant";
      if (!kOps[i].target.empty() && kOps[i].target == kOps[j].target) return "two lines name the same target";
    }
  }
  return nullptr;
}

}  // namespace kiln::ops
