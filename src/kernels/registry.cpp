// The kernel registry: one entry per line of the operator table, each defined
// by a KILN_KERNEL (or KILN_BOXED_KERNEL) line next to its kernel. An op without
// a kernel does not link ("undefined reference to kiln_kernel_<id>"); a kernel
// whose parameter types disagree with its schema is refused when the registry
// starts (reported on stderr, and the kernel is then not found).
#include "util/register.h"

#include <cstdio>

namespace kiln::rt::kernels {

#define KILN_OP(id, target, schema) extern const KernelEntry kiln_kernel_##id;
#include "kiln/ops/aten_ops.def"
#undef KILN_OP

namespace {

const KernelEntry* const kEntries[ops::kNumOps] = {
#define KILN_OP(id, target, schema) &kiln_kernel_##id,
#include "kiln/ops/aten_ops.def"
#undef KILN_OP
};

std::string_view arg_name(const ops::Schema& s, int i) { return i < s.num_args ? s.args[i].name : "?"; }

struct Registry {
  const KernelEntry* by_op[ops::kNumOps] = {};
  Registry() {
    for (size_t i = 0; i < ops::kNumOps; ++i) {
      char msg[256];
      const char* why = check_kernel_entry(*kEntries[i], msg, sizeof(msg));
      if (why[0] == '\0' && kEntries[i]->op != i) why = "registered under another operator's id";
      if (why[0] != '\0') {
        std::fprintf(stderr, "kiln: error: kernel registry: %s\n", why);
        continue;
      }
      by_op[i] = kEntries[i];
    }
  }
};

const Registry& registry() {
  static const Registry r;
  return r;
}

}  // namespace

const char* check_kernel_entry(const KernelEntry& e, char* msg, size_t n) {
  if (e.op >= ops::kNumOps) {
    std::snprintf(msg, n, "kernel for unknown operator id %u", static_cast<unsigned>(e.op));
    return msg;
  }
  const auto id = static_cast<ops::OpId>(e.op);
  const char* op = ops::op_name(id).data();
  const ops::Schema& s = ops::op_schema(id);
  if (e.fn == nullptr) {
    std::snprintf(msg, n, "%s: no entry point", op);
    return msg;
  }
  if (e.params == nullptr) return "";  // boxed: checks its own arguments
  if (e.num_params != s.num_args) {
    std::snprintf(msg, n, "%s: the kernel takes %d arguments but the schema '%.*s' has %d", op, e.num_params,
                  static_cast<int>(ops::op_info(id).schema.size()), ops::op_info(id).schema.data(), s.num_args);
    return msg;
  }
  for (int i = 0; i < s.num_args; ++i) {
    const ops::Arg& a = s.args[i];
    const uint8_t code = e.params[i];
    const auto t = static_cast<ops::Type>(code & kParamTypeMask);
    const std::string_view name = arg_name(s, i);
    if (t != a.type) {
      std::snprintf(msg, n, "%s: parameter %d (%.*s) takes %.*s but the schema has %.*s", op, i,
                    static_cast<int>(name.size()), name.data(), static_cast<int>(ops::type_name(t).size()),
                    ops::type_name(t).data(), static_cast<int>(ops::type_name(a.type).size()),
                    ops::type_name(a.type).data());
      return msg;
    }
    const bool mut = (code & kMutableParam) != 0;
    if (a.is_out && a.type == ops::Type::Tensor && (!mut || (code & kWrappedParam) != 0)) {
      std::snprintf(msg, n, "%s: parameter %d (%.*s) is an out tensor: it must be Tensor&", op, i,
                    static_cast<int>(name.size()), name.data());
      return msg;
    }
    if (!a.is_out && mut) {
      std::snprintf(msg, n, "%s: parameter %d (%.*s) is Tensor& but the schema does not mark it mutable (a!)", op,
                    i, static_cast<int>(name.size()), name.data());
      return msg;
    }
  }
  return "";
}

const char* check_kernel_coverage(std::span<const KernelEntry* const> entries, char* msg, size_t n) {
  for (size_t i = 0; i < ops::kNumOps; ++i) {
    const auto id = static_cast<ops::OpId>(i);
    if (ops::op_info(id).target.empty()) continue;  // run-only ops: the link checks those
    bool found = false;
    for (const KernelEntry* e : entries) found = found || (e != nullptr && e->op == i);
    if (!found) {
      std::snprintf(msg, n, "%s (emitted for %.*s) has no kernel", ops::op_name(id).data(),
                    static_cast<int>(ops::op_info(id).target.size()), ops::op_info(id).target.data());
      return msg;
    }
  }
  return "";
}

}  // namespace kiln::rt::kernels

namespace kiln::rt {

KernelFn find_kernel(std::string_view name, std::string_view overload) {
  auto id = ops::find_op(name, overload);
  if (!id) return nullptr;
  const KernelEntry* e = kernels::registry().by_op[static_cast<size_t>(*id)];
  return e != nullptr ? e->fn : nullptr;
}

std::span<const KernelEntry* const> registered_kernels() { return kernels::kEntries; }

std::string_view kernel_name(const KernelEntry& entry) {
  return entry.op < ops::kNumOps ? ops::op_name(static_cast<ops::OpId>(entry.op)) : std::string_view("?");
}

}  // namespace kiln::rt
