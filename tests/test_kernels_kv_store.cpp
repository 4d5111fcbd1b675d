// store_kv_row (kernels/kv_rows.hpp), one row of floats rounded once into
// a KV cache's element type, on each architecture of the build whose code
// differs (rope_test::DistinctArchs), each suite named by it:
//   the 16-bit types round to nearest even (the neighbours of the result are
//     no nearer), as half.hpp does, in the lanes and the tail;
//   int8, the SIMD row against its scalar twin bit for bit; within s/2 per
//     element (plus the rounding of x / s), q in [-127, 127], the largest
//     element at +-127, scale 0 for zeros and NaN (q = 0) for non-finite;
//   int8 ties to even against ties built by hand (not through any rounding
//     function), on every architecture the CPU runs and in the reference.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include <rope/half.hpp>
#include <rope/kernels/kv_rows.hpp>
#include <rope/reference.hpp>

#include "archs.hpp"
#include "kv_elements.hpp"
#include "support.hpp"

namespace {

using rope::BFloat16;
using rope::Float16;
using LD = long double;

template <class Arch>
class KvRows : public ::testing::Test {};
TYPED_TEST_SUITE(KvRows, rope_test::DistinctArchs, rope_test::ArchNames);

using rope_test::widen;

// store_kv_row into the 16-bit types: what half.hpp's conversions give, and
// that is the nearest value (ties to an even bit pattern), checked against
// the neighbouring bit patterns.
template <class E>
void check_round_16(float x, E got) {
  const std::uint16_t b = got.bits;
  if (std::isnan(x)) {
    EXPECT_TRUE(std::isnan(widen(got))) << x;
    return;
  }
  const LD y = widen(got);
  if (std::isinf(static_cast<double>(y))) {
    // Only values past the largest finite one (and its half ulp) overflow.
    const E largest =
        E::from_bits(static_cast<std::uint16_t>((b & 0x8000u) | (std::is_same<E, Float16>::value ? 0x7bffu : 0x7f7fu)));
    const LD big = widen(largest);
    const LD next_ulp = std::is_same<E, Float16>::value ? 32.0L : std::ldexp(1.0L, 127 - 7);
    EXPECT_GE(std::fabs(static_cast<LD>(x)), std::fabs(big) + next_ulp / 2) << x;
    return;
  }
  const LD err = std::fabs(static_cast<LD>(x) - y);
  for (int step : {-1, 1}) {
    const std::uint16_t mag = b & 0x7fffu;
    if (step < 0 && mag == 0) continue;
    const E other = E::from_bits(static_cast<std::uint16_t>((b & 0x8000u) | (mag + step)));
    const LD o = widen(other);
    if (std::isinf(static_cast<double>(o)) || std::isnan(static_cast<double>(o))) continue;
    const LD other_err = std::fabs(static_cast<LD>(x) - o);
    EXPECT_LE(err, other_err) << "not the nearest: x " << x << " bits " << b;
    if (err == other_err) {
      EXPECT_EQ(b & 1u, 0u) << "a tie not to even: x " << x;
    }
  }
}

TYPED_TEST(KvRows, StoreSixteenBitTypesRoundOnceToNearestEven) {
  using Arch = TypeParam;
  std::mt19937 gen(5);
  std::vector<float> x;
  for (int e = -30; e <= 20; ++e) {
    std::uniform_real_distribution<float> dist(-std::ldexp(1.0f, e), std::ldexp(1.0f, e));
    for (int i = 0; i < 20; ++i) x.push_back(dist(gen));
  }
  const float specials[] = {0.0f,
                            -0.0f,
                            1.0f,
                            65504.0f,
                            65519.0f,
                            65520.0f,
                            -70000.0f,
                            1.00390625f,
                            1.01171875f,
                            std::ldexp(1.0f, -24),
                            std::ldexp(3.0f, -26),
                            std::numeric_limits<float>::denorm_min(),
                            std::numeric_limits<float>::max(),
                            std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN()};
  x.insert(x.end(), std::begin(specials), std::end(specials));
  std::vector<BFloat16> bf(x.size());
  std::vector<Float16> hf(x.size());
  rope::store_kv_row<Arch>(x.data(), x.size(), bf.data(), nullptr);
  rope::store_kv_row<Arch>(x.data(), x.size(), hf.data(), nullptr);
  for (std::size_t i = 0; i < x.size(); ++i) {
    EXPECT_EQ(bf[i].bits, rope::detail::float_to_bfloat16_bits(x[i])) << Arch::name() << " " << x[i];
    EXPECT_EQ(hf[i].bits, rope::detail::float_to_float16_bits(x[i])) << Arch::name() << " " << x[i];
    check_round_16(x[i], bf[i]);
    check_round_16(x[i], hf[i]);
  }
  // Every length and start (the SIMD blocks and the tail): the same bits,
  // and nothing written past the row.
  for (std::size_t start = 0; start < 3; ++start) {
    for (std::size_t n = 0; n <= 40; ++n) {
      std::vector<BFloat16> b(n + 1, BFloat16::from_bits(0x1234));
      std::vector<Float16> h(n + 1, Float16::from_bits(0x1234));
      rope::store_kv_row<Arch>(x.data() + 990 + start, n, b.data(), nullptr);
      rope::store_kv_row<Arch>(x.data() + 990 + start, n, h.data(), nullptr);
      for (std::size_t i = 0; i < n; ++i) {
        ASSERT_EQ(b[i].bits, rope::detail::float_to_bfloat16_bits(x[990 + start + i])) << Arch::name() << " n " << n;
        ASSERT_EQ(h[i].bits, rope::detail::float_to_float16_bits(x[990 + start + i])) << Arch::name() << " n " << n;
      }
      ASSERT_EQ(b[n].bits, 0x1234) << Arch::name() << " written past n " << n;
      ASSERT_EQ(h[n].bits, 0x1234) << Arch::name() << " written past n " << n;
    }
  }
  std::vector<float> copy(x.size());
  rope::store_kv_row<Arch>(x.data(), x.size(), copy.data(), nullptr);
  EXPECT_EQ(std::memcmp(copy.data(), x.data(), x.size() * sizeof(float)), 0);
}

// The SIMD int8 store against its scalar twin, bit for bit (codes and the
// scale): every length around the lane widths, magnitudes from subnormal to
// 1e30, ties (x / s exactly k + 1/2), and a NaN or an infinity in the SIMD
// blocks or in the tail.
TYPED_TEST(KvRows, StoreInt8IsItsScalarTwinBitForBit) {
  using Arch = TypeParam;
  const auto same = [](const std::vector<float>& x, const char* what) {
    const std::size_t n = x.size();
    std::vector<std::int8_t> got(n + 1, 77), want(n + 1, 77);
    float gs = -1, ws = -1;
    rope::store_kv_row<Arch>(x.data(), n, got.data(), &gs);
    rope::reference::quantize_int8(x.data(), n, want.data(), &ws);
    ASSERT_TRUE(std::memcmp(&gs, &ws, sizeof(float)) == 0 || (std::isnan(gs) && std::isnan(ws)))
        << what << " n " << n << " scale " << gs << " vs " << ws;
    ASSERT_EQ(got, want) << what << " n " << n;
    ASSERT_EQ(got[n], 77) << "wrote past n = " << n;
  };
  std::vector<std::size_t> lengths;
  for (std::size_t n = 0; n <= 70; ++n) lengths.push_back(n);
  for (std::size_t n : {127, 128, 129, 130, 256, 257}) lengths.push_back(n);
  for (std::size_t n : lengths) {
    for (const double magnitude : {1e-42, 1e-30, 1e-3, 1.0, 37.0, 1e30}) {
      same(rope_test::random_vector<float>(n, static_cast<std::uint32_t>(7 * n + 3), magnitude), "random");
    }
    if (n == 0) continue;
    // Ties: the largest is 127 s, the rest k + 1/2 steps (k + 1/2 and 127
    // are exact in float, so x / s is too).
    std::vector<float> ties(n);
    for (std::size_t c = 0; c < n; ++c) ties[c] = (c == 0 ? 127.0f : static_cast<float>(c % 120) + 0.5f) * 0.25f;
    same(ties, "ties");
    for (const float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity()}) {
      for (std::size_t at : {std::size_t{0}, n / 2, n - 1}) {
        auto x = rope_test::random_vector<float>(n, static_cast<std::uint32_t>(n + at));
        x[at] = bad;
        same(x, "non-finite");
      }
    }
    same(std::vector<float>(n, -0.0f), "zeros");
  }
}

TEST(KvRowsStore, Int8QuantizesSymmetricallyWithinHalfAStep) {
  const double eps = std::numeric_limits<float>::epsilon();
  for (std::size_t n : {std::size_t{1}, std::size_t{2}, std::size_t{7}, std::size_t{64}, std::size_t{130}}) {
    // 3e-43 to 1e-38: subnormal scales (3e-43 and 1e-42 a few of the least
    // subnormal, where rounding m / 127 moves it most).
    for (const double magnitude : {3e-43, 1e-42, 1e-40, 1e-38, 1e-30, 1e-3, 1.0, 37.0, 1e30}) {
      const auto x = rope_test::random_vector<float>(n, static_cast<std::uint32_t>(n * 3 + 1), magnitude);
      std::vector<std::int8_t> q(n, 99);
      float s = -1;
      rope::store_kv_row(x.data(), n, q.data(), &s);
      float m = 0;
      std::size_t at = 0;
      for (std::size_t c = 0; c < n; ++c) {
        if (std::fabs(x[c]) > m) m = std::fabs(x[c]), at = c;
      }
      // A subnormal m / 127 is coarse: one float up where it rounded down
      // so far that m / s passes 127.
      float want_s = m / 127.0f;
      if (want_s < std::numeric_limits<float>::min() && m / want_s > 127.0f) want_s = std::nextafter(want_s, 1.0f);
      ASSERT_EQ(s, want_s) << "scale = max |x| / 127, n " << n << " magnitude " << magnitude;
      ASSERT_GT(s, 0.0f);
      // q = x / s rounded, x / s itself rounded: |x - s q| <= s (1/2 + 127 eps).
      const LD step = static_cast<LD>(s) * (0.5L + 127 * static_cast<LD>(eps));
      for (std::size_t c = 0; c < n; ++c) {
        ASSERT_GE(q[c], -127);
        ASSERT_LE(q[c], 127);
        ASSERT_LE(std::fabs(static_cast<LD>(x[c]) - static_cast<LD>(s) * q[c]), step)
            << "n " << n << " magnitude " << magnitude << " c " << c;
      }
      if (want_s >= std::numeric_limits<float>::min()) {  // a subnormal scale is too coarse to
        ASSERT_EQ(std::abs(static_cast<int>(q[at])), 127) << "the largest element maps to +-127";
      }
      ASSERT_EQ(q[at] > 0, x[at] > 0);
    }
  }
  // A nonzero vector below 127 times the least subnormal, where max|x| / 127
  // underflows: the least subnormal is its scale, every element read back
  // within half a step, and the vector is not read back as zeros.
  {
    const float tiny = std::numeric_limits<float>::denorm_min();
    const float x[3] = {3 * tiny, -tiny, 0.0f};
    std::int8_t q[3] = {9, 9, 9};
    float s = -1;
    rope::store_kv_row(x, 3, q, &s);
    EXPECT_EQ(s, tiny);
    EXPECT_EQ(q[0], 3);
    EXPECT_EQ(q[1], -1);
    EXPECT_EQ(q[2], 0);
  }
  // Zeros: scale 0, q 0 (the sign of zero does not matter).
  const float zeros[4] = {0.0f, -0.0f, 0.0f, 0.0f};
  std::int8_t q[4] = {5, 5, 5, 5};
  float s = -1;
  rope::store_kv_row(zeros, 4, q, &s);
  EXPECT_EQ(s, 0.0f);
  for (std::int8_t v : q) EXPECT_EQ(v, 0);
  // A NaN or an infinity anywhere: NaN scale and q = 0, so every value read back is NaN.
  for (const float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                          -std::numeric_limits<float>::infinity()}) {
    for (std::size_t at : {std::size_t{0}, std::size_t{5}}) {
      auto x = rope_test::random_vector<float>(6, 2);
      x[at] = bad;
      std::int8_t out[6] = {1, 1, 1, 1, 1, 1};
      float scale = 1;
      rope::store_kv_row(x.data(), 6, out, &scale);
      EXPECT_TRUE(std::isnan(scale)) << bad << " at " << at;
      for (std::int8_t v : out) EXPECT_EQ(v, 0);
    }
  }
}

// int8 ties to even, against ties built by hand. A row whose largest
// magnitude is 127 s for a power of two s has the scale max|x| / 127 = s
// exactly; its other values are (j + 1/2) s, exact in float, and (j + 1/2) s
// / s = j + 1/2 exactly, so each code must be the even one of j and j + 1,
// worked out here on the integers (no rounding function is called). Values a
// quarter of a step from a tie go to the nearer integer. j runs over
// -127 .. 126 (every tie inside [-127, 127]) in steps of 37, so neighbouring
// values have j of either parity and either sign; s from 2^-120 to 2^100;
// every length around the lane widths; the largest value (+127 s or -127 s)
// first, in the middle or last, in the SIMD blocks or the tail.
struct Int8Ties {
  std::vector<float> x;
  std::vector<int> want;
  float scale;
};

Int8Ties int8_ties(std::size_t n, std::size_t top_at, int s_exponent, bool negative_top, bool quarters) {
  Int8Ties t;
  t.scale = std::ldexp(1.0f, s_exponent);
  t.x.resize(n);
  t.want.resize(n);
  for (std::size_t c = 0; c < n; ++c) {
    const int j = static_cast<int>((c * 37) % 254) - 127;
    if (quarters) {
      const bool up = c % 2 == 1;  // j + 3/4 goes up to j + 1, j + 1/4 down to j
      t.x[c] = (static_cast<float>(j) + (up ? 0.75f : 0.25f)) * t.scale;
      t.want[c] = up ? j + 1 : j;
    } else {
      t.x[c] = (static_cast<float>(j) + 0.5f) * t.scale;
      t.want[c] = j % 2 == 0 ? j : j + 1;
    }
  }
  t.x[top_at] = (negative_top ? -127.0f : 127.0f) * t.scale;
  t.want[top_at] = negative_top ? -127 : 127;
  return t;
}

// Every row of ties through quantize(x, n, out, scale), against the codes
// worked out by hand, the scale s exactly and nothing written past n.
template <class Quantize>
void expect_int8_ties(const char* what, Quantize&& quantize) {
  std::vector<std::size_t> lengths;
  for (std::size_t n = 1; n <= 70; ++n) lengths.push_back(n);
  for (std::size_t n : {127, 128, 129, 130, 254, 257}) lengths.push_back(n);
  std::size_t rows = 0;
  for (const std::size_t n : lengths) {
    for (const std::size_t top_at : {std::size_t{0}, n / 2, n - 1}) {
      for (const int s_exponent : {-120, -10, 0, 7, 100}) {
        for (const bool quarters : {false, true}) {
          const bool negative_top = (n + top_at) % 2 == 1;
          const Int8Ties t = int8_ties(n, top_at, s_exponent, negative_top, quarters);
          std::vector<std::int8_t> got(n + 1, 77);
          float scale = -1;
          quantize(t.x.data(), n, got.data(), &scale);
          ++rows;
          ASSERT_EQ(scale, t.scale) << what << " n " << n << " s 2^" << s_exponent;
          for (std::size_t c = 0; c < n; ++c) {
            ASSERT_EQ(static_cast<int>(got[c]), t.want[c])
                << what << " n " << n << " c " << c << " s 2^" << s_exponent << ": x / s = " << t.x[c] / t.scale;
          }
          ASSERT_EQ(got[n], 77) << what << " wrote past n = " << n;
        }
      }
    }
  }
  ASSERT_GT(rows, 0u);
}

TEST(KvRowsStore, Int8TiesRoundToEvenOnEveryArchitecture) {
  const auto ran = rope_test::for_each_arch<float>([](auto arch) {
    using Arch = decltype(arch);
    expect_int8_ties(Arch::name(), [](const float* x, std::size_t n, std::int8_t* out, float* scale) {
      rope::store_kv_row<Arch>(x, n, out, scale);
    });
  });
  EXPECT_FALSE(ran.empty()) << "no architecture of this build runs on this CPU";
}

TEST(KvRowsStore, Int8ReferenceTiesRoundToEven) {
  expect_int8_ties("reference::quantize_int8", [](const float* x, std::size_t n, std::int8_t* out, float* scale) {
    rope::reference::quantize_int8(x, n, out, scale);
  });
}

}  // namespace
