// f32-gemm micro-kernel tester (XNNPACK-style): one GEMM shape, strides, alpha
// and accumulate, run on a variant and compared with the reference -- the
// generic variant for every other variant, a naive triple loop in double for
// the generic one. Integer-valued data (the default) is exact in float whatever
// the summation order, so then the results must match bit for bit; float data
// is compared within the worst-case rounding bound of a k-term dot product.
#pragma once

#include "kiln/cpu/config.h"
#include "kiln/cpu/gemm.h"

#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <ostream>
#include <random>
#include <vector>

namespace kiln::cpu {
// gtest prints a test parameter by its name
inline void PrintTo(const F32GemmVariant& v, std::ostream* os) { *os << v.name; }
}  // namespace kiln::cpu

namespace kiln::cpu::testing {

inline const F32GemmVariant& generic_f32_gemm() {
  for (const F32GemmVariant& v : f32_gemm_variants())
    if (v.isa == Isa::Generic) return v;
  ADD_FAILURE() << "no generic f32-gemm variant";
  return f32_gemm_variants().back();
}

class GemmTester {
 public:
  GemmTester& m(int64_t v) { m_ = v; return *this; }
  GemmTester& n(int64_t v) { n_ = v; return *this; }
  GemmTester& k(int64_t v) { k_ = v; return *this; }
  // extra elements at the end of each row of A, B, C (leading dimension = width + pad)
  GemmTester& a_pad(int64_t v) { a_pad_ = v; return *this; }
  GemmTester& b_pad(int64_t v) { b_pad_ = v; return *this; }
  GemmTester& c_pad(int64_t v) { c_pad_ = v; return *this; }
  GemmTester& alpha(float v) { alpha_ = v; return *this; }
  GemmTester& accumulate(bool v) { accumulate_ = v; return *this; }
  GemmTester& float_data(bool v) { float_data_ = v; return *this; }
  GemmTester& seed(uint32_t v) { seed_ = v; return *this; }
  // runs the variant's gemm_bt on Bᵀ ([n, k], its rows padded by b_pad) instead of gemm on B
  GemmTester& transposed_b(bool v) { transposed_b_ = v; return *this; }
  // runs the variant's gemm_packed on B packed as its panels (sgemm_pack_b_width, from B or, with
  // transposed_b, from Bᵀ), in two calls when n > nr: columns [0, nr) and [nr, n) from the second panel on,
  // the second saying B streams from memory (ldb 1)
  GemmTester& packed_b(bool v) { packed_b_ = v; return *this; }

  void test(const F32GemmVariant& v) const {
    SCOPED_TRACE(::testing::Message() << v.name << " m=" << m_ << " n=" << n_ << " k=" << k_ << " lda=" << lda()
                                      << " ldb=" << ldb() << " ldc=" << ldc() << " alpha=" << alpha_
                                      << " accumulate=" << accumulate_ << " transposed_b=" << transposed_b_
                                      << " packed_b=" << packed_b_);
    std::mt19937 rng(seed_);
    auto fill = [&](std::vector<float>& x) {
      std::uniform_int_distribution<int> ints(-3, 3);
      std::uniform_real_distribution<float> reals(-1.0f, 1.0f);
      for (float& e : x) e = float_data_ ? reals(rng) : static_cast<float>(ints(rng));
    };
    std::vector<float> a(static_cast<size_t>(m_ * lda())), b(static_cast<size_t>(k_ * ldb())),
        c0(static_cast<size_t>(m_ * ldc()));
    fill(a);
    fill(b);
    fill(c0);
    for (int64_t i = 0; i < m_; ++i)  // C's padding: must come back untouched
      for (int64_t j = n_; j < ldc(); ++j) c0[static_cast<size_t>(i * ldc() + j)] = kSentinel;

    std::vector<float> c = c0;
    const int64_t ldbt = k_ + b_pad_;
    std::vector<float> bt;
    if (transposed_b_) {
      bt.assign(static_cast<size_t>(n_ * ldbt), kSentinel);
      for (int64_t p = 0; p < k_; ++p)
        for (int64_t j = 0; j < n_; ++j) bt[static_cast<size_t>(j * ldbt + p)] = b[static_cast<size_t>(p * ldb() + j)];
    }
    if (packed_b_) {
      const int64_t panels = (n_ + v.nr - 1) / v.nr;
      std::vector<float> packed(static_cast<size_t>(panels * v.nr * k_), kSentinel);
      if (transposed_b_) sgemm_pack_b_width(v.nr, k_, n_, bt.data(), ldbt, true, packed.data());
      else sgemm_pack_b_width(v.nr, k_, n_, b.data(), ldb(), false, packed.data());
      const int64_t j0 = n_ > v.nr ? v.nr : n_;
      v.gemm_packed(m_, j0, k_, alpha_, a.data(), lda(), packed.data(), 0, accumulate_, c.data(), ldc());
      if (j0 < n_)  // ldb 1: B streams from memory (the tile prefetches it among its FMAs), the same products
        v.gemm_packed(m_, n_ - j0, k_, alpha_, a.data(), lda(), packed.data() + j0 * k_, 1, accumulate_, c.data() + j0,
                      ldc());
    } else if (transposed_b_) {
      v.gemm_bt(m_, n_, k_, alpha_, a.data(), lda(), bt.data(), ldbt, accumulate_, c.data(), ldc());
    } else {
      v.gemm(m_, n_, k_, alpha_, a.data(), lda(), b.data(), ldb(), accumulate_, c.data(), ldc());
    }

    // the reference, and a bound on each entry's rounding error relative to it
    std::vector<double> ref(static_cast<size_t>(m_ * n_)), bound(static_cast<size_t>(m_ * n_));
    const bool naive = v.isa == Isa::Generic;
    std::vector<float> cg = c0;
    if (!naive) generic_f32_gemm().gemm(m_, n_, k_, alpha_, a.data(), lda(), b.data(), ldb(), accumulate_, cg.data(), ldc());
    const bool need_sums = naive || float_data_;  // (integer data against the generic variant: exact, no bound)
    for (int64_t i = 0; i < m_; ++i)
      for (int64_t j = 0; j < n_; ++j) {
        double sum = 0, mag = 0;
        for (int64_t p = 0; need_sums && p < k_; ++p) {
          const double t = static_cast<double>(a[static_cast<size_t>(i * lda() + p)]) * b[static_cast<size_t>(p * ldb() + j)];
          sum += t;
          mag += std::fabs(t);
        }
        const double old = accumulate_ ? c0[static_cast<size_t>(i * ldc() + j)] : 0.0;
        const size_t e = static_cast<size_t>(i * n_ + j);
        ref[e] = naive ? alpha_ * sum + old : cg[static_cast<size_t>(i * ldc() + j)];
        // |fl(x·y) - x·y| <= k eps sum|x y| for each of two float computations (plus alpha and +C)
        bound[e] = float_data_ ? (2.0 * static_cast<double>(k_) + 4.0) * FLT_EPSILON * (std::fabs(alpha_) * mag + std::fabs(old)) : 0.0;
      }

    int64_t bad = 0;
    for (int64_t i = 0; i < m_; ++i) {
      for (int64_t j = 0; j < n_; ++j) {
        const size_t e = static_cast<size_t>(i * n_ + j);
        const float got = c[static_cast<size_t>(i * ldc() + j)];
        if (!(std::fabs(static_cast<double>(got) - ref[e]) <= bound[e]) && bad++ < 5)
          ADD_FAILURE() << "C[" << i << ", " << j << "] = " << got << ", reference " << ref[e] << " (bound " << bound[e] << ")";
      }
      for (int64_t j = n_; j < ldc(); ++j)
        if (std::memcmp(&c[static_cast<size_t>(i * ldc() + j)], &kSentinel, sizeof(float)) != 0 && bad++ < 5)
          ADD_FAILURE() << "C[" << i << ", " << j << "] (padding past n) was written";
    }
    EXPECT_EQ(bad, 0) << "entries wrong";
  }

 private:
  static constexpr float kSentinel = 1234.5f;
  int64_t lda() const { return k_ + a_pad_; }
  int64_t ldb() const { return n_ + b_pad_; }
  int64_t ldc() const { return n_ + c_pad_; }

  int64_t m_ = 1, n_ = 1, k_ = 1, a_pad_ = 0, b_pad_ = 0, c_pad_ = 0;
  float alpha_ = 1.0f;
  bool accumulate_ = false, float_data_ = false, transposed_b_ = false, packed_b_ = false;
  uint32_t seed_ = 0;
};

}  // namespace kiln::cpu::testing
