// Delegate backends: a .pte's DelegateCall hands a region of the program to a
// backend by id ("XnnpackBackend"). A backend prepares its payload once at
// method load (init) and runs it per call (execute) on the call's values.
#pragma once

#include "kiln/runtime/evalue.h"
#include "kiln/runtime/status.h"

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

namespace kiln::rt {

class DebugOutputLog;
class ErrorMessage;
class PteFile;

// Opaque per-delegate state a backend returns from init.
struct DelegateHandle {
  const struct Backend* backend = nullptr;
  void* state = nullptr;
};

struct CompileSpecView {
  std::string_view key;
  std::span<const std::byte> value;
};

// One line of a delegate's own profile (its steps, as the backend labels them).
struct BackendProfileEntry {
  const char* label = nullptr;
  uint64_t calls = 0;
  uint64_t total_ns = 0;
};

// One step of a delegate, in execution order, as a profile sees it: its
// label, the debug handles of the payload nodes it runs (XNNPACK:
// XNode.debug_handle; kiln's payloads put the edge node's index there, which
// kiln lower's X.debug.json maps to the .pt2), its totals since profiling was
// enabled and its last run's start and end (steady clock, ns since its epoch). A step of attention
// over a KV cache that reads only some of its positions also says how many its last run read
// (positions_read, of cache_positions; -1 and 0 for other steps).
struct BackendStepProfile {
  const char* label = nullptr;
  const uint32_t* debug_handles = nullptr;
  size_t num_debug_handles = 0;
  uint64_t calls = 0;
  uint64_t total_ns = 0;
  uint64_t last_start_ns = 0;
  uint64_t last_end_ns = 0;
  int64_t positions_read = -1;
  int64_t cache_positions = 0;
};

// What the caller of Program::load_method asks of the method's delegates
// (MethodOptions::backend). Per method, not per process: two methods may run
// with different settings side by side. Each backend documents what it reads.
struct BackendOptions {
  size_t threads = 1;              // parallelism a delegate may use (1: the calling thread only)
  const char* engine = nullptr;    // a backend-specific choice of implementation; null: its default
                                   // (XnnpackBackend: "kiln" or "xnnpack", see kiln/backends/xnnpack/runtime.h)
  bool profiling_detail = false;   // finer steps for a profile (XnnpackBackend: one XNNPACK subgraph per node)
};

// Everything a backend's init sees of the program and of the caller.
struct BackendInitContext {
  const PteFile& file;                      // the program (named data, page release)
  std::span<const std::byte> payload;       // this delegate's processed blob
  std::span<const CompileSpecView> specs;   // its compile specs
  const BackendOptions& options;            // the method's options for its delegates
  // Some tensor a call of this delegate passes is dynamic-bound (TensorShapeDynamism::DYNAMIC_BOUND):
  // its sizes may change from call to call, up to the sizes the program lists.
  bool dynamic_shapes = false;
};

struct Backend {
  const char* id;
  // Prepares the payload (weights may come from ctx.file.named_data()); sets *state.
  // The state keeps what it needs of ctx.options: execute() sees only the state.
  Status (*init)(const BackendInitContext& ctx, void** state, ErrorMessage* error);
  // Runs the delegate on its call's arguments (inputs then outputs, as the program lists them).
  Status (*execute)(void* state, std::span<EValue*> args, ErrorMessage* error);
  void (*destroy)(void* state);
  // Optional (null if the backend has no profile): timing of the delegate's
  // own steps. profile() fills up to out.size() entries and returns how many it has.
  void (*enable_profiling)(void* state, bool on) = nullptr;
  size_t (*profile)(const void* state, std::span<BackendProfileEntry> out) = nullptr;
  // Optional: every step's profile (BackendStepProfile), up to out.size(); returns how many steps there are.
  // Reads what execute() recorded while profiling; allocates nothing.
  size_t (*step_profile)(const void* state, std::span<BackendStepProfile> out) = nullptr;
  // Optional: while `log` is set (null: off, the default), execute() copies each of its steps' outputs
  // into it (kiln/runtime/debug_outputs.h: the call's instruction is log->instruction(), the node its
  // payload node's debug handle). Method::enable_debug_outputs calls it; execute() allocates nothing.
  void (*enable_debug_outputs)(void* state, DebugOutputLog* log) = nullptr;
};

// The backend registered under `id`, or nullptr.
const Backend* find_backend(std::string_view id);
// Registers a backend (at startup, before loading programs); false if the id is taken or the table is full.
bool register_backend(const Backend* backend);

}  // namespace kiln::rt
