// f32-gemv tester: axpy_rows, dot and dot_rows of one variant against the
// reference -- the generic variant for every other variant, naive loops in
// double for the generic one -- like gemm_tester.h (integer data: exact).
#pragma once

#include "kiln/cpu/config.h"

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
inline void PrintTo(const F32GemvVariant& v, std::ostream* os) { *os << v.name; }
}  // namespace kiln::cpu

namespace kiln::cpu::testing {

inline const F32GemvVariant& generic_f32_gemv() {
  for (const F32GemvVariant& v : f32_gemv_variants())
    if (v.isa == Isa::Generic) return v;
  ADD_FAILURE() << "no generic f32-gemv variant";
  return f32_gemv_variants().back();
}

class GemvTester {
 public:
  GemvTester& rows(int64_t v) { rows_ = v; return *this; }
  GemvTester& k(int64_t v) { k_ = v; return *this; }
  GemvTester& n(int64_t v) { n_ = v; return *this; }
  GemvTester& x_pad(int64_t v) { x_pad_ = v; return *this; }  // ldx = k + x_pad
  GemvTester& w_pad(int64_t v) { w_pad_ = v; return *this; }  // ldw = n + w_pad (dot_rows: 1 + w_pad)
  GemvTester& o_pad(int64_t v) { o_pad_ = v; return *this; }  // ldo = n + o_pad (dot_rows: 1 + o_pad)
  GemvTester& float_data(bool v) { float_data_ = v; return *this; }
  GemvTester& seed(uint32_t v) { seed_ = v; return *this; }

  // out[0:rows, 0:n] += x · W over [k, n] weights
  void test_axpy_rows(const F32GemvVariant& v) const {
    SCOPED_TRACE(::testing::Message() << v.name << " axpy_rows rows=" << rows_ << " k=" << k_ << " n=" << n_
                                      << " pads " << x_pad_ << "/" << w_pad_ << "/" << o_pad_);
    const int64_t ldx = k_ + x_pad_, ldw = n_ + w_pad_, ldo = n_ + o_pad_;
    std::vector<float> x = data(rows_ * ldx, 1), w = data(k_ * ldw, 2), out0 = data(rows_ * ldo, 3);
    mark_padding(out0, rows_, n_, ldo);
    std::vector<float> out = out0, ref = out0;
    v.axpy_rows(x.data(), ldx, rows_, k_, w.data(), ldw, n_, out.data(), ldo);
    std::vector<double> exact(static_cast<size_t>(rows_ * n_)), mag(exact.size());
    if (v.isa != Isa::Generic) generic_f32_gemv().axpy_rows(x.data(), ldx, rows_, k_, w.data(), ldw, n_, ref.data(), ldo);
    for (int64_t r = 0; r < rows_; ++r)
      for (int64_t j = 0; j < n_; ++j) {
        double s = out0[static_cast<size_t>(r * ldo + j)], a = std::fabs(s);
        for (int64_t p = 0; p < k_; ++p) {
          const double t = static_cast<double>(x[static_cast<size_t>(r * ldx + p)]) * w[static_cast<size_t>(p * ldw + j)];
          s += t;
          a += std::fabs(t);
        }
        exact[static_cast<size_t>(r * n_ + j)] = v.isa == Isa::Generic ? s : ref[static_cast<size_t>(r * ldo + j)];
        mag[static_cast<size_t>(r * n_ + j)] = a;
      }
    check(out, exact, mag, rows_, n_, ldo);
  }

  // dot(a[0:k], b[0:k]); rows and pads unused
  void test_dot(const F32GemvVariant& v) const {
    SCOPED_TRACE(::testing::Message() << v.name << " dot k=" << k_);
    std::vector<float> a = data(k_, 1), b = data(k_, 2);
    const float got = v.dot(a.data(), b.data(), k_);
    double s = 0, m = 0;
    for (int64_t p = 0; p < k_; ++p) {
      s += static_cast<double>(a[static_cast<size_t>(p)]) * b[static_cast<size_t>(p)];
      m += std::fabs(static_cast<double>(a[static_cast<size_t>(p)]) * b[static_cast<size_t>(p)]);
    }
    const double want = v.isa == Isa::Generic ? s : generic_f32_gemv().dot(a.data(), b.data(), k_);
    check({got}, {want}, {m}, 1, 1, 1);
  }

  // out[r * ldo] = x[r, 0:k] · W[0:k, 0] with W's row stride ldw = 1 + w_pad
  void test_dot_rows(const F32GemvVariant& v) const {
    SCOPED_TRACE(::testing::Message() << v.name << " dot_rows rows=" << rows_ << " k=" << k_ << " pads " << x_pad_
                                      << "/" << w_pad_ << "/" << o_pad_);
    const int64_t ldx = k_ + x_pad_, ldw = 1 + w_pad_, ldo = 1 + o_pad_;
    std::vector<float> x = data(rows_ * ldx, 1), w = data(k_ * ldw, 2), out0 = data(rows_ * ldo, 3);
    mark_padding(out0, rows_, 1, ldo);
    std::vector<float> out = out0, ref = out0;
    v.dot_rows(x.data(), ldx, rows_, k_, w.data(), ldw, out.data(), ldo);
    if (v.isa != Isa::Generic) generic_f32_gemv().dot_rows(x.data(), ldx, rows_, k_, w.data(), ldw, ref.data(), ldo);
    std::vector<double> exact(static_cast<size_t>(rows_)), mag(exact.size());
    for (int64_t r = 0; r < rows_; ++r) {
      double s = 0, a = 0;
      for (int64_t p = 0; p < k_; ++p) {
        const double t = static_cast<double>(x[static_cast<size_t>(r * ldx + p)]) * w[static_cast<size_t>(p * ldw)];
        s += t;
        a += std::fabs(t);
      }
      exact[static_cast<size_t>(r)] = v.isa == Isa::Generic ? s : ref[static_cast<size_t>(r * ldo)];
      mag[static_cast<size_t>(r)] = a;
    }
    check(out, exact, mag, rows_, 1, ldo);
  }

  // c[rows, n] = a[rows, k] · b[n, k]ᵀ (row strides k + x_pad, k + w_pad, n + o_pad)
  void test_dot_block(const F32GemvVariant& v) const {
    SCOPED_TRACE(::testing::Message() << v.name << " dot_block rows=" << rows_ << " n=" << n_ << " k=" << k_ << " pads "
                                      << x_pad_ << "/" << w_pad_ << "/" << o_pad_);
    const int64_t lda = k_ + x_pad_, ldb = k_ + w_pad_, ldc = n_ + o_pad_;
    std::vector<float> a = data(rows_ * lda, 1), b = data(n_ * ldb, 2), c0 = data(rows_ * ldc, 3);
    mark_padding(c0, rows_, n_, ldc);
    std::vector<float> c = c0, ref = c0;
    v.dot_block(a.data(), lda, rows_, b.data(), ldb, n_, k_, c.data(), ldc);
    if (v.isa != Isa::Generic) generic_f32_gemv().dot_block(a.data(), lda, rows_, b.data(), ldb, n_, k_, ref.data(), ldc);
    std::vector<double> exact(static_cast<size_t>(rows_ * n_)), mag(exact.size());
    for (int64_t r = 0; r < rows_; ++r)
      for (int64_t j = 0; j < n_; ++j) {
        double s = 0, m = 0;
        for (int64_t p = 0; p < k_; ++p) {
          const double t = static_cast<double>(a[static_cast<size_t>(r * lda + p)]) * b[static_cast<size_t>(j * ldb + p)];
          s += t;
          m += std::fabs(t);
        }
        const size_t e = static_cast<size_t>(r * n_ + j);
        exact[e] = v.isa == Isa::Generic ? s : ref[static_cast<size_t>(r * ldc + j)];
        mag[e] = m;
      }
    check(c, exact, mag, rows_, n_, ldc);
  }

 private:
  static constexpr float kSentinel = 1234.5f;

  std::vector<float> data(int64_t count, uint32_t stream) const {
    std::mt19937 rng(seed_ * 7919u + stream);
    std::uniform_int_distribution<int> ints(-3, 3);
    std::uniform_real_distribution<float> reals(-1.0f, 1.0f);
    std::vector<float> x(static_cast<size_t>(count));
    for (float& e : x) e = float_data_ ? reals(rng) : static_cast<float>(ints(rng));
    return x;
  }
  static void mark_padding(std::vector<float>& out, int64_t rows, int64_t n, int64_t ldo) {
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = n; j < ldo; ++j) out[static_cast<size_t>(r * ldo + j)] = kSentinel;
  }
  // got[r * ld + j] against want[r * n + j], within the rounding bound of two k-term sums (0 for integer data)
  void check(const std::vector<float>& got, const std::vector<double>& want, const std::vector<double>& mag, int64_t rows,
             int64_t n, int64_t ld) const {
    int64_t bad = 0;
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t j = 0; j < n; ++j) {
        const size_t e = static_cast<size_t>(r * n + j);
        const double bound = float_data_ ? (2.0 * static_cast<double>(k_) + 4.0) * FLT_EPSILON * mag[e] : 0.0;
        const float g = got[static_cast<size_t>(r * ld + j)];
        if (!(std::fabs(static_cast<double>(g) - want[e]) <= bound) && bad++ < 5)
          ADD_FAILURE() << "[" << r << ", " << j << "] = " << g << ", reference " << want[e] << " (bound " << bound << ")";
      }
      for (int64_t j = n; j < ld; ++j)
        if (std::memcmp(&got[static_cast<size_t>(r * ld + j)], &kSentinel, sizeof(float)) != 0 && bad++ < 5)
          ADD_FAILURE() << "[" << r << ", " << j << "] (padding) was written";
    }
    EXPECT_EQ(bad, 0) << "entries wrong";
  }

  int64_t rows_ = 1, k_ = 1, n_ = 1, x_pad_ = 0, w_pad_ = 0, o_pad_ = 0;
  bool float_data_ = false;
  uint32_t seed_ = 0;
};

}  // namespace kiln::cpu::testing
