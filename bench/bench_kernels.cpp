// kernel/<pairing>/<variant>/<shape> and kernel/-/memcpy/<shape>: the row
// kernel applied to every head of every token of a [tokens, heads, head_dim]
// (SIMD: rope::rotate_heads once per token; reference: one call per head)
// f32 tensor, next to a memcpy of the same bytes and the scalar reference
// built with the same flags, so every figure is read as a ratio from one run.
//
// Variants: simd and reference (out of place, forward), simd_in_place,
// reference_in_place, simd_inverse (out of place, Direction::inverse) and
// simd_unaligned (out of place, both tensors 16 bytes off a cache line;
// every other case is 64-byte aligned). Out of place with partial rotary also
// copies the pass-through channels, so the output is the whole tensor, as a
// memcpy's would be (simd: a token's heads copied whole, then rotated in
// place in the output, as rope::apply does; reference: the rest of each
// head after it); in place leaves them alone.
//
// Counters, the same for every case of a shape: bytes = the tensor read once
// and written once (2 x its size, whatever the variant touches), so bytes/s
// ratios are time ratios; items = head vectors rotated, so 1e9 / items_per_second
// is ns per head; vs_memcpy = the case's speed over a memcpy of the same
// bytes timed in the same iterations (paired.hpp), which the report reads
// for the "/ memcpy" rows. kernel/-/memcpy/<shape> is the memcpy alone.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <map>
#include <memory>
#include <new>
#include <random>
#include <string>
#include <utility>

#include <rope/kernels.hpp>
#include <rope/reference.hpp>
#include <rope/table.hpp>

#include "paired.hpp"
#include "shapes.hpp"

namespace {

using rope::Direction;
using rope::Style;
using rope_bench::Shape;

// Buffers start on a 64-byte boundary (a cache line, one AVX-512 vector), as
// the tensors of ML frameworks usually do; with head vectors of 64, 96 or 128
// floats every row is then aligned too. The simd_unaligned variant shifts both
// tensors by kUnalignedOffset floats to show what a misaligned tensor costs.
constexpr std::size_t kAlignment = 64;
constexpr std::size_t kUnalignedOffset = 4;  // 16 bytes: where malloc puts big blocks

struct FreeDeleter {
  void operator()(float* p) const noexcept { std::free(p); }
};

class Buffer {
 public:
  // Room for n floats after an offset of up to kUnalignedOffset.
  explicit Buffer(std::size_t n) : size_(n) {
    const std::size_t bytes = (n + kUnalignedOffset) * sizeof(float);
    const std::size_t rounded = (bytes + kAlignment - 1) / kAlignment * kAlignment;
    data_.reset(static_cast<float*>(std::aligned_alloc(kAlignment, rounded)));
    if (!data_) throw std::bad_alloc();
    std::fill_n(data_.get(), n + kUnalignedOffset, 0.0f);
  }
  float* data() noexcept { return data_.get(); }
  const float* data() const noexcept { return data_.get(); }
  std::size_t size() const noexcept { return size_; }

 private:
  std::size_t size_;
  std::unique_ptr<float[], FreeDeleter> data_;
};

enum class Impl { simd, reference };
enum class Placement { out_of_place, in_place };

struct Variant {
  const char* name;
  Impl impl;
  Placement placement;
  Direction dir;
  std::size_t offset = 0;  // floats from the 64-byte boundary, input and output alike
};

constexpr Variant kSimd{"simd", Impl::simd, Placement::out_of_place, Direction::forward};
constexpr Variant kReference{"reference", Impl::reference, Placement::out_of_place, Direction::forward};
constexpr Variant kSimdInPlace{"simd_in_place", Impl::simd, Placement::in_place, Direction::forward};
constexpr Variant kSimdInverse{"simd_inverse", Impl::simd, Placement::out_of_place, Direction::inverse};
constexpr Variant kReferenceInPlace{"reference_in_place", Impl::reference, Placement::in_place, Direction::forward};
constexpr Variant kSimdUnaligned{"simd_unaligned", Impl::simd, Placement::out_of_place, Direction::forward,
                                 kUnalignedOffset};

// The inputs of the big shapes take a while to fill and Google Benchmark
// calls a case several times while it sizes the run, so they are made once.
const Buffer& input(const Shape& shape) {
  static std::map<std::string, Buffer> cache;
  auto it = cache.find(shape.name);
  if (it == cache.end()) {
    std::mt19937 gen(42);
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    Buffer b(shape.elements());
    for (std::size_t i = 0; i < shape.elements() + kUnalignedOffset; ++i) b.data()[i] = dist(gen);
    it = cache.emplace(shape.name, std::move(b)).first;
  }
  return it->second;
}

const rope::Table<float>& table(std::size_t rotary_dim, std::size_t positions) {
  static std::map<std::pair<std::size_t, std::size_t>, std::unique_ptr<rope::Table<float>>> cache;
  auto& slot = cache[{rotary_dim, positions}];
  if (!slot) slot = std::make_unique<rope::Table<float>>(rope::frequencies(rotary_dim), positions);
  return *slot;
}

void set_counters(benchmark::State& state, const Shape& shape) {
  const auto bytes = static_cast<std::int64_t>(shape.elements() * 2 * sizeof(float));
  state.SetBytesProcessed(state.iterations() * bytes);
  state.SetItemsProcessed(state.iterations() * static_cast<std::int64_t>(shape.rows()));
}

// Calls per timed stretch of a paired case: about 20 us of work, so that
// reading the clock is no part of what a short case measures.
std::size_t calls_for(const Shape& shape) {
  const std::size_t bytes = shape.elements() * sizeof(float);
  constexpr std::size_t kStretch = std::size_t(1) << 20;  // ~20 us of memcpy at ~50 GB/s
  return bytes >= kStretch ? 1 : kStretch / bytes;
}

// Token t of the shape sits at position first_position + t of a table of
// table_positions rows (0: just enough rows).
struct Case {
  Shape shape;
  std::size_t first_position;
  std::size_t table_positions;
};

template <Style S, Impl I>
void rotate_tensor(benchmark::State& state, Case c, Variant v) {
  const Shape& shape = c.shape;
  const auto& t = table(shape.rotary_dim, std::max(c.table_positions, c.first_position + shape.tokens));
  const Buffer& in = input(shape);
  // In place rotates its own copy of the input over and over: rotations keep
  // the norm, so the values stay in range however many iterations run.
  Buffer out(in.size());
  if (v.placement == Placement::in_place) {
    std::copy_n(in.data(), in.size() + kUnalignedOffset, out.data());
  }
  float* y = out.data() + v.offset;
  const float* x = v.placement == Placement::in_place ? y : in.data() + v.offset;
  const std::size_t d = shape.head_dim;
  const std::size_t r = shape.rotary_dim;
  const bool copy_rest = v.placement == Placement::out_of_place && r < d;
  const Direction dir = v.dir;
  const auto rotate = [&] {
    // The position is data, as in a decode step: the table row is looked up.
    std::size_t first = c.first_position;
    benchmark::DoNotOptimize(first);
    for (std::size_t tok = 0; tok < shape.tokens; ++tok) {
      const float* cos = t.cos(first + tok);
      const float* sin = t.sin(first + tok);
      const std::size_t token = tok * shape.heads * d;
      if constexpr (I == Impl::simd) {
        // All heads of the token share the row: prepared once, applied to
        // each. With pass-through channels, as rope::apply does it: the
        // token's heads copied whole, then rotated in place in the output.
        const auto stride = static_cast<std::ptrdiff_t>(d);
        const float* from = x + token;
        if (copy_rest) {
          std::memcpy(y + token, x + token, shape.heads * d * sizeof(float));
          from = y + token;
        }
        rope::rotate_heads<S>(from, stride, y + token, stride, shape.heads, cos, sin, r, dir);
      } else {
        for (std::size_t h = 0; h < shape.heads; ++h) {
          rope::reference::rotate<S>(x + token + h * d, y + token + h * d, cos, sin, r, dir);
          if (copy_rest) std::memcpy(y + token + h * d + r, x + token + h * d + r, (d - r) * sizeof(float));
        }
      }
    }
    benchmark::DoNotOptimize(y);
    benchmark::ClobberMemory();
  };
  // Paired with a memcpy of the same bytes from the input into the output
  // (in place: the output is then the tensor rotated, a fresh copy each
  // time); counter vs_memcpy (paired.hpp).
  const float* from = in.data() + v.offset;
  const std::size_t bytes = shape.elements() * sizeof(float);
  const auto copy = [&] {
    std::memcpy(y, from, bytes);
    benchmark::DoNotOptimize(y);
    benchmark::ClobberMemory();
  };
  rope_bench::paired(state, "vs_memcpy", calls_for(shape), copy, rotate);
  set_counters(state, shape);
}

void copy_tensor(benchmark::State& state, Shape shape) {
  const Buffer& x = input(shape);
  Buffer y(x.size());
  for (auto _ : state) {
    std::memcpy(y.data(), x.data(), x.size() * sizeof(float));
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  set_counters(state, shape);
}

template <Style S>
void register_variant(const Case& c, const Variant& v) {
  const std::string name = std::string("kernel/") + rope::name(S) + "/" + v.name + "/" + c.shape.name;
  if (v.impl == Impl::simd) {
    benchmark::RegisterBenchmark(name.c_str(), rotate_tensor<S, Impl::simd>, c, v)->UseManualTime();
  } else {
    benchmark::RegisterBenchmark(name.c_str(), rotate_tensor<S, Impl::reference>, c, v)->UseManualTime();
  }
}

void register_shape(const Case& c, std::initializer_list<Variant> variants) {
  for (const Variant& v : variants) register_variant<Style::rotate_half>(c, v);
  for (const Variant& v : variants) register_variant<Style::block_diagonal>(c, v);
  benchmark::RegisterBenchmark((std::string("kernel/-/memcpy/") + c.shape.name).c_str(), copy_tensor, c.shape);
}

const bool registered = [] {
  // The architecture the kernels were compiled for, in the JSON's context.
  benchmark::AddCustomContext("rope_simd_arch", xsimd::default_arch::name());
  register_shape({rope_bench::kL2Small, 0, 0},
                 {kSimd, kReference, kSimdInPlace, kReferenceInPlace, kSimdInverse, kSimdUnaligned});
  register_shape({rope_bench::kEncoderSmall, 0, 0}, {kSimd, kReference, kSimdInPlace});
  register_shape({rope_bench::kLlama3Prefill, 0, 0}, {kSimd, kReference, kSimdInPlace, kSimdInverse, kSimdUnaligned});
  register_shape({rope_bench::kNeox20bPartial, 0, 0}, {kSimd, kReference, kSimdInPlace});
  register_shape({rope_bench::kLlama3Decode, rope_bench::kDecodePosition, rope_bench::kDecodeTablePositions},
                 {kSimdInPlace, kReferenceInPlace});
  return true;
}();

}  // namespace
