// The .pte writer. Mirrors what ExecuTorch 1.5 writes for a program with the
// default ExecutorchBackendConfig:
//  - segments, in this order: the constant segment (all constants packed,
//    each but the last padded to the tensor alignment; offsets[0] is the
//    reserved empty slot), then one segment per delegate payload in order of
//    first use by the plans' delegates (empty payloads stay inline), then one
//    per named blob; each segment starts at a multiple of the segment
//    alignment, counted from the segment base offset;
//  - the flatbuffer, with the 32-byte extended header inserted after its
//    first 8 bytes (padded to the schema's largest alignment), the segment
//    base offset at the next multiple of the segment alignment after it, and
//    no padding after the last segment; without segment data there is no
//    header and the file is the bare flatbuffer.
#include "kiln/pte/pte_writer_staged.h"

#include "kiln/core/error.h"
#include "kiln/core/output_file.h"
#include "kiln/fb/kiln_program_generated.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <optional>
#include <set>
#include <string_view>
#include <unordered_set>
#include <variant>

namespace kiln::pte {
namespace {

namespace fbs = ::kiln::fb;
using flatbuffers::FlatBufferBuilder;
using flatbuffers::Offset;

template <class... Ts>
struct Overloaded : Ts... {
  using Ts::operator()...;
};
template <class... Ts>
Overloaded(Ts...) -> Overloaded<Ts...>;

// ---------------------------------------------------------------------------
// Consistency checks: the writer refuses programs ExecuTorch could not load.

uint64_t tensor_nbytes(const TensorValue& t, const std::string& where) {
  int elem = element_size(t.dtype);
  check(elem > 0, "{}: unknown dtype code {}", where, static_cast<int>(t.dtype));
  uint64_t numel = 1;
  for (int32_t s : t.sizes) {
    check(s >= 0, "{}: negative size {}", where, s);
    check(s == 0 || numel <= std::numeric_limits<uint64_t>::max() / static_cast<uint64_t>(s) / 16,
          "{}: tensor size overflows", where);
    numel *= static_cast<uint64_t>(s);
  }
  return numel * static_cast<uint64_t>(elem);
}

void check_program(const Program& program, const WriteOptions& opts) {
  check(is_power_of_two(opts.segment_alignment), "segment alignment {} is not a power of two", opts.segment_alignment);
  check(is_power_of_two(opts.tensor_alignment), "tensor alignment {} is not a power of two", opts.tensor_alignment);
  check(!program.plans.empty(), "the program has no execution plan");

  std::set<std::string> plan_names;
  std::vector<bool> payload_used(program.delegate_payloads.size(), false);
  for (const ExecutionPlan& plan : program.plans) {
    check(!plan.name.empty(), "an execution plan has no name");
    check(plan_names.insert(plan.name).second, "two execution plans are named '{}'", plan.name);
    const std::string p = fmt::format("plan '{}'", plan.name);
    const auto n_values = static_cast<int64_t>(plan.values.size());
    auto check_value = [&](int64_t index, std::string_view what) {
      check(index >= 0 && index < n_values, "{}: {} names value {}, but the plan has {} values", p, what, index,
            n_values);
    };
    check(!plan.non_const_buffer_sizes.empty(), "{}: non_const_buffer_sizes lacks its reserved entry [0]", p);
    for (size_t i = 0; i < plan.non_const_buffer_sizes.size(); ++i)
      check(plan.non_const_buffer_sizes[i] >= 0, "{}: planned buffer {} has negative size", p, i);

    for (size_t vi = 0; vi < plan.values.size(); ++vi) {
      const std::string where = fmt::format("{} value {}", p, vi);
      std::visit(Overloaded{
                     [&](const TensorValue& t) {
                       uint64_t nbytes = tensor_nbytes(t, where);
                       check(t.dim_order.empty() || t.dim_order.size() == t.sizes.size(),
                             "{}: dim_order has {} entries for a rank-{} tensor", where, t.dim_order.size(),
                             t.sizes.size());
                       for (uint8_t d : t.dim_order)
                         check(d < t.sizes.size(), "{}: dim_order names dimension {} of a rank-{} tensor", where, d,
                               t.sizes.size());
                       if (t.constant_index > 0) {
                         check(t.constant_index < program.constants.size(),
                               "{}: constant {} out of range (the program has {})", where, t.constant_index,
                               program.constants.size());
                         check(t.allocation.has_value() || program.constants[t.constant_index].size >= nbytes,
                               "{}: constant {} holds {} bytes, the tensor needs {}", where, t.constant_index,
                               program.constants[t.constant_index].size, nbytes);
                       }
                       check(t.mutable_index == 0 || (t.allocation && t.constant_index == 0 &&
                                                      t.mutable_index < program.mutable_data.size() &&
                                                      program.mutable_data[t.mutable_index].size >= nbytes),
                             "{}: mutable data {} is not a planned tensor's initial contents of {} bytes", where,
                             t.mutable_index, nbytes);
                       if (t.allocation) {
                         const Allocation& a = *t.allocation;
                         check(a.memory_id >= 1 && a.memory_id < plan.non_const_buffer_sizes.size(),
                               "{}: memory_id {} out of range (planned buffers 1..{})", where, a.memory_id,
                               plan.non_const_buffer_sizes.size() - 1);
                         auto cap = static_cast<uint64_t>(plan.non_const_buffer_sizes[a.memory_id]);
                         check(a.offset <= cap && nbytes <= cap - a.offset,
                               "{}: {} bytes at offset {} exceed planned buffer {} ({} bytes)", where, nbytes,
                               a.offset, a.memory_id, cap);
                       }
                     },
                     [&](const IntList& l) {
                       for (int32_t i : l.items) {
                         check_value(i, "an IntList item");
                         check(std::holds_alternative<int64_t>(plan.values[static_cast<size_t>(i)]),
                               "{}: IntList item {} is not an Int value", where, i);
                       }
                     },
                     [&](const TensorList& l) {
                       for (int32_t i : l.items) {
                         check_value(i, "a TensorList item");
                         check(std::holds_alternative<TensorValue>(plan.values[static_cast<size_t>(i)]),
                               "{}: TensorList item {} is not a tensor", where, i);
                       }
                     },
                     [&](const OptionalTensorList& l) {
                       for (int32_t i : l.items)
                         if (i != -1) check_value(i, "an OptionalTensorList item");
                     },
                     [](const auto&) {},
                 },
                 plan.values[vi]);
    }
    for (int32_t i : plan.inputs) check_value(i, "an input");
    for (int32_t i : plan.outputs) check_value(i, "an output");
    for (size_t ii = 0; ii < plan.instructions.size(); ++ii) {
      const std::string where = fmt::format("instruction {}", ii);
      std::visit(Overloaded{
                     [&](const KernelCall& k) {
                       check(k.op_index >= 0 && static_cast<size_t>(k.op_index) < plan.operators.size(),
                             "{}: {} calls operator {}, but the plan has {}", p, where, k.op_index,
                             plan.operators.size());
                       for (int32_t a : k.args) check_value(a, where + " argument");
                     },
                     [&](const DelegateCall& d) {
                       check(d.delegate_index >= 0 && static_cast<size_t>(d.delegate_index) < plan.delegates.size(),
                             "{}: {} calls delegate {}, but the plan has {}", p, where, d.delegate_index,
                             plan.delegates.size());
                       for (int32_t a : d.args) check_value(a, where + " argument");
                     },
                     [&](const MoveCall& m) {
                       check_value(m.from, where + " (move source)");
                       check_value(m.to, where + " (move target)");
                     },
                     [&](const JumpFalseCall& j) {
                       check_value(j.cond_value, where + " (condition)");
                       check(j.destination >= 0 && static_cast<size_t>(j.destination) <= plan.instructions.size(),
                             "{}: {} jumps to instruction {} of {}", p, where, j.destination,
                             plan.instructions.size());
                     },
                     [&](const FreeCall& f) { check_value(f.value, where + " (freed value)"); },
                 },
                 plan.instructions[ii]);
    }
    for (size_t di = 0; di < plan.delegates.size(); ++di) {
      const BackendDelegate& d = plan.delegates[di];
      check(!d.id.empty(), "{}: delegate {} has no backend id", p, di);
      check(d.payload_index < program.delegate_payloads.size(),
            "{}: delegate {} ({}) names payload {}, but the program has {}", p, di, d.id, d.payload_index,
            program.delegate_payloads.size());
      payload_used[d.payload_index] = true;
    }
  }
  for (size_t i = 0; i < payload_used.size(); ++i)
    check(payload_used[i], "delegate payload {} is not used by any delegate", i);
  std::unordered_set<std::string_view> keys;
  for (const NamedBlob& n : program.named_data) {
    check(!n.key.empty(), "a named data entry has an empty key");
    check(keys.insert(n.key).second, "named data key '{}' appears twice", n.key);
  }
}

// ---------------------------------------------------------------------------
// Segment layout: computed from the declared blob sizes before any data moves.

struct SegmentPlan {
  enum class Kind { Constants, Delegate, Named, Mutable } kind;
  size_t source = 0;  // payload or named-blob index
  uint64_t offset = 0;
  uint64_t size = 0;
};

struct DelegateRef {
  fbs::DataLocation location = fbs::DataLocation::INLINE;
  uint32_t index = 0;
};

struct Layout {
  std::vector<SegmentPlan> segments;
  std::optional<uint32_t> constant_segment;   // index into segments
  std::vector<uint64_t> constant_offsets;     // per constant, within the constant segment
  std::optional<uint32_t> mutable_segment;    // initial contents of mutable buffers, when there are any
  std::vector<uint64_t> mutable_offsets;      // per mutable data entry, within that segment
  std::vector<std::vector<DelegateRef>> delegate_refs;  // [plan][delegate]
  uint32_t inline_payload_count = 0;          // empty payloads kept inline, one per delegate
  std::vector<uint32_t> named_segment;        // per named blob
  uint64_t segment_data_size = 0;             // end of the last segment
};

Layout plan_layout(const Program& program, const WriteOptions& opts) {
  Layout L;
  auto add_segment = [&](SegmentPlan::Kind kind, size_t source, uint64_t size) {
    uint64_t prev_end = L.segments.empty() ? 0 : L.segments.back().offset + L.segments.back().size;
    L.segments.push_back({kind, source, align_up(prev_end, opts.segment_alignment), size});
    return static_cast<uint32_t>(L.segments.size() - 1);
  };

  // Blobs one after another in one segment, each at a multiple of the tensor alignment: their offsets, the size.
  auto pack = [&](const auto& blobs, std::vector<uint64_t>& offsets) {
    uint64_t offset = 0;
    for (size_t i = 0; i < blobs.size(); ++i) {
      offsets.push_back(offset);
      offset += blobs[i].size;
      if (i + 1 < blobs.size()) offset = align_up(offset, opts.tensor_alignment);
    }
    return offset;
  };
  if (!program.constants.empty())
    L.constant_segment = add_segment(SegmentPlan::Kind::Constants, 0, pack(program.constants, L.constant_offsets));
  if (program.mutable_data.size() > 1)
    L.mutable_segment = add_segment(SegmentPlan::Kind::Mutable, 0, pack(program.mutable_data, L.mutable_offsets));

  std::vector<std::optional<uint32_t>> payload_segment(program.delegate_payloads.size());
  for (const ExecutionPlan& plan : program.plans) {
    auto& refs = L.delegate_refs.emplace_back();
    for (const BackendDelegate& d : plan.delegates) {
      const DataBlob& payload = program.delegate_payloads[d.payload_index];
      if (payload.size == 0) {
        refs.push_back({fbs::DataLocation::INLINE, L.inline_payload_count++});
        continue;
      }
      auto& seg = payload_segment[d.payload_index];
      if (!seg) seg = add_segment(SegmentPlan::Kind::Delegate, d.payload_index, payload.size);
      refs.push_back({fbs::DataLocation::SEGMENT, *seg});
    }
  }

  for (size_t i = 0; i < program.named_data.size(); ++i)
    L.named_segment.push_back(add_segment(SegmentPlan::Kind::Named, i, program.named_data[i].data.size));

  if (!L.segments.empty()) L.segment_data_size = L.segments.back().offset + L.segments.back().size;
  return L;
}

// ---------------------------------------------------------------------------
// The flatbuffer.

Offset<fbs::Tensor> build_tensor(FlatBufferBuilder& b, const TensorValue& t) {
  std::vector<uint8_t> order = t.dim_order;
  if (order.empty())
    for (size_t d = 0; d < t.sizes.size(); ++d) order.push_back(static_cast<uint8_t>(d));
  auto sizes = b.CreateVector(t.sizes);
  auto dim_order = b.CreateVector(order);
  Offset<fbs::AllocationDetails> allocation = 0;
  if (t.allocation)
    allocation = fbs::CreateAllocationDetails(b, t.allocation->memory_id,
                                              static_cast<uint32_t>(t.allocation->offset & 0xffffffffu),
                                              static_cast<uint32_t>(t.allocation->offset >> 32));
  return fbs::CreateTensor(b, static_cast<fbs::ScalarType>(t.dtype), /*storage_offset=*/0, sizes, dim_order,
                           /*requires_grad=*/false, t.constant_index > 0 ? t.constant_index : t.mutable_index,
                           allocation, /*layout=*/0,
                           t.dynamic_bound ? fbs::TensorShapeDynamism::DYNAMIC_BOUND : fbs::TensorShapeDynamism::STATIC);
}

// The union wrappers: an EValue or Instruction holding `member`, of the type `type` names.
template <class T>
Offset<fbs::EValue> evalue(FlatBufferBuilder& b, fbs::KernelTypes type, Offset<T> member) {
  return fbs::CreateEValue(b, type, member.Union());
}
template <class T>
Offset<fbs::Instruction> instruction(FlatBufferBuilder& b, fbs::InstructionArguments type, Offset<T> member) {
  return fbs::CreateInstruction(b, type, member.Union());
}

Offset<fbs::EValue> build_value(FlatBufferBuilder& b, const Value& v) {
  using K = fbs::KernelTypes;
  return std::visit(
      Overloaded{
          [&](const NoneValue&) { return evalue(b, K::Null, fbs::CreateNull(b)); },
          [&](int64_t i) { return evalue(b, K::Int, fbs::CreateInt(b, i)); },
          [&](double d) { return evalue(b, K::Double, fbs::CreateDouble(b, d)); },
          [&](bool x) { return evalue(b, K::Bool, fbs::CreateBool(b, x)); },
          [&](const std::string& s) { return evalue(b, K::String, fbs::CreateString(b, b.CreateString(s))); },
          [&](const TensorValue& t) { return evalue(b, K::Tensor, build_tensor(b, t)); },
          [&](const IntList& l) {
            std::vector<int64_t> items(l.items.begin(), l.items.end());
            return evalue(b, K::IntList, fbs::CreateIntList(b, b.CreateVector(items)));
          },
          [&](const DoubleList& l) { return evalue(b, K::DoubleList, fbs::CreateDoubleList(b, b.CreateVector(l.items))); },
          [&](const BoolList& l) {
            std::vector<uint8_t> items(l.items.begin(), l.items.end());
            return evalue(b, K::BoolList, fbs::CreateBoolList(b, b.CreateVector(items)));
          },
          [&](const TensorList& l) { return evalue(b, K::TensorList, fbs::CreateTensorList(b, b.CreateVector(l.items))); },
          [&](const OptionalTensorList& l) {
            return evalue(b, K::OptionalTensorList, fbs::CreateOptionalTensorList(b, b.CreateVector(l.items)));
          },
      },
      v);
}

Offset<fbs::Instruction> build_instruction(FlatBufferBuilder& b, const Instruction& ins) {
  using I = fbs::InstructionArguments;
  return std::visit(
      Overloaded{
          [&](const KernelCall& k) {
            return instruction(b, I::KernelCall, fbs::CreateKernelCall(b, k.op_index, b.CreateVector(k.args)));
          },
          [&](const DelegateCall& d) {
            return instruction(b, I::DelegateCall, fbs::CreateDelegateCall(b, d.delegate_index, b.CreateVector(d.args)));
          },
          [&](const MoveCall& m) { return instruction(b, I::MoveCall, fbs::CreateMoveCall(b, m.from, m.to)); },
          [&](const JumpFalseCall& j) {
            return instruction(b, I::JumpFalseCall, fbs::CreateJumpFalseCall(b, j.cond_value, j.destination));
          },
          [&](const FreeCall& f) { return instruction(b, I::FreeCall, fbs::CreateFreeCall(b, f.value)); },
      },
      ins);
}

Offset<fbs::ExecutionPlan> build_plan(FlatBufferBuilder& b, const ExecutionPlan& plan,
                                      const std::vector<DelegateRef>& refs) {
  auto name = b.CreateString(plan.name);
  auto meta = fbs::CreateContainerMetadata(b, b.CreateString(plan.encoded_inputs_spec),
                                           b.CreateString(plan.encoded_outputs_spec));
  std::vector<Offset<fbs::EValue>> values;
  values.reserve(plan.values.size());
  for (const Value& v : plan.values) values.push_back(build_value(b, v));
  auto values_vec = b.CreateVector(values);
  auto inputs = b.CreateVector(plan.inputs);
  auto outputs = b.CreateVector(plan.outputs);

  std::vector<Offset<fbs::Instruction>> instructions;
  instructions.reserve(plan.instructions.size());
  for (const Instruction& ins : plan.instructions) instructions.push_back(build_instruction(b, ins));
  auto no_indices = std::vector<int32_t>{};
  auto chain = fbs::CreateChain(b, b.CreateVector(no_indices), b.CreateVector(no_indices),
                                b.CreateVector(instructions));
  auto chains = b.CreateVector(std::vector<Offset<fbs::Chain>>{chain});

  std::vector<Offset<fbs::Operator>> operators;
  for (const Operator& op : plan.operators)
    operators.push_back(fbs::CreateOperator(b, b.CreateString(op.name), b.CreateString(op.overload)));
  auto operators_vec = b.CreateVector(operators);

  std::vector<Offset<fbs::BackendDelegate>> delegates;
  for (size_t i = 0; i < plan.delegates.size(); ++i) {
    const BackendDelegate& d = plan.delegates[i];
    std::vector<Offset<fbs::CompileSpec>> specs;
    for (const CompileSpec& s : d.compile_specs)
      specs.push_back(fbs::CreateCompileSpec(b, b.CreateString(s.key), b.CreateVector(s.value)));
    auto processed = fbs::CreateBackendDelegateDataReference(b, refs[i].location, refs[i].index);
    delegates.push_back(fbs::CreateBackendDelegate(b, b.CreateString(d.id), processed, b.CreateVector(specs)));
  }
  auto delegates_vec = b.CreateVector(delegates);
  auto buffer_sizes = b.CreateVector(plan.non_const_buffer_sizes);
  return fbs::CreateExecutionPlan(b, name, meta, values_vec, inputs, outputs, chains, operators_vec, delegates_vec,
                                  buffer_sizes);
}

void build_program(FlatBufferBuilder& b, const Program& program, const Layout& L) {
  std::vector<Offset<fbs::ExecutionPlan>> plans;
  for (size_t i = 0; i < program.plans.size(); ++i)
    plans.push_back(build_plan(b, program.plans[i], L.delegate_refs[i]));
  auto plans_vec = b.CreateVector(plans);
  auto constant_buffer = b.CreateVector(std::vector<Offset<fbs::Buffer>>{});

  std::vector<Offset<fbs::BackendDelegateInlineData>> inline_data;
  for (uint32_t i = 0; i < L.inline_payload_count; ++i) {
    b.ForceVectorAlignment(0, 1, kSchemaMaxAlignment);
    auto empty = b.CreateVector(static_cast<const uint8_t*>(nullptr), 0);
    inline_data.push_back(fbs::CreateBackendDelegateInlineData(b, empty));
  }
  auto inline_vec = b.CreateVector(inline_data);

  std::vector<Offset<fbs::DataSegment>> segments;
  for (const SegmentPlan& s : L.segments) segments.push_back(fbs::CreateDataSegment(b, s.offset, s.size));
  auto segments_vec = b.CreateVector(segments);

  Offset<fbs::SubsegmentOffsets> constant_segment = 0;
  if (L.constant_segment)
    constant_segment = fbs::CreateSubsegmentOffsets(b, *L.constant_segment, b.CreateVector(L.constant_offsets));

  Offset<flatbuffers::Vector<Offset<fbs::NamedData>>> named_vec = 0;
  if (!program.named_data.empty()) {
    std::vector<Offset<fbs::NamedData>> named;
    for (size_t i = 0; i < program.named_data.size(); ++i)
      named.push_back(fbs::CreateNamedData(b, b.CreateString(program.named_data[i].key), L.named_segment[i]));
    named_vec = b.CreateVector(named);
  }

  Offset<flatbuffers::Vector<Offset<fbs::SubsegmentOffsets>>> mutable_segments = 0;
  if (L.mutable_segment)
    mutable_segments = b.CreateVector(std::vector<Offset<fbs::SubsegmentOffsets>>{
        fbs::CreateSubsegmentOffsets(b, *L.mutable_segment, b.CreateVector(L.mutable_offsets))});
  auto root = fbs::CreateProgram(b, program.version, plans_vec, constant_buffer, inline_vec, segments_vec,
                                 constant_segment, mutable_segments, named_vec);
  fbs::FinishProgramBuffer(b, root);
}

// ---------------------------------------------------------------------------
// Output: a buffered file that counts what it wrote.

class OutputFile {
 public:
  explicit OutputFile(StagedFile& file) : file_(file), start_(file.written()) {}
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;

  void write(const void* data, size_t n) { file_.write(data, n); }
  void zeros(uint64_t n) {
    static constexpr std::byte kZeros[4096] = {};
    while (n > 0) {
      size_t chunk = static_cast<size_t>(std::min<uint64_t>(n, sizeof kZeros));
      write(kZeros, chunk);
      n -= chunk;
    }
  }
  void pad_to(uint64_t offset) {
    if (written() > offset) fail("internal: {} already holds {} bytes, past offset {}", file_.target(), written(), offset);
    zeros(offset - written());
  }
  void close() { file_.close(); }
  uint64_t written() const { return file_.written() - start_; }

 private:
  StagedFile& file_;
  uint64_t start_ = 0;
};

void stream_blob(OutputFile& out, const DataBlob& blob, const std::string& what) {
  const uint64_t start = out.written();
  if (blob.size > 0)
    check(static_cast<bool>(blob.write), "{} declares {} bytes but has no data source", what, blob.size);
  if (blob.write) {
    blob.write([&](std::span<const std::byte> bytes) {
      check(out.written() - start + bytes.size() <= blob.size, "{} streams more than the {} bytes it declares", what,
            blob.size);
      out.write(bytes.data(), bytes.size());
    });
  }
  check(out.written() - start == blob.size, "{} streamed {} bytes but declares {}", what, out.written() - start,
        blob.size);
}

void write_file(const Program& program, const Layout& L, const flatbuffers::FlatBufferBuilder& b,
                const WriteOptions& opts, StagedFile& file) {
  const auto* fb = reinterpret_cast<const std::byte*>(b.GetBufferPointer());
  const uint64_t fb_size = b.GetSize();
  OutputFile out(file);

  if (L.segment_data_size == 0) {  // nothing after the flatbuffer: no extended header either
    out.write(fb, fb_size);
    out.close();
    return;
  }

  const uint64_t header_size = align_up(kExtendedHeaderLength, std::max(kSchemaMaxAlignment, opts.tensor_alignment));
  ExtendedHeader eh;
  eh.program_size = header_size + fb_size;
  eh.segment_base_offset = align_up(eh.program_size, opts.segment_alignment);
  eh.segment_data_size = L.segment_data_size;
  check(read_le(fb, 4) + header_size <= std::numeric_limits<uint32_t>::max(), "the program flatbuffer is too large");

  std::byte root[4];
  write_le(root, read_le(fb, 4) + header_size, 4);  // the root moves by the inserted header
  out.write(root, 4);
  out.write(fb + 4, 4);  // "ET12"
  auto header = encode_extended_header(eh);
  out.write(header.data(), header.size());
  out.zeros(header_size - header.size());
  out.write(fb + kExtendedHeaderOffset, fb_size - kExtendedHeaderOffset);

  for (const SegmentPlan& s : L.segments) {
    out.pad_to(eh.segment_base_offset + s.offset);
    switch (s.kind) {
      case SegmentPlan::Kind::Constants:
        for (size_t i = 0; i < program.constants.size(); ++i) {
          out.pad_to(eh.segment_base_offset + s.offset + L.constant_offsets[i]);
          stream_blob(out, program.constants[i], fmt::format("constant {}", i));
        }
        break;
      case SegmentPlan::Kind::Mutable:
        for (size_t i = 0; i < program.mutable_data.size(); ++i) {
          out.pad_to(eh.segment_base_offset + s.offset + L.mutable_offsets[i]);
          stream_blob(out, program.mutable_data[i], fmt::format("mutable data {}", i));
        }
        break;
      case SegmentPlan::Kind::Delegate:
        stream_blob(out, program.delegate_payloads[s.source], fmt::format("delegate payload {}", s.source));
        break;
      case SegmentPlan::Kind::Named:
        stream_blob(out, program.named_data[s.source].data,
                    fmt::format("named data '{}'", program.named_data[s.source].key));
        break;
    }
    check(out.written() == eh.segment_base_offset + s.offset + s.size, "internal: segment size mismatch");
  }
  out.close();
}

}  // namespace

void write_pte(const Program& program, StagedFile& file, const WriteOptions& opts) {
  check_program(program, opts);
  Layout layout = plan_layout(program, opts);

  FlatBufferBuilder builder(1 << 20);
  build_program(builder, program, layout);
  write_file(program, layout, builder, opts, file);
}

void write_pte(const Program& program, const std::string& path, const WriteOptions& opts) {
  StagedFile file(path);  // removed unless published
  write_pte(program, file, opts);
  file.publish();
}

}  // namespace kiln::pte
