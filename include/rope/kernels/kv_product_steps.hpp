// rope/kernels/kv_product_steps.hpp — the product modes (Products, and
// kv_products.hpp's header comment) value by value: their blocks and rows,
// q rounded to bf16 or quantized to int8, the bf16 mode's lane steps and
// tree, the int8 mode's integer sum, and what decides whether a bf16 key
// may take float fused multiply-adds. The instruction paths of
// kv_products.hpp give these bits; the lane steps are also what runs where
// no instruction does.
#pragma once

#include <cfloat>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#endif

#include "../detail/inline.hpp"
#include "../half.hpp"
#include "kv_store.hpp"

namespace rope {
namespace detail {

constexpr std::size_t kBf16Block = 32;  // channels per block of the bf16 mode
constexpr std::size_t kBf16Lanes = 16;
constexpr std::size_t kInt8Block = 64;  // bytes per block of the int8 mode

ROPE_ALWAYS_INLINE std::size_t bf16_row(std::size_t d) noexcept {
  return (d + kBf16Block - 1) / kBf16Block * kBf16Block;
}
ROPE_ALWAYS_INLINE std::size_t int8_row(std::size_t d) noexcept {
  return (d + kInt8Block - 1) / kInt8Block * kInt8Block;
}

// Whether the running CPU has AVX512-VNNI (CPUID leaf 7, ECX bit 11), asked
// once.
template <class Arch>
bool avx512_vnni_runs() noexcept {
#if defined(__x86_64__) && defined(__GNUC__)
  static const bool runs = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (__get_cpuid_max(0, nullptr) < 7) return false;
    __cpuid_count(7, 0, a, b, c, d);
    return (c & (1u << 11)) != 0;
  }();
  return runs;
#else
  return false;
#endif
}

// Whether the mode's instruction may be used (tests turn it off to hold the
// float and integer lanes to the instruction's bits on one machine).
inline bool& products_hardware_allowed() noexcept {
  static bool allowed = true;
  return allowed;
}

// x flushed to a zero of its sign below 2^-126 (NaN and infinities kept).
ROPE_ALWAYS_INLINE float flush(float x) noexcept { return std::fabs(x) < FLT_MIN ? std::copysign(0.0f, x) : x; }

// The lanes' tree of the bf16 mode.
ROPE_ALWAYS_INLINE float bf16_tree(const float* s) noexcept {
  float t[kBf16Lanes];
  for (std::size_t i = 0; i < kBf16Lanes; ++i) t[i] = s[i];
  for (std::size_t w = 1; w < kBf16Lanes; w *= 2) {
    for (std::size_t i = 0; i < kBf16Lanes; i += 2 * w) t[i] = t[i] + t[i + w];
  }
  return t[0];
}

// A row of d floats as the bf16 mode's q: rounded to nearest even, a
// subnormal result flushed to a zero of its sign, padded with +0 to a
// whole block.
ROPE_ALWAYS_INLINE void bf16_query(const float* x, std::size_t d, std::uint16_t* out) noexcept {
  for (std::size_t c = 0; c < d; ++c) {
    std::uint16_t b = float_to_bfloat16_bits(x[c]);
    if ((b & 0x7f80u) == 0) b &= 0x8000u;  // zero or subnormal: a zero of its sign
    out[c] = b;
  }
  for (std::size_t c = d; c < bf16_row(d); ++c) out[c] = 0;
}

// The 16 lane sums of the bf16 mode for one row q (bf16_row(d) values)
// against one key of d stored values, lane by lane: each product exact in
// double (two 8-bit significands), each sum rounded once to float (through
// double: exact, or so far below the float's half ulp that the double's own
// rounding cannot reach a float tie), then flushed.
ROPE_ALWAYS_INLINE void bf16_lanes(const std::uint16_t* q, const BFloat16* key, std::size_t d, float* lanes) noexcept {
  for (std::size_t i = 0; i < kBf16Lanes; ++i) lanes[i] = 0.0f;
  const auto* k = reinterpret_cast<const std::uint16_t*>(key);
  for (std::size_t base = 0; base < d; base += kBf16Block) {
    for (std::size_t i = 0; i < kBf16Lanes; ++i) {
      const std::size_t e = base + 2 * i, o = e + 1;
      const double pe =
          e < d ? static_cast<double>(bfloat16_bits_to_float(q[e])) * flush(bfloat16_bits_to_float(k[e])) : 0.0;
      const double po =
          o < d ? static_cast<double>(bfloat16_bits_to_float(q[o])) * flush(bfloat16_bits_to_float(k[o])) : 0.0;
      const float s = flush(static_cast<float>(static_cast<double>(lanes[i]) + po));
      lanes[i] = flush(static_cast<float>(static_cast<double>(s) + pe));
    }
  }
}

// The least exponent field over the nonzero values of n bf16 values: 0
// where one is subnormal, an infinity or NaN (its products must be
// flushed or are not finite: the lanes' steps), 0x1ff where all are zero.
ROPE_ALWAYS_INLINE unsigned bf16_least_exponent(const std::uint16_t* x, std::size_t n) noexcept {
  unsigned least = 0x1ff;
  for (std::size_t c = 0; c < n; ++c) {
    const unsigned a = x[c] & 0x7fffu;
    if (a == 0) continue;
    if (a >= 0x7f80u || a < 0x80u) return 0;
    least = (a >> 7) < least ? (a >> 7) : least;
  }
  return least;
}

// Whether rows of least exponent field q_least meet a key of k_least in
// fused multiply-adds (see kBf16FusedArch).
ROPE_ALWAYS_INLINE bool bf16_fused_exact(unsigned q_least, unsigned k_least) noexcept {
  return q_least != 0 && k_least != 0 && q_least + k_least >= 142;
}

// A row of bf16_query widened for the fused twin: per block of 32
// channels, the values of its 16 odd channels (lane i: channel 2i + 1),
// then of its 16 even ones, as floats (exact).
ROPE_ALWAYS_INLINE void bf16_query_wide(const std::uint16_t* q, std::size_t d, float* out) noexcept {
  for (std::size_t base = 0; base < bf16_row(d); base += kBf16Block) {
    for (std::size_t i = 0; i < kBf16Lanes; ++i) {
      out[base + i] = bfloat16_bits_to_float(q[base + 2 * i + 1]);
      out[base + kBf16Lanes + i] = bfloat16_bits_to_float(q[base + 2 * i]);
    }
  }
}

// A row of d floats as the int8 mode's q (see the header comment): its
// bytes padded with 0 to a whole block, its scale and the sum of its bytes;
// false when the row holds a NaN or an infinity (its scores are NaN).
ROPE_ALWAYS_INLINE bool int8_query(const float* x, std::size_t d, std::int8_t* out, float* scale,
                                   std::int32_t* sum) noexcept {
  float top = 0.0f;
  bool finite = true;
  for (std::size_t c = 0; c < d; ++c) {
    finite = finite && std::isfinite(x[c]);
    top = std::fabs(x[c]) > top ? std::fabs(x[c]) : top;
  }
  *scale = finite ? int8_scale(top) : std::numeric_limits<float>::quiet_NaN();
  *sum = 0;
  for (std::size_t c = 0; c < int8_row(d); ++c) {
    float v = 0.0f;
    if (c < d && finite && top > 0.0f) v = std::nearbyint(x[c] / *scale);
    v = v > 127.0f ? 127.0f : v < -127.0f ? -127.0f : v;
    out[c] = static_cast<std::int8_t>(v);
    *sum += out[c];
  }
  return finite;
}

// sum_c q_c k_c of one row against one key, in integers.
ROPE_ALWAYS_INLINE std::int32_t int8_sum(const std::int8_t* q, const std::int8_t* key, std::size_t d) noexcept {
  std::int32_t s = 0;
  for (std::size_t c = 0; c < d; ++c) s += static_cast<std::int32_t>(q[c]) * key[c];
  return s;
}

}  // namespace detail
}  // namespace rope
