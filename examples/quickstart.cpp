// Quick start: rotate a query and a key of a toy model and watch the
// relative-position property at work. Shifting both positions by the same
// offset changes every rotated vector but not their dot product, because
// <R_m q, R_n k> = <q, R_(n-m) k> depends on n - m alone. It exits 1 unless
// each score equals the closed form of the rotated dot product,
//   sum_p (q_a k_a + q_b k_b) cos(t theta_p) + (q_b k_a - q_a k_b) sin(t theta_p),
// t = n - m, over the pairs (a, b) = (p, p + 4), computed here in double.
#include <cmath>
#include <cstdio>
#include <vector>

#include <rope/rope.hpp>

namespace {

constexpr std::size_t kHeadDim = 8;  // a toy head: four rotated pairs

double dot(const std::vector<float>& a, const std::vector<float>& b) {
  double sum = 0;
  for (std::size_t i = 0; i < a.size(); ++i) sum += double(a[i]) * b[i];
  return sum;
}

// The query at position m and the key at position n, both rotated.
double rotated_score(const rope::Table<float>& table, const std::vector<float>& q, const std::vector<float>& k,
                     std::size_t m, std::size_t n) {
  std::vector<float> rq(kHeadDim), rk(kHeadDim);
  rope::rotate<rope::Style::rotate_half>(q.data(), rq.data(), table.cos(m), table.sin(m), kHeadDim);
  rope::rotate<rope::Style::rotate_half>(k.data(), rk.data(), table.cos(n), table.sin(n), kHeadDim);
  return dot(rq, rk);
}

// The rotated score from the math alone, for offset t = n - m.
double closed_form(const std::vector<float>& q, const std::vector<float>& k, double t) {
  double sum = 0;
  for (std::size_t p = 0; p < kHeadDim / 2; ++p) {
    const std::size_t a = p, b = p + kHeadDim / 2;
    const double theta = std::pow(10000.0, -2.0 * double(p) / double(kHeadDim));
    sum += (double(q[a]) * k[a] + double(q[b]) * k[b]) * std::cos(t * theta) +
           (double(q[b]) * k[a] - double(q[a]) * k[b]) * std::sin(t * theta);
  }
  return sum;
}

}  // namespace

int main() {
  // theta_p = 10000^(-2p/8); a table of 10000 positions, angles exact in double.
  const rope::Table<float> table(rope::frequencies(kHeadDim), 10000);

  const std::vector<float> q = {0.5f, -1.0f, 0.25f, 2.0f, 1.5f, 0.0f, -0.75f, 1.0f};
  const std::vector<float> k = {1.0f, 0.5f, -0.5f, 1.0f, 0.25f, -2.0f, 1.0f, 0.5f};

  std::printf("unrotated <q, k>             = %+.6f\n", dot(q, k));
  std::printf("query at m, key at n = m + 3:\n");
  for (std::size_t m : {0u, 10u, 500u, 9000u}) {
    std::printf("  m = %4zu, n = %4zu: <R_m q, R_n k> = %+.6f\n", m, m + 3, rotated_score(table, q, k, m, m + 3));
  }
  std::printf("same positions, key at n = m + 7 instead:\n");
  for (std::size_t m : {0u, 10u, 500u, 9000u}) {
    std::printf("  m = %4zu, n = %4zu: <R_m q, R_n k> = %+.6f\n", m, m + 7, rotated_score(table, q, k, m, m + 7));
  }
  // Every score above against the closed form (float rounding: 1e-5).
  for (std::size_t offset : {3u, 7u}) {
    for (std::size_t m : {0u, 10u, 500u, 9000u}) {
      const double got = rotated_score(table, q, k, m, m + offset), want = closed_form(q, k, double(offset));
      if (std::fabs(got - want) > 1e-5) {
        std::printf("m = %zu, offset %zu: %+.6f differs from the closed form %+.6f\n", m, offset, got, want);
        return 1;
      }
    }
  }
  std::printf("every score equals the closed form of <q, R_(n-m) k>\n");
  return 0;
}
