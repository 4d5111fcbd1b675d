// attention/batch_decode/... and attention/long_decode/...: a server's decode
// step over a paged KV cache (rope/attention/attend.hpp), Llama-3-8B shape:
// 32 query / 8 key-value heads, head_dim 128, q already rotated (append
// rotates it before attend), f32 q and out, one attend call per iteration
// over the step's plan, made once outside the timing as an engine makes it
// once per step for all of its layers.
//
//   batch_decode/<kv>/<layout>/T<n>  one new token for each of the 16
//                                    sequences of kBatchLengths (32768 cached
//                                    tokens in all), kv in f32 bf16 f16 i8
//                                    (fp8 below),
//                                    on n threads
//       contiguous                   one page per sequence of the longest
//                                    length (8192): block table row b = {b}
//       paged                        pages of 16 tokens handed out in a
//                                    shuffled order (fixed seed), so a
//                                    sequence's pages are scattered in memory
//   batch_decode/read/<kv>           one SIMD pass summing, as 32-bit words, a
//                                    contiguous buffer of exactly the K, V
//                                    (and int8 scale) bytes a batch_decode
//                                    call reads, 1 thread: the limit of decode
//   long_decode/bf16/paged/T<n>      one sequence of 32768 cached tokens, bf16,
//                                    pages of 16, shuffled
//   batch_decode/bf16dot/paged/T1    the bf16 paged case with Products::bf16
//   batch_decode/i8dot/paged/T1      the i8 paged case with Products::int8
//   batch_decode/fp8/paged/T1,       fp8 E4M3 and E5M2 caches, paged, 1
//     batch_decode/fp8e5m2/paged/T1  thread (and read/fp8, read/fp8e5m2)
//                                    (each also against the exact step of
//                                    the same run, counter vs_exact; its
//                                    label names the instruction that ran)
//
// Bytes processed: the K and V bytes read (and the int8 scales), the same for
// both layouts. In the same iterations (paired.hpp), each case on one
// thread is also timed against a read of the bytes it reads, where they lie
// in its cache (counter vs_read); each on two threads against itself on one
// (vs_T1); each paged case against the contiguous one of the same threads
// (vs_contiguous). The report reads those. The caches are big (f32: 268 MB
// for 32k tokens, the contiguous one reserves 4x that), so one batch is held
// at a time, both layouts: the cases of one storage type run one after
// another and share them, the next type frees them before building its own.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include <rope/attention.hpp>
#include <rope/detail/simd.hpp>
#include <xsimd/xsimd.hpp>

#include "batch_cases.hpp"

namespace {

// The bytes of a batch_decode call, contiguous, as 32-bit words.
struct ReadCase : Held {
  rope_bench::LineVector<std::uint32_t> words;
  explicit ReadCase(std::size_t bytes) : words(read_words(bytes)) {}
};

template <class E>
void read_case(benchmark::State& state, std::string key) {
  const std::vector<std::int64_t> lengths(std::begin(kBatchLengths), std::end(kBatchLengths));
  const std::size_t bytes = kv_bytes<E>(lengths);
  auto& c = hold<ReadCase>(key, [&] { return std::make_unique<ReadCase>(bytes); });
  for (auto _ : state) {
    std::uint32_t s = sum_words(c.words.data(), c.words.size());
    benchmark::DoNotOptimize(s);
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * static_cast<std::int64_t>(bytes));
}

template <class E>
void register_kv() {
  const std::string kv = KvName<E>::value;
  const std::vector<std::int64_t> lengths(std::begin(kBatchLengths), std::end(kBatchLengths));
  for (const Layout layout : {Layout::contiguous, Layout::paged}) {
    const std::string name = kv + (layout == Layout::paged ? "/paged" : "/contiguous");
    for (const std::size_t threads : {std::size_t{1}, std::size_t{2}}) {
      benchmark::RegisterBenchmark(("attention/batch_decode/" + name + "/T" + std::to_string(threads)).c_str(),
                                   batch_case<E>, lengths, layout, threads, "batch/" + kv, rope::Products::exact)
          ->Unit(benchmark::kMillisecond)
          ->UseManualTime();
    }
  }
  // The product mode of the cache's type (kernels/kv_products.hpp).
  const rope::Products mode = std::is_same<E, rope::BFloat16>::value ? rope::Products::bf16
                              : std::is_same<E, std::int8_t>::value  ? rope::Products::int8
                                                                     : rope::Products::exact;
  if (mode != rope::Products::exact) {
    const std::string name = std::string(mode == rope::Products::bf16 ? "bf16dot" : "i8dot") + "/paged/T1";
    benchmark::RegisterBenchmark(("attention/batch_decode/" + name).c_str(), batch_case<E>, lengths, Layout::paged,
                                 std::size_t{1}, "batch/" + kv, mode)
        ->Unit(benchmark::kMillisecond)
        ->UseManualTime();
  }
  benchmark::RegisterBenchmark(("attention/batch_decode/read/" + kv).c_str(), read_case<E>, "read/" + kv)
      ->Unit(benchmark::kMillisecond)
      ->UseRealTime();
}

// An fp8 cache (kernels/kv_planes.hpp): the paged case on one thread and
// its read only, against the other types' full set.
template <class E>
void register_fp8() {
  const std::string kv = KvName<E>::value;
  const std::vector<std::int64_t> lengths(std::begin(kBatchLengths), std::end(kBatchLengths));
  benchmark::RegisterBenchmark(("attention/batch_decode/" + kv + "/paged/T1").c_str(), batch_case<E>, lengths,
                               Layout::paged, std::size_t{1}, "batch/" + kv, rope::Products::exact)
      ->Unit(benchmark::kMillisecond)
      ->UseManualTime();
  benchmark::RegisterBenchmark(("attention/batch_decode/read/" + kv).c_str(), read_case<E>, "read/" + kv)
      ->Unit(benchmark::kMillisecond)
      ->UseRealTime();
}

// Registered in this order so that the cases of one cache run one after
// another (without --benchmark_enable_random_interleaving).
const bool kRegistered = [] {
  register_kv<float>();
  register_kv<rope::BFloat16>();
  register_kv<rope::Float16>();
  register_kv<std::int8_t>();
  register_fp8<rope::Float8E4M3>();
  register_fp8<rope::Float8E5M2>();
  for (const std::size_t threads : {std::size_t{1}, std::size_t{2}}) {
    benchmark::RegisterBenchmark(("attention/long_decode/bf16/paged/T" + std::to_string(threads)).c_str(),
                                 batch_case<rope::BFloat16>, std::vector<std::int64_t>{kLongLength}, Layout::paged,
                                 threads, std::string("long/bf16/paged"), rope::Products::exact)
        ->Unit(benchmark::kMillisecond)
        ->UseManualTime();
  }
  return true;
}();

}  // namespace

namespace rope_bench {

template <class E>
void native_attend(const rope::attention::Plan& plan, const rope::attention::PagedCache<E>& cache,
                   const rope::View<const float>& q, const rope::View<float>& out) {
  rope::attention::attend(plan, cache, q, out);
}
template void native_attend<float>(const rope::attention::Plan&, const rope::attention::PagedCache<float>&,
                                   const rope::View<const float>&, const rope::View<float>&);
template void native_attend<rope::BFloat16>(const rope::attention::Plan&,
                                            const rope::attention::PagedCache<rope::BFloat16>&,
                                            const rope::View<const float>&, const rope::View<float>&);
template void native_attend<std::int8_t>(const rope::attention::Plan&, const rope::attention::PagedCache<std::int8_t>&,
                                         const rope::View<const float>&, const rope::View<float>&);

}  // namespace rope_bench
