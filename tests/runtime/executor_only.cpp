// Links kiln_executor alone (no kernel library, no backend): the executor
// builds and links on its own, resolves operators only from what was
// registered into it, and rejects a program whose kernels are missing.
// Usage: kiln_executor_only [PROGRAM.pte]
#include "kiln/runtime/kernel_registry.h"
#include "kiln/runtime/program.h"

#include <cstdio>
#include <cstring>

namespace {

void fake_add(kiln::rt::KernelContext&, std::span<kiln::rt::EValue*>) {}
kiln::rt::KernelFn find_fake(std::string_view name, std::string_view overload) {
  return name == "test::fake_add" && overload == "out" ? fake_add : nullptr;
}
size_t count_fake() { return 1; }
const kiln::rt::KernelLibrary kFake{"fake", find_fake, count_fake};

int failures = 0;
void expect(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "FAILED: %s\n", what);
    ++failures;
  }
}

}  // namespace

int main(int argc, char** argv) {
  using namespace kiln::rt;
  expect(registered_kernel_count() == 0, "no kernel is registered without a kernel library");
  expect(lookup_kernel("aten::add", "out") == nullptr, "aten::add.out is not found without the portable kernels");
  expect(register_kernel_library(&kFake), "a kernel library registers");
  expect(lookup_kernel("test::fake_add", "out") == &fake_add, "a registered kernel is found");
  expect(lookup_kernel("test::fake_add", "Tensor") == nullptr, "the overload is part of the key");
  expect(registered_kernel_count() == 1, "one kernel registered");
  if (argc > 1) {  // a real program: loads and verifies, but its method cannot prepare
    ErrorMessage err;
    auto program = Program::load(argv[1], &err);
    expect(program.ok(), "the program loads with the executor alone");
    if (program.ok()) {
      auto method = program->load_method("forward", &err);
      expect(!method.ok() && method.status() == Status::NotFound && std::strstr(err.c_str(), "has no kernel"),
             "preparing the method reports the missing kernel");
    }
  }
  if (failures == 0) std::printf("executor alone: ok\n");
  return failures == 0 ? 0 : 1;
}
