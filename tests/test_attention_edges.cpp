// The attention module at its edges: non-finite inputs in keys and values a
// query must not see, NaN rows, eq. 19's feature table (its width and its
// attention factor), causal linear attention masked by position, the views
// the multi-head softmax must refuse, and block / chunk sizes past any
// matrix. Each case pins one behaviour that a simpler implementation gets
// wrong (multiplying masked entries by zero, zero rows for every row sum
// that is not > 0, trusting a Rotation's rotary_dim, index-order masks).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include <rope/attention.hpp>

#include "attention_heads.hpp"
#include "attention_oracle.hpp"
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
TEST(AttentionEdges, FutureNonFiniteRowsNeverReachEarlierSoftmaxOutputs) {
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
      o.causal = true;
      o.block = block;
      const Matrix<double> clean = ra::softmax(q, k, v, Rotation<double>{&table}, o);
      const Matrix<double> got = ra::softmax(q, k_bad, v_bad, Rotation<double>{&table}, o);
      EXPECT_TRUE(all_finite(got.topRows(bad))) << "block " << block << " bad " << which;
      EXPECT_LE(at::relative_error(got.topRows(bad), clean.topRows(bad)), 1e-12) << "block " << block;
      for (std::size_t i = bad; i < l && which == 0; ++i) {
        EXPECT_TRUE(has_nan(got.row(Eigen::Index(i)))) << "row " << i;
      }
      // The same through the views, with a sliding window that hides the bad
      // row again from the queries more than 3 positions after it.
      o.window = 3;
      Heads<double> qh(l, 2, d, 0), kh(l, 1, d, 0), vh(l, 1, dv, 0), out(l, 2, dv, 0);
      for (std::size_t t = 0; t < l; ++t) {
        for (std::size_t c = 0; c < d; ++c) {
          qh.at(t, 0, c) = qh.at(t, 1, c) = q(Eigen::Index(t), Eigen::Index(c));
          kh.at(t, 0, c) = k_bad(Eigen::Index(t), Eigen::Index(c));
        }
        for (std::size_t c = 0; c < dv; ++c) vh.at(t, 0, c) = v_bad(Eigen::Index(t), Eigen::Index(c));
      }
      ra::softmax<double>(qh.view(), kh.view(), vh.view(), out.view(), Rotation<double>{&table}, o);
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

TEST(AttentionEdges, FutureNonFiniteRowsNeverReachEarlierLinearOutputs) {
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
      o.causal = true;
      o.chunk = chunk;
      const Matrix<double> clean[] = {ra::linear(fq, fk, v, o), ra::linear(q, k, v, phi, o),
                                      ra::linear_eq19(q, k, v, phi, Rotation<double>{&feature_table}, o)};
      const Matrix<double> got[] = {ra::linear(fq, fk_bad, v_bad, o), ra::linear(q, k_bad, v_bad, phi, o),
                                    ra::linear_eq19(q, k_bad, v_bad, phi, Rotation<double>{&feature_table}, o)};
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
TEST(AttentionEdges, SoftmaxNaNRowsStayNaN) {
  const std::size_t l = 9, d = 4, dv = 2;
  Matrix<double> q = at::random_matrix<double>(l, d, 7), k = at::random_matrix<double>(l, d, 8);
  const Matrix<double> v = at::random_matrix<double>(l, dv, 9);
  q(4, 0) = kNaN;
  k(6, 1) = kNaN;
  ra::SoftmaxOptions o;
  o.causal = true;
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

// A feature rotation that asks for more channels than its table has is
// refused by name (it used to read past the table).
TEST(AttentionEdges, Eq19RotationWiderThanItsTableIsRefused) {
  const std::size_t l = 5, m = 16;
  const rope::Table<double> narrow(rope::frequencies(4, 10000.0), 8);
  const Matrix<double> f = ra::elu_plus_one(at::random_matrix<double>(l, m, 10));
  const Matrix<double> v = at::random_matrix<double>(l, 2, 11);
  const auto msg = rope_test::thrown_message([&] { ra::linear_eq19(f, f, v, Rotation<double>{&narrow, Style::rotate_half, m}); });
  EXPECT_NE(msg.find("feature_rotation.rotary_dim must be <= the table's rotary_dim 4, got 16"), std::string::npos)
      << msg;
}

// Eq. 19 rotates: a feature table with an attention factor gives the same
// output as one without (the factor is divided out of the numerator).
TEST(AttentionEdges, Eq19DividesTheFeatureTablesAttentionFactorOut) {
  const std::size_t l = 17, m = 8, dv = 3;
  const auto plain = rope::frequencies(m, 10000.0);
  rope::scaling::Custom custom;
  custom.inv_freq = plain.inv_freq;
  custom.attention_factor = 1.7;
  const rope::Table<double> unit(plain, 32), scaled(rope::frequencies(m, 10000.0, custom), 32);
  ASSERT_EQ(scaled.attention_factor(), 1.7);
  const Matrix<double> fq = ra::elu_plus_one(at::random_matrix<double>(l, m, 12));
  const Matrix<double> fk = ra::elu_plus_one(at::random_matrix<double>(l, m, 13));
  const Matrix<double> v = at::random_matrix<double>(l, dv, 14);
  for (const bool causal : {false, true}) {
    ra::LinearOptions o;
    o.causal = causal;
    o.q_positions = o.k_positions = at::random_positions(l, 32, 15);
    const Matrix<double> a = ra::linear_eq19(fq, fk, v, Rotation<double>{&unit}, o);
    const Matrix<double> b = ra::linear_eq19(fq, fk, v, Rotation<double>{&scaled}, o);
    EXPECT_LE(at::relative_error(b, a), 1e-13) << "causal " << causal;
  }
}

// Causal linear attention masks by position, as softmax does: with rows out
// of position order, a row sees the keys at or before its position, not the
// rows above it.
TEST(AttentionEdges, CausalLinearMasksByPositionNotRowOrder) {
  const std::size_t l = 6, m = 4, dv = 2;
  const Matrix<double> fq = ra::elu_plus_one(at::random_matrix<double>(l, m, 16));
  const Matrix<double> fk = ra::elu_plus_one(at::random_matrix<double>(l, m, 17));
  const Matrix<double> v = at::random_matrix<double>(l, dv, 18);
  ra::LinearOptions o;
  o.causal = true;
  o.chunk = 2;
  o.q_positions = {5, 0, 3, 3, 1, 4};
  o.k_positions = {5, 0, 3, 3, 1, 4};
  const auto want = at::quadratic(at::to_ld(fq), at::to_ld(fq), at::to_ld(fk), at::to_ld(fk), at::to_ld(v), true,
                                  1e-6L, o.q_positions, o.k_positions);
  const auto index_order = at::quadratic(at::to_ld(fq), at::to_ld(fq), at::to_ld(fk), at::to_ld(fk), at::to_ld(v), true);
  const Matrix<double> got = ra::linear(fq, fk, v, o);
  EXPECT_LE(at::relative_error(got, want), 1e-12);
  EXPECT_GT(at::relative_error(got, index_order), 1e-3);  // the two masks differ here
  // Row 0 (position 5) sees all six keys: the non-causal result.
  ra::LinearOptions all;
  EXPECT_LE(at::relative_error(got.row(0), Matrix<double>(ra::linear(fq, fk, v, all).row(0))), 1e-12);
}

// The multi-head softmax refuses an output that shares memory with an input
// or whose heads collapse onto one row, and writes nothing.
TEST(AttentionEdges, SoftmaxViewsRefuseOverlappingOutputs) {
  const std::size_t l = 4, d = 4;
  Heads<double> q(l, 2, d, 19), k(l, 1, d, 20), v(l, 1, d, 21);
  Heads<double> out = Heads<double>::filled(l, 2, d, -5.0);
  const auto q_before = q.data, v_before = v.data, out_before = out.data;
  const auto run = [&](rope::View<double> o) {
    return rope_test::thrown_message([&] { ra::softmax<double>(q.view(), k.view(), v.view(), o); });
  };
  EXPECT_NE(run(q.view()).find("out must be disjoint from q"), std::string::npos);
  EXPECT_NE(run(rope::View<double>(v.data.data(), l, 2, d, d, 0)).find("out.head_stride must be >= 4"),
            std::string::npos);
  EXPECT_NE(run(rope::View<double>(out.data.data(), l, 2, d, 2 * d, 0)).find("out.head_stride must be >= 4"),
            std::string::npos);
  const rope::View<double> over_v(v.data.data(), l, 2, 2, d, 2);  // inside v's rows
  EXPECT_NE(rope_test::thrown_message([&] {
              ra::softmax<double>(q.view(), k.view(), rope::View<const double>(v.data.data(), l, 1, 2, d, 2), over_v);
            }).find("disjoint from v"),
            std::string::npos);
  EXPECT_TRUE(at::same_bytes(q.data, q_before));
  EXPECT_TRUE(at::same_bytes(v.data, v_before));
  EXPECT_TRUE(at::same_bytes(out.data, out_before));
}

// Block and chunk sizes beyond any matrix mean "everything in one block".
TEST(AttentionEdges, HugeBlocksAndChunksAreOneBlock) {
  const std::size_t l = 12, d = 4, dv = 2;
  const Matrix<double> q = at::random_matrix<double>(l, d, 22), k = at::random_matrix<double>(l, d, 23);
  const Matrix<double> v = at::random_matrix<double>(l, dv, 24);
  for (const std::size_t huge : {std::size_t{1} << 63, std::numeric_limits<std::size_t>::max()}) {
    ra::SoftmaxOptions so, so_l;
    so.causal = so_l.causal = true;
    so.block = huge;
    so_l.block = l;
    EXPECT_LE(at::relative_error(ra::softmax(q, k, v, {}, so), ra::softmax(q, k, v, {}, so_l)), 1e-15);
    ra::LinearOptions lo, lo_l;
    lo.causal = lo_l.causal = true;
    lo.chunk = huge;
    lo_l.chunk = l;
    const Matrix<double> fq = ra::elu_plus_one(q), fk = ra::elu_plus_one(k);
    EXPECT_LE(at::relative_error(ra::linear(fq, fk, v, lo), ra::linear(fq, fk, v, lo_l)), 1e-15);
  }
  // A feature count is not a feature map: no implicit conversion.
  static_assert(!std::is_convertible<std::size_t, ra::FavorFeatures>::value, "FavorFeatures(size_t) is explicit");
}

}  // namespace
