// table/scalar/128k and table/double_simd/128k: building the float cos/sin
// table of 131072 positions for rotary_dim 128 (base 500000), once with a
// plain std::cos/std::sin loop in double and once with the rope::Table
// constructor (xsimd batches of double). Both give every entry within 2^-24
// of the exact value; items are table entries, so read the two as a ratio.
#include <benchmark/benchmark.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include <rope/frequencies.hpp>
#include <rope/table.hpp>

namespace {

constexpr std::size_t kPositions = 131072;
constexpr std::size_t kRotaryDim = 128;

void set_counters(benchmark::State& state) {
  state.SetItemsProcessed(state.iterations() * static_cast<std::int64_t>(kPositions * kRotaryDim));
}

void build_scalar(benchmark::State& state) {
  const auto f = rope::frequencies(kRotaryDim, 500000.0);
  const std::size_t pairs = f.inv_freq.size();
  for (auto _ : state) {
    // Allocated per build, as the Table constructor does.
    std::vector<float> data(kPositions * kRotaryDim);
    for (std::size_t m = 0; m < kPositions; ++m) {
      float* c = data.data() + m * kRotaryDim;
      float* s = c + pairs;
      for (std::size_t p = 0; p < pairs; ++p) {
        const double angle = static_cast<double>(m) * f.inv_freq[p];
        c[p] = static_cast<float>(f.attention_factor * std::cos(angle));
        s[p] = static_cast<float>(f.attention_factor * std::sin(angle));
      }
    }
    benchmark::DoNotOptimize(data.data());
    benchmark::ClobberMemory();
  }
  set_counters(state);
}

void build_simd(benchmark::State& state) {
  const auto f = rope::frequencies(kRotaryDim, 500000.0);
  for (auto _ : state) {
    const rope::Table<float> table(f, kPositions);
    benchmark::DoNotOptimize(table.cos(kPositions - 1));
    benchmark::ClobberMemory();
  }
  set_counters(state);
}

const bool kRegistered = [] {
  benchmark::RegisterBenchmark("table/scalar/128k", build_scalar)->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("table/double_simd/128k", build_simd)->Unit(benchmark::kMillisecond);
  return true;
}();

}  // namespace
