// Tables against the exact angle: every float entry within 2^-24 of
// cos/sin(m * theta_p) evaluated in long double, at positions beyond 2^20,
// on every row length (SIMD tails), for angles past the SIMD range, and with
// scaled frequencies and their attention factor.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <vector>

#include <rope/table.hpp>
#include <cstring>
#include <functional>
#include <limits>
#include "support.hpp"

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

// Against the table's own theta_p (as stored, in double), so the check is of
// the table alone, whatever schedule produced it. A float entry must be
// within `bound` (2^-24 times the largest magnitude an entry can have) of the
// exact angle's cos/sin. A double entry is held to a few ulps of the cos/sin
// of the double angle m * theta_p (the rounding of that one product is the
// only error the design allows beyond them), so the reference then rounds
// the product to double the same way.
enum class Angle { exact, rounded_to_double };

template <class T>
void expect_exact_for(const rope::Table<T>& table, const rope::Frequencies& f, std::size_t m,
                      long double bound, Angle kind = Angle::exact) {
  const long double af = f.attention_factor;
  for (std::size_t p = 0; p < f.inv_freq.size(); ++p) {
    const long double angle =
        kind == Angle::exact
            ? static_cast<long double>(m) * static_cast<long double>(f.inv_freq[p])
            : static_cast<long double>(static_cast<double>(m) * f.inv_freq[p]);
    ASSERT_LE(std::fabs(table.cos(m)[p] - af * std::cos(angle)), bound) << "cos m=" << m << " p=" << p;
    ASSERT_LE(std::fabs(table.sin(m)[p] - af * std::sin(angle)), bound) << "sin m=" << m << " p=" << p;
  }
}

long double float_bound(double attention_factor) {
  return std::ldexp(1.0L, -24) * std::max(1.0L, static_cast<long double>(attention_factor));
}

TEST(Table, EveryRowLengthIsExactIncludingSimdTails) {
  for (std::size_t r = 2; r <= 70; r += 2) {
    const auto f = rope::frequencies(r, 10000.0);
    const rope::Table<float> tf(f, 3000);
    const rope::Table<double> td(f, 3000);
    for (std::size_t m = 0; m < 3000; m += 11) {
      expect_exact_for(tf, f, m, float_bound(1.0));
      expect_exact_for(td, f, m, 4e-16L, Angle::rounded_to_double);
    }
  }
}

// A pair's value never depends on how long the row is or where the SIMD
// batch boundary falls: rows sharing a prefix of frequencies agree there bit
// for bit.
TEST(Table, ValuesDoNotDependOnTheRowLength) {
  const auto full = rope::frequencies(64, 10000.0);
  const rope::Table<float> long_table(full, 500);
  for (std::size_t pairs : {1u, 3u, 7u, 9u, 17u}) {
    const std::vector<double> prefix(full.inv_freq.begin(), full.inv_freq.begin() + pairs);
    const rope::Table<float> short_table(rope::Frequencies{prefix, 1.0}, 500);
    for (std::size_t m = 0; m < 500; ++m) {
      for (std::size_t p = 0; p < pairs; ++p) {
        ASSERT_EQ(short_table.cos(m)[p], long_table.cos(m)[p]) << m << " " << p;
        ASSERT_EQ(short_table.sin(m)[p], long_table.sin(m)[p]) << m << " " << p;
      }
    }
  }
}

// Angles past the range of the vectorised reduction (2^20 rad) go through
// std::cos/std::sin lane by lane; batches mixing small and large angles too.
TEST(Table, AnglesFarPastTheSimdRangeStayExact) {
  const std::vector<double> inv{1.0, 37.25, 0.001, 3.0, 250.5, 1e-4, 7.75, 0.5, 91.0, 2e-6, 13.0};
  const rope::Frequencies f{inv, 1.0};
  const rope::Table<float> tf(f, 40000);
  const rope::Table<double> td(f, 40000);
  for (std::size_t m = 0; m < 40000; m += 3) {
    expect_exact_for(tf, f, m, float_bound(1.0));
    expect_exact_for(td, f, m, 4e-16L, Angle::rounded_to_double);
  }
}

TEST(Table, FullHeadAt128KPositionsIsExact) {
  const auto f = rope::frequencies(128, 500000.0);
  const rope::Table<float> table(f, 131072);
  for (std::size_t m = 0; m < 131072; m += 13) expect_exact_for(table, f, m, float_bound(1.0));
  for (std::size_t m = 131072 - 64; m < 131072; ++m) expect_exact_for(table, f, m, float_bound(1.0));
}

// The attention factor of a scaled schedule reaches every entry.
TEST(Table, ScaledFrequenciesAndTheirAttentionFactorReachTheTable) {
  rope::scaling::Yarn yarn;
  yarn.factor = 40.0;
  yarn.original_max_positions = 4096;
  yarn.mscale = 1.0;
  yarn.mscale_all_dim = 0.5;  // g(40, 1)/g(40, 0.5) = 1.3689/1.1844
  std::vector<double> ext(32, 1.5);
  const rope::Frequencies variants[] = {
      rope::frequencies(64, 10000.0, yarn),
      rope::frequencies(64, 10000.0, rope::scaling::LongRope{ext, ext, 4096, 131072}, 8192),
      rope::frequencies(64, 10000.0, rope::scaling::Custom{std::vector<double>(32, 0.125), 0.75}),
  };
  for (const auto& f : variants) {
    ASSERT_NE(f.attention_factor, 1.0);
    const rope::Table<float> tf(f, 5000);
    const rope::Table<double> td(f, 5000);
    EXPECT_EQ(tf.attention_factor(), f.attention_factor);
    EXPECT_EQ(td.cos(0)[0], f.attention_factor);
    EXPECT_EQ(td.sin(0)[0], 0.0);
    for (std::size_t m = 0; m < 5000; m += 7) {
      expect_exact_for(tf, f, m, float_bound(f.attention_factor));
      expect_exact_for(td, f, m, 4e-16L * std::max(1.0, f.attention_factor),
                       Angle::rounded_to_double);
    }
  }
}

}  // namespace

// ---- Bad input: every refusal names its argument and writes nothing (docs/errors.md).
namespace {
namespace table_errors {
namespace scaling = rope::scaling;
[[maybe_unused]] constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
[[maybe_unused]] constexpr double kInf = std::numeric_limits<double>::infinity();
using rope_test::expect_names;
using rope_test::message_of;

TEST(TableErrors, TableRejectsEmptyFrequencies) {
  const auto msg = message_of<std::invalid_argument>([] { rope::Table<float>(rope::Frequencies{}, 16); });
  EXPECT_NE(msg.find("inv_freq"), std::string::npos) << msg;
}

// positions * rotary_dim must not wrap around: a table too large for memory
// is refused by name, never allocated short and written past its end.
TEST(TableErrors, TableRefusesASizeThatOverflows) {
  const std::size_t positions = std::numeric_limits<std::size_t>::max() / 4 + 1;  // * 4 wraps to 0
  try {
    rope::Table<float> table(rope::frequencies(4), positions);
    FAIL() << "no exception";
  } catch (const rope::invalid_argument& e) {
    EXPECT_EQ(e.function(), "rope::Table");
    EXPECT_EQ(e.argument(), "positions");
    EXPECT_NE(std::string(e.what()).find("positions must be at most"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("got " + std::to_string(positions)), std::string::npos)
        << e.what();
  }
}

}  // namespace table_errors
}  // namespace
