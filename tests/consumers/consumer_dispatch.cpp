// The program consumer projects build against rope::dispatch, with their own
// (baseline) flags: it fails (exit 1) unless dispatch installs an
// instruction set this CPU runs and rope::apply, run through it, gives the
// closed form at a few positions (e_p at position m -> cos(m theta_p) e_p +
// sin(m theta_p) e_(p + r/2)) and keeps the relative-position property
// <R_m q, R_n k> = <q, R_(n-m) k>.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include <rope/dispatch.hpp>
#include <rope/rope.hpp>

int main() {
  const std::string arch = rope::dispatch::install();
  const auto available = rope::dispatch::available();
  if (std::find(available.begin(), available.end(), arch) == available.end()) return 1;

  constexpr std::size_t head_dim = 128;
  const rope::Table<float> table(rope::frequencies(head_dim), 64);
  std::vector<float> q(head_dim), k(head_dim);
  for (std::size_t i = 0; i < head_dim; ++i) {
    q[i] = std::sin(0.3f * i + 0.1f);
    k[i] = std::cos(0.7f * i - 0.2f);
  }
  const auto rotated = [&](std::vector<float> x, std::int64_t position) {
    rope::apply(rope::View<float>::token_major(x.data(), 1, 1, head_dim), table, rope::Style::rotate_half, position);
    return x;
  };
  const std::int64_t m = 17, n = 40;
  const auto rq = rotated(q, m), rk = rotated(k, n), rk_rel = rotated(k, n - m);
  double absolute = 0, relative = 0;
  for (std::size_t i = 0; i < head_dim; ++i) {
    absolute += double(rq[i]) * rk[i];
    relative += double(q[i]) * rk_rel[i];
  }
  std::printf("rope::dispatch runs %s: <R_m q, R_n k> = %.6f, <q, R_(n-m) k> = %.6f\n", arch.c_str(), absolute,
              relative);
  if (std::fabs(absolute - relative) >= 1e-4) return 1;
  for (const std::size_t p : {0u, 9u, 63u}) {
    for (const std::int64_t position : {1, 17, 63}) {
      std::vector<float> e(head_dim, 0.0f);
      e[p] = 1.0f;
      const auto y = rotated(e, position);
      const double angle = double(position) * std::pow(10000.0, -2.0 * double(p) / double(head_dim));
      if (std::fabs(y[p] - std::cos(angle)) > 1e-6 || std::fabs(y[p + head_dim / 2] - std::sin(angle)) > 1e-6) {
        std::printf("rope::dispatch: e_%zu at position %lld differs from the closed form\n", p,
                    static_cast<long long>(position));
        return 1;
      }
    }
  }
  return 0;
}
