// rope/detail/sincos.hpp — one row of attention_factor * cos/sin(m * theta_p)
// for p = 0 .. pairs-1, in double, vectorised with xsimd batches of double.
//
// Accuracy: the angle m * theta_p is one double multiplication, as in the
// scalar loop. Its cos/sin is rope's own: a Cody-Waite reduction by pi/2
// split in pieces of 33, 33 and 53 bits (exact while the quadrant count stays
// below 2^20) and Taylor polynomials to degree 17/18 on [-pi/4, pi/4], whose
// truncation (< 1e-19) is far below the rounding. The accuracy of the result
// (double: 3 ulps with the attention factor; float: 1/2 ulp + 2^-27 ulp) is
// stated once, with how it was measured, in docs/design.md ("Accuracy of
// tables and angles").
// A batch holding any angle above kSimdAngleLimit goes lane by lane through
// std::cos/std::sin, so the guarantee holds for every angle.
//
// Why not xsimd::sin/cos: their reduction picks a branch per batch from the
// largest lane, and past 2^20 * pi/2 xsimd 8.1 reduces each lane with a
// scalar routine while later versions may differ; on AVX-512 their rounding
// intrinsics also trip GCC 12's -Wmaybe-uninitialized (GCC bug 105593) in
// any translation unit that included xsimd first, i.e. a -Werror build. The
// code below uses only arithmetic, fma, abs, compare, select and any, which
// mean the same in every xsimd version. It assumes the default rounding mode
// (round to nearest), which the magic-number rounding relies on; under
// -ffast-math every lane goes through std::cos/std::sin instead.
#pragma once

#include <cmath>
#include <cstddef>

#include "xsimd.hpp"

// Inlined into the row loop, the batch stays in registers between the
// polynomial and the rounding to T instead of going through memory.
#if defined(__GNUC__)
#define ROPE_SINCOS_INLINE [[gnu::always_inline]] inline
#else
#define ROPE_SINCOS_INLINE inline
#endif

namespace rope::detail {

// |angle| below which the SIMD reduction is exact: the quadrant count n
// stays below 2^20, so n times a 33-bit piece of pi/2 is an exact double.
inline constexpr double kSimdAngleLimit = 1048576.0;  // 2^20

// pi/2 = kPio2Hi + kPio2Mid + kPio2Lo + O(2^-122): the first two have 33
// significant bits, the last is the rest rounded to double.
inline constexpr double kPio2Hi = 0x1.921fb544p+0;
inline constexpr double kPio2Mid = 0x1.0b4611a6p-34;
inline constexpr double kPio2Lo = 0x1.3198a2e037073p-69;
inline constexpr double kTwoOverPi = 0x1.45f306dc9c883p-1;
// Adding and subtracting 1.5 * 2^52 rounds a double of magnitude < 2^51 to
// the nearest integer (in the default rounding mode) with plain arithmetic.
inline constexpr double kRoundMagic = 0x1.8p+52;

// (-1)^k / n!, rounded once: the Taylor coefficients. On |r| <= pi/4 the
// first omitted terms, r^19/19! and r^20/20!, are below 1e-19.
constexpr double taylor_coefficient(int n) {
  long double f = 1.0L;
  for (int i = 2; i <= n; ++i) f *= static_cast<long double>(i);
  return static_cast<double>(((n / 2) % 2 == 0 ? 1.0L : -1.0L) / f);
}

// The nearest integer to each lane (|v| < 2^51), with plain arithmetic.
template <class B>
ROPE_SINCOS_INLINE B nearest_integer(const B& v) noexcept {
  return (v + B(kRoundMagic)) - B(kRoundMagic);
}

// sin and cos of every lane of x, |x| <= kSimdAngleLimit (accuracy: see the
// header comment). Written with arithmetic and select only, so it means the
// same in every xsimd version and on every instruction set.
template <class Arch>
ROPE_SINCOS_INLINE void sincos_batch(const xsimd::batch<double, Arch>& x, xsimd::batch<double, Arch>& sin_x,
                                     xsimd::batch<double, Arch>& cos_x) noexcept {
  using B = xsimd::batch<double, Arch>;
  // n = nearest integer to x * 2/pi; r = x - n*pi/2 in three steps: the
  // first two subtract exact products, the third a correction of ~2^-49.
  const B n = nearest_integer(x * B(kTwoOverPi));
  const B r = ((x - n * B(kPio2Hi)) - n * B(kPio2Mid)) - n * B(kPio2Lo);
  const B z = r * r;

  B s(taylor_coefficient(17));
  s = xsimd::fma(s, z, B(taylor_coefficient(15)));
  s = xsimd::fma(s, z, B(taylor_coefficient(13)));
  s = xsimd::fma(s, z, B(taylor_coefficient(11)));
  s = xsimd::fma(s, z, B(taylor_coefficient(9)));
  s = xsimd::fma(s, z, B(taylor_coefficient(7)));
  s = xsimd::fma(s, z, B(taylor_coefficient(5)));
  s = xsimd::fma(s, z, B(taylor_coefficient(3)));
  s = xsimd::fma(s * z, r, r);  // r + r^3 * (...)

  B c(taylor_coefficient(18));
  c = xsimd::fma(c, z, B(taylor_coefficient(16)));
  c = xsimd::fma(c, z, B(taylor_coefficient(14)));
  c = xsimd::fma(c, z, B(taylor_coefficient(12)));
  c = xsimd::fma(c, z, B(taylor_coefficient(10)));
  c = xsimd::fma(c, z, B(taylor_coefficient(8)));
  c = xsimd::fma(c, z, B(taylor_coefficient(6)));
  c = xsimd::fma(c, z, B(taylor_coefficient(4)));
  c = xsimd::fma(c, z, B(taylor_coefficient(2)));
  c = xsimd::fma(c, z, B(1.0));

  // The quadrant n mod 4 as n - 4*round(n/4), in {-2, -1, 0, 1, 2}.
  const B q = n - B(4.0) * nearest_integer(n * B(0.25));
  const auto q1 = q == B(1.0);
  const auto q2 = xsimd::abs(q) == B(2.0);
  const auto q3 = q == B(-1.0);
  sin_x = xsimd::select(q2, -s, xsimd::select(q1, c, xsimd::select(q3, -c, s)));
  cos_x = xsimd::select(q2, -c, xsimd::select(q1, -s, xsimd::select(q3, s, c)));
}

// af * cos/sin of one batch of angles into c and s (kLanes doubles each):
// the SIMD path when every lane is within kSimdAngleLimit, else std::cos and
// std::sin lane by lane.
template <class Arch>
ROPE_SINCOS_INLINE void scaled_sincos(const xsimd::batch<double, Arch>& angle, double attention_factor, double* c,
                                      double* s) noexcept {
  using B = xsimd::batch<double, Arch>;
#if defined(__FAST_MATH__)
  // -ffast-math lets the compiler fold nearest_integer to its argument and
  // re-associate the reduction, which would wreck the SIMD path: such builds
  // take std::cos/std::sin for every lane.
  constexpr bool kScalarOnly = true;
#else
  constexpr bool kScalarOnly = false;
#endif
  if (kScalarOnly || xsimd::any(xsimd::abs(angle) > B(kSimdAngleLimit))) {
    alignas(64) double a[B::size];
    angle.store_unaligned(a);
    for (std::size_t i = 0; i < B::size; ++i) {
      c[i] = attention_factor * std::cos(a[i]);
      s[i] = attention_factor * std::sin(a[i]);
    }
    return;
  }
  B sin_v, cos_v;
  sincos_batch(angle, sin_v, cos_v);
  const B af(attention_factor);
  (af * cos_v).store_unaligned(c);
  (af * sin_v).store_unaligned(s);
}

// to[i] = T(from[i]), i < N. A fixed trip count and no possible aliasing
// let the compiler round a whole batch with one conversion instruction
// (xsimd has no double-to-float narrowing of a batch).
template <std::size_t N, class T>
void round_to(const double* __restrict from, T* __restrict to) noexcept {
  for (std::size_t i = 0; i < N; ++i) to[i] = static_cast<T>(from[i]);
}

// cos_out[p] = T(af * cos(position * inv_freq[p])), sin_out likewise.
// Preconditions (unchecked): inv_freq, cos_out and sin_out hold `pairs`
// values; the outputs do not overlap inv_freq.
template <class T, class Arch = xsimd::default_arch>
void sincos_row(const double* inv_freq, std::size_t pairs, double position, double attention_factor, T* cos_out,
                T* sin_out) noexcept {
  using B = xsimd::batch<double, Arch>;
  constexpr std::size_t kLanes = B::size;
  const B m(position);
  alignas(64) double c[kLanes];
  alignas(64) double s[kLanes];
  std::size_t p0 = 0;
  for (; p0 + kLanes <= pairs; p0 += kLanes) {
    scaled_sincos(m * B::load_unaligned(inv_freq + p0), attention_factor, c, s);
    round_to<kLanes>(c, cos_out + p0);
    round_to<kLanes>(s, sin_out + p0);
  }
  if (p0 < pairs) {
    // The last, partial batch runs the same SIMD step on a zero-padded copy,
    // so a pair's value never depends on where the row ends.
    const std::size_t n = pairs - p0;
    alignas(64) double theta[kLanes];
    for (std::size_t i = 0; i < kLanes; ++i) theta[i] = i < n ? inv_freq[p0 + i] : 0.0;
    scaled_sincos(m * B::load_unaligned(theta), attention_factor, c, s);
    for (std::size_t i = 0; i < n; ++i) {
      cos_out[p0 + i] = static_cast<T>(c[i]);
      sin_out[p0 + i] = static_cast<T>(s[i]);
    }
  }
}

}  // namespace rope::detail

#undef ROPE_SINCOS_INLINE
