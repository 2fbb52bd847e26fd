// Test-only: proves Method::execute allocates no heap memory. It replaces the
// C allocation entry points (which operator new also goes through) with
// counting wrappers around glibc's, arms them around one execute() call, and
// prints the count as JSON. A deliberate allocation while armed proves the
// hook itself works.
//
//   kiln_alloc_check FILE.pte   -> {"allocations_during_execute": 0, "hook_counted": 1}
//   kiln_alloc_check FILE.pte --profile   the same with profiling on (every instruction
//                                          and delegate step timed, as kiln profile runs it)
//   kiln_alloc_check FILE.pte --debug-outputs   the same with intermediate outputs logged (every
//                                          instruction's, every delegate step's), adding to the
//                                          line how many were logged inside delegates
#include "kiln/backends/xnnpack/runtime.h"
#include "kiln/runtime/debug_outputs.h"
#include "kiln/runtime/program.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

extern "C" {
void* __libc_malloc(size_t);
void* __libc_calloc(size_t, size_t);
void* __libc_realloc(void*, size_t);
void* __libc_memalign(size_t, size_t);
}

namespace {
std::atomic<bool> g_armed{false};
std::atomic<long> g_count{0};
void note() {
  if (g_armed.load(std::memory_order_relaxed)) g_count.fetch_add(1, std::memory_order_relaxed);
}
}  // namespace

extern "C" {
void* malloc(size_t n) {
  note();
  return __libc_malloc(n);
}
void* calloc(size_t n, size_t m) {
  note();
  return __libc_calloc(n, m);
}
void* realloc(void* p, size_t n) {
  note();
  return __libc_realloc(p, n);
}
void* aligned_alloc(size_t a, size_t n) {
  note();
  return __libc_memalign(a, n);
}
int posix_memalign(void** out, size_t a, size_t n) {
  note();
  *out = __libc_memalign(a, n);
  return *out ? 0 : 12;
}
}

// Prints the result line: allocations counted while armed, and whether the hook counts at all
// (a malloc made armed, after the measured call, must be seen).
long g_delegate_nodes = -1;  // --debug-outputs: tensors the delegates logged in the measured call

int report(long during) {
  g_armed = true;
  void* volatile probe = std::malloc(16);
  g_armed = false;
  std::free(probe);
  if (g_delegate_nodes >= 0)
    std::printf("{\"allocations_during_execute\": %ld, \"hook_counted\": %ld, \"delegate_node_outputs\": %ld}\n", during,
                g_count.load(), g_delegate_nodes);
  else
    std::printf("{\"allocations_during_execute\": %ld, \"hook_counted\": %ld}\n", during, g_count.load());
  return 0;
}

int main(int argc, char** argv) {
  // --llm-steps: a dynamic LLM program (forward(tokens[1, T], input_pos[T])): a 3-token prefill and a
  // 1-token decode step unarmed, then a decode step at the next position armed (a size seen before)
  const bool profile = argc == 3 && std::strcmp(argv[2], "--profile") == 0;
  const bool llm_steps = argc == 3 && std::strcmp(argv[2], "--llm-steps") == 0;
  const bool debug_outputs = argc == 3 && std::strcmp(argv[2], "--debug-outputs") == 0;
  if (argc != 2 && !profile && !llm_steps && !debug_outputs) {
    std::fprintf(stderr, "usage: kiln_alloc_check FILE.pte [--profile | --llm-steps | --debug-outputs]\n");
    return 2;
  }
  // delegated programs: the XNNPACK backend with a thread pool, as `kiln bench --threads 2` runs them
  if (!kiln::backends::xnnpack::register_runtime_backend()) {
    std::fprintf(stderr, "cannot register the XNNPACK backend\n");
    return 1;
  }
  kiln::rt::ErrorMessage err;
  auto program = kiln::rt::Program::load(argv[1], &err);
  if (!program.ok()) {
    std::fprintf(stderr, "load: %s\n", err.c_str());
    return 1;
  }
  kiln::rt::MethodOptions options;
  options.backend.threads = 2;
  options.backend.profiling_detail = profile || debug_outputs;
  options.profiling = profile;
  auto method = program->load_method("forward", options, &err);
  if (!method.ok()) {
    std::fprintf(stderr, "load_method: %s\n", err.c_str());
    return 1;
  }
  // Inputs: zeros of the right size (valid token ids, valid floats).
  std::vector<std::vector<std::byte>> inputs;
  for (size_t i = 0; i < method->num_inputs(); ++i) {
    inputs.emplace_back(method->input(i).nbytes());
    if (method->set_input(i, inputs.back().data(), inputs.back().size(), &err) != kiln::rt::Status::Ok) {
      std::fprintf(stderr, "set_input: %s\n", err.c_str());
      return 1;
    }
  }
  if (llm_steps) {
    if (method->num_inputs() != 2 || !method->input_is_dynamic(0) || !method->input_is_dynamic(1)) {
      std::fprintf(stderr, "--llm-steps: not a dynamic LLM program\n");
      return 1;
    }
    int64_t pos = 0;
    std::vector<int64_t> p(static_cast<size_t>(method->input(1).numel));  // positions, filled per step
    auto step = [&](int64_t t, bool armed) -> kiln::rt::Status {
      for (int64_t k = 0; k < t; ++k) p[static_cast<size_t>(k)] = pos + k;
      pos += t;
      const int64_t ts[2] = {1, t}, ps[1] = {t};
      if (method->set_input(0, inputs[0].data(), static_cast<size_t>(t) * 8, ts, &err) != kiln::rt::Status::Ok ||
          method->set_input(1, p.data(), static_cast<size_t>(t) * 8, ps, &err) != kiln::rt::Status::Ok)
        return kiln::rt::Status::InvalidArgument;
      g_armed = armed;
      kiln::rt::Status s = method->execute(&err);
      g_armed = false;
      return s;
    };
    if (step(3, false) != kiln::rt::Status::Ok || step(1, false) != kiln::rt::Status::Ok) {
      std::fprintf(stderr, "execute: %s\n", err.c_str());
      return 1;
    }
    kiln::rt::Status s = step(1, true);
    long during = g_count.exchange(0);
    if (s != kiln::rt::Status::Ok) {
      std::fprintf(stderr, "execute: %s\n", err.c_str());
      return 1;
    }
    return report(during);
  }
  if (method->execute(&err) != kiln::rt::Status::Ok) {  // warm-up, unarmed
    std::fprintf(stderr, "execute: %s\n", err.c_str());
    return 1;
  }
  // Programs may reuse input memory after its last read (ExecuTorch's do):
  // set the inputs again, unarmed, as a caller running it repeatedly would.
  for (size_t i = 0; i < method->num_inputs(); ++i) method->set_input(i, inputs[i].data(), inputs[i].size(), &err);
  kiln::rt::DebugOutputLog log(64 << 20, 1 << 16);
  if (debug_outputs) method->enable_debug_outputs(&log);
  g_armed = true;
  kiln::rt::Status s = method->execute(&err);
  g_armed = false;
  long during = g_count.exchange(0);
  if (s != kiln::rt::Status::Ok) {
    std::fprintf(stderr, "execute: %s\n", err.c_str());
    return 1;
  }
  if (debug_outputs) {
    g_delegate_nodes = 0;
    for (const kiln::rt::DebugOutput& e : log.entries()) g_delegate_nodes += e.delegate_node >= 0;
    method->enable_debug_outputs(nullptr);
  }
  return report(during);
}
