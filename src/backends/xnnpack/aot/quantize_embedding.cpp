// Embedding-table quantization for kiln lower --quantize-embedding and --recipe llm-int4 (see quantize.h): the
// tables' int4/int8 rows, streamed from the .pt2 block by block at write time.
#include "kiln/backends/xnnpack/quantize.h"

#include "quantize_common.h"

#include "kiln/core/error.h"
#include "kiln/passes/edge_program.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <span>
#include <thread>
#include <vector>

namespace kiln::backends::xnnpack {
using namespace qdetail;

std::string EmbeddingQuant::name() const {
  if (bits == 0) return "none";
  return group ? fmt::format("{}:{}", bits, group) : fmt::format("{}", bits);
}

std::optional<EmbeddingQuant> parse_embedding_quant(std::string_view text, std::string* error) {
  std::string_view base = text, group;
  if (auto colon = text.find(':'); colon != std::string_view::npos) {
    base = text.substr(0, colon);
    group = text.substr(colon + 1);
  }
  EmbeddingQuant q;
  if (base == "4") q.bits = 4, q.group = 32;
  else if (base == "8") q.bits = 8, q.group = 0;
  else {
    *error = fmt::format("unknown embedding quantization '{}' (4[:GROUP] or 8[:GROUP])", text);
    return std::nullopt;
  }
  if (!group.empty()) {
    int64_t g = 0;
    for (char c : group) {
      if (c < '0' || c > '9' || g > (int64_t{1} << 40)) {
        g = -1;
        break;
      }
      g = g * 10 + (c - '0');
    }
    if (g <= 0 || (q.bits == 4 && g % 2 != 0)) {
      *error = fmt::format("bad group size '{}' in --quantize-embedding {} (a positive{} number of columns)", group,
                           text, q.bits == 4 ? " even" : "");
      return std::nullopt;
    }
    q.group = g;
  }
  return q;
}

namespace {

// Rows [0, rows) of a table d wide (fp32 values, row-major) into `data` (rows x row_bytes) and `scales`
// (rows x groups fp32). Every offset is 64-bit: a table may hold more than 2^31 elements (Gemma 4's per-layer
// table: 262144 x 8960 = 2.35e9). `source` is the 16-bit type the values had in the .pt2 (torchao's arithmetic
// then runs in that type, as quantize_rows_narrow's), Float otherwise.
KILN_QUANT_INLINE void quantize_embedding_rows_impl(const float* w, int64_t rows, int64_t d, const EmbeddingQuant& q,
                                                   uint8_t* data, float* scales) {
  const int64_t g = q.group ? q.group : d, groups = d / g;
  const float half_range = q.bits == 4 ? 7.5f : 127.5f;
  const float qmin = q.bits == 4 ? -8.0f : -128.0f, qmax = q.bits == 4 ? 7.0f : 127.0f;
  const bool narrow = q.source != QuantScheme::Source::Float;
  const bool bf16 = q.source == QuantScheme::Source::BFloat16;
  auto round = [bf16](float f) { return bf16 ? from_bf16(to_bf16(f)) : round_to_half(f); };
  const float eps = bf16 ? FLT_MIN : 0x1p-14f;  // torch.finfo(dtype).smallest_normal
  const size_t row_bytes = static_cast<size_t>(q.bits == 4 ? d / 2 : d);
  std::vector<float> t(static_cast<size_t>(g));
  for (int64_t r = 0; r < rows; ++r) {
    uint8_t* out = data ? data + static_cast<size_t>(r) * row_bytes : nullptr;
    for (int64_t b = 0; b < groups; ++b) {
      const float* x = w + static_cast<size_t>(r) * static_cast<size_t>(d) + static_cast<size_t>(b * g);
      float scale, inv;
      if (narrow) {  // torchao in bf16 / fp16: scale = max(round(max|w| / 7.5), eps), q = round(round(w * round(1/s)))
        float amax = 0.0f;  // exact in any order (a NaN skipped either way)
        int64_t i0 = 0;
        {
          F32x8 m8 = {};
          for (; i0 + 8 <= g; i0 += 8) {
            U32x8 u;
            std::memcpy(&u, x + i0, sizeof u);
            u &= 0x7fffffffu;  // |x|
            F32x8 a;
            std::memcpy(&a, &u, sizeof a);
            m8 = a > m8 ? a : m8;
          }
          for (int l = 0; l < 8; ++l) amax = std::max(amax, m8[l]);
        }
        for (int64_t i = i0; i < g; ++i) amax = std::max(amax, std::fabs(x[i]));
        scale = std::max(round(amax / half_range), eps);
        inv = round(1.0f / scale);
      } else {
        scale = symmetric_scale(x, g, half_range);
        inv = 1.0f / scale;
      }
      scales[static_cast<size_t>(r) * static_cast<size_t>(groups) + static_cast<size_t>(b)] = scale;
      if (!out) continue;  // the scales only
      // t = clamp(x * inv) (clamping before the rounding gives the same integers: the bounds are on every grid),
      // rounded to the 16-bit type under `narrow`, then to an integer (ties to even: kRounder)
      int64_t i1 = 0;
      if (narrow && bf16) {  // 8 at a time, the same operations lane by lane, then the tail below
        const F32x8 vinv = inv - F32x8{}, lo = qmin - F32x8{}, hi = qmax - F32x8{}, rounder = kRounder - F32x8{};
        for (; i1 + 8 <= g; i1 += 8) {
          F32x8 y;
          std::memcpy(&y, x + i1, sizeof y);
          y *= vinv;
          y = y < lo ? lo : y;  // std::max(y, qmin)
          y = hi < y ? hi : y;  // std::min(y, qmax)
          U32x8 u;
          std::memcpy(&u, &y, sizeof u);
          u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
          std::memcpy(&y, &u, sizeof y);
          y = (y + rounder) - rounder;
          std::memcpy(&t[static_cast<size_t>(i1)], &y, sizeof y);
        }
      }
      for (int64_t i = i1; i < g; ++i) t[static_cast<size_t>(i)] = std::min(std::max(x[i] * inv, qmin), qmax);
      if (narrow && bf16) {
        for (int64_t i = i1; i < g; ++i) {
          uint32_t u;
          std::memcpy(&u, &t[static_cast<size_t>(i)], 4);
          u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
          std::memcpy(&t[static_cast<size_t>(i)], &u, 4);
        }
      } else if (narrow) {
        for (int64_t i = 0; i < g; ++i) t[static_cast<size_t>(i)] = round_to_half(t[static_cast<size_t>(i)]);
      }
      for (int64_t i = narrow && bf16 ? i1 : 0; i < g; ++i)
        t[static_cast<size_t>(i)] = (t[static_cast<size_t>(i)] + kRounder) - kRounder;
      if (q.bits == 8) {
        for (int64_t i = 0; i < g; ++i) out[b * g + i] = static_cast<uint8_t>(static_cast<int8_t>(t[static_cast<size_t>(i)]));
      } else {  // ExecuTorch's embedding_4bit order: the even column in the high nibble, as q + 8 (g is even)
        uint8_t* o = out + (b * g) / 2;
        for (int64_t i = 0; i < g; i += 2)
          o[i / 2] = static_cast<uint8_t>((static_cast<int>(t[static_cast<size_t>(i)]) + 8) << 4 |
                                          (static_cast<int>(t[static_cast<size_t>(i + 1)]) + 8));
      }
    }
  }
}

#if defined(__x86_64__)
__attribute__((target("avx2"))) void quantize_embedding_rows_avx2(const float* w, int64_t rows, int64_t d,
                                                                   const EmbeddingQuant& q, uint8_t* data,
                                                                   float* scales) {
  quantize_embedding_rows_impl(w, rows, d, q, data, scales);
}
#endif

// quantize_embedding_rows_impl in the widest form this CPU runs (the same bytes: no fused multiply-adds)
void quantize_embedding_rows(const float* w, int64_t rows, int64_t d, const EmbeddingQuant& q, uint8_t* data,
                             float* scales) {
#if defined(__x86_64__)
  if (cpu_has_avx2()) return quantize_embedding_rows_avx2(w, rows, d, q, data, scales);
#endif
  quantize_embedding_rows_impl(w, rows, d, q, data, scales);
}

// Streams a table's rows in blocks of about 32 MB of fp32 (split over lower_threads()), each block quantized into
// the caller's buffers: `fn(first_row, rows, data, scales)` gets every block in order. The table is never whole in
// memory: its values come from the .pt2 (widened from bf16 as they are read; with more than one thread, the next
// block is read on a thread of its own while this one is quantized and handed to fn: two blocks in memory) or
// from the folded bytes.
void for_each_quantized_block(const pt2::ExportedProgram* exported, const passes::ConstantData& c, int64_t v, int64_t d,
                              const EmbeddingQuant& q, bool scales_only,
                              const std::function<void(int64_t, int64_t, const uint8_t*, const float*)>& fn) {
  const int64_t g = q.group ? q.group : d, groups = d / g;
  const int64_t block = std::max<int64_t>(1, lower_block_bytes(int64_t{32} << 20) / 4 / d);  // rows: ~8 M values
  const size_t row_bytes = static_cast<size_t>(q.bits == 4 ? d / 2 : d);
  const int64_t threads = lower_threads();
  const bool read_ahead = !c.bytes && threads > 1 && v > block;
  std::vector<float> values[2];
  for (int i = 0; i < (c.bytes ? 0 : read_ahead ? 2 : 1); ++i)
    values[i].resize(static_cast<size_t>(std::min(block, v)) * static_cast<size_t>(d));
  std::vector<uint8_t> data(scales_only ? 0 : static_cast<size_t>(std::min(block, v)) * row_bytes);
  std::vector<float> scales(static_cast<size_t>(std::min(block, v)) * static_cast<size_t>(groups));
  auto read = [&](int64_t r0, std::vector<float>& into) {
    const int64_t n = std::min(block, v - r0);
    const size_t count = static_cast<size_t>(n) * static_cast<size_t>(d);
    const uint64_t offset = static_cast<uint64_t>(r0) * static_cast<uint64_t>(d) * sizeof(float);
    exported->read_constant_range(*c.source, offset, std::as_writable_bytes(std::span(into.data(), count)));
  };
  // the block after this one, read while this one is quantized and written (joined before the next block starts,
  // and on the way out when fn or the quantization throws)
  struct Ahead {
    std::thread thread;
    std::exception_ptr error;
    void join() {
      if (thread.joinable()) thread.join();
    }
    ~Ahead() { join(); }
  } ahead;
  int cur = 0;
  if (!c.bytes) read(0, values[0]);
  for (int64_t r0 = 0; r0 < v; r0 += block) {
    const int64_t n = std::min(block, v - r0);
    const size_t count = static_cast<size_t>(n) * static_cast<size_t>(d);
    const float* src = c.bytes ? reinterpret_cast<const float*>(c.bytes->data()) + static_cast<size_t>(r0) * static_cast<size_t>(d)
                               : values[cur].data();
    if (read_ahead && r0 + block < v)
      ahead.thread = std::thread([&, next = r0 + block, into = &values[1 - cur]] {
        try {
          read(next, *into);
        } catch (...) {
          ahead.error = std::current_exception();
        }
      });
    auto part = [&](int64_t t, int64_t parts) {
      const int64_t a = n * t / parts, b = n * (t + 1) / parts;
      quantize_embedding_rows(src + static_cast<size_t>(a) * static_cast<size_t>(d), b - a, d, q,
                              scales_only ? nullptr : data.data() + static_cast<size_t>(a) * row_bytes,
                              scales.data() + static_cast<size_t>(a) * static_cast<size_t>(groups));
    };
    const int64_t parts = count >= (size_t{1} << 20) ? std::min(threads, n) : 1;
    {
      std::vector<std::thread> pool;
      for (int64_t t = 1; t < parts; ++t) pool.emplace_back(part, t, parts);
      part(0, parts);
      for (auto& th : pool) th.join();
    }
    fn(r0, n, data.data(), scales.data());
    if (c.bytes || r0 + block >= v) continue;
    if (read_ahead) {
      ahead.join();
      if (ahead.error) std::rethrow_exception(ahead.error);
      cur = 1 - cur;
    } else {
      read(r0 + block, values[cur]);
    }
  }
}

}  // namespace

QuantizedWeights quantize_embedding_table(const float* w, int64_t v, int64_t d, const EmbeddingQuant& q) {
  const int64_t g = q.group ? q.group : d, groups = d / g;
  QuantizedWeights out;
  out.data.assign(static_cast<size_t>(v) * static_cast<size_t>(q.bits == 4 ? d / 2 : d), std::byte{0});
  out.scales.resize(static_cast<size_t>(v) * static_cast<size_t>(groups) * 4);
  quantize_embedding_rows(w, v, d, q, reinterpret_cast<uint8_t*>(out.data.data()),
                          reinterpret_cast<float*>(out.scales.data()));
  return out;
}

int64_t quantize_embeddings(passes::EdgeProgram& program, const EmbeddingQuant& q, EmbeddingQuantReport* report) {
  if (q.bits == 0) return 0;
  graph::Graph& g = program.graph;
  int64_t rewritten = 0;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    if (g.nodes[i].target != "aten.embedding.default") continue;
    const graph::NamedArgument* wa = g.nodes[i].input("weight");
    const graph::NamedArgument* ia = g.nodes[i].input("indices");
    if (!wa || !ia || wa->arg.kind != graph::Argument::Kind::Tensor) continue;
    const auto w = std::get<graph::ValueId>(wa->arg.payload);
    if (!program.is_constant(w)) continue;
    const graph::TensorMeta meta = g.value(w).meta;
    if (meta.dtype != ScalarType::Float || meta.sizes.size() != 2) continue;
    const int64_t v = meta.sizes[0], d = meta.sizes[1];
    const int64_t group = q.group ? q.group : d;
    const std::string node_name = g.nodes[i].name, table = program.constants.at(w).name;
    check(d % group == 0, "--quantize-embedding {}: the group size {} does not divide the {} columns of embedding '{}' ({})",
          q.name(), group, d, node_name, table);
    check(q.bits == 8 || d % 2 == 0, "--quantize-embedding {}: embedding '{}' has an odd row width {}", q.name(),
          node_name, d);
    // ExecuTorch's portable and quantized tensors count elements and index rows in 64 bits, and its sizes are
    // int32 per dimension: [V, D/2] or [V, D] fits as long as V and D do (they came from a tensor).
    const passes::ConstantData source = program.constants.at(w);
    EmbeddingQuant eq = q;
    if (source.source && source.source->stored_dtype)
      eq.source = *source.source->stored_dtype == ScalarType::BFloat16 ? QuantScheme::Source::BFloat16
                                                                        : QuantScheme::Source::Half;
    const int64_t groups = d / group;
    const size_t row_bytes = static_cast<size_t>(q.bits == 4 ? d / 2 : d);
    const uint64_t data_bytes = static_cast<uint64_t>(v) * row_bytes;
    const size_t scale_bytes = static_cast<size_t>(v) * static_cast<size_t>(groups) * 4;
    // A table read from the .pt2 is quantized as the .pte is written, block by block (ConstantData::generated),
    // its data and its scales both: neither the table nor its quantized form is ever whole in memory (Gemma 4's
    // per-layer table quantizes to 1.2 GB). The table is read once: the data constant is written first (the
    // emitter stores constants in value order, and the data's value is created first), and its pass keeps the
    // scales for the scales constant; written in any other order (or asked for alone), the scales are computed by
    // a pass of their own, with the same arithmetic, so the same bytes. A folded table (bytes computed during
    // lowering, in memory already) is quantized now.
    std::shared_ptr<const std::vector<std::byte>> data_bytes_now, scales_now;
    std::shared_ptr<const passes::GeneratedBytes> generated, generated_scales;
    if (!source.source) {
      auto data = std::make_shared<std::vector<std::byte>>(static_cast<size_t>(data_bytes));
      auto scales = std::make_shared<std::vector<std::byte>>(scale_bytes);
      for_each_quantized_block(program.exported, source, v, d, eq, false, [&](int64_t r0, int64_t n, const uint8_t* qd, const float* qs) {
        std::memcpy(data->data() + static_cast<size_t>(r0) * row_bytes, qd, static_cast<size_t>(n) * row_bytes);
        std::memcpy(scales->data() + static_cast<size_t>(r0) * static_cast<size_t>(groups) * 4, qs,
                    static_cast<size_t>(n) * static_cast<size_t>(groups) * 4);
      });
      data_bytes_now = std::move(data);
      scales_now = std::move(scales);
    } else {
      struct Kept {  // the scales the data pass computed, until the scales constant is written
        std::mutex m;
        std::unique_ptr<std::vector<std::byte>> scales;
      };
      auto kept = std::make_shared<Kept>();
      const pt2::ExportedProgram* ep = program.exported;
      auto gen = std::make_shared<passes::GeneratedBytes>();
      gen->size = data_bytes;
      gen->write = [ep, source, v, d, eq, row_bytes, groups, scale_bytes,
                    kept](const std::function<void(std::span<const std::byte>)>& sink) {
        auto scales = std::make_unique<std::vector<std::byte>>(scale_bytes);
        for_each_quantized_block(ep, source, v, d, eq, false, [&](int64_t r0, int64_t n, const uint8_t* qd, const float* qs) {
          sink(std::as_bytes(std::span(qd, static_cast<size_t>(n) * row_bytes)));
          std::memcpy(scales->data() + static_cast<size_t>(r0) * static_cast<size_t>(groups) * 4, qs,
                      static_cast<size_t>(n) * static_cast<size_t>(groups) * 4);
        });
        std::lock_guard<std::mutex> lock(kept->m);
        kept->scales = std::move(scales);
      };
      auto gen_scales = std::make_shared<passes::GeneratedBytes>();
      gen_scales->size = scale_bytes;
      gen_scales->write = [ep, source, v, d, eq, groups, scale_bytes,
                           kept](const std::function<void(std::span<const std::byte>)>& sink) {
        std::unique_ptr<std::vector<std::byte>> scales;
        {
          std::lock_guard<std::mutex> lock(kept->m);
          scales = std::move(kept->scales);  // handed over once: a second write computes them again
        }
        if (!scales) {
          scales = std::make_unique<std::vector<std::byte>>(scale_bytes);
          for_each_quantized_block(ep, source, v, d, eq, true, [&](int64_t r0, int64_t n, const uint8_t*, const float* qs) {
            std::memcpy(scales->data() + static_cast<size_t>(r0) * static_cast<size_t>(groups) * 4, qs,
                        static_cast<size_t>(n) * static_cast<size_t>(groups) * 4);
          });
        }
        sink(*scales);
      };
      generated = std::move(gen);
      generated_scales = std::move(gen_scales);
      if (report) report->streamed.push_back(table);
    }
    if (report) report->tables.push_back(fmt::format("{} [{}, {}] -> int{} [{}, {}] + fp32 scales [{}, {}]", table, v,
                                                     d, q.bits, v, q.bits == 4 ? d / 2 : d, v, groups));
    auto contiguous = [](ScalarType dt, std::vector<int64_t> sizes) {
      graph::TensorMeta m;
      m.dtype = dt;
      m.sizes = sizes;
      m.strides.assign(sizes.size(), 1);
      for (size_t k = sizes.size(); k-- > 1;) m.strides[k - 1] = m.strides[k] * sizes[k];
      return m;
    };
    auto fresh = [&](std::string base) {
      std::string name = base;
      for (int k = 1; g.find_value(name); ++k) name = fmt::format("{}_{}", base, k);
      return name;
    };
    const graph::ValueId qv = g.add_value(fresh(node_name + "_qweight"),
                                          contiguous(q.bits == 4 ? ScalarType::Byte : ScalarType::Char,
                                                     {v, q.bits == 4 ? d / 2 : d}));
    passes::ConstantData qc{nullptr, std::move(data_bytes_now), fmt::format("{} (int{} embedding)", table, q.bits)};
    qc.generated = std::move(generated);
    program.constants[qv] = std::move(qc);
    const graph::ValueId sv = g.add_value(fresh(node_name + "_qscales"), contiguous(ScalarType::Float, {v, groups}));
    passes::ConstantData sc{nullptr, std::move(scales_now), fmt::format("{} (int{} embedding scales)", table, q.bits)};
    sc.generated = std::move(generated_scales);
    program.constants[sv] = std::move(sc);
    graph::Node& n = g.nodes[i];  // re-fetched: add_value does not move nodes, but keep it obvious
    const graph::Argument indices = n.input("indices")->arg;
    n.target = q.bits == 4 ? "quantized_decomposed.embedding_4bit.default" : "quantized_decomposed.embedding_byte.default";
    n.inputs = {{"weight", graph::Argument::tensor(qv), false},
                {"weight_scales", graph::Argument::tensor(sv), false},
                {"weight_zero_points", graph::Argument::none(), false},
                {"weight_quant_min", graph::Argument::integer(q.bits == 4 ? -8 : -128), false},
                {"weight_quant_max", graph::Argument::integer(q.bits == 4 ? 7 : 127), false},
                {"indices", indices, false}};
    if (reads_of(g, w) == 0) program.constants.erase(w);
    ++rewritten;
  }
  return rewritten;
}

}  // namespace kiln::backends::xnnpack
