// The default schedule theta_p = base^(-2p/r) against a long double closed
// form, and the errors for invalid arguments.
#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>
#include <string>

#include <rope/frequencies.hpp>

namespace {

TEST(Frequencies, DefaultScheduleMatchesClosedForm) {
  for (std::size_t r : {2u, 4u, 24u, 64u, 96u, 128u, 256u}) {
    for (double base : {10000.0, 500000.0, 1e6, 2.5}) {
      const auto f = rope::frequencies(r, base);
      ASSERT_EQ(f.inv_freq.size(), r / 2);
      EXPECT_EQ(f.rotary_dim(), r);
      EXPECT_EQ(f.attention_factor, 1.0);
      EXPECT_EQ(f.inv_freq[0], 1.0);
      for (std::size_t p = 0; p < r / 2; ++p) {
        const long double exact = std::pow(static_cast<long double>(base), -2.0L * p / r);
        // Rounded once from a wider evaluation: within one ulp (2^-52 relative).
        EXPECT_NEAR(f.inv_freq[p], static_cast<double>(exact), 0x1p-52 * static_cast<double>(exact))
            << "r=" << r << " base=" << base << " p=" << p;
        if (p > 0) {
          EXPECT_LT(f.inv_freq[p], f.inv_freq[p - 1]);
        }
      }
    }
  }
}

TEST(Frequencies, DefaultBaseIsTenThousand) {
  const auto f = rope::frequencies(64);
  EXPECT_NEAR(f.inv_freq[1], std::pow(10000.0, -2.0 / 64), 1e-16);
}

template <class F>
std::string message_of(F&& f) {
  try {
    f();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "(no std::invalid_argument)";
}

TEST(Frequencies, RejectsOddOrZeroRotaryDimNamingIt) {
  for (std::size_t r : {0u, 1u, 3u, 127u}) {
    const auto msg = message_of([&] { rope::frequencies(r); });
    EXPECT_NE(msg.find("rotary_dim"), std::string::npos) << msg;
    EXPECT_NE(msg.find(std::to_string(r)), std::string::npos) << msg;
  }
}

TEST(Frequencies, RejectsBaseAtOrBelowOneNamingIt) {
  for (double base : {1.0, 0.5, 0.0, -10.0, std::nan(""), double(INFINITY)}) {
    const auto msg = message_of([&] { rope::frequencies(64, base); });
    EXPECT_NE(msg.find("base"), std::string::npos) << msg;
  }
}

}  // namespace
