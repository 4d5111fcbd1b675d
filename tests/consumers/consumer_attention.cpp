// The attention program the consumer projects build against rope::attention:
// it fails (exit 1) unless softmax attention with RoPE gives the closed form
// of a two-key case (q = k = e_0, theta_0 = 1: the scores are scale * cos of
// the position offsets) and sees relative positions only, i.e. shifting
// every query and key position by the same amount leaves the output
// unchanged (which attention without RoPE would pass too).
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <vector>

#include <rope/attention.hpp>

int main() {
  namespace ra = rope::attention;
  constexpr Eigen::Index tokens = 12, head_dim = 32;
  const rope::Table<double> table(rope::frequencies(head_dim), 256);
  ra::Matrix<double> q(tokens, head_dim), k(tokens, head_dim), v(tokens, head_dim);
  for (Eigen::Index i = 0; i < tokens; ++i) {
    for (Eigen::Index c = 0; c < head_dim; ++c) {
      q(i, c) = std::sin(0.3 * double(i * head_dim + c));
      k(i, c) = std::cos(0.7 * double(i * head_dim + c));
      v(i, c) = std::sin(1.1 * double(i + c));
    }
  }
  ra::SoftmaxOptions near, far;
  near.mask.causal = far.mask.causal = true;
  for (Eigen::Index i = 0; i < tokens; ++i) {
    near.q_positions.push_back(i);
    far.q_positions.push_back(i + 200);
  }
  near.k_positions = near.q_positions;
  far.k_positions = far.q_positions;
  const ra::Rotation<double> rotation{&table, rope::Style::rotate_half};
  const ra::Matrix<double> a = ra::softmax(q, k, v, rotation, near);
  const ra::Matrix<double> b = ra::softmax(q, k, v, rotation, far);
  const double difference = (a - b).cwiseAbs().maxCoeff();
  std::printf("rope %d attention: positions 0.. vs 200..: max |difference| = %.3g\n", rope::kVersion, difference);
  if (difference >= 1e-10) return 1;
  // The closed form: query e_0 at position 5; keys e_0 at positions 5 and 7
  // with values e_0 and e_1. Scores s_j = cos(pk_j - 5) / sqrt(d).
  ra::Matrix<double> q1 = ra::Matrix<double>::Zero(1, head_dim), k2 = ra::Matrix<double>::Zero(2, head_dim);
  ra::Matrix<double> v2 = ra::Matrix<double>::Zero(2, 2);
  q1(0, 0) = k2(0, 0) = k2(1, 0) = 1.0;
  v2(0, 0) = v2(1, 1) = 1.0;
  ra::SoftmaxOptions at;
  at.mask.causal = false;  // the key at 7 is after the query at 5
  at.q_positions = {5};
  at.k_positions = {5, 7};
  const ra::Matrix<double> out = ra::softmax(q1, k2, v2, rotation, at);
  const double scale = 1.0 / std::sqrt(double(head_dim));
  const double e0 = std::exp(scale * std::cos(0.0)), e1 = std::exp(scale * std::cos(2.0));
  const double w0 = e0 / (e0 + e1), w1 = e1 / (e0 + e1);
  std::printf("rope attention: weights (%.12f, %.12f), closed form (%.12f, %.12f)\n", out(0, 0), out(0, 1), w0, w1);
  return std::fabs(out(0, 0) - w0) < 1e-12 && std::fabs(out(0, 1) - w1) < 1e-12 ? 0 : 1;
}
