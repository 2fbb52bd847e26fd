// kiln lower --calibrate: activation statistics from kiln's runtime, AWQ-style scales folded into constants
// (kiln/compiler/calibrate.h).
#include "kiln/compiler/calibrate.h"

#include "kiln/core/error.h"
#include "kiln/emit/emitter.h"
#include "kiln/pte/pte_writer.h"
#include "kiln/runtime/program.h"
#include "kiln/tokenizer/tokenizer.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <thread>
#include <unistd.h>

namespace kiln::compiler {
namespace {

namespace fs = std::filesystem;
using backends::xnnpack::QuantScheme;
using graph::ValueId;

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::optional<ValueId> tensor_input(const graph::Node& n, std::string_view name) {
  const graph::NamedArgument* a = n.input(name);
  if (!a || a->arg.kind != graph::Argument::Kind::Tensor) return std::nullopt;
  return std::get<ValueId>(a->arg.payload);
}

// nodes that only reshape a contiguous tensor: the channel (last) dimension is kept when the sizes' last entry is
bool is_view(const graph::Node& n) {
  static const std::set<std::string, std::less<>> views = {
      "aten.view_copy.default", "aten._unsafe_view.default", "aten.reshape.default", "aten.view.default",
      "aten.clone.default", "aten.alias_copy.default", "aten.squeeze_copy.dims", "aten.squeeze_copy.dim",
      "aten.unsqueeze_copy.default", "dim_order_ops._clone_dim_order.default"};
  return views.contains(n.target) && n.output_ids().size() == 1 && tensor_input(n, "self").has_value();
}

// A linear layer with a constant fp32 weight W [N, K], in one of the edge forms the payload quantizes:
//   Permuted    mm/addmm(x, permute_copy(W, [1, 0]))
//   Transposed  mm/addmm(x, W^T) with W^T [K, N] a constant (a transpose folded ahead of time)
//   Head        mm(W, permute_copy(x, [1, 0])) (a tied LM head's form)
struct Site {
  enum class Form { Permuted, Transposed, Head } form;
  size_t node;    // the product
  size_t reader;  // the node reading x (the product, or the Head form's permute)
  ValueId weight, x;
  int64_t n, k;
  bool quantized;  // not kept fp32 by --quantize-skip
};

// One input several linear layers read, and where 1/s can be folded.
struct Group {
  ValueId root;  // the value before any view
  std::vector<size_t> sites;
  int64_t k = 0;
  enum class Fold { None, Norm, Rows } fold = Fold::None;
  ValueId norm = -1;     // Norm: the 1-D multiplier constant
  size_t row_site = 0;   // Rows: the site whose weight rows produce one factor of the root's product
  std::vector<double> abs_sum, sq_sum;
  int64_t rows = 0;
  std::vector<float> s;  // the chosen scales (1 when alpha is 0)
  std::vector<float> gram;  // GPTQ: sum x x^T over every token, the upper triangle (row i: columns i..k-1)
  size_t first_node = SIZE_MAX;  // the first of its products in the program (sequential GPTQ's order)
  bool gram_folded = false;      // the gram is of x' = x / s (a run of the program with AWQ's fold in it)
};

struct Graph {
  const passes::EdgeProgram& p;
  std::vector<std::vector<size_t>> readers;  // per value: reading nodes
  std::vector<int> output_reads;
  explicit Graph(const passes::EdgeProgram& program) : p(program) {
    readers.resize(p.graph.values.size());
    output_reads.assign(p.graph.values.size(), 0);
    for (size_t i = 0; i < p.graph.nodes.size(); ++i)
      for (const auto& in : p.graph.nodes[i].inputs)
        for (ValueId id : in.arg.tensor_ids()) readers[static_cast<size_t>(id)].push_back(i);
    for (const auto& o : p.graph.outputs)
      for (ValueId id : o.tensor_ids()) ++output_reads[static_cast<size_t>(id)];
    for (ValueId id : p.outputs) ++output_reads[static_cast<size_t>(id)];
  }
  const graph::Node* producer(ValueId v) const {
    const int32_t i = p.graph.value(v).producer;
    return i < 0 ? nullptr : &p.graph.nodes[static_cast<size_t>(i)];
  }
  int64_t last_dim(ValueId v) const {
    const auto& s = p.graph.value(v).meta.sizes;
    return s.empty() ? -1 : s.back();
  }
  // v before views that keep its last dimension k
  ValueId root(ValueId v, int64_t k) const {
    for (const graph::Node* n = producer(v); n && is_view(*n);) {
      const ValueId in = *tensor_input(*n, "self");
      if (last_dim(in) != k) break;
      v = in;
      n = producer(v);
    }
    return v;
  }
  // every reader of v, through views, is one of `sites` reading it as x (nothing else sees v)
  bool only_feeds(ValueId v, const std::set<size_t>& sites) const {
    if (output_reads[static_cast<size_t>(v)] > 0 || p.mutable_buffer(v)) return false;
    for (size_t r : readers[static_cast<size_t>(v)]) {
      const graph::Node& n = p.graph.nodes[r];
      if (sites.contains(r)) continue;
      if (!is_view(n)) return false;
      for (ValueId o : n.output_ids())
        if (!only_feeds(o, sites)) return false;
    }
    return true;
  }
  int64_t reads(ValueId v) const {
    return static_cast<int64_t>(readers[static_cast<size_t>(v)].size()) + output_reads[static_cast<size_t>(v)];
  }
};

std::vector<float> floats(const passes::EdgeProgram& p, ValueId v) {
  const std::vector<std::byte> b = p.constant_bytes(v);
  std::vector<float> f(b.size() / sizeof(float));
  std::memcpy(f.data(), b.data(), f.size() * sizeof(float));
  return f;
}

void set_floats(passes::EdgeProgram& p, ValueId v, const std::vector<float>& f) {
  auto bytes = std::make_shared<std::vector<std::byte>>(f.size() * sizeof(float));
  std::memcpy(bytes->data(), f.data(), bytes->size());
  passes::ConstantData& c = p.constants.at(v);
  c.source = nullptr;
  c.bytes = std::move(bytes);
}

// the bf16 nearest f (round half to even), as the payload stores scales
uint16_t bf16_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
float bf16_value(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// sum x[i] y[i], four lanes at a time (the vector extension: -O2 does not vectorise a plain reduction)
double dot(const double* x, const double* y, int64_t n) {
  typedef double V __attribute__((vector_size(32)));
  V acc{};
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    V vx, vy;
    std::memcpy(&vx, x + i, sizeof vx);
    std::memcpy(&vy, y + i, sizeof vy);
    acc += vx * vy;
  }
  double t = acc[0] + acc[1] + acc[2] + acc[3];
  for (; i < n; ++i) t += x[i] * y[i];
  return t;
}

// GPTQ's scale refit (8da4w): with the int4 codes q that GPTQ chose kept, each row's bf16 group scales s re-fitted to
// the layer objective (w - Q s)^T H (w - Q s) (Q: the row's codes, group b's codes in column b): the exact least
// squares over all of the row's scales together, A s = b with A[a][b] = q_a^T H_ab q_b, b_a = q_a^T (H w)_a (2 k^2
// per row). Not each group alone on H's diagonal block (s_b = q_b^T H_bb w_b / q_b^T H_bb q_b): that ignores the
// error GPTQ's feedback moved between groups and raised the objective (tiny LM: 3.3k against GPTQ's 1.3k; SmolLM2:
// 19.42 perplexity against 18.40, bench/RESULTS.md). The rounded scales are kept for a row only where they lower its
// objective (a quadratic in s: exact from A and b). `ridge`: the objective on H + ridge I (GPTQ's damping, which the
// caller passes: on the undamped H the refit fits the calibration text's few directions; SmolLM2, 840 tokens: 18.34
// perplexity undamped, 18.10 damped, against GPTQ's 18.40).
void refit_scales(backends::xnnpack::QuantizedWeights& q, const std::vector<float>& w, int64_t n, int64_t k,
                  int64_t g, const std::vector<double>& h, double ridge) {
  const int64_t groups = k / g;
  const auto* codes = reinterpret_cast<const uint8_t*>(q.data.data());
  auto rows = [&](int64_t r0, int64_t r1) {
    std::vector<double> a(static_cast<size_t>(groups * groups)), b(static_cast<size_t>(groups)), qr(static_cast<size_t>(k)),
        s0(static_cast<size_t>(groups)), s(static_cast<size_t>(groups)), wd(static_cast<size_t>(k));
    for (int64_t r = r0; r < r1; ++r) {
      for (int64_t c = 0; c < k; c += 2) {
        const uint8_t byte = codes[r * (k / 2) + c / 2];
        qr[static_cast<size_t>(c)] = (byte & 15) - 8;
        qr[static_cast<size_t>(c + 1)] = (byte >> 4) - 8;
      }
      uint16_t* sc = reinterpret_cast<uint16_t*>(q.scales.data()) + r * groups;
      for (int64_t j = 0; j < groups; ++j) s0[static_cast<size_t>(j)] = bf16_value(sc[j]);
      const float* wr = w.data() + r * k;
      for (int64_t c = 0; c < k; ++c) wd[static_cast<size_t>(c)] = wr[c];
      std::fill(a.begin(), a.end(), 0.0);
      std::fill(b.begin(), b.end(), 0.0);
      double whw = 0;
      for (int64_t i = 0; i < k; ++i) {
        const double* hi = h.data() + i * k;
        const int64_t gi = i / g;
        const double qi = qr[static_cast<size_t>(i)];
        const double t = dot(hi, wd.data(), k);
        whw += wr[i] * t;
        b[static_cast<size_t>(gi)] += qi * t;
        if (qi != 0)
          for (int64_t gj = 0; gj < groups; ++gj)
            a[static_cast<size_t>(gi * groups + gj)] += qi * dot(hi + gj * g, qr.data() + gj * g, g);
      }
      if (ridge > 0)  // H + ridge I (GPTQ's damping): its diagonal's part of A, b and w^T H w
        for (int64_t i = 0; i < k; ++i) {
          const double qi = qr[static_cast<size_t>(i)];
          a[static_cast<size_t>((i / g) * groups + i / g)] += ridge * qi * qi;
          b[static_cast<size_t>(i / g)] += ridge * qi * wr[i];
          whw += ridge * static_cast<double>(wr[i]) * wr[i];
        }
      // the objective for scales x: w^T H w - 2 x.b + x^T A x
      auto obj = [&](const std::vector<double>& x) {
        double o = whw;
        for (int64_t i = 0; i < groups; ++i) {
          o -= 2 * x[static_cast<size_t>(i)] * b[static_cast<size_t>(i)];
          for (int64_t j = 0; j < groups; ++j)
            o += x[static_cast<size_t>(i)] * a[static_cast<size_t>(i * groups + j)] * x[static_cast<size_t>(j)];
        }
        return o;
      };
      double mean = 0;
      for (int64_t i = 0; i < groups; ++i) mean += a[static_cast<size_t>(i * groups + i)];
      mean /= static_cast<double>(groups);
      if (!(mean > 0)) continue;
      // ridge toward the old scales (1e-6 of A's mean diagonal): a group the text never excited keeps its scale
      std::vector<double> m = a;
      s = b;
      for (int64_t i = 0; i < groups; ++i) {
        m[static_cast<size_t>(i * groups + i)] += 1e-6 * mean;
        s[static_cast<size_t>(i)] += 1e-6 * mean * s0[static_cast<size_t>(i)];
      }
      // Gaussian elimination with partial pivoting (groups <= a few hundred)
      bool ok = true;
      for (int64_t c = 0; c < groups && ok; ++c) {
        int64_t p = c;
        for (int64_t i = c + 1; i < groups; ++i)
          if (std::abs(m[static_cast<size_t>(i * groups + c)]) > std::abs(m[static_cast<size_t>(p * groups + c)])) p = i;
        if (!(std::abs(m[static_cast<size_t>(p * groups + c)]) > 0)) { ok = false; break; }
        if (p != c) {
          for (int64_t j = 0; j < groups; ++j) std::swap(m[static_cast<size_t>(c * groups + j)], m[static_cast<size_t>(p * groups + j)]);
          std::swap(s[static_cast<size_t>(c)], s[static_cast<size_t>(p)]);
        }
        for (int64_t i = c + 1; i < groups; ++i) {
          const double f = m[static_cast<size_t>(i * groups + c)] / m[static_cast<size_t>(c * groups + c)];
          if (f == 0) continue;
          for (int64_t j = c; j < groups; ++j) m[static_cast<size_t>(i * groups + j)] -= f * m[static_cast<size_t>(c * groups + j)];
          s[static_cast<size_t>(i)] -= f * s[static_cast<size_t>(c)];
        }
      }
      if (!ok) continue;
      for (int64_t c = groups - 1; c >= 0; --c) {
        double t = s[static_cast<size_t>(c)];
        for (int64_t j = c + 1; j < groups; ++j) t -= m[static_cast<size_t>(c * groups + j)] * s[static_cast<size_t>(j)];
        s[static_cast<size_t>(c)] = t / m[static_cast<size_t>(c * groups + c)];
      }
      std::vector<uint16_t> bits(static_cast<size_t>(groups));
      std::vector<double> rounded(static_cast<size_t>(groups));
      bool finite = true;
      for (int64_t i = 0; i < groups; ++i) {
        const float f = static_cast<float>(s[static_cast<size_t>(i)]);
        finite = finite && std::isfinite(f) && f > 0;
        bits[static_cast<size_t>(i)] = bf16_bits(f);
        rounded[static_cast<size_t>(i)] = bf16_value(bits[static_cast<size_t>(i)]);
      }
      if (!finite || !(obj(rounded) < obj(s0))) continue;
      for (int64_t i = 0; i < groups; ++i) sc[i] = bits[static_cast<size_t>(i)];
    }
  };
  const int64_t threads = std::clamp<int64_t>(std::thread::hardware_concurrency(), 1, std::min<int64_t>(8, n));
  std::vector<std::thread> pool;
  for (int64_t t = 1; t < threads; ++t) pool.emplace_back([&, t] { rows(n * t / threads, n * (t + 1) / threads); });
  rows(0, n / threads);
  for (auto& th : pool) th.join();
}

// the quantized weight as fp32 [n, k] (quantize.h's layouts)
std::vector<float> dequantize(const backends::xnnpack::QuantizedWeights& q, int64_t n, int64_t k,
                              const QuantScheme& s) {
  std::vector<float> w(static_cast<size_t>(n * k));
  if (s.kind == QuantScheme::Kind::Int4Groups) {
    const auto* bytes = reinterpret_cast<const uint8_t*>(q.data.data());
    const int64_t groups = k / s.group;
    for (int64_t r = 0; r < n; ++r)
      for (int64_t b = 0; b < groups; ++b) {
        uint16_t b16;
        std::memcpy(&b16, q.scales.data() + static_cast<size_t>(r * groups + b) * 2, 2);
        const uint32_t u = static_cast<uint32_t>(b16) << 16;
        float scale, offset = 0.0f;  // (--quantize-scales asym: scale q + offset)
        std::memcpy(&scale, &u, 4);
        if (backends::xnnpack::has_offsets(s))
          std::memcpy(&offset, q.offsets.data() + static_cast<size_t>(r * groups + b) * 4, 4);
        for (int64_t c = b * s.group; c < (b + 1) * s.group; c += 2) {  // the even input in the low nibble
          const uint8_t byte = bytes[r * (k / 2) + c / 2];
          w[static_cast<size_t>(r * k + c)] = static_cast<float>((byte & 15) - 8) * scale + offset;
          w[static_cast<size_t>(r * k + c + 1)] = static_cast<float>((byte >> 4) - 8) * scale + offset;
        }
      }
  } else {
    const auto* codes = reinterpret_cast<const int8_t*>(q.data.data());
    for (int64_t r = 0; r < n; ++r) {
      float scale;
      std::memcpy(&scale, q.scales.data() + static_cast<size_t>(r) * 4, 4);
      for (int64_t c = 0; c < k; ++c) w[static_cast<size_t>(r * k + c)] = static_cast<float>(codes[r * k + c]) * scale;
    }
  }
  return w;
}

float bf16_round(float f) {  // to bf16 (nearest even), back to fp32
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  u &= 0xffff0000u;
  std::memcpy(&f, &u, 4);
  return f;
}

// The output-aware int4 groups: per group of `group` inputs, the bf16 scale s and codes q = clamp(round(v / s))
// minimising sum_i m_i (v_i - s q_i)^2 (m: the input's mean x_i^2, what each column's error costs at the output),
// searched over clipping ratios with weighted least-squares refits, written back as the grid values s q. Only
// codes that reach 7 or -8 are taken: the lowering's mse rule then finds that grid exactly again (its ratio 0.875
// or 1 candidate lands on s, and the refit of exact grid values is s itself), so the file holds this choice. A
// group keeps its values when no candidate beats the plain rule's codes `plain` (the weighted error never grows).
std::vector<bool> output_aware_groups(std::vector<float>& w, const std::vector<float>& plain, int64_t n, int64_t k,
                                      int64_t group, const std::vector<double>& m) {
  std::vector<bool> written(static_cast<size_t>(n * (k / group)), false);
  std::vector<float> q(static_cast<size_t>(group)), bq(static_cast<size_t>(group));
  for (int64_t r = 0; r < n; ++r)
    for (int64_t b = 0; b < k / group; ++b) {
      float* v = w.data() + r * k + b * group;
      const float* p = plain.data() + r * k + b * group;
      const double* mi = m.data() + b * group;
      float amax = 0;
      double base = 0;
      for (int64_t i = 0; i < group; ++i) {
        amax = std::max(amax, std::fabs(v[i]));
        base += mi[i] * (static_cast<double>(v[i]) - p[i]) * (static_cast<double>(v[i]) - p[i]);
      }
      if (!(amax > 1e-30f) || !std::isfinite(amax)) continue;
      double best = base;
      float best_s = 0;
      auto codes = [&](float inv) {
        int top = 0;
        for (int64_t i = 0; i < group; ++i) {
          q[i] = std::nearbyint(std::clamp(v[i] * inv, -8.0f, 7.0f));
          top = std::max(top, static_cast<int>(std::fabs(q[i])));
        }
        return top;
      };
      auto try_scale = [&](float inv) {
        codes(inv);
        double vq = 0, qq = 0;
        for (int64_t i = 0; i < group; ++i) vq += mi[i] * v[i] * q[i], qq += mi[i] * q[i] * q[i];
        if (!(qq > 0) || !(vq > 0)) return;
        const float sc = bf16_round(static_cast<float>(vq / qq));
        if (!(sc > 0) || codes(1.0f / sc) < 7) return;
        double e = 0;
        for (int64_t i = 0; i < group; ++i) {
          const double d = static_cast<double>(v[i]) - static_cast<double>(sc) * q[i];
          e += mi[i] * d * d;
        }
        if (e < best) best = e, best_s = sc, bq = q;
      };
      for (int c = 0; c <= 14; ++c) try_scale((0.7f + 0.05f * static_cast<float>(c)) * 8.0f / amax);
      if (best_s > 0) try_scale(1.0f / best_s);
      if (best_s > 0) {
        for (int64_t i = 0; i < group; ++i) v[i] = best_s * bq[i];
        written[static_cast<size_t>(r * (k / group) + b)] = true;
      }
    }
  return written;
}

// the scales of `alpha` from mean |x| (AWQ's: clamped below, normalised by sqrt(max * min))
std::vector<float> awq_scales(const std::vector<double>& mean_abs, double alpha) {
  std::vector<float> s(mean_abs.size(), 1.0f);
  if (alpha == 0.0) return s;
  double lo = INFINITY, hi = 0;
  std::vector<double> d(mean_abs.size());
  for (size_t i = 0; i < d.size(); ++i) {
    d[i] = std::pow(std::max(mean_abs[i], 1e-4), alpha);
    lo = std::min(lo, d[i]), hi = std::max(hi, d[i]);
  }
  const double norm = std::sqrt(lo * hi);
  for (size_t i = 0; i < d.size(); ++i) s[i] = static_cast<float>(d[i] / norm);
  return s;
}

// The program's fp32 run over the text: per group, sum |x_i| and x_i^2 over every token.
// With `generate` > 0 the text is the fp32 program's own: windows of max_positions tokens, each started from
// `seed` and continued by sampling the program's next-token distribution (temperature 1, the 40 most likely
// tokens, a fixed-seed generator: the same text every lowering), `generate` tokens in all (ids is then filled).
int64_t collect(const passes::EdgeProgram& edge, std::vector<Group>& groups, std::vector<int32_t>& ids,
                int64_t max_positions, int64_t generate = 0, int32_t seed = 0) {
  passes::EdgeProgram probe = edge;  // the same program, the groups' inputs as extra outputs
  const size_t first_extra = probe.outputs.size();
  for (const Group& g : groups) probe.outputs.push_back(g.root);
  probe.outputs_spec.clear();
  const pte::Program program = emit::emit_program(probe);
  const fs::path path = fs::temp_directory_path() / fmt::format("kiln-calibrate-{}.pte", ::getpid());
  struct Remove {
    fs::path p;
    ~Remove() {
      std::error_code ec;
      fs::remove(p, ec);
    }
  } remove{path};
  pte::write_pte(program, path.string());
  rt::ErrorMessage err;
  auto loaded = rt::Program::load(path.c_str(), &err);
  check(loaded.ok(), "--calibrate: the fp32 program does not load in kiln's runtime: {}", err.c_str());
  auto m = loaded.value().load_method("forward", &err);
  check(m.ok(), "--calibrate: the fp32 program's forward does not prepare: {}", err.c_str());
  rt::Method& f = m.value();
  check(f.num_inputs() == 2 && f.input(0).dtype == ScalarType::Long && f.input(0).dim == 2 &&
            f.input(1).dtype == ScalarType::Long && f.input(1).dim == 1,
        "--calibrate needs an LLM program forward(tokens [1, T], input_pos) (kiln_export llm)");
  const int64_t step = f.input(0).size(1);
  const bool dynamic = f.input_is_dynamic(0) && f.input_is_dynamic(1);
  const bool pos_vector = f.input(1).size(0) == step;
  const int64_t window = max_positions > 0 ? max_positions : step;
  std::vector<int64_t> tok(static_cast<size_t>(step)), pos(static_cast<size_t>(step));
  int64_t tokens = 0;
  auto accumulate = [&] {
      for (size_t gi = 0; gi < groups.size(); ++gi) {
        Group& g = groups[gi];
        const rt::Tensor& t = f.output(first_extra + gi);
        check(t.dtype == ScalarType::Float && t.numel % g.k == 0, "internal: calibration output {} is not [.., {}] fp32",
              gi, g.k);
        const float* x = t.data_as<const float>();
        const int64_t rows = t.numel / g.k;
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t c = 0; c < g.k; ++c) {
            const double v = x[r * g.k + c];
            g.abs_sum[static_cast<size_t>(c)] += std::fabs(v);
            g.sq_sum[static_cast<size_t>(c)] += v * v;
          }
        g.rows += rows;
        if (!g.gram.empty())  // the upper triangle of sum x x^T, row by row
          for (int64_t r = 0; r < rows; ++r) backends::xnnpack::gptq_gram_update(g.gram.data(), x + r * g.k, g.k);
      }
  };
  if (generate > 0) {
    check(step == 1 || dynamic, "--calibrate-self needs a program that takes one token per call (or any count)");
    uint64_t state = 0x9e3779b97f4a7c15ull;  // xorshift64*
    auto uniform = [&] {
      state ^= state >> 12, state ^= state << 25, state ^= state >> 27;
      return static_cast<double>((state * 0x2545f4914f6cdd1dull) >> 11) * 0x1p-53;
    };
    ids.clear();
    while (tokens < generate) {
      int32_t next = seed;
      for (int64_t at = 0; at < window && tokens < generate; ++at) {
        ids.push_back(next);
        tok[0] = next, pos[0] = at;
        const int64_t one[2] = {1, 1}, pshape[1] = {1};
        const bool ok = (dynamic ? f.set_input(0, tok.data(), 8, one, &err) : f.set_input(0, tok.data(), 8, &err)) ==
                            rt::Status::Ok &&
                        (dynamic ? f.set_input(1, pos.data(), 8, pshape, &err) : f.set_input(1, pos.data(), 8, &err)) ==
                            rt::Status::Ok &&
                        f.execute(&err) == rt::Status::Ok;
        check(ok, "--calibrate-self: the fp32 program failed at position {}: {}", at, err.c_str());
        accumulate();
        ++tokens;
        const rt::Tensor& logits = f.output(0);
        check(logits.dtype == ScalarType::Float && logits.numel > 0, "--calibrate-self: the program's first output is not fp32 logits");
        const int64_t vocab = logits.size(logits.dim - 1);
        const float* l = logits.data_as<const float>() + (logits.numel - vocab);
        std::vector<int32_t> order(static_cast<size_t>(vocab));
        for (int32_t v = 0; v < vocab; ++v) order[static_cast<size_t>(v)] = v;
        const int64_t top = std::min<int64_t>(40, vocab);
        std::partial_sort(order.begin(), order.begin() + top, order.end(), [&](int32_t a, int32_t b) {
          return l[a] > l[b] || (l[a] == l[b] && a < b);
        });
        double total = 0;
        std::vector<double> p(static_cast<size_t>(top));
        for (int64_t i = 0; i < top; ++i) total += p[static_cast<size_t>(i)] = std::exp(static_cast<double>(l[order[static_cast<size_t>(i)]]) - l[order[0]]);
        double u = uniform() * total;
        next = order[static_cast<size_t>(top - 1)];
        for (int64_t i = 0; i < top; ++i)
          if ((u -= p[static_cast<size_t>(i)]) < 0) {
            next = order[static_cast<size_t>(i)];
            break;
          }
      }
    }
    return tokens;
  }
  for (size_t w0 = 0; w0 < ids.size(); w0 += static_cast<size_t>(window)) {
    const int64_t wlen = std::min<int64_t>(window, static_cast<int64_t>(ids.size() - w0));
    for (int64_t at = 0; at < wlen;) {
      int64_t n = std::min(step, wlen - at);
      if (!dynamic && n < step) break;  // a static program takes whole steps
      for (int64_t i = 0; i < n; ++i) {
        tok[static_cast<size_t>(i)] = ids[w0 + static_cast<size_t>(at + i)];
        pos[static_cast<size_t>(i)] = at + i;
      }
      const int64_t tshape[2] = {1, n}, pshape[1] = {pos_vector ? n : 1};
      const bool ok = (dynamic ? f.set_input(0, tok.data(), static_cast<size_t>(n) * 8, tshape, &err)
                               : f.set_input(0, tok.data(), static_cast<size_t>(n) * 8, &err)) == rt::Status::Ok &&
                      (dynamic ? f.set_input(1, pos.data(), static_cast<size_t>(pshape[0]) * 8, pshape, &err)
                               : f.set_input(1, pos.data(), static_cast<size_t>(pshape[0]) * 8, &err)) ==
                          rt::Status::Ok &&
                      f.execute(&err) == rt::Status::Ok;
      check(ok, "--calibrate: the fp32 program failed at positions {}..{}: {}", at, at + n - 1, err.c_str());
      accumulate();
      tokens += n;
      at += n;
    }
  }
  return tokens;
}

}  // namespace

CalibrationResult calibrate_awq(passes::EdgeProgram& edge, const std::string& text_path,
                                const std::string& tokenizer_path, int64_t max_positions, const QuantScheme& scheme,
                                const std::function<bool(const graph::Node&, graph::ValueId)>& keep_fp32,
                                const std::function<void(std::string_view)>& progress, CalibrationMethod method,
                                int64_t self_tokens, bool scales_only,
                                const std::map<ValueId, QuantScheme>& per_weight_given,
                                const CalibrationPlanner& plan) {
  CalibrationResult result;
  // the scheme each layer is stored in (--quantize-head 8: the head's 8da8w; PayloadOptions::per_weight; with
  // --quantize auto, the plan's choices once `plan` has run)
  std::map<ValueId, QuantScheme> per_weight = per_weight_given;
  auto scheme_of = [&](ValueId w) -> const QuantScheme& {
    const auto it = per_weight.find(w);
    return it != per_weight.end() ? it->second : scheme;
  };
  result.method = calibration_method_name(method);
  const bool gptq = method.gptq, awq = method.awq, act_order = method.act_order, refit = method.refit;
  check(!scales_only || !gptq || plan, "internal: calibration scales only with awq");
  check(scheme.kind == QuantScheme::Kind::Int4Groups || scheme.kind == QuantScheme::Kind::Int8Channels,
        "--calibrate needs --quantize 8da4w or 8da8w");
  std::vector<int32_t> ids;
  int32_t seed = 0;  // --calibrate-self: each window starts from the BOS token (or <|endoftext|>, or id 0)
  if (self_tokens > 0) {
    std::string why;
    std::unique_ptr<tok::Tokenizer> tokenizer;
    if (!tokenizer_path.empty()) tokenizer = tok::Tokenizer::load(tokenizer_path, &why);
    if (tokenizer) seed = tokenizer->bos_id().value_or(tokenizer->id_of("<|endoftext|>").value_or(0));
  } else {
    std::string text;
    {
      std::ifstream in(text_path, std::ios::binary);
      check(static_cast<bool>(in), "{}: cannot open the calibration text", text_path);
      text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    }
    check(!tokenizer_path.empty(), "--calibrate: no tokenizer.json (nor tokenizer.model) beside the spec");
    std::string why;
    auto tokenizer = tok::Tokenizer::load(tokenizer_path, &why);
    check(tokenizer != nullptr, "{}", why);
    check(tokenizer->encode(text, &ids, &why, false), "{}: {}", text_path, why);
    check(ids.size() >= 2, "{}: the calibration text has {} tokens (at least 2)", text_path, ids.size());
  }

  // the linear layers, grouped by the input they read
  const Graph g(edge);
  std::vector<Site> sites;
  for (size_t i = 0; i < edge.graph.nodes.size(); ++i) {
    const graph::Node& n = edge.graph.nodes[i];
    if (n.target != "aten.mm.default" && n.target != "aten.addmm.default") continue;
    auto self = tensor_input(n, "self"), mat2 = tensor_input(n, "mat2");
    if (!self || !mat2) continue;
    auto fp32_matrix = [&](ValueId v) {
      const auto& m = edge.graph.value(v).meta;
      return edge.is_constant(v) && !edge.constants.at(v).quantized && m.dtype == ScalarType::Float &&
             m.sizes.size() == 2 && g.reads(v) == 1;
    };
    auto transpose_of = [&](ValueId v) -> std::optional<ValueId> {  // v = permute_copy(u, [1, 0]) read once
      const graph::Node* t = g.producer(v);
      const graph::NamedArgument* dims = t ? t->input("dims") : nullptr;
      if (!t || t->target != "aten.permute_copy.default" || !dims || dims->arg.kind != graph::Argument::Kind::Ints ||
          std::get<std::vector<int64_t>>(dims->arg.payload) != std::vector<int64_t>{1, 0} || g.reads(v) != 1)
        return std::nullopt;
      return tensor_input(*t, "self");
    };
    const bool keep = keep_fp32 && keep_fp32(n, edge.is_constant(*self) ? *self : *mat2);
    if (auto w = transpose_of(*mat2); w && fp32_matrix(*w) && !edge.is_constant(*self)) {
      const auto& sz = edge.graph.value(*w).meta.sizes;
      sites.push_back({Site::Form::Permuted, i, i, *w, *self, sz[0], sz[1], false});
    } else if (fp32_matrix(*mat2) && !edge.is_constant(*self)) {
      const auto& sz = edge.graph.value(*mat2).meta.sizes;
      sites.push_back({Site::Form::Transposed, i, i, *mat2, *self, sz[1], sz[0], false});
    } else if (auto x = transpose_of(*mat2); n.target == "aten.mm.default" && x && fp32_matrix(*self) &&
                                             !edge.is_constant(*x)) {
      const auto& sz = edge.graph.value(*self).meta.sizes;
      sites.push_back({Site::Form::Head, i, static_cast<size_t>(edge.graph.value(*mat2).producer), *self, *x, sz[0],
                       sz[1], false});
    } else {
      continue;
    }
    sites.back().quantized = !keep;
  }
  std::map<ValueId, size_t> group_of_root;
  std::vector<Group> groups;
  for (size_t s = 0; s < sites.size(); ++s) {
    const ValueId root = g.root(sites[s].x, sites[s].k);
    auto [it, fresh] = group_of_root.try_emplace(root, groups.size());
    if (fresh) {
      groups.emplace_back();
      groups.back().root = root;
      groups.back().k = sites[s].k;
    }
    if (groups[it->second].k == sites[s].k) {
      groups[it->second].sites.push_back(s);
      groups[it->second].first_node = std::min(groups[it->second].first_node, sites[s].node);
    }
  }
  std::map<size_t, size_t> site_of_node;
  for (size_t s = 0; s < sites.size(); ++s) site_of_node[sites[s].node] = s;
  for (Group& gr : groups) {
    std::set<size_t> nodes;
    for (size_t s : gr.sites) nodes.insert(sites[s].reader);
    const graph::Node* prod = g.producer(gr.root);
    if (!prod || prod->target != "aten.mul.Tensor" || !g.only_feeds(gr.root, nodes)) continue;
    auto a = tensor_input(*prod, "self"), b = tensor_input(*prod, "other");
    if (!a || !b) continue;
    for (ValueId c : {*a, *b}) {  // a norm's weight: a constant [K] only this product reads
      const auto& m = edge.graph.value(c).meta;
      if (edge.is_constant(c) && m.dtype == ScalarType::Float && m.sizes == std::vector<int64_t>{gr.k} &&
          g.reads(c) == 1 && !edge.constants.at(c).quantized) {
        gr.fold = Group::Fold::Norm, gr.norm = c;
        break;
      }
    }
    if (gr.fold != Group::Fold::None || edge.is_constant(*a) || edge.is_constant(*b)) continue;
    for (ValueId c : {*b, *a}) {  // a factor that is a linear layer's output [.., K], read only here
      const ValueId r = g.root(c, gr.k);
      const graph::Node* mm = g.producer(r);
      if (!mm) continue;
      auto site = site_of_node.find(static_cast<size_t>(mm - edge.graph.nodes.data()));
      if (site == site_of_node.end() || sites[site->second].n != gr.k || sites[site->second].form == Site::Form::Head)
        continue;
      bool single = true;  // the chain from the product to the factor is read once at each step
      for (ValueId v = c; single && v != r;) {
        single = g.reads(v) == 1;
        v = *tensor_input(*g.producer(v), "self");
      }
      if (single && g.reads(r) == 1) {
        gr.fold = Group::Fold::Rows, gr.row_site = site->second;
        break;
      }
    }
  }
  // AWQ needs a foldable producer; GPTQ takes every input whose layers are quantized
  std::erase_if(groups, [&](const Group& gr) {
    return (!gptq || std::none_of(gr.sites.begin(), gr.sites.end(), [&](size_t si) { return sites[si].quantized; })) &&
           gr.fold == Group::Fold::None;
  });
  result.inputs_found =
      std::count_if(groups.begin(), groups.end(), [](const Group& gr) { return gr.fold != Group::Fold::None; });
  if (groups.empty()) return result;
  // sequential GPTQ: the inputs whose layers GPTQ quantizes, in program order, cut into stages of consecutive inputs
  // (kGptqStages at most: about one per transformer block); the first stage's H from the first run, each later
  // stage's from a run of the program with the stages before it quantized
  std::vector<std::vector<ValueId>> stages;  // by root
  if (gptq && method.sequential) {
    std::vector<const Group*> ordered;
    for (const Group& gr : groups)
      if (std::any_of(gr.sites.begin(), gr.sites.end(), [&](size_t si) { return sites[si].quantized; }))
        ordered.push_back(&gr);
    std::stable_sort(ordered.begin(), ordered.end(),
                     [](const Group* a, const Group* b) { return a->first_node < b->first_node; });
    static constexpr size_t kGptqStages = 32;
    const size_t per_stage = std::max<size_t>(1, (ordered.size() + kGptqStages - 1) / kGptqStages);
    for (size_t at = 0; at < ordered.size(); at += per_stage) {
      stages.emplace_back();
      for (size_t i = at; i < std::min(ordered.size(), at + per_stage); ++i) stages.back().push_back(ordered[i]->root);
    }
  }
  for (Group& gr : groups) {
    gr.abs_sum.assign(static_cast<size_t>(gr.k), 0.0), gr.sq_sum.assign(static_cast<size_t>(gr.k), 0.0);
    gr.s.assign(static_cast<size_t>(gr.k), 1.0f);
    if (gptq && (stages.empty() || std::find(stages[0].begin(), stages[0].end(), gr.root) != stages[0].end())) {
      gr.gram.assign(static_cast<size_t>(gr.k * gr.k), 0.0f);
      result.gram_bytes += gr.k * gr.k * static_cast<int64_t>(sizeof(float));
    }
  }

  if (progress)
    progress(fmt::format("calibrating: running the fp32 program over {} tokens of {} ({} inputs of linear layers)",
                         ids.size(), text_path, groups.size()));
  auto t0 = std::chrono::steady_clock::now();
  result.tokens = collect(edge, groups, ids, max_positions, self_tokens, seed);
  result.run_seconds = seconds_since(t0);
  check(result.tokens > 0, "{}: the calibration text is shorter than one step of the program", text_path);

  // the search: inputs whose 1/s goes into another layer's rows first (that layer's own search then sees them)
  t0 = std::chrono::steady_clock::now();
  if (progress) progress("calibrating: searching the scales");
  std::stable_sort(groups.begin(), groups.end(),
                   [](const Group& x, const Group& y) { return x.fold == Group::Fold::Rows && y.fold != Group::Fold::Rows; });
  std::map<ValueId, std::vector<float>> current;  // weights read (rescaled or not) so far
  std::set<ValueId> rescaled;
  std::map<ValueId, const Site*> site_of_weight;
  for (const Site& st : sites) site_of_weight[st.weight] = &st;
  auto transpose = [](const std::vector<float>& a, int64_t rows, int64_t cols) {  // [rows, cols] -> [cols, rows]
    std::vector<float> t(a.size());
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) t[static_cast<size_t>(c * rows + r)] = a[static_cast<size_t>(r * cols + c)];
    return t;
  };
  auto weight = [&](ValueId w) -> std::vector<float>& {  // as [N, K]
    auto it = current.find(w);
    if (it == current.end()) {
      const Site& st = *site_of_weight.at(w);
      std::vector<float> f = floats(edge, w);
      if (st.form == Site::Form::Transposed) f = transpose(f, st.k, st.n);
      it = current.emplace(w, std::move(f)).first;
    }
    return it->second;
  };
  static constexpr int kGrid = 10;
  const bool output_aware =
      !scales_only && !gptq && scheme.kind == QuantScheme::Kind::Int4Groups && scheme.scales == backends::xnnpack::ScaleRule::Mse;
  for (Group& gr : groups) {
    if (!awq || gr.fold == Group::Fold::None) continue;
    const size_t k = static_cast<size_t>(gr.k);
    std::vector<double> mean_abs(k), mean_sq(k);
    for (size_t c = 0; c < k; ++c)
      mean_abs[c] = gr.abs_sum[c] / static_cast<double>(gr.rows), mean_sq[c] = gr.sq_sum[c] / static_cast<double>(gr.rows);
    double best_err = INFINITY, err0 = 0;
    int best = 0;
    for (int a = 0; a <= kGrid; ++a) {
      const std::vector<float> s = awq_scales(mean_abs, a / static_cast<double>(kGrid));
      double err = 0;
      for (size_t si : gr.sites) {
        const Site& st = sites[si];
        if (!st.quantized) continue;
        const std::vector<float>& w = weight(st.weight);
        std::vector<float> scaled(w.size());
        for (int64_t r = 0; r < st.n; ++r)
          for (size_t c = 0; c < k; ++c) scaled[r * k + c] = w[r * k + c] * s[c];
        const QuantScheme& sw = scheme_of(st.weight);
        const std::vector<float> dq = dequantize(backends::xnnpack::quantize_weights(scaled.data(), st.n, st.k, sw),
                                                 st.n, st.k, sw);
        for (int64_t r = 0; r < st.n; ++r)
          for (size_t c = 0; c < k; ++c) {
            const double d = static_cast<double>(w[r * k + c]) - static_cast<double>(dq[r * k + c]) / s[c];
            err += d * d * mean_sq[c];
          }
      }
      if (a == 0) err0 = err;
      if (err < best_err) best_err = err, best = a;
    }
    result.proxy_before += err0;
    result.proxy_after += best_err;
    std::string layers;
    for (size_t si : gr.sites)
      layers += (layers.empty() ? "" : ", ") + edge.constants.at(sites[si].weight).name;
    const std::string producer = gr.fold == Group::Fold::Norm ? edge.constants.at(gr.norm).name
                                                              : edge.constants.at(sites[gr.row_site].weight).name + " (rows)";
    result.choices.push_back(fmt::format("{} -> {}: alpha {:.1f}, error proxy {:+.1f}%", producer, layers,
                                         best / static_cast<double>(kGrid),
                                         err0 > 0 ? 100.0 * (best_err - err0) / err0 : 0.0));
    auto drop_unscaled = [&] {  // weights this search read and left as they are: back to streaming from the .pt2
      for (size_t si : gr.sites)
        if (!rescaled.contains(sites[si].weight)) current.erase(sites[si].weight);
    };
    if (best == 0 && !output_aware) {
      drop_unscaled();
      continue;
    }
    const std::vector<float> s = awq_scales(mean_abs, best / static_cast<double>(kGrid));
    gr.s = s;
    for (size_t si : gr.sites) {
      std::vector<float>& w = weight(sites[si].weight);
      for (int64_t r = 0; r < sites[si].n; ++r)
        for (size_t c = 0; c < k; ++c) w[r * k + c] *= s[c];
      rescaled.insert(sites[si].weight);
      if (best > 0) ++result.layers_scaled;
    }
    if (best == 0) {
    } else if (gr.fold == Group::Fold::Norm) {
      std::vector<float> gamma = floats(edge, gr.norm);
      for (size_t c = 0; c < k; ++c) gamma[c] /= s[c];
      set_floats(edge, gr.norm, gamma);
    } else {
      const Site& up = sites[gr.row_site];
      std::vector<float>& w = weight(up.weight);
      for (size_t r = 0; r < k; ++r)
        for (int64_t c = 0; c < up.k; ++c) w[r * static_cast<size_t>(up.k) + static_cast<size_t>(c)] /= s[r];
      rescaled.insert(up.weight);
    }
    if (best > 0) ++result.inputs_scaled;
  }
  // the output-aware groups last, once every fold is in (down's 1/s is in up's rows)
  if (output_aware) {
    if (progress) progress("calibrating: output-aware int4 groups");
    for (const Group& gr : groups) {
      for (size_t si : gr.sites) {
        const Site& st = sites[si];
        if (!st.quantized || scheme_of(st.weight).kind != QuantScheme::Kind::Int4Groups) continue;
        std::vector<float>& w = weight(st.weight);
        std::vector<double> m(static_cast<size_t>(st.k));  // x' = x / s: mean x'^2 per column
        for (size_t c = 0; c < m.size(); ++c) m[c] = gr.sq_sum[c] / static_cast<double>(gr.rows) / (gr.s[c] * gr.s[c]);
        const std::vector<float> plain =
            dequantize(backends::xnnpack::quantize_weights(w.data(), st.n, st.k, scheme), st.n, st.k, scheme);
        const std::vector<bool> written = output_aware_groups(w, plain, st.n, st.k, scheme.group, m);
        rescaled.insert(st.weight);
        // what the payload's quantizer will store for these values: the grid found, group by group?
        const std::vector<float> again =
            dequantize(backends::xnnpack::quantize_weights(w.data(), st.n, st.k, scheme), st.n, st.k, scheme);
        for (size_t at = 0; at < w.size(); at += static_cast<size_t>(scheme.group)) {
          if (!written[at / static_cast<size_t>(scheme.group)]) continue;
          ++result.groups;
          result.groups_kept += !std::equal(w.begin() + static_cast<std::ptrdiff_t>(at),
                                            w.begin() + static_cast<std::ptrdiff_t>(at + static_cast<size_t>(scheme.group)),
                                            again.begin() + static_cast<std::ptrdiff_t>(at));
        }
      }
    }
  }
  if (plan) {
    // --quantize auto: AWQ's scales into the program now (the plan measures the weights it will store), then the
    // plan's schemes for GPTQ (a plan on the text's own input moments, mean x'^2 per column, was measured worse
    // than the norms' gamma^2 on SmolLM2: bench/RESULTS.md)
    for (auto& [w, f] : current)
      if (rescaled.contains(w)) {
        const Site& st = *site_of_weight.at(w);
        set_floats(edge, w, st.form == Site::Form::Transposed ? transpose(f, st.n, st.k) : f);
      }
    per_weight = plan(edge);
  }
  if (gptq) {
    // per input: H = X'^T X' / tokens with x' = x / s (the AWQ scales folded above), damped 1% of its mean
    // diagonal, factorised once for every layer reading it; then each layer's rows with error feedback
    if (progress) progress("calibrating: GPTQ (error feedback on each input's X^T X)");
    const auto t1 = std::chrono::steady_clock::now();
    // sequential GPTQ writes each quantized weight into the program (dequantized) for the next stages' runs; what
    // the program held before is put back at the end (the payload stores result.precomputed for those weights)
    std::map<ValueId, passes::ConstantData> saved;
    auto write_weight = [&](ValueId w, const std::vector<float>& nk) {  // nk: [N, K]
      saved.try_emplace(w, edge.constants.at(w));
      const Site& st = *site_of_weight.at(w);
      set_floats(edge, w, st.form == Site::Form::Transposed ? transpose(nk, st.n, st.k) : nk);
    };
    auto gptq_input = [&](Group& gr) {
      const int64_t k = gr.k;
      std::vector<size_t> todo;
      for (size_t si : gr.sites)
        if (sites[si].quantized) todo.push_back(si);
      if (todo.empty() || gr.rows == 0) return;
      std::vector<double> h(static_cast<size_t>(k * k));
      for (int64_t i = 0; i < k; ++i)
        for (int64_t j = i; j < k; ++j) {
          const double v = static_cast<double>(gr.gram[static_cast<size_t>(i * k + j)]) / static_cast<double>(gr.rows) /
                           (gr.gram_folded ? 1.0
                                           : static_cast<double>(gr.s[static_cast<size_t>(i)]) * gr.s[static_cast<size_t>(j)]);
          h[static_cast<size_t>(i * k + j)] = h[static_cast<size_t>(j * k + i)] = v;
        }
      std::vector<float>().swap(gr.gram);
      int64_t dead = 0;
      // Damping by how well the text covers the input: GPTQ's 1% of the mean diagonal with >= 2k tokens, 10% with
      // >= k, else 100% (H then has a rank below k, and the feedback would push the error into directions the text
      // never excited: on SmolLM2 with 840 tokens, down_proj's held-out output error was 1.6x the plain rule's at
      // 1% and 0.8x at 100%; q_proj's 0.30x at 1%, 0.25x at 10%; bench/RESULTS.md)
      const double damp = gr.rows >= 2 * k ? 0.01 : gr.rows >= k ? 0.1 : 1.0;
      // act-order: the columns in decreasing diag(H) (ties by index), H permuted likewise before the factorisation
      std::vector<int64_t> order;
      std::vector<double> hp;
      if (act_order) {
        order.resize(static_cast<size_t>(k));
        for (int64_t i = 0; i < k; ++i) order[static_cast<size_t>(i)] = i;
        std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
          return h[static_cast<size_t>(a * k + a)] > h[static_cast<size_t>(b * k + b)];
        });
        hp.resize(h.size());
        for (int64_t i = 0; i < k; ++i)
          for (int64_t j = 0; j < k; ++j)
            hp[static_cast<size_t>(i * k + j)] =
                h[static_cast<size_t>(order[static_cast<size_t>(i)] * k + order[static_cast<size_t>(j)])];
      }
      const std::vector<float> u = backends::xnnpack::gptq_inverse_factor(act_order ? std::move(hp) : h, k, damp, &dead);
      result.gptq_dead_inputs += dead;
      for (size_t si : todo) {
        const Site& st = sites[si];
        std::vector<float> w = weight(st.weight);  // a copy: GPTQ changes it
        current.erase(st.weight);
        rescaled.erase(st.weight);
        // the objective on a sample of rows (every 32nd): the plain rule's codes, then GPTQ's
        auto objective = [&](const std::vector<float>& deq, const std::vector<float>& orig) {
          double total = 0;
          std::vector<double> d(static_cast<size_t>(k));
          for (int64_t r = 0; r < st.n; r += 32) {
            for (int64_t c = 0; c < k; ++c)
              d[static_cast<size_t>(c)] = static_cast<double>(orig[static_cast<size_t>(r * k + c)]) - deq[static_cast<size_t>(r * k + c)];
            for (int64_t i = 0; i < k; ++i) {
              double t = 0;
              const double* hi = h.data() + i * k;
              for (int64_t j = 0; j < k; ++j) t += hi[j] * d[static_cast<size_t>(j)];
              total += d[static_cast<size_t>(i)] * t;
            }
          }
          return total;
        };
        const QuantScheme& sw = scheme_of(st.weight);
        const std::vector<float> plain =
            dequantize(backends::xnnpack::quantize_weights(w.data(), st.n, k, sw), st.n, k, sw);
        result.gptq_objective_plain += objective(plain, w);
        std::vector<float> fed = w;
        auto qw = backends::xnnpack::quantize_weights_gptq(fed, st.n, k, u, sw, act_order ? &order : nullptr);
        if (refit && sw.kind == QuantScheme::Kind::Int4Groups) {
          double mean_diag = 0;  // the refit on H + damp * mean(diag H) I, GPTQ's own damping (see above)
          for (int64_t i = 0; i < k; ++i) mean_diag += h[static_cast<size_t>(i * k + i)];
          refit_scales(qw, w, st.n, k, sw.group, h, damp * mean_diag / static_cast<double>(k));
          fed = dequantize(qw, st.n, k, sw);
        }
        result.gptq_objective += objective(fed, w);
        result.precomputed[st.weight] = {sw, std::move(qw)};
        ++result.gptq_layers;
        if (method.sequential) write_weight(st.weight, fed);
      }
    };
    if (!method.sequential) {
      for (Group& gr : groups) gptq_input(gr);
    } else {
      std::map<ValueId, Group*> by_root;
      for (Group& gr : groups) by_root[gr.root] = &gr;
      for (size_t stage = 0; stage < stages.size(); ++stage) {
        if (stage > 0) {
          if (stage == 1)  // AWQ's rescaled weights into the program once (its norms' folds are in already)
            for (auto& [w, f] : current)
              if (rescaled.contains(w)) write_weight(w, f);
          // this stage's inputs from the program with every earlier stage's layers quantized
          std::vector<Group> probe;
          int64_t bytes = 0;
          for (ValueId root : stages[stage]) {
            const Group& gr = *by_root.at(root);
            probe.emplace_back();
            probe.back().root = root, probe.back().k = gr.k;
            probe.back().abs_sum.assign(static_cast<size_t>(gr.k), 0.0);
            probe.back().sq_sum.assign(static_cast<size_t>(gr.k), 0.0);
            probe.back().gram.assign(static_cast<size_t>(gr.k * gr.k), 0.0f);
            bytes += gr.k * gr.k * static_cast<int64_t>(sizeof(float));
          }
          result.gram_bytes = std::max(result.gram_bytes, bytes);
          if (progress)
            progress(fmt::format("calibrating: sequential GPTQ, stage {} of {} (running the program with {} layers "
                                 "quantized)",
                                 stage + 1, stages.size(), result.gptq_layers));
          const auto t2 = std::chrono::steady_clock::now();
          collect(edge, probe, ids, max_positions);
          result.run_seconds += seconds_since(t2);
          for (Group& pr : probe) {
            Group& gr = *by_root.at(pr.root);
            gr.gram = std::move(pr.gram), gr.rows = pr.rows, gr.gram_folded = true;
          }
        }
        for (ValueId root : stages[stage]) gptq_input(*by_root.at(root));
        ++result.gptq_stages;
      }
      for (auto& [w, c] : saved)
        if (!rescaled.contains(w)) edge.constants.at(w) = c;  // (rescaled ones: written below, as without +seq)
    }
    result.gptq_seconds = seconds_since(t1);
  }
  for (auto& [w, f] : current)
    if (rescaled.contains(w)) {
      const Site& st = *site_of_weight.at(w);
      set_floats(edge, w, st.form == Site::Form::Transposed ? transpose(f, st.n, st.k) : f);
    }
  result.search_seconds = seconds_since(t0);
  return result;
}

std::optional<CalibrationMethod> parse_calibration_method(std::string_view text, std::string* error) {
  // parts joined by '+': awq, gptq or gptq-act (at most one each, awq first), then the modifiers refit and seq
  CalibrationMethod m{.awq = false};
  bool gptq_named = false, modifier_seen = false;
  std::string_view rest = text;
  auto fail = [&](std::string_view why) -> std::optional<CalibrationMethod> {
    *error = fmt::format("unknown calibration method '{}' in --calibrate-method ({}; the methods: awq, gptq, "
                         "awq+gptq, gptq-act or awq+gptq-act, the GPTQ ones with +refit and/or +seq, e.g. "
                         "awq+gptq-act+refit+seq)",
                         text, why);
    return std::nullopt;
  };
  while (true) {
    const size_t plus = rest.find('+');
    const std::string_view part = rest.substr(0, plus);
    if (part == "awq") {
      if (m.awq || gptq_named || modifier_seen) return fail("awq comes first, once");
      m.awq = true;
    } else if (part == "gptq" || part == "gptq-act") {
      if (gptq_named || modifier_seen) return fail("one of gptq or gptq-act, before the modifiers");
      gptq_named = m.gptq = true;
      m.act_order = part == "gptq-act";
    } else if (part == "refit" || part == "seq") {
      if (!m.gptq) return fail(fmt::format("+{} modifies a GPTQ method", part));
      bool& flag = part == "refit" ? m.refit : m.sequential;
      if (flag || (part == "refit" && m.sequential)) return fail("the modifiers once each, refit before seq");
      flag = modifier_seen = true;
    } else {
      return fail(part.empty() ? std::string("an empty part") : fmt::format("'{}' is not a part of one", part));
    }
    if (plus == std::string_view::npos) break;
    rest.remove_prefix(plus + 1);
  }
  return m;
}

std::string calibration_method_name(const CalibrationMethod& m) {
  std::string name = m.awq ? "awq" : "";
  if (m.gptq) name += std::string(name.empty() ? "" : "+") + (m.act_order ? "gptq-act" : "gptq");
  if (m.refit) name += "+refit";
  if (m.sequential) name += "+seq";
  return name;
}

}  // namespace kiln::compiler
