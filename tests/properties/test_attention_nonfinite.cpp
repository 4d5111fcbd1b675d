// Non-finite values inside attention: a NaN or Inf in a key or value row
// reaches only the outputs of the queries that see it, and a NaN row of
// scores stays NaN (never a zero row). The one-head and multi-head calls
// and linear attention; one sequence's steps over its contiguous cache
// (plan, append, attend): test_attention_nonfinite_steps.cpp, a unit of its
// own so that each builds within the sanitizer stages' limits.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include <rope/attention.hpp>

#include "attention_heads.hpp"
#include "attention_oracle.hpp"
#include "kv_elements.hpp"
#include "support.hpp"

namespace {

namespace at = attention_test;
namespace ra = rope::attention;
using at::Heads;
using ra::Matrix;
using ra::Rotation;
using rope::Style;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

bool all_finite(const Matrix<double>& m) { return m.allFinite(); }
template <class Row>
bool has_nan(const Row& row) {
  return row.array().isNaN().any();
}

// A NaN value or an infinite key at token `bad`: every earlier output of a
// causal call is finite and equal to the call without them, whatever the
// block; the outputs that see a NaN value are NaN (an infinite key may
// weigh 0 or all, so only the earlier rows are pinned for it).
TEST(AttentionNonFinite, FutureNonFiniteRowsNeverReachEarlierSoftmaxOutputs) {
  const std::size_t l = 23, d = 8, dv = 4, bad = 13;
  const rope::Table<double> table(rope::frequencies(d, 10000.0), 32);
  const Matrix<double> q = at::random_matrix<double>(l, d, 1), k = at::random_matrix<double>(l, d, 2);
  const Matrix<double> v = at::random_matrix<double>(l, dv, 3);
  for (const int which : {0, 1}) {  // 0: NaN in v, 1: Inf in k
    Matrix<double> k_bad = k, v_bad = v;
    if (which == 0) v_bad(bad, 1) = kNaN;
    if (which == 1) k_bad(bad, 2) = kInf;
    for (const std::size_t block : {std::size_t{1}, std::size_t{4}, std::size_t{16}, std::size_t{23}}) {
      ra::SoftmaxOptions o;
      o.mask.causal = true;
      o.block = block;
      const Rotation<double> rotation{&table, Style::rotate_half};
      const Matrix<double> clean = ra::softmax(q, k, v, rotation, o);
      const Matrix<double> got = ra::softmax(q, k_bad, v_bad, rotation, o);
      EXPECT_TRUE(all_finite(got.topRows(bad))) << "block " << block << " bad " << which;
      EXPECT_LE(at::relative_error(got.topRows(bad), clean.topRows(bad)), 1e-12) << "block " << block;
      for (std::size_t i = bad; i < l && which == 0; ++i) {
        EXPECT_TRUE(has_nan(got.row(Eigen::Index(i)))) << "row " << i;
      }
      // The same through the views, with a sliding window that hides the bad
      // row again from the queries more than 3 positions after it.
      o.mask.window = 3;
      Heads<double> qh(l, 2, d, 0), kh(l, 1, d, 0), vh(l, 1, dv, 0), out(l, 2, dv, 0);
      for (std::size_t t = 0; t < l; ++t) {
        for (std::size_t c = 0; c < d; ++c) {
          qh.at(t, 0, c) = qh.at(t, 1, c) = q(Eigen::Index(t), Eigen::Index(c));
          kh.at(t, 0, c) = k_bad(Eigen::Index(t), Eigen::Index(c));
        }
        for (std::size_t c = 0; c < dv; ++c) vh.at(t, 0, c) = v_bad(Eigen::Index(t), Eigen::Index(c));
      }
      ra::softmax<double>(qh.view(), kh.view(), vh.view(), out.view(), rotation, o);
      for (std::size_t t = 0; t < l; ++t) {
        const bool sees_bad = t >= bad && t < bad + 3;
        const bool nan = std::isnan(out.at(t, 1, 0)) || std::isnan(out.at(t, 1, 1)) || std::isnan(out.at(t, 1, 2)) ||
                         std::isnan(out.at(t, 1, 3));
        if (!sees_bad) {
          EXPECT_FALSE(nan) << "window row " << t << " block " << block;
        } else if (which == 0) {
          EXPECT_TRUE(nan) << "window row " << t << " block " << block;
        }
      }
    }
  }
}

TEST(AttentionNonFinite, FutureNonFiniteRowsNeverReachEarlierLinearOutputs) {
  const std::size_t l = 21, d = 8, m = 16, dv = 3, bad = 11;
  const rope::Table<double> feature_table(rope::frequencies(m, 10000.0), 32);
  const Matrix<double> q = at::random_matrix<double>(l, d, 4), k = at::random_matrix<double>(l, d, 5);
  const Matrix<double> v = at::random_matrix<double>(l, dv, 6);
  ra::FavorOptions fo;
  fo.features = m;
  const ra::FavorFeatures phi(d, fo);
  const Matrix<double> fq = ra::elu_plus_one(q), fk = ra::elu_plus_one(k);
  for (const int which : {0, 1}) {
    Matrix<double> k_bad = k, v_bad = v, fk_bad = fk;
    if (which == 0) v_bad(bad, 0) = kNaN;
    if (which == 1) {
      k_bad(bad, 1) = kNaN;
      fk_bad(bad, 1) = kInf;
    }
    for (const std::size_t chunk : {std::size_t{1}, std::size_t{5}, std::size_t{8}, std::size_t{21}}) {
      ra::LinearOptions o;
      o.mask.causal = true;
      o.chunk = chunk;
      const Rotation<double> rotation{&feature_table, Style::rotate_half};
      const Matrix<double> clean[] = {ra::linear(fq, fk, v, o), ra::linear(q, k, v, phi, o),
                                      ra::linear_eq19(q, k, v, phi, rotation, o)};
      const Matrix<double> got[] = {ra::linear(fq, fk_bad, v_bad, o), ra::linear(q, k_bad, v_bad, phi, o),
                                    ra::linear_eq19(q, k_bad, v_bad, phi, rotation, o)};
      for (int i = 0; i < 3; ++i) {
        EXPECT_TRUE(all_finite(got[i].topRows(bad))) << "call " << i << " chunk " << chunk << " bad " << which;
        EXPECT_LE(at::relative_error(got[i].topRows(bad), clean[i].topRows(bad)), 1e-12) << "call " << i;
        if (which == 0) {
          EXPECT_TRUE(has_nan(got[i].row(bad))) << "call " << i << " chunk " << chunk;
        }
      }
    }
  }
}

// A NaN in q_i or in a key it sees gives a NaN row, not zeros; a query that
// sees no key is the only zero row.
TEST(AttentionNonFinite, SoftmaxNaNRowsStayNaN) {
  const std::size_t l = 9, d = 4, dv = 2;
  Matrix<double> q = at::random_matrix<double>(l, d, 7), k = at::random_matrix<double>(l, d, 8);
  const Matrix<double> v = at::random_matrix<double>(l, dv, 9);
  q(4, 0) = kNaN;
  k(6, 1) = kNaN;
  ra::SoftmaxOptions o;
  o.mask.causal = true;
  o.block = 3;
  o.q_positions = {0, 1, 2, 3, 4, 5, 6, 7, -1};  // the last query precedes every key
  o.k_positions = {0, 1, 2, 3, 4, 5, 6, 7, 8};
  const Matrix<double> out = ra::softmax(q, k, v, {}, o);
  for (std::size_t i = 0; i < l; ++i) {
    const bool nan_expected = i == 4 || i == 6 || i == 7;
    EXPECT_EQ(std::isnan(out(Eigen::Index(i), 0)), nan_expected) << "row " << i;
  }
  EXPECT_EQ(out(8, 0), 0.0);
  EXPECT_EQ(out(8, 1), 0.0);
}

}  // namespace
