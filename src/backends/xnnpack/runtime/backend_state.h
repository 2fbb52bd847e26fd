// Internal to kiln's XNNPACK backend: the state a delegate keeps from init to
// execute (values, their storage, the steps), the thread pool, and the steps
// that run on kiln's own code (steps.cpp). xnnpack_backend.cpp builds them.
#pragma once

#include "kiln/backends/xnnpack/runtime.h"
#include "kiln/cpu/threadpool.h"
#include "kiln/runtime/backend.h"
#include "kiln/runtime/evalue.h"
#include "kiln/runtime/program.h"

#include <xnnpack.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

namespace kiln::backends::xnnpack::detail {

using rt::EValue;

constexpr uint32_t kInvalidId = 0xFFFFFFFFu;
constexpr uint32_t kExternalInput = 1u, kExternalOutput = 2u;
constexpr size_t kMaxRank = 6;        // XNN_MAX_TENSOR_DIMS
constexpr size_t kArenaAlign = 64;
constexpr int64_t kGemvRows = 16;     // below this many rows, fully-connected products stream W (GEMV)

// ---------------------------------------------------------------- thread pool

// How a delegate runs: the pool its method's options asked for (rt::BackendOptions::threads
// at init), shared with every delegate of the same size. Null pool: the calling thread only.
// Loops are split into about this many pieces per thread: the pool hands them
// out one at a time, so the threads stay busy to the end and a thread that is
// descheduled holds up one small piece (cpu/threadpool.h).
inline constexpr int64_t kTasksPerThread = 8;
// ...but no piece of an elementwise loop (a fused row chain, a transpose) smaller than this many
// elements: waking the other thread and joining it costs about what ~4K elements of such work do,
// so a one-token step's small chains (a head's 64-wide rows, 576-wide norms) run on the caller.
inline constexpr int64_t kMinTaskElements = 4096;
// Pieces for an elementwise loop of `units` (rows, blocks) covering `elements`: at most `cap`, at
// least kMinTaskElements elements each, at least 1.
inline int64_t elementwise_pieces(int64_t units, int64_t cap, int64_t elements) {
  return std::max<int64_t>(1, std::min({units, cap, elements / kMinTaskElements}));
}

struct Exec {
  cpu::ThreadPool* pool = nullptr;
  int64_t threads = 1;
  // f(i) for i < n over the pool (on this thread when there is none).
  template <typename F>
  void parallel_for(size_t n, const F& f) const {
    if (pool != nullptr) {
      pool->parallel_for(n, f);
      return;
    }
    for (size_t i = 0; i < n; ++i) f(i);
  }
  // The pthreadpool XNNPACK runtimes are created with (null: single-threaded).
  pthreadpool_t raw_pool() const { return pool != nullptr ? pool->raw() : nullptr; }
};

// The process's pool of `threads` threads, created on first use and kept while a
// delegate holds it (null for 1 thread or if no pool can be created).
std::shared_ptr<cpu::ThreadPool> shared_pool(size_t threads);

// ---------------------------------------------------------------- values

// Where a value's bytes are at execute time.
struct Storage {
  enum class Kind : uint8_t { None, Arena, Arg, Static } kind = Kind::None;
  uint32_t arg = 0;            // Arg: index into the delegate call's arguments
  size_t offset = 0;           // Arena: byte offset
  const void* data = nullptr;  // Static: constant bytes
};

struct Value {
  bool defined = false;
  uint32_t ndims = 0;
  std::array<int64_t, kMaxRank> dims{};
  int64_t numel = 1;
  uint32_t external_id = 0;
  uint32_t flags = 0;
  const void* constant = nullptr;     // static data, or null
  std::span<const std::byte> constant_bytes;
  int32_t group = -1;                 // reshape group (values sharing bytes)
  uint32_t elem_bits = 32;            // bits per element, from the payload's datatype (fp32: 32, int4: 4)
  // The payload's fp16 (ExecuTorch's float16 programs): computed as fp32 like every other value. A constant is
  // widened once, at init (State::owned); a delegate argument is converted at the call (State::half_*).
  bool half = false;
  // Quantized values (ExecuTorch's 8da4w / 8da8w programs): activations quantized
  // at run time per row (their bytes are a cpu::Qd8Rows block, min_bytes), and
  // constant weights with per-group bf16 scales (int4) or per-channel fp32 scales (int8).
  enum class Quant : uint8_t { None, DynamicRows, Int4Groups, Int8Channels } quant = Quant::None;
  const uint16_t* group_scales = nullptr;  // Int4Groups: [rows, cols / group_size], bf16 bits
  const float* channel_scales = nullptr;   // Int8Channels: [rows]
  int64_t group_size = 0;
  uint8_t rows_layout = 0;                 // DynamicRows: the cpu::Qd8Layout its readers take
  size_t min_bytes = 0;
  size_t bytes() const { return std::max((static_cast<size_t>(numel) * elem_bits + 7) / 8, min_bytes); }
};

// Values joined by reshapes share one storage.
struct Group {
  Storage storage;
  size_t bytes = 0;
  int64_t first_def = INT64_MAX, last_use = -1;
};

// ---------------------------------------------------------------- steps

enum class StepKind : uint8_t { Subgraph, FullyConnected, Rows, Bmm, LmHead, Transpose, Slice, Concat, Unary, Copy, Clamp,
                                QuantizeRows, QFullyConnected };
enum class UnaryOp : uint8_t { Tanh, Rsqrt, Gelu, Exp, Log, Sin, Cos, Copy };

// Row programs (fused elementwise chains, see Builder::find_chains): values
// seen as R rows of C floats; an operand is a value computed earlier in the
// chain (a slot) or bytes in memory, whose rows repeat with period P (numpy
// broadcasting of a trailing block), or a per-row scalar.
enum class RowOpKind : uint8_t { Add, Sub, Mul, Div, Max, Min, Square, Sqrt, Rsqrt, Neg, Abs, Sigmoid, Tanh, Exp, Gelu,
                                 Copy, Softmax, RowDot, GeluTanh, ScaledSoftmax, None };  // None: not a row op
                                 // GeluTanh, ScaledSoftmax: no node's; operations of the chain found in it
                                 // (fuse_rows.cpp). ScaledSoftmax: softmax(a * bias + b), b a row or none
struct RowOperand {
  enum class Src : uint8_t { None, Slot, Memory } src = Src::None;
  int32_t index = -1;    // slot, or storage group
  int64_t period = 1;    // memory: rows repeat every `period` rows
  bool scalar = false;   // one float per row (else C)
  bool constant = false; // memory: a one-element constant of the program, `value`
  float value = 0.0f;
};
struct RowOp {
  RowOpKind kind = RowOpKind::Copy;
  RowOperand a, b;
  int32_t out_slot = -1;
  bool out_scalar = false;
  int32_t write_group = -1;     // also stored to memory (read after the chain), else the slot only
  float lo = -INFINITY, hi = INFINITY;
  const float* w = nullptr;     // RowDot: C weights
  float bias = 0.0f;
};

struct Operand {
  int32_t group = -1;
  const float* data(const std::vector<Group>& groups, std::byte* arena, std::span<EValue*> args) const;
};

// Positions of a KV cache an attention step reads (live_span): [lo[0], hi[0]) and [lo[1], hi[1]),
// in order, disjoint, either possibly empty.
struct LiveSpan {
  int64_t lo[2] = {0, 0}, hi[2] = {0, 0};
  int64_t count() const { return (hi[0] - lo[0]) + (hi[1] - lo[1]); }
};

struct Step {
  StepKind kind = StepKind::Copy;
  std::string label;
  // Subgraph
  xnn_runtime_t runtime = nullptr;
  std::vector<xnn_external_value> externals;
  std::vector<int32_t> external_groups;  // storage group of each external
  bool binds_args = false;
  // kiln steps: inputs (up to 5) and output
  std::vector<Operand> in;
  Operand out;
  UnaryOp unary = UnaryOp::Copy;
  // shapes
  int64_t batch = 1, m = 0, n = 0, k = 0;
  int64_t a_batch_stride = 0, b_batch_stride = 0;
  uint32_t rank = 0;
  std::array<int64_t, kMaxRank> in_dims{}, out_dims{}, perm{}, offsets{};
  int64_t outer = 0, inner = 0;                      // concat: rows and per-input row widths
  std::array<int64_t, 5> widths{};
  int64_t count = 0;                                 // unary/copy/clamp elements
  float lo = -INFINITY, hi = INFINITY;
  const float* weights = nullptr;                    // fully connected: [k, n] row-major ([n, k] if weights_nk)
  bool weights_nk = false;                           // fully connected, a few rows: W as the file has it, [n, k]
  bool group_sums = false;                           // fully connected on W = a block of ones per output (kiln's int4
                                                     // offsets' group sums): out[r, j] = sum of x[r, j g .. j g + g), g = k / n
  bool weights_panels = false;                       // fully connected, many rows: W packed as cpu::sgemm_pack_b's panels
  bool trans_b = false;                              // Bmm: B is [.., n, k] (C = A · Bᵀ), a few rows of A
  // Attention over the live positions (Builder::find_live_attention): the scores product
  // (trans_b) has the additive mask the next rows step adds (`period` rows of n floats); per call
  // it computes only the positions some mask row keeps (live_span: a prefix for a cache written from
  // position 0, the window for a sliding-window ring, which may wrap), the rest of its rows 0 (the
  // mask hides them, the softmax makes them 0), and the product with V after the rows step (live_k)
  // reads only those positions of V. last_read: the positions the last call read (a profile's), -1
  // for other steps.
  Operand live_mask;
  int64_t live_mask_period = 0;
  bool live_k = false;
  int64_t last_read = -1;
  const float* bias = nullptr;                       // [n] or null
  // QuantizeRows / QFullyConnected (8da4w, 8da8w): the rows' layout, the weights
  const void* qweights = nullptr;                    // int4 [n, ceil(k/2)] or int8 [n, k], from the file
  const uint16_t* group_scales = nullptr;            // int4: bf16 [n, k / group]
  const float* channel_scales = nullptr;             // int8: [n]
  const float* weight_sums = nullptr;                // [n], cpu::qb4w/qc8w_weight_sums (st.owned)
  int64_t group = 0;                                 // int4 group size; 0: int8 weights
  bool qb4w_panels = false;                          // int4: qweights are cpu::Qb4wPanels (kiln's memory)
  uint8_t rows_layout = 0;                           // cpu::Qd8Layout
  // Rows: the fused chain
  std::vector<RowOp> row_ops;
  int64_t rows = 0, cols = 0, tasks = 1, slots = 0;
  std::vector<int64_t> slot_offset;   // floats into a task's scratch
  std::vector<float> scratch;         // tasks x per-task floats
  std::vector<float*> slot_ptr;       // tasks x slots: where each slot's row is, this row
  int64_t scratch_per_task = 0;
  // profiling: totals, the last run's times (steady clock), the payload
  // nodes' debug handles (XNode.debug_handle) of the nodes the step runs
  uint64_t calls = 0, total_ns = 0;
  uint64_t last_start_ns = 0, last_end_ns = 0;
  std::vector<uint32_t> debug_handles;
  // intermediate outputs (debug_outputs.cpp): the payload node whose output the step leaves last (-1:
  // none), and the value a debug log copies after the step (kInvalidId: none), keyed by debug_node
  int32_t last_node = -1;
  uint32_t debug_value = kInvalidId;
  uint32_t debug_node = 0;
  uint32_t debug_view_value = kInvalidId;  // the last view of debug_value that follows the step (none: kInvalidId)
  uint32_t debug_view_node = 0;
};

inline const float* Operand::data(const std::vector<Group>& groups, std::byte* arena, std::span<EValue*> args) const {
  const Storage& s = groups[static_cast<size_t>(group)].storage;
  switch (s.kind) {
    case Storage::Kind::Arena: return reinterpret_cast<const float*>(arena + s.offset);
    case Storage::Kind::Arg: return static_cast<const float*>(args[s.arg]->tensor().data);
    case Storage::Kind::Static: return static_cast<const float*>(s.data);
    case Storage::Kind::None: break;
  }
  return nullptr;
}

struct State {
  std::vector<Value> values;
  std::vector<Group> groups;
  std::vector<Step> steps;
  std::vector<uint32_t> arg_values;     // arg index -> value id
  std::vector<int64_t> arg_numel;
  size_t num_inputs = 0;
  std::byte* arena = nullptr;
  size_t arena_bytes = 0;
  std::vector<const void*> bound_args;  // argument pointers the subgraphs were set up with
  bool profiling = false;
  rt::DebugOutputLog* debug_log = nullptr;  // intermediate outputs (debug_outputs.cpp); null: off
  std::vector<std::unique_ptr<float, decltype(&std::free)>> owned;  // weights kiln laid out itself
  // fp16 arguments (Value::half), made at init: per argument, whether it is one, the fp32 tensor the plan reads
  // or writes in its place (its bytes in half_buffers, sized for the payload's sizes, a dynamic one's bounds),
  // and the argument list a call passes on (the caller's EValue, or the staged one)
  std::vector<uint8_t> half_arg;
  std::vector<rt::Tensor> half_staged;
  std::vector<rt::EValue> half_values;
  std::vector<rt::EValue*> half_call;
  std::vector<std::vector<float>> half_buffers;
  std::vector<std::shared_ptr<void>> weight_chunks;                  // (weight_memory) holds those it carved
  // the method's options (rt::BackendOptions), kept from init
  std::shared_ptr<cpu::ThreadPool> pool;  // outlives the XNNPACK runtimes created on it (~State deletes them first)
  Exec exec;
  Engine engine = Engine::Kiln;
  bool per_node = false;                  // one XNNPACK subgraph per node (profiling detail)
  LiveSpan live;                          // this call's, from the last attention scores step
  // A delegate whose calls change sizes (rt::BackendInitContext::dynamic_shapes). This plan is the
  // payload's own sizes (its upper bounds); a call whose inputs have other sizes runs a plan made
  // for them (Builder::infer_dims: each node's output sizes from its inputs', as XNNPACK's reshape
  // does), kept for the next call of the same sizes (most recently used first, at most kMaxPlans),
  // sharing this plan's repacked weights. Fully-connected fp32 weights stay in the file's layout.
  static constexpr size_t kMaxPlans = 4;
  bool dynamic = false;
  bool resizes_outputs = false;           // gives the call's output tensors this plan's sizes
  const rt::PteFile* file = nullptr;
  std::span<const std::byte> payload;
  std::vector<std::unique_ptr<State>> plans;
  State* last = nullptr;                  // the plan the last call ran (profiles read it); null: this one
  State* owner = nullptr;                 // a plan's: the root state (its weights, file); null: this one
  std::unordered_map<uint32_t, const uint8_t*> qb4w_panels;  // int4 weights repacked (in `owned`), by value
  std::unordered_map<uint32_t, const float*> weight_sums;    // quantized weights' row sums (in `owned`), by value
  std::unordered_map<const void*, const uint8_t*> weight_copies;  // fp32 weights copied (weight_memory), by file bytes
  std::unordered_map<const void*, const float*> lm_head_panels;   // the LM head's table packed (in `owned`), by file bytes

  ~State() {
    for (Step& s : steps)
      if (s.runtime) xnn_delete_runtime(s.runtime);
    std::free(arena);
  }
};

// Memory for the weights a one-token step streams (int4 panels, fp32 fully-connected weights and
// the LM head's table, copied out of the file at load, the file's pages released): carved from
// chunks of 16 MiB (or one chunk for a larger request), 2 MiB-aligned, that the kernel is asked to
// back with transparent huge pages (madvise MADV_HUGEPAGE; this machine's THP mode is "madvise").
// A product that streams tens to hundreds of MB per token from 4 KiB pages pays a TLB miss per
// page: on one core the int4 products read 11-15 GB/s from 4 KiB pages and 21-25 GB/s from huge
// pages, SmolLM2's fp32 products 17 and 22.5 GB/s (same kernels, same bytes). The chunks are
// shared by the programs loaded in the process; each lives while a returned owner does. Returns
// null (with *out null) if no memory is left. The cost is at load: a copy (538 MB: ~0.2 s) into
// pages the kernel zeroes (huge pages: ~0.1 s for 538 MB, 4 KiB pages ~0.35 s); on this VM the
// first process to touch free memory the host has not backed yet waits ~10 ms per MB instead.
std::shared_ptr<void> weight_memory(size_t bytes, uint8_t** out);
// `bytes` of the program's file (fp32 weights a one-token step streams) copied into weight_memory
// once per delegate: `owner` (the delegate's root state) keeps the copy, by the bytes' address, for
// every plan; the file's pages are released if `release`. *out: the copy, or the file's own bytes
// with KILN_HUGE_PAGES=0 (rt::huge_pages_enabled).
rt::Status copy_to_weight_memory(State& owner, const rt::PteFile* file, std::span<const std::byte> bytes, bool release,
                                 const float** out, rt::ErrorMessage* error);
// The tied LM head's table W [n, k] (fp32, in the program's file or not) packed as the selected GEMM's
// column panels of Wᵀ (cpu::sgemm_pack_b), once per delegate: `owner` keeps them, by W's address. The
// file's pages of W are released a chunk at a time as they are packed (the tied embedding's lookup
// reads back only its tokens' rows), so resident memory never holds both whole. *out: the panels.
rt::Status table_panels_once(State& owner, const rt::PteFile* file, const float* w, int64_t n, int64_t k,
                             const float** out, rt::ErrorMessage* error);

// What the backend's init and execute do, for its tests to read a delegate's plan
// (tests/xnnpack/xnnpack_planner_test.cpp). plan_payload builds `st` (fresh) from
// a payload with the method's options, as init does, without running it; `file`
// holds the named constants, or is null for a payload whose constants are inline.
// NotSupported until register_runtime_backend() has initialized XNNPACK.
// execute_state runs a built state on the call's arguments (inputs, then outputs).
rt::Status plan_payload(const rt::PteFile* file, std::span<const std::byte> payload, const rt::BackendOptions& options,
                        State& st, rt::ErrorMessage* error);
rt::Status execute_state(State& st, std::span<EValue*> args, rt::ErrorMessage* error);

// Intermediate outputs (debug_outputs.cpp): turns logging on (log) or off (null) for `st` and its plans;
// log_step_output copies a step's output (Step::debug_value) into st.debug_log.
void enable_debug_outputs(State& st, rt::DebugOutputLog* log);
void log_step_output(const State& st, const Step& step, std::span<EValue*> args);

// ---------------------------------------------------------------- kiln's steps (steps.cpp)

// live: only the positions of `live` (trans_b: columns of C, the rest set to 0; else: those of the
// products' k, A's other columns being 0); null: all
void run_bmm(const Exec& ex, const Step& s, const float* a, const float* b, float* c, const LiveSpan* live = nullptr);
// A mask value at or below this hides its position: -inf, or transformers' eager masks'
// finfo(float32).min (score + min rounds to min, and exp(min - rowmax) is 0 in fp32).
constexpr float kMaskedBelow = -1e30f;
// The positions an additive attention mask keeps (some of its `rows` rows of n floats is above
// kMaskedBelow, or NaN there), as at most two intervals: every kept position, and of the hidden ones
// all but those between the intervals' ends outside the longest hidden run among the kept ones.
// A prefix for a cache written from 0, one interval or two for a ring of a sliding window. All n
// when some row keeps none (eager's NaN rows for -inf masks, or its uniform rows for finfo.min
// ones, are then reproduced).
LiveSpan live_span(const float* mask, int64_t rows, int64_t n);
// w_panels: Wᵀ packed as cpu::sgemm_pack_b's panels (a static delegate's many rows), or null
void run_lm_head(const Exec& ex, Step& s, const float* w, const float* w_panels, const float* xt, float* out);
// floats of the LM head step's scratch for m rows of k (0 below kGemvRows: the one-pass rows need none)
int64_t lm_head_scratch_floats(int64_t m, int64_t k);
void run_quantize_rows(const Exec& ex, const Step& s, const float* x, float* out);
void run_qfully_connected(const Exec& ex, const Step& s, const float* rows, float* y);
void run_fully_connected(const Exec& ex, const Step& s, const float* x, float* out);
void run_transpose(const Exec& ex, const Step& s, const float* in, float* out);
void run_slice(const Exec& ex, const Step& s, const float* in, float* out);
void run_unary(const Exec& ex, const Step& s, const float* in, float* out);
void run_concat(const Step& s, std::span<const float* const> ins, float* out);
// The columns of a fused chain's row that one of its task units covers (all of them but in an elementwise chain).
int64_t rows_chunk(const std::vector<RowOp>& ops, int64_t cols);
void run_rows(const Exec& ex, Step& s, const std::vector<Group>& groups, std::byte* arena, std::span<EValue*> args);
bool row_mode(const Value& e, const Value& d, int64_t* period, bool* scalar);

}  // namespace kiln::backends::xnnpack::detail
