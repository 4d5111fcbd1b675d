// The default schedule theta_p = base^(-2p/r) and every scaling variant
// against closed forms computed here in long double, their boundary cases,
// and the errors for invalid arguments.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include <rope/frequencies.hpp>

#include <cstring>
#include <functional>
#include "support.hpp"

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

TEST(Frequencies, RejectsOddOrZeroRotaryDimNamingIt) {
  for (std::size_t r : {0u, 1u, 3u, 127u}) {
    const auto msg = rope_test::thrown_message([&] { rope::frequencies(r); });
    EXPECT_NE(msg.find("rotary_dim"), std::string::npos) << msg;
    EXPECT_NE(msg.find(std::to_string(r)), std::string::npos) << msg;
  }
}

TEST(Frequencies, RejectsBaseAtOrBelowOneNamingIt) {
  for (double base : {1.0, 0.5, 0.0, -10.0, std::nan(""), double(INFINITY)}) {
    const auto msg = rope_test::thrown_message([&] { rope::frequencies(64, base); });
    EXPECT_NE(msg.find("base"), std::string::npos) << msg;
  }
}

// ---------------------------------------------------------------------------
// Scaling variants. Each closed form below is written from the formula in
// long double, independently of the library; the library rounds once from a
// long double evaluation, so a few ulps cover both roundings.

namespace closed_form {

using LD = long double;
constexpr LD kPi = 3.141592653589793238462643383279502884L;

LD plain(std::size_t r, LD base, std::size_t p) {
  return std::pow(base, -2.0L * static_cast<LD>(p) / static_cast<LD>(r));
}

std::vector<LD> plain_all(std::size_t r, LD base) {
  std::vector<LD> v;
  for (std::size_t p = 0; p < r / 2; ++p) v.push_back(plain(r, base, p));
  return v;
}

std::vector<LD> ntk(std::size_t r, LD base, LD stretch) {
  const LD scaled = base * std::pow(stretch, static_cast<LD>(r) / static_cast<LD>(r - 2));
  return plain_all(r, scaled);
}

struct YarnResult {
  std::vector<LD> inv;
  LD attention;
  LD lo, hi;
};

// YaRN from its published definitions, not from the library's code:
//  - the YaRN paper (arXiv 2309.00071, section 3.2, "NTK-by-parts"): pair p
//    makes r(p) = L0 / lambda_p = L0 * theta_p / (2 pi) full turns over the
//    original context L0; pairs with r > beta_fast keep theta_p
//    (extrapolation), pairs with r < beta_slow get theta_p / s
//    (interpolation), a ramp blends between them: h = theta_p * ((1 - g) / s + g)
//    with g the fraction kept;
//  - the paper's reference code, whose documented semantics the checkpoints
//    follow: the two boundaries are the (fractional) pair indices where r(p)
//    equals beta_fast and beta_slow, rounded outwards (floor / ceil) unless
//    truncation is off, clamped to [0, r - 1] (the rotary dimension, not the
//    pair count, as the reference code does), widened by 0.001 if equal; the
//    ramp is linear in the pair index between them;
//  - the attention factor sqrt(1/t) = 0.1 ln(s) + 1 (paper, eq. 22), and the
//    DeepSeek variant g(s, mscale) / g(s, mscale_all_dim) with
//    g(s, m) = 0.1 m ln(s) + 1 (1 for s <= 1), unless given outright.
// The boundary is found here by bisection on r(p), a different computation
// from the library's closed-form logarithm.
LD mscale_g(LD s, LD m) { return s <= 1 ? 1.0L : 0.1L * m * std::log(s) + 1.0L; }

// Full turns of a pair at the fractional index x over L0 positions:
// L0 * base^(-2x/r) / (2 pi), decreasing in x.
LD turns(LD x, std::size_t r, LD base, LD l0) {
  return l0 * std::pow(base, -2.0L * x / static_cast<LD>(r)) / (2 * kPi);
}

// The fractional pair index x at which turns(x) == n, by bisection over
// [-4r, 4r] (the root may lie outside [0, r/2): it is clamped later).
LD pair_at_turns(LD n, std::size_t r, LD base, LD l0) {
  LD lo = -4.0L * static_cast<LD>(r), hi = 4.0L * static_cast<LD>(r);
  for (int i = 0; i < 200; ++i) {
    const LD mid = (lo + hi) / 2;
    (turns(mid, r, base, l0) > n ? lo : hi) = mid;
  }
  return (lo + hi) / 2;
}

YarnResult yarn(std::size_t r, LD base, const rope::scaling::Yarn& y) {
  const LD l0 = static_cast<LD>(y.original_max_positions);
  const LD s = y.factor;
  LD lo = pair_at_turns(y.beta_fast, r, base, l0);  // faster pairs keep theta_p
  LD hi = pair_at_turns(y.beta_slow, r, base, l0);  // slower pairs get theta_p / s
  if (y.truncate) {
    lo = std::floor(lo);
    hi = std::ceil(hi);
  }
  lo = std::max(lo, 0.0L);
  hi = std::min(hi, static_cast<LD>(r) - 1);
  if (lo == hi) hi += 0.001L;
  YarnResult out{{}, 1.0L, lo, hi};
  for (std::size_t p = 0; p < r / 2; ++p) {
    // Fraction interpolated: 0 up to lo, 1 from hi, linear in p between.
    const LD interpolated = std::min(1.0L, std::max(0.0L, (static_cast<LD>(p) - lo) / (hi - lo)));
    const LD kept = 1 - interpolated;
    out.inv.push_back(plain(r, base, p) * (kept + interpolated / s));
  }
  if (y.attention_factor) {
    out.attention = *y.attention_factor;
  } else if (y.mscale != 0 && y.mscale_all_dim != 0) {
    out.attention = mscale_g(s, y.mscale) / mscale_g(s, y.mscale_all_dim);
  } else {
    out.attention = mscale_g(s, 1);
  }
  return out;
}

enum class Band { high, medium, low };

std::vector<LD> llama3(std::size_t r, LD base, const rope::scaling::Llama3& s, std::vector<Band>* bands = nullptr) {
  std::vector<LD> out;
  const LD l0 = static_cast<LD>(s.original_max_positions);
  for (std::size_t p = 0; p < r / 2; ++p) {
    const LD inv = plain(r, base, p);
    const LD wavelength = 2 * kPi / inv;
    if (wavelength < l0 / s.high_freq_factor) {
      out.push_back(inv);
      if (bands) bands->push_back(Band::high);
    } else if (wavelength > l0 / s.low_freq_factor) {
      out.push_back(inv / s.factor);
      if (bands) bands->push_back(Band::low);
    } else {
      const LD smooth = (l0 / wavelength - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
      out.push_back((1 - smooth) * inv / s.factor + smooth * inv);
      if (bands) bands->push_back(Band::medium);
    }
  }
  return out;
}

std::vector<LD> longrope(std::size_t r, LD base, const std::vector<double>& ext) {
  std::vector<LD> out;
  for (std::size_t p = 0; p < r / 2; ++p) {
    out.push_back(1.0L / (ext[p] * std::pow(base, 2.0L * static_cast<LD>(p) / static_cast<LD>(r))));
  }
  return out;
}

}  // namespace closed_form

// Every value within `ulps` units of 2^-52 relative of the closed form.
void expect_matches(const std::vector<double>& got, const std::vector<long double>& want, double ulps = 4,
                    const char* what = "") {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (std::size_t p = 0; p < got.size(); ++p) {
    const long double tol = ulps * 0x1p-52L * std::fabs(want[p]);
    EXPECT_LE(std::fabs(got[p] - want[p]), tol)
        << what << " p=" << p << " got " << got[p] << " want " << static_cast<double>(want[p]);
  }
}

using rope::Scaling;
namespace scaling = rope::scaling;

TEST(Scaling, NoneEqualsThePlainScheduleAndIsTheDefault) {
  const auto plain = rope::frequencies(128, 500000.0);
  const auto none = rope::frequencies(128, 500000.0, scaling::None{});
  const auto defaulted = rope::frequencies(128, 500000.0, Scaling{}, 123456);
  EXPECT_EQ(none.inv_freq, plain.inv_freq);
  EXPECT_EQ(defaulted.inv_freq, plain.inv_freq);
  EXPECT_EQ(none.attention_factor, 1.0);
}

TEST(Scaling, LinearDividesEveryFrequencyByTheFactor) {
  for (double factor : {0.5, 2.0, 4.0, 8.0, 3.3}) {
    const auto f = rope::frequencies(96, 10000.0, scaling::Linear{factor});
    std::vector<long double> want;
    for (std::size_t p = 0; p < 48; ++p) want.push_back(closed_form::plain(96, 10000.0L, p) / factor);
    expect_matches(f.inv_freq, want, 2, "linear");
    EXPECT_EQ(f.attention_factor, 1.0);
  }
}

TEST(Scaling, NtkMatchesTheStretchedBaseAndDividesTheLowestFrequencyByFactor) {
  for (std::size_t r : {4u, 64u, 128u}) {
    for (double factor : {2.0, 4.0, 8.0, 0.5}) {
      const auto f = rope::frequencies(r, 10000.0, scaling::Ntk{factor});
      expect_matches(f.inv_freq, closed_form::ntk(r, 10000.0L, factor), 4, "ntk");
      // base'^(-(r-2)/r) = base^(-(r-2)/r) / factor: the slowest pair is
      // exactly position-interpolated, the fastest (p = 0) untouched.
      const long double last = closed_form::plain(r, 10000.0L, r / 2 - 1) / factor;
      EXPECT_NEAR(f.inv_freq.back(), static_cast<double>(last), 8 * 0x1p-52 * static_cast<double>(last));
      EXPECT_EQ(f.inv_freq[0], 1.0);
    }
  }
}

TEST(Scaling, DynamicNtkIsThePlainScheduleAtOrBelowTheOriginalLength) {
  const auto plain = rope::frequencies(128, 10000.0);
  for (double factor : {2.0, 4.0, 0.5}) {
    for (std::size_t seq_len : {std::size_t{0}, std::size_t{1}, std::size_t{2047}, std::size_t{4096}}) {
      const auto f = rope::frequencies(128, 10000.0, scaling::DynamicNtk{factor, 4096}, seq_len);
      EXPECT_EQ(f.inv_freq, plain.inv_freq) << "factor " << factor << " seq_len " << seq_len;
      EXPECT_EQ(f.attention_factor, 1.0);
    }
  }
}

TEST(Scaling, DynamicNtkAboveTheOriginalLengthMatchesTheClosedForm) {
  const auto plain = rope::frequencies(128, 10000.0);
  for (double factor : {2.0, 4.0, 0.5}) {
    std::vector<double> previous = plain.inv_freq;
    for (std::size_t seq_len : {4097u, 8192u, 16384u, 100000u}) {
      const auto f = rope::frequencies(128, 10000.0, scaling::DynamicNtk{factor, 4096}, seq_len);
      const long double l = seq_len, l0 = 4096;
      const long double stretch = factor * l / l0 - (factor - 1);
      expect_matches(f.inv_freq, closed_form::ntk(128, 10000.0L, stretch), 4, "dynamic");
      // A longer sequence only ever lowers the frequencies (never a base below base).
      for (std::size_t p = 1; p < 64; ++p) {
        EXPECT_LT(f.inv_freq[p], previous[p]) << "seq_len " << seq_len << " p " << p;
        EXPECT_FALSE(std::isnan(f.inv_freq[p]));
      }
      previous = f.inv_freq;
    }
  }
}

scaling::Yarn yarn(double factor, std::size_t original) {
  scaling::Yarn y;
  y.factor = factor;
  y.original_max_positions = original;
  return y;
}

TEST(Scaling, YarnMatchesTheClosedFormForCheckpointShapedConfigs) {
  struct Case {
    std::size_t r;
    double base;
    scaling::Yarn y;
  };
  std::vector<Case> cases;
  cases.push_back({128, 1e6, yarn(4.0, 32768)});  // Qwen2.5 style
  auto deepseek = yarn(40.0, 4096);               // DeepSeek-V3 style
  deepseek.mscale = 1.0;
  deepseek.mscale_all_dim = 1.0;
  cases.push_back({64, 10000.0, deepseek});
  auto deepseek_v2_lite = yarn(40.0, 4096);
  deepseek_v2_lite.mscale = 0.707;
  deepseek_v2_lite.mscale_all_dim = 0.707;
  cases.push_back({64, 10000.0, deepseek_v2_lite});
  auto ratio = yarn(16.0, 4096);
  ratio.mscale = 1.0;
  ratio.mscale_all_dim = 0.5;
  cases.push_back({128, 10000.0, ratio});
  auto untruncated = yarn(32.0, 4096);
  untruncated.beta_fast = 32;
  untruncated.beta_slow = 1;
  untruncated.truncate = false;
  cases.push_back({64, 150000.0, untruncated});
  // A long original length over a small base: ceil(corr(beta_slow)) = 84
  // is clamped to r - 1 = 63.
  cases.push_back({64, 100.0, yarn(16.0, 1000000)});
  ASSERT_EQ(closed_form::yarn(64, 100.0L, yarn(16.0, 1000000)).hi, 63.0L);
  auto given = yarn(8.0, 8192);
  given.attention_factor = 0.9;
  cases.push_back({128, 500000.0, given});
  for (const auto& c : cases) {
    const auto f = rope::frequencies(c.r, c.base, c.y);
    const auto want = closed_form::yarn(c.r, c.base, c.y);
    expect_matches(f.inv_freq, want.inv, 4, "yarn");
    EXPECT_NEAR(f.attention_factor, static_cast<double>(want.attention), 1e-15)
        << "factor " << c.y.factor << " mscale " << c.y.mscale << "/" << c.y.mscale_all_dim;
  }
}

TEST(Scaling, YarnAttentionFactorFollowsG) {
  // g(s, 1) = 0.1 ln s + 1 when mscale_all_dim is 0 (mscale is then unused).
  auto y = yarn(4.0, 32768);
  y.mscale = 3.0;
  EXPECT_NEAR(rope::frequencies(128, 1e6, y).attention_factor, 0.1 * std::log(4.0) + 1, 1e-15);
  // Equal mscale and mscale_all_dim cancel.
  y.mscale = 0.8;
  y.mscale_all_dim = 0.8;
  EXPECT_NEAR(rope::frequencies(128, 1e6, y).attention_factor, 1.0, 1e-15);
  // mscale_all_dim alone (mscale 0, as rope::hf reads an absent key) is
  // not a ratio: the reference's `if mscale and mscale_all_dim` fails.
  y.mscale = 0.0;
  y.mscale_all_dim = 1.0;
  EXPECT_NEAR(rope::frequencies(128, 1e6, y).attention_factor, 0.1 * std::log(4.0) + 1, 1e-15);
  y.mscale = 0.8;
  y.mscale_all_dim = 0.8;
  // An explicit attention_factor wins.
  y.attention_factor = 1.5;
  EXPECT_EQ(rope::frequencies(128, 1e6, y).attention_factor, 1.5);
}

TEST(Scaling, YarnTruncateFalseKeepsTheFractionalRamp) {
  auto t = yarn(32.0, 4096);
  auto u = t;
  u.truncate = false;
  const auto ft = rope::frequencies(64, 150000.0, t);
  const auto fu = rope::frequencies(64, 150000.0, u);
  const auto wt = closed_form::yarn(64, 150000.0L, t);
  const auto wu = closed_form::yarn(64, 150000.0L, u);
  // The chosen config has fractional correction dims, so the two differ.
  ASSERT_NE(wu.lo, std::floor(wu.lo));
  ASSERT_NE(wu.hi, std::ceil(wu.hi));
  EXPECT_NE(ft.inv_freq, fu.inv_freq);
  expect_matches(ft.inv_freq, wt.inv, 4, "truncated");
  expect_matches(fu.inv_freq, wu.inv, 4, "untruncated");
}

TEST(Scaling, YarnWithLoEqualHiStepsFromOriginalToInterpolated) {
  // beta_fast == beta_slow without truncation: lo == hi, so hi = lo + 0.001
  // and the ramp is a step between two consecutive pairs.
  auto y = yarn(8.0, 8192);
  y.beta_fast = y.beta_slow = 4.0;
  y.truncate = false;
  const auto want = closed_form::yarn(128, 10000.0L, y);
  ASSERT_NEAR(static_cast<double>(want.hi - want.lo), 0.001, 1e-12);
  const auto f = rope::frequencies(128, 10000.0, y);
  expect_matches(f.inv_freq, want.inv, 4, "lo==hi");
  const auto plain = rope::frequencies(128, 10000.0);
  std::size_t kept = 0, divided = 0;
  for (std::size_t p = 0; p < 64; ++p) {
    const double ratio = plain.inv_freq[p] / f.inv_freq[p];
    if (p <= want.lo) {
      EXPECT_NEAR(ratio, 1.0, 1e-15) << p;
      ++kept;
    } else if (p >= want.hi) {
      EXPECT_NEAR(ratio, 8.0, 1e-14) << p;
      ++divided;
    }
  }
  EXPECT_GT(kept, 0u);
  EXPECT_GT(divided, 0u);

  // Correction dims in (-1, 0): floor gives -1, clamped to 0, and ceil gives
  // 0, so lo == hi == 0 after truncation and clamping (L0/(2 pi n) = 0.95).
  auto z = yarn(8.0, 64);
  z.beta_fast = z.beta_slow = 10.72;
  const auto wz = closed_form::yarn(128, 10000.0L, z);
  ASSERT_EQ(wz.lo, 0.0L);
  ASSERT_NEAR(static_cast<double>(wz.hi), 0.001, 1e-15);
  expect_matches(rope::frequencies(128, 10000.0, z).inv_freq, wz.inv, 4, "clamped lo==hi");
}

TEST(Scaling, YarnWithFactorAtOrBelowOneHasNoAttentionScaling) {
  for (double factor : {1.0, 0.5}) {
    auto y = yarn(factor, 4096);
    y.mscale = 0.7;
    y.mscale_all_dim = 0.3;
    const auto f = rope::frequencies(64, 10000.0, y);
    EXPECT_EQ(f.attention_factor, 1.0);
    expect_matches(f.inv_freq, closed_form::yarn(64, 10000.0L, y).inv, 4, "factor<=1");
  }
  // factor 1 leaves the schedule unchanged.
  expect_matches(rope::frequencies(64, 10000.0, yarn(1.0, 4096)).inv_freq, closed_form::plain_all(64, 10000.0L), 2,
                 "factor 1");
}

TEST(Scaling, Llama3MatchesTheClosedFormInAllThreeBands) {
  const scaling::Llama3 defaults;  // Llama 3.1: 8, 1, 4, 8192
  EXPECT_EQ(defaults.factor, 8.0);
  EXPECT_EQ(defaults.low_freq_factor, 1.0);
  EXPECT_EQ(defaults.high_freq_factor, 4.0);
  EXPECT_EQ(defaults.original_max_positions, 8192u);
  for (const auto& s : {defaults, scaling::Llama3{32.0, 1.0, 4.0, 8192}, scaling::Llama3{4.0, 2.0, 8.0, 4096}}) {
    std::vector<closed_form::Band> bands;
    const auto want = closed_form::llama3(128, 500000.0L, s, &bands);
    const auto f = rope::frequencies(128, 500000.0, s);
    expect_matches(f.inv_freq, want, 4, "llama3");
    EXPECT_EQ(f.attention_factor, 1.0);
    for (auto b : {closed_form::Band::high, closed_form::Band::medium, closed_form::Band::low}) {
      EXPECT_NE(std::find(bands.begin(), bands.end(), b), bands.end()) << "a band is empty";
    }
    // High-frequency pairs are untouched bit for bit.
    const auto plain = rope::frequencies(128, 500000.0);
    for (std::size_t p = 0; p < 64; ++p) {
      if (bands[p] == closed_form::Band::high) {
        EXPECT_EQ(f.inv_freq[p], plain.inv_freq[p]);
      }
    }
  }
}

TEST(Scaling, LongRopeSwitchesFromShortToLongAboveTheOriginalLength) {
  std::vector<double> short_factor(48), long_factor(48);
  for (std::size_t p = 0; p < 48; ++p) {
    short_factor[p] = 1.0 + 0.01 * p;
    long_factor[p] = 1.0 + 0.5 * p;
  }
  const scaling::LongRope s{short_factor, long_factor, 4096, 131072};
  for (std::size_t seq_len : {0u, 100u, 4096u}) {
    const auto f = rope::frequencies(96, 10000.0, s, seq_len);
    expect_matches(f.inv_freq, closed_form::longrope(96, 10000.0L, short_factor), 4, "short");
  }
  for (std::size_t seq_len : {4097u, 131072u}) {
    const auto f = rope::frequencies(96, 10000.0, s, seq_len);
    expect_matches(f.inv_freq, closed_form::longrope(96, 10000.0L, long_factor), 4, "long");
  }
  // sqrt(1 + ln(131072/4096)/ln(4096)) = sqrt(1 + 5/12).
  EXPECT_NEAR(rope::frequencies(96, 10000.0, s).attention_factor, std::sqrt(17.0L / 12.0L), 1e-15);
}

TEST(Scaling, Llama3WithoutABlendBandIsAStepAtTheLowFrequencyWavelength) {
  // high_freq_factor <= low_freq_factor leaves no band to blend over: the
  // reference's masks give theta/factor above L0/low_freq_factor and theta
  // below (it only warns about such configs).
  for (const auto& s : {scaling::Llama3{16.0, 1.0, 1.0, 8192}, scaling::Llama3{8.0, 4.0, 2.0, 8192}}) {
    const auto f = rope::frequencies(128, 500000.0, s);
    const long double l0 = 8192.0L;
    std::size_t divided = 0;
    for (std::size_t p = 0; p < 64; ++p) {
      const long double inv = closed_form::plain(128, 500000.0L, p);
      const bool low_frequency = 2 * closed_form::kPi / inv > l0 / s.low_freq_factor;
      divided += low_frequency ? 1 : 0;
      const long double want = low_frequency ? inv / s.factor : inv;
      EXPECT_NEAR(f.inv_freq[p], static_cast<double>(want), 4 * std::numeric_limits<double>::epsilon() * want)
          << "pair " << p;
    }
    EXPECT_GT(divided, 0u);
    EXPECT_LT(divided, 64u);
  }
}

TEST(Scaling, LongRopeTakesAGivenFactorOrAttentionFactor) {
  const std::vector<double> ones(32, 1.0);
  // A given factor replaces max_positions / L0 (which is then not read).
  scaling::LongRope s{ones, ones, 4096, 0};
  s.factor = 8.0;
  const long double want = std::sqrt(1.0L + std::log(8.0L) / std::log(4096.0L));
  EXPECT_NEAR(rope::frequencies(64, 10000.0, s).attention_factor, static_cast<double>(want), 1e-15);
  s.factor = 1.0;
  EXPECT_EQ(rope::frequencies(64, 10000.0, s).attention_factor, 1.0);
  // A given attention factor wins over both.
  s.attention_factor = 1.25;
  EXPECT_EQ(rope::frequencies(64, 10000.0, s).attention_factor, 1.25);
  scaling::LongRope t{ones, ones, 4096, 131072};
  t.attention_factor = 0.75;
  EXPECT_EQ(rope::frequencies(64, 10000.0, t).attention_factor, 0.75);
}

TEST(Scaling, ProportionalRotatesTheFirstPairsOfTheFullHeadSchedule) {
  // Gemma 4's global layers: 512 channels, a quarter of them rotate: pairs
  // 0..63 keep base^(-2p/512) (the exponent of the whole head), pairs
  // 64..255 do not turn.
  const auto f = rope::frequencies(512, 1e6, scaling::Proportional{0.25, 1.0});
  ASSERT_EQ(f.inv_freq.size(), 256u);
  EXPECT_EQ(f.attention_factor, 1.0);
  for (std::size_t p = 0; p < 256; ++p) {
    const long double want = p < 64 ? closed_form::plain(512, 1e6L, p) : 0.0L;
    EXPECT_NEAR(f.inv_freq[p], static_cast<double>(want), 4 * std::numeric_limits<double>::epsilon() * want)
        << "pair " << p;
  }
  // The factor divides the pairs that turn; 1.0 rotates every pair.
  const auto g = rope::frequencies(64, 10000.0, scaling::Proportional{1.0, 4.0});
  expect_matches(
      g.inv_freq,
      [] {
        auto v = closed_form::plain_all(64, 10000.0L);
        for (auto& x : v) x /= 4;
        return v;
      }(),
      2, "factor");
  // floor(prf * r / 2) with prf * r rounded to double, as the reference's
  // int(prf * head_dim // 2): the double 0.6 is just below 3/5, yet 0.6 * 10
  // rounds to exactly 6.0, so 3 pairs turn (a wider product would give 2);
  // 0.3 * 10 = 3.0000000000000004 gives 1; 0 rotates nothing.
  auto turning = [](double prf, std::size_t r) {
    const auto v = rope::frequencies(r, 10000.0, scaling::Proportional{prf, 1.0}).inv_freq;
    return static_cast<std::size_t>(std::count_if(v.begin(), v.end(), [](double x) { return x > 0; }));
  };
  EXPECT_EQ(turning(0.6, 10), 3u);
  EXPECT_EQ(turning(0.3, 10), 1u);
  EXPECT_EQ(turning(0.0, 64), 0u);
  EXPECT_EQ(turning(1.0, 64), 32u);
}

TEST(Scaling, LongRopeAttentionFactorIsOneWithoutExtension) {
  const std::vector<double> ones(32, 1.0);
  for (std::size_t max_positions : {1000u, 4096u}) {
    const auto f = rope::frequencies(64, 10000.0, scaling::LongRope{ones, ones, 4096, max_positions});
    EXPECT_EQ(f.attention_factor, 1.0);
    expect_matches(f.inv_freq, closed_form::plain_all(64, 10000.0L), 2, "unit factors");
  }
  const auto f = rope::frequencies(64, 10000.0, scaling::LongRope{ones, ones, 2048, 32768});
  const long double want = std::sqrt(1.0L + std::log(16.0L) / std::log(2048.0L));
  EXPECT_NEAR(f.attention_factor, static_cast<double>(want), 1e-15);
}

TEST(Scaling, CustomIsTakenAsGiven) {
  const std::vector<double> inv{1.0, 0.25, 1e-3, 0.0};
  const auto f = rope::frequencies(8, 10000.0, scaling::Custom{inv, 1.125});
  EXPECT_EQ(f.inv_freq, inv);
  EXPECT_EQ(f.attention_factor, 1.125);
  EXPECT_EQ(rope::frequencies(8, 10000.0, scaling::Custom{inv}).attention_factor, 1.0);
}

// The message names the field and shows the value after "got ".
void expect_rejects(const Scaling& s, const std::string& field, const std::string& value, std::size_t rotary_dim = 64,
                    std::size_t seq_len = 0) {
  const auto msg = rope_test::thrown_message([&] { rope::frequencies(rotary_dim, 10000.0, s, seq_len); });
  EXPECT_NE(msg.find(field), std::string::npos) << "field " << field << ": " << msg;
  EXPECT_NE(msg.find("got " + value), std::string::npos) << "value " << value << ": " << msg;
}

TEST(Scaling, RejectsEachInvalidFieldNamingItAndItsValue) {
  const double nan = std::nan("");
  expect_rejects(scaling::Linear{0.0}, "Linear::factor", "0");
  expect_rejects(scaling::Linear{-1.5}, "Linear::factor", "-1.5");
  expect_rejects(scaling::Linear{nan}, "Linear::factor", "nan");
  expect_rejects(scaling::Ntk{-2.25}, "Ntk::factor", "-2.25");
  expect_rejects(scaling::Ntk{2.0}, "rotary_dim", "2", 2);
  expect_rejects(scaling::DynamicNtk{-3.5, 4096}, "DynamicNtk::factor", "-3.5");
  expect_rejects(scaling::DynamicNtk{2.0, 0}, "DynamicNtk::original_max_positions", "0");
  expect_rejects(scaling::DynamicNtk{2.0, 4096}, "rotary_dim", "2", 2, 8192);

  expect_rejects(yarn(-0.5, 4096), "Yarn::factor", "-0.5");
  expect_rejects(yarn(4.0, 0), "Yarn::original_max_positions", "0");
  auto y = yarn(4.0, 4096);
  y.beta_fast = -32;
  expect_rejects(y, "Yarn::beta_fast", "-32");
  y = yarn(4.0, 4096);
  y.beta_slow = 0.0;
  expect_rejects(y, "Yarn::beta_slow", "0");
  y = yarn(4.0, 4096);
  y.mscale = nan;
  expect_rejects(y, "Yarn::mscale", "nan");
  y = yarn(4.0, 4096);
  y.mscale_all_dim = double(INFINITY);
  expect_rejects(y, "Yarn::mscale_all_dim", "inf");
  y = yarn(4.0, 4096);
  y.attention_factor = -1.25;
  expect_rejects(y, "Yarn::attention_factor", "-1.25");

  expect_rejects(scaling::Llama3{-8.0, 1.0, 4.0, 8192}, "Llama3::factor", "-8");
  expect_rejects(scaling::Llama3{8.0, -1.0, 4.0, 8192}, "Llama3::low_freq_factor", "-1");
  expect_rejects(scaling::Llama3{8.0, 1.0, 0.0, 8192}, "Llama3::high_freq_factor", "0");
  expect_rejects(scaling::Llama3{8.0, 1.0, 4.0, 0}, "Llama3::original_max_positions", "0");

  const std::vector<double> ok(32, 1.0), short_vec(31, 1.0);
  auto bad = ok;
  bad[7] = -0.75;
  expect_rejects(scaling::LongRope{short_vec, ok, 4096, 131072}, "LongRope::short_factor.size()", "31");
  expect_rejects(scaling::LongRope{ok, short_vec, 4096, 131072}, "LongRope::long_factor.size()", "31");
  expect_rejects(scaling::LongRope{bad, ok, 4096, 131072}, "LongRope::short_factor[7]", "-0.75");
  expect_rejects(scaling::LongRope{ok, bad, 4096, 131072}, "LongRope::long_factor[7]", "-0.75");
  expect_rejects(scaling::LongRope{ok, ok, 0, 131072}, "LongRope::original_max_positions", "0");
  expect_rejects(scaling::LongRope{ok, ok, 4096, 0}, "LongRope::max_positions", "0");

  expect_rejects(scaling::Custom{short_vec, 1.0}, "Custom::inv_freq.size()", "31");
  expect_rejects(scaling::Custom{bad, 1.0}, "Custom::inv_freq[7]", "-0.75");
  expect_rejects(scaling::Custom{ok, 0.0}, "Custom::attention_factor", "0");
  expect_rejects(scaling::Custom{ok, nan}, "Custom::attention_factor", "nan");
}

TEST(Scaling, RotaryDimAndBaseAreCheckedWhateverTheVariant) {
  EXPECT_THROW(rope::frequencies(63, 10000.0, scaling::Linear{2.0}), std::invalid_argument);
  EXPECT_THROW(rope::frequencies(0, 10000.0, yarn(4.0, 4096)), std::invalid_argument);
  const auto msg = rope_test::thrown_message([] { rope::frequencies(64, 0.5, scaling::Llama3{}); });
  EXPECT_NE(msg.find("base"), std::string::npos) << msg;
  EXPECT_NE(msg.find("got 0.5"), std::string::npos) << msg;
}

}  // namespace

// ---- Bad input: every refusal names its argument and writes nothing (docs/errors.md).
namespace {
namespace frequency_errors {
namespace scaling = rope::scaling;
[[maybe_unused]] constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
[[maybe_unused]] constexpr double kInf = std::numeric_limits<double>::infinity();
using rope_test::expect_names;
using rope_test::message_of;

void expect_rejected(const rope::Scaling& scaling, const std::string& argument, const std::string& value,
                     std::size_t rotary_dim = 64, std::size_t seq_len = 0) {
  SCOPED_TRACE(argument + " = " + value);
  const auto msg = message_of<std::invalid_argument>([&] { rope::frequencies(rotary_dim, 10000.0, scaling, seq_len); });
  expect_names(msg, argument, value);
}

TEST(FrequenciesErrors, FrequenciesRotaryDimAndBase) {
  for (std::size_t r :
       {std::size_t{0}, std::size_t{1}, std::size_t{3}, std::size_t{127}, std::numeric_limits<std::size_t>::max()}) {
    const auto msg = message_of<std::invalid_argument>([&] { rope::frequencies(r); });
    expect_names(msg, "rotary_dim", std::to_string(r));
  }
  const std::pair<double, const char*> bases[] = {{1.0, "1"},    {0.5, "0.5"},  {0.0, "0"},     {-10.0, "-10"},
                                                  {kNaN, "nan"}, {kInf, "inf"}, {-kInf, "-inf"}};
  for (const auto& bad : bases) {
    const double base = bad.first;  // a named copy: lambdas cannot capture a structured binding in C++17
    const auto msg = message_of<std::invalid_argument>([&] { rope::frequencies(64, base); });
    expect_names(msg, "base", bad.second);
  }
}

// A factor of every variant: zero (the default of a forgotten field),
// negative, NaN and infinite are rejected by name.
TEST(FrequenciesErrors, ScalingFactors) {
  const std::pair<double, const char*> bad[] = {{0.0, "0"}, {-2.0, "-2"}, {kNaN, "nan"}, {kInf, "inf"}};
  for (const auto& [v, text] : bad) {
    expect_rejected(scaling::Linear{v}, "scaling::Linear::factor", text);
    expect_rejected(scaling::Ntk{v}, "scaling::Ntk::factor", text);
    expect_rejected(scaling::DynamicNtk{v, 4096}, "scaling::DynamicNtk::factor", text, 64, 8192);
    scaling::Yarn yarn;
    yarn.factor = v;
    yarn.original_max_positions = 4096;
    expect_rejected(yarn, "scaling::Yarn::factor", text);
    scaling::Llama3 llama;
    llama.factor = v;
    expect_rejected(llama, "scaling::Llama3::factor", text);
  }
  // Fields left at their defaults of 0.
  expect_rejected(scaling::Linear{}, "scaling::Linear::factor", "0");
  expect_rejected(scaling::Ntk{}, "scaling::Ntk::factor", "0");
  expect_rejected(scaling::Yarn{}, "scaling::Yarn::factor", "0");
}

TEST(FrequenciesErrors, ScalingLengthsAndShapes) {
  expect_rejected(scaling::DynamicNtk{2.0, 0}, "scaling::DynamicNtk::original_max_positions", "0");
  // NTK's exponent r/(r-2) needs rotary_dim > 2.
  expect_rejected(scaling::Ntk{2.0}, "rotary_dim", "2", 2);
  expect_rejected(scaling::DynamicNtk{2.0, 16}, "rotary_dim", "2", 2, 32);

  scaling::Yarn yarn;
  yarn.factor = 4.0;
  expect_rejected(yarn, "scaling::Yarn::original_max_positions", "0");
  yarn.original_max_positions = 4096;
  for (auto [field, member] : {std::pair{"scaling::Yarn::beta_fast", &scaling::Yarn::beta_fast},
                               std::pair{"scaling::Yarn::beta_slow", &scaling::Yarn::beta_slow}}) {
    auto y = yarn;
    y.*member = 0.0;
    expect_rejected(y, field, "0");
    y.*member = kNaN;
    expect_rejected(y, field, "nan");
  }
  {
    auto y = yarn;
    y.mscale = kNaN;
    expect_rejected(y, "scaling::Yarn::mscale", "nan");
    y = yarn;
    y.mscale_all_dim = kInf;
    expect_rejected(y, "scaling::Yarn::mscale_all_dim", "inf");
    y = yarn;
    y.attention_factor = -1.0;
    expect_rejected(y, "scaling::Yarn::attention_factor", "-1");
  }

  scaling::Llama3 llama;
  llama.low_freq_factor = 0.0;
  expect_rejected(llama, "scaling::Llama3::low_freq_factor", "0");
  llama = scaling::Llama3{};
  llama.high_freq_factor = kNaN;
  expect_rejected(llama, "scaling::Llama3::high_freq_factor", "nan");
  llama = scaling::Llama3{};
  llama.original_max_positions = 0;
  expect_rejected(llama, "scaling::Llama3::original_max_positions", "0");

  scaling::LongRope lr;
  lr.short_factor.assign(32, 1.0);
  lr.long_factor.assign(32, 2.0);
  lr.original_max_positions = 4096;
  lr.max_positions = 131072;
  ASSERT_NO_THROW(rope::frequencies(64, 10000.0, lr, 8192));
  {
    auto b = lr;
    b.short_factor.resize(31);
    expect_rejected(b, "scaling::LongRope::short_factor.size()", "31");
    b = lr;
    b.long_factor.resize(33, 1.0);
    expect_rejected(b, "scaling::LongRope::long_factor.size()", "33");
    b = lr;
    b.long_factor[7] = 0.0;
    expect_rejected(b, "scaling::LongRope::long_factor[7]", "0");
    b = lr;
    b.short_factor[31] = kNaN;
    expect_rejected(b, "scaling::LongRope::short_factor[31]", "nan");
    b = lr;
    b.original_max_positions = 1;
    expect_rejected(b, "scaling::LongRope::original_max_positions", "1");
    b = lr;
    b.max_positions = 0;
    expect_rejected(b, "scaling::LongRope::max_positions", "0");
    b = lr;
    b.factor = 0.0;
    expect_rejected(b, "scaling::LongRope::factor", "0");
    b = lr;
    b.attention_factor = -2.0;
    expect_rejected(b, "scaling::LongRope::attention_factor", "-2");
  }

  for (const double prf : {-0.25, 1.5, kNaN}) {
    expect_rejected(scaling::Proportional{prf, 1.0}, "scaling::Proportional::partial_rotary_factor",
                    rope::detail::to_text(prf));
  }
  expect_rejected(scaling::Proportional{0.25, 0.0}, "scaling::Proportional::factor", "0");
  expect_rejected(scaling::Proportional{0.25, kInf}, "scaling::Proportional::factor", "inf");

  scaling::Custom custom;
  custom.inv_freq.assign(32, 0.5);
  ASSERT_NO_THROW(rope::frequencies(64, 10000.0, custom));
  {
    auto b = custom;
    b.inv_freq.resize(5);
    expect_rejected(b, "scaling::Custom::inv_freq.size()", "5");
    b = custom;
    b.inv_freq[3] = -1.0;
    expect_rejected(b, "scaling::Custom::inv_freq[3]", "-1");
    b = custom;
    b.inv_freq[0] = kInf;
    expect_rejected(b, "scaling::Custom::inv_freq[0]", "inf");
    b = custom;
    b.attention_factor = 0.0;
    expect_rejected(b, "scaling::Custom::attention_factor", "0");
  }
}

// rotary_dim and base are checked before any variant's fields.
TEST(FrequenciesErrors, RotaryDimAndBaseAreCheckedFirst) {
  const auto msg = message_of<std::invalid_argument>([] { rope::frequencies(7, 10000.0, scaling::Linear{}); });
  expect_names(msg, "rotary_dim", "7");
  const auto msg2 = message_of<std::invalid_argument>([] { rope::frequencies(8, 0.5, scaling::Linear{}); });
  expect_names(msg2, "base", "0.5");
}

// A scaling whose fields are each valid but whose result overflows is refused.
TEST(FrequenciesErrors, ScalingThatOverflowsInvFreqIsRefused) {
  try {
    rope::frequencies(4, 10000.0, rope::scaling::Linear{1e-310});
    FAIL() << "no exception";
  } catch (const rope::invalid_argument& e) {
    EXPECT_EQ(e.function(), "rope::frequencies");
    EXPECT_NE(std::string(e.what()).find("inv_freq[0] = inf"), std::string::npos) << e.what();
  }
}

}  // namespace frequency_errors
}  // namespace
