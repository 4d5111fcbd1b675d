// rope::angles: one position on the fly. It must equal a table row bit for
// bit (a decoder may switch between them at any position), stay exact far
// beyond any table, carry the attention factor, and reject bad arguments
// without writing.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <stdexcept>
#include <vector>

#include <rope/angles.hpp>
#include <rope/table.hpp>
#include <cstring>
#include <functional>
#include "support.hpp"

namespace {

std::vector<rope::Frequencies> schedules() {
  rope::scaling::Yarn yarn;
  yarn.factor = 4.0;
  yarn.original_max_positions = 32768;
  return {
      rope::frequencies(128, 500000.0),
      rope::frequencies(64, 10000.0, rope::scaling::Llama3{}),
      rope::frequencies(128, 1e6, yarn),
      rope::frequencies(6, 10000.0),   // shorter than one batch
      rope::frequencies(34, 10000.0),  // a partial last batch
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

TEST(Angles, EqualsTheTableRowBitForBit) {
  expect_equals_table_row<float>();
  expect_equals_table_row<double>();
}

// Float values within 2^-24 of cos/sin of the exact angle, computed in long
// double, up to 2^26 (where the double angle's own rounding, 2^-53 * angle,
// still leaves room in the bound); double values within a few ulps of the
// cos/sin of the double angle at any position up to 2^53.
TEST(Angles, ExactFarBeyondAnyTable) {
  const auto f = rope::frequencies(128, 500000.0);
  const std::size_t pairs = f.inv_freq.size();
  std::mt19937_64 gen(7);
  std::vector<float> cf(pairs), sf(pairs);
  std::vector<double> cd(pairs), sd(pairs);
  std::uniform_int_distribution<std::uint64_t> near(1u << 20, 1u << 26);
  for (int i = 0; i < 300; ++i) {
    const std::size_t m = near(gen);
    rope::angles(f, m, cf.data(), sf.data());
    for (std::size_t p = 0; p < pairs; ++p) {
      const long double angle = static_cast<long double>(m) * static_cast<long double>(f.inv_freq[p]);
      ASSERT_LE(std::fabs(cf[p] - std::cos(angle)), std::ldexp(1.0L, -24)) << m << " " << p;
      ASSERT_LE(std::fabs(sf[p] - std::sin(angle)), std::ldexp(1.0L, -24)) << m << " " << p;
    }
  }
  std::uniform_int_distribution<std::uint64_t> far(0, std::uint64_t{1} << 53);
  for (int i = 0; i < 300; ++i) {
    const std::size_t m = i == 0 ? rope::kMaxExactPosition : far(gen);
    rope::angles(f, m, cd.data(), sd.data());
    for (std::size_t p = 0; p < pairs; ++p) {
      const long double angle = static_cast<double>(m) * f.inv_freq[p];
      ASSERT_LE(std::fabs(cd[p] - std::cos(angle)), 4e-16L) << m << " " << p;
      ASSERT_LE(std::fabs(sd[p] - std::sin(angle)), 4e-16L) << m << " " << p;
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
  const std::size_t m = 123457;
  rope::angles(f, m, c.data(), s.data());
  for (std::size_t p = 0; p < 32; ++p) {
    const long double angle = static_cast<double>(m) * f.inv_freq[p];
    EXPECT_LE(std::fabs(c[p] - af * std::cos(angle)), 6e-16L) << p;
    EXPECT_LE(std::fabs(s[p] - af * std::sin(angle)), 6e-16L) << p;
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
    EXPECT_NE(std::string(e.what()).find(std::to_string(rope::kMaxExactPosition + 1)), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(rope::angles(f, std::numeric_limits<std::size_t>::max(), c.data(), s.data()),
               std::out_of_range);
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
  const auto call = [&] { rope::angles<T>(f, position, null_cos ? nullptr : cos.data(), null_sin ? nullptr : sin.data()); };
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
