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

#include "paired.hpp"
#include "shapes.hpp"

namespace rope_bench {

// rope::apply_qk as the -march=native build compiles it (bench_apply.cpp),
// for the dispatched cases of baseline.cpp to be timed against: in place
// when q_out is null.
template <class T>
void native_apply_qk(rope::View<T> q, rope::View<T> k, T* q_out, T* k_out, const rope::Table<float>& table,
                     const std::int64_t* positions, const rope::Options& options);

}  // namespace rope_bench

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

// What one apply case rotates: Q and K (and their outputs out of place),
// positions, options.
template <class T>
struct QkCall {
  QkShape shape;
  Placement placement;
  rope::Table<float> table;
  Tensor<T> q, k, q_out, k_out;
  std::vector<std::int64_t> positions;
  rope::Options options;

  QkCall(const QkShape& s, Placement p, std::size_t threads)
      : shape(s),
        placement(p),
        table(rope::frequencies(s.q.rotary_dim, 500000.0), 8192),
        q(s.q.tokens * s.q.heads * s.q.head_dim),
        k(s.q.tokens * s.k_heads * s.q.head_dim),
        q_out(p == Placement::in_place ? 0 : q.size(), false),
        k_out(p == Placement::in_place ? 0 : k.size(), false),
        positions(s.q.tokens) {
    for (std::size_t t = 0; t < s.q.tokens; ++t) positions[t] = s.first_position + static_cast<std::int64_t>(t);
    options.threads = threads;
    if (p == Placement::out_of_place_cached) options.stores = rope::Stores::cached;
    if (p == Placement::out_of_place_streaming) options.stores = rope::Stores::streaming;
  }

  // The same call through the native build (bench_apply.cpp).
  void native() {
    const std::size_t tokens = shape.q.tokens, d = shape.q.head_dim;
    const bool in_place = placement == Placement::in_place;
    rope_bench::native_apply_qk(rope::View<T>::token_major(q.data(), tokens, shape.q.heads, d),
                                rope::View<T>::token_major(k.data(), tokens, shape.k_heads, d),
                                in_place ? nullptr : q_out.data(), in_place ? nullptr : k_out.data(), table,
                                positions.data(), options);
    benchmark::DoNotOptimize(q_out.data());
    benchmark::ClobberMemory();
  }

  // rope::apply_qk as compiled in this translation unit.
  void operator()() {
    const std::size_t tokens = shape.q.tokens, d = shape.q.head_dim;
    const auto qv = rope::View<T>::token_major(q.data(), tokens, shape.q.heads, d);
    const auto kv = rope::View<T>::token_major(k.data(), tokens, shape.k_heads, d);
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
};

// The same bytes as an apply case moved by memcpy (Q and K into other
// buffers), the tokens split across threads the way apply splits them.
template <class T>
struct QkCopy {
  QkShape shape;
  std::size_t workers;
  Tensor<T> q, k, q_out, k_out;

  QkCopy(const QkShape& s, std::size_t threads)
      : shape(s),
        workers(std::min(threads, s.q.tokens)),
        q(s.q.tokens * s.q.heads * s.q.head_dim),
        k(s.q.tokens * s.k_heads * s.q.head_dim),
        q_out(q.size(), false),
        k_out(k.size(), false) {}

  void part(std::size_t w) {
    const auto copy = [&](const Tensor<T>& from, Tensor<T>& to) {
      const std::size_t begin = from.size() / shape.q.tokens * (shape.q.tokens * w / workers);
      const std::size_t end = from.size() / shape.q.tokens * (shape.q.tokens * (w + 1) / workers);
      std::memcpy(to.data() + begin, from.data() + begin, (end - begin) * sizeof(T));
    };
    copy(q, q_out);
    copy(k, k_out);
  }
  void operator()() {
    std::vector<std::thread> pool;
    for (std::size_t w = 1; w < workers; ++w) pool.emplace_back([this, w] { part(w); });
    part(0);
    for (auto& t : pool) t.join();
    benchmark::DoNotOptimize(q_out.data());
    benchmark::ClobberMemory();
  }
};

// Calls per timed stretch of a paired case (paired.hpp): a decode step's few
// hundred ns many times over.
inline std::size_t apply_calls(const QkShape& shape) { return shape.q.tokens == 1 ? 64 : 1; }

// An apply case, paired with the memcpy of its bytes (counter vs_memcpy).
template <class T>
void apply_case(benchmark::State& state, QkShape shape, Placement placement, std::size_t threads) {
  QkCall<T> call(shape, placement, threads);
  QkCopy<T> copy(shape, threads);
  rope_bench::paired(state, "vs_memcpy", apply_calls(shape), copy, call);
  set_bytes<T>(state, shape);
}

// The memcpy alone.
template <class T>
void memcpy_case(benchmark::State& state, QkShape shape, std::size_t threads) {
  QkCopy<T> copy(shape, threads);
  for (auto _ : state) copy();
  set_bytes<T>(state, shape);
}

}  // namespace
