// ETDump writer (etdump.h). The file is a flatbuffer (ExecuTorch's runtime
// builds it with flatcc, size-prefixed, identifier "ED00"); kiln writes the few
// tables a profile needs with flatbuffers' builder directly: the layout is
// ExecuTorch's devtools/etdump schema's, field slot k at vtable offset 4 + 2k,
// read from that schema (version 0 of the format, as ExecuTorch 1.5 writes it).
//   ETDump       { version: uint, run_data: [RunData] }
//   RunData      { name: string, bundled_input_index: int = -1, allocators: [..], events: [Event] }
//   Event        { profile_event: ProfileEvent, allocation_event, debug_event }
//   ProfileEvent { name: string, chain_index: int, instruction_id: int = -1,
//                  delegate_debug_id_int: int = -1, delegate_debug_id_str: string,
//                  delegate_debug_metadata: [ubyte], start_time: ulong, end_time: ulong }
#include "etdump.h"

#include <flatbuffers/flatbuffers.h>

namespace kiln::cli {
namespace {

constexpr flatbuffers::voffset_t slot(int k) { return static_cast<flatbuffers::voffset_t>(4 + 2 * k); }

}  // namespace

std::vector<uint8_t> etdump_bytes(const std::vector<EtdumpRun>& runs) {
  flatbuffers::FlatBufferBuilder fb(1 << 16);
  std::vector<flatbuffers::Offset<void>> run_offsets;
  for (const EtdumpRun& run : runs) {
    std::vector<flatbuffers::Offset<void>> events;
    for (const EtdumpEvent& e : run.events) {
      auto name = fb.CreateString(e.name);
      flatbuffers::Offset<flatbuffers::String> id_str;
      if (!e.delegate_id_str.empty()) id_str = fb.CreateString(e.delegate_id_str);
      auto pe = fb.StartTable();
      fb.AddOffset(slot(0), name);
      fb.AddElement<int32_t>(slot(1), 0, 0);  // chain_index: kiln's plans have one chain
      fb.AddElement<int32_t>(slot(2), e.instruction_id, -1);
      fb.AddElement<int32_t>(slot(3), e.delegate_id_int, -1);
      if (!e.delegate_id_str.empty()) fb.AddOffset(slot(4), id_str);
      fb.AddElement<uint64_t>(slot(6), e.start_ns, 0);
      fb.AddElement<uint64_t>(slot(7), e.end_ns, 0);
      flatbuffers::Offset<void> profile(fb.EndTable(pe));
      auto ev = fb.StartTable();
      fb.AddOffset(slot(0), profile);
      events.emplace_back(fb.EndTable(ev));
    }
    auto name = fb.CreateString(run.name);
    auto allocators = fb.CreateVector(std::vector<flatbuffers::Offset<void>>{});
    auto ev_vec = fb.CreateVector(events);
    auto rd = fb.StartTable();
    fb.AddOffset(slot(0), name);
    fb.AddElement<int32_t>(slot(1), -1, -1);
    fb.AddOffset(slot(2), allocators);
    fb.AddOffset(slot(3), ev_vec);
    run_offsets.emplace_back(fb.EndTable(rd));
  }
  auto run_vec = fb.CreateVector(run_offsets);
  auto root = fb.StartTable();
  fb.AddElement<uint32_t>(slot(0), 0, 0xFFFFFFFFu);  // version 0, written explicitly
  fb.AddOffset(slot(1), run_vec);
  fb.FinishSizePrefixed(flatbuffers::Offset<void>(fb.EndTable(root)), "ED00");
  return std::vector<uint8_t>(fb.GetBufferPointer(), fb.GetBufferPointer() + fb.GetSize());
}

}  // namespace kiln::cli
