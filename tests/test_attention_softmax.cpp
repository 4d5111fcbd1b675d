// Softmax attention with RoPE against a naive long-double softmax whose
// scores are q_i . R_(pk_j - pq_i) k_j * scale (E5): both pairings, partial
// rotary, random and repeated positions, causal masks by position, every
// block size (divisors of L and not), a set scale, float and double, the
// multi-head View overload with grouped-query heads, and the error paths.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include <rope/attention.hpp>
#include <rope/frequencies.hpp>
#include <rope/table.hpp>

#include "attention_oracle.hpp"
#include "support.hpp"

namespace {

namespace at = attention_test;
using rope::Style;
using rope::attention::Matrix;
using rope::attention::Rotation;
using rope::attention::SoftmaxOptions;

constexpr Style kStyles[] = {Style::rotate_half, Style::block_diagonal};

template <class T>
class SoftmaxTyped : public ::testing::Test {};
using Scalars = ::testing::Types<float, double>;
TYPED_TEST_SUITE(SoftmaxTyped, Scalars, rope_test::ScalarNames);

// E5: blockwise softmax with RoPE equals the naive softmax of the relative
// scores, for every block size, causal or not, with random positions.
TYPED_TEST(SoftmaxTyped, MatchesNaiveRelativeScoresForEveryBlock) {
  using T = TypeParam;
  const std::size_t lq = 37, lk = 45, d = 16, dv = 12;
  const auto freqs = rope::frequencies(d, 10000.0);
  const rope::Table<T> table(freqs, 200);
  const Matrix<T> q = at::random_matrix<T>(lq, d, 1), k = at::random_matrix<T>(lk, d, 2);
  const Matrix<T> v = at::random_matrix<T>(lk, dv, 3);
  for (const Style style : kStyles) {
    for (const bool causal : {false, true}) {
      SoftmaxOptions o;
      o.causal = causal;
      o.q_positions = at::random_positions(lq, 200, 4);
      o.k_positions = at::random_positions(lk, 200, 5);
      const auto want = at::naive_softmax(at::to_ld(q), at::to_ld(k), at::to_ld(v), freqs.inv_freq, style,
                                          o.q_positions, o.k_positions, 1.0L / std::sqrt(at::LD(d)), causal);
      for (const std::size_t block : {std::size_t{1}, std::size_t{3}, std::size_t{7}, std::size_t{16},
                                      std::size_t{37}, std::size_t{45}, std::size_t{128}}) {
        o.block = block;
        const Matrix<T> got = rope::attention::softmax(q, k, v, Rotation<T>{&table, style}, o);
        EXPECT_LE(at::relative_error(got, want), at::exact_tolerance<T>())
            << rope::name(style) << " causal " << causal << " block " << block;
      }
    }
  }
}

// Default positions with Lq = Lk: the causal mask is j <= i; a set scale is used as given.
TYPED_TEST(SoftmaxTyped, DefaultPositionsAndSetScale) {
  using T = TypeParam;
  const std::size_t l = 50, d = 32, dv = 8;
  const auto freqs = rope::frequencies(d, 500000.0);
  const rope::Table<T> table(freqs, 64);
  const Matrix<T> q = at::random_matrix<T>(l, d, 11), k = at::random_matrix<T>(l, d, 12);
  const Matrix<T> v = at::random_matrix<T>(l, dv, 13);
  SoftmaxOptions o;
  o.causal = true;
  o.scale = 0.3;
  o.block = 16;
  const auto pos = at::iota_positions(l);
  const auto want = at::naive_softmax(at::to_ld(q), at::to_ld(k), at::to_ld(v), freqs.inv_freq, Style::rotate_half,
                                      pos, pos, 0.3L, true);
  const Matrix<T> got = rope::attention::softmax(q, k, v, Rotation<T>{&table, Style::rotate_half}, o);
  EXPECT_LE(at::relative_error(got, want), at::exact_tolerance<T>());
  // Row 0 sees only key 0: its output is v_0.
  for (Eigen::Index c = 0; c < got.cols(); ++c) EXPECT_NEAR(got(0, c), v(0, c), 1e-6);
}

// Sorted positions with repeats (packed or shared positions): each query
// sees a prefix of every key block, a key of the same position included.
TEST(Softmax, SortedPositionsWithRepeats) {
  const std::size_t l = 40, d = 8;
  const auto freqs = rope::frequencies(d, 10000.0);
  const rope::Table<double> table(freqs, 64);
  const Matrix<double> q = at::random_matrix<double>(l, d, 71), k = at::random_matrix<double>(l, d, 72);
  const Matrix<double> v = at::random_matrix<double>(l, 4, 73);
  SoftmaxOptions o;
  o.causal = true;
  for (std::size_t i = 0; i < l; ++i) o.k_positions.push_back(static_cast<std::int64_t>(i / 3));
  for (std::size_t i = 0; i < l; ++i) o.q_positions.push_back(static_cast<std::int64_t>(i / 2));
  const auto want = at::naive_softmax(at::to_ld(q), at::to_ld(k), at::to_ld(v), freqs.inv_freq, Style::rotate_half,
                                      o.q_positions, o.k_positions, 1.0L / std::sqrt(at::LD(d)), true);
  for (const std::size_t block : {std::size_t{1}, std::size_t{6}, std::size_t{16}, std::size_t{256}}) {
    o.block = block;
    const Matrix<double> got = rope::attention::softmax(q, k, v, Rotation<double>{&table, Style::rotate_half}, o);
    EXPECT_LE(at::relative_error(got, want), 1e-12) << "block " << block;
  }
}

// Partial rotary: channels past rotary_dim take no rotation.
TEST(Softmax, PartialRotary) {
  const std::size_t l = 20, d = 24, r = 8;
  const auto freqs = rope::frequencies(16, 10000.0);  // table wider than what is used
  const rope::Table<double> table(freqs, 32);
  const Matrix<double> q = at::random_matrix<double>(l, d, 21), k = at::random_matrix<double>(l, d, 22);
  const Matrix<double> v = at::random_matrix<double>(l, 5, 23);
  SoftmaxOptions o;
  o.block = 6;
  const auto pos = at::iota_positions(l);
  // The first r/2 pairs of the table over r channels: the same thetas as
  // rope::frequencies(16) restricted to its first r/2 pairs.
  std::vector<double> used(freqs.inv_freq.begin(), freqs.inv_freq.begin() + r / 2);
  const auto want = at::naive_softmax(at::to_ld(q), at::to_ld(k), at::to_ld(v), used, Style::block_diagonal, pos,
                                      pos, 1.0L / std::sqrt(at::LD(d)), false);
  const Matrix<double> got = rope::attention::softmax(q, k, v, Rotation<double>{&table, Style::block_diagonal, r}, o);
  EXPECT_LE(at::relative_error(got, want), 1e-12);
}

// No table: plain softmax attention, and a column-major input is read as well.
TEST(Softmax, WithoutRopeAndColumnMajorInput) {
  const std::size_t l = 33, d = 8;
  const Matrix<double> q = at::random_matrix<double>(l, d, 31), k = at::random_matrix<double>(l, d, 32);
  const Matrix<double> v = at::random_matrix<double>(l, 3, 33);
  const Eigen::MatrixXd q_col = q;  // column-major
  const auto pos = at::iota_positions(l);
  const auto want = at::naive_softmax(at::to_ld(q), at::to_ld(k), at::to_ld(v), {}, Style::rotate_half, pos, pos,
                                      1.0L / std::sqrt(at::LD(d)), true);
  SoftmaxOptions o;
  o.causal = true;
  o.block = 10;
  EXPECT_LE(at::relative_error(rope::attention::softmax(q_col, k, v, {}, o), want), 1e-12);
}

// A query whose position precedes every key sees nothing: a zero row, not NaN.
TEST(Softmax, QueryWithNoVisibleKeyGivesZeros) {
  const Matrix<double> q = at::random_matrix<double>(3, 4, 41), k = at::random_matrix<double>(4, 4, 42);
  const Matrix<double> v = at::random_matrix<double>(4, 2, 43);
  SoftmaxOptions o;
  o.causal = true;
  o.q_positions = {0, 5, 1};
  o.k_positions = {2, 3, 4, 5};
  o.block = 2;
  const Matrix<double> got = rope::attention::softmax(q, k, v, {}, o);
  EXPECT_EQ(got(0, 0), 0.0);
  EXPECT_EQ(got(0, 1), 0.0);
  EXPECT_EQ(got(2, 0), 0.0);
  EXPECT_TRUE(std::isfinite(got(1, 0)));
}

// Grouped-query heads over rope::View: query head h reads key/value head
// h / (Hq / Hk); each head equals the one-head call on its own rows.
TEST(Softmax, GroupedQueryViews) {
  const std::size_t l = 19, hq = 6, hk = 2, d = 8, dv = 4;
  const rope::Table<float> table(rope::frequencies(d, 10000.0), 32);
  const Matrix<float> q = at::random_matrix<float>(l, hq * d, 51);  // [tokens, heads, d]
  const Matrix<float> k = at::random_matrix<float>(l, hk * d, 52);
  const Matrix<float> v = at::random_matrix<float>(l, hk * dv, 53);
  Matrix<float> out = Matrix<float>::Constant(static_cast<Eigen::Index>(l), static_cast<Eigen::Index>(hq * dv), -7.0f);
  SoftmaxOptions o;
  o.causal = true;
  o.block = 5;
  const Rotation<float> rope{&table, Style::rotate_half};
  rope::attention::softmax<float>(rope::View<const float>::token_major(q.data(), l, hq, d),
                                  rope::View<const float>::token_major(k.data(), l, hk, d),
                                  rope::View<const float>::token_major(v.data(), l, hk, dv),
                                  rope::View<float>::token_major(out.data(), l, hq, dv), rope, o);
  const auto cols = [](std::size_t h, std::size_t w) {
    return std::pair<Eigen::Index, Eigen::Index>(static_cast<Eigen::Index>(h * w), static_cast<Eigen::Index>(w));
  };
  for (std::size_t h = 0; h < hq; ++h) {
    const std::size_t kv = h / (hq / hk);
    const auto [q0, qn] = cols(h, d);
    const auto [k0, kn] = cols(kv, d);
    const auto [v0, vn] = cols(kv, dv);
    const auto [o0, on] = cols(h, dv);
    const Matrix<float> want =
        rope::attention::softmax(q.middleCols(q0, qn), k.middleCols(k0, kn), v.middleCols(v0, vn), rope, o);
    const Matrix<float> got = out.middleCols(o0, on);
    // The group's heads share one score tile (one GEMM), so the summation
    // order differs from the one-head call: equal up to float rounding.
    EXPECT_LE(at::relative_error(got, want), 1e-6) << "head " << h;
  }
}

TEST(Softmax, BadInputThrowsAndWritesNothing) {
  const rope::Table<double> table(rope::frequencies(8, 10000.0), 10);
  const Matrix<double> q = at::random_matrix<double>(4, 8, 61), k = at::random_matrix<double>(5, 8, 62);
  const Matrix<double> v = at::random_matrix<double>(5, 3, 63);
  const Rotation<double> rope{&table, Style::rotate_half};
  const auto message = [](auto&& call) { return rope_test::thrown_message(call); };
  using rope::attention::softmax;
  EXPECT_NE(message([&] { softmax(q, Matrix<double>(k.leftCols(6)), v, rope); }).find("k.cols() (the head dimension) must be q.cols() = 8, got 6"),
            std::string::npos);
  EXPECT_NE(message([&] { softmax(q, k, Matrix<double>(v.topRows(4)), rope); }).find("v.rows() must be k.rows() = 5, got 4"),
            std::string::npos);
  SoftmaxOptions o;
  o.block = 0;
  EXPECT_NE(message([&] { softmax(q, k, v, rope, o); }).find("options.block"), std::string::npos);
  o = {};
  o.scale = std::nan("");
  EXPECT_NE(message([&] { softmax(q, k, v, rope, o); }).find("options.scale"), std::string::npos);
  o = {};
  o.k_positions = {0, 1, 2};
  EXPECT_NE(message([&] { softmax(q, k, v, rope, o); }).find("options.k_positions.size() must be 0 or the number of rows 5, got 3"), std::string::npos);
  o = {};
  o.q_positions = {0, 1, 10, 2};
  EXPECT_NE(message([&] { softmax(q, k, v, rope, o); }).find("out_of_range: rope::attention::softmax: options.q_positions[2] must be in the table's positions [0, 10), got 10"),
            std::string::npos);
  EXPECT_NE(message([&] { softmax(q, k, v, Rotation<double>{&table, Style::rotate_half, 5}); }).find("rotation.rotary_dim must be even, got 5"),
            std::string::npos);

  // The View overload checks everything before writing.
  std::vector<double> qb(4 * 2 * 8, 0.5), kb(5 * 1 * 8, 0.25), vb(5 * 3, 1.0), ob(4 * 2 * 3, -3.0);
  const auto untouched = ob;
  SoftmaxOptions bad;
  bad.q_positions = {0, 1, 2, 99};
  EXPECT_NE(message([&] {
              softmax<double>(rope::View<const double>::token_major(qb.data(), 4, 2, 8),
                              rope::View<const double>::token_major(kb.data(), 5, 1, 8),
                              rope::View<const double>::token_major(vb.data(), 5, 1, 3),
                              rope::View<double>::token_major(ob.data(), 4, 2, 3), rope, bad);
            }).find("options.q_positions[3] must be in the table's positions [0, 10), got 99"),
            std::string::npos);
  EXPECT_EQ(ob, untouched);
  EXPECT_NE(message([&] {
              softmax<double>(rope::View<const double>::token_major(qb.data(), 4, 2, 8),
                              rope::View<const double>::token_major(kb.data(), 4, 1, 8),
                              rope::View<const double>::token_major(vb.data(), 5, 1, 3),
                              rope::View<double>::token_major(ob.data(), 4, 2, 3), rope);
            }).find("v.tokens must be k.tokens = 4, got 5"),
            std::string::npos);
  EXPECT_NE(message([&] {
              softmax<double>(rope::View<const double>::token_major(qb.data(), 4, 3, 8),
                              rope::View<const double>::token_major(kb.data(), 5, 2, 4),
                              rope::View<const double>::token_major(vb.data(), 5, 2, 1),
                              rope::View<double>::token_major(ob.data(), 4, 3, 1), rope);
            }).find("k.heads must be a divisor of q.heads = 3, got 2"),
            std::string::npos);
  EXPECT_EQ(ob, untouched);
}

}  // namespace
