// rope/fp8.hpp — rope's 8-bit float storage types, the two OCP FP8 formats:
//
//   Float8E4M3  sign, 4 exponent bits (bias 7), 3 mantissa bits; no
//               infinities, NaN only at S.1111.111 (0x7f, 0xff); largest
//               finite 448 = 1.75 * 2^8; subnormals m * 2^-9, m in 1..7.
//   Float8E5M2  sign, 5 exponent bits (bias 15), 2 mantissa bits: the top
//               byte of an IEEE binary16, with its infinities (0x7c, 0xfc)
//               and NaNs; largest finite 57344 = 1.75 * 2^15; subnormals
//               m * 2^-16, m in 1..3.
//
// Encoding rounds to nearest, ties to the even code (the one whose lowest
// bit is 0), in integer arithmetic on the float's bits: the same code in any
// floating-point rounding mode, with or without flush-to-zero. Beyond the
// largest finite value it saturates: a finite float of larger magnitude
// becomes +-448 (+-57344); an infinity becomes NaN in E4M3, which has none,
// and stays infinite in E5M2. A NaN stays a NaN. Decoding is exact: every
// code but the NaNs is a float, zero and subnormals included.
//
// Like BFloat16 and Float16 (half.hpp) they are trivially copyable structs
// holding the raw bits, with explicit conversions both ways. In a KV cache
// (attention/cache.hpp) a row of them carries one float scale per token and
// head, as int8 rows do (kernels/kv_store.hpp).
#pragma once

#include <cstdint>
#include <limits>

#include "half.hpp"

namespace rope {
namespace detail {

// The shape of one FP8 format: kMant stored mantissa bits, exponent bias
// kBias, kMax the largest finite code's magnitude bits.
template <int Mant, int Bias, std::uint8_t MaxCode>
struct Fp8Format {
  static constexpr int kMant = Mant;
  static constexpr int kBias = Bias;
  static constexpr std::uint8_t kMax = MaxCode;
};
using E4M3Format = Fp8Format<3, 7, 0x7e>;
using E5M2Format = Fp8Format<2, 15, 0x7b>;

// |f|'s code (no sign bit) for a finite f, saturated at F::kMax. A float
// a = m24 * 2^(e - 23) (m24 with its leading bit; e >= -126) has in the
// format the step 2^(max(e, 1 - bias) - mant): the code is m24 shifted
// right by the difference, rounded to nearest even, plus the biased
// exponent above the format's least (a carry out of the mantissa bumps the
// exponent, as it should).
template <class F>
inline std::uint8_t fp8_magnitude(std::uint32_t u) noexcept {
  const std::uint32_t field = (u >> 23) & 0xffu;
  const std::uint32_t m24 = field == 0 ? (u & 0x7fffffu) : ((u & 0x7fffffu) | 0x800000u);
  const int e = field == 0 ? -126 : static_cast<int>(field) - 127;
  constexpr int kLeast = 1 - F::kBias;   // the least normal exponent
  if (e > F::kBias + 1) return F::kMax;  // at least twice the largest finite
  const int step = e > kLeast ? e : kLeast;
  const int shift = 23 - F::kMant + (step - e);
  if (shift >= 25) return 0;  // below half the least subnormal (m24 < 2^24)
  const std::uint32_t half = 1u << (shift - 1);
  const std::uint32_t kept = m24 >> shift;
  const std::uint32_t dropped = m24 & ((1u << shift) - 1u);
  const std::uint32_t rounded = kept + (dropped > half || (dropped == half && (kept & 1u)) ? 1u : 0u);
  // Subnormal steps: rounded is the code; normal: rounded holds the leading
  // bit, which the exponent field's count replaces.
  const std::uint32_t code = e >= kLeast ? (static_cast<std::uint32_t>(e - kLeast) << F::kMant) + rounded : rounded;
  return static_cast<std::uint8_t>(code > F::kMax ? F::kMax : code);
}

inline std::uint8_t float_to_e4m3_bits(float f) noexcept {
  const std::uint32_t u = float_bits(f);
  const auto sign = static_cast<std::uint8_t>((u >> 24) & 0x80u);
  if ((u & 0x7f800000u) == 0x7f800000u) return static_cast<std::uint8_t>(sign | 0x7fu);  // NaN, infinity
  return static_cast<std::uint8_t>(sign | fp8_magnitude<E4M3Format>(u));
}
inline std::uint8_t float_to_e5m2_bits(float f) noexcept {
  const std::uint32_t u = float_bits(f);
  const auto sign = static_cast<std::uint8_t>((u >> 24) & 0x80u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint8_t>(sign | 0x7fu);   // NaN
  if ((u & 0x7fffffffu) == 0x7f800000u) return static_cast<std::uint8_t>(sign | 0x7cu);  // infinity
  return static_cast<std::uint8_t>(sign | fp8_magnitude<E5M2Format>(u));
}

// Exact decodes: a normal code's exponent rebiased onto binary32's (its
// mantissa bits moved up), a subnormal's integer mantissa times its step.
inline float e4m3_bits_to_float(std::uint8_t b) noexcept {
  const std::uint32_t mag = b & 0x7fu;
  const std::uint32_t sign = static_cast<std::uint32_t>(b & 0x80u) << 24;
  if (mag == 0x7fu) return bits_float(sign | 0x7fc00000u);
  const float v = mag < 8u ? static_cast<float>(mag) * 0x1p-9f : bits_float((mag << 20) + (120u << 23));
  return bits_float(float_bits(v) | sign);
}
inline float e5m2_bits_to_float(std::uint8_t b) noexcept {
  return float16_bits_to_float(static_cast<std::uint16_t>(b << 8));
}

}  // namespace detail

struct Float8E4M3 {
  std::uint8_t bits;
  Float8E4M3() = default;
  explicit Float8E4M3(float f) noexcept : bits(detail::float_to_e4m3_bits(f)) {}
  explicit operator float() const noexcept { return detail::e4m3_bits_to_float(bits); }
  static Float8E4M3 from_bits(std::uint8_t b) noexcept {
    Float8E4M3 x;
    x.bits = b;
    return x;
  }
  // The largest finite magnitude: a cache row's scale maps its largest
  // value onto it.
  static constexpr float max() noexcept { return 448.0f; }
};

struct Float8E5M2 {
  std::uint8_t bits;
  Float8E5M2() = default;
  explicit Float8E5M2(float f) noexcept : bits(detail::float_to_e5m2_bits(f)) {}
  explicit operator float() const noexcept { return detail::e5m2_bits_to_float(bits); }
  static Float8E5M2 from_bits(std::uint8_t b) noexcept {
    Float8E5M2 x;
    x.bits = b;
    return x;
  }
  static constexpr float max() noexcept { return 57344.0f; }
};

namespace detail {
// One stored value of a KV cache as float, exactly (before its row's
// scale), beside half.hpp's for the other element types.
inline float widen_value(Float8E4M3 x) noexcept { return e4m3_bits_to_float(x.bits); }
inline float widen_value(Float8E5M2 x) noexcept { return e5m2_bits_to_float(x.bits); }
}  // namespace detail

static_assert(sizeof(Float8E4M3) == 1 && sizeof(Float8E5M2) == 1, "one byte per value");

}  // namespace rope
