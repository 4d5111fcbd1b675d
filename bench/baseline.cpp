// apply_baseline/<type>/<placement>/t1/<shape> and apply_dispatch/...: the
// apply family's Llama-3-8B prefill and decode cases built the way a user's
// program is, with no -march flag (rope_bench's other sources have
// -march=native), run through rope's header-only path (baseline: SSE2 on
// x86-64) and through rope::dispatch. Read against apply/<type>/... of the
// same run, the -march=native build: the report prints dispatch / native and
// baseline / native.
//
// attention/batch_decode_baseline/<kv>/paged/T1 and .../batch_decode_dispatch/...:
// attention/batch_decode/<kv>/paged/T1 (bench_batch.cpp) built the same way,
// through the header-only path and with rope::dispatch installed, which runs
// the cache reads (attend_keys) from its table; the rest of the call (the
// merges and the output rows, a small part of it) keeps baseline code either
// way. The report prints dispatch / native.
//
// ROPE_BENCH_DISPATCH=<name> pins the instruction set dispatch uses (e.g.
// fma3+avx2 on an AVX-512 machine, to measure the AVX2 class of CPU);
// by default it picks the best one, as a user's program would.
#include <cstdio>
#include <cstdlib>
#include <stdexcept>

#include <rope/dispatch.hpp>

#include "apply_cases.hpp"
#include "batch_cases.hpp"

namespace {

// Dispatch is installed for the case's own calls only: every other case
// runs the loop compiled in its own translation unit. Each dispatched case
// is timed against the native build's same call in the same iterations
// (counter vs_native, paired.hpp), dispatch switched off for those.
const auto kNativeOn = [] { rope::dispatch::uninstall(); };
const auto kDispatchOn = [] { rope::dispatch::install(); };

template <class T>
void dispatch_case(benchmark::State& state, QkShape shape, Placement placement, std::size_t threads) {
  QkCall<T> call(shape, placement, threads);
  rope_bench::paired(
      state, "vs_native", apply_calls(shape), [&] { call.native(); }, call, kNativeOn, kDispatchOn);
  rope::dispatch::uninstall();
  set_bytes<T>(state, shape);
}

template <class E>
void batch_dispatch_case(benchmark::State& state, std::vector<std::int64_t> lengths, std::string key) {
  auto& caches = hold<BatchCaches<E>>(key, [&] { return std::make_unique<BatchCaches<E>>(lengths); });
  BatchCase<E>& c = caches.get(Layout::paged);
  BatchCall<E> call(c, 1);
  const auto native = [&] {
    rope_bench::native_attend(call.plan, c.cache, call.q, call.out);
    benchmark::DoNotOptimize(c.out.data());
    benchmark::ClobberMemory();
  };
  rope_bench::paired(state, "vs_native", 1, native, call, kNativeOn, kDispatchOn);
  rope::dispatch::uninstall();
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) *
                          static_cast<std::int64_t>(kv_bytes<E>(c.lengths)));
}

// In the order of bench_batch.cpp's, the cases of one cache one after
// another (each translation unit holds its own cache).
template <class E>
void register_batch() {
  const std::string kv = KvName<E>::value;
  const std::vector<std::int64_t> lengths(std::begin(kBatchLengths), std::end(kBatchLengths));
  const std::string key = "baseline/" + kv;
  benchmark::RegisterBenchmark(("attention/batch_decode_baseline/" + kv + "/paged/T1").c_str(), batch_case<E>, lengths,
                               Layout::paged, 1, key, rope::Products::exact)
      ->Unit(benchmark::kMillisecond)
      ->UseManualTime();
  benchmark::RegisterBenchmark(("attention/batch_decode_dispatch/" + kv + "/paged/T1").c_str(), batch_dispatch_case<E>,
                               lengths, key)
      ->Unit(benchmark::kMillisecond)
      ->UseManualTime();
}

template <class T>
void register_builds(const char* type) {
  for (const QkShape& shape : {kPrefill, kDecode}) {
    for (Placement p : {Placement::in_place, Placement::out_of_place}) {
      const std::string suffix = "/" + std::string(type) + "/" + name(p) + "/t1/" + shape.q.name;
      benchmark::RegisterBenchmark(("apply_baseline" + suffix).c_str(), apply_case<T>, shape, p, 1)->UseManualTime();
      benchmark::RegisterBenchmark(("apply_dispatch" + suffix).c_str(), dispatch_case<T>, shape, p, 1)->UseManualTime();
    }
  }
}

const bool kRegistered = [] {
  if (const char* pinned = std::getenv("ROPE_BENCH_DISPATCH")) {
    try {
      rope::dispatch::force(pinned);
    } catch (const std::invalid_argument& e) {
      std::fprintf(stderr, "ROPE_BENCH_DISPATCH: %s\n", e.what());
      std::exit(2);
    }
  }
  rope::dispatch::uninstall();
  benchmark::AddCustomContext("rope_dispatch_arch", rope::dispatch::arch());
  benchmark::AddCustomContext("rope_baseline_arch", xsimd::default_arch::name());
  register_builds<float>("f32");
  register_builds<rope::BFloat16>("bf16");
  register_batch<float>();
  register_batch<rope::BFloat16>();
  register_batch<std::int8_t>();
  return true;
}();

}  // namespace
