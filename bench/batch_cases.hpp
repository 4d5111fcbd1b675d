// The batch decode case of rope_bench, shared by bench_batch.cpp (built
// with -march=native, like every other bench source) and baseline.cpp
// (built with the flags a user's program has, alone with rope::dispatch).
// Everything here is in an anonymous namespace on purpose: each
// translation unit compiles its own copy with its own flags, and
// attend's Arch template argument (xsimd::default_arch) keeps the two
// instantiations of the attention call apart.
#pragma once

#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <unistd.h>

#include <rope/attention.hpp>
#include <rope/detail/simd.hpp>
#include <rope/kernels/kv_products.hpp>  // products_path, which a compiled attention library does not bring
#include <xsimd/xsimd.hpp>

#include "memory.hpp"
#include "paired.hpp"
#include "shapes.hpp"

namespace rope_bench {

// attend as the -march=native build compiles it (bench_batch.cpp), for the
// dispatched cases of baseline.cpp to be timed against (E: float,
// BFloat16, int8).
template <class E>
void native_attend(const rope::attention::Plan& plan, const rope::attention::PagedCache<E>& cache,
                   const rope::View<const float>& q, const rope::View<float>& out);

}  // namespace rope_bench

namespace {

namespace ra = rope::attention;
using rope_bench::KvName;

constexpr std::size_t kQHeads = 32, kKvHeads = 8, kHeadDim = 128, kPageSize = 16;

// The batch's cache lengths: a mix of short and long requests, 32768 tokens
// in all. Some end inside a page (and inside a kv_split part), as a running
// server's do.
constexpr std::int64_t kBatchLengths[] = {8192, 4096, 3072, 2560, 2048, 2051, 1792, 1536,
                                          1533, 1280, 1024, 1024, 768,  512,  256,  1024};
constexpr std::int64_t sum_lengths() {
  std::int64_t s = 0;
  for (const std::int64_t l : kBatchLengths) s += l;
  return s;
}
static_assert(sum_lengths() == 32768, "the batch holds 32k cached tokens");
constexpr std::int64_t kLongLength = 32768;
constexpr std::uint32_t kShuffleSeed = 20240611;

enum class Layout { contiguous, paged };

// The K, V (and scale) bytes a call reads for these lengths.
template <class E>
std::size_t kv_bytes(const std::vector<std::int64_t>& lengths) {
  const std::size_t tokens = static_cast<std::size_t>(std::accumulate(lengths.begin(), lengths.end(), std::int64_t{0}));
  const std::size_t per_row = kHeadDim * sizeof(E) + (rope::KvElement<E>::kScaled ? sizeof(float) : 0);
  return 2 * tokens * kKvHeads * per_row;
}

// What BatchCaches::evict reads where the system does not say how large
// its last-level cache is: more than any L3 one core reaches today.
constexpr std::size_t kUnknownCacheEviction = std::size_t{1} << 30;

// The size of the last-level cache where the system says (0 where not).
inline std::size_t last_level_cache() {
#if defined(_SC_LEVEL3_CACHE_SIZE) && defined(_SC_LEVEL2_CACHE_SIZE)
  const long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE), l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
  return static_cast<std::size_t>(std::max({l3, l2, 0L}));
#else
  return 0;
#endif
}

// `bytes` of pseudo-random 32-bit words on cache lines, as the caches are.
inline rope_bench::LineVector<std::uint32_t> read_words(std::size_t bytes) {
  rope_bench::LineVector<std::uint32_t> words(bytes / sizeof(std::uint32_t));
  std::uint32_t s = 1;
  for (auto& w : words) w = s = s * 1664525u + 1013904223u;
  return words;
}

// What one case builds and the next case of the same key reuses.
struct Held {
  virtual ~Held() = default;
};
std::unique_ptr<Held> g_held;
std::string g_held_key;

// What is held under a key is rebuilt if a case asks for it as another
// type (cases that share a key must hold the same T to share it).
template <class T, class Make>
T& hold(const std::string& key, Make make) {
  if (g_held_key != key || dynamic_cast<T*>(g_held.get()) == nullptr) {
    g_held.reset();  // free the last case's cache before building this one
    g_held_key.clear();
    g_held = make();
    g_held_key = key;
  }
  return static_cast<T&>(*g_held);
}

// A cache holding `lengths` sequences of random rows, its block table, and a
// rotated query token per sequence.
template <class E>
struct BatchCase : Held {
  std::vector<std::int64_t> lengths, q_starts;
  std::vector<std::int32_t> block_table;
  std::size_t stride = 0;
  rope_bench::LineVector<E> k, v;  // on cache lines, as an engine's pools
  rope_bench::LineVector<float> k_scales, v_scales;
  ra::PagedCache<E> cache;
  rope_bench::LineVector<float> q, out;
  std::size_t page_size = 0;

  BatchCase(std::vector<std::int64_t> lens, Layout layout) : lengths(std::move(lens)) {
    const std::size_t n = lengths.size();
    q_starts.resize(n + 1);
    std::iota(q_starts.begin(), q_starts.end(), std::int64_t{0});
    std::size_t pages = 0;
    if (layout == Layout::contiguous) {
      page_size = static_cast<std::size_t>(*std::max_element(lengths.begin(), lengths.end()));
      pages = n;
      stride = 1;
      block_table.resize(n);
      std::iota(block_table.begin(), block_table.end(), 0);
    } else {
      page_size = kPageSize;
      for (const std::int64_t l : lengths) {
        const std::size_t p = (static_cast<std::size_t>(l) + kPageSize - 1) / kPageSize;
        pages += p;
        stride = std::max(stride, p);
      }
      std::vector<std::int32_t> order(pages);
      std::iota(order.begin(), order.end(), 0);
      std::mt19937 gen(kShuffleSeed);
      std::shuffle(order.begin(), order.end(), gen);
      block_table.assign(n * stride, 0);
      std::size_t next = 0;
      for (std::size_t b = 0; b < n; ++b) {
        const std::size_t p = (static_cast<std::size_t>(lengths[b]) + kPageSize - 1) / kPageSize;
        for (std::size_t i = 0; i < p; ++i) block_table[b * stride + i] = order[next++];
      }
    }
    const std::size_t rows = pages * page_size * kKvHeads;
    k.resize(rows * kHeadDim);
    v.resize(rows * kHeadDim);
    float* ks = nullptr;
    float* vs = nullptr;
    if (rope::KvElement<E>::kScaled) {
      k_scales.resize(rows);
      v_scales.resize(rows);
      ks = k_scales.data();
      vs = v_scales.data();
    }
    cache.k = ra::PagePool<E>::nhd(k.data(), pages, page_size, kKvHeads, kHeadDim, ks);
    cache.v = ra::PagePool<E>::nhd(v.data(), pages, page_size, kKvHeads, kHeadDim, vs);
    fill();
    Noise noise{7};
    q.resize(n * kQHeads * kHeadDim);
    for (float& x : q) x = noise();
    out.resize(q.size());
  }

  // Each sequence's rows written through append (its K/V form), a chunk
  // of tokens at a time as a chunked prefill would, rounded into E as an
  // engine's projection would store them.
  void fill() {
    constexpr std::size_t kChunk = 512;
    std::vector<float> kn(kChunk * kKvHeads * kHeadDim), vn(kn.size());
    Noise noise{12345};
    ra::Plan plan;
    for (std::size_t b = 0; b < lengths.size(); ++b) {
      const std::size_t len = static_cast<std::size_t>(lengths[b]);
      for (std::size_t j0 = 0; j0 < len; j0 += kChunk) {
        const std::size_t count = std::min(kChunk, len - j0);
        for (std::size_t i = 0; i < count * kKvHeads * kHeadDim; ++i) {
          kn[i] = noise();
          vn[i] = noise();
        }
        const std::int64_t starts[2] = {0, static_cast<std::int64_t>(count)};
        const auto after = static_cast<std::int64_t>(j0 + count);
        ra::plan(plan, ra::Shape::of(cache, kQHeads),
                 ra::Batch{starts, &after, block_table.data() + b * stride, stride, 1});
        ra::append(plan, cache, rope::View<const float>::token_major(kn.data(), count, kKvHeads, kHeadDim),
                   rope::View<const float>::token_major(vn.data(), count, kKvHeads, kHeadDim));
      }
    }
  }

  // Calls run(p, bytes) for each run of memory a call reads: each
  // sequence's pages in its block table's order, the K rows of a page's
  // tokens, their V rows (and int8 scales).
  template <class Run>
  void each_run(Run run) const {
    const std::size_t row = kKvHeads * kHeadDim;  // values of a token, all heads
    for (std::size_t b = 0; b < lengths.size(); ++b) {
      const std::size_t len = static_cast<std::size_t>(lengths[b]);
      for (std::size_t j0 = 0; j0 < len; j0 += page_size) {
        const std::size_t first = static_cast<std::size_t>(block_table[b * stride + j0 / page_size]) * page_size;
        const std::size_t n = std::min(page_size, len - j0);
        run(k.data() + first * row, n * row * sizeof(E));
        run(v.data() + first * row, n * row * sizeof(E));
        if (rope::KvElement<E>::kScaled) {
          run(k_scales.data() + first * kKvHeads, n * kKvHeads * sizeof(float));
          run(v_scales.data() + first * kKvHeads, n * kKvHeads * sizeof(float));
        }
      }
    }
  }

  // One SIMD pass summing, as 32-bit words, exactly the bytes a call reads,
  // where they lie in the cache.
  std::uint32_t read() const {
    std::uint32_t s = 0;
    each_run([&](const void* p, std::size_t bytes) {
      s += sum_words(static_cast<const std::uint32_t*>(p), bytes / sizeof(std::uint32_t));
    });
    return s;
  }

  // Writes back and drops from every cache level the lines of the bytes a
  // call reads (flush_bytes); false where the instruction set cannot.
  bool flush() const {
    bool flushed = true;
    each_run([&](const void* p, std::size_t bytes) { flushed = flush_bytes(p, bytes) && flushed; });
    return flushed;
  }

  ra::Batch batch() const noexcept {
    return {q_starts.data(), lengths.data(), block_table.data(), stride, lengths.size()};
  }
};

// attend of this unit's build over a case's cache, the step planned once
// (outside the timing, as an engine plans a step once for all its layers).
template <class E>
struct BatchCall {
  BatchCase<E>& c;
  rope::View<const float> q;
  rope::View<float> out;
  ra::Plan plan;

  BatchCall(BatchCase<E>& held, std::size_t threads, rope::Products products = rope::Products::exact)
      : c(held),
        q(rope::View<const float>::token_major(held.q.data(), held.lengths.size(), kQHeads, kHeadDim)),
        out(rope::View<float>::token_major(held.out.data(), held.lengths.size(), kQHeads, kHeadDim)) {
    ra::Shape shape = ra::Shape::of(held.cache, kQHeads);
    shape.products = products;
    ra::plan(plan, shape, held.batch(), threads);
    (*this)();  // grows the plan's scratch outside the timing
  }
  void operator()() {
    ra::attend(plan, c.cache, q, out);
    benchmark::DoNotOptimize(c.out.data());
    benchmark::ClobberMemory();
  }
};

// The two layouts of one batch, each built when a case first asks for it.
template <class E>
struct BatchCaches : Held {
  std::vector<std::int64_t> lengths;
  std::unique_ptr<BatchCase<E>> layouts[2];
  rope_bench::LineVector<std::uint32_t> other;  // words no call reads (evict)
  explicit BatchCaches(std::vector<std::int64_t> lens) : lengths(std::move(lens)) {}

  // Before every timed stretch of a batch case, so that each starts with
  // the bytes it reads out of the caches, as a decode step finds a layer's
  // cache after the other layers' (see batch_case): those bytes flushed
  // line by line (x86), or where that cannot be done, a read of other
  // bytes, as many as a call reads and at least one and a half times the
  // last-level cache (1 GiB where the system does not say).
  void evict(const BatchCase<E>& reader) {
    if (reader.flush()) return;
    if (other.empty()) {
      const std::size_t cache = last_level_cache();
      other = read_words(std::max(kv_bytes<E>(lengths), cache > 0 ? cache / 2 * 3 : kUnknownCacheEviction));
    }
    std::uint32_t s = sum_words(other.data(), other.size());
    benchmark::DoNotOptimize(s);
  }
  BatchCase<E>& get(Layout layout) {
    auto& c = layouts[layout == Layout::paged ? 1 : 0];
    if (!c) c = std::make_unique<BatchCase<E>>(lengths, layout);
    return *c;
  }
};

// A batch case, paired (paired.hpp) on one thread with a read of the bytes
// it reads, in its own cache (counter vs_read), on more with the same call
// on one thread (counter vs_T1); a paged case also with the contiguous
// case of the same threads (counter vs_contiguous). key names the batch:
// its two layouts are held together.
//
// Every stretch, the case's and each baseline's, starts with the bytes it
// reads flushed from the caches (BatchCaches::evict, outside the timing).
// Without it a stretch found in the caches what the stretches before it
// had left: a bf16 batch (134 MB) fits whole in a 300 MB L3, so in the
// order the stretches run (read, contiguous call, paged call) the ratios
// measured the order: the read of a paged case came right after the paged
// call over the same bytes, and the call of a T2 case right after the T1
// call. A read of 1.5x the L3 in between was not enough: lines read twice
// per iteration survived it.
template <class E>
void batch_case(benchmark::State& state, std::vector<std::int64_t> lengths, Layout layout, std::size_t threads,
                std::string key, rope::Products products = rope::Products::exact) {
  auto& caches = hold<BatchCaches<E>>(key, [&] { return std::make_unique<BatchCaches<E>>(lengths); });
  BatchCase<E>& c = caches.get(layout);
  BatchCall<E> call(c, threads, products);
  if (products != rope::Products::exact) {
    state.SetLabel(std::string("scores by ") + rope::detail::products_path<xsimd::default_arch>(products));
  }
  const std::function<void()> evict = [&caches, &c] { caches.evict(c); };
  std::unique_ptr<BatchCall<E>> baseline;
  std::vector<rope_bench::BaselineCall> baselines;
  if (threads == 1) {
    std::size_t bytes = 0;
    c.each_run([&](const void*, std::size_t n) { bytes += n; });
    if (bytes != kv_bytes<E>(c.lengths)) {
      state.SkipWithError("the paired read does not cover the bytes the call reads");
      return;
    }
    baselines.push_back({"vs_read",
                         [&] {
                           std::uint32_t s = c.read();
                           benchmark::DoNotOptimize(s);
                         },
                         evict});
  } else {
    baseline = std::make_unique<BatchCall<E>>(c, 1, products);
    baselines.push_back({"vs_T1", [&] { (*baseline)(); }, evict});
  }
  // A product mode: also against the exact step of the same threads.
  std::unique_ptr<BatchCall<E>> exact;
  if (products != rope::Products::exact) {
    exact = std::make_unique<BatchCall<E>>(c, threads);
    baselines.push_back({"vs_exact", [&] { (*exact)(); }, evict});
  }
  std::unique_ptr<BatchCall<E>> contiguous;
  if (layout == Layout::paged && caches.lengths.size() > 1 && products == rope::Products::exact) {
    BatchCase<E>& flat = caches.get(Layout::contiguous);
    contiguous = std::make_unique<BatchCall<E>>(flat, threads);
    baselines.push_back({"vs_contiguous", [&] { (*contiguous)(); }, [&caches, &flat] { caches.evict(flat); }});
  }
  rope_bench::paired(state, 1, baselines, call, evict);
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) *
                          static_cast<std::int64_t>(kv_bytes<E>(c.lengths)));
}

}  // namespace
