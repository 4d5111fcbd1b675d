// attention/<case>/L<n>: one f32 head of d = dv = 64 over L tokens, RoPE on Q
// and K (rotate_half, base 10000), every case causal where it has a mode:
//   softmax_causal  blockwise online softmax (default block)
//   linear          FAVOR+ (m = 256) causal linear attention, chunked
//   linear_eq19     FAVOR+ (m = 256) causal, RoFormer eq. 19 (features rotated over m)
//   qk_gemm         the full L x L product Q K^T in one Eigen GEMM: the
//                   compute ceiling the score part of softmax is read against
// Each case counts L tokens as items, Q, K, V read and the output written as
// bytes, and reports GFLOP/s over the nominal flops of one call (2 per
// multiply-add of the products the algorithm needs; masked-out work that a
// diagonal block still does is not counted).
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstdlib>
#include <string>

#include <rope/attention.hpp>
#include <rope/frequencies.hpp>
#include <rope/table.hpp>

namespace {

using rope::attention::Matrix;

constexpr std::int64_t kHeadDim = 64;
constexpr std::int64_t kValueDim = 64;
constexpr std::int64_t kFeatures = 256;
constexpr std::int64_t kLengths[] = {256, 512, 1024, 2048, 4096};

Matrix<float> inputs(std::int64_t rows, std::int64_t cols, unsigned seed) {
  std::srand(seed);
  // Uniform entries in [-0.5, 0.5] keep FAVOR+ in its well-conditioned range.
  return Matrix<float>::Random(static_cast<Eigen::Index>(rows), static_cast<Eigen::Index>(cols)) * 0.5f;
}

void set_counters(benchmark::State& state, std::int64_t l, double flops) {
  state.SetItemsProcessed(state.iterations() * l);
  state.SetBytesProcessed(state.iterations() * (3 * l * kHeadDim + l * kValueDim) *
                          static_cast<std::int64_t>(sizeof(float)));
  state.counters["GFLOP/s"] = benchmark::Counter(flops * 1e-9 * static_cast<double>(state.iterations()),
                                                 benchmark::Counter::kIsRate);
}

// Multiply-adds of causal prefix products over L tokens: L (L + 1) / 2 pairs.
double causal_pairs(std::int64_t l) { return static_cast<double>(l) * static_cast<double>(l + 1) / 2.0; }

void softmax_causal(benchmark::State& state, std::int64_t l) {
  const rope::Table<float> table(rope::frequencies(kHeadDim, 10000.0), static_cast<std::size_t>(l));
  const Matrix<float> q = inputs(l, kHeadDim, 1), k = inputs(l, kHeadDim, 2), v = inputs(l, kValueDim, 3);
  const rope::attention::Rotation<float> rope{&table, rope::Style::rotate_half};
  rope::attention::SoftmaxOptions o;
  o.causal = true;
  for (auto _ : state) {
    Matrix<float> out = rope::attention::softmax(q, k, v, rope, o);
    benchmark::DoNotOptimize(out.data());
  }
  set_counters(state, l, 2.0 * causal_pairs(l) * (kHeadDim + kValueDim));
}

void qk_gemm(benchmark::State& state, std::int64_t l) {
  const Matrix<float> q = inputs(l, kHeadDim, 1), k = inputs(l, kHeadDim, 2);
  Matrix<float> scores(static_cast<Eigen::Index>(l), static_cast<Eigen::Index>(l));
  for (auto _ : state) {
    scores.noalias() = q * k.transpose();
    benchmark::DoNotOptimize(scores.data());
  }
  set_counters(state, l, 2.0 * static_cast<double>(l) * static_cast<double>(l) * kHeadDim);
}

// Features of Q and K (2 L m d), then per token the carried state read and
// updated (2 x L m dv, plus L m for z) and the within-chunk products
// (L chunk (m + dv) on average); eq. 19 adds the unrotated denominator
// product within chunks (L chunk m / 2) and rotates 2 L m features.
double linear_flops(std::int64_t l, bool eq19) {
  const double L = static_cast<double>(l), m = kFeatures, d = kHeadDim, dv = kValueDim;
  const double chunk = static_cast<double>(rope::attention::LinearOptions{}.chunk);
  double f = 2.0 * 2.0 * L * m * d + 2.0 * (2.0 * L * m * dv + L * m) + 2.0 * L * chunk / 2.0 * (m + dv);
  if (eq19) f += 2.0 * L * chunk / 2.0 * m + 2.0 * 3.0 * L * m;
  return f;
}

void linear_causal(benchmark::State& state, std::int64_t l, bool eq19) {
  const rope::Table<float> table(rope::frequencies(kHeadDim, 10000.0), static_cast<std::size_t>(l));
  const rope::Table<float> feature_table(rope::frequencies(kFeatures, 10000.0), static_cast<std::size_t>(l));
  const Matrix<float> q = inputs(l, kHeadDim, 1), k = inputs(l, kHeadDim, 2), v = inputs(l, kValueDim, 3);
  rope::attention::FavorOptions fo;
  fo.features = kFeatures;
  const rope::attention::FavorFeatures phi(kHeadDim, fo);
  rope::attention::LinearOptions o;
  o.causal = true;
  for (auto _ : state) {
    Matrix<float> out =
        eq19 ? rope::attention::linear_eq19(q, k, v, phi, {&feature_table, rope::Style::rotate_half}, o)
             : rope::attention::linear(q, k, v, phi, o, {&table, rope::Style::rotate_half});
    benchmark::DoNotOptimize(out.data());
  }
  set_counters(state, l, linear_flops(l, eq19));
}

const bool kRegistered = [] {
  for (const std::int64_t l : kLengths) {
    const std::string suffix = "/L" + std::to_string(l);
    benchmark::RegisterBenchmark(("attention/softmax_causal" + suffix).c_str(), softmax_causal, l)
        ->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(("attention/linear" + suffix).c_str(), linear_causal, l, false)
        ->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(("attention/linear_eq19" + suffix).c_str(), linear_causal, l, true)
        ->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(("attention/qk_gemm" + suffix).c_str(), qk_gemm, l)
        ->Unit(benchmark::kMillisecond);
  }
  return true;
}();

}  // namespace
