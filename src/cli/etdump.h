// ETDump (ExecuTorch's profile event format) for `kiln profile --etdump`.
#pragma once

#include "kiln/core/dtype.h"

#include <cstdint>
#include <string>
#include <vector>

namespace kiln::cli {

// One profiling event of a run, as ExecuTorch's ETDump ProfileEvent holds it.
struct EtdumpEvent {
  std::string name;              // operator events: the name; "DELEGATE_CALL", "Method::execute"
  int32_t instruction_id = -1;   // -1: not an instruction (Method::execute)
  int32_t delegate_id_int = -1;  // a delegate's event: an integer identifier, or -1
  std::string delegate_id_str;   // or a string identifier ("" : none)
  uint64_t start_ns = 0, end_ns = 0;
};

// A debug event: one tensor an instruction (or a node inside its delegate) logged (its bytes at `offset` in
// the debug buffer file).
struct EtdumpDebug {
  int32_t instruction_id = -1;
  ScalarType dtype = ScalarType::Float;
  std::vector<int64_t> sizes;
  uint64_t offset = 0;
  std::string delegate_id_str;  // a node inside a delegate: its identifier (its step's profile event's); "": none
};

struct EtdumpRun {
  std::string name;  // the method
  std::vector<EtdumpEvent> events;
  std::vector<std::pair<size_t, EtdumpDebug>> debug;  // (index in events it goes before, by index), the event
};

// The size-prefixed "ED00" flatbuffer ExecuTorch's devtools (Inspector) read.
std::vector<uint8_t> etdump_bytes(const std::vector<EtdumpRun>& runs);

}  // namespace kiln::cli
