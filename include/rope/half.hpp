// rope/half.hpp — rope's own 16-bit storage types: BFloat16 and Float16.
//
// A 16-bit tensor is stored in 16 bits and computed in fp32 lanes:
//   widen (exact) -> rotate in float -> narrow once, round to nearest even.
// BFloat16 is the top half of an IEEE binary32 (8 exponent bits, 7 stored
// mantissa bits); Float16 is IEEE binary16 (5 exponent bits, 10 stored
// mantissa bits, subnormals below 2^-14, overflow to infinity at 65520).
//
// Both are trivially copyable structs holding the raw bits, so a tensor of
// them is a plain array of std::uint16_t with a type that says how to read
// it. Conversions are explicit both ways, like any narrowing. The tensor API
// also accepts other 2-byte types with explicit float conversions (for
// example Eigen::bfloat16 and Eigen::half) without including their headers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace rope {
namespace detail {

inline std::uint32_t float_bits(float f) noexcept {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
inline float bits_float(std::uint32_t u) noexcept {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// Round to nearest even on the 16 dropped bits: adding 0x7fff plus the lowest
// kept bit carries into the kept part exactly when the dropped part is above
// half, or equal to half with an odd kept part. NaNs keep their sign and top
// payload bits and are forced quiet so that rounding cannot turn them into
// infinities.
inline std::uint16_t float_to_bfloat16_bits(float f) noexcept {
  const std::uint32_t u = float_bits(f);
  const std::uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const bool nan = (u & 0x7fffffffu) > 0x7f800000u;
  return static_cast<std::uint16_t>(nan ? ((u >> 16) | 0x0040u) : rounded);
}
inline float bfloat16_bits_to_float(std::uint16_t b) noexcept {
  return bits_float(static_cast<std::uint32_t>(b) << 16);
}

// binary32 -> binary16, round to nearest even, written as selects so that a
// loop of them vectorises.
//   |f| >= 2^-14 (normal): rebias the exponent (127 -> 15) and round the
//     23-bit mantissa to 10 bits with the same carry trick as above; a carry
//     out of the mantissa correctly bumps the exponent.
//   |f| <  2^-14 (subnormal or zero): |f| + 0.5f has an ulp of 2^-24, the
//     binary16 subnormal step, so the FPU's own rounding gives the result.
//   |f| >= 65520 rounds to infinity; NaN stays NaN (quiet).
inline std::uint16_t float_to_float16_bits(float f) noexcept {
  const std::uint32_t u = float_bits(f);
  const std::uint32_t sign = (u >> 16) & 0x8000u;
  const std::uint32_t a = u & 0x7fffffffu;
  const std::uint32_t rebiased = a - 0x38000000u;  // (127 - 15) << 23
  const std::uint32_t normal = (rebiased + 0x0fffu + ((rebiased >> 13) & 1u)) >> 13;
  const std::uint32_t subnormal = float_bits(bits_float(a) + 0.5f) - 0x3f000000u;
  std::uint32_t h = a < 0x38800000u ? subnormal : normal;
  h = a >= 0x477ff000u ? 0x7c00u : h;
  h = a > 0x7f800000u ? (0x7e00u | ((a >> 13) & 0x3ffu)) : h;
  return static_cast<std::uint16_t>(sign | h);
}

// binary16 -> binary32, exact: normals rebias the exponent, subnormals are
// m * 2^-24 (exact in float), infinities and NaNs keep their payload.
inline float float16_bits_to_float(std::uint16_t h) noexcept {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exponent = (h >> 10) & 0x1fu;
  const std::uint32_t mantissa = h & 0x3ffu;
  std::uint32_t u;
  if (exponent == 0x1fu) {
    u = 0x7f800000u | (mantissa << 13);
  } else if (exponent == 0) {
    u = float_bits(static_cast<float>(mantissa) * 5.9604644775390625e-8f);  // 2^-24
  } else {
    u = ((exponent + 112u) << 23) | (mantissa << 13);
  }
  return bits_float(sign | u);
}

}  // namespace detail

// bfloat16: binary32 with the low 16 mantissa bits dropped.
struct BFloat16 {
  std::uint16_t bits;

  BFloat16() = default;
  explicit BFloat16(float f) noexcept : bits(detail::float_to_bfloat16_bits(f)) {}
  explicit operator float() const noexcept { return detail::bfloat16_bits_to_float(bits); }
  static BFloat16 from_bits(std::uint16_t b) noexcept {
    BFloat16 x;
    x.bits = b;
    return x;
  }
};

// IEEE binary16 ("half", fp16).
struct Float16 {
  std::uint16_t bits;

  Float16() = default;
  explicit Float16(float f) noexcept : bits(detail::float_to_float16_bits(f)) {}
  explicit operator float() const noexcept { return detail::float16_bits_to_float(bits); }
  static Float16 from_bits(std::uint16_t b) noexcept {
    Float16 x;
    x.bits = b;
    return x;
  }
};

static_assert(sizeof(BFloat16) == 2 && std::is_trivially_copyable<BFloat16>::value, "BFloat16 layout");
static_assert(sizeof(Float16) == 2 && std::is_trivially_copyable<Float16>::value, "Float16 layout");

namespace detail {

// How the tensor API reads and writes an element type T: float and double
// are computed as themselves; a 16-bit storage type is widened to float and
// narrowed back once. kWidened says which.
template <class T, class = void>
struct Storage {
  static constexpr bool kSupported = false;
};

template <class T>
struct Storage<T, std::enable_if_t<std::is_same<T, float>::value || std::is_same<T, double>::value>> {
  static constexpr bool kSupported = true;
  static constexpr bool kWidened = false;
  using compute_type = T;
};

template <>
struct Storage<BFloat16> {
  static constexpr bool kSupported = true;
  static constexpr bool kWidened = true;
  using compute_type = float;
  static void widen(const BFloat16* in, float* out, std::size_t n) noexcept {
    for (std::size_t i = 0; i < n; ++i) out[i] = bfloat16_bits_to_float(in[i].bits);
  }
  static void narrow(const float* in, BFloat16* out, std::size_t n) noexcept {
    for (std::size_t i = 0; i < n; ++i) out[i].bits = float_to_bfloat16_bits(in[i]);
  }
};

template <>
struct Storage<Float16> {
  static constexpr bool kSupported = true;
  static constexpr bool kWidened = true;
  using compute_type = float;
  static void widen(const Float16* in, float* out, std::size_t n) noexcept {
    for (std::size_t i = 0; i < n; ++i) out[i] = float16_bits_to_float(in[i].bits);
  }
  static void narrow(const float* in, Float16* out, std::size_t n) noexcept {
    for (std::size_t i = 0; i < n; ++i) out[i].bits = float_to_float16_bits(in[i]);
  }
};

// Any other trivially copyable 2-byte type that converts explicitly to and
// from float (Eigen::bfloat16, Eigen::half, ...): its own conversions are
// trusted to round to nearest even.
template <class T>
using is_foreign_16bit =
    std::integral_constant<bool, sizeof(T) == 2 && std::is_trivially_copyable<T>::value &&
                                     !std::is_same<T, BFloat16>::value && !std::is_same<T, Float16>::value &&
                                     !std::is_integral<T>::value && std::is_constructible<T, float>::value &&
                                     std::is_constructible<float, T>::value>;

template <class T>
struct Storage<T, std::enable_if_t<is_foreign_16bit<T>::value>> {
  static constexpr bool kSupported = true;
  static constexpr bool kWidened = true;
  using compute_type = float;
  static void widen(const T* in, float* out, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) out[i] = static_cast<float>(in[i]);
  }
  static void narrow(const float* in, T* out, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) out[i] = T(in[i]);
  }
};

// One stored value of a KV cache element type (attention/paged.hpp) as
// float, exactly: float, the two 16-bit types, and int8 (before its scale).
inline float widen_value(float x) noexcept { return x; }
inline float widen_value(BFloat16 x) noexcept { return bfloat16_bits_to_float(x.bits); }
inline float widen_value(Float16 x) noexcept { return float16_bits_to_float(x.bits); }
inline float widen_value(std::int8_t x) noexcept { return static_cast<float>(x); }

}  // namespace detail
}  // namespace rope
