// The XNNPACK backend's executor (builder.h): a call binds its tensors to a plan (for a dynamic
// delegate, the plan for its sizes) and runs the plan's steps. Allocates nothing, but for a
// dynamic delegate's first call of new sizes (a new plan).
#include "builder.h"
#include "kiln/cpu/gemm.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <memory>
#include <new>

namespace kiln::backends::xnnpack::detail {

namespace {

Status run_plan(State& st, std::span<EValue*> args, ErrorMessage* error);

// Whether a call's tensor has a value's sizes (a 0-d tensor is a payload's [1]: XNNPACK has no 0-d values).
bool same_sizes(const rt::Tensor& t, const Value& v) {
  if (t.dim == 0) return v.numel == 1;
  return static_cast<uint32_t>(t.dim) == v.ndims && std::equal(v.dims.begin(), v.dims.begin() + v.ndims, t.sizes);
}

// Whether the call's inputs have the sizes `st` is planned for.
bool inputs_match(const State& st, std::span<EValue*> args) {
  for (size_t a = 0; a < st.num_inputs && a < args.size(); ++a) {
    if (!args[a] || !args[a]->is_tensor()) return true;  // reported by run_plan
    if (!same_sizes(args[a]->tensor(), st.values[st.arg_values[a]])) return false;
  }
  return true;
}

}  // namespace

// Runs the call on the plan for its input sizes: `st` itself, or for a dynamic delegate the plan
// made for these sizes, made now if no recent call had them.
Status execute_state(State& st, std::span<EValue*> args, ErrorMessage* error) {
  if (args.size() != st.arg_values.size())
    return fail(error, Status::InvalidArgument, "the call passes %zu arguments, the graph has %zu inputs and outputs",
                args.size(), st.arg_values.size());
  if (!st.dynamic || inputs_match(st, args)) {
    st.last = nullptr;
    return run_plan(st, args, error);
  }
  size_t found = st.plans.size();
  for (size_t p = 0; p < st.plans.size() && found == st.plans.size(); ++p)
    if (inputs_match(*st.plans[p], args)) found = p;
  if (found == st.plans.size()) {  // a plan for these sizes (allocates: once per new set of sizes)
    auto plan = std::unique_ptr<State>(new (std::nothrow) State);
    if (!plan) return fail(error, Status::OutOfMemory, "out of memory");
    plan->engine = st.engine;
    plan->per_node = st.per_node;
    plan->pool = st.pool;
    plan->exec = st.exec;
    plan->profiling = st.profiling;
    plan->debug_log = st.debug_log;
    plan->resizes_outputs = true;
    plan->owner = &st;
    Builder b(st.file, error);
    b.plan_for(&st, args);
    KILN_TRY(b.build(st.payload, *plan));
    if (st.plans.size() == State::kMaxPlans) st.plans.pop_back();
    st.plans.insert(st.plans.begin(), std::move(plan));
    found = 0;
  } else if (found != 0) {
    std::rotate(st.plans.begin(), st.plans.begin() + static_cast<std::ptrdiff_t>(found),
                st.plans.begin() + static_cast<std::ptrdiff_t>(found + 1));
    found = 0;
  }
  st.last = st.plans[found].get();
  return run_plan(*st.last, args, error);
}

namespace {

// The LM head's table when the call passes it (the tied embedding: a constant of the program, which
// the embedding lookup outside the delegate reads too): the first call copies it into weight_memory
// (see Builder::in_weight_memory), if it lies in the program's file, and later calls with the same
// table read the copy; any other tensor (one that could change between calls) is read as passed.
Status table_in_weight_memory(State& st, const Step& step, const float** w, ErrorMessage* error) {
  State& owner = st.owner ? *st.owner : st;
  if (!owner.file || (step.m >= kGemvRows && !owner.dynamic)) return Status::Ok;  // a GEMM: in place
  const std::span<const std::byte> file = owner.file->bytes();
  const auto* p = reinterpret_cast<const std::byte*>(*w);
  const size_t bytes = static_cast<size_t>(step.n * step.k) * sizeof(float);
  if (p < file.data() || p + bytes > file.data() + file.size()) return Status::Ok;
  return copy_to_weight_memory(owner, owner.file, std::span<const std::byte>(p, bytes), true, w, error);
}

// The same table for a GEMM (many rows of a static delegate, where the selected GEMM packs its B once:
// cpu::sgemm_pack_once): the first call packs Wᵀ as the GEMM's column panels (kiln's memory, the file's
// pages released: the embedding's lookup reads back only its tokens' rows), later calls read the panels.
// *panels stays null for a table outside the file (it could change between calls): the product packs x.
Status table_panels(State& st, const Step& step, const float* w, const float** panels, ErrorMessage* error) {
  State& owner = st.owner ? *st.owner : st;
  if (!owner.file) return Status::Ok;
  const std::span<const std::byte> file = owner.file->bytes();
  const auto* p = reinterpret_cast<const std::byte*>(w);
  const size_t bytes = static_cast<size_t>(step.n * step.k) * sizeof(float);
  if (p < file.data() || p + bytes > file.data() + file.size()) return Status::Ok;
  return table_panels_once(owner, owner.file, w, step.n, step.k, panels, error);
}

// Binds the call's tensors and runs the steps of one plan.
// Each token, the steps' descriptions (the Step structs, their operand and row-op arrays, the
// storage groups they name) are cold: the weights streamed since have evicted them, and reading
// each where its step starts costs a few misses to memory per step (perf: the first loads of
// run_plan, ~5% of a SmolLM2 8da4w decode step of 1175 steps). So each step fetches what the
// next ones will read, in stages: step i + 3's struct, step i + 2's arrays, step i + 1's groups.
inline void prefetch_lines(const void* p, size_t bytes) {
  const char* c = static_cast<const char*>(p);
  for (size_t o = 0; o < bytes; o += 64) __builtin_prefetch(c + o);
}

void prefetch_ahead(const State& st, size_t si) {
  const size_t n = st.steps.size();
  if (si + 3 < n) prefetch_lines(&st.steps[si + 3], sizeof(Step));
  if (si + 2 < n) {
    const Step& s = st.steps[si + 2];
    prefetch_lines(s.in.data(), s.in.size() * sizeof(Operand));
    prefetch_lines(s.row_ops.data(), s.row_ops.size() * sizeof(RowOp));
  }
  if (si + 1 < n) {
    const Step& s = st.steps[si + 1];
    auto group = [&](int32_t g) {
      if (g >= 0 && static_cast<size_t>(g) < st.groups.size()) __builtin_prefetch(&st.groups[static_cast<size_t>(g)]);
    };
    group(s.out.group);
    for (const Operand& o : s.in) group(o.group);
    for (const RowOp& op : s.row_ops) {
      if (op.a.src == RowOperand::Src::Memory) group(op.a.index);
      if (op.b.src == RowOperand::Src::Memory) group(op.b.index);
      if (op.write_group >= 0) group(op.write_group);
    }
  }
}

Status run_plan(State& st, std::span<EValue*> args, ErrorMessage* error) {
  if (st.arena == nullptr && st.arena_bytes > 0) {  // a dynamic delegate's plan at its upper bounds, first run
    KILN_TRY(ensure_arena(st, error));
    KILN_TRY(setup_subgraphs(st, error));
  }
  if (st.resizes_outputs || st.dynamic)  // the outputs get this call's sizes (dynamic-bound tensors)
    for (size_t a = st.num_inputs; a < args.size(); ++a) {
      if (!args[a] || !args[a]->is_tensor()) continue;  // reported below
      const Value& v = st.values[st.arg_values[a]];
      rt::Tensor& t = args[a]->tensor();
      if (same_sizes(t, v)) continue;
      if (rt::resize_tensor(t, std::span<const int64_t>(v.dims.data(), v.ndims)) != Status::Ok)
        return fail(error, Status::InvalidArgument, "output %zu cannot hold %lld elements", a - st.num_inputs,
                    static_cast<long long>(v.numel));
    }
  bool rebind = false;
  for (size_t a = 0; a < args.size(); ++a) {
    if (!args[a] || !args[a]->is_tensor() || args[a]->tensor().dtype != ScalarType::Float ||
        args[a]->tensor().numel != st.arg_numel[a] || !args[a]->tensor().data)
      return fail(error, Status::InvalidArgument, "argument %zu is not a float tensor of %lld elements", a,
                  static_cast<long long>(st.arg_numel[a]));
    if (!args[a]->tensor().is_contiguous())  // the steps read and write every tensor in its sizes' row-major order
      return fail(error, Status::NotSupported,
                  "argument %zu is not contiguous (only identity dim order is supported, as in the portable kernels)", a);
    if (st.bound_args[a] != args[a]->tensor().data) rebind = true;
  }
  if (rebind) {
    for (Step& step : st.steps) {
      if (step.kind != StepKind::Subgraph || !step.binds_args) continue;
      for (size_t e = 0; e < step.externals.size(); ++e) {
        const Storage& sto = st.groups[static_cast<size_t>(step.external_groups[e])].storage;
        if (sto.kind == Storage::Kind::Arg) step.externals[e].data = args[sto.arg]->tensor().data;
      }
      if (xnn_setup_runtime(step.runtime, step.externals.size(), step.externals.data()) != xnn_status_success)
        return fail(error, Status::Internal, "xnn_setup_runtime failed");
    }
    for (size_t a = 0; a < args.size(); ++a) st.bound_args[a] = args[a]->tensor().data;
  }
  using Clock = std::chrono::steady_clock;
  const size_t nsteps = st.steps.size();
  for (size_t si = 0; si < nsteps; ++si) {
    Step& step = st.steps[si];
    prefetch_ahead(st, si);
    Clock::time_point t0;
    if (st.profiling) t0 = Clock::now();
    auto in = [&](size_t j) { return step.in[j].data(st.groups, st.arena, args); };
    auto* out = const_cast<float*>(step.out.group >= 0 ? step.out.data(st.groups, st.arena, args) : nullptr);
    switch (step.kind) {
      case StepKind::Subgraph:
        if (xnn_invoke_runtime(step.runtime) != xnn_status_success)
          return fail(error, Status::Internal, "xnn_invoke_runtime failed");
        break;
      case StepKind::FullyConnected: run_fully_connected(st.exec, step, in(0), out); break;
      case StepKind::QuantizeRows: run_quantize_rows(st.exec, step, in(0), out); break;
      case StepKind::QFullyConnected: run_qfully_connected(st.exec, step, in(0), out); break;
      case StepKind::Rows: run_rows(st.exec, step, st.groups, st.arena, args); break;
      case StepKind::Bmm: {
        const LiveSpan* live = nullptr;
        if (step.live_mask.group >= 0) {
          st.live = live_span(step.live_mask.data(st.groups, st.arena, args), step.live_mask_period, step.n);
          live = &st.live;
        } else if (step.live_k) {
          live = &st.live;
        }
        if (live != nullptr) step.last_read = live->count();
        run_bmm(st.exec, step, in(0), in(1), out, live);
        break;
      }
      case StepKind::LmHead: {
        const float* w = in(0);
        const float* panels = step.weights_panels ? step.weights : nullptr;
        if (step.in[0].group >= 0 &&
            st.groups[static_cast<size_t>(step.in[0].group)].storage.kind == Storage::Kind::Arg) {
          const State& owner = st.owner ? *st.owner : st;
          if (step.m >= kGemvRows && !owner.dynamic && cpu::sgemm_pack_once())
            KILN_TRY(table_panels(st, step, w, &panels, error));
          else
            KILN_TRY(table_in_weight_memory(st, step, &w, error));
        }
        if (static_cast<size_t>(lm_head_scratch_floats(step.m, step.k)) > step.scratch.size())
          return fail(error, Status::Internal, "LM head: %lld rows, more than its scratch was planned for", static_cast<long long>(step.m));
        run_lm_head(st.exec, step, w, panels, in(1), out);
        break;
      }
      case StepKind::Transpose: run_transpose(st.exec, step, in(0), out); break;
      case StepKind::Slice: run_slice(st.exec, step, in(0), out); break;
      case StepKind::Unary: case StepKind::Copy: case StepKind::Clamp: run_unary(st.exec, step, in(0), out); break;
      case StepKind::Concat: {
        std::array<const float*, 5> ins{};
        for (size_t j = 0; j < step.in.size(); ++j) ins[j] = in(j);
        run_concat(step, std::span<const float* const>(ins.data(), step.in.size()), out);
        break;
      }
    }
    if (st.profiling) {
      const Clock::time_point t1 = Clock::now();
      step.calls++;
      step.total_ns += static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(t1 - t0).count());
      step.last_start_ns = static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(t0.time_since_epoch()).count());
      step.last_end_ns = static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(t1.time_since_epoch()).count());
    }
    if (st.debug_log) [[unlikely]] log_step_output(st, step, args);  // off: one predictable test per step
  }
  return Status::Ok;
}

}  // namespace

}  // namespace kiln::backends::xnnpack::detail
