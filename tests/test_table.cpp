// Tables against the accuracy statement of docs/design.md ("Accuracy of
// tables and angles"), in ulps of T against a long-double oracle
// (tests/ulp_oracle.hpp): every float entry is within kFloatUlps of
// attention_factor * cos/sin(a), every double entry within kDoubleUlps, where
// a = double(m) * theta_p is the library's angle. Swept over positions
// 0 .. 2^20 + 4096, positions whose angle lands next to a multiple of pi/2,
// the fastest and slowest pairs, every rotary_dim 2 .. 70 and some up to 256,
// several bases, attention factors != 1, and angles past the SIMD range.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <vector>

#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <rope/table.hpp>
#include <utility>
#include "support.hpp"
#include "ulp_oracle.hpp"

namespace {

using rope_test::exact_cos;
using rope_test::exact_sin;
using rope_test::ulps;

// The bounds of docs/design.md ("Accuracy of tables and angles"):
//   double: 3 ulps. The reduction by pi/2 (two roundings), the polynomial
//   and the product with the attention factor add up to ~2.5 ulps; the
//   largest error measured over 5e8 entries was 2.49 ulps (2.45 with
//   attention factor 1). std::cos/std::sin past 2^20 rad are within 1 ulp.
//   float: one rounding to nearest of that double: 1/2 ulp of float plus the
//   double's error, 3 ulps of double = 3 * 2^-29 ulps of float < 2^-27.
constexpr long double kDoubleUlps = 3.0L;
constexpr long double kFloatUlps = 0.5L + 0x1p-27L;

template <class T>
constexpr long double bound_ulps() {
  return std::is_same<T, float>::value ? kFloatUlps : kDoubleUlps;
}

// Every entry of row m against the oracle; returns the largest error seen.
template <class T>
long double expect_row_within(const T* c, const T* s, const rope::Frequencies& f, std::size_t m,
                              long double bound = bound_ulps<T>()) {
  long double worst = 0;
  for (std::size_t p = 0; p < f.inv_freq.size(); ++p) {
    const long double ec = exact_cos(m, f.inv_freq[p], f.attention_factor);
    const long double es = exact_sin(m, f.inv_freq[p], f.attention_factor);
    const long double uc = ulps(c[p], ec), us = ulps(s[p], es);
    EXPECT_LE(uc, bound) << "cos m=" << m << " p=" << p << " got " << c[p] << " exact " << ec;
    EXPECT_LE(us, bound) << "sin m=" << m << " p=" << p << " got " << s[p] << " exact " << es;
    if (uc > bound || us > bound) return std::max(uc, us);  // one report per row
    worst = std::max(worst, std::max(uc, us));
  }
  return worst;
}

template <class T>
long double expect_exact_for(const rope::Table<T>& table, const rope::Frequencies& f, std::size_t m) {
  return expect_row_within(table.cos(m), table.sin(m), f, m);
}

// Positions m whose angle m * theta_p lies next to a multiple of pi/2 (cos or
// sin near 0, the entries with the largest relative error), for k = 1 ..
// kMax quarter turns, below `limit`.
std::vector<std::size_t> near_quarter_turns(double theta, std::size_t limit, long k_max = 400) {
  std::vector<std::size_t> ms;
  const long double quarter = 1.5707963267948966192313216916397514L;
  for (long k = 1; k <= k_max; ++k) {
    const long double m = std::nearbyint(static_cast<long double>(k) * quarter / theta);
    if (m >= static_cast<long double>(limit)) break;
    for (long double d : {-1.0L, 0.0L, 1.0L}) {
      if (m + d >= 0 && m + d < static_cast<long double>(limit)) ms.push_back(static_cast<std::size_t>(m + d));
    }
  }
  return ms;
}

TEST(Table, FloatEntriesWithinHalfAnUlpAtEveryPositionTo2Pow20) {
  constexpr std::size_t kPositions = (std::size_t{1} << 20) + 4096;
  constexpr std::size_t kRotaryDim = 8;  // a small row keeps the table at 36 MB
  const auto f = rope::frequencies(kRotaryDim, 10000.0);
  const rope::Table<float> table(f, kPositions);
  ASSERT_EQ(table.positions(), kPositions);
  ASSERT_EQ(table.rotary_dim(), kRotaryDim);
  long double worst = 0;
  for (std::size_t m = 0; m < kPositions; ++m) worst = std::max(worst, expect_exact_for(table, f, m));
  // Correct rounding leaves errors up to 1/2 ulp: over 8M entries some come
  // close, so a bound far above the errors seen would show here.
  EXPECT_GT(worst, 0.49L);
  std::printf("[ rope     ] float table, %zu entries: max %.9Lf ulps\n", 2 * kPositions * 4, worst);
}

TEST(Table, DoubleEntriesWithinTheStatedUlpsTo2Pow20) {
  constexpr std::size_t kPositions = (std::size_t{1} << 20) + 4096;
  const auto f = rope::frequencies(4, 10000.0);
  const rope::Table<double> table(f, kPositions);
  long double worst = 0;
  for (std::size_t m = 0; m < kPositions; ++m) worst = std::max(worst, expect_exact_for(table, f, m));
  EXPECT_GT(worst, 0.5L);  // not correctly rounded everywhere: the bound is not vacuous
  std::printf("[ rope     ] double table, %zu entries: max %.9Lf ulps\n", 2 * kPositions * 2, worst);
}

// Entry (p) of row m against the oracle's cos and sin of that entry (one
// evaluation shared by every value checked at (m, p): under an emulator the
// long-double oracle is the cost of these sweeps).
template <class T>
void expect_entry_within(T c, T s, long double exact_c, long double exact_s, std::size_t m, std::size_t p) {
  EXPECT_LE(ulps(c, exact_c), bound_ulps<T>()) << "cos m=" << m << " p=" << p;
  EXPECT_LE(ulps(s, exact_s), bound_ulps<T>()) << "sin m=" << m << " p=" << p;
}

// The entries with the smallest magnitude, cos/sin next to 0, where an
// absolute bound says nothing: positions within one of k * pi/(2 theta_p)
// (k = 1 .. 400, below 2^40) for every pair, the fastest (theta_0 = 1) and
// slowest alike; and for base 10000, through a table for those below 2^16
// (a table row is sincos_row of the whole row, stored: one base shows that
// the stored entries are the row's, the row itself is checked on all three).
TEST(Table, EntriesNextToAQuarterTurnWithinTheStatedUlps) {
  constexpr std::size_t kTablePositions = std::size_t{1} << 16;
  constexpr double kTableBase = 10000.0;
  for (double base : {10000.0, 500000.0, 1e6}) {
    // The oracle's (cos, sin) by (theta, m), evaluated once per base: the
    // pairs of r = 2, 16 and 128 are pairs of r = 256 (theta_i =
    // base^(-2i/r)), so most of a smaller head's values are seen before.
    std::map<std::pair<double, std::size_t>, std::pair<long double, long double>> oracle;
    for (std::size_t r : {256u, 128u, 16u, 2u}) {
      const auto f = rope::frequencies(r, base);
      const std::size_t table_positions = base == kTableBase ? kTablePositions : 1;
      const rope::Table<float> tf(f, table_positions);
      const rope::Table<double> td(f, table_positions);
      // Pair p is computed in the block of kBlock pairs that holds it (kBlock
      // a multiple of every SIMD width, so the block's batches and tail are
      // the full row's): the same lanes as in the full row at a fraction of
      // the row's work.
      constexpr std::size_t kBlock = 16;
      std::vector<float> cf(kBlock), sf(kBlock);
      std::vector<double> cd(kBlock), sd(kBlock);
      for (std::size_t p = 0; p < r / 2; ++p) {
        const std::size_t first = p - p % kBlock, count = std::min(kBlock, r / 2 - first), lane = p - first;
        for (std::size_t m : near_quarter_turns(f.inv_freq[p], std::size_t{1} << 40)) {
          rope::detail::sincos_row<float>(f.inv_freq.data() + first, count, double(m), 1.0, cf.data(), sf.data());
          rope::detail::sincos_row<double>(f.inv_freq.data() + first, count, double(m), 1.0, cd.data(), sd.data());
          auto [at, fresh] = oracle.try_emplace({f.inv_freq[p], m});
          if (fresh) at->second = {exact_cos(m, f.inv_freq[p], 1.0), exact_sin(m, f.inv_freq[p], 1.0)};
          const auto [c, s] = at->second;
          expect_entry_within(cf[lane], sf[lane], c, s, m, p);
          expect_entry_within(cd[lane], sd[lane], c, s, m, p);
          if (m < table_positions) {
            expect_entry_within(tf.cos(m)[p], tf.sin(m)[p], c, s, m, p);
            expect_entry_within(td.cos(m)[p], td.sin(m)[p], c, s, m, p);
          }
        }
      }
    }
  }
}

TEST(Table, FullHeadFloatAndDoubleTablesAreExactToTheirPrecision) {
  constexpr std::size_t kRotaryDim = 128;
  const auto f = rope::frequencies(kRotaryDim, 500000.0);
  const rope::Table<float> tf(f, 8192);
  const rope::Table<double> td(f, 8192);
  for (std::size_t m = 0; m < 8192; ++m) {
    expect_exact_for(tf, f, m);
    expect_exact_for(td, f, m);
  }
}

// An accumulated angle drifts: the cos of a running float sum of theta_p is
// off by more than 1e-3 at m = 1e5, where the table's entry (one double
// product) is within the bound of docs/design.md. Both are measured against
// the math rather than anything of the library's: theta_1 of rotary_dim 8,
// base 10^4, is (10^4)^(-1/4) = 1/10, so m theta_1 = 10^4 exactly and the
// reference is cos(10^4) in long double. The float sum adds the float
// nearest 1/10 m times. The table's tolerance is 1/2 ulp + 2^-27 ulp of
// float plus the error its angle carries by definition: theta_1 is a double
// within 2^-52 relative of 1/10 (test_frequencies) and double(m) * theta_1
// rounds once more, so the angle is within 10^4 * 2^-51 rad of 10^4.
TEST(Table, AccumulatedFloatAnglesWouldFailTheBound) {
  constexpr std::size_t kRotaryDim = 8;
  constexpr std::size_t kM = 100000;
  const std::size_t p = 1;
  const long double exact = std::cos(10000.0L);
  float angle = 0;
  const float step = 0.1f;
  for (std::size_t m = 0; m < kM; ++m) angle += step;
  const long double drifted = std::cos(static_cast<long double>(angle));
  EXPECT_GT(std::fabs(drifted - exact), 1e-3L);
  EXPECT_GT(ulps(static_cast<float>(drifted), exact), 1000.0L);
  const rope::Table<float> table(rope::frequencies(kRotaryDim, 10000.0), kM + 1);
  const long double tolerance = kFloatUlps * rope_test::ulp_at<float>(exact) + 10000.0L * 0x1p-51L;
  EXPECT_LE(std::fabs(static_cast<long double>(table.cos(kM)[p]) - exact), tolerance)
      << "table " << table.cos(kM)[p] << " exact " << static_cast<double>(exact);
}

TEST(Table, AttentionFactorScalesCosAndSin) {
  auto f = rope::frequencies(16);
  f.attention_factor = 1.25;
  const rope::Table<double> table(f, 64);
  EXPECT_DOUBLE_EQ(table.attention_factor(), 1.25);
  for (std::size_t m = 0; m < 64; ++m) expect_exact_for(table, f, m);
  EXPECT_EQ(table.cos(0)[0], 1.25);
}

TEST(Table, RejectsEmptyFrequencies) {
  EXPECT_THROW(rope::Table<float>(rope::Frequencies{}, 16), std::invalid_argument);
}

TEST(Table, EveryRowLengthIsExactIncludingSimdTails) {
  for (std::size_t r = 2; r <= 70; r += 2) {
    const auto f = rope::frequencies(r, 10000.0);
    const rope::Table<float> tf(f, 3000);
    const rope::Table<double> td(f, 3000);
    for (std::size_t m = 0; m < 3000; m += 11) {
      expect_exact_for(tf, f, m);
      expect_exact_for(td, f, m);
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
    expect_exact_for(tf, f, m);
    expect_exact_for(td, f, m);
  }
}

TEST(Table, FullHeadAt128KPositionsIsExact) {
  const auto f = rope::frequencies(128, 500000.0);
  const rope::Table<float> table(f, 131072);
  for (std::size_t m = 0; m < 131072; m += 13) expect_exact_for(table, f, m);
  for (std::size_t m = 131072 - 64; m < 131072; ++m) expect_exact_for(table, f, m);
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
      expect_exact_for(tf, f, m);
      expect_exact_for(td, f, m);
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
    EXPECT_NE(std::string(e.what()).find("got " + std::to_string(positions)), std::string::npos) << e.what();
  }
}

}  // namespace table_errors
}  // namespace
