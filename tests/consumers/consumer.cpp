// The program every consumer project builds against rope::rope: it fails
// (exit 1) unless the rotation gives the closed form at a few positions
// (unit vector e_p at position m -> cos(m theta_p) e_p + sin(m theta_p)
// e_(p + r/2), theta_p = 10000^(-2p/r)) and preserves the relative-position
// property <R_m q, R_n k> = <q, R_(n-m) k>, which a rotation that does
// nothing would also pass. The core must not need Eigen: it fails to compile
// if <rope/rope.hpp> pulls Eigen in.
#include <cmath>
#include <cstdio>
#include <vector>

#include <rope/rope.hpp>

#if defined(EIGEN_WORLD_VERSION)
#error "<rope/rope.hpp> must not include Eigen: the core needs xsimd alone"
#endif

int main() {
  constexpr std::size_t head_dim = 64;
  const rope::Table<float> table(rope::frequencies(head_dim), 64);
  std::vector<float> q(head_dim), k(head_dim), rq(head_dim), rk(head_dim), rk_rel(head_dim);
  for (std::size_t i = 0; i < head_dim; ++i) {
    q[i] = std::sin(0.3f * i + 0.1f);
    k[i] = std::cos(0.7f * i - 0.2f);
  }
  const std::size_t m = 17, n = 40;
  rope::rotate<rope::Style::rotate_half>(q.data(), rq.data(), table.cos(m), table.sin(m), head_dim);
  rope::rotate<rope::Style::rotate_half>(k.data(), rk.data(), table.cos(n), table.sin(n), head_dim);
  rope::rotate<rope::Style::rotate_half>(k.data(), rk_rel.data(), table.cos(n - m), table.sin(n - m), head_dim);
  double absolute = 0, relative = 0;
  for (std::size_t i = 0; i < head_dim; ++i) {
    absolute += double(rq[i]) * rk[i];
    relative += double(q[i]) * rk_rel[i];
  }
  std::printf("rope %d: <R_m q, R_n k> = %.6f, <q, R_(n-m) k> = %.6f\n", rope::kVersion, absolute, relative);
  if (std::fabs(absolute - relative) >= 1e-4) return 1;
  // Known values: e_p at position m, against cos and sin in double.
  for (const std::size_t p : {0u, 5u, 31u}) {
    for (const std::size_t position : {1u, 17u, 63u}) {
      std::vector<float> e(head_dim, 0.0f), y(head_dim);
      e[p] = 1.0f;
      rope::rotate<rope::Style::rotate_half>(e.data(), y.data(), table.cos(position), table.sin(position), head_dim);
      const double angle = double(position) * std::pow(10000.0, -2.0 * double(p) / double(head_dim));
      if (std::fabs(y[p] - std::cos(angle)) > 1e-6 || std::fabs(y[p + head_dim / 2] - std::sin(angle)) > 1e-6) {
        std::printf("rope: e_%zu at position %zu is (%.7f, %.7f), the closed form (%.7f, %.7f)\n", p, position,
                    double(y[p]), double(y[p + head_dim / 2]), std::cos(angle), std::sin(angle));
        return 1;
      }
    }
  }
  return 0;
}
