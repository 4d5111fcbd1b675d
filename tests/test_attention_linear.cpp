// Linear attention against its quadratic forms in long double (E1, E2, E3),
// eq. 19 position identities (E4), the E6 golden values, offset invariance
// (E7), positivity (E8), causal prefix invariance (E9), chunk sizes and the
// recurrent step API agreeing with the batch result, and the error paths.
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
#include <random>
#include <type_traits>
#include "attention_heads.hpp"
#include "attention_oracle.hpp"
#include "support.hpp"

namespace {

namespace at = attention_test;
using rope::Style;
using rope::attention::FavorFeatures;
using rope::attention::FavorOptions;
using rope::attention::LinearOptions;
using rope::attention::LinearState;
using rope::attention::Matrix;
using rope::attention::Rotation;
using rope::attention::Vector;

constexpr Style kStyles[] = {Style::rotate_half, Style::block_diagonal};

template <class T>
class LinearTyped : public ::testing::Test {};
using Scalars = ::testing::Types<float, double>;
TYPED_TEST_SUITE(LinearTyped, Scalars, rope_test::ScalarNames);

// Positive features with a spread of magnitudes: elu+1 of Gaussian inputs.
template <class T>
Matrix<T> positive_features(std::size_t rows, std::size_t m, std::uint32_t seed) {
  return rope::attention::elu_plus_one(at::random_matrix<T>(rows, m, seed));
}

const std::size_t kChunks[] = {1, 3, 7, 16, 40, 41, 100};

// E1 and E2: non-causal and causal linear attention equal
// A V / rowsum(A) with A = Phi_Q Phi_K^T (tril'd when causal), for every chunk.
TYPED_TEST(LinearTyped, EqualsQuadraticFormForEveryChunk) {
  using T = TypeParam;
  const std::size_t l = 41, m = 12, dv = 5;
  const Matrix<T> fq = positive_features<T>(l, m, 1), fk = positive_features<T>(l, m, 2);
  const Matrix<T> v = at::random_matrix<T>(l, dv, 3);
  const auto q = at::to_ld(fq), k = at::to_ld(fk);
  for (const bool causal : {false, true}) {
    const auto want = at::quadratic(q, q, k, k, at::to_ld(v), causal);
    for (const std::size_t chunk : kChunks) {
      LinearOptions o;
      o.mask.causal = causal;
      o.chunk = chunk;
      EXPECT_LE(at::relative_error(rope::attention::linear(fq, fk, v, o), want), at::exact_tolerance<T>())
          << "causal " << causal << " chunk " << chunk;
    }
  }
  // Non-causal with more keys than queries.
  const Matrix<T> fk2 = positive_features<T>(60, m, 4);
  const Matrix<T> v2 = at::random_matrix<T>(60, dv, 5);
  const auto want2 = at::quadratic(q, q, at::to_ld(fk2), at::to_ld(fk2), at::to_ld(v2), false);
  LinearOptions all_keys;
  all_keys.mask.causal = false;
  EXPECT_LE(at::relative_error(rope::attention::linear(fq, fk2, v2, all_keys), want2), at::exact_tolerance<T>());
}

// E2 for FAVOR+ causal keys: the running prefix max and eps = 0 for keys give
// the quadratic form of the unoffset features m^(-1/2) exp(u - h); the
// queries carry eps.
TYPED_TEST(LinearTyped, FavorCausalEqualsQuadraticForm) {
  using T = TypeParam;
  const std::size_t l = 45, d = 8, dv = 4;
  FavorOptions fo;
  fo.features = 32;
  fo.seed = 7;
  const FavorFeatures phi(d, fo);
  // Growing key norms make the prefix max grow along the sequence.
  Matrix<T> k = at::random_matrix<T>(l, d, 8);
  for (Eigen::Index j = 0; j < k.rows(); ++j) k.row(j) *= T(0.5 + 0.05 * double(j));
  const Matrix<T> q = at::random_matrix<T>(l, d, 9), v = at::random_matrix<T>(l, dv, 10);
  const Matrix<T> fq = phi.queries(q);
  const auto lk = phi.log_features(k);
  at::Mat kf(l, std::vector<at::LD>(fo.features));
  for (std::size_t j = 0; j < l; ++j) {
    for (std::size_t r = 0; r < fo.features; ++r) {
      kf[j][r] =
          std::exp(static_cast<at::LD>(lk.exponent(Eigen::Index(j), Eigen::Index(r)))) / std::sqrt(at::LD(fo.features));
    }
  }
  const auto qf = at::to_ld(fq);
  const auto vf = at::to_ld(v);
  // The offsets scale numerator and denominator alike; the oracle has none,
  // so compare with delta = 0 (no guard) on both sides.
  const auto want = at::quadratic(qf, qf, kf, kf, vf, true, 0.0L);
  for (const std::size_t chunk : kChunks) {
    LinearOptions o;
    o.mask.causal = true;
    o.chunk = chunk;
    o.delta = 0;
    EXPECT_LE(at::relative_error(rope::attention::linear(q, k, v, phi, o), want), at::exact_tolerance<T>())
        << "chunk " << chunk;
  }
}

// The recurrent step API equals the batch result: plain features, FAVOR+
// keys with their log scale, and eq. 19 with rotated numerator features.
TYPED_TEST(LinearTyped, RecurrentStepsEqualBatch) {
  using T = TypeParam;
  const std::size_t l = 30, d = 8, m = 16, dv = 3;
  const Matrix<T> fq = positive_features<T>(l, m, 21), fk = positive_features<T>(l, m, 22);
  const Matrix<T> v = at::random_matrix<T>(l, dv, 23);
  LinearOptions o;
  o.mask.causal = true;
  o.chunk = 7;
  const Matrix<T> batch = rope::attention::linear(fq, fk, v, o);
  LinearState<T> state(m, dv);
  for (std::size_t i = 0; i < l; ++i) {
    const auto row = Eigen::Index(i);
    const Vector<T> out = state.step(fq.row(row), fk.row(row), v.row(row));
    EXPECT_LE(at::relative_error(out.transpose(), batch.row(row)), at::exact_tolerance<T>()) << "token " << i;
  }

  // FAVOR+ keys: push their scaled features with their log scale.
  FavorOptions fo;
  fo.features = m;
  const FavorFeatures phi(d, fo);
  Matrix<T> q = at::random_matrix<T>(l, d, 24), k = at::random_matrix<T>(l, d, 25);
  for (Eigen::Index j = 0; j < k.rows(); ++j) k.row(j) *= T(1 + 0.1 * double(j % 9));
  const Matrix<T> favor_batch = rope::attention::linear(q, k, v, phi, o);
  const Matrix<T> pq = phi.queries(q);
  const auto sk = phi.scaled_keys(k);
  LinearState<T> favor_state(m, dv);
  for (std::size_t i = 0; i < l; ++i) {
    const auto row = Eigen::Index(i);
    favor_state.push(sk.features.row(row), sk.features.row(row), v.row(row), sk.log_scale[row]);
    const Vector<T> out = favor_state.read(pq.row(row));
    EXPECT_LE(at::relative_error(out.transpose(), favor_batch.row(row)), at::exact_tolerance<T>()) << "favor " << i;
  }

  // Eq. 19: numerator features rotated at the token's position.
  const rope::Table<T> table(rope::frequencies(m, 10000.0), 64);
  const Rotation<T> rope{&table, Style::rotate_half};
  // Increasing positions: the causal mask by position is then the order of
  // the rows, as the recurrent steps take them.
  o.q_positions = at::increasing_positions(l, 64, 26);
  o.k_positions = o.q_positions;
  const Matrix<T> eq19_batch = rope::attention::linear_eq19(fq, fk, v, rope, o);
  LinearState<T> eq19_state(m, dv);
  for (std::size_t i = 0; i < l; ++i) {
    const auto row = Eigen::Index(i);
    const auto p = static_cast<std::size_t>(o.q_positions[i]);
    Vector<T> qn = fq.row(row).transpose(), kn = fk.row(row).transpose();
    rope::rotate<Style::rotate_half, T>(qn.data(), qn.data(), table.cos(p), table.sin(p), m);
    rope::rotate<Style::rotate_half, T>(kn.data(), kn.data(), table.cos(p), table.sin(p), m);
    eq19_state.push(kn, fk.row(row), v.row(row));
    const Vector<T> out = eq19_state.read(qn, fq.row(row));
    EXPECT_LE(at::relative_error(out.transpose(), eq19_batch.row(row)), at::exact_tolerance<T>()) << "eq19 " << i;
  }
}

// E3: eq. 19 equals (N V) / rowsum(D), N_ij = (R_pi phi(q_i)).(R_pj phi(k_j)),
// D_ij = phi(q_i).phi(k_j), the rotation from the exact angles over m features.
TYPED_TEST(LinearTyped, Eq19EqualsQuadraticForm) {
  using T = TypeParam;
  const std::size_t l = 29, m = 10, dv = 4;
  const auto freqs = rope::frequencies(m, 10000.0);
  const rope::Table<T> table(freqs, 300);
  const Matrix<T> fq = positive_features<T>(l, m, 31), fk = positive_features<T>(l, m, 32);
  const Matrix<T> v = at::random_matrix<T>(l, dv, 33);
  LinearOptions o;
  o.mask.causal = false;
  o.q_positions = at::random_positions(l, 300, 34);
  o.k_positions = at::random_positions(l, 300, 35);
  const auto qd = at::to_ld(fq), kd = at::to_ld(fk);
  for (const Style style : kStyles) {
    at::Mat qn = qd, kn = kd;
    for (std::size_t i = 0; i < l; ++i) {
      qn[i] = at::rotate(qd[i], freqs.inv_freq, style, at::LD(o.q_positions[i]));
      kn[i] = at::rotate(kd[i], freqs.inv_freq, style, at::LD(o.k_positions[i]));
    }
    for (const bool causal : {false, true}) {
      // Causal masks by position: key j is summed for query i iff pk_j <= pq_i.
      const auto want = at::quadratic(qn, qd, kn, kd, at::to_ld(v), causal, 1e-6L, o.q_positions, o.k_positions);
      for (const std::size_t chunk : {std::size_t{1}, std::size_t{4}, std::size_t{29}}) {
        o.mask.causal = causal;
        o.chunk = chunk;
        const Matrix<T> got = rope::attention::linear_eq19(fq, fk, v, Rotation<T>{&table, style}, o);
        EXPECT_LE(at::relative_error(got, want), at::exact_tolerance<T>())
            << rope::name(style) << " causal " << causal << " chunk " << chunk;
      }
    }
  }
}

// E3 for FAVOR+ features from raw q, k (causal keys with the running max):
// the quadratic form of the features the map gives, offsets removed.
TEST(Linear, FavorEq19EqualsQuadraticForm) {
  const std::size_t l = 24, d = 8, m = 16, dv = 3;
  const auto freqs = rope::frequencies(m, 100.0);
  const rope::Table<double> table(freqs, 64);
  FavorOptions fo;
  fo.features = m;
  fo.eps = 0;
  const FavorFeatures phi(d, fo);
  const Matrix<double> q = at::random_matrix<double>(l, d, 41), k = at::random_matrix<double>(l, d, 42);
  const Matrix<double> v = at::random_matrix<double>(l, dv, 43);
  const auto lq = phi.log_features(q), lk = phi.log_features(k);
  at::Mat qd(l), kd(l);
  for (std::size_t i = 0; i < l; ++i) {
    for (std::size_t r = 0; r < m; ++r) {
      qd[i].push_back(std::exp(static_cast<at::LD>(lq.exponent(Eigen::Index(i), Eigen::Index(r)))));
      kd[i].push_back(std::exp(static_cast<at::LD>(lk.exponent(Eigen::Index(i), Eigen::Index(r)))));
    }
  }
  LinearOptions o;
  o.mask.causal = false;
  o.delta = 0;
  o.q_positions = at::random_positions(l, 64, 44);
  o.k_positions = at::random_positions(l, 64, 45);
  at::Mat qn = qd, kn = kd;
  for (std::size_t i = 0; i < l; ++i) {
    qn[i] = at::rotate(qd[i], freqs.inv_freq, Style::block_diagonal, at::LD(o.q_positions[i]));
    kn[i] = at::rotate(kd[i], freqs.inv_freq, Style::block_diagonal, at::LD(o.k_positions[i]));
  }
  for (const bool causal : {false, true}) {
    o.mask.causal = causal;
    o.chunk = 5;
    const auto want = at::quadratic(qn, qd, kn, kd, at::to_ld(v), causal, 0.0L, o.q_positions, o.k_positions);
    const Matrix<double> got =
        rope::attention::linear_eq19(q, k, v, phi, Rotation<double>{&table, Style::block_diagonal}, o);
    EXPECT_LE(at::relative_error(got, want), 1e-12) << "causal " << causal;
  }
}

// Pre-phi mode: rotating q and k in d dimensions first (here by hand, with
// the row kernel) and then running FAVOR+ without RoPE gives the same output,
// causal (features computed chunk by chunk) or not, with random positions.
TYPED_TEST(LinearTyped, PrePhiEqualsRotatingFirst) {
  using T = TypeParam;
  const std::size_t l = 31, d = 8, dv = 3;
  const rope::Table<T> table(rope::frequencies(d, 10000.0), 100);
  FavorOptions fo;
  fo.features = 16;
  const FavorFeatures phi(d, fo);
  const Matrix<T> q = at::random_matrix<T>(l, d, 46), k = at::random_matrix<T>(l, d, 47);
  const Matrix<T> v = at::random_matrix<T>(l, dv, 48);
  LinearOptions o;
  o.mask.causal = false;
  o.q_positions = at::random_positions(l, 100, 49);
  o.k_positions = at::random_positions(l, 100, 50);
  Matrix<T> qr = q, kr = k;
  for (std::size_t i = 0; i < l; ++i) {
    const auto pq = static_cast<std::size_t>(o.q_positions[i]), pk = static_cast<std::size_t>(o.k_positions[i]);
    T* qrow = qr.row(Eigen::Index(i)).data();
    T* krow = kr.row(Eigen::Index(i)).data();
    rope::rotate<Style::block_diagonal, T>(qrow, qrow, table.cos(pq), table.sin(pq), d);
    rope::rotate<Style::block_diagonal, T>(krow, krow, table.cos(pk), table.sin(pk), d);
  }
  for (const bool causal : {false, true}) {
    for (const std::size_t chunk : {std::size_t{1}, std::size_t{4}, std::size_t{31}}) {
      o.mask.causal = causal;
      o.chunk = chunk;
      // The same positions mask both calls; only the rotation differs.
      const Matrix<T> want = rope::attention::linear(qr, kr, v, phi, o);
      const Matrix<T> got = rope::attention::linear(q, k, v, phi, o, Rotation<T>{&table, Style::block_diagonal});
      EXPECT_LE(at::relative_error(got, want), at::exact_tolerance<T>()) << "causal " << causal << " chunk " << chunk;
    }
  }
}

// E4: with all positions equal eq. 19 is plain linear attention; shifting all
// positions by the same s changes nothing.
TYPED_TEST(LinearTyped, Eq19PositionIdentities) {
  using T = TypeParam;
  const std::size_t l = 26, m = 8, dv = 3;
  const rope::Table<T> table(rope::frequencies(m, 10000.0), 200);
  const Matrix<T> fq = positive_features<T>(l, m, 51), fk = positive_features<T>(l, m, 52);
  const Matrix<T> v = at::random_matrix<T>(l, dv, 53);
  for (const Style style : kStyles) {
    for (const bool causal : {false, true}) {
      LinearOptions o;
      o.mask.causal = causal;
      o.chunk = 6;
      o.q_positions.assign(l, 77);
      o.k_positions.assign(l, 77);
      const Matrix<T> plain = rope::attention::linear(fq, fk, v, o);
      const Matrix<T> same = rope::attention::linear_eq19(fq, fk, v, Rotation<T>{&table, style}, o);
      EXPECT_LE(at::relative_error(same, plain), at::exact_tolerance<T>()) << rope::name(style);
      o.q_positions = at::random_positions(l, 100, 54);
      o.k_positions = at::random_positions(l, 100, 55);
      const Matrix<T> base = rope::attention::linear_eq19(fq, fk, v, Rotation<T>{&table, style}, o);
      for (auto& p : o.q_positions) p += 93;
      for (auto& p : o.k_positions) p += 93;
      const Matrix<T> shifted = rope::attention::linear_eq19(fq, fk, v, Rotation<T>{&table, style}, o);
      EXPECT_LE(at::relative_error(shifted, base), at::exact_tolerance<T>()) << rope::name(style);
    }
  }
}

// E6: m = 2, theta_0 = 1 rad, block-diagonal pairing. phi(q) = (1, 0) at
// position 2; keys (1, 0) at 0 and (0.6, 0.8) at 1; numerator terms
// cos 2 = -0.4161468365 and 0.9973581714, denominator 1.6.
TEST(Linear, Eq19GoldenValues) {
  const auto freqs = rope::frequencies(2, 10000.0);  // theta_0 = base^0 = 1 for any base
  ASSERT_EQ(freqs.inv_freq[0], 1.0);
  const rope::Table<double> table(freqs, 3);
  Matrix<double> fq(1, 2), fk(2, 2), v(2, 1), v2(2, 2);
  fq << 1, 0;
  fk << 1, 0, 0.6, 0.8;
  v << 1, 1;
  v2 << 1, 0, 0, 1;  // one value channel per key: the output is the weights
  LinearOptions o;
  o.mask.causal = false;
  o.q_positions = {2};
  o.k_positions = {0, 1};
  const Rotation<double> rope{&table, Style::block_diagonal};
  // The numerator terms from the oracle's rotation.
  const auto qn = at::rotate({1, 0}, freqs.inv_freq, Style::block_diagonal, 2);
  EXPECT_NEAR(static_cast<double>(at::dot(qn, at::rotate({1, 0}, freqs.inv_freq, Style::block_diagonal, 0))),
              -0.4161468365, 1e-10);
  EXPECT_NEAR(static_cast<double>(at::dot(qn, at::rotate({0.6L, 0.8L}, freqs.inv_freq, Style::block_diagonal, 1))),
              0.9973581714, 1e-10);
  const Matrix<double> out = rope::attention::linear_eq19(fq, fk, v, rope, o);
  EXPECT_NEAR(out(0, 0), 0.3632570843, 1e-10);
  const Matrix<double> weights = rope::attention::linear_eq19(fq, fk, v2, rope, o);
  EXPECT_NEAR(weights(0, 0), -0.2600917728, 1e-10);  // a negative weight: not clamped
  EXPECT_NEAR(weights(0, 1), 0.6233488571, 1e-10);
  // Causal over the same tokens (query position 2 sees both keys) and the step API agree.
  LinearState<double> state(2, 1);
  Vector<double> kn0(2), kn1(2), qrot(2);
  kn0 << 1, 0;
  kn1 << 0.6 * std::cos(1.0) - 0.8 * std::sin(1.0), 0.8 * std::cos(1.0) + 0.6 * std::sin(1.0);
  qrot << std::cos(2.0), std::sin(2.0);
  state.push(kn0, fk.row(0), v.row(0));
  state.push(kn1, fk.row(1), v.row(1));
  EXPECT_NEAR(state.read(qrot, fq.row(0))[0], 0.3632570843, 1e-10);
  EXPECT_NEAR(state.key_sum()[0], 1.6, 1e-15);  // the denominator sum, unrotated
}

// E7: with eps = 0, query-row and key offsets leave the outputs unchanged.
TEST(Linear, OffsetsCancelWithZeroEps) {
  const std::size_t l = 33, m = 9, dv = 4;
  const Matrix<double> fq = positive_features<double>(l, m, 61), fk = positive_features<double>(l, m, 62);
  const Matrix<double> v = at::random_matrix<double>(l, dv, 63);
  const Matrix<double> row_scale = at::random_matrix<double>(l, 1, 64).array().exp().matrix();
  const Matrix<double> fq_scaled = row_scale.asDiagonal() * fq;
  for (const bool causal : {false, true}) {
    LinearOptions o;
    o.mask.causal = causal;
    o.chunk = 8;
    const Matrix<double> base = rope::attention::linear(fq, fk, v, o);
    EXPECT_LE(at::relative_error(rope::attention::linear(fq_scaled, fk, v, o), base), 1e-12);
    EXPECT_LE(at::relative_error(rope::attention::linear(fq, Matrix<double>(fk * std::exp(-7.5)), v, o), base), 1e-12);
  }
  // FAVOR+ with eps = 0: the map's own offsets (row max for queries, c_K or
  // the running max for keys) against the unoffset kernel features.
  FavorOptions fo;
  fo.features = 24;
  fo.eps = 0;
  const FavorFeatures phi(6, fo);
  const Matrix<double> q = at::random_matrix<double>(l, 6, 65, 1.5), k = at::random_matrix<double>(l, 6, 66, 1.5);
  const auto lq = phi.log_features(q), lk = phi.log_features(k);
  const Matrix<double> raw_q = lq.exponent.array().exp().matrix(), raw_k = lk.exponent.array().exp().matrix();
  for (const bool causal : {false, true}) {
    LinearOptions o;
    o.mask.causal = causal;
    o.chunk = 10;
    o.delta = 0;
    const auto want = at::quadratic(at::to_ld(raw_q), at::to_ld(raw_q), at::to_ld(raw_k), at::to_ld(raw_k),
                                    at::to_ld(v), causal, 0.0L);
    EXPECT_LE(at::relative_error(rope::attention::linear(q, k, v, phi, o), want), 1e-12) << "causal " << causal;
  }
}

// E8: every feature and every denominator is positive. With moderate inputs
// the outputs of plain and pre-phi linear attention are convex combinations
// of the values; with inputs whose exponents underflow, v = 1 still gives an
// output in (0, 1], which a zero or negative denominator could not.
TYPED_TEST(LinearTyped, FeaturesAndDenominatorsPositive) {
  using T = TypeParam;
  const std::size_t l = 40, d = 8, dv = 3;
  FavorOptions fo;
  fo.features = 64;
  const FavorFeatures phi(d, fo);
  const rope::Table<T> table(rope::frequencies(d, 10000.0), 64);
  const Rotation<T> rope{&table, Style::rotate_half};
  const Matrix<T> v = at::random_matrix<T>(l, dv, 73);
  for (const double input_scale : {1.0, 12.0}) {
    const Matrix<T> q = at::random_matrix<T>(l, d, 71, input_scale), k = at::random_matrix<T>(l, d, 72, input_scale);
    EXPECT_GT(phi.queries(q).minCoeff(), T(0)) << input_scale;
    EXPECT_GT(phi.keys(k).minCoeff(), T(0)) << input_scale;
    EXPECT_GT(phi.scaled_keys(k).features.rowwise().maxCoeff().minCoeff(), T(0)) << input_scale;
    const Matrix<T> elu = rope::attention::elu_plus_one(at::random_matrix<T>(l, d, 74, 5.0));
    EXPECT_GT(elu.minCoeff(), T(0));
    for (const bool causal : {false, true}) {
      LinearOptions o;
      o.mask.causal = causal;
      o.chunk = 9;
      const Matrix<T> ones = Matrix<T>::Ones(static_cast<Eigen::Index>(l), 1);
      const Matrix<T> unit = rope::attention::linear(q, k, ones, phi, o, rope);
      EXPECT_GT(unit.minCoeff(), T(0)) << input_scale << " causal " << causal;
      EXPECT_LE(unit.maxCoeff(), T(1) + T(8) * std::numeric_limits<T>::epsilon());
      if (input_scale > 1.0) continue;
      const Matrix<T> out = rope::attention::linear(q, k, v, phi, o, rope);
      for (Eigen::Index i = 0; i < out.rows(); ++i) {
        const Eigen::Index seen = causal ? i + 1 : v.rows();
        for (Eigen::Index c = 0; c < v.cols(); ++c) {
          const T lo = v.col(c).head(seen).minCoeff(), hi = v.col(c).head(seen).maxCoeff();
          const T slack = T(16) * std::numeric_limits<T>::epsilon();
          EXPECT_GE(out(i, c), lo - slack) << "row " << i;
          EXPECT_LE(out(i, c), hi + slack) << "row " << i;
        }
      }
    }
  }
}

// E9: in causal mode, changing tokens >= t leaves outputs < t unchanged —
// even when a future key is far larger than every earlier one, which a
// head-wide key offset c_K would turn into underflow of the earlier keys.
TYPED_TEST(LinearTyped, CausalPrefixInvariance) {
  using T = TypeParam;
  const std::size_t l = 36, d = 8, dv = 4, t = 17;
  FavorOptions fo;
  fo.features = 32;
  const FavorFeatures phi(d, fo);
  const Matrix<T> q = at::random_matrix<T>(l, d, 81), k = at::random_matrix<T>(l, d, 82);
  const Matrix<T> v = at::random_matrix<T>(l, dv, 83);
  Matrix<T> q2 = q, k2 = k, v2 = v;
  q2.bottomRows(l - t) = at::random_matrix<T>(l - t, d, 84);
  k2.bottomRows(l - t) = at::random_matrix<T>(l - t, d, 85, 40.0);
  v2.bottomRows(l - t) = at::random_matrix<T>(l - t, dv, 86);
  const rope::Table<T> feature_table(rope::frequencies(fo.features, 10000.0), 64);
  for (const std::size_t chunk : {std::size_t{1}, std::size_t{5}, std::size_t{16}, std::size_t{36}}) {
    LinearOptions o;
    o.mask.causal = true;
    o.chunk = chunk;
    const Matrix<T> a = rope::attention::linear(q, k, v, phi, o), b = rope::attention::linear(q2, k2, v2, phi, o);
    EXPECT_LE(at::relative_error(b.topRows(t), a.topRows(t)), at::exact_tolerance<T>()) << "chunk " << chunk;
    const Rotation<T> rope{&feature_table, Style::rotate_half};
    const Matrix<T> c = rope::attention::linear_eq19(q, k, v, phi, rope, o);
    const Matrix<T> e = rope::attention::linear_eq19(q2, k2, v2, phi, rope, o);
    EXPECT_LE(at::relative_error(e.topRows(t), c.topRows(t)), at::exact_tolerance<T>()) << "eq19 chunk " << chunk;
  }
  // The same test fails with the head-wide key offset: it is discriminating.
  LinearOptions o;
  o.mask.causal = true;
  const Matrix<T> wide_a = rope::attention::linear(phi.queries(q), phi.keys(k), v, o);
  const Matrix<T> wide_b = rope::attention::linear(phi.queries(q2), phi.keys(k2), v2, o);
  EXPECT_GT(at::relative_error(wide_b.topRows(t), wide_a.topRows(t)), 1e-3);
}

TEST(Linear, BadInputThrows) {
  const auto message = [](auto&& call) { return rope_test::thrown_message(call); };
  const Matrix<double> f3 = positive_features<double>(4, 3, 91), f4 = positive_features<double>(4, 4, 92);
  const Matrix<double> v = at::random_matrix<double>(4, 2, 93);
  const rope::Table<double> table4(rope::frequencies(4, 10000.0), 8);
  using rope::attention::linear;
  using rope::attention::linear_eq19;
  EXPECT_NE(message([&] {
              linear_eq19(f3, f3, v, Rotation<double>{&table4, rope::Style::rotate_half});
            }).find("the feature dimension m must be even for eq. 19 (pairs of features), got 3"),
            std::string::npos);
  const rope::Table<double> table2(rope::frequencies(2, 10000.0), 8);
  EXPECT_NE(message([&] {
              linear_eq19(f4, f4, v, Rotation<double>{&table2, rope::Style::rotate_half});
            }).find("feature_rotation.rotary_dim must be the feature dimension m = 4"),
            std::string::npos);
  EXPECT_NE(message([&] {
              linear_eq19(f4, f4, v, Rotation<double>{});
            }).find("feature_rotation.table must be non-null, got null"),
            std::string::npos);
  LinearOptions o;
  o.mask.causal = false;
  o.q_positions = {0, 1, 2, 8};
  EXPECT_NE(message([&] {
              linear_eq19(f4, f4, v, Rotation<double>{&table4, rope::Style::rotate_half}, o);
            })
                .find("out_of_range: rope::attention::linear_eq19: options.q_positions[3] must be in the table's "
                      "positions [0, 8), got 8"),
            std::string::npos);
  o = {};
  o.chunk = 0;
  EXPECT_NE(message([&] { linear(f4, f4, v, o); }).find("options.chunk must be at least 1, got 0"), std::string::npos);
  o = {};
  o.mask.causal = true;  // causal by position: 4 queries may see 3 keys
  EXPECT_EQ(message([&] { linear(f4, Matrix<double>(f4.topRows(3)), Matrix<double>(v.topRows(3)), o); }),
            "no exception");
  EXPECT_NE(message([&] { linear(f4, f3, v); }).find("k.cols() must be q.cols() = 4, got 3"), std::string::npos);
  o = {};
  o.delta = -1;
  EXPECT_NE(message([&] { linear(f4, f4, v, o); }).find("options.delta"), std::string::npos);
  const FavorFeatures phi(5);
  EXPECT_NE(message([&] { linear(f4, f4, v, phi); }).find("must be the feature map's head_dim 5, got 4"),
            std::string::npos);
  LinearState<double> state(4, 2);
  EXPECT_NE(message([&] { state.push(f3.row(0), v.row(0)); }).find("kn.size() must be 4, got 3"), std::string::npos);
  EXPECT_NE(message([&] { (void)state.read(f3.row(0)); }).find("qn.size() must be 4, got 3"), std::string::npos);
  EXPECT_NE(message([&] { LinearState<double>(0, 2); }).find("features must be at least 1, got 0"), std::string::npos);
  // A failed push leaves the state as it was.
  EXPECT_EQ(state.key_sum().squaredNorm(), 0.0);
}

}  // namespace

// ---- multi-head linear attention with a LinearState per key/value head
namespace {
namespace heads {

namespace at = attention_test;
namespace ra = rope::attention;
using at::Heads;
using ra::Matrix;
using ra::Rotation;
using rope::Style;
using rope::View;

template <class T>
class LinearHeads : public ::testing::Test {};
using Scalars = ::testing::Types<float, double>;
TYPED_TEST_SUITE(LinearHeads, Scalars, rope_test::ScalarNames);

template <class T>
double tolerance() {
  return at::exact_tolerance<T>();
}

// max |got - want| / max |want| over one head of an output tensor.
template <class T>
double head_error(const Heads<T>& out, std::size_t h, const at::Mat& want) {
  return at::relative_error(out.head(h), want);
}

using at::LinearCase;

// The multi-head views give each head the one-head call on its rows, for
// FAVOR+ with pre-phi RoPE and in eq. 19 form, causal or not.
TYPED_TEST(LinearHeads, LinearHeadsEqualOneHeadCalls) {
  using T = TypeParam;
  const LinearCase<T> c(51);
  const auto& [table, feature_table, q, k, v, phi] = c;
  for (const bool causal : {false, true}) {
    ra::LinearOptions o;
    o.mask.causal = causal;
    o.chunk = 5;
    o.q_positions = o.k_positions = at::random_positions(c.l, 64, 54);
    Heads<T> pre(c.l, c.hq, c.dv, 0), eq19(c.l, c.hq, c.dv, 0);
    ra::linear<T>(q.view(), k.view(), v.view(), pre.view(), phi, o, {&table, Style::rotate_half});
    ra::linear_eq19<T>(q.view(), k.view(), v.view(), eq19.view(), phi, {&feature_table, Style::block_diagonal}, o);
    for (std::size_t h = 0; h < c.hq; ++h) {
      const std::size_t g = h / (c.hq / c.hk);
      const Matrix<T> want_pre =
          ra::linear(q.head(h), k.head(g), v.head(g), phi, o, Rotation<T>{&table, Style::rotate_half});
      const Matrix<T> want_eq19 =
          ra::linear_eq19(q.head(h), k.head(g), v.head(g), phi, Rotation<T>{&feature_table, Style::block_diagonal}, o);
      EXPECT_LE(at::relative_error(pre.head(h), want_pre), tolerance<T>()) << "causal " << causal << " head " << h;
      EXPECT_LE(at::relative_error(eq19.head(h), want_eq19), tolerance<T>()) << "causal " << causal << " head " << h;
    }
  }
}

// A prefill in chunks, then one token at a time, carrying one LinearState
// per key/value head, equals the one-shot causal call.
TYPED_TEST(LinearHeads, LinearChunkedPrefillThenDecodeEqualsOneShot) {
  using T = TypeParam;
  const LinearCase<T> c(61);
  for (const bool eq19 : {true, false}) {
    ra::LinearOptions o;
    o.mask.causal = true;
    o.chunk = 4;
    const auto call = [&](std::size_t t, std::size_t n, Heads<T>& out, std::vector<ra::LinearState<T>>* states) {
      ra::LinearOptions step = o;
      step.q_offset = step.k_offset = static_cast<std::int64_t>(t);
      if (eq19) {
        ra::linear_eq19<T>(c.q.view().slice_tokens(t, n), c.k.view().slice_tokens(t, n), c.v.view().slice_tokens(t, n),
                           out.view().slice_tokens(t, n), c.phi, {&c.feature_table, Style::rotate_half}, step, states);
      } else {
        ra::linear<T>(c.q.view().slice_tokens(t, n), c.k.view().slice_tokens(t, n), c.v.view().slice_tokens(t, n),
                      out.view().slice_tokens(t, n), c.phi, step, {&c.table, Style::rotate_half}, states);
      }
    };
    Heads<T> once(c.l, c.hq, c.dv, 0), pieces(c.l, c.hq, c.dv, 0);
    call(0, c.l, once, nullptr);
    std::vector<ra::LinearState<T>> states;
    std::size_t t = 0;
    for (const std::size_t n : {std::size_t{9}, std::size_t{5}}) {
      call(t, n, pieces, &states);
      t += n;
    }
    for (; t < c.l; ++t) call(t, 1, pieces, &states);
    ASSERT_EQ(states.size(), c.hk);
    for (std::size_t h = 0; h < c.hq; ++h) {
      EXPECT_LE(at::relative_error(pieces.head(h), once.head(h)), 10 * tolerance<T>())
          << "eq19 " << eq19 << " head " << h;
    }
    // The states remember where they are: a query before their last key is refused.
    Heads<T> spare(c.l, c.hq, c.dv, 0);
    EXPECT_THROW(call(3, 1, spare, &states), std::invalid_argument);
  }
}

// Packed sequences equal one call per sequence: no attention across them.
TYPED_TEST(LinearHeads, LinearSequencesEqualSeparateCalls) {
  using T = TypeParam;
  const LinearCase<T> c(71);
  const auto& [table, feature_table, q, k, v, phi] = c;
  const std::size_t split = 9;
  for (const bool causal : {false, true}) {
    ra::LinearOptions packed;
    packed.mask.causal = causal;
    packed.chunk = 4;
    for (std::size_t t = 0; t < c.l; ++t) {
      packed.q_sequence.push_back(t < split ? 0 : 1);
      packed.q_positions.push_back(static_cast<std::int64_t>(t < split ? t : t - split));
    }
    packed.k_sequence = packed.q_sequence;
    packed.k_positions = packed.q_positions;
    Heads<T> together(c.l, c.hq, c.dv, 0), apart(c.l, c.hq, c.dv, 0);
    ra::linear<T>(q.view(), k.view(), v.view(), together.view(), phi, packed);
    ra::LinearOptions alone;
    alone.mask.causal = causal;
    alone.chunk = 4;
    for (const auto& [t0, n] : {std::pair<std::size_t, std::size_t>{0, split}, {split, c.l - split}}) {
      ra::linear<T>(q.view().slice_tokens(t0, n), k.view().slice_tokens(t0, n), v.view().slice_tokens(t0, n),
                    apart.view().slice_tokens(t0, n), phi, alone);
    }
    for (std::size_t h = 0; h < c.hq; ++h) {
      EXPECT_LE(at::relative_error(together.head(h), apart.head(h)), tolerance<T>()) << "causal " << causal;
    }
  }
}

TEST(LinearErrors, LinearStatesAreChecked) {
  const LinearCase<double> c(91);
  Heads<double> out = Heads<double>::filled(c.l, c.hq, c.dv, -3.0);
  const auto untouched = out.data;
  const auto message = [&](ra::LinearOptions o, std::vector<ra::LinearState<double>>* states) -> std::string {
    try {
      ra::linear<double>(c.q.view(), c.k.view(), c.v.view(), out.view(), c.phi, o, {}, states);
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
    return "no exception";
  };
  std::vector<ra::LinearState<double>> states;
  ra::LinearOptions o;
  o.mask.causal = false;
  EXPECT_NE(message(o, &states).find("states must be null unless options.mask.causal"), std::string::npos);
  o.mask.causal = true;
  std::vector<ra::LinearState<double>> three(3, ra::LinearState<double>(c.m, c.dv));
  EXPECT_NE(message(o, &three).find("states->size() must be 0 or k.heads = 2, got 3"), std::string::npos);
  std::vector<ra::LinearState<double>> narrow(2, ra::LinearState<double>(c.m / 2, c.dv));
  EXPECT_NE(message(o, &narrow).find("states[0].features() must be the feature dimension 16, got 8"),
            std::string::npos);
  EXPECT_TRUE(at::same_bytes(out.data, untouched));
}

// Every byte a LinearState carries, for comparing a state before and after.
std::vector<unsigned char> state_bytes(const std::vector<ra::LinearState<double>>& states) {
  std::vector<unsigned char> bytes;
  const auto add = [&](const void* p, std::size_t n) {
    const auto* b = static_cast<const unsigned char*>(p);
    bytes.insert(bytes.end(), b, b + n);
  };
  for (const auto& s : states) {
    add(s.key_value_sum().data(), sizeof(double) * static_cast<std::size_t>(s.key_value_sum().size()));
    add(s.key_sum().data(), sizeof(double) * static_cast<std::size_t>(s.key_sum().size()));
    const double offset = s.log_offset(), delta = s.delta();
    const std::int64_t last = s.last_position();
    const bool empty = s.empty();
    add(&offset, sizeof offset);
    add(&delta, sizeof delta);
    add(&last, sizeof last);
    add(&empty, sizeof empty);
  }
  return bytes;
}

// A refused causal call changes neither the states nor the output, whichever
// check refuses it (one state of two too narrow, a query before the states'
// last key, positions outside the rotation's table, a value width that is
// not the states'), and the states stay usable: the call that continues
// after the refusals gives, bit for bit, what it gives without them.
TEST(LinearErrors, RefusedCallsLeaveTheStatesAsTheyWere) {
  const LinearCase<double> c(93);
  const std::size_t first = 9, next = 5;
  ra::LinearOptions o;
  o.mask.causal = true;
  o.chunk = 4;
  const Rotation<double> rotation{&c.table, Style::rotate_half};
  const auto call = [&](std::size_t t, std::size_t n, Heads<double>& out, std::vector<ra::LinearState<double>>* states,
                        ra::LinearOptions step) {
    step.q_offset = step.k_offset = static_cast<std::int64_t>(t) + step.q_offset;
    ra::linear<double>(c.q.view().slice_tokens(t, n), c.k.view().slice_tokens(t, n), c.v.view().slice_tokens(t, n),
                       out.view().slice_tokens(t, n), c.phi, step, rotation, states);
  };
  Heads<double> plain = Heads<double>::filled(c.l, c.hq, c.dv, -3.0), refused = plain;
  std::vector<ra::LinearState<double>> kept, states;
  call(0, first, plain, &kept, o);
  call(0, first, refused, &states, o);
  ASSERT_EQ(states.size(), c.hk);
  const auto before = state_bytes(states);
  const auto out_before = refused.data;

  const auto refuse = [&](const char* what, const std::string& expected, auto&& f) {
    const std::string msg = rope_test::thrown_message(f);
    EXPECT_NE(msg.find(expected), std::string::npos) << what << ": " << msg;
    EXPECT_EQ(state_bytes(states), before) << what << ": the states changed";
    EXPECT_TRUE(at::same_bytes(refused.data, out_before)) << what << ": the output changed";
  };
  refuse("a narrow second state", "states[1].features() must be the feature dimension 16, got 8", [&] {
    std::vector<ra::LinearState<double>> mixed = states;
    mixed[1] = ra::LinearState<double>(c.m / 2, c.dv);
    const auto first_state = state_bytes({mixed[0]});
    try {
      call(first, next, refused, &mixed, o);
    } catch (...) {
      EXPECT_EQ(state_bytes({mixed[0]}), first_state) << "states[0] changed";
      throw;
    }
  });
  refuse("a query before the last key",
         "the position of query token 0 must be >= the last key position in states[0] (8), got 3",
         [&] { call(3, 1, refused, &states, o); });
  ra::LinearOptions far = o;
  far.q_offset = 1000;  // the table holds 64 positions
  refuse("positions outside the table", "out_of_range: ", [&] { call(first, next, refused, &states, far); });
  refuse("another value width", "states[0].value_dim() must be v.head_dim = 5, got 4", [&] {
    const Heads<double> wide(c.l, c.hk, c.dv + 1, 95);
    Heads<double> wide_out = Heads<double>::filled(c.l, c.hq, c.dv + 1, -3.0);
    ra::LinearOptions step = o;
    step.q_offset = step.k_offset = static_cast<std::int64_t>(first);
    ra::linear<double>(c.q.view().slice_tokens(first, next), c.k.view().slice_tokens(first, next),
                       wide.view().slice_tokens(first, next), wide_out.view().slice_tokens(first, next), c.phi, step,
                       rotation, &states);
  });

  call(first, next, plain, &kept, o);
  call(first, next, refused, &states, o);
  EXPECT_EQ(state_bytes(states), state_bytes(kept));
  EXPECT_TRUE(at::same_bytes(refused.data, plain.data));
}

}  // namespace heads
}  // namespace

// ---- eq. 19 feature tables, masks by position
namespace {
namespace edges {

namespace at = attention_test;
namespace ra = rope::attention;
using at::Heads;
using ra::Matrix;
using ra::Rotation;
using rope::Style;

// A feature rotation that asks for more channels than its table has is
// refused by name (it used to read past the table).
TEST(LinearEdges, Eq19RotationWiderThanItsTableIsRefused) {
  const std::size_t l = 5, m = 16;
  const rope::Table<double> narrow(rope::frequencies(4, 10000.0), 8);
  const Matrix<double> f = ra::elu_plus_one(at::random_matrix<double>(l, m, 10));
  const Matrix<double> v = at::random_matrix<double>(l, 2, 11);
  const auto msg = rope_test::thrown_message([&] {
    ra::linear_eq19(f, f, v, Rotation<double>{&narrow, Style::rotate_half, m});
  });
  EXPECT_NE(msg.find("feature_rotation.rotary_dim must be <= the table's rotary_dim 4, got 16"), std::string::npos)
      << msg;
}

// Eq. 19 rotates: a feature table with an attention factor gives the same
// output as one without (the factor is divided out of the numerator).
TEST(LinearEdges, Eq19DividesTheFeatureTablesAttentionFactorOut) {
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
    o.mask.causal = causal;
    o.q_positions = o.k_positions = at::random_positions(l, 32, 15);
    const Matrix<double> a = ra::linear_eq19(fq, fk, v, Rotation<double>{&unit, rope::Style::rotate_half}, o);
    const Matrix<double> b = ra::linear_eq19(fq, fk, v, Rotation<double>{&scaled, rope::Style::rotate_half}, o);
    EXPECT_LE(at::relative_error(b, a), 1e-13) << "causal " << causal;
  }
}

// Causal linear attention masks by position, as softmax does: with rows out
// of position order, a row sees the keys at or before its position, not the
// rows above it.
TEST(LinearEdges, CausalLinearMasksByPositionNotRowOrder) {
  const std::size_t l = 6, m = 4, dv = 2;
  const Matrix<double> fq = ra::elu_plus_one(at::random_matrix<double>(l, m, 16));
  const Matrix<double> fk = ra::elu_plus_one(at::random_matrix<double>(l, m, 17));
  const Matrix<double> v = at::random_matrix<double>(l, dv, 18);
  ra::LinearOptions o;
  o.mask.causal = true;
  o.chunk = 2;
  o.q_positions = {5, 0, 3, 3, 1, 4};
  o.k_positions = {5, 0, 3, 3, 1, 4};
  const auto want = at::quadratic(at::to_ld(fq), at::to_ld(fq), at::to_ld(fk), at::to_ld(fk), at::to_ld(v), true, 1e-6L,
                                  o.q_positions, o.k_positions);
  const auto index_order =
      at::quadratic(at::to_ld(fq), at::to_ld(fq), at::to_ld(fk), at::to_ld(fk), at::to_ld(v), true);
  const Matrix<double> got = ra::linear(fq, fk, v, o);
  EXPECT_LE(at::relative_error(got, want), 1e-12);
  EXPECT_GT(at::relative_error(got, index_order), 1e-3);  // the two masks differ here
  // Row 0 (position 5) sees all six keys: the non-causal result.
  ra::LinearOptions all;
  all.mask.causal = false;
  EXPECT_LE(at::relative_error(got.row(0), Matrix<double>(ra::linear(fq, fk, v, all).row(0))), 1e-12);
}

}  // namespace edges
}  // namespace
