// Tables against the exact angle: every float entry within 2^-24 of
// cos/sin(m * theta_p) evaluated in long double, at positions beyond 2^20.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <stdexcept>

#include <rope/table.hpp>

namespace {

// theta_p and the angle m * theta_p computed independently in long double.
long double exact_angle(std::size_t m, std::size_t p, std::size_t rotary_dim, long double base) {
  const long double theta = std::pow(base, -2.0L * static_cast<long double>(p) / rotary_dim);
  return static_cast<long double>(m) * theta;
}

template <class T>
void expect_exact(const rope::Table<T>& table, std::size_t m, long double base, long double bound) {
  const std::size_t r = table.rotary_dim();
  for (std::size_t p = 0; p < r / 2; ++p) {
    const long double angle = exact_angle(m, p, r, base);
    const long double af = table.attention_factor();
    ASSERT_LE(std::fabs(static_cast<long double>(table.cos(m)[p]) - af * std::cos(angle)), bound)
        << "cos at m=" << m << " p=" << p;
    ASSERT_LE(std::fabs(static_cast<long double>(table.sin(m)[p]) - af * std::sin(angle)), bound)
        << "sin at m=" << m << " p=" << p;
  }
}

TEST(Table, FloatEntriesWithin2PowMinus24OfTheExactAngleBeyond2Pow20) {
  constexpr std::size_t kPositions = (std::size_t{1} << 20) + 4096;
  constexpr std::size_t kRotaryDim = 8;  // a small row keeps the table at 36 MB
  const rope::Table<float> table(rope::frequencies(kRotaryDim, 10000.0), kPositions);
  ASSERT_EQ(table.positions(), kPositions);
  ASSERT_EQ(table.rotary_dim(), kRotaryDim);
  const long double bound = std::ldexp(1.0L, -24);
  // Every position near the start and the end, and a stride through the rest.
  for (std::size_t m = 0; m < 4096; ++m) expect_exact(table, m, 10000.0L, bound);
  for (std::size_t m = 4096; m < kPositions - 4096; m += 97) expect_exact(table, m, 10000.0L, bound);
  for (std::size_t m = kPositions - 4096; m < kPositions; ++m) expect_exact(table, m, 10000.0L, bound);
}

TEST(Table, FullHeadFloatAndDoubleTablesAreExactToTheirPrecision) {
  constexpr std::size_t kRotaryDim = 128;
  const auto f = rope::frequencies(kRotaryDim, 500000.0);
  const rope::Table<float> tf(f, 8192);
  const rope::Table<double> td(f, 8192);
  for (std::size_t m = 0; m < 8192; m += 7) {
    expect_exact(tf, m, 500000.0L, std::ldexp(1.0L, -24));
    // Double: the double angle is within ~m * 2^-53 rad of the exact one.
    expect_exact(td, m, 500000.0L, std::ldexp(1.0L, -52) * (1 + m));
  }
}

// An accumulated angle drifts: the same positions computed by repeated float
// addition are far outside the bound the table meets. This is why the table
// never accumulates.
TEST(Table, AccumulatedFloatAnglesWouldFailTheBound) {
  constexpr std::size_t kRotaryDim = 8;
  constexpr std::size_t kM = 100000;
  const auto f = rope::frequencies(kRotaryDim);
  const std::size_t p = 1;  // theta_1 = 10000^(-1/4) = 0.1: not a float
  float angle = 0;
  const float step = static_cast<float>(f.inv_freq[p]);
  for (std::size_t m = 0; m < kM; ++m) angle += step;
  const long double exact = exact_angle(kM, p, kRotaryDim, 10000.0L);
  EXPECT_GT(std::fabs(std::cos(static_cast<long double>(angle)) - std::cos(exact)), 1e-3L);
  const rope::Table<float> table(f, kM + 1);
  EXPECT_LE(std::fabs(table.cos(kM)[p] - std::cos(exact)), std::ldexp(1.0L, -24));
}

TEST(Table, AttentionFactorScalesCosAndSin) {
  auto f = rope::frequencies(16);
  f.attention_factor = 1.25;
  const rope::Table<double> table(f, 64);
  EXPECT_DOUBLE_EQ(table.attention_factor(), 1.25);
  for (std::size_t m = 0; m < 64; ++m) expect_exact(table, m, 10000.0L, 1e-14L);
  EXPECT_DOUBLE_EQ(table.cos(0)[0], 1.25);
}

TEST(Table, RejectsEmptyFrequencies) {
  EXPECT_THROW(rope::Table<float>(rope::Frequencies{}, 16), std::invalid_argument);
}

}  // namespace
