// PteFile: mapping and verification of .pte files (see kiln/runtime/pte_file.h).
// Every check happens in open(); accessors only index what was verified.
#include "kiln/runtime/pte_file.h"
#include "kiln/runtime/try.h"

#include "kiln/fb/kiln_program_generated.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <limits>

namespace kiln::rt {

void ErrorMessage::set(const char* format, ...) {
  va_list args;
  va_start(args, format);
  std::vsnprintf(text_, sizeof text_, format, args);
  va_end(args);
  // Messages quote names from the file (operators, plans, backends); a damaged name
  // must not break the one-line message: printable ASCII only.
  for (char& c : text_) {
    if (c == '\0') break;
    if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x7f) c = '?';
  }
}

Status vfailure(ErrorMessage* error, Status s, const char* prefix, const char* format, va_list args) {
  if (error) {
    char text[320];
    std::vsnprintf(text, sizeof text, format, args);
    error->set("%s%s", prefix, text);
  }
  return s;
}

Status failure(ErrorMessage* error, Status s, const char* format, ...) {
  va_list args;
  va_start(args, format);
  vfailure(error, s, "", format, args);
  va_end(args);
  return s;
}

void PteFile::release_pages(std::span<const std::byte> bytes) const {
  if (data_ == nullptr || bytes.empty() || bytes.data() < data_ || bytes.data() + bytes.size() > data_ + size_) return;
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  uintptr_t begin = (reinterpret_cast<uintptr_t>(bytes.data()) + page - 1) & ~(page - 1);
  uintptr_t end = (reinterpret_cast<uintptr_t>(bytes.data()) + bytes.size()) & ~(page - 1);
  // The mapping is private and these pages were never written: dropping them loses nothing.
  if (end > begin) ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
}

void PteFile::advise_sparse(std::span<const std::byte> bytes) const {
  if (data_ == nullptr || bytes.empty() || bytes.data() < data_ || bytes.data() + bytes.size() > data_ + size_) return;
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  // every page the range touches (the mapping starts on a page, so these stay inside it)
  const uintptr_t begin = reinterpret_cast<uintptr_t>(bytes.data()) & ~(page - 1);
  const uintptr_t end = (reinterpret_cast<uintptr_t>(bytes.data()) + bytes.size() + page - 1) & ~(page - 1);
  ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_RANDOM);
  ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_NOHUGEPAGE);
}

size_t pte_element_size(int8_t scalar_type) {
  switch (scalar_type) {
    case 0: case 1: case 11: case 12: case 13: case 16: case 17:   // u8 i8 bool qint8 quint8 quint4x2 quint2x4
    case 23: case 24: case 25: case 26: case 44:                   // float8 variants
      return 1;
    case 2: case 5: case 15: case 22: case 27:                     // i16 f16 bf16 bits16 u16
      return 2;
    case 3: case 6: case 8: case 14: case 28:                      // i32 f32 complex32 qint32 u32
      return 4;
    case 4: case 7: case 9: case 29:                               // i64 f64 complex64 u64
      return 8;
    case 10:                                                       // complex128
      return 16;
    default:
      return 0;
  }
}

namespace {

using U64 = uint64_t;
constexpr U64 kFlatbufferMaxSize = 0x7fffffff;  // flatbuffers' 32-bit offset limit


// a + b <= limit, without overflow.
bool fits(U64 a, U64 b, U64 limit) { return a <= limit && b <= limit - a; }

template <typename T>
uint32_t length(const flatbuffers::Vector<T>* v) {
  return v ? v->size() : 0;
}

// flatbuffers' Verifier checks only that a vector's length word is 4-aligned, so
// the elements of a damaged [long]/[double]/[uint64] vector can sit 4 bytes off
// their alignment, and reading them is undefined behaviour. The mapping is
// page-aligned, so checking the address checks the file offset.
template <typename T>
bool elements_aligned(const flatbuffers::Vector<T>* v) {
  // An empty vector has no element to misalign (flatbuffers need not align its data).
  return v == nullptr || v->size() == 0 || reinterpret_cast<uintptr_t>(v->data()) % alignof(T) == 0;
}

// Where a constant's bytes live: [begin, end) of the file.
struct ByteRange {
  U64 begin = 0, end = 0;
};

// Verifies everything below the frame: segments, constants, delegates, named
// data and the plans. Holds the facts the plan checks need.
class ProgramChecker {
 public:
  ProgramChecker(const fb::Program& p, U64 file_size, bool has_header, const format::ExtendedHeader& eh,
                 ErrorMessage* error)
      : p_(p), file_size_(file_size), has_header_(has_header), eh_(eh), error_(error) {}

  Status run() {
    if (!p_.execution_plan()) return fail("the program has no execution_plan table");
    KILN_TRY(check_segments());
    KILN_TRY(check_constants());
    KILN_TRY(check_mutable_data());
    KILN_TRY(check_named_data());
    for (uint32_t i = 0; i < p_.execution_plan()->size(); ++i)
      KILN_TRY(check_plan(i, *p_.execution_plan()->Get(i)));
    return Status::Ok;
  }

 private:
  Status fail(const char* format, ...) __attribute__((format(printf, 2, 3))) {
    if (error_) {
      char text[320];
      va_list args;
      va_start(args, format);
      std::vsnprintf(text, sizeof text, format, args);
      va_end(args);
      if (plan_name_) error_->set("plan '%.64s' %s", plan_name_, text);
      else error_->set("%s", text);
    }
    return Status::InvalidProgram;
  }

  U64 segment_size(uint32_t i) const { return p_.segments()->Get(i)->size(); }

  Status check_segments() {
    const auto* segments = p_.segments();
    for (uint32_t i = 0; i < length(segments); ++i) {
      const fb::DataSegment* s = segments->Get(i);
      if (!has_header_) {
        if (s->size() > 0)
          return fail("segment %u holds %llu bytes, but the file has no extended header to locate segments", i,
                      static_cast<unsigned long long>(s->size()));
        continue;
      }
      if (!fits(eh_.segment_base_offset, s->offset(), file_size_) ||
          !fits(eh_.segment_base_offset + s->offset(), s->size(), file_size_)) {
        U64 start = eh_.segment_base_offset + s->offset();
        bool start_overflows = start < s->offset();
        if (start_overflows || start > file_size_)
          return fail("segment %u starts past the end of the %llu-byte file (offset %llu from the segment base %llu)",
                      i, static_cast<unsigned long long>(file_size_), static_cast<unsigned long long>(s->offset()),
                      static_cast<unsigned long long>(eh_.segment_base_offset));
        return fail("segment %u (%llu bytes at byte %llu) ends past the end of the %llu-byte file", i,
                    static_cast<unsigned long long>(s->size()), static_cast<unsigned long long>(start),
                    static_cast<unsigned long long>(file_size_));
      }
      if (eh_.segment_data_size > 0 && !fits(s->offset(), s->size(), eh_.segment_data_size))
        return fail("segment %u (offset %llu, %llu bytes) ends past the %llu bytes of segment data in the header", i,
                    static_cast<unsigned long long>(s->offset()), static_cast<unsigned long long>(s->size()),
                    static_cast<unsigned long long>(eh_.segment_data_size));
    }
    return Status::Ok;
  }

  // Offsets into one segment: in range, and (for constants) non-decreasing.
  Status check_subsegments(const fb::SubsegmentOffsets& sub, const char* what, bool ordered) {
    const auto* offsets = sub.offsets();
    if (length(offsets) == 0) return Status::Ok;
    if (!elements_aligned(offsets)) return fail("%s offsets are not 8-byte aligned", what);
    if (sub.segment_index() >= length(p_.segments()))
      return fail("%s names segment %u, but the program has %u segments", what, sub.segment_index(),
                  length(p_.segments()));
    U64 size = segment_size(sub.segment_index());
    for (uint32_t i = 0; i < offsets->size(); ++i) {
      U64 off = offsets->Get(i);
      if (off > size)
        return fail("%s item %u starts at byte %llu of segment %u, which has %llu bytes", what, i,
                    static_cast<unsigned long long>(off), sub.segment_index(), static_cast<unsigned long long>(size));
      if (ordered && i > 0 && off < offsets->Get(i - 1))
        return fail("%s item %u starts at byte %llu, before item %u at byte %llu", what, i,
                    static_cast<unsigned long long>(off), i - 1, static_cast<unsigned long long>(offsets->Get(i - 1)));
    }
    return Status::Ok;
  }

  Status check_constants() {
    const auto* seg = p_.constant_segment();
    uint32_t segment_constants = seg ? length(seg->offsets()) : 0;
    if (segment_constants > 0 && length(p_.constant_buffer()) > 0)
      return fail("constants are both inline (%u) and in a segment (%u); only one may be used",
                  length(p_.constant_buffer()), segment_constants);
    if (segment_constants > 0) KILN_TRY(check_subsegments(*seg, "constant segment", true));
    constant_count_ = segment_constants > 0 ? segment_constants : length(p_.constant_buffer());
    return Status::Ok;
  }

  // Size in bytes of constant i (< constant_count_).
  U64 constant_size(uint32_t i) const {
    const auto* seg = p_.constant_segment();
    if (seg && length(seg->offsets()) > 0) {
      const auto* offsets = seg->offsets();
      U64 end = i + 1 < offsets->size() ? offsets->Get(i + 1) : segment_size(seg->segment_index());
      return end - offsets->Get(i);
    }
    return length(p_.constant_buffer()->Get(i)->storage());
  }

  Status check_mutable_data() {
    const auto* m = p_.mutable_data_segments();
    for (uint32_t i = 0; i < length(m); ++i)
      KILN_TRY(check_subsegments(*m->Get(i), "mutable data segment", false));
    return Status::Ok;
  }

  Status check_named_data() {
    const auto* named = p_.named_data();
    for (uint32_t i = 0; i < length(named); ++i) {
      const fb::NamedData* n = named->Get(i);
      if (!n->key()) return fail("named data entry %u has no key", i);
      if (n->segment_index() >= length(p_.segments()))
        return fail("named data '%.64s' names segment %u, but the program has %u segments", n->key()->c_str(),
                    n->segment_index(), length(p_.segments()));
    }
    return Status::Ok;
  }

  bool value_in_range(int64_t index) const { return index >= 0 && index < static_cast<int64_t>(n_values_); }
  fb::KernelTypes value_type(int64_t index) const {
    return plan_->values()->Get(static_cast<uint32_t>(index))->val_type();
  }

  Status check_index(int64_t index, const char* what, uint32_t where) {
    if (!value_in_range(index))
      return fail("%s %u names value %lld, but the plan has %u values", what, where, static_cast<long long>(index),
                  n_values_);
    return Status::Ok;
  }

  Status check_args(const flatbuffers::Vector<int32_t>* args, uint32_t instruction) {
    for (uint32_t a = 0; a < length(args); ++a)
      if (!value_in_range(args->Get(a)))
        return fail("instruction %u argument %u names value %d, but the plan has %u values", instruction, a,
                    args->Get(a), n_values_);
    return Status::Ok;
  }

  Status check_tensor(uint32_t vi, const fb::Tensor& t) {
    const auto* sizes = t.sizes();
    if (!sizes) return fail("value %u: tensor has no sizes", vi);
    U64 elem = pte_element_size(static_cast<int8_t>(t.scalar_type()));
    if (elem == 0) return fail("value %u: unknown dtype code %d", vi, static_cast<int>(t.scalar_type()));
    U64 nbytes = elem;
    for (uint32_t d = 0; d < sizes->size(); ++d) {
      int32_t s = sizes->Get(d);
      if (s < 0) return fail("value %u: size %d of dimension %u is negative", vi, s, d);
      // The runtime counts elements in int64: keep the byte size (>= the count) below 2^63.
      if (s > 0 && nbytes > static_cast<U64>(std::numeric_limits<int64_t>::max()) / static_cast<U64>(s))
        return fail("value %u: tensor byte size overflows", vi);
      nbytes *= static_cast<U64>(s);
    }
    if (const auto* order = t.dim_order()) {
      if (order->size() != sizes->size())
        return fail("value %u: dim_order has %u entries for a rank-%u tensor", vi, order->size(), sizes->size());
      uint64_t seen = 0;
      for (uint32_t d = 0; d < order->size(); ++d) {
        uint8_t o = order->Get(d);
        if (o >= sizes->size() || o >= 64 || (seen & (uint64_t{1} << o)))
          return fail("value %u: dim_order is not a permutation of the tensor's %u dimensions", vi, sizes->size());
        seen |= uint64_t{1} << o;
      }
    }
    const fb::ExtraTensorInfo* extra = t.extra_tensor_info();
    if (extra && extra->location() == fb::TensorDataLocation::EXTERNAL) {
      if (!extra->fully_qualified_name())
        return fail("value %u: external tensor has no fully qualified name", vi);
    } else if (t.data_buffer_idx() > 0 && !t.allocation_info()) {
      if (t.data_buffer_idx() >= constant_count_)
        return fail("value %u: constant %u out of range (the program has %u constants)", vi, t.data_buffer_idx(),
                    constant_count_);
      U64 have = constant_size(t.data_buffer_idx());
      if (have < nbytes)
        return fail("value %u: constant %u holds %llu bytes, the tensor needs %llu", vi, t.data_buffer_idx(),
                    static_cast<unsigned long long>(have), static_cast<unsigned long long>(nbytes));
    } else if (t.data_buffer_idx() > 0) {
      uint64_t which = extra ? extra->mutable_data_segments_idx() : 0;
      const auto* m = p_.mutable_data_segments();
      if (which >= length(m))
        return fail("value %u: initial data in mutable data segment %llu, but the program has %u", vi,
                    static_cast<unsigned long long>(which), length(m));
      if (t.data_buffer_idx() >= length(m->Get(static_cast<uint32_t>(which))->offsets()))
        return fail("value %u: mutable data item %u out of range", vi, t.data_buffer_idx());
    }
    if (const fb::AllocationDetails* a = t.allocation_info()) {
      uint32_t buffers = length(plan_->non_const_buffer_sizes());
      if (a->memory_id() < 1 || a->memory_id() >= buffers)
        return fail("value %u: memory_id %u out of range (the plan has planned buffers 1..%u)", vi, a->memory_id(),
                    buffers - 1);
      U64 offset = (static_cast<U64>(a->memory_offset_high()) << 32) | a->memory_offset_low();
      U64 capacity = static_cast<U64>(plan_->non_const_buffer_sizes()->Get(a->memory_id()));
      if (!fits(offset, nbytes, capacity))
        return fail("value %u: %llu bytes at offset %llu exceed planned buffer %u (%llu bytes)", vi,
                    static_cast<unsigned long long>(nbytes), static_cast<unsigned long long>(offset), a->memory_id(),
                    static_cast<unsigned long long>(capacity));
    }
    return Status::Ok;
  }

  Status check_value(uint32_t vi, const fb::EValue& v) {
    switch (v.val_type()) {
      case fb::KernelTypes::NONE:
        return fail("value %u has no type", vi);
      case fb::KernelTypes::Null:
      case fb::KernelTypes::Int:
      case fb::KernelTypes::Bool:
      case fb::KernelTypes::Double:
      case fb::KernelTypes::String:
      case fb::KernelTypes::DoubleList:
      case fb::KernelTypes::BoolList:
        break;
      case fb::KernelTypes::Tensor:
        break;
      case fb::KernelTypes::IntList:
      case fb::KernelTypes::TensorList:
      case fb::KernelTypes::OptionalTensorList:
        break;
      default:
        return fail("value %u has unknown type code %d", vi, static_cast<int>(v.val_type()));
    }
    if (!v.val()) return fail("value %u has a type but no data", vi);
    switch (v.val_type()) {
      case fb::KernelTypes::Tensor:
        return check_tensor(vi, *v.val_as_Tensor());
      case fb::KernelTypes::DoubleList:
        if (!elements_aligned(v.val_as_DoubleList()->items()))
          return fail("value %u: DoubleList items are not 8-byte aligned", vi);
        break;
      case fb::KernelTypes::IntList: {
        const auto* items = v.val_as_IntList()->items();
        if (!elements_aligned(items)) return fail("value %u: IntList items are not 8-byte aligned", vi);
        for (uint32_t i = 0; i < length(items); ++i) {
          int64_t item = items->Get(i);
          if (!value_in_range(item) || value_type(item) != fb::KernelTypes::Int)
            return fail("value %u: IntList item %u names value %lld, which is not an Int", vi, i,
                        static_cast<long long>(item));
        }
        break;
      }
      case fb::KernelTypes::TensorList: {
        const auto* items = v.val_as_TensorList()->items();
        for (uint32_t i = 0; i < length(items); ++i) {
          int32_t item = items->Get(i);
          if (!value_in_range(item) || value_type(item) != fb::KernelTypes::Tensor)
            return fail("value %u: TensorList item %u names value %d, which is not a tensor", vi, i, item);
        }
        break;
      }
      case fb::KernelTypes::OptionalTensorList: {
        const auto* items = v.val_as_OptionalTensorList()->items();
        for (uint32_t i = 0; i < length(items); ++i) {
          int32_t item = items->Get(i);
          if (item == -1) continue;
          if (!value_in_range(item) ||
              (value_type(item) != fb::KernelTypes::Tensor && value_type(item) != fb::KernelTypes::Null))
            return fail("value %u: OptionalTensorList item %u names value %d, which is not a tensor or None", vi, i,
                        item);
        }
        break;
      }
      default:
        break;
    }
    return Status::Ok;
  }

  // A kernel or delegate call: its index within the plan's `count` operators/delegates (`what`), then its arguments.
  Status check_call(uint32_t ii, const char* what, int32_t index, uint32_t count,
                    const flatbuffers::Vector<int32_t>* args) {
    if (index < 0 || static_cast<uint32_t>(index) >= count)
      return fail("instruction %u calls %s %d, but the plan has %u %ss", ii, what, index, count, what);
    return check_args(args, ii);
  }

  Status check_instruction(uint32_t ii, const fb::Instruction& ins, uint32_t n_instructions) {
    if (!ins.instr_args()) return fail("instruction %u has no arguments", ii);
    switch (ins.instr_args_type()) {
      case fb::InstructionArguments::KernelCall: {
        const auto* k = ins.instr_args_as_KernelCall();
        return check_call(ii, "operator", k->op_index(), length(plan_->operators()), k->args());
      }
      case fb::InstructionArguments::DelegateCall: {
        const auto* d = ins.instr_args_as_DelegateCall();
        return check_call(ii, "delegate", d->delegate_index(), length(plan_->delegates()), d->args());
      }
      case fb::InstructionArguments::MoveCall: {
        const auto* m = ins.instr_args_as_MoveCall();
        KILN_TRY(check_index(m->move_from(), "move source of instruction", ii));
        return check_index(m->move_to(), "move target of instruction", ii);
      }
      case fb::InstructionArguments::JumpFalseCall: {
        const auto* j = ins.instr_args_as_JumpFalseCall();
        KILN_TRY(check_index(j->cond_value_index(), "condition of instruction", ii));
        if (j->destination_instruction() < 0 || static_cast<uint32_t>(j->destination_instruction()) > n_instructions)
          return fail("instruction %u jumps to instruction %d of %u", ii, j->destination_instruction(),
                      n_instructions);
        return Status::Ok;
      }
      case fb::InstructionArguments::FreeCall:
        return check_index(ins.instr_args_as_FreeCall()->value_index(), "freed value of instruction", ii);
      default:
        return fail("instruction %u has unknown kind %d", ii, static_cast<int>(ins.instr_args_type()));
    }
  }

  Status check_plan(uint32_t index, const fb::ExecutionPlan& plan) {
    plan_name_ = nullptr;
    if (!plan.name()) return fail("execution plan %u has no name", index);
    plan_name_ = plan.name()->c_str();
    plan_ = &plan;
    if (!plan.values()) return fail("has no values table");
    if (!plan.inputs()) return fail("has no inputs list");
    if (!plan.outputs()) return fail("has no outputs list");
    if (!plan.non_const_buffer_sizes()) return fail("has no non_const_buffer_sizes");
    n_values_ = plan.values()->size();
    if (!elements_aligned(plan.non_const_buffer_sizes())) return fail("non_const_buffer_sizes is not 8-byte aligned");
    for (uint32_t i = 0; i < plan.non_const_buffer_sizes()->size(); ++i)
      if (plan.non_const_buffer_sizes()->Get(i) < 0)
        return fail("planned buffer %u has negative size %lld", i,
                    static_cast<long long>(plan.non_const_buffer_sizes()->Get(i)));
    for (uint32_t vi = 0; vi < n_values_; ++vi) KILN_TRY(check_value(vi, *plan.values()->Get(vi)));
    for (uint32_t i = 0; i < plan.inputs()->size(); ++i) KILN_TRY(check_index(plan.inputs()->Get(i), "input", i));
    for (uint32_t i = 0; i < plan.outputs()->size(); ++i)
      KILN_TRY(check_index(plan.outputs()->Get(i), "output", i));
    for (uint32_t i = 0; i < length(plan.operators()); ++i)
      if (!plan.operators()->Get(i)->name()) return fail("operator %u has no name", i);
    for (uint32_t i = 0; i < length(plan.delegates()); ++i) {
      const fb::BackendDelegate* d = plan.delegates()->Get(i);
      if (!d->id()) return fail("delegate %u has no backend id", i);
      const fb::BackendDelegateDataReference* ref = d->processed();
      if (!ref) return fail("delegate %u (%.64s) has no payload reference", i, d->id()->c_str());
      if (ref->location() == fb::DataLocation::INLINE) {
        if (ref->index() >= length(p_.backend_delegate_data()))
          return fail("delegate %u (%.64s) names inline payload %u, but the program has %u", i, d->id()->c_str(),
                      ref->index(), length(p_.backend_delegate_data()));
      } else if (ref->location() == fb::DataLocation::SEGMENT) {
        if (ref->index() >= length(p_.segments()))
          return fail("delegate %u (%.64s) names segment %u, but the program has %u segments", i, d->id()->c_str(),
                      ref->index(), length(p_.segments()));
      } else {
        return fail("delegate %u (%.64s) has unknown payload location %d", i, d->id()->c_str(),
                    static_cast<int>(ref->location()));
      }
    }
    for (uint32_t c = 0; c < length(plan.chains()); ++c) {
      const auto* instructions = plan.chains()->Get(c)->instructions();
      for (uint32_t ii = 0; ii < length(instructions); ++ii)
        KILN_TRY(check_instruction(ii, *instructions->Get(ii), instructions->size()));
    }
    plan_name_ = nullptr;
    return Status::Ok;
  }

  const fb::Program& p_;
  U64 file_size_;
  bool has_header_;
  format::ExtendedHeader eh_;
  ErrorMessage* error_;
  uint32_t constant_count_ = 0;
  const fb::ExecutionPlan* plan_ = nullptr;
  const char* plan_name_ = nullptr;
  uint32_t n_values_ = 0;
};

// Printable form of the 4 identifier bytes.
void identifier_text(const std::byte* p, char out[5]) {
  for (int i = 0; i < 4; ++i) {
    auto c = static_cast<unsigned char>(p[i]);
    out[i] = (c >= 0x20 && c < 0x7f) ? static_cast<char>(c) : '?';
  }
  out[4] = '\0';
}

#undef KILN_CHECK_OK

}  // namespace

Result<PteFile> PteFile::open(const char* path, ErrorMessage* error) {
  int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return failure(error, Status::AccessFailed, "cannot open: %s", std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int e = errno;
    ::close(fd);
    return failure(error, Status::AccessFailed, "cannot stat: %s", std::strerror(e));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return failure(error, Status::AccessFailed, "not a regular file");
  }
  const U64 size = static_cast<U64>(st.st_size);
  if (size < format::kExtendedHeaderOffset) {
    ::close(fd);
    return failure(error, Status::InvalidProgram, "the file is %llu bytes, too short for a program (at least %zu)",
                   static_cast<unsigned long long>(size), format::kExtendedHeaderOffset);
  }
  // Private (copy-on-write) and writable: the file itself is never changed, but a
  // damaged program whose kernel is handed a constant as its out tensor (or whose
  // input is a constant) writes into its own copy of those pages instead of
  // faulting on a read-only mapping. Which arguments a kernel writes depends on
  // the operator's schema, so the loader cannot rule that out. Untouched pages
  // stay shared with the page cache. MAP_NORESERVE: a private writable mapping is
  // otherwise charged in full against the commit limit, as if every page were to be
  // copied, and the kernel's default overcommit heuristic refuses one larger than
  // RAM + swap (a 12 GB .pte on an 8 GB board), although only a damaged program ever
  // writes a page of it.
  void* map = ::mmap(nullptr, static_cast<size_t>(size), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_NORESERVE, fd, 0);
  int map_errno = errno;
  ::close(fd);
  if (map == MAP_FAILED) return failure(error, Status::AccessFailed, "cannot map: %s", std::strerror(map_errno));

  PteFile f;  // owns the mapping from here on
  f.data_ = static_cast<const std::byte*>(map);
  f.size_ = size;

  if (std::memcmp(f.data_ + 4, format::kProgramIdentifier, 4) != 0) {
    char id[5];
    identifier_text(f.data_ + 4, id);
    return failure(error, Status::InvalidProgram,
                   "file identifier is '%s' at byte 4, expected '%s' (not an ExecuTorch program of this format)", id,
                   format::kProgramIdentifier);
  }

  format::ExtendedHeader eh;
  switch (format::parse_extended_header(f.bytes(), &eh)) {
    case format::HeaderParse::Absent:
      f.program_size_ = size;
      break;
    case format::HeaderParse::TooShort:
      return failure(error, Status::InvalidProgram, "the %llu-byte file ends inside the extended header at byte 8",
                     static_cast<unsigned long long>(size));
    case format::HeaderParse::BadLength:
      return failure(error, Status::InvalidProgram, "extended header length %llu is below the minimum %u",
                     static_cast<unsigned long long>(format::read_le(f.data_ + 12, 4)), format::kExtendedHeaderMinLength);
    case format::HeaderParse::Ok: {
      f.has_header_ = true;
      f.header_ = eh;
      f.program_size_ = eh.program_size;
      if (eh.program_size < format::kExtendedHeaderOffset + eh.length)
        return failure(error, Status::InvalidProgram,
                       "extended header: program size %llu is smaller than the header itself (%llu bytes)",
                       static_cast<unsigned long long>(eh.program_size),
                       static_cast<unsigned long long>(format::kExtendedHeaderOffset + eh.length));
      if (eh.program_size > size)
        return failure(error, Status::InvalidProgram,
                       "extended header: program size %llu exceeds the %llu-byte file",
                       static_cast<unsigned long long>(eh.program_size), static_cast<unsigned long long>(size));
      if (eh.segment_base_offset != 0 &&
          (eh.segment_base_offset < eh.program_size || eh.segment_base_offset > size))
        return failure(error, Status::InvalidProgram,
                       "extended header: segment base offset %llu is outside [%llu, %llu] (after the program, within "
                       "the file)",
                       static_cast<unsigned long long>(eh.segment_base_offset),
                       static_cast<unsigned long long>(eh.program_size), static_cast<unsigned long long>(size));
      if (eh.segment_data_size > 0 &&
          (eh.segment_base_offset == 0 || !fits(eh.segment_base_offset, eh.segment_data_size, size)))
        return failure(error, Status::InvalidProgram,
                       "extended header: %llu bytes of segment data at byte %llu end past the %llu-byte file",
                       static_cast<unsigned long long>(eh.segment_data_size),
                       static_cast<unsigned long long>(eh.segment_base_offset), static_cast<unsigned long long>(size));
      break;
    }
  }
  if (f.program_size_ > kFlatbufferMaxSize)
    return failure(error, Status::NotSupported, "the program flatbuffer is %llu bytes, over the 2 GiB limit",
                   static_cast<unsigned long long>(f.program_size_));

  flatbuffers::Verifier::Options options;
  options.max_depth = 64;
  options.max_tables = 50'000'000;
  flatbuffers::Verifier verifier(reinterpret_cast<const uint8_t*>(f.data_), static_cast<size_t>(f.program_size_),
                                 options);
  if (!fb::VerifyProgramBuffer(verifier))
    return failure(error, Status::InvalidProgram,
                   "the program flatbuffer (%llu bytes) fails verification: truncated or corrupt",
                   static_cast<unsigned long long>(f.program_size_));
  f.program_ = fb::GetProgram(f.data_);

  Status s = ProgramChecker(*f.program_, size, f.has_header_, f.header_, error).run();
  if (s != Status::Ok) return s;
  return Result<PteFile>(std::move(f));
}

PteFile::PteFile(PteFile&& other) noexcept { *this = std::move(other); }

PteFile& PteFile::operator=(PteFile&& other) noexcept {
  if (this != &other) {
    release();
    data_ = other.data_;
    size_ = other.size_;
    program_ = other.program_;
    has_header_ = other.has_header_;
    header_ = other.header_;
    program_size_ = other.program_size_;
    other.data_ = nullptr;
    other.size_ = 0;
    other.program_ = nullptr;
  }
  return *this;
}

PteFile::~PteFile() { release(); }

void PteFile::release() {
  if (data_) ::munmap(const_cast<std::byte*>(data_), static_cast<size_t>(size_));
  data_ = nullptr;
}

size_t PteFile::segment_count() const { return length(program_->segments()); }

Result<std::span<const std::byte>> PteFile::segment(size_t index, ErrorMessage* error) const {
  if (index >= segment_count())
    return failure(error, Status::OutOfRange, "segment %zu out of range (the program has %zu)", index,
                   segment_count());
  const fb::DataSegment* s = program_->segments()->Get(static_cast<uint32_t>(index));
  if (s->size() == 0) return std::span<const std::byte>{};
  return std::span<const std::byte>(data_ + header_.segment_base_offset + s->offset(), static_cast<size_t>(s->size()));
}

size_t PteFile::constant_count() const {
  const auto* seg = program_->constant_segment();
  if (seg && length(seg->offsets()) > 0) return seg->offsets()->size();
  return length(program_->constant_buffer());
}

Result<std::span<const std::byte>> PteFile::constant(size_t index, ErrorMessage* error) const {
  if (index >= constant_count())
    return failure(error, Status::OutOfRange, "constant %zu out of range (the program has %zu)", index,
                   constant_count());
  const auto i = static_cast<uint32_t>(index);
  const auto* seg = program_->constant_segment();
  if (seg && length(seg->offsets()) > 0) {
    Result<std::span<const std::byte>> bytes = segment(seg->segment_index(), error);
    if (!bytes.ok()) return bytes.status();
    const auto* offsets = seg->offsets();
    U64 begin = offsets->Get(i);
    U64 end = i + 1 < offsets->size() ? offsets->Get(i + 1) : bytes->size();
    return bytes->subspan(static_cast<size_t>(begin), static_cast<size_t>(end - begin));
  }
  const auto* storage = program_->constant_buffer()->Get(i)->storage();
  if (!storage) return std::span<const std::byte>{};
  return std::span<const std::byte>(reinterpret_cast<const std::byte*>(storage->data()), storage->size());
}

Result<std::span<const std::byte>> PteFile::mutable_data(size_t which, size_t index, ErrorMessage* error) const {
  const auto* segs = program_->mutable_data_segments();
  if (which >= length(segs))
    return failure(error, Status::OutOfRange, "mutable data segment %zu out of range (the program has %u)", which,
                   length(segs));
  const fb::SubsegmentOffsets* seg = segs->Get(static_cast<uint32_t>(which));
  const auto* offsets = seg->offsets();
  if (index >= length(offsets))
    return failure(error, Status::OutOfRange, "mutable data item %zu out of range (the segment has %u)", index,
                   length(offsets));
  Result<std::span<const std::byte>> bytes = segment(seg->segment_index(), error);
  if (!bytes.ok()) return bytes.status();
  const auto i = static_cast<uint32_t>(index);
  U64 begin = offsets->Get(i);
  U64 end = i + 1 < offsets->size() ? offsets->Get(i + 1) : bytes->size();
  if (begin > end || end > bytes->size())
    return failure(error, Status::InvalidProgram, "mutable data item %zu lies outside its segment", index);
  return bytes->subspan(static_cast<size_t>(begin), static_cast<size_t>(end - begin));
}

Result<std::span<const std::byte>> PteFile::delegate_payload(size_t plan_index, size_t delegate_index,
                                                             ErrorMessage* error) const {
  const auto* plans = program_->execution_plan();
  if (plan_index >= plans->size())
    return failure(error, Status::OutOfRange, "plan %zu out of range (the program has %u)", plan_index,
                   plans->size());
  const auto* delegates = plans->Get(static_cast<uint32_t>(plan_index))->delegates();
  if (delegate_index >= length(delegates))
    return failure(error, Status::OutOfRange, "delegate %zu out of range (the plan has %u)", delegate_index,
                   length(delegates));
  const fb::BackendDelegateDataReference* ref = delegates->Get(static_cast<uint32_t>(delegate_index))->processed();
  if (ref->location() == fb::DataLocation::SEGMENT) return segment(ref->index(), error);
  const auto* data = program_->backend_delegate_data()->Get(ref->index())->data();
  if (!data) return std::span<const std::byte>{};
  return std::span<const std::byte>(reinterpret_cast<const std::byte*>(data->data()), data->size());
}

Result<std::span<const std::byte>> PteFile::named_data(std::string_view key, ErrorMessage* error) const {
  const auto* named = program_->named_data();
  for (uint32_t i = 0; i < length(named); ++i) {
    const fb::NamedData* n = named->Get(i);
    if (n->key()->string_view() == key) return segment(n->segment_index(), error);
  }
  return failure(error, Status::NotFound, "no named data '%.*s'", static_cast<int>(std::min<size_t>(key.size(), 64)),
                 key.data());
}

Result<const fb::ExecutionPlan*> PteFile::plan(std::string_view name, ErrorMessage* error) const {
  const auto* plans = program_->execution_plan();
  for (uint32_t i = 0; i < plans->size(); ++i)
    if (plans->Get(i)->name()->string_view() == name) return plans->Get(i);
  return failure(error, Status::NotFound, "no method '%.*s' in the program",
                 static_cast<int>(std::min<size_t>(name.size(), 64)), name.data());
}

}  // namespace kiln::rt
