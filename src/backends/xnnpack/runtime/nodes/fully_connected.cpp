// Fully connected: y = x · Wᵀ (+ bias) with constant weights. With the xnnpack engine, fp32
// weights run in XNNPACK; otherwise on kiln's code: fp32 (run_fully_connected, W in the layout
// the product streams) and int8 rows x int4 groups / int8 channels (run_qfully_connected, the
// 8da4w / 8da8w programs). With one output column and the kiln engine, a row op (a row mean).
#include "node_kind.h"

#include "kiln/cpu/gemm.h"
#include "kiln/cpu/quant.h"

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <string>

namespace kiln::backends::xnnpack::detail {

static bool io(const fbx::XNode& node, NodeIO& io) {
  auto* n = node.xnode_union_as_XNNFullyConnected();
  if (!n) return false;
  io.in[0] = n->input1_id(); io.in[1] = n->filter_id(); io.in[2] = n->bias_id(); io.num_in = 3;
  io.out = n->output_id();
  return true;
}

static ShapeResult infer(const ShapeContext& c, std::array<int64_t, kMaxRank>& d) {
  const Value& x = c.x;
  const Value& w = c.in(1);
  const size_t n = c.n;
  if (w.ndims != 2 || x.ndims < 1) return shape_unsupported();
  const bool kn = (c.node.xnode_union_as_XNNFullyConnected()->flags() & 1u) != 0;
  const int64_t k = kn ? w.dims[0] : w.dims[1], nn = kn ? w.dims[1] : w.dims[0];
  if (x.dims[x.ndims - 1] != k) return shape_bad("the input's last size is not the weights' input channels");
  if (n == x.ndims) {
    std::copy_n(x.dims.begin(), n, d.begin());
    d[n - 1] = nn;
  } else if (n == 2) {
    d[0] = x.numel / k;
    d[1] = nn;
  } else {
    return shape_unsupported();
  }
  return shape_ok();
}

static Status define(const DefineContext& c, xnn_status* s) {
  *s = xnn_define_fully_connected(c.sg, c.lo, c.hi, c.a, c.b, c.bias, c.o,
                                  c.node.xnode_union_as_XNNFullyConnected()->flags());
  return Status::Ok;
}

static Status on_library(const NodeContext& c, const State& st, bool* library) {
  // both implementations need constant weights
  bool static_w = st.values[c.io.in[1]].constant && (c.io.in[2] == kInvalidId || st.values[c.io.in[2]].constant);
  if (!static_w) return fail(c.error, Status::NotSupported, "node %zu: fully connected with non-constant weights", c.index);
  // Debian's XNNPACK has no int8 x int4 product: quantized ones always run on kiln's code
  *library = st.engine == Engine::Xnnpack && st.values[c.io.in[1]].quant == Value::Quant::None;
  return Status::Ok;
}

// dst [cols, rows] = src [rows, cols]ᵀ, in tiles that stay in cache (weights at load time:
// hundreds of MB, where the plain loop's strided writes take seconds).
static void transpose_blocked(const float* src, int64_t rows, int64_t cols, float* dst) {
  constexpr int64_t kTile = 32;
  for (int64_t r0 = 0; r0 < rows; r0 += kTile)
    for (int64_t c0 = 0; c0 < cols; c0 += kTile) {
      const int64_t r1 = std::min(rows, r0 + kTile), c1 = std::min(cols, c0 + kTile);
      for (int64_t c = c0; c < c1; ++c)
        for (int64_t r = r0; r < r1; ++r) dst[c * rows + r] = src[r * cols + c];
    }
}

// int8 rows x int4 (groups) or int8 (channels) weights: 8da4w / 8da8w
static Status quantized_step(const StepContext& c, Step& step) {
  const NodeIO& io = c.io;
  const Value &in = c.in(0), &out = c.out(), &w = c.in(1);
  const auto* p = c.node.xnode_union_as_XNNFullyConnected();
  if (w.ndims != 2 || (p->flags() & 1u) != 0 || out.ndims < 1) return c.bad("quantized weights must be [N, K]");
  step.kind = StepKind::QFullyConnected;
  step.n = w.dims[0];
  step.k = w.dims[1];
  if (in.dims[in.ndims - 1] != step.k || out.dims[out.ndims - 1] != step.n || in.numel / step.k != out.numel / step.n)
    return c.bad("input, weights and output shapes do not agree");
  step.m = in.numel / step.k;
  step.rows_layout = in.rows_layout;
  step.qweights = w.constant;
  // per weight, once for every node and plan that reads it (a dynamic delegate's plans share them)
  State& owner = c.owner;
  const float*& shared_sums = owner.weight_sums[io.in[1]];
  float* sums = nullptr;
  if (!shared_sums) {
    sums = static_cast<float*>(std::aligned_alloc(kArenaAlign, (static_cast<size_t>(step.n) * 4 + kArenaAlign - 1) / kArenaAlign * kArenaAlign));
    if (!sums) return fail(c.error, Status::OutOfMemory, "out of memory for weight sums");
    owner.owned.emplace_back(sums, &std::free);
  }
  if (w.quant == Value::Quant::Int4Groups) {
    step.group = w.group_size;
    step.group_scales = w.group_scales;
    step.label = "kiln fully connected, int8 x int4";
    // Signed rows: repacked once into kiln's panels (one copy per weight, however many nodes read it),
    // which hold the weights and their scales: the file's pages then leave memory, so the model is held
    // once. The sums and the panels are made a block of rows at a time and each block's pages leave as
    // soon as it is packed, so that a large weight (Gemma 4 E2B's 262144 x 1536 LM head, 230 MB with
    // its scales) is never resident twice.
    const bool pack = step.rows_layout == static_cast<uint8_t>(cpu::Qd8Layout::Signed);
    const uint8_t*& panels = owner.qb4w_panels[io.in[1]];
    uint8_t* buf = nullptr;
    if (pack && !panels) {
      std::shared_ptr<void> chunk = weight_memory(cpu::qb4w_panels_bytes(step.n, step.k, step.group), &buf);
      if (!buf) return fail(c.error, Status::OutOfMemory, "out of memory repacking int4 weights");
      owner.weight_chunks.push_back(std::move(chunk));
    }
    const bool release = buf && c.only_packed[io.in[1]] && c.file;
    const auto* q = static_cast<const uint8_t*>(w.constant);
    const int64_t ldw = step.k / 2, groups = step.k / step.group;
    constexpr int64_t kBlock = 64 * cpu::kQb4wPanel;  // rows: whole panels
    const size_t panel_bytes = cpu::qb4w_panel_bytes(step.k, step.group);
    for (int64_t r0 = 0; r0 < step.n && (sums || buf); r0 += kBlock) {
      const int64_t rows = std::min(kBlock, step.n - r0);
      const uint8_t* wr = q + r0 * ldw;
      const uint16_t* sr = w.group_scales + r0 * groups;
      if (sums) cpu::qb4w_weight_sums(wr, sr, rows, step.k, step.group, sums + r0);
      if (!buf) continue;
      cpu::qb4w_pack_panels(wr, sr, rows, step.k, step.group, buf + static_cast<size_t>(r0 / cpu::kQb4wPanel) * panel_bytes);
      if (release) {
        c.file->release_pages(std::span<const std::byte>(reinterpret_cast<const std::byte*>(wr), static_cast<size_t>(rows * ldw)));
        c.file->release_pages(std::span<const std::byte>(reinterpret_cast<const std::byte*>(sr),
                                                         static_cast<size_t>(rows * groups) * sizeof(uint16_t)));
      }
    }
    if (release) {  // the pages that straddle two blocks
      c.file->release_pages(w.constant_bytes);
      c.file->release_pages(std::span<const std::byte>(reinterpret_cast<const std::byte*>(w.group_scales),
                                                       static_cast<size_t>(step.n * groups) * sizeof(uint16_t)));
    }
    if (buf) panels = buf;
    if (pack) {
      step.qweights = panels;
      step.qb4w_panels = true;
    }
  } else {
    step.channel_scales = w.channel_scales;
    if (sums) cpu::qc8w_weight_sums(static_cast<const int8_t*>(w.constant), w.channel_scales, step.n, step.k, sums);
    step.label = "kiln fully connected, int8 x int8";
  }
  if (c.st.per_node) step.label += " " + std::to_string(step.n) + "x" + std::to_string(step.k);
  if (sums) shared_sums = sums;
  step.weight_sums = shared_sums;
  step.in.resize(1);
  if (io.in[2] != kInvalidId) {
    const Value& b = c.in(2);
    if (b.numel != step.n || b.quant != Value::Quant::None) return c.bad("bias must be fp32 with one value per output");
    step.bias = static_cast<const float*>(b.constant);
  }
  return Status::Ok;
}

static Status step(const StepContext& c, Step& step) {
  if (c.in(0).quant == Value::Quant::DynamicRows) return quantized_step(c, step);
  const NodeIO& io = c.io;
  const Value &in = c.in(0), &out = c.out(), &w = c.in(1);
  State& st = c.st;
  const auto* p = c.node.xnode_union_as_XNNFullyConnected();
  if (w.quant != Value::Quant::None) return c.bad("quantized weights need dynamically quantized int8 inputs");
  if (w.ndims != 2 || in.ndims < 1 || out.ndims < 1) return c.bad("weights must be 2-D");
  const bool kn = (p->flags() & 1u) != 0;  // XNN_FLAG_TRANSPOSE_WEIGHTS: W is [K, N]
  step.kind = StepKind::FullyConnected;
  step.label = "kiln fully connected";
  if (st.per_node) step.label += " " + std::to_string(w.dims[0]) + "x" + std::to_string(w.dims[1]);
  step.k = kn ? w.dims[0] : w.dims[1];
  step.n = kn ? w.dims[1] : w.dims[0];
  if (in.dims[in.ndims - 1] != step.k || out.dims[out.ndims - 1] != step.n || step.k == 0 || step.n == 0 ||
      in.numel / step.k != out.numel / step.n)
    return c.bad("input, weights and output shapes do not agree");
  step.m = in.numel / step.k;
  step.in.resize(1);  // x; the weights and bias are constants
  if (io.in[2] != kInvalidId) {
    if (st.values[io.in[2]].numel != step.n) return c.bad("bias size is not the output channels");
    step.bias = static_cast<const float*>(st.values[io.in[2]].constant);
  }
  // W [N, K] with ones on each output's own block of K / N inputs and zeros elsewhere: the group sums of
  // --quantize-scales asym's offsets (kiln/backends/xnnpack/quantize.h). Summed directly (K adds per row, not
  // N K products); W is neither copied nor read again.
  if (!kn && step.n > 1 && step.k % step.n == 0 && step.k / step.n >= 2) {
    const auto* wv = static_cast<const float*>(w.constant);
    const int64_t g = step.k / step.n;
    bool blocks = true;
    for (int64_t j = 0; j < step.n && blocks; ++j)
      for (int64_t i = 0; i < step.k && blocks; ++i) blocks = wv[j * step.k + i] == (i / g == j ? 1.0f : 0.0f);
    if (blocks) {
      step.group_sums = true;
      step.group = g;
      step.label = "kiln group sums";
      if (st.per_node) step.label += " " + std::to_string(step.n) + "x" + std::to_string(step.k);
      return Status::Ok;
    }
  }
  // W's layout for the product: a few rows (one token) are dot products over W's rows, [N, K], so
  // that each task streams one contiguous block of W; many rows run the GEMM over [K, N]. A file
  // with the other layout is transposed once, into kiln's memory, and its copy leaves memory.
  // A dynamic delegate keeps W as the file has it for every size (run_fully_connected has a
  // GEMM over [N, K] for many rows), so that no plan holds a second copy of the weights.
  // Few inputs (K <= 64, e.g. the int4 offsets' products on group sums): [K, N] for every size, where a
  // few rows are K streaming row updates (axpy) rather than N dot products of K (each too short to pay).
  const bool few_inputs = step.k <= 64 && step.n >= 4;
  step.weights_nk = c.dynamic ? !kn && !few_inputs : step.m < kGemvRows && !few_inputs;
  if (!c.dynamic && step.m >= kGemvRows && step.n >= 4 && cpu::sgemm_pack_once()) {
    // Many rows of a static delegate, where the selected GEMM wants it (cpu::sgemm_pack_once): W packed once as the GEMM's panels (cpu::sgemm_pack_b: the selected
    // variant's column panels, each K rows of contiguous floats), so no product packs B per call; about the
    // transposed copy's memory, and the file's pages released as for it. (Not huge-page weight memory: on
    // a Xeon VM filling it took 1.0-1.2 s for GPT-2 against 0.23 s in 4 KiB pages, for no faster runs.)
    const int64_t floats = cpu::sgemm_packed_floats(step.k, step.n);
    const size_t bytes = static_cast<size_t>(floats) * sizeof(float);
    auto* wp = static_cast<float*>(std::aligned_alloc(kArenaAlign, (bytes + kArenaAlign - 1) / kArenaAlign * kArenaAlign));
    if (!wp) return fail(c.error, Status::OutOfMemory, "out of memory packing weights");
    st.owned.emplace_back(wp, &std::free);
    cpu::sgemm_pack_b(step.k, step.n, static_cast<const float*>(w.constant), kn ? step.n : step.k, !kn, wp);
    step.weights = wp;
    step.weights_panels = true;
    if (c.only_packed[io.in[1]] && c.file) c.file->release_pages(w.constant_bytes);
  } else if (step.weights_nk != kn) {
    // The file's layout. Streamed once per token (a few rows, or a dynamic delegate, whose plans
    // share one copy): copied into huge-page weight memory, the file's pages released (see
    // weight_memory). Many rows (a GEMM, which packs its panels): read in place.
    const float* copy = static_cast<const float*>(w.constant);
    if (c.dynamic || step.m < kGemvRows)
      KILN_TRY(c.in_weight_memory(w.constant_bytes, c.only_packed[io.in[1]], &copy));
    step.weights = copy;
  } else {
    float* wt = nullptr;
    if (step.m < kGemvRows) {
      // A few rows: the transposed copy is streamed once per token, so it goes into huge-page weight
      // memory like the copies above (GPT-2's [K, N] weights in kiln's files, one token on a Xeon: 12.2
      // GB/s from 4 KiB pages, where the LM head's table read 16.4 from huge pages).
      uint8_t* buf = nullptr;
      std::shared_ptr<void> chunk = weight_memory(w.bytes(), &buf);
      if (!buf) return fail(c.error, Status::OutOfMemory, "out of memory transposing weights");
      c.owner.weight_chunks.push_back(std::move(chunk));
      wt = reinterpret_cast<float*>(buf);
    } else {
      wt = static_cast<float*>(std::aligned_alloc(kArenaAlign, (w.bytes() + kArenaAlign - 1) / kArenaAlign * kArenaAlign));
      if (!wt) return fail(c.error, Status::OutOfMemory, "out of memory transposing weights");
      st.owned.emplace_back(wt, &std::free);
    }
    const int64_t rows = kn ? step.k : step.n, cols = kn ? step.n : step.k;  // the file's [rows, cols]
    transpose_blocked(static_cast<const float*>(w.constant), rows, cols, wt);
    step.weights = wt;
    if (c.only_packed[io.in[1]] && c.file) c.file->release_pages(w.constant_bytes);
  }
  return Status::Ok;
}

KILN_XNNPACK_NODE_KINDS(fully_connected_nodes,
  {.type = NodeType::XNNFullyConnected, .io = io, .optional_bias = true, .infer = infer, .define = define,
   .on_library = on_library, .kiln_step = step, .row_op = RowOpKind::RowDot})

}  // namespace kiln::backends::xnnpack::detail
