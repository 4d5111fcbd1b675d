// rope's 16-bit storage types: widening exact for every bit pattern (against
// the value written from the format's definition in long double), narrowing
// to the nearest representable value with ties to even (checked against the
// neighbours of the result), and agreement with Eigen's independent
// conversions; and the SIMD conversions of the 16-bit kernels against the
// scalar ones on every architecture.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include <Eigen/Core>

#include <rope/detail/half_lanes.hpp>
#include <rope/half.hpp>

#include "archs.hpp"

namespace {

float from_bits(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
std::uint32_t to_bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

// The value of a 16-bit pattern from the format's definition; the largest
// pattern past the finite range (infinity) counts as the next power of two,
// which is where round-to-nearest places the overflow threshold.
struct Format {
  int exponent_bits, mantissa_bits;
  long double value(std::uint16_t b) const {
    const int bias = (1 << (exponent_bits - 1)) - 1;
    const unsigned e = (b >> mantissa_bits) & ((1u << exponent_bits) - 1);
    const unsigned m = b & ((1u << mantissa_bits) - 1);
    const long double sign = (b & 0x8000u) ? -1.0L : 1.0L;
    if (e == (1u << exponent_bits) - 1) {
      return m == 0 ? sign * std::ldexp(1.0L, bias + 1) : std::numeric_limits<long double>::quiet_NaN();
    }
    if (e == 0) return sign * std::ldexp(static_cast<long double>(m), 1 - bias - mantissa_bits);
    return sign *
           std::ldexp(1.0L + std::ldexp(static_cast<long double>(m), -mantissa_bits), static_cast<int>(e) - bias);
  }
  bool is_nan(std::uint16_t b) const {
    const unsigned e = (b >> mantissa_bits) & ((1u << exponent_bits) - 1);
    return e == (1u << exponent_bits) - 1 && (b & ((1u << mantissa_bits) - 1)) != 0;
  }
};
constexpr Format kBFloat16{8, 7};
constexpr Format kFloat16{5, 10};

template <class H>
void expect_widening_exact(const Format& format) {
  for (std::uint32_t b = 0; b <= 0xffff; ++b) {
    const auto bits = static_cast<std::uint16_t>(b);
    const float f = static_cast<float>(H::from_bits(bits));
    if (format.is_nan(bits)) {
      ASSERT_TRUE(std::isnan(f)) << std::hex << b;
      ASSERT_TRUE(std::isnan(static_cast<float>(H(f)))) << "NaN must stay NaN " << std::hex << b;
      continue;
    }
    const long double expected = format.value(bits);
    if (std::isinf(f)) {
      ASSERT_EQ(std::fabs(expected), std::ldexp(1.0L, format.exponent_bits == 8 ? 128 : 16)) << std::hex << b;
    } else {
      ASSERT_EQ(static_cast<long double>(f), expected) << std::hex << b;
    }
    ASSERT_EQ(H(f).bits, bits) << "round trip of " << std::hex << b;
  }
}

TEST(Half, WideningIsExactAndRoundTripsForEveryPattern) {
  expect_widening_exact<rope::BFloat16>(kBFloat16);
  expect_widening_exact<rope::Float16>(kFloat16);
}

// r = H(f) is the nearest value: no neighbour pattern is closer, and a tie
// goes to the even pattern.
template <class H>
void expect_nearest(float f, const Format& format) {
  const std::uint16_t r = H(f).bits;
  if (std::isnan(f)) {
    ASSERT_TRUE(format.is_nan(r));
    return;
  }
  const long double x = f;
  const long double d = std::fabs(format.value(r) - x);
  // Same-sign neighbours; patterns are sign-magnitude, so +-1 on the
  // magnitude steps to the adjacent values.
  const std::uint16_t magnitude = r & 0x7fffu;
  for (int step : {-1, 1}) {
    const int n = static_cast<int>(magnitude) + step;
    if (n < 0) continue;
    const auto neighbour = static_cast<std::uint16_t>((r & 0x8000u) | static_cast<unsigned>(n));
    if (format.is_nan(neighbour)) continue;
    const long double dn = std::fabs(format.value(neighbour) - x);
    ASSERT_LE(d, dn) << f << " -> " << std::hex << r << " but " << neighbour << " is closer";
    if (d == dn) {
      ASSERT_EQ(r & 1u, 0u) << f << ": a tie must go to the even pattern";
    }
  }
  if (magnitude == 0 && x != 0) {  // zero: the other sign's smallest value is no closer than +-0
    ASSERT_LE(d, format.value(1));
  }
}

// Random floats, a stride through every pattern, the exact ties of both
// formats and their neighbours, and the edges of the ranges.
std::vector<float> narrowing_samples(int random_samples, std::uint64_t stride) {
  std::mt19937 gen(1);
  std::uniform_int_distribution<std::uint32_t> bits;
  std::vector<float> samples;
  for (int i = 0; i < random_samples; ++i) samples.push_back(from_bits(bits(gen)));
  for (std::uint64_t u = 0; u <= 0xffffffffu; u += stride) samples.push_back(from_bits(static_cast<std::uint32_t>(u)));
  // Exact ties and their neighbours around every 16-bit value in both formats.
  for (std::uint32_t b = 0; b <= 0xffff; b += 7) {
    const std::uint32_t u = b << 16;
    for (std::uint32_t delta : {0x7fffu, 0x8000u, 0x8001u}) samples.push_back(from_bits(u + delta));
    const float h = static_cast<float>(rope::Float16::from_bits(static_cast<std::uint16_t>(b)));
    if (std::isfinite(h)) {
      for (std::int32_t delta : {0x0fff, 0x1000, 0x1001, -0x1000}) {
        samples.push_back(from_bits(static_cast<std::uint32_t>(static_cast<std::int64_t>(to_bits(h)) + delta)));
      }
    }
  }
  for (float f : {65504.0f, 65519.99f, 65520.0f, 1e30f, std::ldexp(1.0f, -24), std::ldexp(1.0f, -25),
                  std::ldexp(3.0f, -26), std::numeric_limits<float>::max(), std::numeric_limits<float>::denorm_min(),
                  std::numeric_limits<float>::infinity(), -0.0f}) {
    samples.push_back(f);
    samples.push_back(-f);
  }
  return samples;
}

TEST(Half, NarrowingRoundsToNearestEven) {
  for (float f : narrowing_samples(2000000, 4099)) {
    expect_nearest<rope::BFloat16>(f, kBFloat16);
    expect_nearest<rope::Float16>(f, kFloat16);
  }
}

// Eigen's conversions are written independently (and use F16C where the
// build enables it): both must agree with rope's bit for bit.
TEST(Half, AgreesWithEigen) {
  std::mt19937 gen(2);
  std::uniform_int_distribution<std::uint32_t> bits;
  for (int i = 0; i < 2000000; ++i) {
    const float f = from_bits(bits(gen));
    if (std::isnan(f)) continue;
    const Eigen::bfloat16 eb(f);
    const Eigen::half eh(f);
    std::uint16_t b, h;
    std::memcpy(&b, &eb, 2);
    std::memcpy(&h, &eh, 2);
    ASSERT_EQ(rope::BFloat16(f).bits, b) << f;
    ASSERT_EQ(rope::Float16(f).bits, h) << f;
  }
}

// Lanes::pack of the samples, in batches as they come, against the scalar
// narrowing bit for bit.
template <class H, class Lanes, class Arch>
void expect_pack_matches_scalar(const std::vector<float>& samples) {
  using U = xsimd::batch<std::uint32_t, Arch>;
  using F = xsimd::batch<float, Arch>;
  constexpr std::size_t n = U::size;
  std::uint16_t bits[2 * n];
  float lo[n], hi[n];
  for (std::size_t at = 0; at + 2 * n <= samples.size(); at += 2 * n) {
    for (std::size_t i = 0; i < n; ++i) {
      lo[i] = samples[at + 2 * i];
      hi[i] = samples[at + 2 * i + 1];
    }
    const U packed = Lanes::pack(F::load_unaligned(lo), F::load_unaligned(hi));
    packed.store_unaligned(reinterpret_cast<std::uint32_t*>(bits));
    for (std::size_t i = 0; i < n; ++i) {
      ASSERT_EQ(bits[2 * i], H(lo[i]).bits) << lo[i] << " (" << std::hex << to_bits(lo[i]) << ")";
      ASSERT_EQ(bits[2 * i + 1], H(hi[i]).bits) << hi[i] << " (" << std::hex << to_bits(hi[i]) << ")";
    }
  }
}

// The SIMD conversions of the 16-bit kernels (detail/half_lanes.hpp), on
// every architecture this build targets and the CPU runs, against the
// scalar ones above bit for bit: widening every pattern, narrowing every
// sample (NaNs included, payload and all).
template <class H, class Arch>
void expect_lanes_match_scalar() {
  using Lanes = typename rope::detail::LanesOf<H, Arch>::type;
  using U = xsimd::batch<std::uint32_t, Arch>;
  constexpr std::size_t n = U::size;
  std::uint16_t bits[2 * n];
  float lo[n], hi[n];
  for (std::uint32_t b = 0; b <= 0xffff; b += 2 * n) {
    for (std::size_t i = 0; i < 2 * n; ++i) bits[i] = static_cast<std::uint16_t>((b + i) & 0xffffu);
    const U v = U::load_unaligned(reinterpret_cast<const std::uint32_t*>(bits));
    Lanes::low(v).store_unaligned(lo);
    Lanes::high(v).store_unaligned(hi);
    for (std::size_t i = 0; i < n; ++i) {
      ASSERT_EQ(to_bits(lo[i]), to_bits(static_cast<float>(H::from_bits(bits[2 * i])))) << std::hex << bits[2 * i];
      ASSERT_EQ(to_bits(hi[i]), to_bits(static_cast<float>(H::from_bits(bits[2 * i + 1]))))
          << std::hex << bits[2 * i + 1];
    }
  }
  // Fewer random and strided samples than the scalar test: it runs once per
  // architecture; every tie and edge is kept.
  expect_pack_matches_scalar<H, Lanes, Arch>(narrowing_samples(100000, 65537));
}

TEST(Half, SimdLanesMatchTheScalarConversionsOnEveryArchitecture) {
  int archs = 0;
  rope_test::for_each_arch<float>([&](auto arch) {
    using Arch = decltype(arch);
    ++archs;
    expect_lanes_match_scalar<rope::BFloat16, Arch>();
    expect_lanes_match_scalar<rope::Float16, Arch>();
  });
  EXPECT_GT(archs, 0);
}

// The bfloat16 rounding of AVX512-BF16 (BFloat16HardwareLanes), where the
// CPU has it, against the scalar narrowing bit for bit: the samples in
// batches free of subnormals (every lane through the instruction), then
// each subnormal sample alone among normal ones (which the instruction would
// read as zero: the batch must take the integer rounding), then all mixed.
TEST(Half, HardwareBFloat16RoundingMatchesTheScalarOne) {
  int archs = 0;
  rope_test::for_each_arch<float>([&](auto arch) {
    using Arch = decltype(arch);
    if constexpr (rope::detail::kBFloat16HardwareArch<Arch>) {
      if (!rope::detail::avx512_bf16_runs<Arch>()) return;
      ++archs;
      using Lanes = rope::detail::BFloat16HardwareLanes<Arch>;
      constexpr std::size_t n = 2 * xsimd::batch<float, Arch>::size;
      const auto samples = narrowing_samples(100000, 65537);
      std::vector<float> normal, subnormal;
      for (float f : samples) (std::fpclassify(f) == FP_SUBNORMAL ? subnormal : normal).push_back(f);
      ASSERT_GT(subnormal.size(), 100u);
      expect_pack_matches_scalar<rope::BFloat16, Lanes, Arch>(normal);
      std::vector<float> one_each;
      for (std::size_t i = 0; i < subnormal.size(); ++i) {
        for (std::size_t lane = 0; lane < n; ++lane) {
          one_each.push_back(lane == i % n ? subnormal[i] : normal[(i * n + lane) % normal.size()]);
        }
      }
      expect_pack_matches_scalar<rope::BFloat16, Lanes, Arch>(one_each);
      expect_pack_matches_scalar<rope::BFloat16, Lanes, Arch>(samples);
    }
  });
  if (archs == 0) GTEST_SKIP() << "no AVX512-BF16 on this CPU, or no AVX-512BW code in this build";
}

}  // namespace

namespace {

// The relative error of rounding x into T, in long double.
template <class T>
long double relative_rounding_error(float x) {
  const long double stored = static_cast<long double>(static_cast<float>(T(x)));
  return std::fabs(stored - static_cast<long double>(x)) / std::fabs(static_cast<long double>(x));
}

// The bound docs/attention.md states for one rounding into a 16-bit cache,
// 2^-(p) |x| for p significant bits (bf16 8, f16 11), reached at a tie:
// x = 2^e (1 + 2^-p), halfway between 2^e and its upper neighbour, goes to
// the even one, 2^e, off by 2^-p / (1 + 2^-p) of |x|. So the bound holds
// over every normal x and is tight: half of it (bf16's 2^-9, as the docs
// once said) is exceeded there.
template <class T>
void expect_rounding_bound(int precision, int lowest_exponent, int highest_exponent, const char* name) {
  const long double bound = std::ldexp(1.0L, -precision);
  long double worst = 0;
  for (int e = lowest_exponent; e <= highest_exponent; ++e) {
    const float tie = std::ldexp(1.0f + std::ldexp(1.0f, -precision), e);
    const long double at_tie = relative_rounding_error<T>(tie);
    EXPECT_EQ(static_cast<float>(T(tie)), std::ldexp(1.0f, e)) << name << ": the tie at 2^" << e << " goes to even";
    EXPECT_LE(at_tie, bound) << name << " at the tie 2^" << e << " (1 + 2^-" << precision << ")";
    EXPECT_GT(at_tie, bound / 2) << name << ": at a tie the error passes half the bound";
    worst = std::max(worst, at_tie);
    // Every other float of the binade too, 4096 evenly spaced mantissas.
    for (std::uint32_t m = 0; m < (1u << 23); m += (1u << 11) + 1) {
      const float x = from_bits((static_cast<std::uint32_t>(e + 127) << 23) | m);
      if (std::isinf(static_cast<float>(T(x)))) continue;  // past T's largest value: overflow, not rounding
      EXPECT_LE(relative_rounding_error<T>(x), bound) << name << " at " << x;
    }
  }
  EXPECT_NEAR(static_cast<double>(worst), static_cast<double>(bound / (1 + bound)), 1e-12 * static_cast<double>(bound));
}

}  // namespace

TEST(Half, OneRoundingIsWithinTwoToMinusPrecisionReachedAtTies) {
  expect_rounding_bound<rope::BFloat16>(8, -120, 120, "bf16");
  expect_rounding_bound<rope::Float16>(11, -14, 15, "f16");
}
