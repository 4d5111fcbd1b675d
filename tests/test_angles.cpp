// rope::angles: one position on the fly. It must equal a table row bit for
// bit (a decoder may switch between them at any position), meet the accuracy
// statement of docs/design.md far beyond any table, carry the attention factor, and reject bad arguments
// without writing.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <stdexcept>
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

template <class T>
void expect_equals_table_row() {
  for (const auto& f : schedules()) {
    const std::size_t pairs = f.inv_freq.size();
    const rope::Table<T> table(f, 2048);
    std::vector<T> c(pairs), s(pairs);
    for (std::size_t m = 0; m < 2048; ++m) {
      rope::angles(f, m, c.data(), s.data());
      for (std::size_t p = 0; p < pairs; ++p) {
        ASSERT_EQ(c[p], table.cos(m)[p]) << "m=" << m << " p=" << p;
        ASSERT_EQ(s[p], table.sin(m)[p]) << "m=" << m << " p=" << p;
      }
    }
  }
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

// Bit-for-bit equality is the promise that lets a decoder switch between a
// table and angles without a seam; it says nothing of accuracy (both run
// detail::sincos_row), so each row is also held to the oracle.
TEST(Angles, EqualsTheTableRowBitForBit) {
  expect_equals_table_row<float>();
  expect_equals_table_row<double>();
  for (const auto& f : schedules()) {
    for (std::size_t m = 0; m < 2048; m += 3) {
      expect_angles_within<float>(f, m, kFloatUlps);
      expect_angles_within<double>(f, m, kDoubleUlps);
    }
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
