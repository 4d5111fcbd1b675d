// Quick start: rotate a query and a key of a toy model and watch the
// relative-position property at work. Shifting both positions by the same
// offset changes every rotated vector but not their dot product, because
// <R_m q, R_n k> = <q, R_(n-m) k> depends on n - m alone.
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
double rotated_score(const rope::Table<float>& table, const std::vector<float>& q,
                     const std::vector<float>& k, std::size_t m, std::size_t n) {
  std::vector<float> rq(kHeadDim), rk(kHeadDim);
  rope::rotate<rope::Style::rotate_half>(q.data(), rq.data(), table.cos(m), table.sin(m), kHeadDim);
  rope::rotate<rope::Style::rotate_half>(k.data(), rk.data(), table.cos(n), table.sin(n), kHeadDim);
  return dot(rq, rk);
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
    std::printf("  m = %4zu, n = %4zu: <R_m q, R_n k> = %+.6f\n", m, m + 3,
                rotated_score(table, q, k, m, m + 3));
  }
  std::printf("same positions, key at n = m + 7 instead:\n");
  for (std::size_t m : {0u, 10u, 500u, 9000u}) {
    std::printf("  m = %4zu, n = %4zu: <R_m q, R_n k> = %+.6f\n", m, m + 7,
                rotated_score(table, q, k, m, m + 7));
  }
  return 0;
}
