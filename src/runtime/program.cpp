#include "kiln/runtime/program.h"

#include "kiln/ops/op_id.h"

#include "kiln/fb/kiln_program_generated.h"
#include "kiln/runtime/kernel_registry.h"
#include "kiln/runtime/try.h"

#include <algorithm>
#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <type_traits>

#include <sys/mman.h>

namespace kiln::rt {
namespace {

constexpr size_t kBufferAlignment = 64;
constexpr size_t kHugePage = size_t{2} << 20;

// Planned memory of 2 MiB or more (an LLM's KV cache, a large model's activations) in
// 2 MiB-aligned memory advised MADV_HUGEPAGE: decode reads each layer's cache once per
// token in short streams, and from 4 KiB pages (a TLB miss per page; in a VM a nested walk)
// SmolLM2's q · Kᵀ ran about 1.4x slower (a standalone loop over 30 layers' caches at
// position 200). KILN_HUGE_PAGES=0 asks for no huge pages (huge_pages_enabled, as for the
// XNNPACK backend's weight memory). Advice only: with THP off the pages stay 4 KiB.
std::byte* alloc_planned(size_t rounded) {
  if (!huge_pages_enabled() || rounded < kHugePage)
    return static_cast<std::byte*>(std::aligned_alloc(kBufferAlignment, std::max<size_t>(rounded, kBufferAlignment)));
  const size_t size = (rounded + kHugePage - 1) / kHugePage * kHugePage;
  auto* p = static_cast<std::byte*>(std::aligned_alloc(kHugePage, size));
  if (p) ::madvise(p, size, MADV_HUGEPAGE);
  return p;
}

using fb::KernelTypes;

template <typename T>
size_t len(const flatbuffers::Vector<T>* v) {
  return v ? v->size() : 0;
}

void shape_text(char* buf, size_t n, std::span<const int64_t> shape) {
  size_t at = static_cast<size_t>(std::snprintf(buf, n, "["));
  for (size_t d = 0; d < shape.size() && at < n; ++d)
    at += static_cast<size_t>(std::snprintf(buf + at, n - at, "%s%lld", d ? ", " : "", static_cast<long long>(shape[d])));
  if (at < n) std::snprintf(buf + at, n - at, "]");
}

}  // namespace

Method::Method(Method&& o) noexcept = default;  // moved-from vectors are empty: nothing freed twice

Method& Method::operator=(Method&& o) noexcept {
  if (this == &o) return *this;
  this->~Method();
  new (this) Method();
  name_ = std::move(o.name_);
  values_ = std::move(o.values_);
  tensors_ = std::move(o.tensors_);
  int_arena_ = std::move(o.int_arena_);
  double_arena_ = std::move(o.double_arena_);
  bool_arena_ = std::move(o.bool_arena_);
  tensor_ptr_arena_ = std::move(o.tensor_ptr_arena_);
  arg_ptrs_ = std::move(o.arg_ptrs_);
  instructions_ = std::move(o.instructions_);
  operator_labels_ = std::move(o.operator_labels_);
  delegate_labels_ = std::move(o.delegate_labels_);
  inputs_ = std::move(o.inputs_);
  outputs_ = std::move(o.outputs_);
  input_planned_ = std::move(o.input_planned_);
  input_dynamic_ = std::move(o.input_dynamic_);
  input_home_ = std::move(o.input_home_);
  input_private_ = std::move(o.input_private_);
  int_refresh_ = std::move(o.int_refresh_);
  buffers_ = std::move(o.buffers_);
  planned_bytes_ = o.planned_bytes_;
  delegates_ = std::move(o.delegates_);
  profile_ = std::move(o.profile_);
  profiling_ = o.profiling_;
  debug_log_ = o.debug_log_;
  debug_outs_ = std::move(o.debug_outs_);
  o.debug_log_ = nullptr;
  o.buffers_.clear();
  o.delegates_.clear();
  return *this;
}

bool huge_pages_enabled() {
  static const bool on = [] {
    const char* v = std::getenv("KILN_HUGE_PAGES");
    return !(v && std::strcmp(v, "0") == 0);
  }();
  return on;
}

Method::~Method() {
  for (auto& d : delegates_)
    if (d.backend && d.backend->destroy) d.backend->destroy(d.state);
  for (std::byte* b : buffers_) std::free(b);
}

void Method::enable_profiling(bool on) {
  profiling_ = on;
  for (auto& p : profile_) p = InstructionProfile{};  // as the backends do: a profile starts from zero
  for (auto& d : delegates_)
    if (d.backend && d.backend->enable_profiling) d.backend->enable_profiling(d.state, on);
}

void Method::enable_debug_outputs(DebugOutputLog* log) {
  debug_log_ = log;
  for (auto& d : delegates_)  // the backends that log their own nodes (each step's output)
    if (d.backend && d.backend->enable_debug_outputs) d.backend->enable_debug_outputs(d.state, log);
  if (log && debug_outs_.size() != instructions_.size()) {  // a kernel call's outs: its operator's schema
    debug_outs_.assign(instructions_.size(), 0);
    for (size_t i = 0; i < instructions_.size(); ++i) {
      if (instructions_[i].kind != Instruction::Kind::Kernel) continue;
      const std::string_view label = instruction_label(i);  // "aten::native_layer_norm.out"
      const size_t dot = label.rfind('.');
      const auto id = dot == std::string_view::npos ? std::nullopt
                                                    : ops::find_op(label.substr(0, dot), label.substr(dot + 1));
      if (id) debug_outs_[i] = static_cast<uint8_t>(ops::op_schema(*id).num_outs);
    }
  }
}

void Method::log_debug_outputs(size_t pc, const Instruction& in, std::span<EValue*> args) {
  bool logged = false;
  auto log = [&](const EValue* v) {
    if (!v) return;
    if (v->tag == EValue::Tag::Tensor) {
      debug_log_->log(static_cast<uint32_t>(pc), -1, *v->scalar.t);
      logged = true;
    } else if (v->tag == EValue::Tag::TensorList) {
      for (const Tensor* t : v->tensors)
        if (t) debug_log_->log(static_cast<uint32_t>(pc), -1, *t);
      logged = true;
    }
  };
  if (in.kind == Instruction::Kind::Kernel) {  // its out arguments (the last one when the table lacks it)
    const size_t outs = std::max<size_t>(debug_outs_[pc], 1);
    for (size_t k = args.size() >= outs ? args.size() - outs : 0; k < args.size(); ++k) log(args[k]);
    if (!logged && !args.empty()) log(args[0]);  // an in-place operator (index_put_, copy_): the self it writes
  } else if (in.kind == Instruction::Kind::Delegate) {  // as ExecuTorch: every argument, inputs then outputs
    for (const EValue* v : args) log(v);
  }
}

size_t Method::delegate_steps(size_t d, std::span<BackendStepProfile> out) const {
  if (d >= delegates_.size()) return 0;
  const DelegateHandle& h = delegates_[d];
  return h.backend && h.backend->step_profile ? h.backend->step_profile(h.state, out) : 0;
}

size_t Method::delegate_profile(size_t d, std::span<BackendProfileEntry> out) const {
  if (d >= delegates_.size()) return 0;
  const DelegateHandle& h = delegates_[d];
  return h.backend && h.backend->profile ? h.backend->profile(h.state, out) : 0;
}

const char* Method::instruction_label(size_t i) const {
  const auto& in = instructions_[i];
  switch (in.kind) {
    case Instruction::Kind::Kernel: return operator_labels_[static_cast<size_t>(in.op_or_delegate)].c_str();
    case Instruction::Kind::Delegate: return delegate_labels_[static_cast<size_t>(in.op_or_delegate)].c_str();
    case Instruction::Kind::Move: return "move";
    case Instruction::Kind::JumpFalse: return "jump_false";
    case Instruction::Kind::Free: return "free";
  }
  return "?";
}

Status Method::set_input(size_t i, const void* data, size_t bytes, ErrorMessage* error) {
  if (i >= inputs_.size())
    return failure(error, Status::OutOfRange, "input %zu: the method has %zu inputs", i, inputs_.size());
  Tensor& t = *values_[static_cast<size_t>(inputs_[i])].scalar.t;
  if (bytes != t.nbytes())
    return failure(error, Status::InvalidArgument, "input %zu: %zu bytes given, the %s tensor needs %zu", i, bytes,
                   std::string(dtype_name(t.dtype)).c_str(), t.nbytes());
  if (input_planned_[i]) {
    if (bytes) std::memcpy(t.data, data, bytes);
  } else {
    t.data = const_cast<void*>(data);
  }
  return Status::Ok;
}

Status Method::set_input(size_t i, const void* data, size_t bytes, std::span<const int64_t> shape,
                         ErrorMessage* error) {
  if (i >= inputs_.size())
    return failure(error, Status::OutOfRange, "input %zu: the method has %zu inputs", i, inputs_.size());
  Tensor& t = *values_[static_cast<size_t>(inputs_[i])].scalar.t;
  if (!t.same_shape(shape)) {
    char want[160], have[160];
    shape_text(have, sizeof(have), t.shape());
    shape_text(want, sizeof(want), shape);
    if (!input_dynamic_[i])
      return failure(error, Status::InvalidArgument, "input %zu: shape %s given, the static input is %s", i, want,
                     have);
    if (shape.size() != static_cast<size_t>(t.dim))
      return failure(error, Status::InvalidArgument, "input %zu: shape %s given, the input has rank %d", i, want,
                     t.dim);
    size_t numel = 1;
    for (int64_t d : shape) numel *= d < 0 ? 0 : static_cast<size_t>(d);
    if (numel * static_cast<size_t>(element_size(t.dtype)) != bytes)
      return failure(error, Status::InvalidArgument, "input %zu: %zu bytes given for shape %s", i, bytes, want);
    if (resize_tensor(t, shape) != Status::Ok)
      return failure(error, Status::InvalidArgument,
                     "input %zu: shape %s exceeds the program's upper bound (%zu bytes planned)", i, want,
                     t.capacity_bytes);
  }
  return set_input(i, data, bytes, error);
}

Status Method::share_input(size_t i, void* data, size_t bytes, std::span<const int64_t> shape, bool* shared,
                           ErrorMessage* error) {
  *shared = false;
  if (i >= inputs_.size())
    return failure(error, Status::OutOfRange, "input %zu: the method has %zu inputs", i, inputs_.size());
  if (input_home_.size() != inputs_.size()) {
    input_home_.assign(inputs_.size(), nullptr);
    input_private_.assign(inputs_.size(), -1);
  }
  Tensor& t = *values_[static_cast<size_t>(inputs_[i])].scalar.t;
  if (input_planned_[i] && input_private_[i] < 0) {  // once: does any other tensor lie in its planned memory?
    const auto* lo = static_cast<const std::byte*>(t.data);
    const std::byte* hi = lo + std::max(t.capacity_bytes, t.nbytes());
    bool alone = lo != nullptr;
    for (const Tensor& o : tensors_) {
      if (&o == &t || o.data == nullptr) continue;
      const auto* olo = static_cast<const std::byte*>(o.data);
      const std::byte* ohi = olo + std::max<size_t>(std::max(o.capacity_bytes, o.nbytes()), 1);
      if (olo < hi && lo < ohi) alone = false;
    }
    input_private_[i] = alone ? 1 : 0;
    input_home_[i] = t.data;
  }
  if (input_planned_[i] && input_private_[i] == 0) return set_input(i, data, bytes, shape, error);
  // set_input's checks (shape, size), then its unplanned path: the input points at `data`
  const bool planned = input_planned_[i];
  input_planned_[i] = false;
  const Status s = set_input(i, data, bytes, shape, error);
  input_planned_[i] = planned;
  *shared = s == Status::Ok;
  return s;
}

void Method::unshare_inputs() {
  for (size_t i = 0; i < input_home_.size(); ++i)
    if (input_planned_[i] && input_home_[i] != nullptr) values_[static_cast<size_t>(inputs_[i])].scalar.t->data = input_home_[i];
}

Status Method::execute(ErrorMessage* error) {
  using Clock = std::chrono::steady_clock;
  KernelContext ctx;
  for (const auto& in : inputs_)
    if (values_[static_cast<size_t>(in)].scalar.t->data == nullptr && values_[static_cast<size_t>(in)].scalar.t->numel > 0)
      return failure(error, Status::InvalidArgument, "an input was not set");
  for (size_t k = 0; k < outputs_.size(); ++k) {
    if (!values_[static_cast<size_t>(outputs_[k])].is_tensor()) continue;  // a constant method's value
    const Tensor& t = *values_[static_cast<size_t>(outputs_[k])].scalar.t;
    if (t.data == nullptr && t.numel > 0)
      return failure(error, Status::NotSupported, "output %zu has no memory: the program did not plan it", k);
  }
  size_t pc = 0;
  while (pc < instructions_.size()) {
    const Instruction& in = instructions_[pc];
    Clock::time_point start;
    if (profiling_) start = Clock::now();
    size_t next = pc + 1;
    std::span<EValue*> args(arg_ptrs_.data() + in.args_begin, in.args_count);
    switch (in.kind) {
      case Instruction::Kind::Kernel:
        ctx.reset();
        in.fn(ctx, args);
        if (!ctx.ok())
          return failure(error, ctx.status(), "instruction %zu (%s): %s", pc, instruction_label(pc), ctx.message());
        for (uint32_t r = in.refresh_begin; r < in.refresh_begin + in.refresh_count; ++r)
          int_arena_[int_refresh_[r].first] = values_[static_cast<size_t>(int_refresh_[r].second)].scalar.i;
        break;
      case Instruction::Kind::Delegate: {
        const DelegateHandle& d = delegates_[static_cast<size_t>(in.op_or_delegate)];
        if (debug_log_) debug_log_->set_instruction(static_cast<uint32_t>(pc));  // what the delegate logs inside
        KILN_TRY(d.backend->execute(d.state, args, error));
        break;
      }
      case Instruction::Kind::Move:
        values_[static_cast<size_t>(in.b)] = values_[static_cast<size_t>(in.a)];
        break;
      case Instruction::Kind::JumpFalse: {
        // As ExecuTorch: the condition is a Bool, or a bool tensor that is true when all
        // its elements are; anything else is a malformed program (taking it as false
        // could turn a damaged instruction into an endless backward jump).
        const EValue& c = values_[static_cast<size_t>(in.a)];
        bool cond = true;
        if (c.tag == EValue::Tag::Bool) {
          cond = c.scalar.b;
        } else if (c.tag == EValue::Tag::Tensor && c.scalar.t->dtype == ScalarType::Bool &&
                   (c.scalar.t->data != nullptr || c.scalar.t->numel == 0)) {
          const auto* p = static_cast<const uint8_t*>(c.scalar.t->data);
          for (int64_t k = 0; k < c.scalar.t->numel && cond; ++k) cond = p[k] != 0;
        } else {
          return failure(error, Status::InvalidProgram,
                         "instruction %zu (jump_false): condition value %d is not a bool or a bool tensor", pc, in.a);
        }
        if (!cond) next = static_cast<size_t>(in.b);
        break;
      }
      case Instruction::Kind::Free: break;  // planned memory: nothing to release
    }
    if (profiling_) {
      const Clock::time_point end = Clock::now();
      InstructionProfile& p = profile_[pc];
      p.calls++;
      p.total_ns += static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(end - start).count());
      p.last_start_ns = static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(start.time_since_epoch()).count());
      p.last_end_ns = static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(end.time_since_epoch()).count());
    }
    if (debug_log_) log_debug_outputs(pc, in, args);
    pc = next;
  }
  return Status::Ok;
}

Result<Program> Program::load(const char* path, ErrorMessage* error) {
  Result<PteFile> f = PteFile::open(path, error);
  if (!f.ok()) return f.status();
  return Program(std::move(f.value()));
}

Result<Method> Program::load_method(const char* name, ErrorMessage* error) const {
  return load_method(name, MethodOptions{}, error);
}

// Program::load_method, as named steps over one execution plan, in order: each checks what it
// reads and fills its part of the Method; the first failure ends the load (the Method's
// destructor releases what the earlier steps made).
class MethodLoader {
 public:
  MethodLoader(const PteFile& file, const fb::ExecutionPlan& p, const char* plan_name, const MethodOptions& o,
               ErrorMessage* e, Method& method)
      : file_(file), plan(p), name(plan_name), options(o), error(e), m(method), sizes(p.non_const_buffer_sizes()),
        values(p.values()), n(len(values)) {}

  Status run() {
    KILN_TRY(plan_memory());
    KILN_TRY(size_arenas());
    KILN_TRY(load_tensors());
    KILN_TRY(load_values());
    KILN_TRY(bind_inputs_outputs());
    KILN_TRY(check_tensor_memory());
    KILN_TRY(resolve_kernels());
    KILN_TRY(init_delegates());
    KILN_TRY(load_instructions());
    KILN_TRY(check_loops());
    advise_gathered_tables();
    return Status::Ok;
  }

 private:
  bool value_index_ok(int64_t idx) const { return idx >= 0 && static_cast<size_t>(idx) < n; }

  // Planned memory: one zeroed, aligned buffer per memory id.
  Status plan_memory() {
    m.buffers_.assign(len(sizes), nullptr);
    for (size_t i = 1; i < len(sizes); ++i) {
      int64_t bytes = sizes->Get(static_cast<flatbuffers::uoffset_t>(i));
      if (bytes < 0) return failure(error, Status::InvalidProgram, "planned buffer %zu has negative size", i);
      size_t rounded = (static_cast<size_t>(bytes) + kBufferAlignment - 1) / kBufferAlignment * kBufferAlignment;
      m.buffers_[i] = alloc_planned(rounded);
      if (!m.buffers_[i]) return failure(error, Status::OutOfMemory, "cannot allocate %lld bytes of planned memory",
                                         static_cast<long long>(bytes));
      std::memset(m.buffers_[i], 0, rounded);
      m.planned_bytes_ += static_cast<uint64_t>(bytes);
    }
    return Status::Ok;
  }

  // The values' arenas, sized first, so spans into them stay valid.
  Status size_arenas() {
    size_t n_tensors = 0, n_ints = 0, n_doubles = 0, n_bools = 0, n_tensor_ptrs = 0;
    for (size_t i = 0; i < n; ++i) {
      const fb::EValue* v = values->Get(static_cast<flatbuffers::uoffset_t>(i));
      switch (v->val_type()) {
        case KernelTypes::Tensor: ++n_tensors; break;
        case KernelTypes::IntList: n_ints += len(v->val_as_IntList()->items()); break;
        case KernelTypes::DoubleList: n_doubles += len(v->val_as_DoubleList()->items()); break;
        case KernelTypes::BoolList: n_bools += len(v->val_as_BoolList()->items()); break;
        case KernelTypes::TensorList: n_tensor_ptrs += len(v->val_as_TensorList()->items()); break;
        case KernelTypes::OptionalTensorList: n_tensor_ptrs += len(v->val_as_OptionalTensorList()->items()); break;
        default: break;
      }
    }
    m.values_.resize(n);
    m.tensors_.resize(n_tensors);
    m.int_arena_.resize(n_ints);
    m.double_arena_.resize(n_doubles);
    m.bool_arena_.reset(new (std::nothrow) bool[n_bools + 1]);
    m.tensor_ptr_arena_.resize(n_tensor_ptrs);
    int_source_.assign(n_ints, -1);
    tensor_of_value_.assign(n, SIZE_MAX);
    return Status::Ok;
  }

  // Tensors first: lists refer to them by index.
  Status load_tensors() {
    for (size_t i = 0; i < n; ++i) {
      const fb::EValue* v = values->Get(static_cast<flatbuffers::uoffset_t>(i));
      if (v->val_type() != KernelTypes::Tensor) continue;
      const fb::Tensor* ft = v->val_as_Tensor();
      Tensor& t = m.tensors_[ti];
      tensor_of_value_[i] = ti++;
      t.dtype = static_cast<ScalarType>(ft->scalar_type());
      if (pte_element_size(static_cast<int8_t>(ft->scalar_type())) == 0)
        return failure(error, Status::NotSupported, "value %zu: tensor dtype code %d is not supported", i,
                       static_cast<int>(ft->scalar_type()));
      size_t rank = len(ft->sizes());
      if (rank > static_cast<size_t>(kMaxDims) || len(ft->dim_order()) != rank)
        return failure(error, Status::InvalidProgram, "value %zu: tensor rank %zu (dim order %zu) unsupported", i, rank,
                       len(ft->dim_order()));
      int64_t shape[kMaxDims];
      for (size_t d = 0; d < rank; ++d) {
        shape[d] = ft->sizes()->Get(static_cast<flatbuffers::uoffset_t>(d));
        if (shape[d] < 0) return failure(error, Status::InvalidProgram, "value %zu: negative size", i);
        uint8_t o = ft->dim_order()->Get(static_cast<flatbuffers::uoffset_t>(d));
        if (o >= rank) return failure(error, Status::InvalidProgram, "value %zu: dim order entry %u out of range", i, o);
        t.dim_order[d] = o;
      }
      t.dim = static_cast<int32_t>(rank);
      t.capacity_bytes = SIZE_MAX;
      if (resize_tensor(t, std::span<const int64_t>(shape, rank)) != Status::Ok)
        return failure(error, Status::InvalidProgram, "value %zu: bad tensor shape", i);
      const size_t nbytes = t.nbytes();
      if (ft->data_buffer_idx() > 0 && !ft->allocation_info()) {
        Result<std::span<const std::byte>> c = file_.constant(ft->data_buffer_idx(), error);
        if (!c.ok()) return c.status();
        if (c.value().size() < nbytes)
          return failure(error, Status::InvalidProgram, "value %zu: constant %u holds %zu bytes, the tensor needs %zu", i,
                         ft->data_buffer_idx(), c.value().size(), nbytes);
        t.data = const_cast<std::byte*>(c.value().data());
        t.capacity_bytes = nbytes;
      } else if (const fb::AllocationDetails* a = ft->allocation_info()) {
        uint64_t offset = (static_cast<uint64_t>(a->memory_offset_high()) << 32) | a->memory_offset_low();
        if (a->memory_id() == 0 || a->memory_id() >= m.buffers_.size())
          return failure(error, Status::InvalidProgram, "value %zu: memory id %u out of range", i, a->memory_id());
        uint64_t size = static_cast<uint64_t>(sizes->Get(a->memory_id()));
        if (offset > size || nbytes > size - offset)
          return failure(error, Status::InvalidProgram,
                         "value %zu: tensor at offset %llu (%zu bytes) overruns planned buffer %u of %llu bytes", i,
                         static_cast<unsigned long long>(offset), nbytes, a->memory_id(),
                         static_cast<unsigned long long>(size));
        t.data = m.buffers_[a->memory_id()] + offset;
        t.capacity_bytes = nbytes;
        if (ft->data_buffer_idx() > 0) {  // mutable tensor with an initial value
          const fb::ExtraTensorInfo* extra = ft->extra_tensor_info();
          Result<std::span<const std::byte>> c =
              file_.mutable_data(extra ? static_cast<size_t>(extra->mutable_data_segments_idx()) : 0,
                                 ft->data_buffer_idx(), error);
          if (!c.ok()) return c.status();
          if (c.value().size() < nbytes) return failure(error, Status::InvalidProgram, "value %zu: initial data too short", i);
          std::memcpy(t.data, c.value().data(), nbytes);
        }
      } else {
        t.data = nullptr;  // fed at run time
        t.capacity_bytes = nbytes;
      }
      // Kernels access elements as their C++ type: a constant or planned offset that is not
      // a multiple of the element's alignment (ExecuTorch aligns both to 16) is malformed.
      const size_t align = std::min<size_t>(static_cast<size_t>(element_size(t.dtype)), alignof(std::max_align_t));
      if (t.data != nullptr && nbytes > 0 && align > 1 && reinterpret_cast<uintptr_t>(t.data) % align != 0)
        return failure(error, Status::InvalidProgram, "value %zu: tensor data is not aligned to its %zu-byte elements", i,
                       align);
      m.values_[i] = EValue::from_tensor(&t);
    }
    return Status::Ok;
  }

  // The other values: scalars, strings, lists (of the arena slots the tensors and ints fill).
  Status load_values() {
    // a list's items copied into its arena from slot `next` on (advancing it)
    auto copy_items = [](const auto* items, auto* arena, size_t& next) {
      using T = std::remove_reference_t<decltype(*arena)>;
      const size_t begin = next;
      for (size_t k = 0; k < len(items); ++k) arena[next++] = static_cast<T>(items->Get(static_cast<flatbuffers::uoffset_t>(k)));
      return std::span<const T>(arena + begin, next - begin);
    };
    for (size_t i = 0; i < n; ++i) {
      const fb::EValue* v = values->Get(static_cast<flatbuffers::uoffset_t>(i));
      EValue& e = m.values_[i];
      switch (v->val_type()) {
        case KernelTypes::NONE:
        case KernelTypes::Null: e = EValue{}; break;
        case KernelTypes::Int: e = EValue::from_int(v->val_as_Int()->int_val()); break;
        case KernelTypes::Bool: e = EValue::from_bool(v->val_as_Bool()->bool_val()); break;
        case KernelTypes::Double: e = EValue::from_double(v->val_as_Double()->double_val()); break;
        case KernelTypes::String: {
          const auto* s = v->val_as_String()->string_val();
          e.tag = EValue::Tag::String;
          e.str = s ? std::string_view(s->c_str(), s->size()) : std::string_view();
          break;
        }
        case KernelTypes::Tensor: break;
        case KernelTypes::IntList: {
          const auto* items = v->val_as_IntList()->items();
          const size_t begin = ii;
          for (size_t k = 0; k < len(items); ++k) {
            int64_t idx = items->Get(static_cast<flatbuffers::uoffset_t>(k));
            if (!value_index_ok(idx) || values->Get(static_cast<flatbuffers::uoffset_t>(idx))->val_type() != KernelTypes::Int)
              return failure(error, Status::InvalidProgram, "value %zu: int list item %zu is not an Int value", i, k);
            int_source_[ii] = static_cast<int32_t>(idx);
            m.int_arena_[ii++] = values->Get(static_cast<flatbuffers::uoffset_t>(idx))->val_as_Int()->int_val();
          }
          e.tag = EValue::Tag::IntList;
          e.ints = std::span<const int64_t>(m.int_arena_.data() + begin, ii - begin);
          break;
        }
        case KernelTypes::DoubleList:
          e.tag = EValue::Tag::DoubleList;
          e.doubles = copy_items(v->val_as_DoubleList()->items(), m.double_arena_.data(), di);
          break;
        case KernelTypes::BoolList:
          e.tag = EValue::Tag::BoolList;
          e.bools = copy_items(v->val_as_BoolList()->items(), m.bool_arena_.get(), bi);
          break;
        case KernelTypes::TensorList:
        case KernelTypes::OptionalTensorList: {
          bool optional = v->val_type() == KernelTypes::OptionalTensorList;
          const auto* items = optional ? v->val_as_OptionalTensorList()->items() : v->val_as_TensorList()->items();
          const size_t begin = pi;
          for (size_t k = 0; k < len(items); ++k) {
            int32_t idx = items->Get(static_cast<flatbuffers::uoffset_t>(k));
            if (optional && idx == -1) {
              m.tensor_ptr_arena_[pi++] = nullptr;
              continue;
            }
            if (!value_index_ok(idx) || tensor_of_value_[static_cast<size_t>(idx)] == SIZE_MAX)
              return failure(error, Status::InvalidProgram, "value %zu: list item %zu is not a tensor value", i, k);
            m.tensor_ptr_arena_[pi++] = &m.tensors_[tensor_of_value_[static_cast<size_t>(idx)]];
          }
          e.tag = optional ? EValue::Tag::OptionalTensorList : EValue::Tag::TensorList;
          e.tensors = std::span<Tensor* const>(m.tensor_ptr_arena_.data() + begin, pi - begin);
          break;
        }
      }
    }
    return Status::Ok;
  }

  // Inputs and outputs.
  Status bind_inputs_outputs() {
    auto tensor_slot = [&](int32_t idx, const char* what, size_t k) -> Status {
      if (!value_index_ok(idx) || tensor_of_value_[static_cast<size_t>(idx)] == SIZE_MAX)
        return failure(error, Status::InvalidProgram, "%s %zu is not a tensor value", what, k);
      return Status::Ok;
    };
    for (size_t k = 0; k < len(plan.inputs()); ++k) {
      int32_t idx = plan.inputs()->Get(static_cast<flatbuffers::uoffset_t>(k));
      KILN_TRY(tensor_slot(idx, "input", k));
      m.inputs_.push_back(idx);
      m.input_planned_.push_back(m.values_[static_cast<size_t>(idx)].scalar.t->data != nullptr);
      const fb::Tensor* ft = values->Get(static_cast<flatbuffers::uoffset_t>(idx))->val_as_Tensor();
      m.input_dynamic_.push_back(ft != nullptr && ft->shape_dynamism() == fb::TensorShapeDynamism::DYNAMIC_BOUND);
    }
    for (size_t k = 0; k < len(plan.outputs()); ++k) {
      int32_t idx = plan.outputs()->Get(static_cast<flatbuffers::uoffset_t>(k));
      // a constant method (ExecuTorch's LLM metadata) returns Int, Bool or Double values
      const bool scalar = value_index_ok(idx) && (m.values_[static_cast<size_t>(idx)].tag == EValue::Tag::Int ||
                                                  m.values_[static_cast<size_t>(idx)].tag == EValue::Tag::Bool ||
                                                  m.values_[static_cast<size_t>(idx)].tag == EValue::Tag::Double);
      if (!scalar)
        KILN_TRY(tensor_slot(idx, "output", k));
      m.outputs_.push_back(idx);
    }
    return Status::Ok;
  }

  Status check_tensor_memory() {
    // A tensor that is neither constant nor planned gets memory only as a method input
    // (set_input) or output; any other such tensor would be handed to kernels as null.
    // ExecuTorch's executorch_prim::et_view (its dynamic programs' views) writes a tensor without
    // memory of its own: the kernel points it at its input's bytes.
    std::vector<bool> view_result(n, false);
    if (len(plan.chains()) == 1)
      for (size_t c = 0; c < len(plan.chains()->Get(0)->instructions()); ++c) {
        const auto* kc = plan.chains()->Get(0)->instructions()->Get(static_cast<flatbuffers::uoffset_t>(c))->instr_args_as_KernelCall();
        if (kc == nullptr || kc->op_index() < 0 || static_cast<size_t>(kc->op_index()) >= len(plan.operators()) || len(kc->args()) == 0)
          continue;
        const fb::Operator* op = plan.operators()->Get(static_cast<flatbuffers::uoffset_t>(kc->op_index()));
        if (op->name() == nullptr || op->name()->string_view() != "executorch_prim::et_view") continue;
        const int32_t r = kc->args()->Get(static_cast<flatbuffers::uoffset_t>(len(kc->args()) - 1));
        if (value_index_ok(r)) view_result[static_cast<size_t>(r)] = true;
      }
    for (size_t i = 0; i < n; ++i) {
      if (tensor_of_value_[i] == SIZE_MAX || view_result[i]) continue;
      const Tensor& t = m.tensors_[tensor_of_value_[i]];
      if (t.data != nullptr || t.nbytes() == 0) continue;
      const int32_t v = static_cast<int32_t>(i);
      if (std::find(m.inputs_.begin(), m.inputs_.end(), v) == m.inputs_.end() &&
          std::find(m.outputs_.begin(), m.outputs_.end(), v) == m.outputs_.end())
        return failure(error, Status::InvalidProgram,
                       "value %zu: tensor has no memory (not a constant, not planned, not an input or output)", i);
    }
    return Status::Ok;
  }

  // Operators -> kernels.
  Status resolve_kernels() {
    for (size_t k = 0; k < len(plan.operators()); ++k) {
      const fb::Operator* op = plan.operators()->Get(static_cast<flatbuffers::uoffset_t>(k));
      const char* opname = op->name() ? op->name()->c_str() : "";
      const char* overload = op->overload() ? op->overload()->c_str() : "";
      KernelFn fn = lookup_kernel(opname, overload);
      if (fn == nullptr)
        return failure(error, Status::NotFound, "operator %s.%s has no kernel in kiln's runtime", opname, overload);
      kernels.push_back(fn);
      const std::string_view on(opname);
      keeps_result.push_back(on.starts_with("executorch_prim::") || (on == "aten::sym_size" && std::string_view(overload) == "int"));
      m.operator_labels_.push_back(*overload ? std::string(opname) + "." + overload : std::string(opname));
    }
    return Status::Ok;
  }

  // Delegates -> backends.
  Status init_delegates() {
    for (size_t k = 0; k < len(plan.delegates()); ++k) {
      const fb::BackendDelegate* d = plan.delegates()->Get(static_cast<flatbuffers::uoffset_t>(k));
      const char* id = d->id() ? d->id()->c_str() : "";
      const Backend* backend = find_backend(id);
      if (backend == nullptr)
        return failure(error, Status::NotFound, "delegate %zu needs backend '%s', which this kiln runtime does not have",
                       k, id);
      size_t plan_index = 0;
      for (size_t p = 0; p < len(file_.program().execution_plan()); ++p)
        if (file_.program().execution_plan()->Get(static_cast<flatbuffers::uoffset_t>(p)) == &plan) plan_index = p;
      Result<std::span<const std::byte>> payload = file_.delegate_payload(plan_index, k, error);
      if (!payload.ok()) return payload.status();
      std::vector<CompileSpecView> specs;
      for (size_t s = 0; s < len(d->compile_specs()); ++s) {
        const fb::CompileSpec* cs = d->compile_specs()->Get(static_cast<flatbuffers::uoffset_t>(s));
        specs.push_back({cs->key() ? std::string_view(cs->key()->c_str(), cs->key()->size()) : std::string_view(),
                         cs->value() ? std::span<const std::byte>(reinterpret_cast<const std::byte*>(cs->value()->data()),
                                                                  cs->value()->size())
                                     : std::span<const std::byte>()});
      }
      // Whether a call of this delegate passes a dynamic-bound tensor (its sizes change per call)
      bool dynamic = false;
      if (len(plan.chains()) == 1)
        for (size_t c = 0; c < len(plan.chains()->Get(0)->instructions()) && !dynamic; ++c) {
          const fb::Instruction* ins = plan.chains()->Get(0)->instructions()->Get(static_cast<flatbuffers::uoffset_t>(c));
          const auto* dc = ins->instr_args_as_DelegateCall();
          if (dc == nullptr || dc->delegate_index() != static_cast<int32_t>(k)) continue;
          for (size_t a = 0; a < len(dc->args()); ++a) {
            const int32_t idx = dc->args()->Get(static_cast<flatbuffers::uoffset_t>(a));
            if (!value_index_ok(idx)) continue;  // reported with the instructions below
            const fb::Tensor* ft = values->Get(static_cast<flatbuffers::uoffset_t>(idx))->val_as_Tensor();
            dynamic |= ft != nullptr && ft->shape_dynamism() == fb::TensorShapeDynamism::DYNAMIC_BOUND;
          }
        }
      DelegateHandle h{backend, nullptr};
      const BackendInitContext ctx{file_, payload.value(), specs, options.backend, dynamic};
      KILN_TRY(backend->init(ctx, &h.state, error));
      m.delegates_.push_back(h);
      m.delegate_labels_.push_back(id);
    }
    return Status::Ok;
  }

  // Instructions (a single chain).
  Status load_instructions() {
    if (len(plan.chains()) != 1)
      return failure(error, Status::NotSupported, "plan '%s' has %zu chains; kiln runs single-chain plans", name,
                     len(plan.chains()));
    const fb::Chain* chain = plan.chains()->Get(0);
    size_t total_args = 0;
    for (size_t k = 0; k < len(chain->instructions()); ++k) {
      const fb::Instruction* ins = chain->instructions()->Get(static_cast<flatbuffers::uoffset_t>(k));
      if (ins->instr_args_type() == fb::InstructionArguments::KernelCall) total_args += len(ins->instr_args_as_KernelCall()->args());
      if (ins->instr_args_type() == fb::InstructionArguments::DelegateCall) total_args += len(ins->instr_args_as_DelegateCall()->args());
    }
    m.arg_ptrs_.reserve(total_args);
    const size_t n_instr = len(chain->instructions());
    written_.assign(n, false);
    for (size_t k = 0; k < n_instr; ++k) {
      const fb::Instruction* ins = chain->instructions()->Get(static_cast<flatbuffers::uoffset_t>(k));
      Method::Instruction mi;
      const flatbuffers::Vector<int32_t>* args = nullptr;
      switch (ins->instr_args_type()) {
        case fb::InstructionArguments::KernelCall: {
          const auto* kc = ins->instr_args_as_KernelCall();
          if (kc->op_index() < 0 || static_cast<size_t>(kc->op_index()) >= kernels.size())
            return failure(error, Status::InvalidProgram, "instruction %zu: operator index %d out of range", k, kc->op_index());
          mi.kind = Method::Instruction::Kind::Kernel;
          mi.fn = kernels[static_cast<size_t>(kc->op_index())];
          mi.op_or_delegate = kc->op_index();
          args = kc->args();
          break;
        }
        case fb::InstructionArguments::DelegateCall: {
          const auto* dc = ins->instr_args_as_DelegateCall();
          if (dc->delegate_index() < 0 || static_cast<size_t>(dc->delegate_index()) >= m.delegates_.size())
            return failure(error, Status::InvalidProgram, "instruction %zu: delegate index %d out of range", k,
                           dc->delegate_index());
          mi.kind = Method::Instruction::Kind::Delegate;
          mi.op_or_delegate = dc->delegate_index();
          args = dc->args();
          break;
        }
        case fb::InstructionArguments::MoveCall: {
          const auto* mc = ins->instr_args_as_MoveCall();
          if (!value_index_ok(mc->move_from()) || !value_index_ok(mc->move_to()))
            return failure(error, Status::InvalidProgram, "instruction %zu: move index out of range", k);
          // Every value keeps its kind, so inputs and outputs stay tensors and kernels see
          // only the kinds the loader checked.
          if (m.values_[static_cast<size_t>(mc->move_from())].tag != m.values_[static_cast<size_t>(mc->move_to())].tag)
            return failure(error, Status::InvalidProgram,
                           "instruction %zu: move from value %d to value %d of another kind", k, mc->move_from(),
                           mc->move_to());
          mi.kind = Method::Instruction::Kind::Move;
          mi.a = mc->move_from();
          mi.b = mc->move_to();
          written_[static_cast<size_t>(mi.b)] = true;
          break;
        }
        case fb::InstructionArguments::JumpFalseCall: {
          const auto* jc = ins->instr_args_as_JumpFalseCall();
          if (!value_index_ok(jc->cond_value_index()) || jc->destination_instruction() < 0 ||
              static_cast<size_t>(jc->destination_instruction()) > n_instr)
            return failure(error, Status::InvalidProgram, "instruction %zu: jump out of range", k);
          mi.kind = Method::Instruction::Kind::JumpFalse;
          mi.a = jc->cond_value_index();
          mi.b = jc->destination_instruction();
          break;
        }
        case fb::InstructionArguments::FreeCall:
          mi.kind = Method::Instruction::Kind::Free;
          break;
        default:
          return failure(error, Status::InvalidProgram, "instruction %zu: unknown kind", k);
      }
      if (args != nullptr) {
        mi.args_begin = static_cast<uint32_t>(m.arg_ptrs_.size());
        size_t count = len(args);
        // ExecuTorch's kernel calls end with a return-value slot that repeats the outs: not passed to kernels.
        // Scalar instructions (sym_size, executorch_prim) have no outs: their last slot is the value they write.
        if (mi.kind == Method::Instruction::Kind::Kernel && count > 0 &&
            !keeps_result[static_cast<size_t>(mi.op_or_delegate)])
          --count;
        for (size_t a = 0; a < len(args); ++a) {
          int32_t idx = args->Get(static_cast<flatbuffers::uoffset_t>(a));
          if (!value_index_ok(idx))
            return failure(error, Status::InvalidProgram, "instruction %zu: argument %zu value index %d out of range", k, a, idx);
          if (mi.kind == Method::Instruction::Kind::Delegate || a + 1 == len(args))
            written_[static_cast<size_t>(idx)] = true;
          if (a < count) m.arg_ptrs_.push_back(&m.values_[static_cast<size_t>(idx)]);
        }
        mi.args_count = static_cast<uint32_t>(count);
        if (mi.kind == Method::Instruction::Kind::Kernel && keeps_result[static_cast<size_t>(mi.op_or_delegate)] &&
            len(args) > 0) {
          const int32_t result = args->Get(static_cast<flatbuffers::uoffset_t>(len(args) - 1));
          const bool view = m.operator_labels_[static_cast<size_t>(mi.op_or_delegate)] == "executorch_prim::et_view.default";
          if (view && m.values_[static_cast<size_t>(result)].tag != EValue::Tag::Tensor)
            return failure(error, Status::InvalidProgram, "instruction %zu (et_view): its result value %d is not a Tensor", k,
                           result);
          if (!view && m.values_[static_cast<size_t>(result)].tag != EValue::Tag::Int)
            return failure(error, Status::InvalidProgram, "instruction %zu (%s): its result value %d is not an Int", k,
                           m.operator_labels_[static_cast<size_t>(mi.op_or_delegate)].c_str(), result);
          mi.refresh_begin = static_cast<uint32_t>(m.int_refresh_.size());
          for (size_t slot = 0; slot < int_source_.size(); ++slot)
            if (int_source_[slot] == result) m.int_refresh_.emplace_back(static_cast<uint32_t>(slot), result);
          mi.refresh_count = static_cast<uint32_t>(m.int_refresh_.size()) - mi.refresh_begin;
        }
      }
      m.instructions_.push_back(mi);
    }
    return Status::Ok;
  }

  Status check_loops() {
    // A backward jump on a Bool that is false and that no instruction can change loops
    // forever (a damaged instruction kind can make one); a loop's condition must be computed.
    for (size_t k = 0; k < m.instructions_.size(); ++k) {
      const Method::Instruction& mi = m.instructions_[k];
      if (mi.kind != Method::Instruction::Kind::JumpFalse || static_cast<size_t>(mi.b) > k) continue;
      const EValue& c = m.values_[static_cast<size_t>(mi.a)];
      if (c.tag == EValue::Tag::Bool && !c.scalar.b && !written_[static_cast<size_t>(mi.a)])
        return failure(error, Status::InvalidProgram,
                       "instruction %zu: jumps back to instruction %d on value %d, which is always false: the plan never "
                       "ends", k, mi.b, mi.a);
    }
    return Status::Ok;
  }

  // Embedding tables (constants in the file that only lookups read: aten::embedding, ExecuTorch's quantized
  // embedding_byte/4bit/2bit lookups, index_select) are read a few rows a call: their pages are advised for
  // sparse reads (PteFile::advise_sparse), so that a step brings in the rows it gathers and not the huge
  // pages around them (Gemma 4 E2B's per-layer table is 2.35 GB in int8, its rows 9 KB). A table that any
  // other instruction or delegate also reads (a tied LM head reading it whole) keeps the default advice.
  void advise_gathered_tables() {
    constexpr size_t kMinTable = size_t{2} << 20;  // below a huge page nothing is gained
    auto table_args = [](std::string_view label) -> size_t {  // leading arguments that are the table's data
      if (label == "aten::embedding.out" || label == "aten::index_select.out") return 1;
      if (label.starts_with("quantized_decomposed::embedding_")) return 3;  // weight, scales, zero points
      return 0;
    };
    std::vector<uint8_t> use(n, 0);  // 0: not read, 1: read only as a table, 2: read otherwise
    for (const Method::Instruction& in : m.instructions_) {
      size_t tables = 0;
      if (in.kind == Method::Instruction::Kind::Kernel)
        tables = table_args(m.operator_labels_[static_cast<size_t>(in.op_or_delegate)]);
      else if (in.kind == Method::Instruction::Kind::Move)
        use[static_cast<size_t>(in.a)] = 2;
      for (uint32_t a = 0; a < in.args_count; ++a) {
        const auto v = static_cast<size_t>(m.arg_ptrs_[in.args_begin + a] - m.values_.data());
        use[v] = a < tables && use[v] != 2 ? 1 : 2;
      }
    }
    for (size_t v = 0; v < n; ++v) {
      if (use[v] != 1 || !m.values_[v].is_tensor()) continue;
      const Tensor& t = *m.values_[v].scalar.t;
      const auto* p = static_cast<const std::byte*>(t.data);
      const std::span<const std::byte> file = file_.bytes();
      if (t.nbytes() < kMinTable || p < file.data() || p + t.nbytes() > file.data() + file.size()) continue;
      file_.advise_sparse(std::span<const std::byte>(p, t.nbytes()));
    }
  }

  const PteFile& file_;
  const fb::ExecutionPlan& plan;
  const char* name;
  const MethodOptions& options;
  ErrorMessage* error;
  Method& m;
  const flatbuffers::Vector<int64_t>* sizes;       // planned buffers' bytes, by memory id
  const flatbuffers::Vector<flatbuffers::Offset<fb::EValue>>* values;
  const size_t n;                                  // values
  size_t ti = 0, ii = 0, di = 0, bi = 0, pi = 0;   // next slot of tensors_ and of each arena
  std::vector<int32_t> int_source_;                // per int_arena_ slot: the Int value it copies
  std::vector<size_t> tensor_of_value_;            // per value: its index in tensors_, or SIZE_MAX
  std::vector<KernelFn> kernels;                   // per operator
  std::vector<bool> keeps_result;                  // scalar instructions: their result slot is their output
  // Values an instruction may replace: move targets, a kernel call's result slot (its last
  // argument: the outs, or the value a scalar op produces), any delegate call argument.
  std::vector<bool> written_;
};

Result<Method> Program::load_method(const char* name, const MethodOptions& options, ErrorMessage* error) const {
  Result<const fb::ExecutionPlan*> found = file_.plan(name, error);
  if (!found.ok()) return found.status();
  Method m;
  m.name_ = name;
  KILN_TRY(MethodLoader(file_, *found.value(), name, options, error, m).run());
  m.profile_.assign(m.instructions_.size(), InstructionProfile{});
  if (options.profiling) m.enable_profiling(true);
  return m;
}

}  // namespace kiln::rt
