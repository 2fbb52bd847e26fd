// Test-only: writes a small hand-built program with kiln's .pte writer, for
// tests/python/test_pte_format.py to load with ExecuTorch.
//
//   kiln_pte_smoke OUT.pte [--planned-input] [--extras]
//
// forward(x: float32[2, 3]) -> x @ w + c, with constants w: float32[3, 4]
// (w.flat[k] = 0.5 k - 1) and c: float32[4] = [1, -2, 3, 0.25], as
// aten::mm.out then aten::add.out (alpha 1) into planned memory.
// --planned-input also plans x; --extras adds what ExecuTorch's runtime
// cannot run but its deserializer must read back: a delegate with a segment
// payload (1000 bytes, byte k = k % 251), one with an empty (inline)
// payload, both called, two unused constants (5 bytes, byte k = 3k; 8 bytes,
// byte k = 5k) and two named blobs "alpha" (300 bytes, byte k = (7k) % 256)
// and "beta" (5 bytes "kiln!").
#include "kiln/core/error.h"
#include "kiln/pte/pte_writer.h"

#include <cstdio>
#include <cstring>
#include <string>

using namespace kiln::pte;

namespace {

DataBlob float_blob(const std::vector<float>& values) {
  std::vector<std::byte> bytes(values.size() * sizeof(float));
  std::memcpy(bytes.data(), values.data(), bytes.size());
  return DataBlob::from_bytes(std::move(bytes));
}

DataBlob pattern_blob(size_t n, int mul, int mod) {
  std::vector<std::byte> bytes(n);
  for (size_t k = 0; k < n; ++k)
    bytes[k] = static_cast<std::byte>((k * static_cast<size_t>(mul)) % static_cast<size_t>(mod));
  return DataBlob::from_bytes(std::move(bytes));
}

TensorValue tensor(std::vector<int32_t> sizes) {
  TensorValue t;
  t.dtype = kiln::ScalarType::Float;
  t.sizes = std::move(sizes);
  for (size_t d = 0; d < t.sizes.size(); ++d) t.dim_order.push_back(static_cast<uint8_t>(d));
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: kiln_pte_smoke OUT.pte [--planned-input] [--extras]\n");
    return 2;
  }
  bool planned_input = false, extras = false;
  for (int i = 2; i < argc; ++i) {
    if (std::strcmp(argv[i], "--planned-input") == 0) planned_input = true;
    else if (std::strcmp(argv[i], "--extras") == 0) extras = true;
    else {
      std::fprintf(stderr, "kiln_pte_smoke: unknown option %s\n", argv[i]);
      return 2;
    }
  }

  Program program;
  std::vector<float> w(12);
  for (int k = 0; k < 12; ++k) w[static_cast<size_t>(k)] = 0.5f * static_cast<float>(k) - 1.0f;
  program.constants.push_back(float_blob(w));                          // constant 1
  program.constants.push_back(float_blob({1.0f, -2.0f, 3.0f, 0.25f}));  // constant 2

  ExecutionPlan plan;
  TensorValue x = tensor({2, 3});
  if (planned_input) x.allocation = Allocation{1, 64};
  TensorValue wt = tensor({3, 4});
  wt.constant_index = 1;
  TensorValue out0 = tensor({2, 4});
  out0.allocation = Allocation{1, 0};
  TensorValue ct = tensor({4});
  ct.constant_index = 2;
  TensorValue out1 = tensor({2, 4});
  out1.allocation = Allocation{1, 32};
  plan.values = {x, wt, out0, ct, int64_t{1}, out1};
  plan.inputs = {0};
  plan.outputs = {5};
  plan.operators = {{"aten::mm", "out"}, {"aten::add", "out"}};
  // ExecuTorch's calling convention: schema args, outs, then the return value.
  plan.instructions = {KernelCall{0, {0, 1, 2, 2}}, KernelCall{1, {2, 3, 4, 5, 5}}};
  plan.non_const_buffer_sizes = {0, planned_input ? 96 : 64};
  plan.encoded_inputs_spec =
      R"([1, {"type": "builtins.tuple", "context": "null", "children_spec": [{"type": "builtins.tuple", "context": "null", "children_spec": [{"type": null, "context": null, "children_spec": []}]}, {"type": "builtins.dict", "context": "[]", "children_spec": []}]}])";
  plan.encoded_outputs_spec = R"([1, {"type": null, "context": null, "children_spec": []}])";

  if (extras) {
    program.delegate_payloads.push_back(pattern_blob(1000, 1, 251));
    program.delegate_payloads.push_back(DataBlob{});
    plan.delegates.push_back({"KilnTestBackend", 0, {{"mode", {1, 2}}}});
    plan.delegates.push_back({"KilnEmptyBackend", 1, {}});
    plan.instructions.push_back(DelegateCall{0, {5, 5}});
    plan.instructions.push_back(DelegateCall{1, {5}});
    // Constants nobody uses, sized so the first needs padding before the next.
    program.constants.push_back(pattern_blob(5, 3, 256));  // constant 3: 5 bytes, padded to 16
    program.constants.push_back(pattern_blob(8, 5, 256));  // constant 4: 8 bytes, last: no padding
    program.named_data.push_back({"alpha", pattern_blob(300, 7, 256)});
    std::vector<std::byte> beta(5);
    std::memcpy(beta.data(), "kiln!", 5);
    program.named_data.push_back({"beta", DataBlob::from_bytes(std::move(beta))});
  }
  program.plans.push_back(std::move(plan));

  try {
    write_pte(program, argv[1]);
  } catch (const kiln::Error& e) {
    std::fprintf(stderr, "kiln_pte_smoke: %s\n", e.what());
    return 1;
  }
  return 0;
}
