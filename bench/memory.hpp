// What rope_bench's cases share about memory: random values cheap enough to
// fill a cache of hundreds of megabytes, a read of exactly some bytes (the
// limit of a step that only reads them), and dropping bytes from every
// cache level. In an anonymous namespace on purpose, like batch_cases.hpp:
// each translation unit compiles its own copy with its own flags
// (baseline.cpp has a user's).
#pragma once

#include <cstddef>
#include <cstdint>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include <rope/detail/simd.hpp>
#include <xsimd/xsimd.hpp>

namespace {

// Values in [-amplitude, amplitude): xorshift.
struct Noise {
  std::uint32_t s;
  float amplitude = 0.5f;
  float operator()() noexcept {
    s ^= s << 13;
    s ^= s >> 17;
    s ^= s << 5;
    return static_cast<float>(s >> 8) * (2 * amplitude / 16777216.0f) - amplitude;
  }
};

// One SIMD pass summing n 32-bit words: a read of exactly those bytes.
inline std::uint32_t sum_words(const std::uint32_t* p, std::size_t n) noexcept {
  using B = xsimd::batch<std::uint32_t>;
  constexpr std::size_t W = B::size;
  B a0(0u), a1(0u), a2(0u), a3(0u);
  std::size_t i = 0;
  for (; i + 4 * W <= n; i += 4 * W) {
    a0 += B::load_unaligned(p + i);
    a1 += B::load_unaligned(p + i + W);
    a2 += B::load_unaligned(p + i + 2 * W);
    a3 += B::load_unaligned(p + i + 3 * W);
  }
  std::uint32_t s = rope::detail::sum_lanes((a0 + a1) + (a2 + a3));
  for (; i < n; ++i) s += p[i];
  return s;
}

// Writes back and drops the lines of [p, p + bytes) from every cache level
// (x86: CLFLUSHOPT where the build targets it, else CLFLUSH); false where
// the instruction set has no such instruction.
inline bool flush_bytes(const void* p, std::size_t bytes) noexcept {
#if defined(__x86_64__) || defined(__i386__)
  const auto first = reinterpret_cast<std::uintptr_t>(p) & ~std::uintptr_t{63};
  const auto end = reinterpret_cast<std::uintptr_t>(p) + bytes;
  for (std::uintptr_t line = first; line < end; line += 64) {
#if defined(__CLFLUSHOPT__)
    _mm_clflushopt(reinterpret_cast<void*>(line));
#else
    _mm_clflush(reinterpret_cast<const void*>(line));
#endif
  }
  _mm_mfence();
  return true;
#else
  (void)p;
  (void)bytes;
  return false;
#endif
}

}  // namespace
