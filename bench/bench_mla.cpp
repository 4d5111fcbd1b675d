// attention/mla_.../ and attention/dsa_...: multi-head latent attention
// (rope/attention/mla_attend.hpp), DeepSeek-V3 shape: 128 query heads, a
// latent row of kv_lora_rank 512 + qk_rope_head_dim 64 per token, pages of
// 64 rows handed out in a shuffled order. MLA is compute-bound (per cached
// row, 128 heads do 128 * (576 + 512) multiply-adds), so each case is timed
// against bare f32 GEMMs of the same FLOPs and shapes, in the same
// iterations (counter vs_gemm: the GEMMs' time over the case's, the case's
// speed in units of the GEMM rate; paired.hpp).
//
//   mla_decode/<kv>/T<n>   one new token for each of 16 sequences of cache
//                          lengths 256 .. 8192 (32000 keys in all), kv in f32
//                          bf16 i8, on n threads; T1 paired with the GEMMs
//                          (vs_gemm), T2 with T1 (vs_T1)
//   mla_decode/bf16dot/T1  the bf16 case in the bf16 product mode
//                          (Shape::products: on AMX tiles where they run),
//                          paired with the exact bf16 case (vs_exact) and
//                          with the GEMMs (vs_gemm)
//   mla_decode/gemm        per sequence [128 x 576] x [576 x L] and
//                          [128 x L] x [L x 512] over contiguous f32 rows
//   mla_prefill/bf16       one 2048-token prompt, causal, 1 thread
//   mla_prefill/gemm       the GEMMs of the same blocks of 4 tokens x 128
//                          heads against the keys each block sees
//   dsa_decode/bf16/T1     16 sequences of 32768 cached rows, each new token
//                          attending to 2048 of them (top-k indices)
//   dsa_decode/gemm        per sequence the GEMMs over 2048 contiguous rows
//   mla_prefill_sweep/absorbed/L<n>    a fresh prompt of n tokens, absorbed,
//                          timed against the unabsorbed form of the same
//                          prompt in the same iterations (vs_unabsorbed:
//                          above 1, the absorbed form is the faster)
//   mla_prefill_sweep/unabsorbed/L<n>  the unabsorbed form alone: the rows
//                          up-projected to per-head K (128 + 64 rope) and V
//                          (128) by one GEMM, then the multi-head causal
//                          softmax over them (rope::attention::softmax)
// The plan of a step is made once, outside the timing. The cache rows are
// random values of the cache's type (int8 with random scales).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <Eigen/Core>

#include <rope/attention.hpp>
#include <rope/attention/cascade_tiles.hpp>  // level_tiles_run

#include "memory.hpp"
#include "paired.hpp"
#include "shapes.hpp"

namespace {

namespace ra = rope::attention;
using Mat = ra::Matrix<float>;

constexpr std::size_t kHeads = 128, kLatent = 512, kRope = 64, kWidth = kLatent + kRope, kPage = 64;
constexpr std::int64_t kDecodeLengths[] = {8192, 4096, 4096, 2048, 2048, 2048, 1536, 1536,
                                           1024, 1024, 1024, 1024, 768,  768,  512,  256};
constexpr std::size_t kPrompt = 2048, kDsaLength = 32768, kTopK = 2048;

// A latent cache of `lengths` sequences of random rows in shuffled pages,
// the step's new tokens' queries, and its plan.
template <class E>
struct MlaCase {
  std::vector<std::int64_t> lengths, q_starts;
  std::vector<std::int32_t> block_table;
  std::size_t stride = 0;
  rope_bench::LineVector<E> rows;
  std::vector<float> scales;
  ra::LatentCache<E> cache;
  std::vector<float> q_lat, q_pe, out;
  ra::Plan plan;

  MlaCase(std::vector<std::int64_t> lens, std::size_t new_tokens, std::size_t threads,
          rope::Products products = rope::Products::exact)
      : lengths(std::move(lens)) {
    q_starts.push_back(0);
    std::size_t pages = 0;
    for (const std::int64_t l : lengths) {
      q_starts.push_back(q_starts.back() + static_cast<std::int64_t>(new_tokens));
      const std::size_t p = (static_cast<std::size_t>(l) + kPage - 1) / kPage;
      pages += p;
      stride = std::max(stride, p);
    }
    std::vector<std::int32_t> order(pages);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), std::mt19937(20240611));
    block_table.assign(lengths.size() * stride, 0);
    std::size_t next = 0;
    for (std::size_t b = 0; b < lengths.size(); ++b) {
      for (std::size_t i = 0; i < (static_cast<std::size_t>(lengths[b]) + kPage - 1) / kPage; ++i) {
        block_table[b * stride + i] = order[next++];
      }
    }
    rows.resize(pages * kPage * kWidth);
    Noise noise{12345, 1.0f};
    for (E& x : rows) x = static_cast<E>(rope::KvElement<E>::kScaled ? noise() * 127.0f : noise());
    if (rope::KvElement<E>::kScaled) {
      scales.resize(2 * pages * kPage);
      for (float& s : scales) s = (1.0f + noise()) / 254.0f;
    }
    cache =
        ra::LatentCache<E>::dense(rows.data(), pages, kPage, kLatent, kRope, scales.empty() ? nullptr : scales.data());
    const std::size_t tokens = static_cast<std::size_t>(q_starts.back());
    q_lat.resize(tokens * kHeads * kLatent);
    q_pe.resize(tokens * kHeads * kRope);
    out.resize(q_lat.size());
    for (float& x : q_lat) x = noise();
    for (float& x : q_pe) x = noise();
    ra::Shape shape = ra::Shape::of(cache, kHeads);
    shape.products = products;
    ra::plan(plan, shape, {q_starts.data(), lengths.data(), block_table.data(), stride, lengths.size()}, threads);
  }
  std::size_t tokens() const { return static_cast<std::size_t>(q_starts.back()); }
  void attend(const ra::Mask& mask = {}) {
    ra::Logits logits;
    logits.scale = 0.1352;  // DeepSeek-V3: mscale^2 / sqrt(192) at YaRN factor 40
    ra::attend(plan, cache, rope::View<const float>::token_major(q_lat.data(), tokens(), kHeads, kLatent),
               rope::View<const float>::token_major(q_pe.data(), tokens(), kHeads, kRope),
               rope::View<float>::token_major(out.data(), tokens(), kHeads, kLatent), logits, mask);
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
};

// Bare f32 GEMMs: rows of queries [rows x 576] against n contiguous key rows
// [n x 576], then [rows x n] against their first 512 columns.
struct Gemms {
  Mat q, keys, scores, acc;
  explicit Gemms(std::size_t rows, std::size_t max_keys) {
    Noise noise{7, 1.0f};
    q = Mat::NullaryExpr(static_cast<Eigen::Index>(rows), kWidth, [&] { return noise(); });
    keys = Mat::NullaryExpr(static_cast<Eigen::Index>(max_keys), kWidth, [&] { return noise(); });
    scores.resize(static_cast<Eigen::Index>(rows), static_cast<Eigen::Index>(max_keys));
    acc.resize(static_cast<Eigen::Index>(rows), kLatent);
  }
  void run(std::size_t rows, std::size_t n) {
    const auto r = static_cast<Eigen::Index>(rows), k = static_cast<Eigen::Index>(n);
    scores.topLeftCorner(r, k).noalias() = q.topRows(r) * keys.topRows(k).transpose();
    acc.topRows(r).noalias() = scores.topLeftCorner(r, k) * keys.topLeftCorner(k, kLatent);
    benchmark::DoNotOptimize(acc.data());
  }
};

void set_flops(benchmark::State& state, double macs) {
  state.counters["GFLOP/s"] =
      benchmark::Counter(2.0 * macs * 1e-9 * static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
}

double decode_macs(const std::vector<std::int64_t>& lengths, std::size_t keys_each = 0) {
  double keys = 0;
  for (const std::int64_t l : lengths) keys += keys_each > 0 ? double(keys_each) : double(l);
  return keys * double(kHeads) * double(kWidth + kLatent);
}

template <class E>
void mla_decode(benchmark::State& state, std::size_t threads) {
  const std::vector<std::int64_t> lengths(std::begin(kDecodeLengths), std::end(kDecodeLengths));
  MlaCase<E> c(lengths, 1, threads);
  std::unique_ptr<MlaCase<E>> one;
  Gemms gemms(kHeads, 8192);
  if (threads == 1) {
    rope_bench::paired(
        state, "vs_gemm", 1,
        [&] {
          for (const std::int64_t l : lengths) gemms.run(kHeads, static_cast<std::size_t>(l));
        },
        [&] { c.attend(); });
  } else {
    one = std::make_unique<MlaCase<E>>(lengths, 1, 1);
    rope_bench::paired(
        state, "vs_T1", 1, [&] { one->attend(); }, [&] { c.attend(); });
  }
  set_flops(state, decode_macs(lengths));
}

// The bf16 cache's decode step in the bf16 product mode, paired with the
// exact mode over the same cache (vs_exact) and with the GEMMs (vs_gemm).
void mla_decode_dot(benchmark::State& state) {
  const std::vector<std::int64_t> lengths(std::begin(kDecodeLengths), std::end(kDecodeLengths));
  MlaCase<rope::BFloat16> dot(lengths, 1, 1, rope::Products::bf16), exact(lengths, 1, 1);
  Gemms gemms(kHeads, 8192);
  rope_bench::paired(
      state, 1,
      {{"vs_exact", [&] { exact.attend(); }},
       {"vs_gemm",
        [&] {
          for (const std::int64_t l : lengths) gemms.run(kHeads, static_cast<std::size_t>(l));
        }}},
      [&] { dot.attend(); }, [] {});
  set_flops(state, decode_macs(lengths));
  state.SetLabel(ra::detail::level_tiles_run<xsimd::default_arch>() ? "scores by tdpbf16ps tiles"
                                                                    : "float GEMMs over bf16-rounded q and weights");
}

void mla_decode_gemm(benchmark::State& state) {
  const std::vector<std::int64_t> lengths(std::begin(kDecodeLengths), std::end(kDecodeLengths));
  Gemms gemms(kHeads, 8192);
  for (auto _ : state) {
    for (const std::int64_t l : lengths) gemms.run(kHeads, static_cast<std::size_t>(l));
  }
  set_flops(state, decode_macs(lengths));
}

// The prompt's GEMMs: blocks of kMlaRows / heads tokens against the keys
// their last token sees (what the case computes, without its softmax,
// gathers and masks).
void prefill_gemms(Gemms& gemms) {
  const std::size_t block = ra::kMlaRows / kHeads;
  for (std::size_t t = 0; t < kPrompt; t += block) gemms.run(block * kHeads, std::min(kPrompt, t + block));
}

double prefill_macs() {
  const std::size_t block = ra::kMlaRows / kHeads;
  double keys = 0;
  for (std::size_t t = 0; t < kPrompt; t += block) keys += double(std::min(kPrompt, t + block)) * double(block);
  return keys * double(kHeads) * double(kWidth + kLatent);
}

void mla_prefill(benchmark::State& state) {
  MlaCase<rope::BFloat16> c({static_cast<std::int64_t>(kPrompt)}, kPrompt, 1);
  Gemms gemms(ra::kMlaRows, kPrompt);
  rope_bench::paired(
      state, "vs_gemm", 1, [&] { prefill_gemms(gemms); }, [&] { c.attend(); });
  set_flops(state, prefill_macs());
}

void mla_prefill_gemm(benchmark::State& state) {
  Gemms gemms(ra::kMlaRows, kPrompt);
  for (auto _ : state) prefill_gemms(gemms);
  set_flops(state, prefill_macs());
}

void dsa_decode(benchmark::State& state) {
  const std::vector<std::int64_t> lengths(16, static_cast<std::int64_t>(kDsaLength));
  MlaCase<rope::BFloat16> c(lengths, 1, 1);
  // Each token's top-k: kTopK distinct positions of its cache, in the
  // order a selection gives them (not sorted).
  std::vector<std::int32_t> indices(lengths.size() * kTopK);
  std::mt19937 gen(99);
  std::vector<std::int32_t> all(kDsaLength);
  std::iota(all.begin(), all.end(), 0);
  for (std::size_t t = 0; t < lengths.size(); ++t) {
    std::shuffle(all.begin(), all.end(), gen);
    std::copy_n(all.begin(), kTopK, indices.begin() + static_cast<std::ptrdiff_t>(t * kTopK));
  }
  ra::Mask mask;
  mask.indices = indices.data();
  mask.topk = kTopK;
  Gemms gemms(kHeads, kTopK);
  rope_bench::paired(
      state, "vs_gemm", 1,
      [&] {
        for (std::size_t b = 0; b < lengths.size(); ++b) gemms.run(kHeads, kTopK);
      },
      [&] { c.attend(mask); });
  set_flops(state, decode_macs(lengths, kTopK));
}

void dsa_decode_gemm(benchmark::State& state) {
  Gemms gemms(kHeads, kTopK);
  for (auto _ : state) {
    for (std::size_t b = 0; b < 16; ++b) gemms.run(kHeads, kTopK);
  }
  set_flops(state, decode_macs(std::vector<std::int64_t>(16, 0), kTopK));
}

// The unabsorbed form of a fresh prompt of n tokens: the latent rows
// up-projected by W [512 x heads * (128 + 128)], each head's K the nope part
// with the shared rope part beside it, then the causal softmax over views.
struct Unabsorbed {
  static constexpr std::size_t kNope = 128, kV = 128, kQk = kNope + kRope;
  std::size_t n;
  Mat latent, weights, kv;
  std::vector<float> q, k, v, out, k_pe;
  explicit Unabsorbed(std::size_t tokens) : n(tokens) {
    Noise noise{31, 1.0f};
    const auto rows = static_cast<Eigen::Index>(n);
    latent = Mat::NullaryExpr(rows, kLatent, [&] { return noise(); });
    weights =
        Mat::NullaryExpr(kLatent, static_cast<Eigen::Index>(kHeads * (kNope + kV)), [&] { return 0.05f * noise(); });
    kv.resize(rows, static_cast<Eigen::Index>(kHeads * (kNope + kV)));
    q.resize(n * kHeads * kQk);
    k.resize(n * kHeads * kQk);
    v.resize(n * kHeads * kV);
    out.resize(n * kHeads * kV);
    k_pe.resize(n * kRope);
    for (float& x : q) x = noise();
    for (float& x : k_pe) x = noise();
  }
  void run() {
    kv.noalias() = latent * weights;
    for (std::size_t t = 0; t < n; ++t) {
      const float* row = kv.row(static_cast<Eigen::Index>(t)).data();
      for (std::size_t h = 0; h < kHeads; ++h) {
        float* kh = &k[(t * kHeads + h) * kQk];
        std::copy_n(row + h * (kNope + kV), kNope, kh);
        std::copy_n(&k_pe[t * kRope], kRope, kh + kNope);
        std::copy_n(row + h * (kNope + kV) + kNope, kV, &v[(t * kHeads + h) * kV]);
      }
    }
    ra::SoftmaxOptions o;  // causal; q and k rotated already
    o.keys_rotated = true;
    o.logits.scale = 0.1352;
    ra::softmax<float>(rope::View<const float>::token_major(q.data(), n, kHeads, kQk),
                       rope::View<const float>::token_major(k.data(), n, kHeads, kQk),
                       rope::View<const float>::token_major(v.data(), n, kHeads, kV),
                       rope::View<float>::token_major(out.data(), n, kHeads, kV), {}, o);
    benchmark::DoNotOptimize(out.data());
  }
};

void sweep_absorbed(benchmark::State& state, std::size_t n) {
  MlaCase<rope::BFloat16> c({static_cast<std::int64_t>(n)}, n, 1);
  Unabsorbed u(n);
  rope_bench::paired(
      state, "vs_unabsorbed", 1, [&] { u.run(); }, [&] { c.attend(); });
}

void sweep_unabsorbed(benchmark::State& state, std::size_t n) {
  Unabsorbed u(n);
  for (auto _ : state) u.run();
}

template <class E>
void register_decode(const char* kv) {
  for (const std::size_t threads : {std::size_t{1}, std::size_t{2}}) {
    benchmark::RegisterBenchmark(("attention/mla_decode/" + std::string(kv) + "/T" + std::to_string(threads)).c_str(),
                                 mla_decode<E>, threads)
        ->Unit(benchmark::kMillisecond)
        ->UseManualTime();
  }
}

const bool kRegistered = [] {
  register_decode<float>("f32");
  register_decode<rope::BFloat16>("bf16");
  register_decode<std::int8_t>("i8");
  benchmark::RegisterBenchmark("attention/mla_decode/bf16dot/T1", mla_decode_dot)
      ->Unit(benchmark::kMillisecond)
      ->UseManualTime();
  benchmark::RegisterBenchmark("attention/mla_decode/gemm", mla_decode_gemm)
      ->Unit(benchmark::kMillisecond)
      ->UseRealTime();
  benchmark::RegisterBenchmark("attention/mla_prefill/bf16", mla_prefill)
      ->Unit(benchmark::kMillisecond)
      ->UseManualTime();
  benchmark::RegisterBenchmark("attention/mla_prefill/gemm", mla_prefill_gemm)
      ->Unit(benchmark::kMillisecond)
      ->UseRealTime();
  benchmark::RegisterBenchmark("attention/dsa_decode/bf16/T1", dsa_decode)
      ->Unit(benchmark::kMillisecond)
      ->UseManualTime();
  benchmark::RegisterBenchmark("attention/dsa_decode/gemm", dsa_decode_gemm)
      ->Unit(benchmark::kMillisecond)
      ->UseRealTime();
  for (const std::size_t n : {std::size_t{128}, std::size_t{256}, std::size_t{512}, std::size_t{1024}}) {
    const std::string tail = "/L" + std::to_string(n);
    benchmark::RegisterBenchmark(("attention/mla_prefill_sweep/absorbed" + tail).c_str(), sweep_absorbed, n)
        ->Unit(benchmark::kMillisecond)
        ->UseManualTime();
    benchmark::RegisterBenchmark(("attention/mla_prefill_sweep/unabsorbed" + tail).c_str(), sweep_unabsorbed, n)
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime();
  }
  return true;
}();

}  // namespace
