// Converting a checkpoint between the two pairings. A model trained with
// block_diagonal pairs (2p, 2p+1) runs unchanged with rotate_half kernels
// (p, p + r/2) once the rows of its Q and K projections are permuted:
// every attention score stays the same. Exits 1 unless it does.
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include <rope/rope.hpp>

namespace {

constexpr std::size_t kHeads = 4, kHeadDim = 32, kHidden = 48;

// y = W x for a row-major [heads * head_dim, hidden] weight.
std::vector<double> project(const std::vector<double>& w, const std::vector<double>& x) {
  std::vector<double> y(kHeads * kHeadDim, 0.0);
  for (std::size_t r = 0; r < y.size(); ++r) {
    for (std::size_t c = 0; c < kHidden; ++c) y[r] += w[r * kHidden + c] * x[c];
  }
  return y;
}

// Per-head scores of a query at position m against a key at position n.
std::vector<double> scores(const std::vector<double>& wq, const std::vector<double>& wk, const std::vector<double>& x,
                           const std::vector<double>& y, const rope::Table<double>& table, rope::Style style,
                           std::size_t m, std::size_t n) {
  std::vector<double> q = project(wq, x), k = project(wk, y);
  rope::apply(rope::View<double>::token_major(q.data(), 1, kHeads, kHeadDim), table, style, m);
  rope::apply(rope::View<double>::token_major(k.data(), 1, kHeads, kHeadDim), table, style, n);
  std::vector<double> s(kHeads, 0.0);
  for (std::size_t h = 0; h < kHeads; ++h) {
    for (std::size_t c = 0; c < kHeadDim; ++c) s[h] += q[h * kHeadDim + c] * k[h * kHeadDim + c];
  }
  return s;
}

}  // namespace

int main() {
  std::mt19937 gen(3);
  std::normal_distribution<double> normal;
  std::vector<double> wq(kHeads * kHeadDim * kHidden), wk(wq.size()), x(kHidden), y(kHidden);
  for (auto* v : {&wq, &wk, &x, &y}) {
    for (auto& e : *v) e = normal(gen);
  }
  const rope::Table<double> table(rope::frequencies(kHeadDim), 1024);

  // The checkpoint as trained: block_diagonal.
  const auto before = scores(wq, wk, x, y, table, rope::Style::block_diagonal, 700, 123);
  // Converted: permute the projection rows once, then use rotate_half.
  auto wq_half = wq, wk_half = wk;
  rope::permute_to_rotate_half(wq_half.data(), kHeads, kHeadDim, kHidden);
  rope::permute_to_rotate_half(wk_half.data(), kHeads, kHeadDim, kHidden);
  const auto after = scores(wq_half, wk_half, x, y, table, rope::Style::rotate_half, 700, 123);
  // And back again: the weights return bit for bit.
  rope::permute_to_block_diagonal(wq_half.data(), kHeads, kHeadDim, kHidden);
  const bool round_trip = wq_half == wq;

  double worst = 0;
  for (std::size_t h = 0; h < kHeads; ++h) {
    std::printf("head %zu: block_diagonal score %+.12f, converted rotate_half score %+.12f\n", h, before[h], after[h]);
    worst = std::fmax(worst, std::fabs(before[h] - after[h]) / (1 + std::fabs(before[h])));
  }
  std::printf("max relative difference %.2e; weights restored exactly: %s\n", worst, round_trip ? "yes" : "no");
  return worst < 1e-12 && round_trip ? 0 : 1;
}
