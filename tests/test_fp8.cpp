// rope's 8-bit float storage types (fp8.hpp) against the OCP FP8 formats
// written out in long double: every one of the 256 codes of each decodes to
// its value (zero, subnormals, the largest finite, infinities and NaNs);
// encoding picks the nearest code, the even one at every tie, and saturates
// past the largest finite value, on every code's value, every midpoint
// between neighbouring codes and the floats either side of it, and a million
// random floats of every exponent.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include <rope/fp8.hpp>

namespace {

using rope::detail::bits_float;
using rope::detail::float_bits;

// One FP8 format from its definition: exponent and mantissa widths, and
// which top-exponent codes are NaN (E4M3: only S.1111.111; E5M2: IEEE-like,
// infinity at mantissa 0).
struct Format {
  int exponent_bits, mantissa_bits;
  bool ieee_top;  // the top exponent holds infinities and NaNs (E5M2)
  int bias() const { return (1 << (exponent_bits - 1)) - 1; }
  unsigned top() const { return (1u << exponent_bits) - 1; }
  bool is_nan(std::uint8_t b) const {
    const unsigned e = (b >> mantissa_bits) & top(), m = b & ((1u << mantissa_bits) - 1);
    return ieee_top ? e == top() && m != 0 : (b & 0x7fu) == 0x7fu;
  }
  bool is_inf(std::uint8_t b) const {
    const unsigned e = (b >> mantissa_bits) & top(), m = b & ((1u << mantissa_bits) - 1);
    return ieee_top && e == top() && m == 0;
  }
  long double value(std::uint8_t b) const {
    const unsigned e = (b >> mantissa_bits) & top(), m = b & ((1u << mantissa_bits) - 1);
    const long double sign = (b & 0x80u) ? -1.0L : 1.0L;
    if (is_nan(b)) return std::numeric_limits<long double>::quiet_NaN();
    if (is_inf(b)) return sign * std::numeric_limits<long double>::infinity();
    if (e == 0) return sign * std::ldexp(static_cast<long double>(m), 1 - bias() - mantissa_bits);
    return sign *
           std::ldexp(1.0L + std::ldexp(static_cast<long double>(m), -mantissa_bits), static_cast<int>(e) - bias());
  }
  // The finite non-negative codes in increasing value (0x00 .. the largest).
  std::vector<std::uint8_t> finite_codes() const {
    std::vector<std::uint8_t> out;
    for (unsigned b = 0; b < 0x80u; ++b) {
      if (!is_nan(static_cast<std::uint8_t>(b)) && !is_inf(static_cast<std::uint8_t>(b))) {
        out.push_back(static_cast<std::uint8_t>(b));
      }
    }
    return out;
  }
  // The code a float must encode to: the nearest finite code of x's sign,
  // the even one at a tie, the largest finite beyond it; NaN for a NaN
  // (any NaN code), an infinity: E5M2's infinity, E4M3's NaN.
  std::uint8_t nearest(float x) const {
    // The finite codes and their values, once per format.
    static thread_local std::vector<std::uint8_t> codes;
    static thread_local std::vector<long double> values;
    static thread_local int made_for = 0;
    if (made_for != exponent_bits) {
      codes = finite_codes();
      values.clear();
      for (std::uint8_t c : codes) values.push_back(value(c));
      made_for = exponent_bits;
    }
    const std::uint8_t sign = std::signbit(x) ? 0x80u : 0x00u;
    if (std::isnan(x) || (std::isinf(x) && !ieee_top)) return static_cast<std::uint8_t>(sign | 0x7fu);
    if (std::isinf(x)) return static_cast<std::uint8_t>(sign | (top() << mantissa_bits));
    const long double a = std::fabs(static_cast<long double>(x));
    if (a >= values.back()) return static_cast<std::uint8_t>(sign | codes.back());
    // values[i] <= a < values[i + 1]
    const std::size_t i =
        static_cast<std::size_t>(std::upper_bound(values.begin(), values.end(), a) - values.begin()) - 1;
    const long double below = a - values[i], above = values[i + 1] - a;
    const std::uint8_t best = below < above          ? codes[i]
                              : above < below        ? codes[i + 1]
                              : (codes[i] & 1u) == 0 ? codes[i]
                                                     : codes[i + 1];
    return static_cast<std::uint8_t>(sign | best);
  }
};
constexpr Format kE4M3{4, 3, false};
constexpr Format kE5M2{5, 2, true};

template <class T>
void check_every_code_decodes(const Format& f) {
  for (unsigned b = 0; b < 256; ++b) {
    const auto code = static_cast<std::uint8_t>(b);
    const float got = static_cast<float>(T::from_bits(code));
    const long double want = f.value(code);
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << "code 0x" << std::hex << b;
      continue;
    }
    EXPECT_EQ(static_cast<long double>(got), want) << "code 0x" << std::hex << b;
    EXPECT_EQ(std::signbit(got), (b & 0x80u) != 0) << "code 0x" << std::hex << b;
  }
}

// Encodes x and checks the code against the format's nearest one (any NaN
// code where a NaN is due).
template <class T>
::testing::AssertionResult encodes_nearest(const Format& f, float x) {
  const std::uint8_t got = T(x).bits, want = f.nearest(x);
  if (f.is_nan(want) ? f.is_nan(got) : got == want) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "x = " << x << " (bits 0x" << std::hex << float_bits(x) << "): code 0x"
                                       << unsigned(got) << ", the nearest is 0x" << unsigned(want);
}

// Every code's value, every midpoint between neighbours (a tie) and the
// floats just either side of it, the midpoint past the largest finite, each
// with both signs.
template <class T>
void check_codes_and_ties(const Format& f) {
  const std::vector<std::uint8_t> codes = f.finite_codes();
  std::vector<float> xs;
  for (std::size_t i = 0; i < codes.size(); ++i) {
    const long double v = f.value(codes[i]);
    const long double next =
        i + 1 < codes.size() ? f.value(codes[i + 1]) : v + (v - f.value(codes[i - 1]));  // one step past the largest
    const auto mid = static_cast<float>((v + next) / 2);
    ASSERT_EQ(static_cast<long double>(mid), (v + next) / 2) << "a midpoint is a float";
    xs.insert(xs.end(), {static_cast<float>(v), mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e30f)});
  }
  for (float x : xs) {
    for (float s : {x, -x}) EXPECT_TRUE(encodes_nearest<T>(f, s));
  }
}

// Floats of every exponent, a million bit patterns at random, and the edges.
template <class T>
void check_random_floats(const Format& f) {
  std::mt19937 rng(8);
  std::uniform_int_distribution<std::uint32_t> bits;
  for (int i = 0; i < (1 << 20); ++i) {
    const float x = bits_float(bits(rng));
    ASSERT_TRUE(encodes_nearest<T>(f, x));
  }
  // Where the exponent is near the format's: the exponent field of x drawn
  // from the format's range and a little beyond.
  std::uniform_int_distribution<int> exponent(127 - f.bias() - f.mantissa_bits - 3, 127 + f.bias() + 3);
  for (int i = 0; i < (1 << 20); ++i) {
    const std::uint32_t u = (bits(rng) & 0x807fffffu) | (static_cast<std::uint32_t>(exponent(rng)) << 23);
    ASSERT_TRUE(encodes_nearest<T>(f, bits_float(u)));
  }
  const float inf = std::numeric_limits<float>::infinity();
  for (float x : {0.0f, -0.0f, std::numeric_limits<float>::denorm_min(), std::numeric_limits<float>::min(),
                  std::numeric_limits<float>::max(), inf, -inf, std::numeric_limits<float>::quiet_NaN()}) {
    EXPECT_TRUE(encodes_nearest<T>(f, x));
  }
}

TEST(Fp8, E4M3EveryCodeDecodesToItsValue) { check_every_code_decodes<rope::Float8E4M3>(kE4M3); }
TEST(Fp8, E5M2EveryCodeDecodesToItsValue) { check_every_code_decodes<rope::Float8E5M2>(kE5M2); }

TEST(Fp8, E4M3EncodesToTheNearestCodeTiesToEven) { check_codes_and_ties<rope::Float8E4M3>(kE4M3); }
TEST(Fp8, E5M2EncodesToTheNearestCodeTiesToEven) { check_codes_and_ties<rope::Float8E5M2>(kE5M2); }

TEST(Fp8, E4M3RandomFloatsEncodeToTheNearestCode) { check_random_floats<rope::Float8E4M3>(kE4M3); }
TEST(Fp8, E5M2RandomFloatsEncodeToTheNearestCode) { check_random_floats<rope::Float8E5M2>(kE5M2); }

// The formats' landmarks, stated once more by hand.
TEST(Fp8, LargestFiniteSaturationAndSpecialCodes) {
  EXPECT_EQ(rope::Float8E4M3(448.0f).bits, 0x7eu);
  EXPECT_EQ(rope::Float8E4M3(1e6f).bits, 0x7eu);
  EXPECT_EQ(rope::Float8E4M3(-1e6f).bits, 0xfeu);
  EXPECT_EQ(rope::Float8E4M3(464.0f).bits, 0x7eu);  // the tie past 448 goes to the even 448
  EXPECT_EQ(rope::Float8E4M3(0x1p-9f).bits, 0x01u);
  EXPECT_EQ(rope::Float8E4M3(0x1p-10f).bits, 0x00u);  // a tie with zero: even
  EXPECT_EQ(rope::Float8E4M3(-0.0f).bits, 0x80u);
  EXPECT_TRUE(std::isnan(static_cast<float>(rope::Float8E4M3(std::numeric_limits<float>::infinity()))));
  EXPECT_EQ(static_cast<float>(rope::Float8E4M3::from_bits(0x7eu)), rope::Float8E4M3::max());
  EXPECT_EQ(rope::Float8E5M2(57344.0f).bits, 0x7bu);
  EXPECT_EQ(rope::Float8E5M2(1e30f).bits, 0x7bu);
  EXPECT_EQ(rope::Float8E5M2(std::numeric_limits<float>::infinity()).bits, 0x7cu);
  EXPECT_EQ(rope::Float8E5M2(0x1p-16f).bits, 0x01u);
  EXPECT_EQ(static_cast<float>(rope::Float8E5M2::from_bits(0x7bu)), rope::Float8E5M2::max());
}

}  // namespace
