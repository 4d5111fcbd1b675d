// NaN and Inf in x: every output channel is NaN, +Inf, -Inf or finite exactly
// as in rope::reference::rotate evaluated in double on the same inputs and
// table row, on every architecture this build targets and the CPU runs. A
// non-finite value never leaks into another pair, another head or another
// token: those are bit for bit what the same rows give without it.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include <rope/apply.hpp>
#include <rope/half.hpp>
#include <rope/kernels.hpp>
#include <rope/reference.hpp>
#include <rope/table.hpp>

#include "archs.hpp"
#include "support.hpp"

namespace {

using rope::Direction;
using rope::Style;

template <class T>
class NonFinite : public ::testing::Test {};
using ElementTypes = ::testing::Types<float, double>;
TYPED_TEST_SUITE(NonFinite, ElementTypes, rope_test::ScalarNames);

enum class Kind { nan, plus_inf, minus_inf, finite };
Kind kind_of(double v) {
  if (std::isnan(v)) return Kind::nan;
  if (std::isinf(v)) return v > 0 ? Kind::plus_inf : Kind::minus_inf;
  return Kind::finite;
}
const char* name(Kind k) {
  switch (k) {
    case Kind::nan: return "NaN";
    case Kind::plus_inf: return "+Inf";
    case Kind::minus_inf: return "-Inf";
    case Kind::finite: return "finite";
  }
  return "?";
}

template <class F>
void for_each_style(F&& f) {
  f(std::integral_constant<Style, Style::rotate_half>{});
  f(std::integral_constant<Style, Style::block_diagonal>{});
}

// A tensor of kTokens x kHeads head vectors of head_dim channels (rotary_dim
// of them rotated), each token at its own position of one table. Position 0
// is among them: there sin is exactly 0 and Inf * 0 makes NaN, the case
// where a kernel that skipped a product would differ from the reference.
constexpr std::size_t kTokens = 4;
constexpr std::size_t kHeads = 3;
constexpr std::size_t kPositions[kTokens] = {0, 1, 77, 1000};

TYPED_TEST(NonFinite, PropagateExactlyWhereTheReferencePutsThemAndNowhereElse) {
  using T = TypeParam;
  const T specials[] = {std::numeric_limits<T>::quiet_NaN(), -std::numeric_limits<T>::quiet_NaN(),
                        std::numeric_limits<T>::infinity(), -std::numeric_limits<T>::infinity()};
  std::mt19937 gen(20260601u);
  std::size_t checked_nonfinite = 0;
  constexpr std::size_t kMaxRotaryDim = 70;
  std::vector<std::unique_ptr<rope::Table<T>>> tables(kMaxRotaryDim + 1);
  for (std::size_t r = 2; r <= kMaxRotaryDim; r += 2) {
    tables[r] = std::make_unique<rope::Table<T>>(rope::frequencies(r, 10000.0), kPositions[kTokens - 1] + 1);
  }
  rope_test::for_each_arch<T>([&](auto arch) {
    using Arch = decltype(arch);
    for_each_style([&](auto style_tag) {
      constexpr Style S = decltype(style_tag)::value;
      for (Direction dir : {Direction::forward, Direction::inverse}) {
        for (std::size_t r = 2; r <= kMaxRotaryDim; r += 2) {
          const std::size_t head_dim = r + 3;
          const std::size_t n = kTokens * kHeads * head_dim;
          const rope::Table<T>& table = *tables[r];
          const auto clean = rope_test::random_vector<T>(n, static_cast<std::uint32_t>(r), 2.0);

          // 1..3 special values at random channels of one random head
          // vector (rotated or pass-through channels).
          auto dirty = clean;
          const std::size_t t0 = gen() % kTokens, h0 = gen() % kHeads;
          const std::size_t row0 = (t0 * kHeads + h0) * head_dim;
          const std::size_t count = 1 + gen() % 3;
          for (std::size_t k = 0; k < count; ++k) {
            dirty[row0 + gen() % head_dim] = specials[gen() % 4];
          }

          auto y_clean = clean, y_dirty = dirty;
          for (std::size_t t = 0; t < kTokens; ++t) {
            for (std::size_t h = 0; h < kHeads; ++h) {
              const std::size_t o = (t * kHeads + h) * head_dim;
              const T* c = table.cos(kPositions[t]);
              const T* s = table.sin(kPositions[t]);
              rope::rotate<S, T, Arch>(y_clean.data() + o, y_clean.data() + o, c, s, r, dir);
              rope::rotate<S, T, Arch>(y_dirty.data() + o, y_dirty.data() + o, c, s, r, dir);
            }
          }

          std::ostringstream where;
          where << Arch::name() << " " << rope::name(S) << " " << rope::name(dir) << " rotary_dim=" << r
                << " token=" << t0 << " head=" << h0;
          // Every other head vector: bit for bit the clean result.
          for (std::size_t i = 0; i < n; ++i) {
            if (i >= row0 && i < row0 + head_dim) continue;
            ASSERT_EQ(std::memcmp(&y_clean[i], &y_dirty[i], sizeof(T)), 0) << where.str() << " offset " << i;
          }
          // The dirty head vector: the reference in double decides each
          // channel's class; finite channels agree to a few ulps.
          std::vector<double> expected, magnitude;
          const T* c = table.cos(kPositions[t0]);
          const T* s = table.sin(kPositions[t0]);
          rope_test::reference_in_double<S>(dirty.data() + row0, c, s, r, dir, expected, magnitude);
          for (std::size_t i = 0; i < r; ++i) {
            const double got = static_cast<double>(y_dirty[row0 + i]);
            ASSERT_EQ(name(kind_of(got)), name(kind_of(expected[i]))) << where.str() << " channel " << i;
            if (kind_of(expected[i]) == Kind::finite) {
              ASSERT_NEAR(got, expected[i],
                          2.0 * std::numeric_limits<T>::epsilon() * magnitude[i] + std::numeric_limits<T>::denorm_min())
                  << where.str() << " channel " << i;
            } else {
              ++checked_nonfinite;
            }
          }
          // Pass-through channels keep the exact bits, NaN payloads included.
          ASSERT_EQ(std::memcmp(&y_dirty[row0 + r], &dirty[row0 + r], (head_dim - r) * sizeof(T)), 0) << where.str();
        }
      }
    });
  });
  EXPECT_GT(checked_nonfinite, 100u);
}

// A pair holding Inf in one channel and a finite value in the other at a
// position whose angle has nonzero cos and sin: both outputs are infinite,
// with the signs the rotation gives; at position 0 (sin exactly 0) the
// partner channel is NaN (Inf * 0), as in the reference.
TYPED_TEST(NonFinite, InfinityInOneChannelOfAPair) {
  using T = TypeParam;
  constexpr std::size_t r = 32;
  const rope::Table<T> table(rope::frequencies(r, 10000.0), 8);
  for_each_style([&](auto style_tag) {
    constexpr Style S = decltype(style_tag)::value;
    for (std::size_t p = 0; p < r / 2; ++p) {
      const std::size_t a = rope::first_channel<S>(p, r);
      const std::size_t b = rope::second_channel<S>(p, r);
      for (std::size_t m : {0u, 1u}) {
        std::vector<T> x(r, T(0.5));
        x[a] = std::numeric_limits<T>::infinity();
        std::vector<T> y(r);
        rope::rotate<S>(x.data(), y.data(), table.cos(m), table.sin(m), r, Direction::forward);
        const double c = table.cos(m)[p], s = table.sin(m)[p];
        // y_a = Inf * c - x_b s, y_b = x_b c + Inf * s.
        EXPECT_EQ(kind_of(y[a]), c > 0 ? Kind::plus_inf : Kind::minus_inf) << rope::name(S) << " p=" << p;
        if (s == 0) {
          EXPECT_EQ(kind_of(y[b]), Kind::nan) << rope::name(S) << " p=" << p << " m=" << m;
        } else {
          EXPECT_EQ(kind_of(y[b]), s > 0 ? Kind::plus_inf : Kind::minus_inf) << rope::name(S) << " p=" << p;
        }
        // Every other pair is untouched by the infinity.
        for (std::size_t q = 0; q < r / 2; ++q) {
          if (q == p) continue;
          EXPECT_TRUE(std::isfinite(y[rope::first_channel<S>(q, r)]));
          EXPECT_TRUE(std::isfinite(y[rope::second_channel<S>(q, r)]));
        }
      }
    }
  });
}

// 16-bit storage (BFloat16, Float16) with NaN and Inf: the 16-bit kernels
// widen to float, rotate, and round once, so each output's class (NaN, +Inf,
// -Inf, finite) is the float kernel's on the widened input, rounded to 16
// bits, and finite outputs are the same bits. Every head vector without a
// special value is bit for bit the clean result: nothing non-finite leaks.
// Inputs stay below 4 in magnitude, so no finite value overflows Float16.
template <class H>
void expect_sixteen_bit_nonfinite_like_float() {
  constexpr std::size_t kHeadDim = 40, kRotary = 32, n = kTokens * kHeads * kHeadDim;
  const rope::Table<float> table(rope::frequencies(kRotary), kPositions[kTokens - 1] + 1);
  const float specials[] = {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity()};
  const std::int64_t positions[kTokens] = {0, 1, 77, 1000};
  std::mt19937 gen(20260602u);
  std::size_t nonfinite = 0;
  for (int trial = 0; trial < 200; ++trial) {
    const Style style = trial % 2 ? Style::block_diagonal : Style::rotate_half;
    const auto values = rope_test::random_vector<float>(n, static_cast<std::uint32_t>(trial), 2.0);
    std::vector<H> in(n);
    for (std::size_t i = 0; i < n; ++i) in[i] = H(values[i]);
    const auto clean = in;
    const std::size_t row0 = (gen() % (kTokens * kHeads)) * kHeadDim;
    for (std::size_t k = 0, count = 1 + gen() % 3; k < count; ++k) {
      in[row0 + gen() % kHeadDim] = H(specials[gen() % 3]);
    }
    std::vector<float> wide(n);
    for (std::size_t i = 0; i < n; ++i) wide[i] = static_cast<float>(in[i]);
    rope::apply(rope::View<float>::token_major(wide.data(), kTokens, kHeads, kHeadDim), table, style, positions);
    std::vector<H> out(n), out_clean(n);
    rope::apply(rope::View<const H>::token_major(in.data(), kTokens, kHeads, kHeadDim),
                rope::View<H>::token_major(out.data(), kTokens, kHeads, kHeadDim), table, style, positions);
    rope::apply(rope::View<const H>::token_major(clean.data(), kTokens, kHeads, kHeadDim),
                rope::View<H>::token_major(out_clean.data(), kTokens, kHeads, kHeadDim), table, style, positions);
    for (std::size_t i = 0; i < n; ++i) {
      const H expected(wide[i]);
      const Kind want = kind_of(static_cast<float>(expected)), got = kind_of(static_cast<float>(out[i]));
      ASSERT_STREQ(name(got), name(want)) << "trial " << trial << " element " << i;
      if (want == Kind::finite) {
        ASSERT_EQ(std::memcmp(&out[i], &expected, sizeof(H)), 0) << "trial " << trial << " element " << i;
      } else {
        ++nonfinite;
      }
      if (i < row0 || i >= row0 + kHeadDim) {
        ASSERT_EQ(std::memcmp(&out[i], &out_clean[i], sizeof(H)), 0) << "trial " << trial << " element " << i;
      }
    }
  }
  EXPECT_GT(nonfinite, 200u);
}

TEST(NonFiniteSixteenBit, BFloat16PropagatesExactlyWhereFloatDoes) {
  expect_sixteen_bit_nonfinite_like_float<rope::BFloat16>();
}
TEST(NonFiniteSixteenBit, Float16PropagatesExactlyWhereFloatDoes) {
  expect_sixteen_bit_nonfinite_like_float<rope::Float16>();
}

}  // namespace
