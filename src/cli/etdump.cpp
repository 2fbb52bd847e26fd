// ETDump writer (etdump.h). The file is a flatbuffer (ExecuTorch's runtime
// builds it with flatcc, size-prefixed, identifier "ED00"); kiln writes the few
// tables a profile needs with flatbuffers' builder directly: the layout is
// ExecuTorch's devtools/etdump schema's, field slot k at vtable offset 4 + 2k,
// read from that schema (version 0 of the format, as ExecuTorch 1.5 writes it).
//   ETDump       { version: uint, run_data: [RunData] }
//   RunData      { name: string, bundled_input_index: int = -1, allocators: [..], events: [Event] }
//   Event        { profile_event: ProfileEvent, allocation_event, debug_event }
//   DebugEvent   { chain_index: ulong, instruction_id: int = -1, debug_entry: Value,
//                  delegate_debug_id_int: int = -1, delegate_debug_id_str: string, name: string }
//   Value        { val: ValueType (byte; Tensor = 5), tensor: Tensor, ... }
//   Tensor       { scalar_type: byte (ExecuTorch's ScalarType), sizes: [long], strides: [long], offset: long }
//   ProfileEvent { name: string, chain_index: int, instruction_id: int = -1,
//                  delegate_debug_id_int: int = -1, delegate_debug_id_str: string,
//                  delegate_debug_metadata: [ubyte], start_time: ulong, end_time: ulong }
#include "etdump.h"

#include <flatbuffers/flatbuffers.h>

#include <algorithm>
#include <cstdint>

namespace kiln::cli {
namespace {

constexpr flatbuffers::voffset_t slot(int k) { return static_cast<flatbuffers::voffset_t>(4 + 2 * k); }

}  // namespace

std::vector<uint8_t> etdump_bytes(const std::vector<EtdumpRun>& runs) {
  flatbuffers::FlatBufferBuilder fb(1 << 16);
  std::vector<flatbuffers::Offset<void>> run_offsets;
  for (const EtdumpRun& run : runs) {
    std::vector<flatbuffers::Offset<void>> events;
    size_t next_debug = 0;
    auto debug_events_before = [&](size_t k) {  // a tensor in the debug buffer, as ExecuTorch's runtime logs it
      for (; next_debug < run.debug.size() && run.debug[next_debug].first <= k; ++next_debug) {
        const EtdumpDebug& d = run.debug[next_debug].second;
        std::vector<int64_t> strides(d.sizes.size(), 1);
        for (size_t i = d.sizes.size(); i-- > 1;) strides[i - 1] = strides[i] * std::max<int64_t>(d.sizes[i], 1);
        auto sizes = fb.CreateVector(d.sizes);
        auto strides_v = fb.CreateVector(strides);
        auto t = fb.StartTable();
        fb.AddElement<int8_t>(slot(0), static_cast<int8_t>(d.dtype), 0);
        fb.AddOffset(slot(1), sizes);
        fb.AddOffset(slot(2), strides_v);
        fb.AddElement<int64_t>(slot(3), static_cast<int64_t>(d.offset), -1);  // written even when 0
        flatbuffers::Offset<void> tensor(fb.EndTable(t));
        auto v = fb.StartTable();
        fb.AddElement<int8_t>(slot(0), 5, 0);  // ValueType.Tensor
        fb.AddOffset(slot(1), tensor);
        flatbuffers::Offset<void> value(fb.EndTable(v));
        flatbuffers::Offset<flatbuffers::String> id_str;
        if (!d.delegate_id_str.empty()) id_str = fb.CreateString(d.delegate_id_str);
        auto de = fb.StartTable();
        fb.AddElement<uint64_t>(slot(0), 0, 1);  // chain_index 0, written
        fb.AddElement<int32_t>(slot(1), d.instruction_id, -1);
        fb.AddOffset(slot(2), value);
        if (!d.delegate_id_str.empty()) fb.AddOffset(slot(4), id_str);  // a delegate's node, as ExecuTorch's runtime
        flatbuffers::Offset<void> debug(fb.EndTable(de));
        auto ev = fb.StartTable();
        fb.AddOffset(slot(2), debug);
        events.emplace_back(fb.EndTable(ev));
      }
    };
    for (size_t k = 0; k < run.events.size(); ++k) {
      debug_events_before(k);
      const EtdumpEvent& e = run.events[k];
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
    debug_events_before(SIZE_MAX);
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
