// attention/shared_prefix/..., attention/tree_verify/... and
// attention/shift/...: three things a server does every step, Llama-3-8B
// shape (32 query / 8 key-value heads, head_dim 128), pages of 16 tokens
// handed out in a shuffled order (fixed seed), f32 q and out. Plans are made
// once, outside the timing.
//
//   shared_prefix/<kv>/cascade   16 sequences sharing a 4096-token prefix
//                                (the same 256 pages), each with 512 keys
//                                of its own after it, one decode token
//                                each, 1 thread, kv in bf16 i8; the plan
//                                with Shape::cascade (cascade.hpp); paired
//                                with the plain step (vs_plain: the plain
//                                step's time over the cascade's) and with a
//                                read of the unique bytes (vs_read)
//   shared_prefix/<kv>/plain     the same step without cascade, paired with
//                                the read of the unique bytes (vs_read)
//   shared_prefix/bf16dot/...    the bf16 steps in the bf16 product mode
//                                (Shape::products; the cascade levels on AMX
//                                tiles where the CPU has them), the cascade
//                                also paired with the mode's plain step
//                                (vs_dot_plain)
//   shared_prefix/read/<kv>      one SIMD pass over a contiguous buffer of
//                                the unique bytes: the prefix once and every
//                                sequence's own keys (K, V, int8 scales)
//   tree_verify/bf16             16 sequences of 4096 cached keys, each
//                                verifying a 32-token draft tree (each node
//                                i > 0 a child of (i - 1) / 2: a binary
//                                tree of depth 5), paired with the chain
//                                (vs_chain: the chain's time over the tree's)
//   tree_verify/chain/bf16       the same 32 new tokens per sequence as a
//                                causal chunk
//   shift/bf16                   one sequence's 4096 cached keys rotated by
//                                1024 positions in place (shift.hpp),
//                                paired with shift/memcpy (vs_memcpy)
//   shift/memcpy/bf16            a memcpy of the same key bytes, page by
//                                page, into a buffer of their size
//
// Every stretch (the case's and each baseline's) starts with the bytes it
// reads flushed from the caches where x86 allows (CLFLUSH), as a layer
// finds its cache after the other layers'.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include <rope/attention.hpp>
#include <rope/attention/cascade_tiles.hpp>  // level_tiles_run, which a compiled attention library does not bring
#include <rope/detail/simd.hpp>
#include <xsimd/xsimd.hpp>

#include "memory.hpp"
#include "paired.hpp"
#include "shapes.hpp"

namespace {

namespace ra = rope::attention;
using rope_bench::KvName;

constexpr std::size_t kQHeads = 32, kKvHeads = 8, kHeadDim = 128, kPage = 16, kSequences = 16;
constexpr std::size_t kPrefix = 4096, kOwn = 512, kCached = 4096, kTree = 32, kShiftKeys = 4096;
constexpr std::int64_t kShiftDelta = 1024;
constexpr std::uint32_t kSeed = 20261206;

// A pool of `pages` pages of random rows of E (int8 with random scales).
template <class E>
struct Pool {
  rope_bench::LineVector<E> k, v;
  rope_bench::LineVector<float> k_scales, v_scales;
  ra::PagedCache<E> cache;

  explicit Pool(std::size_t pages) {
    const std::size_t rows = pages * kPage * kKvHeads;
    k.resize(rows * kHeadDim);
    v.resize(rows * kHeadDim);
    Noise noise{kSeed};
    for (auto& x : k) x = value(noise());
    for (auto& x : v) x = value(noise());
    float* ks = nullptr;
    float* vs = nullptr;
    if (rope::KvElement<E>::kScaled) {
      k_scales.resize(rows);
      v_scales.resize(rows);
      for (auto& x : k_scales) x = (1.0f + noise()) / 254.0f;
      for (auto& x : v_scales) x = (1.0f + noise()) / 254.0f;
      ks = k_scales.data();
      vs = v_scales.data();
    }
    cache.k = ra::PagePool<E>::nhd(k.data(), pages, kPage, kKvHeads, kHeadDim, ks);
    cache.v = ra::PagePool<E>::nhd(v.data(), pages, kPage, kKvHeads, kHeadDim, vs);
  }
  static E value(float x) {
    if constexpr (std::is_same<E, std::int8_t>::value) {
      return static_cast<std::int8_t>(static_cast<int>(x * 254.0f));
    } else {
      return E(x);
    }
  }
  // Calls run(p, bytes) for the K, V (and scale) bytes of `tokens` tokens
  // from slot `slot` (within one page).
  template <class Run>
  void each_run(std::size_t slot, std::size_t tokens, Run run) const {
    const std::size_t row = kKvHeads * kHeadDim;
    run(k.data() + slot * row, tokens * row * sizeof(E));
    run(v.data() + slot * row, tokens * row * sizeof(E));
    if (rope::KvElement<E>::kScaled) {
      run(k_scales.data() + slot * kKvHeads, tokens * kKvHeads * sizeof(float));
      run(v_scales.data() + slot * kKvHeads, tokens * kKvHeads * sizeof(float));
    }
  }
};

// Page ids 0 .. n - 1 in a shuffled order.
std::vector<std::int32_t> shuffled_pages(std::size_t n) {
  std::vector<std::int32_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::mt19937 gen(kSeed);
  std::shuffle(order.begin(), order.end(), gen);
  return order;
}

// The shared-prefix batch: the prefix's pages listed first in every block
// table row, then each sequence's own.
template <class E>
struct PrefixCase {
  static constexpr std::size_t kPrefixPages = kPrefix / kPage, kOwnPages = kOwn / kPage;
  static constexpr std::size_t kStride = kPrefixPages + kOwnPages;
  Pool<E> pool{kPrefixPages + kSequences * kOwnPages};
  std::vector<std::int32_t> table = std::vector<std::int32_t>(kSequences * kStride);
  std::vector<std::int64_t> lengths = std::vector<std::int64_t>(kSequences, kPrefix + kOwn);
  std::vector<std::int64_t> starts = std::vector<std::int64_t>(kSequences + 1);
  std::vector<float> q = std::vector<float>(kSequences * kQHeads * kHeadDim);
  std::vector<float> out = std::vector<float>(q.size());
  ra::Plan plain, cascade;
  ra::Plan dot_plain, dot_cascade;              // bf16: the same in the bf16 product mode
  rope_bench::LineVector<std::uint32_t> words;  // the unique bytes, contiguous

  PrefixCase() {
    const std::vector<std::int32_t> order = shuffled_pages(kPrefixPages + kSequences * kOwnPages);
    for (std::size_t b = 0; b < kSequences; ++b) {
      for (std::size_t i = 0; i < kPrefixPages; ++i) table[b * kStride + i] = order[i];
      for (std::size_t i = 0; i < kOwnPages; ++i) {
        table[b * kStride + kPrefixPages + i] = order[kPrefixPages + b * kOwnPages + i];
      }
    }
    std::iota(starts.begin(), starts.end(), std::int64_t{0});
    Noise noise{kSeed + 1};
    for (float& x : q) x = noise();
    const ra::Batch batch{starts.data(), lengths.data(), table.data(), kStride, kSequences};
    ra::Shape shape = ra::Shape::of(pool.cache, kQHeads);
    ra::plan(plain, shape, batch, 1);
    shape.cascade = true;
    ra::plan(cascade, shape, batch, 1);
    if constexpr (std::is_same<E, rope::BFloat16>::value) {
      shape.products = rope::Products::bf16;
      ra::plan(dot_cascade, shape, batch, 1);
      shape.cascade = false;
      ra::plan(dot_plain, shape, batch, 1);
    }
    std::size_t bytes = 0;
    each_unique([&](const void*, std::size_t n) { bytes += n; });
    words.resize(bytes / sizeof(std::uint32_t));
    std::uint32_t s = 1;
    for (auto& w : words) w = s = s * 1664525u + 1013904223u;
  }
  // The unique bytes of the step: the prefix's pages, then each sequence's own.
  template <class Run>
  void each_unique(Run run) const {
    for (std::size_t i = 0; i < kStride; ++i) {
      for (std::size_t b = 0; b < (i < kPrefixPages ? 1 : kSequences); ++b) {
        pool.each_run(static_cast<std::size_t>(table[b * kStride + i]) * kPage, kPage, run);
      }
    }
  }
  void flush() const { each_unique(flush_bytes); }
  void attend(const ra::Plan& plan) {
    ra::attend(plan, pool.cache, rope::View<const float>::token_major(q.data(), kSequences, kQHeads, kHeadDim),
               rope::View<float>::token_major(out.data(), kSequences, kQHeads, kHeadDim));
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  void read() const {
    std::uint32_t s = sum_words(words.data(), words.size());
    benchmark::DoNotOptimize(s);
  }
};

template <class E>
PrefixCase<E>& prefix_case() {
  static std::unique_ptr<PrefixCase<E>> held;
  if (!held) held = std::make_unique<PrefixCase<E>>();
  return *held;
}

template <class E>
void shared_prefix(benchmark::State& state, bool cascade, bool dot) {
  PrefixCase<E>& c = prefix_case<E>();
  c.attend(c.plain);  // the plans' scratch grown outside the timing
  c.attend(c.cascade);
  if (dot) {
    c.attend(c.dot_plain);
    c.attend(c.dot_cascade);
  }
  const std::function<void()> flush = [&c] { c.flush(); };
  const std::function<void()> flush_words = [&c] { flush_bytes(c.words.data(), c.words.size() * 4); };
  std::vector<rope_bench::BaselineCall> baselines;
  baselines.push_back({"vs_read", [&c] { c.read(); }, flush_words});
  if (cascade) baselines.push_back({"vs_plain", [&c] { c.attend(c.plain); }, flush});
  if (dot && cascade) baselines.push_back({"vs_dot_plain", [&c] { c.attend(c.dot_plain); }, flush});
  const ra::Plan& plan = dot ? (cascade ? c.dot_cascade : c.dot_plain) : (cascade ? c.cascade : c.plain);
  rope_bench::paired(
      state, 1, baselines, [&] { c.attend(plan); }, flush);
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) *
                          static_cast<std::int64_t>(c.words.size() * 4));
  // 1 where the mode's cascade levels ran on AMX tiles (cascade_tiles.hpp).
  if (dot) state.counters["tiles"] = ra::detail::level_tiles_run<xsimd::default_arch>() ? 1 : 0;
}

template <class E>
void shared_prefix_read(benchmark::State& state) {
  PrefixCase<E>& c = prefix_case<E>();
  for (auto _ : state) c.read();
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) *
                          static_cast<std::int64_t>(c.words.size() * 4));
}

// 16 sequences of kCached keys, kTree new tokens each: as a tree and as a
// chain, two plans over one pool.
struct TreeCase {
  static constexpr std::size_t kStride = (kCached + kTree + kPage - 1) / kPage;
  Pool<rope::BFloat16> pool{kSequences * kStride};
  std::vector<std::int32_t> table = shuffled_pages(kSequences * kStride);
  std::vector<std::int64_t> lengths = std::vector<std::int64_t>(kSequences, kCached + kTree);
  std::vector<std::int64_t> starts = std::vector<std::int64_t>(kSequences + 1);
  std::vector<std::int32_t> depths = std::vector<std::int32_t>(kSequences * kTree);
  std::vector<std::uint64_t> masks = std::vector<std::uint64_t>(kSequences * kTree);
  std::vector<float> q = std::vector<float>(kSequences * kTree * kQHeads * kHeadDim);
  std::vector<float> out = std::vector<float>(q.size());
  ra::Plan tree, chain;

  TreeCase() {
    for (std::size_t b = 0; b <= kSequences; ++b) starts[b] = static_cast<std::int64_t>(b * kTree);
    for (std::size_t b = 0; b < kSequences; ++b) {
      for (std::size_t i = 0; i < kTree; ++i) {
        std::uint64_t row = 0;
        std::int32_t depth = -1;
        for (std::size_t a = i + 1; a > 0; a = a / 2) {  // node a - 1 and its ancestors
          row |= std::uint64_t{1} << (a - 1);
          ++depth;
        }
        masks[b * kTree + i] = row;
        depths[b * kTree + i] = depth;
      }
    }
    Noise noise{kSeed + 2};
    for (float& x : q) x = noise();
    ra::Batch batch{starts.data(), lengths.data(), table.data(), kStride, kSequences};
    ra::plan(chain, ra::Shape::of(pool.cache, kQHeads), batch, 1);
    batch.tree_depths = depths.data();
    batch.tree_masks = masks.data();
    batch.tree_mask_words = 1;
    ra::plan(tree, ra::Shape::of(pool.cache, kQHeads), batch, 1);
  }
  void flush() const {
    for (std::size_t b = 0; b < kSequences; ++b) {
      for (std::size_t i = 0; i < kStride; ++i) {
        pool.each_run(static_cast<std::size_t>(table[b * kStride + i]) * kPage, kPage, flush_bytes);
      }
    }
  }
  void attend(const ra::Plan& plan) {
    const std::size_t n = kSequences * kTree;
    ra::attend(plan, pool.cache, rope::View<const float>::token_major(q.data(), n, kQHeads, kHeadDim),
               rope::View<float>::token_major(out.data(), n, kQHeads, kHeadDim));
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
};

TreeCase& tree_case() {
  static std::unique_ptr<TreeCase> held;
  if (!held) held = std::make_unique<TreeCase>();
  return *held;
}

void tree_verify(benchmark::State& state, bool as_tree) {
  TreeCase& c = tree_case();
  c.attend(c.tree);
  c.attend(c.chain);
  const std::function<void()> flush = [&c] { c.flush(); };
  std::vector<rope_bench::BaselineCall> baselines;
  if (as_tree) baselines.push_back({"vs_chain", [&c] { c.attend(c.chain); }, flush});
  const ra::Plan& plan = as_tree ? c.tree : c.chain;
  rope_bench::paired(
      state, 1, baselines, [&] { c.attend(plan); }, flush);
}

// One sequence of kShiftKeys keys; a shift by kShiftDelta and back each
// call pair (the keys stay near where they started), and a memcpy of the
// same key bytes.
struct ShiftCase {
  static constexpr std::size_t kPages = kShiftKeys / kPage;
  Pool<rope::BFloat16> pool{kPages};
  std::vector<std::int32_t> table = shuffled_pages(kPages);
  rope::Table<float> angles{rope::frequencies(kHeadDim, 500000.0), static_cast<std::size_t>(kShiftDelta) + 1};
  ra::Rotation<float> rotation{&angles, rope::Style::rotate_half};
  rope_bench::LineVector<rope::BFloat16> copy = rope_bench::LineVector<rope::BFloat16>(pool.k.size());
  std::int64_t delta = kShiftDelta;

  void flush() const {
    flush_bytes(pool.k.data(), pool.k.size() * sizeof(rope::BFloat16));
    flush_bytes(copy.data(), copy.size() * sizeof(rope::BFloat16));
  }
  void shift() {
    ra::shift(pool.cache, table.data(), table.size(), 0, kShiftKeys, delta, rotation);
    delta = -delta;
    benchmark::ClobberMemory();
  }
  void memcpy_keys() {
    const std::size_t page = kPage * kKvHeads * kHeadDim;
    for (std::size_t i = 0; i < kPages; ++i) {
      std::memcpy(copy.data() + i * page, pool.k.data() + static_cast<std::size_t>(table[i]) * page,
                  page * sizeof(rope::BFloat16));
    }
    benchmark::ClobberMemory();
  }
};

ShiftCase& shift_case() {
  static std::unique_ptr<ShiftCase> held;
  if (!held) held = std::make_unique<ShiftCase>();
  return *held;
}

void shift_keys(benchmark::State& state) {
  ShiftCase& c = shift_case();
  const std::function<void()> flush = [&c] { c.flush(); };
  rope_bench::paired(
      state, 1, {{"vs_memcpy", [&c] { c.memcpy_keys(); }, flush}}, [&c] { c.shift(); }, flush);
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) *
                          static_cast<std::int64_t>(c.pool.k.size() * sizeof(rope::BFloat16)));
}

void shift_memcpy(benchmark::State& state) {
  ShiftCase& c = shift_case();
  for (auto _ : state) {
    state.PauseTiming();
    c.flush();
    state.ResumeTiming();
    c.memcpy_keys();
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) *
                          static_cast<std::int64_t>(c.pool.k.size() * sizeof(rope::BFloat16)));
}

template <class E>
void register_prefix() {
  const std::string kv = KvName<E>::value;
  for (const bool dot : {false, true}) {
    if (dot && !std::is_same<E, rope::BFloat16>::value) continue;
    for (const bool cascade : {true, false}) {
      const std::string name = "attention/shared_prefix/" + kv + (dot ? "dot" : "") + (cascade ? "/cascade" : "/plain");
      benchmark::RegisterBenchmark(name.c_str(), shared_prefix<E>, cascade, dot)
          ->Unit(benchmark::kMillisecond)
          ->UseManualTime();
    }
  }
  benchmark::RegisterBenchmark(("attention/shared_prefix/read/" + kv).c_str(), shared_prefix_read<E>)
      ->Unit(benchmark::kMillisecond)
      ->UseRealTime();
}

const bool kRegistered = [] {
  register_prefix<rope::BFloat16>();
  register_prefix<std::int8_t>();
  benchmark::RegisterBenchmark("attention/tree_verify/bf16", tree_verify, true)
      ->Unit(benchmark::kMillisecond)
      ->UseManualTime();
  benchmark::RegisterBenchmark("attention/tree_verify/chain/bf16", tree_verify, false)
      ->Unit(benchmark::kMillisecond)
      ->UseManualTime();
  benchmark::RegisterBenchmark("attention/shift/bf16", shift_keys)->Unit(benchmark::kMillisecond)->UseManualTime();
  benchmark::RegisterBenchmark("attention/shift/memcpy/bf16", shift_memcpy)->Unit(benchmark::kMillisecond);
  return true;
}();

}  // namespace
