// kiln's runtime backend for XNNPACK delegate payloads (see
// include/kiln/backends/xnnpack/runtime.h for what it does): the rt::Backend, its options and
// thread pools. The planner that builds a delegate's State is builder.h's passes; the node
// kinds it knows are nodes/; the steps on kiln's code are steps.cpp.
//
// Payload layout (ExecuTorch's XNNPACK delegate, as both kiln and ExecuTorch
// write it): a 30-byte header -- 4 bytes, the magic "XH00", u16 header length,
// u32 flatbuffer offset, u32 flatbuffer size, u32 constant-data offset, u64
// constant-data size, little-endian -- then the XNNGraph flatbuffer
// (schema/xnnpack_graph.fbs) and the inline constant bytes. A constant is
// either an (offset, size) in that region or a key of the program's named data.
// The delegate call's arguments are the graph's external inputs, then its
// external outputs, each in increasing external_id order.
//
// Runtime code: no exceptions, no RTTI; init allocates, execute does not.

#include "kiln/backends/xnnpack/runtime.h"

#include "builder.h"
#include "kiln/runtime/backend.h"

#include <xnnpack.h>

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <vector>

namespace kiln::backends::xnnpack {

using namespace detail;
using rt::EValue;

Status detail::fail(ErrorMessage* error, Status s, const char* format, ...) {
  va_list ap;
  va_start(ap, format);
  rt::vfailure(error, s, "XnnpackBackend: ", format, ap);
  va_end(ap);
  return s;
}

namespace {

bool xnn_ready = false;  // xnn_initialize succeeded (register_runtime_backend)

// fp16 arguments (Value::half): an fp32 tensor of each one's payload sizes for the plan to read or write.
void stage_half_args(State& st) {
  const size_t n = st.arg_values.size();
  st.half_arg.assign(n, 0);
  for (size_t a = 0; a < n; ++a) st.half_arg[a] = st.values[st.arg_values[a]].half ? 1 : 0;
  if (std::find(st.half_arg.begin(), st.half_arg.end(), 1) == st.half_arg.end()) {
    st.half_arg.clear();
    return;
  }
  st.half_staged.assign(n, rt::Tensor{});
  st.half_values.assign(n, EValue{});
  st.half_call.assign(n, nullptr);
  st.half_buffers.resize(n);
  for (size_t a = 0; a < n; ++a) {
    if (!st.half_arg[a]) continue;
    const Value& v = st.values[st.arg_values[a]];
    st.half_buffers[a].assign(static_cast<size_t>(std::max<int64_t>(v.numel, 1)), 0.0f);
    st.half_values[a] = EValue::from_tensor(&st.half_staged[a]);
  }
}

Status init(const rt::BackendInitContext& ctx, void** state, ErrorMessage* error) {
  auto st = std::unique_ptr<State>(new (std::nothrow) State);
  if (!st) return fail(error, Status::OutOfMemory, "out of memory");
  st->dynamic = ctx.dynamic_shapes;
  KILN_TRY(plan_payload(&ctx.file, ctx.payload, ctx.options, *st, error));
  stage_half_args(*st);
  *state = st.release();
  return Status::Ok;
}

// A call with fp16 arguments: each converted to (an input) or from (an output) its fp32 stand-in around the
// fp32 plan; fp32 arithmetic inside, one rounding per output (nearest even), as eager's float16 CPU kernels do.
Status execute_half(State& st, std::span<EValue*> args, ErrorMessage* error) {
  if (args.size() != st.half_arg.size())
    return fail(error, Status::InvalidArgument, "the call passes %zu arguments, the graph has %zu inputs and outputs",
                args.size(), st.half_arg.size());
  for (size_t a = 0; a < args.size(); ++a) {
    if (!st.half_arg[a]) {
      st.half_call[a] = args[a];
      continue;
    }
    if (!args[a] || !args[a]->is_tensor() || args[a]->tensor().dtype != ScalarType::Half || !args[a]->tensor().data ||
        !args[a]->tensor().is_contiguous() || args[a]->tensor().numel > static_cast<int64_t>(st.half_buffers[a].size()))
      return fail(error, Status::InvalidArgument, "argument %zu is not a contiguous float16 tensor of at most %zu elements",
                  a, st.half_buffers[a].size());
    const rt::Tensor& t = args[a]->tensor();
    rt::Tensor& s = st.half_staged[a];
    KILN_TRY(rt::make_contiguous_tensor(s, ScalarType::Float, t.shape(), st.half_buffers[a].data(),
                                        st.half_buffers[a].size() * sizeof(float)));
    if (a < st.num_inputs) {
      const auto* h = static_cast<const uint16_t*>(t.data);
      for (int64_t i = 0; i < t.numel; ++i) st.half_buffers[a][static_cast<size_t>(i)] = half_bits_to_float_exact(h[i]);
    }
    st.half_call[a] = &st.half_values[a];
  }
  KILN_TRY(execute_state(st, st.half_call, error));
  for (size_t a = st.num_inputs; a < args.size(); ++a) {
    if (!st.half_arg[a]) continue;
    const rt::Tensor& s = st.half_staged[a];
    rt::Tensor& t = args[a]->tensor();
    if (!t.same_shape(s.shape()) && rt::resize_tensor(t, s.shape()) != Status::Ok)
      return fail(error, Status::InvalidArgument, "output %zu cannot hold %lld elements", a - st.num_inputs,
                  static_cast<long long>(s.numel));
    auto* h = static_cast<uint16_t*>(t.data);
    for (int64_t i = 0; i < s.numel; ++i) h[i] = float_to_half_bits_rne(st.half_buffers[a][static_cast<size_t>(i)]);
  }
  return Status::Ok;
}

Status execute(void* opaque, std::span<EValue*> args, ErrorMessage* error) {
  State& st = *static_cast<State*>(opaque);
  return st.half_arg.empty() ? execute_state(st, args, error) : execute_half(st, args, error);
}

void destroy(void* opaque) { delete static_cast<State*>(opaque); }

void enable_profiling(void* opaque, bool on) {
  auto& st = *static_cast<State*>(opaque);
  st.profiling = on;
  for (Step& s : st.steps) s.calls = s.total_ns = s.last_start_ns = s.last_end_ns = 0;
  for (auto& p : st.plans) enable_profiling(p.get(), on);
}

// One entry per step label (summed), in order of first appearance.
size_t profile(const void* opaque, std::span<rt::BackendProfileEntry> out) {
  const auto& root = *static_cast<const State*>(opaque);
  const State& st = root.last ? *root.last : root;  // the plan of the last call's sizes
  std::vector<const std::string*> labels;
  std::vector<rt::BackendProfileEntry> sums;
  for (const Step& s : st.steps) {
    size_t k = 0;
    while (k < labels.size() && *labels[k] != s.label) ++k;
    if (k == labels.size()) {
      labels.push_back(&s.label);
      sums.push_back({s.label.c_str(), 0, 0});
    }
    sums[k].calls += s.calls;
    sums[k].total_ns += s.total_ns;
  }
  for (size_t k = 0; k < sums.size() && k < out.size(); ++k) out[k] = sums[k];
  return sums.size();
}

// Every step, in execution order (rt::BackendStepProfile).
size_t step_profile(const void* opaque, std::span<rt::BackendStepProfile> out) {
  const auto& root = *static_cast<const State*>(opaque);
  const State& st = root.last ? *root.last : root;  // the plan of the last call's sizes
  for (size_t k = 0; k < st.steps.size() && k < out.size(); ++k) {
    const Step& s = st.steps[k];
    out[k] = {s.label.c_str(), s.debug_handles.data(), s.debug_handles.size(), s.calls, s.total_ns,
              s.last_start_ns, s.last_end_ns, s.last_read, s.last_read >= 0 ? (s.trans_b ? s.n : s.k) : 0};
  }
  return st.steps.size();
}

void enable_debug_outputs(void* opaque, rt::DebugOutputLog* log) {
  detail::enable_debug_outputs(*static_cast<State*>(opaque), log);
}

const rt::Backend kBackend{"XnnpackBackend", init, execute, destroy, enable_profiling, profile, step_profile,
                           enable_debug_outputs};

}  // namespace

Status detail::plan_payload(const rt::PteFile* file, std::span<const std::byte> payload, const rt::BackendOptions& o,
                            State& st, ErrorMessage* error) {
  if (!xnn_ready) return fail(error, Status::NotSupported, "XNNPACK is not initialized on this CPU");
  Engine engine = Engine::Kiln;
  if (o.engine != nullptr && std::string_view(o.engine) == "xnnpack") {
    engine = Engine::Xnnpack;
  } else if (o.engine != nullptr && *o.engine != '\0' && std::string_view(o.engine) != "kiln") {
    return fail(error, Status::InvalidArgument, "unknown engine '%s' (kiln or xnnpack)", o.engine);
  }
  st.engine = engine;
  st.per_node = o.profiling_detail;
  st.pool = shared_pool(std::max<size_t>(1, o.threads));
  st.exec.pool = st.pool.get();
  st.exec.threads = st.pool ? static_cast<int64_t>(st.pool->threads()) : 1;
  st.file = file;
  st.payload = payload;
  Builder b(file, error);
  if (st.dynamic) b.plan_for(nullptr, {});  // one layout of the weights for every size
  return b.build(payload, st);
}

std::shared_ptr<cpu::ThreadPool> detail::shared_pool(size_t threads) {
  if (threads <= 1) return nullptr;
  static std::mutex mu;
  static std::vector<std::pair<size_t, std::weak_ptr<cpu::ThreadPool>>> pools;
  std::lock_guard<std::mutex> lock(mu);
  for (auto& [n, weak] : pools)
    if (n == threads)
      if (auto p = weak.lock()) return p;
  auto p = std::make_shared<cpu::ThreadPool>(threads);
  if (p->threads() <= 1) return nullptr;  // no pool could be made: the calling thread
  std::erase_if(pools, [](const auto& e) { return e.second.expired(); });
  pools.emplace_back(threads, p);
  return p;
}

bool register_runtime_backend() {
  if (!xnn_ready) {
    if (xnn_initialize(nullptr) != xnn_status_success) return false;
    xnn_ready = true;
  }
  if (rt::find_backend(kBackend.id) == &kBackend) return true;
  return rt::register_backend(&kBackend);
}

}  // namespace kiln::backends::xnnpack
