// fused/...: the step between the QKV projection and attention (per-head
// QK-norm, RoPE, the KV cache write), Qwen3-8B-like shape: 32 query / 8
// key-value heads, head_dim 128, a fused QKV input in f32 [tokens, 48 heads,
// 128], rotate_half over a table of 4096 positions, a paged cache of pages
// of 16 tokens, Q rotated in place, 1 thread.
//
//   fused/qkv_norm_rope_append/<kv>/<shape>  one append call (the fused step:
//                                            QK-norm, RoPE, the cache write)
//   fused/unfused/<kv>/<shape>               the same work as separate calls,
//                                            as written with rope without the
//                                            fused call: an RMSNorm loop over
//                                            the Q and K heads (in place),
//                                            rope::apply_qk at the plan's
//                                            positions, then append's K/V
//                                            form (no rotation)
//   fused/memcpy/<kv>/<shape>                a memcpy of the QKV input into a
//                                            buffer of the same size: the
//                                            floor of any pass over it
//
// kv: f32, bf16, i8 (a float scale per row). shape:
//   prefill  2048 tokens of one sequence at positions 0 .. 2047, slots 0 ..
//            2047 (128 pages in order)
//   decode   16 tokens, one for each of 16 sequences, at positions that
//            differ, each into a page of its own (pages far apart)
// The step is planned once, outside the timing (an engine plans a step
// once for all of its layers).
//
// Bytes processed: the QKV input bytes, the same for the three cases.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <rope/apply.hpp>
#include <rope/attention.hpp>

#include "shapes.hpp"

namespace {

namespace ra = rope::attention;

constexpr std::size_t kQHeads = 32, kKvHeads = 8, kHeadDim = 128, kPageSize = 16;
constexpr std::size_t kHeads = kQHeads + 2 * kKvHeads;
constexpr std::size_t kTablePositions = 4096;
constexpr std::size_t kPrefillTokens = 2048, kDecodeTokens = 16;
constexpr std::size_t kDecodePages = 256;  // page 16 * b + 5 for sequence b
constexpr float kEps = 1e-6f;

enum class Shape { prefill, decode };

using rope_bench::KvName;

template <class E>
struct FusedCase {
  std::size_t tokens;
  rope::Table<float> table;
  rope_bench::LineVector<float> qkv, copy, q_weight, k_weight;
  std::vector<std::int64_t> q_starts, lengths;
  std::vector<std::int32_t> block_table;
  std::size_t stride = 0;
  ra::Plan plan;
  rope_bench::LineVector<E> k_pool, v_pool;
  rope_bench::LineVector<float> k_scales, v_scales;
  ra::PagedCache<E> cache;

  explicit FusedCase(Shape shape)
      : tokens(shape == Shape::prefill ? kPrefillTokens : kDecodeTokens),
        table(rope::frequencies(kHeadDim, 1000000.0), kTablePositions) {
    std::mt19937 gen(42);
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    qkv.resize(tokens * kHeads * kHeadDim);
    for (float& x : qkv) x = dist(gen);
    copy.resize(qkv.size());
    q_weight.resize(kHeadDim);
    k_weight.resize(kHeadDim);
    // One weight for every channel: Q (and, unfused, K) is normalized in
    // place again each iteration, and with weights that differ by channel
    // the channels of the smaller ones shrink by their ratio every time:
    // with weights in [0.75, 1.25], subnormals from about the 200th
    // iteration, a third of Q's values by the 400th (counted), whose
    // arithmetic may be slower, so a case's time could depend on how many
    // iterations it ran. With one weight each normalized head keeps the
    // RMS it had. The weight is not 1, so the multiply is real.
    std::fill(q_weight.begin(), q_weight.end(), 1.0625f);
    std::fill(k_weight.begin(), k_weight.end(), 0.9375f);
    std::size_t pages = 0;
    q_starts.push_back(0);
    if (shape == Shape::prefill) {
      pages = tokens / kPageSize;
      stride = pages;
      q_starts.push_back(static_cast<std::int64_t>(tokens));
      lengths.push_back(static_cast<std::int64_t>(tokens));
      for (std::size_t i = 0; i < pages; ++i) block_table.push_back(static_cast<std::int32_t>(i));
    } else {
      pages = kDecodePages;
      stride = kTablePositions / kPageSize;
      // Sequence b's token at position 97 + 241 b goes into page 16 b + 5;
      // its earlier keys sit in pages no sequence writes (read, shared).
      std::vector<std::int32_t> read_only;
      for (std::size_t i = 0; i < pages; ++i) {
        if (i % 16 != 5) read_only.push_back(static_cast<std::int32_t>(i));
      }
      block_table.assign(tokens * stride, 0);
      for (std::size_t b = 0; b < tokens; ++b) {
        const std::size_t position = 97 + 241 * b;  // below 4096, each in its own page
        q_starts.push_back(static_cast<std::int64_t>(b + 1));
        lengths.push_back(static_cast<std::int64_t>(position + 1));
        for (std::size_t i = 0; i < position / kPageSize; ++i) block_table[b * stride + i] = read_only[i];
        block_table[b * stride + position / kPageSize] = static_cast<std::int32_t>(16 * b + 5);
      }
    }
    const std::size_t rows = pages * kPageSize * kKvHeads;
    k_pool.resize(rows * kHeadDim);
    v_pool.resize(rows * kHeadDim);
    float* ks = nullptr;
    float* vs = nullptr;
    if (rope::KvElement<E>::kScaled) {
      k_scales.resize(rows);
      v_scales.resize(rows);
      ks = k_scales.data();
      vs = v_scales.data();
    }
    cache.k = ra::PagePool<E>::nhd(k_pool.data(), pages, kPageSize, kKvHeads, kHeadDim, ks);
    cache.v = ra::PagePool<E>::nhd(v_pool.data(), pages, kPageSize, kKvHeads, kHeadDim, vs);
    ra::plan(plan, ra::Shape::of(cache, kQHeads),
             ra::Batch{q_starts.data(), lengths.data(), block_table.data(), stride, lengths.size()});
  }

  rope::QkvViews<float> views() { return rope::split_qkv(qkv.data(), tokens, kQHeads, kKvHeads, kHeadDim); }
  rope::Positions at() const { return rope::Positions(plan.positions()); }
  std::int64_t bytes() const { return static_cast<std::int64_t>(qkv.size() * sizeof(float)); }
};

template <class E>
void fused_case(benchmark::State& state, Shape shape) {
  FusedCase<E> c(shape);
  const auto qkv = c.views();
  ra::AppendOptions o;
  o.rotation = ra::Rotation<float>{&c.table, rope::Style::rotate_half, 0};
  o.q_norm = {c.q_weight.data(), c.q_weight.size()};
  o.k_norm = {c.k_weight.data(), c.k_weight.size()};
  o.eps = kEps;
  for (auto _ : state) {
    ra::append(c.plan, c.cache, qkv.q, qkv.k, qkv.v, qkv.q, o);
    benchmark::DoNotOptimize(c.k_pool.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * c.bytes());
}

// RMSNorm of every head of x in place, as a plain loop (the order of
// operations append.hpp documents).
void rms_norm_heads(const rope::View<float>& x, const float* w) {
  for (std::size_t t = 0; t < x.tokens; ++t) {
    for (std::size_t h = 0; h < x.heads; ++h) {
      float* r = x.row(t, h);
      float ss = 0.0f;
      for (std::size_t i = 0; i < x.head_dim; ++i) ss = std::fma(r[i], r[i], ss);
      const float inv = 1.0f / std::sqrt(ss / static_cast<float>(x.head_dim) + kEps);
      for (std::size_t i = 0; i < x.head_dim; ++i) r[i] = (r[i] * inv) * w[i];
    }
  }
}

template <class E>
void unfused_case(benchmark::State& state, Shape shape) {
  FusedCase<E> c(shape);
  const auto qkv = c.views();
  for (auto _ : state) {
    rms_norm_heads(qkv.q, c.q_weight.data());
    rms_norm_heads(qkv.k, c.k_weight.data());
    rope::apply_qk(qkv.q, qkv.k, c.table, rope::Style::rotate_half, c.at());
    ra::append(c.plan, c.cache, qkv.k, qkv.v);
    benchmark::DoNotOptimize(c.k_pool.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * c.bytes());
}

template <class E>
void memcpy_case(benchmark::State& state, Shape shape) {
  FusedCase<E> c(shape);
  for (auto _ : state) {
    std::memcpy(c.copy.data(), c.qkv.data(), c.qkv.size() * sizeof(float));
    benchmark::DoNotOptimize(c.copy.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * c.bytes());
}

template <class E>
void register_kv() {
  const std::string kv = KvName<E>::value;
  for (const Shape shape : {Shape::prefill, Shape::decode}) {
    const std::string tail = kv + (shape == Shape::prefill ? "/prefill" : "/decode");
    const auto unit = shape == Shape::prefill ? benchmark::kMillisecond : benchmark::kMicrosecond;
    benchmark::RegisterBenchmark(("fused/qkv_norm_rope_append/" + tail).c_str(), fused_case<E>, shape)
        ->Unit(unit)
        ->UseRealTime();
    benchmark::RegisterBenchmark(("fused/unfused/" + tail).c_str(), unfused_case<E>, shape)->Unit(unit)->UseRealTime();
    benchmark::RegisterBenchmark(("fused/memcpy/" + tail).c_str(), memcpy_case<E>, shape)->Unit(unit)->UseRealTime();
  }
}

const bool kRegistered = [] {
  register_kv<float>();
  register_kv<rope::BFloat16>();
  register_kv<std::int8_t>();
  return true;
}();

}  // namespace
