// The element types of a KV cache, for the suites that sweep them
// (test_kernels_kv_rows, test_attention_batch): their names, a loop over
// them, and the exact widening of one stored value to float.
#pragma once

#include <cstdint>
#include <limits>
#include <type_traits>

#include <rope/fp8.hpp>
#include <rope/half.hpp>

namespace rope_test {

template <class E>
const char* element_name() {
  if (std::is_same<E, float>::value) return "f32";
  if (std::is_same<E, rope::BFloat16>::value) return "bf16";
  if (std::is_same<E, rope::Float16>::value) return "f16";
  if (std::is_same<E, rope::Float8E4M3>::value) return "e4m3";
  if (std::is_same<E, rope::Float8E5M2>::value) return "e5m2";
  return "int8";
}

// Calls f(E{}) for every element type of a cache.
template <class F>
void for_each_element(F&& f) {
  f(float{});
  f(rope::BFloat16{});
  f(rope::Float16{});
  f(std::int8_t{});
  f(rope::Float8E4M3{});
  f(rope::Float8E5M2{});
}

// Whether long double is IEEE binary128 computed in software (aarch64
// Linux: every operation a library call, about 50 times slower than x86's
// 80-bit long double under qemu, where CI runs the aarch64 suite). There
// the heaviest long-double oracle tests check their widest case on one
// element type of each decode family (widened_family: f32, bf16, int8) and
// leave the others (f16, fp8) to their narrower cases, which decode the
// same way; each such test says so.
constexpr bool kSoftwareLongDouble = std::numeric_limits<long double>::digits > 64;

// The element types that stand for their decode family where the widest
// cases are cut (kSoftwareLongDouble).
template <class E>
constexpr bool widened_family() {
  return std::is_same<E, float>::value || std::is_same<E, rope::BFloat16>::value || std::is_same<E, std::int8_t>::value;
}

// Whether a test's widest case runs for E here.
template <class E>
constexpr bool widest_case_runs() {
  return !kSoftwareLongDouble || widened_family<E>();
}

// fp8 (rope/fp8.hpp): whether E is one of the two formats, and the bound
// of one value stored into an fp8 row of scale s: the code is F(fl(y / s)),
// to nearest, never saturated, so |y - s F| <= (u + 2^-24 (1 + u)) |y| + s h,
// u the format's unit roundoff (E4M3 2^-4, E5M2 2^-3), h half its subnormal
// step (2^-10, 2^-17), 2^-24 the rounding of y / s.
template <class E>
constexpr bool kFp8 = std::is_same<E, rope::Float8E4M3>::value || std::is_same<E, rope::Float8E5M2>::value;
template <class E>
long double fp8_rounding(long double value, long double scale) {
  constexpr bool e4m3 = std::is_same<E, rope::Float8E4M3>::value;
  const long double u = e4m3 ? 0x1p-4L : 0x1p-3L, h = e4m3 ? 0x1p-10L : 0x1p-17L;
  return (u + 0x1p-24L * (1 + u)) * value + scale * h;
}

inline float widen(float x) { return x; }
inline float widen(rope::BFloat16 x) { return rope::detail::widen_value(x); }
inline float widen(rope::Float16 x) { return rope::detail::widen_value(x); }
inline float widen(std::int8_t x) { return static_cast<float>(x); }
inline float widen(rope::Float8E4M3 x) { return static_cast<float>(x); }
inline float widen(rope::Float8E5M2 x) { return static_cast<float>(x); }

}  // namespace rope_test
