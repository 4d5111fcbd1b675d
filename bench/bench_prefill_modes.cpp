// attention/prefill_modes/...: one causal prompt through the serving path
// (plan, attend) in each product mode (rope/products.hpp): 32 query / 8
// key-value heads, head_dim 128, L 1024 new tokens of one sequence over a
// contiguous bf16 cache that holds their keys and values, bf16 q and out,
// 1 thread. The plan is made once, outside the timing.
//
//   prefill_modes/f32      Products::exact: every product a float fma over
//                          the widened values, token by token
//   prefill_modes/bf16dot  Products::bf16 with the tiles turned off: q
//                          rounded to bf16, each score a vdpbf16ps dot
//                          product (lane by lane where the CPU lacks it),
//                          token by token: what a CPU with AVX512-BF16 and
//                          no AMX runs
//   prefill_modes/amx      Products::bf16 where AMX runs: the prompt's
//                          tokens in blocks of 64 query rows on tdpbf16ps
//                          tiles (cascade_tiles.hpp); a CPU or OS without
//                          the tiles reports that it did not run
//   prefill_modes/gemm     bare f32 Eigen GEMMs of the same multiply-adds
//                          (per key/value head [4L x d] x [d x L/2] and
//                          [4L x L/2] x [L/2 x d]): the f32 compute ceiling
//
// bf16dot and amx are paired with the f32 mode (vs_f32: its time over
// theirs, paired.hpp) and every mode with the GEMMs (vs_gemm: their time
// over the mode's, at the same multiply-adds). The label names the path
// the scores took on this CPU.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include <rope/attention.hpp>
#include <rope/attention/cascade_tiles.hpp>  // level_tiles_run, tiles_allowed
#include <rope/kernels/kv_products.hpp>      // products_path

#include "paired.hpp"

namespace {

namespace ra = rope::attention;
using rope::BFloat16;

constexpr std::size_t kHq = 32, kHk = 8, kD = 128, kL = 1024;

enum class Mode { f32, bf16dot, amx };

std::vector<BFloat16> random_rows(std::size_t n, std::uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal;
  std::vector<BFloat16> v(n);
  for (BFloat16& x : v) x = BFloat16(normal(gen));
  return v;
}

// The prompt: its cache written once, its plan made once.
struct Prompt {
  std::vector<BFloat16> k = random_rows(kL * kHk * kD, 1), v = random_rows(kL * kHk * kD, 2),
                        q = random_rows(kL * kHq * kD, 3), out = std::vector<BFloat16>(kL * kHq * kD);
  ra::PagedCache<BFloat16> cache =
      ra::PagedCache<BFloat16>::contiguous(rope::View<BFloat16>::token_major(k.data(), kL, kHk, kD),
                                           rope::View<BFloat16>::token_major(v.data(), kL, kHk, kD));
  ra::Plan exact, bf16;

  Prompt() {
    ra::Shape shape = ra::Shape::of(cache, kHq);
    ra::plan(exact, shape, 0, kL, 1);
    shape.products = rope::Products::bf16;
    ra::plan(bf16, shape, 0, kL, 1);
  }
  void run(Mode mode) {
    rope::detail::tiles_allowed() = mode == Mode::amx;
    ra::Mask mask;
    mask.causal = true;
    ra::attend(mode == Mode::f32 ? exact : bf16, cache, rope::View<const BFloat16>::token_major(q.data(), kL, kHq, kD),
               rope::View<BFloat16>::token_major(out.data(), kL, kHq, kD), ra::Logits{}, mask);
    benchmark::DoNotOptimize(out.data());
    rope::detail::tiles_allowed() = true;
  }
};

// The bare GEMMs of the same multiply-adds (bench_attention.cpp's
// prefill/gemm_same_flops).
struct Gemm {
  const Eigen::Index rows = static_cast<Eigen::Index>(kHq / kHk * kL), half = static_cast<Eigen::Index>(kL / 2),
                     d = static_cast<Eigen::Index>(kD);
  const ra::Matrix<float> q = ra::Matrix<float>::Random(rows, d), k = ra::Matrix<float>::Random(half, d),
                          v = ra::Matrix<float>::Random(half, d);
  ra::Matrix<float> s = ra::Matrix<float>(rows, half), out = ra::Matrix<float>(rows, d);

  void operator()() {
    for (std::size_t g = 0; g < kHk; ++g) {
      s.noalias() = q * k.transpose();
      out.noalias() = s * v;
      benchmark::DoNotOptimize(out.data());
    }
  }
};

double prompt_flops() { return 2.0 * (double(kL) * double(kL + 1) / 2.0) * 2.0 * kD * kHq; }

void prefill_mode(benchmark::State& state, Mode mode) {
  if (mode == Mode::amx && !ra::detail::level_tiles_run<xsimd::default_arch>()) {
    state.SkipWithError("did not run: no AMX tiles on this CPU or OS");
    return;
  }
  Prompt p;
  Gemm gemm;
  std::vector<rope_bench::BaselineCall> baselines;
  if (mode != Mode::f32) baselines.push_back({"vs_f32", [&] { p.run(Mode::f32); }});
  baselines.push_back({"vs_gemm", [&] { gemm(); }});
  rope_bench::paired(
      state, 1, baselines, [&] { p.run(mode); }, [] {});
  state.counters["GFLOP/s"] =
      benchmark::Counter(prompt_flops() * 1e-9 * static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
  const char* path = mode == Mode::amx       ? "tdpbf16ps tiles"
                     : mode == Mode::bf16dot ? rope::detail::products_path<xsimd::default_arch>(rope::Products::bf16)
                                             : "float fma";
  state.SetLabel(std::string("scores by ") + path);
}

void prefill_gemm(benchmark::State& state) {
  Gemm gemm;
  for (auto _ : state) gemm();
  state.counters["GFLOP/s"] =
      benchmark::Counter(prompt_flops() * 1e-9 * static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
}

const bool kRegistered = [] {
  const std::pair<const char*, Mode> modes[] = {{"f32", Mode::f32}, {"bf16dot", Mode::bf16dot}, {"amx", Mode::amx}};
  for (const auto& [name, mode] : modes) {
    benchmark::RegisterBenchmark((std::string("attention/prefill_modes/") + name).c_str(), prefill_mode, mode)
        ->Unit(benchmark::kMillisecond)
        ->UseManualTime();
  }
  benchmark::RegisterBenchmark("attention/prefill_modes/gemm", prefill_gemm)
      ->Unit(benchmark::kMillisecond)
      ->UseRealTime();
  return true;
}();

}  // namespace
