// Softmax attention with RoPE next to its linear approximations on the same
// input. FAVOR+ random features estimate the softmax kernel, so linear
// attention with pre-phi RoPE approaches softmax attention with RoPE as the
// number of features m grows (its error falls like 1/sqrt(m)); RoFormer's
// eq. 19 form rotates the features instead and, like softmax, sees only
// relative positions: shifting every position leaves it unchanged. Exits 1
// unless the error falls by half from m = 16 to m = 1024 and the shift
// leaves eq. 19 unchanged.
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include <rope/attention.hpp>

namespace ra = rope::attention;

int main() {
  constexpr Eigen::Index tokens = 64, head_dim = 16;
  std::mt19937 gen(11);
  std::normal_distribution<double> normal(0.0, 0.5);
  ra::Matrix<double> q(tokens, head_dim), k(tokens, head_dim), v(tokens, head_dim);
  for (auto* x : {&q, &k, &v}) {
    for (Eigen::Index i = 0; i < x->size(); ++i) x->data()[i] = normal(gen);
  }
  const rope::Table<double> table(rope::frequencies(head_dim, 10000.0), 1024);
  const ra::Rotation<double> rotation{&table, rope::Style::rotate_half};
  ra::SoftmaxOptions so;
  so.mask.causal = true;
  const ra::Matrix<double> exact = ra::softmax(q, k, v, rotation, so);

  std::printf("causal attention, %ld tokens, d = %ld\n", long(tokens), long(head_dim));
  ra::LinearOptions lo;
  lo.mask.causal = true;
  double first = 0, last = 0;
  for (const std::size_t m : {16, 64, 256, 1024}) {
    double error = 0;
    const int draws = 8;  // the error of one draw is noisy: average a few seeds
    for (int seed = 0; seed < draws; ++seed) {
      ra::FavorOptions fo;
      fo.features = m;
      fo.seed = static_cast<std::uint64_t>(seed);
      const ra::FavorFeatures phi(head_dim, fo);
      const ra::Matrix<double> approx = ra::linear(q, k, v, phi, lo, rotation);
      error += (approx - exact).norm() / exact.norm() / draws;
    }
    std::printf("  FAVOR+ m = %4zu, pre-phi RoPE: relative error against softmax %.3f\n", m, error);
    if (m == 16) first = error;
    last = error;
  }

  ra::FavorOptions fo;
  fo.features = 64;
  const ra::FavorFeatures phi(head_dim, fo);
  const rope::Table<double> feature_table(rope::frequencies(64, 10000.0), 1024);
  const ra::Rotation<double> feature_rotation{&feature_table, rope::Style::block_diagonal};
  ra::LinearOptions near = lo, far = lo;
  far.q_offset = far.k_offset = 900;  // every position shifted by 900
  const ra::Matrix<double> a = ra::linear_eq19(q, k, v, phi, feature_rotation, near);
  const ra::Matrix<double> b = ra::linear_eq19(q, k, v, phi, feature_rotation, far);
  const double shift = (a - b).cwiseAbs().maxCoeff();
  std::printf("  eq. 19, m = 64: max |out(positions) - out(positions + 900)| = %.2e\n", shift);
  return last < 0.5 * first && shift < 1e-9 ? 0 : 1;
}
