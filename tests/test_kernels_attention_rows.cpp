// Attention's SIMD rows (kernels/dense_dot.hpp, rms_norm.hpp, scores.hpp) on each architecture of
// the build whose code differs (rope_test::DistinctArchs), each suite named by it, against their
// scalar twins (reference.hpp) and long double:
//   weighted_rows equals reference::weighted_rows bit for bit where the
//   architecture has fused multiply-adds (both add value by value, one
//   rounding each), and is within n * eps * sum |w v| of long double
//   everywhere;
//   dot_rows is within d * eps * sum |q k| of long double (its lanes sum in
//   another order than the reference's loop);
//   rms_norm_row and rms_norm_rows equal the documented plain loop bit for
//   bit, and are within (n + 8) eps |y| of long double;
//   softmax_weights_row equals reference::softmax_weights bit for bit where
//   the architecture has fused multiply-adds, and is within 2 ulps of long
//   double's e^x (4 where Horner's steps round twice).
// Every row count 1 .. 10 (the register-blocked 1 .. 8 and the fallback),
// channel counts around every batch width, strided weights and accumulators,
// and guard values around every output.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include <rope/attention/logits.hpp>
#include <rope/kernels/dense_dot.hpp>
#include <rope/kernels/rms_norm.hpp>
#include <rope/kernels/scores.hpp>
#include <rope/reference.hpp>

#include "archs.hpp"
#include "support.hpp"

namespace {

template <class Arch>
class AttentionRows : public ::testing::Test {};
TYPED_TEST_SUITE(AttentionRows, rope_test::DistinctArchs, rope_test::ArchNames);

constexpr std::size_t kDims[] = {1, 3, 4, 7, 8, 15, 16, 17, 31, 32, 33, 64, 65, 128, 130};

template <class T>
long double abs_ld(T x) {
  return std::fabs(static_cast<long double>(x));
}

template <class T, class Arch>
void check_weighted_rows() {
  const double eps = std::numeric_limits<T>::epsilon();
  for (std::size_t rows = 1; rows <= 10; ++rows) {
    for (std::size_t dv : kDims) {
      const std::size_t n = 1 + (dv * 7 + rows) % 23;
      const std::size_t weight_stride = n + 3, value_stride = dv + 5, acc_stride = dv + 2;
      const auto weights = rope_test::random_vector<T>(rows * weight_stride, 11u * rows + dv);
      const auto values = rope_test::random_vector<T>(n * value_stride, 13u * rows + dv);
      const auto start = rope_test::random_vector<T>(rows * acc_stride, 17u * rows + dv);
      rope_test::Guarded<T> acc(rows * acc_stride, rows % 3);
      std::copy(start.begin(), start.end(), acc.data());
      std::vector<T> twin = start;
      rope::weighted_rows<T, Arch>(weights.data(), weight_stride, rows, n, values.data(), value_stride, dv, acc.data(),
                                   acc_stride);
      rope::reference::weighted_rows(weights.data(), weight_stride, rows, n, values.data(), value_stride, dv,
                                     twin.data(), acc_stride);
      ASSERT_TRUE(acc.guards_intact()) << Arch::name() << " rows " << rows << " dv " << dv;
      for (std::size_t r = 0; r < rows; ++r) {
        for (std::size_t c = 0; c < acc_stride; ++c) {
          const std::size_t i = r * acc_stride + c;
          if (c >= dv) {
            ASSERT_EQ(std::memcmp(&acc.data()[i], &start[i], sizeof(T)), 0) << "gap written, row " << r;
            continue;
          }
          long double exact = start[i], magnitude = abs_ld(start[i]);
          for (std::size_t j = 0; j < n; ++j) {
            const long double term = static_cast<long double>(weights[r * weight_stride + j]) *
                                     static_cast<long double>(values[j * value_stride + c]);
            exact += term;
            magnitude += std::fabs(term);
          }
          const double bound = static_cast<double>(n + 1) * eps * static_cast<double>(magnitude);
          ASSERT_NEAR(static_cast<double>(acc.data()[i]), static_cast<double>(exact), bound)
              << Arch::name() << " rows " << rows << " dv " << dv << " channel " << c;
          if (rope_test::kFusedMultiplyAdd<Arch>) {
            ASSERT_EQ(std::memcmp(&acc.data()[i], &twin[i], sizeof(T)), 0)
                << Arch::name() << " differs from reference::weighted_rows: rows " << rows << " dv " << dv
                << " channel " << c << ": " << acc.data()[i] << " vs " << twin[i];
          }
        }
      }
    }
  }
}

template <class T, class Arch>
void check_dot_rows() {
  const double eps = std::numeric_limits<T>::epsilon();
  for (std::size_t rows = 1; rows <= 10; ++rows) {
    for (std::size_t d : kDims) {
      const auto q = rope_test::random_vector<T>(rows * d, 19u * rows + d);
      const auto key = rope_test::random_vector<T>(d, 23u * rows + d);
      const std::size_t stride = 3;
      rope_test::Guarded<T> scores(rows * stride, 1);
      std::vector<T> before(scores.data(), scores.data() + rows * stride);
      std::vector<T> twin(rows * stride, T(0));
      rope::dot_rows<T, Arch>(q.data(), rows, d, key.data(), scores.data(), stride);
      rope::reference::dot_rows(q.data(), rows, d, key.data(), twin.data(), stride);
      ASSERT_TRUE(scores.guards_intact()) << Arch::name();
      for (std::size_t r = 0; r < rows; ++r) {
        long double exact = 0, magnitude = 0;
        for (std::size_t c = 0; c < d; ++c) {
          const long double term = static_cast<long double>(q[r * d + c]) * static_cast<long double>(key[c]);
          exact += term;
          magnitude += std::fabs(term);
        }
        const double bound = static_cast<double>(d) * eps * static_cast<double>(magnitude);
        ASSERT_NEAR(static_cast<double>(scores.data()[r * stride]), static_cast<double>(exact), bound)
            << Arch::name() << " rows " << rows << " d " << d;
        ASSERT_NEAR(static_cast<double>(twin[r * stride]), static_cast<double>(exact), bound) << "the twin, d " << d;
        for (std::size_t s = 1; s < stride; ++s) {
          ASSERT_EQ(std::memcmp(&scores.data()[r * stride + s], &before[r * stride + s], sizeof(T)), 0)
              << "a score gap was written";
        }
      }
    }
  }
}

TYPED_TEST(AttentionRows, WeightedRowsMatchTheirTwinAndLongDouble) {
  using Arch = TypeParam;
  if (!rope::detail::cpu_supports<Arch>()) GTEST_SKIP() << Arch::name() << " does not run on this CPU";
  check_weighted_rows<float, Arch>();
  if constexpr (rope::detail::has_batch<double, Arch>::value) check_weighted_rows<double, Arch>();
}

TYPED_TEST(AttentionRows, DotRowsMatchLongDouble) {
  using Arch = TypeParam;
  if (!rope::detail::cpu_supports<Arch>()) GTEST_SKIP() << Arch::name() << " does not run on this CPU";
  check_dot_rows<float, Arch>();
  if constexpr (rope::detail::has_batch<double, Arch>::value) check_dot_rows<double, Arch>();
}

// RMSNorm in the order attention/append.hpp documents, as a plain loop: the
// eight chains s[c % 8], their fixed sum, r, then (x r) w.
void plain_rms_norm(const float* x, std::size_t n, const float* w, float eps, bool plus_one, float* y) {
  float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (std::size_t c = 0; c < n; ++c) s[c % 8] = std::fma(x[c], x[c], s[c % 8]);
  const float ss = ((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7]));
  const float r = 1.0f / std::sqrt(ss / static_cast<float>(n) + eps);
  for (std::size_t c = 0; c < n; ++c) y[c] = (x[c] * r) * (plus_one ? 1.0f + w[c] : w[c]);
}

// finish_float_row (a softmax row's end in vectors) equals the scalar
// finish_softmax_row bit for bit on every architecture: every length around
// the vector widths, with and without a sink (one above the row's max, one
// -inf), a row that saw no key, and its log-sum-exp.
TYPED_TEST(AttentionRows, FinishedRowsAreTheScalarLoopBitForBit) {
  using Arch = TypeParam;
  if (!rope::detail::cpu_supports<Arch>()) GTEST_SKIP() << Arch::name() << " does not run on this CPU";
  const float inf = std::numeric_limits<float>::infinity();
  for (const std::size_t n : kDims) {
    const auto acc = rope_test::random_vector<float>(n, 31u + static_cast<unsigned>(n));
    for (const float sink : {-inf, 0.25f, 9.0f}) {
      for (const bool sees : {true, false}) {
        const float m = 1.5f, l = 3.0f + static_cast<float>(n);
        std::vector<float> want(n, -1.0f), got(n, -2.0f);
        float lse_want = 0, lse_got = 1;
        rope::attention::detail::finish_softmax_row<float>(m, l, acc.data(), n, sink, sees, want.data(), &lse_want);
        rope::attention::detail::finish_float_row<Arch>(m, l, acc.data(), n, sink, sees, got.data(), &lse_got);
        const std::string what = "n " + std::to_string(n) + ", sink " + std::to_string(sink) + (sees ? "" : ", no key");
        EXPECT_EQ(std::memcmp(got.data(), want.data(), n * sizeof(float)), 0) << what;
        EXPECT_EQ(std::memcmp(&lse_got, &lse_want, sizeof(float)), 0) << what;
      }
    }
  }
}

// rms_norm_row and rms_norm_rows (four rows' sums at a time, groups of 16
// rows) equal the plain loop bit for bit on every architecture, for every
// row count around the groups, strided rows, in place and out of place; and
// are within (n + 8) eps |y| of long double.
TYPED_TEST(AttentionRows, RmsNormRowsAreThePlainLoopBitForBit) {
  using Arch = TypeParam;
  if (!rope::detail::cpu_supports<Arch>()) GTEST_SKIP() << Arch::name() << " does not run on this CPU";
  const float eps = 1e-6f;
  for (const std::size_t n : kDims) {
    const auto w = rope_test::random_vector<float>(n, 5u + n);
    for (const bool plus_one : {false, true}) {
      for (std::size_t rows = 1; rows <= 21; rows += (rows < 9 ? 1 : 4)) {
        const std::size_t stride = n + 3;
        const auto x = rope_test::random_vector<float>(rows * stride, 31u * rows + n);
        std::vector<float> want(rows * n), one(rows * n), got(rows * n), in_place(x);
        for (std::size_t r = 0; r < rows; ++r) {
          plain_rms_norm(x.data() + r * stride, n, w.data(), eps, plus_one, want.data() + r * n);
          rope::rms_norm_row<Arch>(x.data() + r * stride, n, w.data(), eps, plus_one, one.data() + r * n);
        }
        rope::rms_norm_rows<Arch>(x.data(), stride, rows, n, w.data(), eps, plus_one, got.data(), n);
        rope::rms_norm_rows<Arch>(in_place.data(), stride, rows, n, w.data(), eps, plus_one, in_place.data(), stride);
        for (std::size_t r = 0; r < rows; ++r) {
          long double ss = 0;
          for (std::size_t c = 0; c < n; ++c) ss += static_cast<long double>(x[r * stride + c]) * x[r * stride + c];
          const long double inv = 1.0L / std::sqrt(ss / static_cast<long double>(n) + eps);
          for (std::size_t c = 0; c < n; ++c) {
            const std::size_t i = r * n + c;
            ASSERT_EQ(std::memcmp(&one[i], &want[i], sizeof(float)), 0)
                << Arch::name() << " rms_norm_row n " << n << " row " << r << " channel " << c;
            ASSERT_EQ(std::memcmp(&got[i], &want[i], sizeof(float)), 0)
                << Arch::name() << " rms_norm_rows n " << n << " rows " << rows << " row " << r << " channel " << c;
            ASSERT_EQ(std::memcmp(&in_place[r * stride + c], &want[i], sizeof(float)), 0)
                << Arch::name() << " rms_norm_rows in place n " << n << " rows " << rows << " row " << r;
            const long double exact =
                x[r * stride + c] * inv * (plus_one ? 1.0L + w[c] : static_cast<long double>(w[c]));
            const double bound = static_cast<double>(n + 8) * std::numeric_limits<float>::epsilon() *
                                 static_cast<double>(std::fabs(exact));
            ASSERT_NEAR(static_cast<double>(got[i]), static_cast<double>(exact), bound) << Arch::name() << " n " << n;
          }
          for (std::size_t c = n; c < stride; ++c) {
            ASSERT_EQ(std::memcmp(&in_place[r * stride + c], &x[r * stride + c], sizeof(float)), 0)
                << "a gap between rows was written";
          }
        }
      }
    }
  }
}

// softmax_weights_row against its twin and long double: for scores s_j =
// m - u_j with u_j over [0, 100] (past the underflow at 86.6), some exactly
// m, some -inf, a NaN, every length around the batch widths, the weights
//   - equal reference::softmax_weights bit for bit where the architecture
//     has fused multiply-adds;
//   - are within 2 ulps of e^x, x = s_j - m as rounded to float (4 where
//     Horner's steps round twice), and 0 where e^x < 2^-125;
//   - are exactly 1 at s_j = m, 0 at -inf, NaN at NaN;
//   - equal the twin at the ties, where x log2(e) is half-way between two
//     integers;
// the sum is within n eps of the weights' exact sum; with clear the n scores
// are 0 after and nothing past them is written; in place gives the same bits.
TYPED_TEST(AttentionRows, SoftmaxWeightsMatchTheirTwinAndLongDouble) {
  using Arch = TypeParam;
  if (!rope::detail::cpu_supports<Arch>()) GTEST_SKIP() << Arch::name() << " does not run on this CPU";
  const double eps = std::numeric_limits<float>::epsilon();
  const double ulps = rope_test::kFusedMultiplyAdd<Arch> ? 2.0 : 4.0;
  const float neg_inf = -std::numeric_limits<float>::infinity();
  std::vector<std::size_t> lengths(std::begin(kDims), std::end(kDims));
  lengths.push_back(0);
  lengths.push_back(300);
  for (const std::size_t n : lengths) {
    for (const float m : {0.0f, 3.25f, -17.5f, 41.0f}) {
      const auto u = rope_test::random_vector<float>(n, 7u * static_cast<std::uint32_t>(n) + 1u, 1.0);
      rope_test::Guarded<float> scores(n, n % 3);
      for (std::size_t j = 0; j < n; ++j) scores.data()[j] = m - 50.0f * (1.0f + u[j]);
      if (n > 2) scores.data()[n / 2] = m;
      if (n > 3) scores.data()[n / 3] = neg_inf;
      if (n > 5) scores.data()[n - 1] = m - 0.001f;
      const std::vector<float> s(scores.data(), scores.data() + n);
      std::vector<float> twin(n), in_place(s);
      rope_test::Guarded<float> w(n, (n + 1) % 3);
      const float sum = rope::softmax_weights_row<Arch>(scores.data(), w.data(), n, m, true);
      const float twin_sum = rope::reference::softmax_weights(s.data(), twin.data(), n, m);
      const float in_place_sum = rope::softmax_weights_row<Arch>(in_place.data(), in_place.data(), n, m, false);
      ASSERT_TRUE(scores.guards_intact() && w.guards_intact()) << Arch::name() << " n " << n;
      ASSERT_EQ(std::memcmp(&sum, &in_place_sum, sizeof sum), 0) << Arch::name() << " n " << n;
      long double exact_sum = 0;
      for (std::size_t j = 0; j < n; ++j) {
        ASSERT_EQ(scores.data()[j], 0.0f) << Arch::name() << " clear left score " << j;
        ASSERT_EQ(std::memcmp(&in_place[j], &w.data()[j], sizeof(float)), 0) << Arch::name() << " in place " << j;
        if (rope_test::kFusedMultiplyAdd<Arch>) {
          ASSERT_EQ(std::memcmp(&w.data()[j], &twin[j], sizeof(float)), 0)
              << Arch::name() << " differs from reference::softmax_weights: n " << n << " j " << j;
        }
        const float got = w.data()[j];
        exact_sum += got;
        if (s[j] == neg_inf) {
          ASSERT_EQ(got, 0.0f);
          continue;
        }
        const long double x = s[j] - m;
        const long double exact = std::exp(x);
        if (x == 0) {
          ASSERT_EQ(got, 1.0f);
        }
        if (exact < std::ldexp(1.0L, -125)) {
          ASSERT_LE(got, std::ldexp(1.0f, -124)) << Arch::name() << " x " << static_cast<double>(x);
          continue;
        }
        const float ulp = std::nextafter(static_cast<float>(exact), 2.0f) - static_cast<float>(exact);
        const double bound = ulps * static_cast<double>(ulp);
        ASSERT_NEAR(static_cast<double>(got), static_cast<double>(exact), bound)
            << Arch::name() << " n " << n << " x " << static_cast<double>(x);
      }
      ASSERT_NEAR(static_cast<double>(sum), static_cast<double>(exact_sum),
                  static_cast<double>(n) * eps * static_cast<double>(exact_sum))
          << Arch::name() << " n " << n;
      ASSERT_NEAR(static_cast<double>(twin_sum), static_cast<double>(exact_sum),
                  static_cast<double>(n) * eps * static_cast<double>(exact_sum));
    }
  }
  // Ties: scores whose t = x log2(e) lies exactly half-way between two
  // integers (rare: found by a scan near each half-integer), where the
  // rounding of t to k decides the bits.
  std::vector<float> ties;
  for (int h = 0; h < 125; ++h) {
    const float half = -0.5f - static_cast<float>(h);
    float up = half / 1.44269504088896341f, down = up;
    for (int step = 0; step < 2048; ++step) {
      if (up * 1.44269504088896341f == half) ties.push_back(up);
      if (down * 1.44269504088896341f == half) ties.push_back(down);
      up = std::nextafter(up, 0.0f);
      down = std::nextafter(down, -200.0f);
    }
  }
  ASSERT_GE(ties.size(), 5u) << "the scan found too few ties to test";
  std::vector<float> tie_w(ties.size()), tie_twin(ties.size());
  rope::softmax_weights_row<Arch>(ties.data(), tie_w.data(), ties.size(), 0.0f, false);
  rope::reference::softmax_weights(ties.data(), tie_twin.data(), ties.size(), 0.0f);
  for (std::size_t i = 0; i < ties.size(); ++i) {
    if (rope_test::kFusedMultiplyAdd<Arch>) {
      ASSERT_EQ(std::memcmp(&tie_w[i], &tie_twin[i], sizeof(float)), 0)
          << Arch::name() << " tie x " << ties[i] << ": " << tie_w[i] << " against " << tie_twin[i];
    }
    const long double exact = std::exp(static_cast<long double>(ties[i]));
    const float ulp = std::nextafter(static_cast<float>(exact), 2.0f) - static_cast<float>(exact);
    ASSERT_NEAR(static_cast<double>(tie_w[i]), static_cast<double>(exact), ulps * static_cast<double>(ulp))
        << Arch::name() << " tie x " << ties[i];
  }

  std::vector<float> s = {0.0f, std::numeric_limits<float>::quiet_NaN(), -1.0f}, w(3);
  rope::softmax_weights_row<Arch>(s.data(), w.data(), s.size(), 0.0f, false);
  EXPECT_EQ(w[0], 1.0f);
  EXPECT_TRUE(std::isnan(w[1])) << Arch::name();
  std::vector<float> wide(40, -2.0f), wide_w(40);
  wide[17] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(std::isnan(rope::softmax_weights_row<Arch>(wide.data(), wide_w.data(), wide.size(), 0.0f, false)));
  EXPECT_TRUE(std::isnan(wide_w[17])) << Arch::name();
  EXPECT_EQ(wide_w[16], wide_w[18]);
}

// A NaN in one value row reaches every accumulator that weighs it, and no
// other channel; a zero weight on an infinite value is NaN, as IEEE says
// (attention leaves masked keys out instead of weighing them by zero).
TYPED_TEST(AttentionRows, NonFiniteValuesReachOnlyTheirChannels) {
  using Arch = TypeParam;
  if (!rope::detail::cpu_supports<Arch>()) GTEST_SKIP() << Arch::name() << " does not run on this CPU";
  const std::size_t rows = 3, n = 5, dv = 37;
  std::vector<float> weights(rows * n, 0.5f), values(n * dv, 1.0f), acc(rows * dv, 0.0f);
  values[2 * dv + 11] = std::numeric_limits<float>::quiet_NaN();
  rope::weighted_rows<float, Arch>(weights.data(), n, rows, n, values.data(), dv, dv, acc.data(), dv);
  for (std::size_t r = 0; r < rows; ++r) {
    for (std::size_t c = 0; c < dv; ++c) {
      if (c == 11) {
        EXPECT_TRUE(std::isnan(acc[r * dv + c])) << Arch::name() << " row " << r;
      } else {
        EXPECT_EQ(acc[r * dv + c], 2.5f) << Arch::name() << " row " << r << " channel " << c;
      }
    }
  }
}

// CI names the architectures this machine must run (ROPE_EXPECT_ARCHS): one
// that the build lost, or that the CPU cannot run, fails here instead of
// skipping silently.
TEST(Architectures, EveryExpectedArchitectureIsBuiltAndRuns) {
  const auto expected = rope_test::expected_archs();
  if (expected.empty()) GTEST_SKIP() << "ROPE_EXPECT_ARCHS is not set";
  std::vector<std::string> runnable;
  xsimd::supported_architectures::for_each([&](auto arch) {
    if (rope::detail::cpu_supports<decltype(arch)>()) runnable.emplace_back(decltype(arch)::name());
  });
  std::string listed;
  for (const auto& name : runnable) listed += name + " ";
  for (const auto& name : expected) {
    EXPECT_NE(std::find(runnable.begin(), runnable.end(), name), runnable.end())
        << "expected architecture " << name << " is not built or does not run here (runnable: " << listed << ")";
  }
}

}  // namespace
