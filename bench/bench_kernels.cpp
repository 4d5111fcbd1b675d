// kernel/<pairing>/<simd|reference>/<shape> and kernel/-/memcpy/<shape>:
// the row kernel applied to every head of every token of a [tokens, heads,
// head_dim] tensor, out of place, next to a memcpy of the same bytes and the
// scalar reference built with the same flags. Read the figures as ratios of
// bytes per second from one run.
#include <benchmark/benchmark.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <rope/kernels.hpp>
#include <rope/reference.hpp>
#include <rope/table.hpp>

#include "shapes.hpp"

namespace {

using rope::Style;
using rope_bench::Shape;

std::vector<float> random_tensor(std::size_t n) {
  std::mt19937 gen(42);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(gen);
  return v;
}

// Bytes a pass moves: every element read once and written once.
void set_counters(benchmark::State& state, const Shape& shape) {
  const auto n = static_cast<std::int64_t>(shape.elements());
  state.SetBytesProcessed(state.iterations() * n * 2 * static_cast<std::int64_t>(sizeof(float)));
  state.SetItemsProcessed(state.iterations() * n / 2);  // pairs rotated
}

enum class Impl { simd, reference };

template <Style S, Impl I>
void rotate_tensor(benchmark::State& state, Shape shape) {
  const rope::Table<float> table(rope::frequencies(shape.rotary_dim), shape.tokens);
  const auto x = random_tensor(shape.elements());
  std::vector<float> y(x.size());
  for (auto _ : state) {
    for (std::size_t t = 0; t < shape.tokens; ++t) {
      const float* cos = table.cos(t);
      const float* sin = table.sin(t);
      for (std::size_t h = 0; h < shape.heads; ++h) {
        const std::size_t row = (t * shape.heads + h) * shape.head_dim;
        if (I == Impl::simd) {
          rope::rotate<S>(x.data() + row, y.data() + row, cos, sin, shape.rotary_dim);
        } else {
          rope::reference::rotate<S>(x.data() + row, y.data() + row, cos, sin, shape.rotary_dim);
        }
      }
    }
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  set_counters(state, shape);
}

void copy_tensor(benchmark::State& state, Shape shape) {
  const auto x = random_tensor(shape.elements());
  std::vector<float> y(x.size());
  for (auto _ : state) {
    std::memcpy(y.data(), x.data(), x.size() * sizeof(float));
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  set_counters(state, shape);
}

template <Style S>
void register_style(const Shape& shape) {
  const std::string style = rope::name(S);
  benchmark::RegisterBenchmark(("kernel/" + style + "/simd/" + shape.name).c_str(),
                               rotate_tensor<S, Impl::simd>, shape);
  benchmark::RegisterBenchmark(("kernel/" + style + "/reference/" + shape.name).c_str(),
                               rotate_tensor<S, Impl::reference>, shape);
}

const bool registered = [] {
  for (const Shape& shape : {rope_bench::kL2Small, rope_bench::kEncoderSmall,
                             rope_bench::kLlama3Prefill}) {
    register_style<Style::rotate_half>(shape);
    register_style<Style::block_diagonal>(shape);
    benchmark::RegisterBenchmark((std::string("kernel/-/memcpy/") + shape.name).c_str(), copy_tensor,
                                 shape);
  }
  return true;
}();

}  // namespace
