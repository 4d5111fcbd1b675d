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

#include <algorithm>
#include <limits>
#include <numeric>
#include <optional>
#include <random>
#include <type_traits>
#include "attention_heads.hpp"
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
      o.mask.causal = causal;
      o.q_positions = at::random_positions(lq, 200, 4);
      o.k_positions = at::random_positions(lk, 200, 5);
      const auto want = at::naive_softmax(at::to_ld(q), at::to_ld(k), at::to_ld(v), freqs.inv_freq, style,
                                          o.q_positions, o.k_positions, 1.0L / std::sqrt(at::LD(d)), causal);
      for (const std::size_t block : {std::size_t{1}, std::size_t{3}, std::size_t{7}, std::size_t{16}, std::size_t{37},
                                      std::size_t{45}, std::size_t{128}}) {
        o.block = block;
        const Matrix<T> got = rope::attention::softmax(q, k, v, Rotation<T>{&table, style}, o);
        EXPECT_LE(at::relative_error(got, want), at::exact_tolerance<T>())
            << rope::name(style) << " causal " << causal << " block " << block;
      }
    }
  }
}

// A masked tile of more than 128 query rows is multiplied in pieces of whole
// tokens, each over the keys its tokens see (softmax_tile.hpp): causal and
// sliding-window prefills whose tiles hold 256 and 160 rows match the
// oracle. A value that is not finite reaches only the queries that see its
// key, and only its own channel, whether its tile is masked or not; a masked
// tile of finite values later in the same head still takes its GEMM.
TYPED_TEST(SoftmaxTyped, MaskedTilesOfManyRowsMatchTheOracle) {
  using T = TypeParam;
  const std::size_t l = 300, d = 8, dv = 4;
  const auto freqs = rope::frequencies(d, 10000.0);
  const rope::Table<T> table(freqs, l);
  const Rotation<T> rotation{&table, Style::rotate_half};
  const Matrix<T> q = at::random_matrix<T>(l, d, 131), k = at::random_matrix<T>(l, d, 132);
  Matrix<T> v = at::random_matrix<T>(l, dv, 133);
  const auto positions = at::iota_positions(l);
  const auto oracle = [&](std::size_t window) {
    return at::naive_softmax_masked(
        at::to_ld(q), at::to_ld(k), at::to_ld(v), freqs.inv_freq, Style::rotate_half, positions, positions,
        1.0L / std::sqrt(at::LD(d)),
        [&](std::size_t i, std::size_t j) { return j <= i && (window == 0 || i - j < window); });
  };
  SoftmaxOptions o;
  o.mask.causal = true;
  for (const std::size_t window : {std::size_t{0}, std::size_t{40}}) {
    o.mask.window = window;
    const auto want = oracle(window);
    for (const std::size_t block : {std::size_t{256}, std::size_t{160}}) {
      o.block = block;
      const Matrix<T> got = rope::attention::softmax(q, k, v, rotation, o);
      EXPECT_LE(at::relative_error(got, want), at::exact_tolerance<T>()) << "window " << window << " block " << block;
    }
  }
  constexpr std::size_t bad = 150, channel = 1;
  v(bad, channel) = std::numeric_limits<T>::quiet_NaN();
  o.mask.window = 0;
  const auto want = oracle(0);
  for (const std::size_t block : {std::size_t{256}, std::size_t{160}}) {
    o.block = block;
    const Matrix<T> got = rope::attention::softmax(q, k, v, rotation, o);
    for (std::size_t i = 0; i < l; ++i) {
      for (std::size_t c = 0; c < dv; ++c) {
        const T x = got(static_cast<Eigen::Index>(i), static_cast<Eigen::Index>(c));
        if (i >= bad && c == channel) {
          EXPECT_TRUE(std::isnan(x)) << "block " << block << " row " << i;
        } else {
          EXPECT_LE(std::fabs(static_cast<at::LD>(x) - want[i][c]), at::exact_tolerance<T>())
              << "block " << block << " row " << i << " channel " << c;
        }
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
  o.mask.causal = true;
  o.logits.scale = 0.3;
  o.block = 16;
  const auto pos = at::iota_positions(l);
  const auto want = at::naive_softmax(at::to_ld(q), at::to_ld(k), at::to_ld(v), freqs.inv_freq, Style::rotate_half, pos,
                                      pos, 0.3L, true);
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
  o.mask.causal = true;
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
  o.mask.causal = false;
  o.block = 6;
  const auto pos = at::iota_positions(l);
  // The first r/2 pairs of the table over r channels: the same thetas as
  // rope::frequencies(16) restricted to its first r/2 pairs.
  std::vector<double> used(freqs.inv_freq.begin(), freqs.inv_freq.begin() + r / 2);
  const auto want = at::naive_softmax(at::to_ld(q), at::to_ld(k), at::to_ld(v), used, Style::block_diagonal, pos, pos,
                                      1.0L / std::sqrt(at::LD(d)), false);
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
  o.mask.causal = true;
  o.block = 10;
  EXPECT_LE(at::relative_error(rope::attention::softmax(q_col, k, v, {}, o), want), 1e-12);
}

// A query whose position precedes every key sees nothing: a zero row, not NaN.
TEST(Softmax, QueryWithNoVisibleKeyGivesZeros) {
  const Matrix<double> q = at::random_matrix<double>(3, 4, 41), k = at::random_matrix<double>(4, 4, 42);
  const Matrix<double> v = at::random_matrix<double>(4, 2, 43);
  SoftmaxOptions o;
  o.mask.causal = true;
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
  o.mask.causal = true;
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
  EXPECT_NE(message([&] {
              softmax(q, Matrix<double>(k.leftCols(6)), v, rope);
            }).find("k.cols() (the head dimension) must be q.cols() = 8, got 6"),
            std::string::npos);
  EXPECT_NE(
      message([&] { softmax(q, k, Matrix<double>(v.topRows(4)), rope); }).find("v.rows() must be k.rows() = 5, got 4"),
      std::string::npos);
  SoftmaxOptions o;
  o.mask.causal = false;
  o.block = 0;
  EXPECT_NE(message([&] { softmax(q, k, v, rope, o); }).find("options.block"), std::string::npos);
  o = {};
  o.logits.scale = std::nan("");
  EXPECT_NE(message([&] { softmax(q, k, v, rope, o); }).find("options.logits.scale"), std::string::npos);
  o = {};
  o.k_positions = {0, 1, 2};
  EXPECT_NE(message([&] {
              softmax(q, k, v, rope, o);
            }).find("options.k_positions.size() must be 0 or the number of rows 5, got 3"),
            std::string::npos);
  o = {};
  o.q_positions = {0, 1, 10, 2};
  EXPECT_NE(message([&] { softmax(q, k, v, rope, o); })
                .find("out_of_range: rope::attention::softmax: options.q_positions[2] must be in the table's positions "
                      "[0, 10), got 10"),
            std::string::npos);
  EXPECT_NE(message([&] {
              softmax(q, k, v, Rotation<double>{&table, Style::rotate_half, 5});
            }).find("rotation.rotary_dim must be even, got 5"),
            std::string::npos);

  // The View overload checks everything before writing.
  std::vector<double> qb(4 * 2 * 8, 0.5), kb(5 * 1 * 8, 0.25), vb(5 * 3, 1.0), ob(4 * 2 * 3, -3.0);
  const auto untouched = ob;
  SoftmaxOptions bad;
  bad.mask.causal = false;
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

// ---- masks by position, decoding against a cache of rotated keys
namespace {
namespace decode {

namespace at = attention_test;
namespace ra = rope::attention;
using at::Heads;
using ra::Matrix;
using ra::Rotation;
using rope::Style;
using rope::View;

template <class T>
class SoftmaxDecode : public ::testing::Test {};
using Scalars = ::testing::Types<float, double>;
TYPED_TEST_SUITE(SoftmaxDecode, Scalars, rope_test::ScalarNames);

template <class T>
double tolerance() {
  return at::exact_tolerance<T>();
}

// max |got - want| / max |want| over one head of an output tensor.
template <class T>
double head_error(const Heads<T>& out, std::size_t h, const at::Mat& want) {
  return at::relative_error(out.head(h), want);
}

// The long-double oracle of query head h of a grouped-query call (its key
// and value head h / group), causal by the given positions, scale 1/sqrt(d).
template <class T>
at::Mat oracle_head(const Heads<T>& q, const Heads<T>& k, const Heads<T>& v, std::size_t h, std::size_t group,
                    const rope::Frequencies& freqs, Style style, const std::vector<std::int64_t>& pq,
                    const std::vector<std::int64_t>& pk) {
  const at::LD scale = 1.0L / std::sqrt(static_cast<at::LD>(q.dim));
  return at::naive_softmax(q.head_ld(h), k.head_ld(h / group), v.head_ld(h / group), freqs.inv_freq, style, pq, pk,
                           scale, true);
}

// Sliding windows and packed sequences, causal or not, keys sorted (tiles cut
// at each query's range) or shuffled (entry by entry), every block size,
// grouped-query views: each head equals the naive softmax with the mask.
TYPED_TEST(SoftmaxDecode, SoftmaxMasksMatchNaive) {
  using T = TypeParam;
  const std::size_t l = 37, hq = 4, hk = 2, d = 16, dv = 8, group = hq / hk;
  const auto freqs = rope::frequencies(d, 10000.0);
  const rope::Table<T> table(freqs, 64);
  const Heads<T> q(l, hq, d, 1), k(l, hk, d, 2), v(l, hk, dv, 3);
  // Two packed sequences of 15 and 22 tokens, each from position 0.
  std::vector<std::int64_t> pos(l), seq(l);
  for (std::size_t t = 0; t < l; ++t) {
    seq[t] = t < 15 ? 0 : 1;
    pos[t] = static_cast<std::int64_t>(t < 15 ? t : t - 15);
  }
  std::vector<std::size_t> order(l);
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::mt19937 gen(4);
  for (const bool shuffled : {false, true}) {
    if (shuffled) std::shuffle(order.begin(), order.end(), gen);
    // Token t of the call is token order[t] of the packed batch.
    Heads<T> qs = q, ks = k, vs = v;
    std::vector<std::int64_t> ps(l), ss(l);
    for (std::size_t t = 0; t < l; ++t) {
      std::copy_n(&q.data[order[t] * hq * d], hq * d, &qs.data[t * hq * d]);
      std::copy_n(&k.data[order[t] * hk * d], hk * d, &ks.data[t * hk * d]);
      std::copy_n(&v.data[order[t] * hk * dv], hk * dv, &vs.data[t * hk * dv]);
      ps[t] = pos[order[t]];
      ss[t] = seq[order[t]];
    }
    for (const bool causal : {false, true}) {
      for (const std::size_t window : {std::size_t{0}, std::size_t{1}, std::size_t{5}}) {
        ra::SoftmaxOptions o;
        o.mask.causal = causal;
        o.mask.window = window;
        o.q_positions = o.k_positions = ps;
        o.q_sequence = o.k_sequence = ss;
        const auto visible = [&](std::size_t i, std::size_t j) {
          if (ss[i] != ss[j]) return false;
          if (causal && ps[j] > ps[i]) return false;
          return window == 0 || ps[j] > ps[i] - static_cast<std::int64_t>(window);
        };
        for (const std::size_t block :
             {std::size_t{1}, std::size_t{3}, std::size_t{8}, std::size_t{37}, std::size_t{256}}) {
          o.block = block;
          Heads<T> out = Heads<T>::filled(l, hq, dv, T(-7));
          ra::softmax<T>(qs.view(), ks.view(), vs.view(), out.view(), Rotation<T>{&table, Style::block_diagonal}, o);
          for (std::size_t h = 0; h < hq; ++h) {
            const auto want =
                at::naive_softmax_masked(qs.head_ld(h), ks.head_ld(h / group), vs.head_ld(h / group), freqs.inv_freq,
                                         Style::block_diagonal, ps, ps, 1.0L / std::sqrt(at::LD(d)), visible);
            EXPECT_LE(head_error(out, h, want), tolerance<T>())
                << "shuffled " << shuffled << " causal " << causal << " window " << window << " block " << block
                << " head " << h;
          }
        }
      }
    }
  }
}

// Decoding: the cache holds keys rotated once (rope::apply); one query at
// position t against the cache's first t + 1 keys, or against all of it with
// the causal mask, equals row t of the full causal prefill.
TYPED_TEST(SoftmaxDecode, DecodeAgainstRotatedCacheEqualsPrefillRows) {
  using T = TypeParam;
  const std::size_t l = 29, hq = 6, hk = 2, d = 16, dv = 8;
  const rope::Table<T> table(rope::frequencies(d, 10000.0), 64);
  const Heads<T> q(l, hq, d, 11), k(l, hk, d, 12), v(l, hk, dv, 13);
  for (const Style style : {Style::rotate_half, Style::block_diagonal}) {
    const Rotation<T> rotation{&table, style};
    ra::SoftmaxOptions o;
    o.mask.causal = true;
    o.block = 8;
    std::vector<at::Mat> want(hq);
    for (std::size_t h = 0; h < hq; ++h) {
      want[h] = oracle_head(q, k, v, h, hq / hk, rope::frequencies(d, 10000.0), style, at::iota_positions(l),
                            at::iota_positions(l));
    }
    Heads<T> cache(l, hk, d, 0);
    rope::apply<T>(k.view(), cache.view(), table, style, 0);
    for (std::size_t t = 0; t < l; ++t) {
      ra::SoftmaxOptions step;
      step.mask.causal = true;
      step.keys_rotated = true;
      step.q_offset = static_cast<std::int64_t>(t);
      const auto q_t = q.view().slice_tokens(t, 1);
      for (const bool whole_cache : {false, true}) {
        const std::size_t visible = whole_cache ? l : t + 1;
        Heads<T> out(1, hq, dv, 0);
        ra::softmax<T>(q_t, View<const T>(cache.view()).slice_tokens(0, visible), v.view().slice_tokens(0, visible),
                       out.view(), rotation, step);
        for (std::size_t h = 0; h < hq; ++h) {
          EXPECT_LE(head_error(out, h, at::Mat{want[h][t]}), tolerance<T>())
              << rope::name(style) << " token " << t << " head " << h << " whole cache " << whole_cache;
        }
      }
    }
  }
}

// K given already rotated equals K rotated inside.
TYPED_TEST(SoftmaxDecode, KeysRotatedEqualsRotatingInside) {
  using T = TypeParam;
  const std::size_t l = 20, hq = 4, hk = 2, d = 8, dv = 8;
  const rope::Table<T> table(rope::frequencies(d, 10000.0), 32);
  const Heads<T> q(l, hq, d, 31), k(l, hk, d, 32), v(l, hk, dv, 33);
  Heads<T> rotated(l, hk, d, 0);
  rope::apply<T>(k.view(), rotated.view(), table, Style::rotate_half, 0);
  ra::SoftmaxOptions o;
  o.mask.causal = true;
  Heads<T> a(l, hq, dv, 0), b(l, hq, dv, 0);
  ra::softmax<T>(q.view(), k.view(), v.view(), a.view(), {&table, Style::rotate_half}, o);
  o.keys_rotated = true;
  ra::softmax<T>(q.view(), rotated.view(), v.view(), b.view(), {&table, Style::rotate_half}, o);
  for (std::size_t h = 0; h < hq; ++h) EXPECT_LE(at::relative_error(b.head(h), a.head(h)), tolerance<T>());
}

}  // namespace decode
}  // namespace

// ---- views that must be refused, blocks past any matrix
namespace {
namespace edges {

namespace at = attention_test;
namespace ra = rope::attention;
using at::Heads;
using ra::Matrix;
using ra::Rotation;
using rope::Style;

// The multi-head softmax refuses an output that shares memory with an input
// or whose heads collapse onto one row, and writes nothing.
TEST(SoftmaxEdges, SoftmaxViewsRefuseOverlappingOutputs) {
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
TEST(SoftmaxEdges, HugeBlocksAndChunksAreOneBlock) {
  const std::size_t l = 12, d = 4, dv = 2;
  const Matrix<double> q = at::random_matrix<double>(l, d, 22), k = at::random_matrix<double>(l, d, 23);
  const Matrix<double> v = at::random_matrix<double>(l, dv, 24);
  for (const std::size_t huge : {std::size_t{1} << 63, std::numeric_limits<std::size_t>::max()}) {
    ra::SoftmaxOptions so, so_l;
    so.mask.causal = so_l.mask.causal = true;
    so.block = huge;
    so_l.block = l;
    EXPECT_LE(at::relative_error(ra::softmax(q, k, v, {}, so), ra::softmax(q, k, v, {}, so_l)), 1e-15);
    ra::LinearOptions lo, lo_l;
    lo.mask.causal = lo_l.mask.causal = true;
    lo.chunk = huge;
    lo_l.chunk = l;
    const Matrix<double> fq = ra::elu_plus_one(q), fk = ra::elu_plus_one(k);
    EXPECT_LE(at::relative_error(ra::linear(fq, fk, v, lo), ra::linear(fq, fk, v, lo_l)), 1e-15);
  }
  // A feature count is not a feature map: no implicit conversion.
  static_assert(!std::is_convertible<std::size_t, ra::FavorFeatures>::value, "FavorFeatures(size_t) is explicit");
}

}  // namespace edges
}  // namespace

// ---- logit softcap and attention sinks: s = scale q.k, then the cap, then
// the mask, then the sink in the denominator (options.hpp)
namespace {
namespace logits {

namespace at = attention_test;
namespace ra = rope::attention;
using at::Heads;
using ra::Matrix;
using ra::Rotation;
using rope::Style;

template <class T>
class SoftmaxLogits : public ::testing::Test {};
using Scalars = ::testing::Types<float, double>;
TYPED_TEST_SUITE(SoftmaxLogits, Scalars, rope_test::ScalarNames);

constexpr at::LD kNoSink = -std::numeric_limits<at::LD>::infinity();
const std::size_t kBlocks[] = {1, 3, 7, 8, 16, 37, 45, 128};

// One-head matrices, causal with a sliding window, random positions: every
// block size (1 .. 7 rows per tile take the thin decode path, more the GEMM
// path) matches the oracle for a softcap, a sink, both, and a -inf sink.
// Scores of std ~3 against a cap of 2: the cap changes most weights.
TYPED_TEST(SoftmaxLogits, OneHeadMatchesOracleForEveryBlock) {
  using T = TypeParam;
  const std::size_t lq = 37, lk = 45, d = 16, dv = 12;
  const auto freqs = rope::frequencies(d, 10000.0);
  const rope::Table<T> table(freqs, 200);
  const Matrix<T> q = at::random_matrix<T>(lq, d, 71, 3.0), k = at::random_matrix<T>(lk, d, 72);
  const Matrix<T> v = at::random_matrix<T>(lk, dv, 73);
  struct Case {
    std::optional<double> softcap;
    std::vector<double> sinks;
  };
  const Case cases[] = {{2.0, {}}, {{}, {1.5}}, {2.0, {0.5}}, {30.0, {-3.0}}, {2.0, {-HUGE_VAL}}};
  for (const Case& c : cases) {
    ra::SoftmaxOptions o;
    o.mask.causal = true;
    o.mask.window = 60;
    o.q_positions = at::random_positions(lq, 200, 74);
    o.k_positions = at::random_positions(lk, 200, 75);
    o.logits.softcap = c.softcap;
    o.logits.sinks = c.sinks;
    const at::Logits logits{c.softcap ? at::LD(*c.softcap) : 0, c.sinks.empty() ? kNoSink : at::LD(c.sinks[0])};
    const auto visible = [&](std::size_t i, std::size_t j) {
      const std::int64_t pq = o.q_positions[i], pk = o.k_positions[j];
      return pk <= pq && pk > pq - 60;
    };
    const auto want =
        at::naive_softmax_masked(at::to_ld(q), at::to_ld(k), at::to_ld(v), freqs.inv_freq, Style::rotate_half,
                                 o.q_positions, o.k_positions, 1.0L / std::sqrt(at::LD(d)), visible, logits);
    for (const std::size_t block : kBlocks) {
      o.block = block;
      const Matrix<T> got = ra::softmax(q, k, v, Rotation<T>{&table, Style::rotate_half}, o);
      EXPECT_LE(at::relative_error(got, want), at::exact_tolerance<T>())
          << "softcap " << c.softcap.value_or(0) << " sinks " << c.sinks.size() << " block " << block;
    }
  }
}

// Grouped-query views, two packed sequences, causal with a window: one sink
// per query head (one of them -inf), a softcap; prefill (every query token)
// and decode (the last 1 or 3 tokens: the thin path), every block size.
TYPED_TEST(SoftmaxLogits, GroupedViewsWithSequencesMatchOracle) {
  using T = TypeParam;
  const std::size_t l = 29, hq = 6, hk = 2, d = 16, dv = 8, group = hq / hk;
  const auto freqs = rope::frequencies(d, 10000.0);
  const rope::Table<T> table(freqs, 64);
  const Heads<T> q(l, hq, d, 81, 3.0), k(l, hk, d, 82), v(l, hk, dv, 83);
  std::vector<std::int64_t> pos(l), seq(l);
  for (std::size_t t = 0; t < l; ++t) {
    seq[t] = t < 11 ? 0 : 1;
    pos[t] = static_cast<std::int64_t>(t < 11 ? t : t - 11);
  }
  ra::SoftmaxOptions o;
  o.mask.causal = true;
  o.mask.window = 7;
  o.k_positions = pos;
  o.k_sequence = seq;
  o.logits.softcap = 2.5;
  o.logits.sinks = {0.5, -1.0, 2.0, -HUGE_VAL, 0.0, 1.0};
  for (const std::size_t tokens : {l, std::size_t{3}, std::size_t{1}}) {
    const std::size_t t0 = l - tokens;
    o.q_positions.assign(pos.begin() + static_cast<std::ptrdiff_t>(t0), pos.end());
    o.q_sequence.assign(seq.begin() + static_cast<std::ptrdiff_t>(t0), seq.end());
    const auto visible = [&](std::size_t i, std::size_t j) {
      const std::size_t t = t0 + i;
      return seq[t] == seq[j] && pos[j] <= pos[t] && pos[j] > pos[t] - 7;
    };
    Heads<T> qs(tokens, hq, d, 0);
    std::copy(q.data.begin() + static_cast<std::ptrdiff_t>(t0 * hq * d), q.data.end(), qs.data.begin());
    for (const std::size_t block : kBlocks) {
      o.block = block;
      Heads<T> out = Heads<T>::filled(tokens, hq, dv, T(-7));
      ra::softmax<T>(qs.view(), k.view(), v.view(), out.view(), Rotation<T>{&table, Style::block_diagonal}, o);
      for (std::size_t h = 0; h < hq; ++h) {
        const at::Logits logits{2.5L, at::LD(o.logits.sinks[h])};
        const auto want = at::naive_softmax_masked(qs.head_ld(h), k.head_ld(h / group), v.head_ld(h / group),
                                                   freqs.inv_freq, Style::block_diagonal, o.q_positions, pos,
                                                   1.0L / std::sqrt(at::LD(d)), visible, logits);
        EXPECT_LE(at::relative_error(out.head(h), want), at::exact_tolerance<T>())
            << "tokens " << tokens << " block " << block << " head " << h;
      }
    }
  }
}

// A query that sees no key gets zeros with a sink too (its numerator is
// empty), in both paths; the others match the oracle.
TEST(SoftmaxLogits, QueryThatSeesNothingWithSinkGivesZeros) {
  const std::size_t lq = 12, lk = 10, d = 8, dv = 3;
  const Matrix<double> q = at::random_matrix<double>(lq, d, 101), k = at::random_matrix<double>(lk, d, 102);
  const Matrix<double> v = at::random_matrix<double>(lk, dv, 103);
  ra::SoftmaxOptions o;
  o.mask.causal = true;
  o.q_offset = -2;  // queries 0 and 1 sit before every key
  o.logits.sinks = {0.75};
  o.logits.softcap = 4.0;
  const auto want = at::naive_softmax_masked(
      at::to_ld(q), at::to_ld(k), at::to_ld(v), {}, Style::rotate_half, {}, {}, 1.0L / std::sqrt(at::LD(d)),
      [](std::size_t i, std::size_t j) { return j + 2 <= i; }, at::Logits{4.0L, 0.75L});
  for (const std::size_t block : {std::size_t{1}, std::size_t{4}, std::size_t{64}}) {
    o.block = block;
    const Matrix<double> got = ra::softmax(q, k, v, {}, o);
    EXPECT_TRUE((got.topRows(2).array() == 0).all()) << "block " << block;
    EXPECT_LE(at::relative_error(got, want), at::exact_tolerance<double>()) << "block " << block;
  }
  // No key at all: zeros.
  const Matrix<double> none = ra::softmax(q, Matrix<double>(0, d), Matrix<double>(0, dv), {}, o);
  EXPECT_TRUE((none.array() == 0).all());
}

// The cap comes before the mask: a masked key with a huge score contributes
// nothing. Capped after the mask, its -inf would become -cap, and with a cap
// of 1 against scores in [-1, 1] it would carry a weight like any other key's
// (the test checks that this wrong order differs observably).
TEST(SoftmaxLogits, SoftcapComesBeforeTheMask) {
  const std::size_t l = 9, d = 4, dv = 2;
  Matrix<double> q = at::random_matrix<double>(l, d, 111), k = at::random_matrix<double>(l, d, 112);
  const Matrix<double> v = at::random_matrix<double>(l, dv, 113);
  k.row(l - 1) = 1e6 * q.row(0);  // the last key: huge scores, seen by the last query only
  ra::SoftmaxOptions o;
  o.mask.causal = true;
  o.logits.softcap = 1.0;
  const auto causal = [](std::size_t i, std::size_t j) { return j <= i; };
  const at::LD scale = 0.5L;
  const auto want = at::naive_softmax_masked(at::to_ld(q), at::to_ld(k), at::to_ld(v), {}, Style::rotate_half, {}, {},
                                             scale, causal, at::Logits{1.0L, kNoSink});
  // Mask then cap: every key visible, a masked one's score -1.
  at::Mat wrong = want;
  {
    const auto qs = at::to_ld(q), ks = at::to_ld(k), vs = at::to_ld(v);
    for (std::size_t i = 0; i < l; ++i) {
      at::LD sum = 0;
      std::vector<at::LD> acc(dv, 0);
      for (std::size_t j = 0; j < l; ++j) {
        const at::LD s = j <= i ? std::tanh(at::dot(qs[i], ks[j]) * scale) : std::tanh(kNoSink);
        const at::LD w = std::exp(s);
        sum += w;
        for (std::size_t c = 0; c < dv; ++c) acc[c] += w * vs[j][c];
      }
      for (std::size_t c = 0; c < dv; ++c) wrong[i][c] = acc[c] / sum;
    }
  }
  EXPECT_GT(at::relative_error(rope::attention::Matrix<double>(ra::softmax(q, k, v, {}, o)), wrong), 0.01);
  for (const std::size_t block : {std::size_t{1}, std::size_t{3}, std::size_t{16}}) {
    o.block = block;
    o.logits.scale = 0.5;
    EXPECT_LE(at::relative_error(ra::softmax(q, k, v, {}, o), want), at::exact_tolerance<double>()) << block;
  }
}

// NaN confined with a softcap on (tanh(NaN) is NaN): a NaN key only the last
// query sees leaves every other row finite and equal to the oracle's.
TEST(SoftmaxLogits, NanKeyReachesOnlyTheQueriesThatSeeIt) {
  const std::size_t l = 20, d = 8, dv = 4;
  Matrix<float> q = at::random_matrix<float>(l, d, 121), k = at::random_matrix<float>(l, d, 122);
  const Matrix<float> v = at::random_matrix<float>(l, dv, 123);
  k(l - 1, 2) = std::numeric_limits<float>::quiet_NaN();
  ra::SoftmaxOptions o;
  o.mask.causal = true;
  o.logits.softcap = 3.0;
  o.logits.sinks = {0.5};
  const auto want = at::naive_softmax_masked(
      at::to_ld(q), at::to_ld(k), at::to_ld(v), {}, Style::rotate_half, {}, {}, 1.0L / std::sqrt(at::LD(d)),
      [](std::size_t i, std::size_t j) { return j <= i && j + 1 < 20; }, at::Logits{3.0L, 0.5L});
  for (const std::size_t block : {std::size_t{1}, std::size_t{5}, std::size_t{64}}) {
    o.block = block;
    const Matrix<float> got = ra::softmax(q, k, v, {}, o);
    EXPECT_TRUE(got.row(l - 1).array().isNaN().all()) << block;
    EXPECT_TRUE(got.topRows(l - 1).allFinite()) << block;
    EXPECT_LE(at::relative_error(Matrix<float>(got.topRows(l - 1)), at::Mat(want.begin(), want.end() - 1)),
              at::exact_tolerance<float>())
        << block;
  }
}

// Bad softcaps and sinks are refused by name, before anything is written,
// from every overload.
TEST(SoftmaxLogits, BadSoftcapOrSinksAreRefusedAndWriteNothing) {
  const std::size_t l = 4, hq = 2, d = 8, dv = 3;
  const Matrix<double> q = at::random_matrix<double>(l, d, 131), k = at::random_matrix<double>(l, d, 132);
  const Matrix<double> v = at::random_matrix<double>(l, dv, 133);
  const std::string fn = "rope::attention::softmax: ";
  const auto matrix = [&](const ra::SoftmaxOptions& o) {
    return rope_test::thrown_message([&] { ra::softmax(q, k, v, {}, o); });
  };
  ra::SoftmaxOptions o;
  o.mask.causal = false;
  for (const double bad : {0.0, -1.0, HUGE_VAL, std::nan("")}) {
    o.logits.softcap = bad;
    EXPECT_EQ(matrix(o), fn + "options.logits.softcap must be finite and > 0, got " + rope::detail::to_text(bad));
  }
  o = {};
  o.logits.sinks = {0.0, 1.0};
  EXPECT_EQ(matrix(o), fn + "options.logits.sinks.size() must be 0 or the query heads 1, got 2");
  o.logits.sinks = {std::nan("")};
  EXPECT_EQ(matrix(o), fn + "options.logits.sinks[0] must be finite or -inf, got nan");
  o.logits.sinks = {HUGE_VAL};
  EXPECT_EQ(matrix(o), fn + "options.logits.sinks[0] must be finite or -inf, got inf");
  // A sink beyond float's range rounds to +inf in float: refused there.
  o.logits.sinks = {1e300};
  const Matrix<float> qf = q.cast<float>(), kf = k.cast<float>(), vf = v.cast<float>();
  EXPECT_EQ(rope_test::thrown_message([&] { ra::softmax(qf, kf, vf, {}, o); }),
            fn + "options.logits.sinks[0] must be finite or -inf, got 1e+300");
  EXPECT_EQ(matrix(o), "no exception");

  Heads<double> qh(l, hq, d, 134), kh(l, 1, d, 135), vh(l, 1, dv, 136);
  Heads<double> out = Heads<double>::filled(l, hq, dv, -5.0);
  const auto before = out.data;
  o = {};
  o.logits.sinks = {0.0};
  const auto views = [&] {
    return rope_test::thrown_message([&] { ra::softmax<double>(qh.view(), kh.view(), vh.view(), out.view(), {}, o); });
  };
  EXPECT_EQ(views(), fn + "options.logits.sinks.size() must be 0 or the query heads 2, got 1");
  o.logits.sinks = {0.0, std::nan("")};
  EXPECT_EQ(views(), fn + "options.logits.sinks[1] must be finite or -inf, got nan");
  EXPECT_TRUE(at::same_bytes(before, out.data));
}

}  // namespace logits
}  // namespace
