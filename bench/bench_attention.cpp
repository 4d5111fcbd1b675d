// attention/...: the multi-head attention calls of an inference engine, f32,
// RoPE on Q and K (rotate_half), rope::View tensors [tokens, heads, d]:
//   prefill/softmax/T<n>      causal softmax, 32 query / 8 key-value heads,
//                             d = 128, L = 1024, on n threads; T1 also
//                             timed against gemm_same_flops in the same
//                             iterations (counter vs_gemm, paired.hpp)
//   prefill/gemm_same_flops   bare Eigen GEMMs doing the same multiply-adds
//                             (per key/value head: [4L x d] x [d x L/2] and
//                             [4L x L/2] x [L/2 x d]): the compute ceiling
//   decode/softmax            one query token against a KV cache of 4096
//                             rotated keys (keys_rotated), 32/8 heads, d = 128
//   decode/softmax_step       the same step through the serving path over a
//                             contiguous cache (plan, append, attend): the
//                             new token's K rotated and written first
//   decode/memcpy_kv          memcpy of the K and V cache bytes: the memory
//                             limit a decode step is read against
//   scaling/softmax/L<n>      causal softmax, 8 heads of d = 64
//   scaling/linear_eq19/L<n>  causal FAVOR+ (m = 256) RoFormer eq. 19, 8 heads
//   scaling/linear/L<n>       causal FAVOR+ (m = 256), pre-phi RoPE, 8 heads
// GFLOP/s counts the multiply-adds the algorithm needs (2 flops each); the
// causal count is L (L + 1) / 2 query-key pairs.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <rope/attention.hpp>

#include "paired.hpp"

namespace {

namespace ra = rope::attention;

std::vector<float> random_tensor(std::size_t n, std::uint32_t seed, float scale = 0.5f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(-scale, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(gen);
  return v;
}

double causal_pairs(std::size_t l) { return double(l) * double(l + 1) / 2.0; }

void set_gflops(benchmark::State& state, double flops) {
  state.counters["GFLOP/s"] =
      benchmark::Counter(flops * 1e-9 * static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
}

// Llama-3-8B attention shape.
constexpr std::size_t kQHeads = 32, kKvHeads = 8, kHeadDim = 128;
constexpr std::size_t kPrefill = 1024, kCache = 4096;

// The bare GEMMs of prefill_gemm: per key/value head, the scores of its 4
// query heads' rows against half the keys (the causal count), then those
// scores times the values.
struct PrefillGemm {
  const std::size_t group = kQHeads / kKvHeads;
  const Eigen::Index rows = static_cast<Eigen::Index>(group * kPrefill), half = static_cast<Eigen::Index>(kPrefill / 2),
                     d = static_cast<Eigen::Index>(kHeadDim);
  const ra::Matrix<float> q = ra::Matrix<float>::Random(rows, d), k = ra::Matrix<float>::Random(half, d),
                          v = ra::Matrix<float>::Random(half, d);
  ra::Matrix<float> s = ra::Matrix<float>(rows, half), out = ra::Matrix<float>(rows, d);

  double flops() const { return 2.0 * 2.0 * double(rows) * double(half) * double(d) * kKvHeads; }
  void operator()() {
    for (std::size_t g = 0; g < kKvHeads; ++g) {
      s.noalias() = q * k.transpose();
      out.noalias() = s * v;
      benchmark::DoNotOptimize(out.data());
    }
  }
};

// On one thread timed against the bare GEMMs in the same iterations
// (paired.hpp): counter vs_gemm, its GFLOP/s over theirs.
void prefill_softmax(benchmark::State& state, std::size_t threads) {
  const std::size_t l = kPrefill;
  const rope::Table<float> table(rope::frequencies(kHeadDim, 500000.0), l);
  auto q = random_tensor(l * kQHeads * kHeadDim, 1), k = random_tensor(l * kKvHeads * kHeadDim, 2),
       v = random_tensor(l * kKvHeads * kHeadDim, 3);
  std::vector<float> out(q.size());
  ra::SoftmaxOptions o;
  o.mask.causal = true;
  o.threads = threads;
  const ra::Rotation<float> rotation{&table, rope::Style::rotate_half};
  const auto run = [&] {
    ra::softmax<float>(rope::View<const float>::token_major(q.data(), l, kQHeads, kHeadDim),
                       rope::View<const float>::token_major(k.data(), l, kKvHeads, kHeadDim),
                       rope::View<const float>::token_major(v.data(), l, kKvHeads, kHeadDim),
                       rope::View<float>::token_major(out.data(), l, kQHeads, kHeadDim), rotation, o);
    benchmark::DoNotOptimize(out.data());
  };
  const double flops = 2.0 * causal_pairs(l) * 2.0 * kHeadDim * kQHeads;
  if (threads == 1) {
    PrefillGemm gemm;
    rope_bench::paired(state, "vs_gemm", 1, gemm, run);
    state.counters["vs_gemm"] = state.counters["vs_gemm"] * flops / gemm.flops();
  } else {
    for (auto _ : state) run();
  }
  set_gflops(state, flops);
}

void prefill_gemm(benchmark::State& state) {
  PrefillGemm gemm;
  for (auto _ : state) gemm();
  set_gflops(state, gemm.flops());
}

struct DecodeCase {
  rope::Table<float> table{rope::frequencies(kHeadDim, 500000.0), kCache};
  std::vector<float> q = random_tensor(kQHeads * kHeadDim, 4), k_new = random_tensor(kKvHeads * kHeadDim, 5),
                     v_new = random_tensor(kKvHeads * kHeadDim, 6),
                     k_cache = random_tensor(kCache * kKvHeads * kHeadDim, 7),
                     v_cache = random_tensor(kCache * kKvHeads * kHeadDim, 8), out = std::vector<float>(q.size());
};

void set_cache_bytes(benchmark::State& state) {
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) *
                          static_cast<std::int64_t>(2 * kCache * kKvHeads * kHeadDim * sizeof(float)));
}

void decode_softmax(benchmark::State& state) {
  DecodeCase c;
  ra::SoftmaxOptions o;
  o.mask.causal = true;
  o.keys_rotated = true;
  o.q_offset = kCache - 1;
  const ra::Rotation<float> rotation{&c.table, rope::Style::rotate_half};
  for (auto _ : state) {
    ra::softmax<float>(rope::View<const float>::token_major(c.q.data(), 1, kQHeads, kHeadDim),
                       rope::View<const float>::token_major(c.k_cache.data(), kCache, kKvHeads, kHeadDim),
                       rope::View<const float>::token_major(c.v_cache.data(), kCache, kKvHeads, kHeadDim),
                       rope::View<float>::token_major(c.out.data(), 1, kQHeads, kHeadDim), rotation, o);
    benchmark::DoNotOptimize(c.out.data());
  }
  set_cache_bytes(state);
}

// The decode step of one sequence over a contiguous cache through the
// serving path (what softmax_step did in one call): the step planned, the
// new token's K rotated and written into the cache and Q rotated (append),
// then attend over the cache.
void decode_softmax_step(benchmark::State& state) {
  DecodeCase c;
  const ra::PagedCache<float> cache =
      ra::PagedCache<float>::contiguous(rope::View<float>::token_major(c.k_cache.data(), kCache, kKvHeads, kHeadDim),
                                        rope::View<float>::token_major(c.v_cache.data(), kCache, kKvHeads, kHeadDim));
  ra::AppendOptions ao;
  ao.rotation = {&c.table, rope::Style::rotate_half};
  std::vector<float> q_rotated(c.q.size());
  const auto q_out = rope::View<float>::token_major(q_rotated.data(), 1, kQHeads, kHeadDim);
  ra::Plan plan;
  for (auto _ : state) {
    ra::plan(plan, ra::Shape::of(cache, kQHeads), kCache - 1, 1);
    ra::append(plan, cache, rope::View<const float>::token_major(c.q.data(), 1, kQHeads, kHeadDim),
               rope::View<const float>::token_major(c.k_new.data(), 1, kKvHeads, kHeadDim),
               rope::View<const float>::token_major(c.v_new.data(), 1, kKvHeads, kHeadDim), q_out, ao);
    ra::attend(plan, cache, q_out, rope::View<float>::token_major(c.out.data(), 1, kQHeads, kHeadDim));
    benchmark::DoNotOptimize(c.out.data());
  }
  set_cache_bytes(state);
}

void decode_memcpy(benchmark::State& state) {
  DecodeCase c;
  std::vector<float> k_copy(c.k_cache.size()), v_copy(c.v_cache.size());
  for (auto _ : state) {
    std::memcpy(k_copy.data(), c.k_cache.data(), c.k_cache.size() * sizeof(float));
    std::memcpy(v_copy.data(), c.v_cache.data(), c.v_cache.size() * sizeof(float));
    benchmark::DoNotOptimize(k_copy.data());
    benchmark::DoNotOptimize(v_copy.data());
  }
  set_cache_bytes(state);
}

// The length sweep: 8 heads of d = 64 (dv = 64), FAVOR+ with m = 256.
constexpr std::size_t kSweepHeads = 8, kSweepDim = 64, kFeatures = 256;
constexpr std::size_t kLengths[] = {1024, 2048, 4096, 8192};

enum class Sweep { softmax, linear_eq19, linear };

// Multiply-adds of linear attention per token and head: features of q and k
// (2 m d), reading and updating the carried sums (2 m dv + m), and the
// within-chunk products (chunk/2 (m + dv) on average, eq. 19 adds the
// unrotated denominator's chunk/2 m).
double linear_flops(std::size_t l, bool eq19) {
  const double m = kFeatures, d = kSweepDim, dv = kSweepDim;
  const double chunk = static_cast<double>(ra::LinearOptions{}.chunk);
  double per_token = 2.0 * m * d + 2.0 * m * dv + m + chunk / 2.0 * (m + dv);
  if (eq19) per_token += chunk / 2.0 * m;
  return 2.0 * per_token * double(l) * kSweepHeads;
}

void sweep(benchmark::State& state, Sweep kind, std::size_t l) {
  const std::size_t h = kSweepHeads, d = kSweepDim;
  const rope::Table<float> table(rope::frequencies(d, 10000.0), l);
  const rope::Table<float> feature_table(rope::frequencies(kFeatures, 10000.0), l);
  auto q = random_tensor(l * h * d, 11), k = random_tensor(l * h * d, 12), v = random_tensor(l * h * d, 13);
  std::vector<float> out(q.size());
  const auto qv = rope::View<const float>::token_major(q.data(), l, h, d);
  const auto kv = rope::View<const float>::token_major(k.data(), l, h, d);
  const auto vv = rope::View<const float>::token_major(v.data(), l, h, d);
  const auto ov = rope::View<float>::token_major(out.data(), l, h, d);
  ra::FavorOptions fo;
  fo.features = kFeatures;
  const ra::FavorFeatures phi(d, fo);
  ra::SoftmaxOptions so;
  so.mask.causal = true;
  ra::LinearOptions lo;
  lo.mask.causal = true;
  for (auto _ : state) {
    switch (kind) {
      case Sweep::softmax: ra::softmax<float>(qv, kv, vv, ov, {&table, rope::Style::rotate_half}, so); break;
      case Sweep::linear_eq19:
        ra::linear_eq19<float>(qv, kv, vv, ov, phi, {&feature_table, rope::Style::rotate_half}, lo);
        break;
      case Sweep::linear: ra::linear<float>(qv, kv, vv, ov, phi, lo, {&table, rope::Style::rotate_half}); break;
    }
    benchmark::DoNotOptimize(out.data());
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * l));
  set_gflops(state, kind == Sweep::softmax ? 2.0 * causal_pairs(l) * 2.0 * d * h
                                           : linear_flops(l, kind == Sweep::linear_eq19));
}

const bool kRegistered = [] {
  for (const std::size_t threads : {std::size_t{1}, std::size_t{2}}) {
    auto* b = benchmark::RegisterBenchmark(("attention/prefill/softmax/T" + std::to_string(threads)).c_str(),
                                           prefill_softmax, threads)
                  ->Unit(benchmark::kMillisecond);
    if (threads == 1) {
      b->UseManualTime();
    } else {
      b->UseRealTime();
    }
  }
  benchmark::RegisterBenchmark("attention/prefill/gemm_same_flops", prefill_gemm)
      ->Unit(benchmark::kMillisecond)
      ->UseRealTime();
  benchmark::RegisterBenchmark("attention/decode/softmax", decode_softmax)
      ->Unit(benchmark::kMicrosecond)
      ->UseRealTime();
  benchmark::RegisterBenchmark("attention/decode/softmax_step", decode_softmax_step)
      ->Unit(benchmark::kMicrosecond)
      ->UseRealTime();
  benchmark::RegisterBenchmark("attention/decode/memcpy_kv", decode_memcpy)
      ->Unit(benchmark::kMicrosecond)
      ->UseRealTime();
  for (const std::size_t l : kLengths) {
    const std::string suffix = "/L" + std::to_string(l);
    benchmark::RegisterBenchmark(("attention/scaling/softmax" + suffix).c_str(), sweep, Sweep::softmax, l)
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime();
    benchmark::RegisterBenchmark(("attention/scaling/linear_eq19" + suffix).c_str(), sweep, Sweep::linear_eq19, l)
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime();
    benchmark::RegisterBenchmark(("attention/scaling/linear" + suffix).c_str(), sweep, Sweep::linear, l)
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime();
  }
  return true;
}();

}  // namespace
