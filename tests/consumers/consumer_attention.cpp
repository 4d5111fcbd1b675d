// The attention program the consumer projects build against rope::attention:
// it fails (exit 1) unless softmax attention with RoPE sees relative
// positions only, i.e. shifting every query and key position by the same
// amount leaves the output unchanged.
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
  near.causal = far.causal = true;
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
  return difference < 1e-10 ? 0 : 1;
}
