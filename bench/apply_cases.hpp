// The cases of the apply family, shared by rope_bench's translation units:
// bench_apply.cpp (built with -march=native, like every other bench source)
// and baseline.cpp (built with the flags a user's program has, alone with
// rope::dispatch). Everything here is in an anonymous namespace on purpose:
// each translation unit compiles its own copy with its own flags, so the
// case run from baseline.cpp really is baseline code (and rope::apply's
// Arch template argument, xsimd::default_arch, keeps the two rope::apply_qk
// instantiations apart).
#pragma once

#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <rope/apply.hpp>

#include "shapes.hpp"

namespace {

using rope_bench::Shape;

struct QkShape {
  Shape q;              // tokens, query heads, head_dim, rotary_dim
  std::size_t k_heads;  // key heads (grouped-query attention)
  std::int64_t first_position;

  std::size_t elements() const { return q.tokens * (q.heads + k_heads) * q.head_dim; }
};

// 4096 prompt tokens at positions 0 .. 4095 (80 MiB of f32 Q+K).
constexpr QkShape kPrefill{{"llama3_8b_prefill", 4096, 32, 128, 128}, 8, 0};
// One new token at position 4000 of the KV cache (20 KiB of f32 Q+K).
constexpr QkShape kDecode{{"llama3_8b_decode", 1, 32, 128, 128}, 8, 4000};

enum class Placement { in_place, out_of_place, out_of_place_cached, out_of_place_streaming };

const char* name(Placement p) {
  switch (p) {
    case Placement::in_place: return "in_place";
    case Placement::out_of_place: return "out_of_place";
    case Placement::out_of_place_cached: return "out_of_place_cached";
    default: return "out_of_place_streaming";
  }
}

// A tensor starting on a 64-byte boundary, as an engine's allocator gives.
template <class T>
class Tensor {
 public:
  explicit Tensor(std::size_t n, bool random = true) : storage_(n + 64 / sizeof(T)), size_(n) {
    const auto address = reinterpret_cast<std::uintptr_t>(storage_.data());
    data_ = storage_.data() + ((64 - address % 64) % 64) / sizeof(T);
    std::mt19937 gen(42);
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    for (std::size_t i = 0; i < n; ++i) data_[i] = T(random ? dist(gen) : 0.0f);
  }
  T* data() { return data_; }
  const T* data() const { return data_; }
  std::size_t size() const { return size_; }

 private:
  std::vector<T> storage_;
  std::size_t size_;
  T* data_;
};

// Bytes of one pass: Q and K read once and written once.
template <class T>
void set_bytes(benchmark::State& state, const QkShape& shape) {
  state.SetBytesProcessed(state.iterations() * static_cast<std::int64_t>(2 * shape.elements() * sizeof(T)));
}

template <class T>
void apply_case(benchmark::State& state, QkShape shape, Placement placement, std::size_t threads) {
  const rope::Table<float> table(rope::frequencies(shape.q.rotary_dim, 500000.0), 8192);
  const std::size_t tokens = shape.q.tokens, d = shape.q.head_dim;
  Tensor<T> q(tokens * shape.q.heads * d), k(tokens * shape.k_heads * d);
  Tensor<T> q_out(placement == Placement::in_place ? 0 : q.size(), false);
  Tensor<T> k_out(placement == Placement::in_place ? 0 : k.size(), false);
  std::vector<std::int64_t> positions(tokens);
  for (std::size_t t = 0; t < tokens; ++t) positions[t] = shape.first_position + static_cast<std::int64_t>(t);
  rope::Options options;
  options.threads = threads;
  if (placement == Placement::out_of_place_cached) options.stores = rope::Stores::cached;
  if (placement == Placement::out_of_place_streaming) options.stores = rope::Stores::streaming;
  const auto qv = rope::View<T>::token_major(q.data(), tokens, shape.q.heads, d);
  const auto kv = rope::View<T>::token_major(k.data(), tokens, shape.k_heads, d);
  for (auto _ : state) {
    if (placement == Placement::in_place) {
      rope::apply_qk(qv, kv, table, rope::Style::rotate_half, positions.data(), options);
    } else {
      rope::apply_qk(qv, kv, rope::View<T>::token_major(q_out.data(), tokens, shape.q.heads, d),
                     rope::View<T>::token_major(k_out.data(), tokens, shape.k_heads, d), table,
                     rope::Style::rotate_half, positions.data(), options);
    }
    benchmark::DoNotOptimize(q.data());
    benchmark::DoNotOptimize(q_out.data());
    benchmark::ClobberMemory();
  }
  set_bytes<T>(state, shape);
}

// The same bytes as apply_case moved by memcpy, the tokens split across
// threads the way apply splits them.
template <class T>
void memcpy_case(benchmark::State& state, QkShape shape, std::size_t threads) {
  const Tensor<T> q(shape.q.tokens * shape.q.heads * shape.q.head_dim);
  const Tensor<T> k(shape.q.tokens * shape.k_heads * shape.q.head_dim);
  Tensor<T> q_out(q.size(), false), k_out(k.size(), false);
  const std::size_t workers = std::min(threads, shape.q.tokens);
  auto copy = [&](std::size_t w) {
    const auto part = [&](const Tensor<T>& from, Tensor<T>& to) {
      const std::size_t begin = from.size() / shape.q.tokens * (shape.q.tokens * w / workers);
      const std::size_t end = from.size() / shape.q.tokens * (shape.q.tokens * (w + 1) / workers);
      std::memcpy(to.data() + begin, from.data() + begin, (end - begin) * sizeof(T));
    };
    part(q, q_out);
    part(k, k_out);
  };
  for (auto _ : state) {
    std::vector<std::thread> pool;
    for (std::size_t w = 1; w < workers; ++w) pool.emplace_back(copy, w);
    copy(0);
    for (auto& t : pool) t.join();
    benchmark::DoNotOptimize(q_out.data());
    benchmark::ClobberMemory();
  }
  set_bytes<T>(state, shape);
}

}  // namespace
