// qd8 x qb4w / qc8w (kiln/cpu/quant.h): activation quantization against
// torchao's formulas written out here, every variant this CPU runs against a
// double-precision product of the dequantized values, over remainders of m, k
// and the group sizes ExecuTorch accepts.
#include "kiln/cpu/quant.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

namespace kiln::cpu {
namespace {

struct Aligned {
  explicit Aligned(size_t bytes) : p(static_cast<std::byte*>(std::aligned_alloc(64, (bytes + 63) / 64 * 64))) {}
  ~Aligned() { std::free(p); }
  std::byte* p;
};

std::vector<float> randn(size_t n, std::mt19937& g, float scale = 1.0f) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(g);
  return v;
}

// torchao: choose_qparams_affine(ASYMMETRIC, int8, eps None = FLT_MIN) + quantize_affine, one row.
void torchao_row(const float* x, int64_t k, std::vector<int>* q, float* scale, int* zp) {
  float mn = 0, mx = 0;
  for (int64_t i = 0; i < k; ++i) mn = std::min(mn, x[i]), mx = std::max(mx, x[i]);
  float s = (mx - mn) / 255.0f;
  s = std::max(s, FLT_MIN);
  float z = -128.0f - std::nearbyint(mn / s);
  z = std::min(std::max(z, -128.0f), 127.0f);
  const float inv = 1.0f / s;
  q->resize(static_cast<size_t>(k));
  for (int64_t i = 0; i < k; ++i)
    (*q)[static_cast<size_t>(i)] = static_cast<int>(std::min(std::max(std::nearbyint(x[i] * inv) + z, -128.0f), 127.0f));
  *scale = s;
  *zp = static_cast<int>(z);
}

int64_t layout_pos(int64_t k, Qd8Layout l) {
  if (l != Qd8Layout::Nibbles) return k;  // Plain and Signed: in order
  const int64_t r = k % 128;
  return k - r + (r & 1) * 64 + r / 2;
}

TEST(Qd8Quantize, MatchesTorchaoFormulas) {
  std::mt19937 g(1);
  for (Qd8Layout layout : {Qd8Layout::Plain, Qd8Layout::Nibbles, Qd8Layout::Signed})
    for (int64_t k : {1, 5, 64, 127, 128, 129, 576, 768}) {
      const int64_t m = 3;
      std::vector<float> x = randn(static_cast<size_t>(m * k), g, 2.0f);
      if (k > 3) x[1] = 0.0f, x[2] = -x[3];
      if (k == 5) for (int64_t i = 0; i < k; ++i) x[static_cast<size_t>(k + i)] = 0.0f;  // row 1 all zero: scale eps
      if (k == 127) for (int64_t i = 0; i < k; ++i) x[static_cast<size_t>(2 * k + i)] *= 1e-36f;  // row 2 tiny: scale near eps
      Aligned ws(qd8_rows_bytes(m, k, layout));
      Qd8Rows rows;
      qd8_quantize_rows(x.data(), m, k, k, layout, ws.p, &rows);
      for (int64_t r = 0; r < m; ++r) {
        std::vector<int> q;
        float s;
        int zp;
        torchao_row(x.data() + r * k, k, &q, &s, &zp);
        // Signed rows hold q itself (its zero point too) and its sums per 32 inputs; the others q + 128
        const bool is_signed = layout == Qd8Layout::Signed;
        const int off = is_signed ? 0 : 128;
        EXPECT_EQ(rows.scale[r], s) << "row " << r << " k " << k;
        EXPECT_EQ(rows.zp[r], off + zp);
        std::vector<bool> used(static_cast<size_t>(rows.stride), false);
        for (int64_t i = 0; i < k; ++i) {
          const int64_t p = layout_pos(i, layout);
          used[static_cast<size_t>(p)] = true;
          ASSERT_EQ(static_cast<int>(rows.data[r * rows.stride + p]), (q[static_cast<size_t>(i)] + off) & 0xff)
              << "row " << r << " input " << i << " of " << k;
        }
        if (is_signed) {
          ASSERT_EQ(rows.sums_stride, (k + 31) / 32);
          for (int64_t c = 0; c < rows.sums_stride; ++c) {
            int t = 0;
            for (int64_t i = 32 * c; i < std::min(k, 32 * c + 32); ++i) t += q[static_cast<size_t>(i)];
            ASSERT_EQ(rows.sums[r * rows.sums_stride + c], t) << "row " << r << " sum " << c << " of k " << k;
          }
        }
        for (int64_t p = 0; p < rows.stride; ++p)
          if (!used[static_cast<size_t>(p)]) {
            ASSERT_EQ(rows.data[r * rows.stride + p], 0) << "padding byte " << p;
          }
      }
    }
}

TEST(Qd8Quantize, Bf16RoundTrip) {
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f)), 1.0f);
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(-2.5f)), -2.5f);
  EXPECT_EQ(f32_to_bf16(1.00390625f), 0x3f80);   // exactly halfway: to even
  EXPECT_EQ(f32_to_bf16(1.01171875f), 0x3f82);   // halfway above an odd: up
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(NAN))));
}

struct Case {
  int64_t m, k, n, group;
};

// Dequantized reference, in double.
void reference_qb4w(const std::vector<int>& q, const std::vector<float>& sx, const std::vector<int>& zx,
                    const std::vector<int>& w4, const std::vector<uint16_t>& sc, const std::vector<float>& bias,
                    const Case& c, std::vector<double>* y) {
  const int64_t groups = c.k / c.group;
  y->assign(static_cast<size_t>(c.m * c.n), 0.0);
  for (int64_t r = 0; r < c.m; ++r)
    for (int64_t j = 0; j < c.n; ++j) {
      double acc = 0;
      for (int64_t i = 0; i < c.k; ++i)
        acc += double(q[size_t(r * c.k + i)] - zx[size_t(r)]) *
               (double(bf16_to_f32(sc[size_t(j * groups + i / c.group)])) * w4[size_t(j * c.k + i)]);
      (*y)[size_t(r * c.n + j)] = double(sx[size_t(r)]) * acc + bias[size_t(j)];
    }
}

// Random int4 weights (-8..7) for a case, in ExecuTorch's layout (two per byte, even input in the low
// nibble, as w + 8), bf16 group scales, a bias and the weight sums.
struct Qb4wCase {
  std::vector<int> w4;
  std::vector<uint8_t> file;
  std::vector<uint16_t> scales;
  std::vector<float> bias, sums;
};

Qb4wCase random_qb4w(const Case& c, std::mt19937& g) {
  Qb4wCase w;
  const int64_t ldw = (c.k + 1) / 2, groups = c.k / c.group;
  std::uniform_int_distribution<int> d4(-8, 7);
  w.w4.resize(size_t(c.n * c.k));
  for (int& v : w.w4) v = d4(g);
  w.file.assign(size_t(c.n * ldw), 0);
  for (int64_t j = 0; j < c.n; ++j)
    for (int64_t i = 0; i < c.k; ++i)
      w.file[size_t(j * ldw + i / 2)] |= uint8_t((w.w4[size_t(j * c.k + i)] + 8) << ((i & 1) * 4));
  w.scales.resize(size_t(c.n * groups));
  std::uniform_real_distribution<float> ds(0.001f, 0.1f);
  for (uint16_t& v : w.scales) v = f32_to_bf16(ds(g));
  w.bias = randn(static_cast<size_t>(c.n), g);
  w.sums.resize(static_cast<size_t>(c.n));
  qb4w_weight_sums(w.file.data(), w.scales.data(), c.n, c.k, c.group, w.sums.data());
  return w;
}

TEST(Qd8Gemm, Qb4wVariantsMatchDequantizedProduct) {
  std::mt19937 g(7);
  std::vector<Case> cases;
  for (int64_t k : {32, 64, 96, 128, 160, 256, 576, 768})
    for (int64_t group : {32, 64, 128, 256})
      if (k % group == 0)
        for (int64_t m : {1, 2, 3, 4, 5, 7}) cases.push_back({m, k, 9, group});
  cases.push_back({16, 1536, 40, 32});
  for (const Case& c : cases) {
    std::vector<float> x = randn(size_t(c.m * c.k), g);
    Aligned ws(qd8_rows_bytes(c.m, c.k, Qd8Layout::Nibbles));
    Qd8Rows rows;
    qd8_quantize_rows(x.data(), c.m, c.k, c.k, Qd8Layout::Nibbles, ws.p, &rows);
    std::vector<int> q(static_cast<size_t>(c.m * c.k)), zx(static_cast<size_t>(c.m));
    std::vector<float> sx(static_cast<size_t>(c.m));
    for (int64_t r = 0; r < c.m; ++r) {
      sx[size_t(r)] = rows.scale[r];
      zx[size_t(r)] = rows.zp[r] - 128;
      for (int64_t i = 0; i < c.k; ++i)
        q[size_t(r * c.k + i)] = int(rows.data[r * rows.stride + layout_pos(i, Qd8Layout::Nibbles)]) - 128;
    }
    Qb4wCase wc = random_qb4w(c, g);
    const std::vector<int>& w4 = wc.w4;
    const std::vector<uint8_t>& packed = wc.file;
    const std::vector<uint16_t>& sc = wc.scales;
    const std::vector<float>&bias = wc.bias, &sums = wc.sums;
    std::vector<double> ref;
    reference_qb4w(q, sx, zx, w4, sc, bias, c, &ref);
    double mx = 0;
    for (double v : ref) mx = std::max(mx, std::abs(v));
    const Qb4wWeights w{packed.data(), sc.data(), sums.data(), c.group};
    for (const Qd8GemmVariant& v : qd8_gemm_variants()) {
      if (!qd8_gemm_runnable(v)) continue;
      std::vector<float> y(size_t(c.m * c.n), -1.0f);
      v.qb4w(rows, c.m, c.k, w, 0, 4, bias.data(), y.data(), c.n, -INFINITY, INFINITY);   // two calls: n0 > 0 too
      v.qb4w(rows, c.m, c.k, w, 4, c.n, bias.data(), y.data(), c.n, -INFINITY, INFINITY);
      for (size_t i = 0; i < y.size(); ++i)
        ASSERT_NEAR(y[i], ref[i], 1e-5 * mx + 1e-6)
            << v.name << " m " << c.m << " k " << c.k << " group " << c.group << " at " << i;
      std::vector<float> yc(size_t(c.m * c.n));
      v.qb4w(rows, c.m, c.k, w, 0, c.n, nullptr, yc.data(), c.n, -0.25f, 0.5f);
      for (size_t i = 0; i < yc.size(); ++i)
        ASSERT_NEAR(yc[i], std::min(std::max(ref[i] - bias[i % size_t(c.n)], -0.25), 0.5), 1e-5 * mx + 1e-6)
            << v.name << " clamped, no bias";
    }
  }
}

// The panels (kiln's load-time layout for qb4w): Signed rows hold the same quantization
// as the other layouts, and every variant with a panels product matches the reference,
// over panel ranges that start past 0 and a last panel cut by n.
TEST(Qd8Gemm, Qb4wPanelsMatchDequantizedProduct) {
  std::mt19937 g(11);
  std::vector<Case> cases;
  for (int64_t k : {32, 64, 96, 128, 256, 576})
    for (int64_t group : {32, 64, 128, 256})
      if (k % group == 0)
        for (int64_t m : {1, 2, 3, 4, 5, 9}) cases.push_back({m, k, m % 2 ? int64_t{70} : int64_t{32}, group});
  cases.push_back({1, 1536, 96, 32});
  cases.push_back({16, 1536, 40, 128});
  // more panels than one ~128 KB chunk of them (the many-row bodies pass over the panels chunk by chunk)
  cases.push_back({6, 576, 1000, 32});
  cases.push_back({7, 1536, 700, 64});
  int ran = 0;
  for (const Case& c : cases) {
    std::vector<float> x = randn(size_t(c.m * c.k), g);
    Aligned ws(qd8_rows_bytes(c.m, c.k, Qd8Layout::Signed)), wn(qd8_rows_bytes(c.m, c.k, Qd8Layout::Nibbles));
    Qd8Rows rows, nib;
    qd8_quantize_rows(x.data(), c.m, c.k, c.k, Qd8Layout::Signed, ws.p, &rows);
    qd8_quantize_rows(x.data(), c.m, c.k, c.k, Qd8Layout::Nibbles, wn.p, &nib);
    const Qd8Rows view = qd8_rows_view(ws.p, c.m, c.k, Qd8Layout::Signed);
    ASSERT_EQ(view.sums, rows.sums);
    ASSERT_EQ(view.sums_stride, (c.k + 31) / 32);
    std::vector<int> q(static_cast<size_t>(c.m * c.k)), zx(static_cast<size_t>(c.m));
    std::vector<float> sx(static_cast<size_t>(c.m));
    for (int64_t r = 0; r < c.m; ++r) {
      ASSERT_EQ(rows.scale[r], nib.scale[r]);
      ASSERT_EQ(rows.zp[r], nib.zp[r] - 128);
      sx[size_t(r)] = rows.scale[r];
      zx[size_t(r)] = rows.zp[r];
      for (int64_t i = 0; i < c.k; ++i) {
        const int qi = static_cast<int8_t>(rows.data[r * rows.stride + i]);
        ASSERT_EQ(qi, int(nib.data[r * nib.stride + layout_pos(i, Qd8Layout::Nibbles)]) - 128);
        q[size_t(r * c.k + i)] = qi;
      }
      for (int64_t b = 0; b < rows.sums_stride; ++b) {
        int t = 0;
        for (int64_t i = 32 * b; i < std::min(c.k, 32 * b + 32); ++i) t += q[size_t(r * c.k + i)];
        ASSERT_EQ(rows.sums[r * rows.sums_stride + b], t);
      }
    }
    Qb4wCase wc = random_qb4w(c, g);
    const std::vector<int>& w4 = wc.w4;
    const std::vector<uint8_t>& file = wc.file;
    const std::vector<uint16_t>& sc = wc.scales;
    const std::vector<float>&bias = wc.bias, &sums = wc.sums;
    const int64_t panels = (c.n + kQb4wPanel - 1) / kQb4wPanel;
    ASSERT_EQ(qb4w_panels_bytes(c.n, c.k, c.group), size_t(panels) * qb4w_panel_bytes(c.k, c.group));
    Aligned packed(qb4w_panels_bytes(c.n, c.k, c.group));
    qb4w_pack_panels(file.data(), sc.data(), c.n, c.k, c.group, reinterpret_cast<uint8_t*>(packed.p));
    std::vector<double> ref;
    reference_qb4w(q, sx, zx, w4, sc, bias, c, &ref);
    double mx = 0;
    for (double v : ref) mx = std::max(mx, std::abs(v));
    const Qb4wPanels w{reinterpret_cast<const uint8_t*>(packed.p), sums.data(), c.group};
    for (const Qd8GemmVariant& v : qd8_gemm_variants()) {
      if (!qd8_gemm_runnable(v) || !v.qb4w_panels) continue;
      ++ran;
      std::vector<float> y(size_t(c.m * c.n), -1.0f);
      v.qb4w_panels(rows, c.m, c.k, w, c.n, 0, 1, bias.data(), y.data(), c.n, -INFINITY, INFINITY);
      v.qb4w_panels(rows, c.m, c.k, w, c.n, 1, panels, bias.data(), y.data(), c.n, -INFINITY, INFINITY);
      for (size_t i = 0; i < y.size(); ++i)
        ASSERT_NEAR(y[i], ref[i], 1e-5 * mx + 1e-6)
            << v.name << " m " << c.m << " k " << c.k << " n " << c.n << " group " << c.group << " at " << i;
      // the output's row stride is ldy, not n: nothing is stored past the n outputs of a row
      const int64_t ldy = c.n + 5;
      std::vector<float> yc(size_t(c.m * ldy), 7.0f);
      v.qb4w_panels(rows, c.m, c.k, w, c.n, 0, panels, nullptr, yc.data(), ldy, -0.25f, 0.5f);
      for (int64_t r = 0; r < c.m; ++r)
        for (int64_t j = 0; j < ldy; ++j) {
          const float got = yc[size_t(r * ldy + j)];
          if (j >= c.n) {
            ASSERT_EQ(got, 7.0f) << v.name << " wrote past n";
            continue;
          }
          const double want = std::min(std::max(ref[size_t(r * c.n + j)] - bias[size_t(j)], -0.25), 0.5);
          ASSERT_NEAR(got, want, 1e-5 * mx + 1e-6) << v.name << " clamped, no bias";
        }
    }
  }
  EXPECT_GT(ran, 0);  // the generic variant has the panels product everywhere
}

// The products' integer bounds: every input at q = -128 (or 127) against every weight at 7 (its
// nibble 15) is the largest sum a variant's narrow accumulators meet (AVX2 keeps up to four steps
// of a group in 16 bits: 4 x 4 x 15 x 128 = 30720); every variant, every group size, exact.
TEST(Qd8Gemm, Qb4wPanelsAtTheIntegerBounds) {
  std::mt19937 g(5);
  int ran = 0;
  for (int64_t group : {32, 64, 128, 256})
    for (int64_t m : {1, 2, 3}) {
      const Case c{m, 256, 70, group};
      std::vector<float> x(size_t(c.m * c.k));
      for (int64_t r = 0; r < c.m; ++r)  // a row of -1s quantizes to q = -128, of +1s to 127
        for (int64_t i = 0; i < c.k; ++i) x[size_t(r * c.k + i)] = r % 2 ? 1.0f : -1.0f;
      Aligned ws(qd8_rows_bytes(c.m, c.k, Qd8Layout::Signed));
      Qd8Rows rows;
      qd8_quantize_rows(x.data(), c.m, c.k, c.k, Qd8Layout::Signed, ws.p, &rows);
      std::vector<int> q(size_t(c.m * c.k)), zx(size_t(c.m));
      std::vector<float> sx(size_t(c.m));
      for (int64_t r = 0; r < c.m; ++r) {
        sx[size_t(r)] = rows.scale[r];
        zx[size_t(r)] = rows.zp[r];
        for (int64_t i = 0; i < c.k; ++i) q[size_t(r * c.k + i)] = static_cast<int8_t>(rows.data[r * rows.stride + i]);
        ASSERT_EQ(q[size_t(r * c.k)], r % 2 ? 127 : -128);
      }
      Qb4wCase w = random_qb4w(c, g);
      const int64_t ldw = c.k / 2;
      for (int64_t j = 0; j < c.n; ++j)  // every weight 7 but in output 5 (-8: the other bound)
        for (int64_t i = 0; i < c.k; ++i) {
          const int v = j == 5 ? -8 : 7;
          w.w4[size_t(j * c.k + i)] = v;
          uint8_t& b = w.file[size_t(j * ldw + i / 2)];
          b = uint8_t((b & (i & 1 ? 0x0f : 0xf0)) | ((v + 8) << ((i & 1) * 4)));
        }
      qb4w_weight_sums(w.file.data(), w.scales.data(), c.n, c.k, c.group, w.sums.data());
      std::vector<double> ref;
      reference_qb4w(q, sx, zx, w.w4, w.scales, w.bias, c, &ref);
      double mx = 0;
      for (double v : ref) mx = std::max(mx, std::abs(v));
      Aligned packed(qb4w_panels_bytes(c.n, c.k, c.group));
      qb4w_pack_panels(w.file.data(), w.scales.data(), c.n, c.k, c.group, reinterpret_cast<uint8_t*>(packed.p));
      const Qb4wPanels wp{reinterpret_cast<const uint8_t*>(packed.p), w.sums.data(), c.group};
      const int64_t panels = (c.n + kQb4wPanel - 1) / kQb4wPanel;
      for (const Qd8GemmVariant& v : qd8_gemm_variants()) {
        if (!qd8_gemm_runnable(v) || !v.qb4w_panels) continue;
        ++ran;
        std::vector<float> y(size_t(c.m * c.n), -1.0f);
        v.qb4w_panels(rows, c.m, c.k, wp, c.n, 0, panels, w.bias.data(), y.data(), c.n, -INFINITY, INFINITY);
        for (size_t i = 0; i < y.size(); ++i)
          ASSERT_NEAR(y[i], ref[i], 1e-5 * mx + 1e-6) << v.name << " m " << c.m << " group " << c.group << " at " << i;
      }
    }
  EXPECT_GT(ran, 0);
}

TEST(Qd8Gemm, Qc8wVariantsMatchDequantizedProduct) {
  std::mt19937 g(11);
  for (int64_t k : {1, 15, 16, 17, 63, 64, 65, 576, 1000})
    for (int64_t m : {1, 3, 4, 6}) {
      const int64_t n = 7;
      std::vector<float> x = randn(size_t(m * k), g);
      Aligned ws(qd8_rows_bytes(m, k, Qd8Layout::Plain));
      Qd8Rows rows;
      qd8_quantize_rows(x.data(), m, k, k, Qd8Layout::Plain, ws.p, &rows);
      std::uniform_int_distribution<int> d8(-128, 127);
      std::vector<int8_t> w(size_t(n * k));
      for (int8_t& v : w) v = int8_t(d8(g));
      std::vector<float> scales(static_cast<size_t>(n)), sums(static_cast<size_t>(n)), bias = randn(static_cast<size_t>(n), g);
      std::uniform_real_distribution<float> ds(0.001f, 0.1f);
      for (float& s : scales) s = ds(g);
      qc8w_weight_sums(w.data(), scales.data(), n, k, sums.data());
      std::vector<double> ref(size_t(m * n));
      double mx = 0;
      for (int64_t r = 0; r < m; ++r)
        for (int64_t j = 0; j < n; ++j) {
          double acc = 0;
          for (int64_t i = 0; i < k; ++i)
            acc += double(int(rows.data[r * rows.stride + i]) - rows.zp[r]) * double(scales[size_t(j)]) * w[size_t(j * k + i)];
          ref[size_t(r * n + j)] = double(rows.scale[r]) * acc + bias[size_t(j)];
          mx = std::max(mx, std::abs(ref[size_t(r * n + j)]));
        }
      const Qc8wWeights qw{w.data(), scales.data(), sums.data()};
      for (const Qd8GemmVariant& v : qd8_gemm_variants()) {
        if (!qd8_gemm_runnable(v)) continue;
        std::vector<float> y(size_t(m * n));
        v.qc8w(rows, m, k, qw, 0, 3, bias.data(), y.data(), n, -INFINITY, INFINITY);
        v.qc8w(rows, m, k, qw, 3, n, bias.data(), y.data(), n, -INFINITY, INFINITY);
        for (size_t i = 0; i < y.size(); ++i)
          ASSERT_NEAR(y[i], ref[i], 1e-5 * mx + 1e-6) << v.name << " m " << m << " k " << k << " at " << i;
      }
    }
}

// The many-row variants (qd8_gemm__amx: tiles of 16 rows for 16 rows or more, its avx512vnni
// code for the rest) give the avx512vnni variant's results bit for bit (exact integer sums, the
// same fp32 epilogue), over row counts around the tiles (16, 32), k remainders, output counts
// that cut a block of 32 (or a 32-output panel) and ranges that start past 0. A CPU or kernel
// without AMX reports the test as skipped (NOT TESTED), never as passed.
const Qd8GemmVariant* variant_named(const char* name) {
  for (const Qd8GemmVariant& v : qd8_gemm_variants())
    if (std::string(v.name) == name) return &v;
  return nullptr;
}

void expect_same_bits(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    uint32_t a, b;
    std::memcpy(&a, &got[i], 4);
    std::memcpy(&b, &want[i], 4);
    ASSERT_EQ(a, b) << what << " at " << i << ": " << got[i] << " vs " << want[i];
  }
}

class Qd8GemmManyRows : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    v_ = variant_named(GetParam());
    vnni_ = variant_named("qd8_gemm__avx512vnni");
    if (v_ == nullptr || vnni_ == nullptr || !qd8_gemm_runnable(*v_))
      GTEST_SKIP() << GetParam() << " NOT TESTED: this build, CPU or kernel lacks " << (v_ ? isa_name(v_->isa) : "it");
  }
  const Qd8GemmVariant* v_ = nullptr;
  const Qd8GemmVariant* vnni_ = nullptr;
};

TEST_P(Qd8GemmManyRows, Qc8wSameBitsAsVnni) {
  std::mt19937 g(21);
  for (int64_t k : {1, 17, 64, 65, 100, 576, 1000})
    for (int64_t m : {1, 15, 16, 17, 31, 32, 33, 48, 67})
      for (int64_t n : {7, 32, 45}) {
        std::vector<float> x = randn(size_t(m * k), g);
        if (m > 2) x[size_t(k)] = 50.0f;  // a row with a wide range
        Aligned ws(qd8_rows_bytes(m, k, Qd8Layout::Plain));
        Qd8Rows rows;
        qd8_quantize_rows(x.data(), m, k, k, Qd8Layout::Plain, ws.p, &rows);
        std::uniform_int_distribution<int> d8(-128, 127);
        std::vector<int8_t> w(size_t(n * k));
        for (int8_t& b : w) b = int8_t(d8(g));
        std::vector<float> scales(static_cast<size_t>(n)), sums(static_cast<size_t>(n)), bias = randn(static_cast<size_t>(n), g);
        std::uniform_real_distribution<float> ds(0.001f, 0.1f);
        for (float& s : scales) s = ds(g);
        qc8w_weight_sums(w.data(), scales.data(), n, k, sums.data());
        const Qc8wWeights qw{w.data(), scales.data(), sums.data()};
        const std::string what = std::string(v_->name) + " m " + std::to_string(m) + " k " + std::to_string(k) +
                                 " n " + std::to_string(n);
        // ranges as the backend gives them (multiples of 4 from n0 > 0), bias and clamping
        for (int form = 0; form < 2; ++form) {
          const float lo = form ? -0.25f : -INFINITY, hi = form ? 0.5f : INFINITY;
          const float* b = form ? nullptr : bias.data();
          const int64_t ldy = n + 3;
          std::vector<float> got(size_t(m * ldy), 7.0f), want(size_t(m * ldy), 7.0f);
          for (const auto& [a, z] : {std::pair<int64_t, int64_t>{0, 4}, {4, n}}) {
            v_->qc8w(rows, m, k, qw, a, z, b, got.data(), ldy, lo, hi);
            vnni_->qc8w(rows, m, k, qw, a, z, b, want.data(), ldy, lo, hi);
          }
          ASSERT_NO_FATAL_FAILURE(expect_same_bits(got, want, what + (form ? " clamped, no bias" : "")));
        }
      }
}

TEST_P(Qd8GemmManyRows, Qb4wPanelsSameBitsAsVnni) {
  std::mt19937 g(23);
  std::vector<Case> cases;
  for (int64_t k : {64, 96, 128, 224, 256, 576})  // 1 to 18 groups: every remainder of the 4 tiles of sums
    for (int64_t group : {32, 64, 128, 256})
      if (k % group == 0)
        for (int64_t m : {1, 16, 17, 35})
          cases.push_back({m, k, m % 2 ? int64_t{70} : int64_t{32}, group});
  for (int64_t m : {15, 31, 32, 33, 48, 128}) cases.push_back({m, 576, 100, 32});
  cases.push_back({40, 1536, 96, 32});
  cases.push_back({24, 1536, 40, 128});
  for (const Case& c : cases) {
    std::vector<float> x = randn(size_t(c.m * c.k), g);
    Aligned ws(qd8_rows_bytes(c.m, c.k, Qd8Layout::Signed));
    Qd8Rows rows;
    qd8_quantize_rows(x.data(), c.m, c.k, c.k, Qd8Layout::Signed, ws.p, &rows);
    Qb4wCase wc = random_qb4w(c, g);
    const int64_t panels = (c.n + kQb4wPanel - 1) / kQb4wPanel;
    Aligned packed(qb4w_panels_bytes(c.n, c.k, c.group));
    qb4w_pack_panels(wc.file.data(), wc.scales.data(), c.n, c.k, c.group, reinterpret_cast<uint8_t*>(packed.p));
    const Qb4wPanels w{reinterpret_cast<const uint8_t*>(packed.p), wc.sums.data(), c.group};
    const std::string what = std::string(v_->name) + " m " + std::to_string(c.m) + " k " + std::to_string(c.k) +
                             " n " + std::to_string(c.n) + " group " + std::to_string(c.group);
    for (int form = 0; form < 2; ++form) {
      const float lo = form ? -0.25f : -INFINITY, hi = form ? 0.5f : INFINITY;
      const float* b = form ? nullptr : wc.bias.data();
      const int64_t ldy = c.n + 5;
      std::vector<float> got(size_t(c.m * ldy), 7.0f), want(size_t(c.m * ldy), 7.0f);
      for (const auto& [p0, p1] : {std::pair<int64_t, int64_t>{0, 1}, {1, panels}}) {
        v_->qb4w_panels(rows, c.m, c.k, w, c.n, p0, p1, b, got.data(), ldy, lo, hi);
        vnni_->qb4w_panels(rows, c.m, c.k, w, c.n, p0, p1, b, want.data(), ldy, lo, hi);
      }
      ASSERT_NO_FATAL_FAILURE(expect_same_bits(got, want, what + (form ? " clamped, no bias" : "")));
    }
  }
}

TEST_P(Qd8GemmManyRows, Qb4wSameBitsAsVnni) {
  std::mt19937 g(29);
  for (const Case& c : {Case{17, 576, 40, 32}, Case{33, 256, 9, 64}}) {
    std::vector<float> x = randn(size_t(c.m * c.k), g);
    Aligned ws(qd8_rows_bytes(c.m, c.k, Qd8Layout::Nibbles));
    Qd8Rows rows;
    qd8_quantize_rows(x.data(), c.m, c.k, c.k, Qd8Layout::Nibbles, ws.p, &rows);
    Qb4wCase wc = random_qb4w(c, g);
    const Qb4wWeights w{wc.file.data(), wc.scales.data(), wc.sums.data(), c.group};
    std::vector<float> got(size_t(c.m * c.n)), want(size_t(c.m * c.n));
    v_->qb4w(rows, c.m, c.k, w, 0, c.n, wc.bias.data(), got.data(), c.n, -INFINITY, INFINITY);
    vnni_->qb4w(rows, c.m, c.k, w, 0, c.n, wc.bias.data(), want.data(), c.n, -INFINITY, INFINITY);
    ASSERT_NO_FATAL_FAILURE(expect_same_bits(got, want, v_->name));
  }
}

INSTANTIATE_TEST_SUITE_P(Variants, Qd8GemmManyRows, ::testing::Values("qd8_gemm__amx"),
                         [](const ::testing::TestParamInfo<const char*>& i) { return std::string(i.param); });

TEST(Qd8Gemm, SelectionFollowsTheIsaTable) {
  const Qd8GemmVariant& sel = qd8_gemm_config();
  EXPECT_TRUE(qd8_gemm_runnable(sel));
  EXPECT_LE(static_cast<int>(sel.isa), static_cast<int>(active_isa()));
  // the widest runnable variant at or below the active ISA is the one selected
  for (const Qd8GemmVariant& v : qd8_gemm_variants())
    if (qd8_gemm_runnable(v) && v.isa <= active_isa()) {
      EXPECT_STREQ(sel.name, v.name);
      break;
    }
}

}  // namespace
}  // namespace kiln::cpu
