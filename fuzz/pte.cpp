// libFuzzer target for kiln's runtime: arbitrary bytes as a .pte through the
// verified loader (Program::load), method preparation (load_method: values,
// planned memory, kernels, delegates) and one execution with zero inputs.
// Every input must end in a clean error or a clean run; a crash, a sanitizer
// report or a hang is a bug. Built only with -DKILN_FUZZ=ON and clang
// (scripts/fuzz, which also seeds the corpus with real programs: fuzz/make_seeds.py).
//
// PteFile::open takes a path, so each input is written to a memfd and opened
// through /proc/self/fd. The harness bounds what a well-formed program may
// legitimately ask for (planned memory, input sizes, backward jumps, which are
// loops) so that the fuzzer's memory and time limits report bugs, not big or
// endless programs.
#include "kiln/fb/kiln_program_generated.h"
#include "kiln/runtime/program.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace {

constexpr uint64_t kMaxPlannedBytes = 64ull << 20;  // per method, summed over its buffers
constexpr uint64_t kMaxInputBytes = 16ull << 20;    // per input, zero-filled by the harness

namespace fb = kiln::fb;
namespace rt = kiln::rt;

// The path of a memfd holding exactly `data`.
const char* write_input(const uint8_t* data, size_t size) {
  static int fd = -1;
  static char path[64];
  if (fd < 0) {
    fd = memfd_create("kiln-pte-fuzz", MFD_CLOEXEC);
    if (fd < 0) {
      std::perror("memfd_create");
      std::abort();
    }
    std::snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  }
  if (ftruncate(fd, 0) != 0) std::abort();
  for (size_t done = 0; done < size;) {
    ssize_t n = pwrite(fd, data + done, size - done, static_cast<off_t>(done));
    if (n <= 0) std::abort();
    done += static_cast<size_t>(n);
  }
  return path;
}

bool plan_within_limits(const fb::ExecutionPlan& plan) {
  uint64_t planned = 0;
  if (const auto* sizes = plan.non_const_buffer_sizes())
    for (flatbuffers::uoffset_t i = 0; i < sizes->size(); ++i) {
      const int64_t s = sizes->Get(i);
      if (s < 0 || static_cast<uint64_t>(s) > kMaxPlannedBytes) return false;
      planned += static_cast<uint64_t>(s);
    }
  return planned <= kMaxPlannedBytes;
}

// A JumpFalse to itself or an earlier instruction is a loop: it may legitimately never end.
bool has_backward_jump(const fb::ExecutionPlan& plan) {
  if (!plan.chains()) return false;
  for (const fb::Chain* chain : *plan.chains()) {
    if (!chain->instructions()) continue;
    for (flatbuffers::uoffset_t k = 0; k < chain->instructions()->size(); ++k) {
      const fb::Instruction* ins = chain->instructions()->Get(k);
      if (const auto* j = ins->instr_args_as_JumpFalseCall())
        if (j->destination_instruction() <= static_cast<int32_t>(k)) return true;
    }
  }
  return false;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const char* path = write_input(data, size);
  rt::ErrorMessage err;
  rt::Result<rt::Program> program = rt::Program::load(path, &err);
  if (!program.ok()) return 0;
  const auto* plans = program->file().program().execution_plan();
  for (flatbuffers::uoffset_t p = 0; p < plans->size(); ++p) {
    const fb::ExecutionPlan& plan = *plans->Get(p);
    if (!plan_within_limits(plan)) continue;
    rt::Result<rt::Method> method = program->load_method(plan.name()->c_str(), &err);
    if (!method.ok()) continue;
    rt::Method& m = method.value();
    if (has_backward_jump(plan)) continue;
    std::vector<std::vector<std::byte>> inputs(m.num_inputs());
    bool inputs_set = true;
    for (size_t i = 0; i < m.num_inputs() && inputs_set; ++i) {
      const size_t bytes = m.input(i).nbytes();
      if (bytes > kMaxInputBytes) {
        inputs_set = false;
        break;
      }
      inputs[i].assign(bytes, std::byte{0});
      inputs_set = m.set_input(i, inputs[i].data(), bytes, &err) == rt::Status::Ok;
    }
    if (!inputs_set) continue;
    if (m.execute(&err) != rt::Status::Ok) continue;
    // Outputs are readable after a clean run.
    volatile uint8_t sink = 0;
    for (size_t i = 0; i < m.num_outputs(); ++i) {
      if (!m.output_is_tensor(i)) continue;  // output() is for tensor outputs only (program.h)
      const rt::Tensor& t = m.output(i);
      if (t.nbytes() > 0 && t.data != nullptr) sink = sink ^ static_cast<const uint8_t*>(t.data)[t.nbytes() - 1];
    }
    (void)sink;
  }
  return 0;
}
