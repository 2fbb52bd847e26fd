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

struct Backend {
  const char* id;
  // Prepares `payload` (weights may come from file.named_data()); sets *state.
  Status (*init)(const PteFile& file, std::span<const std::byte> payload, std::span<const CompileSpecView> specs,
                 void** state, ErrorMessage* error);
  // Runs the delegate on its call's arguments (inputs then outputs, as the program lists them).
  Status (*execute)(void* state, std::span<EValue*> args, ErrorMessage* error);
  void (*destroy)(void* state);
  // Optional (null if the backend has no profile): timing of the delegate's
  // own steps. profile() fills up to out.size() entries and returns how many it has.
  void (*enable_profiling)(void* state, bool on) = nullptr;
  size_t (*profile)(const void* state, std::span<BackendProfileEntry> out) = nullptr;
};

// The backend registered under `id`, or nullptr.
const Backend* find_backend(std::string_view id);
// Registers a backend (at startup, before loading programs); false if the id is taken or the table is full.
bool register_backend(const Backend* backend);

}  // namespace kiln::rt
