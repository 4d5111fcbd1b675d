// rope::angles: one position on the fly. It and the rows of a table must
// meet the accuracy statement of docs/design.md against long double from the
// math, meet it far beyond any table, carry the attention factor, and reject
// bad arguments without writing.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <cstring>
#include <functional>
#include <rope/angles.hpp>
#include <rope/table.hpp>
#include "support.hpp"
#include "ulp_oracle.hpp"

namespace {

std::vector<rope::Frequencies> schedules() {
  rope::scaling::Yarn yarn;
  yarn.factor = 4.0;
  yarn.original_max_positions = 32768;
  return {
      rope::frequencies(128, 500000.0),  rope::frequencies(64, 10000.0, rope::scaling::Llama3{}),
      rope::frequencies(128, 1e6, yarn), rope::frequencies(6, 10000.0),  // shorter than one batch
      rope::frequencies(34, 10000.0),                                    // a partial last batch
  };
}

// The accuracy statement of docs/design.md at positions beyond any table, in
// ulps against the long-double oracle of the library's angle double(m) *
// theta_p (tests/ulp_oracle.hpp). Past 2^20 rad the angles go through
// std::cos/std::sin; the oracle evaluates them in long double, a different
// implementation, so the check is not of a function against itself.
// Bounds as in test_table.cpp: float 1/2 ulp + 2^-27, double 3 ulps.
constexpr long double kDoubleUlps = 3.0L;
constexpr long double kFloatUlps = 0.5L + 0x1p-27L;

template <class T>
long double bound_ulps() {
  return std::is_same<T, float>::value ? kFloatUlps : kDoubleUlps;
}

template <class T>
void expect_angles_within(const rope::Frequencies& f, std::size_t m, long double bound) {
  const std::size_t pairs = f.inv_freq.size();
  std::vector<T> c(pairs), s(pairs);
  rope::angles(f, m, c.data(), s.data());
  for (std::size_t p = 0; p < pairs; ++p) {
    const long double ec = rope_test::exact_cos(m, f.inv_freq[p], f.attention_factor);
    const long double es = rope_test::exact_sin(m, f.inv_freq[p], f.attention_factor);
    ASSERT_LE(rope_test::ulps(c[p], ec), bound) << "cos m=" << m << " p=" << p << " got " << c[p];
    ASSERT_LE(rope_test::ulps(s[p], es), bound) << "sin m=" << m << " p=" << p << " got " << s[p];
  }
}

// Row m of T, rope::angles' or a table's, against exact values: each entry
// within the ulp bound of T at the exact value plus slack[p].
template <class T>
void expect_row_near(const T* c, const T* s, const std::vector<long double>& ec, const std::vector<long double>& es,
                     const std::vector<long double>& slack, std::size_t m, const char* what) {
  for (std::size_t p = 0; p < ec.size(); ++p) {
    const long double bound_c = bound_ulps<T>() * rope_test::ulp_at<T>(ec[p]) + slack[p];
    const long double bound_s = bound_ulps<T>() * rope_test::ulp_at<T>(es[p]) + slack[p];
    ASSERT_LE(std::fabs(static_cast<long double>(c[p]) - ec[p]), bound_c)
        << what << " cos m=" << m << " p=" << p << " got " << c[p] << " exact " << static_cast<double>(ec[p]);
    ASSERT_LE(std::fabs(static_cast<long double>(s[p]) - es[p]), bound_s)
        << what << " sin m=" << m << " p=" << p << " got " << s[p] << " exact " << static_cast<double>(es[p]);
  }
}

// Rows of float and double tables and of rope::angles at positions 0 ..
// 2047 against exact(m, ec, es, slack), evaluated once per position.
template <class Exact>
void expect_rows_near(const rope::Frequencies& f, std::size_t step, Exact&& exact) {
  const std::size_t pairs = f.inv_freq.size();
  const rope::Table<float> tf(f, 2048);
  const rope::Table<double> td(f, 2048);
  std::vector<float> cf(pairs), sf(pairs);
  std::vector<double> cd(pairs), sd(pairs);
  std::vector<long double> ec(pairs), es(pairs), slack(pairs, 0.0L);
  for (std::size_t m = 0; m < 2048; m += step) {
    exact(m, ec, es, slack);
    rope::angles(f, m, cf.data(), sf.data());
    rope::angles(f, m, cd.data(), sd.data());
    expect_row_near(cf.data(), sf.data(), ec, es, slack, m, "float angles");
    expect_row_near(cd.data(), sd.data(), ec, es, slack, m, "double angles");
    expect_row_near(tf.cos(m), tf.sin(m), ec, es, slack, m, "float table");
    expect_row_near(td.cos(m), td.sin(m), ec, es, slack, m, "double table");
    if (::testing::Test::HasFatalFailure()) return;  // one report, not one per position
  }
}

// Rows of a table and of rope::angles against the math: for plain
// schedules (attention factor 1) theta_p = base^(-2p/r) is computed here in
// long double, and each entry at every position below 2048 is held to
// cos(m theta_p) and sin(m theta_p), evaluated in long double, not to
// anything of the library's. The tolerance is the bound of docs/design.md in
// ulps of T plus the error the library's angle carries by definition: its
// theta_p is a double within 2^-52 relative of the math (test_frequencies
// holds it there) and double(m) * theta_p rounds once more (2^-53), so the
// angle is within m theta_p 2^-51 rad of m theta_p, and cos and sin move by
// no more than the angle does (2^-60 more covers long double's own
// rounding). Here that slack is below 2^-40, a small fraction of an ulp of
// float but for entries next to zero. The scaled schedules (Llama 3, YaRN),
// whose theta_p test_frequencies rebuilds from the papers, are held to the
// same ulp bounds against the library's angle.
TEST(Angles, RowsOfTablesAndAnglesWithinTheStatedUlpsOfTheMath) {
  for (const auto& [rotary_dim, base] : {std::pair<std::size_t, double>{128, 500000.0},
                                         {6, 10000.0},   // shorter than one batch
                                         {34, 10000.0},  // a partial last batch
                                         {64, 1e6}}) {
    SCOPED_TRACE("rotary_dim " + std::to_string(rotary_dim) + " base " + std::to_string(base));
    std::vector<long double> theta(rotary_dim / 2);
    for (std::size_t p = 0; p < theta.size(); ++p) {
      theta[p] = std::pow(static_cast<long double>(base), -2.0L * static_cast<long double>(p) / rotary_dim);
    }
    expect_rows_near(rope::frequencies(rotary_dim, base), 1, [&](std::size_t m, auto& ec, auto& es, auto& slack) {
      for (std::size_t p = 0; p < theta.size(); ++p) {
        const long double angle = static_cast<long double>(m) * theta[p];
        ec[p] = std::cos(angle);
        es[p] = std::sin(angle);
        slack[p] = angle * 0x1p-51L + 0x1p-60L;
      }
    });
  }
  for (const auto& f : schedules()) {
    expect_rows_near(f, 3, [&](std::size_t m, auto& ec, auto& es, auto&) {
      for (std::size_t p = 0; p < f.inv_freq.size(); ++p) {
        ec[p] = rope_test::exact_cos(m, f.inv_freq[p], f.attention_factor);
        es[p] = rope_test::exact_sin(m, f.inv_freq[p], f.attention_factor);
      }
    });
  }
}

TEST(Angles, WithinTheStatedUlpsFarBeyondAnyTable) {
  std::mt19937_64 gen(7);
  for (const auto& f : schedules()) {
    for (int i = 0; i < 400; ++i) {
      // Every magnitude from 2^10 to 2^53, and 2^53 itself.
      const std::size_t m = i == 0 ? rope::kMaxExactPosition : (gen() >> (11 + i % 43));
      expect_angles_within<float>(f, m, kFloatUlps);
      expect_angles_within<double>(f, m, kDoubleUlps);
    }
    // Positions whose angle lies next to a multiple of pi/2, for every pair.
    const long double quarter = 1.5707963267948966192313216916397514L;
    for (double theta : f.inv_freq) {
      for (long k : {1L, 2L, 3L, 7L, 1000L, 123457L, 99999989L}) {
        const long double m = std::nearbyint(static_cast<long double>(k) * quarter / theta);
        if (m > static_cast<long double>(rope::kMaxExactPosition)) continue;
        expect_angles_within<float>(f, static_cast<std::size_t>(m), kFloatUlps);
        expect_angles_within<double>(f, static_cast<std::size_t>(m), kDoubleUlps);
      }
    }
  }
}

TEST(Angles, CarriesTheAttentionFactor) {
  std::vector<double> ext(32, 2.0);
  const auto f = rope::frequencies(64, 10000.0, rope::scaling::LongRope{ext, ext, 4096, 131072}, 50000);
  const long double af = std::sqrt(1.0L + std::log(32.0L) / std::log(4096.0L));
  ASSERT_NEAR(f.attention_factor, static_cast<double>(af), 1e-15);
  std::vector<double> c(32), s(32);
  rope::angles(f, 0, c.data(), s.data());
  EXPECT_EQ(c[0], f.attention_factor);
  EXPECT_EQ(s[0], 0.0);
  for (std::size_t m : {std::size_t{123457}, std::size_t{1} << 40}) {
    expect_angles_within<double>(f, m, kDoubleUlps);
    expect_angles_within<float>(f, m, kFloatUlps);
  }
}

TEST(Angles, RejectsBadArgumentsWithoutWriting) {
  const auto f = rope::frequencies(16);
  std::vector<float> c(8, -7.0f), s(8, -7.0f);
  const auto untouched = [&] {
    for (std::size_t p = 0; p < 8; ++p) {
      if (c[p] != -7.0f || s[p] != -7.0f) return false;
    }
    return true;
  };
  try {
    rope::angles(f, rope::kMaxExactPosition + 1, c.data(), s.data());
    ADD_FAILURE() << "no std::out_of_range";
  } catch (const std::out_of_range& e) {
    EXPECT_NE(std::string(e.what()).find("position"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(std::to_string(rope::kMaxExactPosition + 1)), std::string::npos) << e.what();
  }
  EXPECT_THROW(rope::angles(f, std::numeric_limits<std::size_t>::max(), c.data(), s.data()), std::out_of_range);
  EXPECT_THROW(rope::angles(rope::Frequencies{}, 0, c.data(), s.data()), std::invalid_argument);
  EXPECT_THROW(rope::angles(f, 0, static_cast<float*>(nullptr), s.data()), std::invalid_argument);
  EXPECT_THROW(rope::angles(f, 0, c.data(), static_cast<float*>(nullptr)), std::invalid_argument);
  EXPECT_TRUE(untouched());
}

}  // namespace

// ---- Bad input: every refusal names its argument and writes nothing (docs/errors.md).
namespace {
namespace angle_errors {
namespace scaling = rope::scaling;
[[maybe_unused]] constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
[[maybe_unused]] constexpr double kInf = std::numeric_limits<double>::infinity();
using rope_test::expect_names;
using rope_test::message_of;

// rope::angles: every rejected argument leaves both output rows untouched.
template <class T>
void expect_angles_rejected(const rope::Frequencies& f, std::size_t position, bool null_cos, bool null_sin,
                            const std::string& argument, const std::string& value, bool out_of_range) {
  SCOPED_TRACE(argument);
  std::vector<T> cos(8), sin(8);
  for (std::size_t i = 0; i < 8; ++i) {
    cos[i] = static_cast<T>(-1000.0 - double(i));
    sin[i] = static_cast<T>(2000.0 + double(i));
  }
  const auto cos_before = cos, sin_before = sin;
  const auto call = [&] {
    rope::angles<T>(f, position, null_cos ? nullptr : cos.data(), null_sin ? nullptr : sin.data());
  };
  const auto msg = out_of_range ? message_of<std::out_of_range>(call) : message_of<std::invalid_argument>(call);
  expect_names(msg, argument, value);
  EXPECT_EQ(std::memcmp(cos.data(), cos_before.data(), 8 * sizeof(T)), 0);
  EXPECT_EQ(std::memcmp(sin.data(), sin_before.data(), 8 * sizeof(T)), 0);
}

TEST(AnglesErrors, AnglesRejectsAndWritesNothing) {
  const auto f = rope::frequencies(16);
  const std::size_t past = rope::kMaxExactPosition + 1;
  expect_angles_rejected<float>(rope::Frequencies{}, 0, false, false, "inv_freq", "empty", false);
  expect_angles_rejected<float>(f, 0, true, false, "cos_out", "null", false);
  expect_angles_rejected<double>(f, 0, false, true, "sin_out", "null", false);
  expect_angles_rejected<float>(f, past, false, false, "position", std::to_string(past), true);
  expect_angles_rejected<double>(f, std::numeric_limits<std::size_t>::max(), false, false, "position",
                                 std::to_string(std::numeric_limits<std::size_t>::max()), true);
}

}  // namespace angle_errors
}  // namespace
