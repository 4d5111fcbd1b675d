// The SIMD row kernels against the scalar reference evaluated in double, on
// every architecture this build targets and the CPU runs, every even
// rotary_dim up to 256 (so every tail length), both pairings and directions,
// aligned and misaligned, in place and out of place; then the identities of
// the rotation that every correct kernel keeps; then the 16-bit kernels
// against the float kernels, bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include <rope/half.hpp>
#include <rope/kernels.hpp>
#include <rope/reference.hpp>

#include "archs.hpp"
#include "support.hpp"

namespace {

using rope::Direction;
using rope::Style;
using rope_test::Guarded;

template <class T>
class Kernels : public ::testing::Test {};
using ElementTypes = ::testing::Types<float, double>;
TYPED_TEST_SUITE(Kernels, ElementTypes, rope_test::ScalarNames);

template <class F>
void for_each_style(F&& f) {
  f(std::integral_constant<Style, Style::rotate_half>{});
  f(std::integral_constant<Style, Style::block_diagonal>{});
}

constexpr Direction kDirections[] = {Direction::forward, Direction::inverse};
constexpr std::size_t kMaxRotaryDim = 256;

// Tolerance of one evaluation of y_a = x_a c - x_b s against the exact value:
// two roundings of products plus one of the sum, each at most half an ulp of
// the magnitude |x_a c| + |x_b s|. 2 * epsilon of that is "a few ulps".
template <class T>
double tolerance(double magnitude) {
  return 2.0 * std::numeric_limits<T>::epsilon() * magnitude + std::numeric_limits<T>::denorm_min();
}

template <class T>
bool bitwise_equal(const T* a, const T* b, std::size_t n) {
  return std::memcmp(a, b, n * sizeof(T)) == 0;
}

TYPED_TEST(Kernels, MatchReferenceOnEveryRotaryDimAlignmentAndPlacement) {
  using T = TypeParam;
  const auto archs = rope_test::for_each_arch<T>([&](auto arch) {
    using Arch = decltype(arch);
    for_each_style([&](auto style_tag) {
      constexpr Style S = decltype(style_tag)::value;
      for (Direction dir : kDirections) {
        for (std::size_t r = 2; r <= kMaxRotaryDim; r += 2) {
          const auto x = rope_test::random_vector<T>(r, static_cast<std::uint32_t>(r));
          const auto cs = rope_test::random_vector<T>(r, static_cast<std::uint32_t>(1000 + r));
          const T* cos = cs.data();
          const T* sin = cs.data() + r / 2;
          std::vector<double> expected, magnitude;
          rope_test::reference_in_double<S>(x.data(), cos, sin, r, dir, expected, magnitude);

          std::vector<T> first;  // the aligned out-of-place result
          for (std::size_t misalign : {0u, 1u, 3u}) {
            for (bool in_place : {false, true}) {
              std::ostringstream where;
              where << Arch::name() << " " << rope::name(S) << " " << rope::name(dir) << " rotary_dim=" << r
                    << " misalign=" << misalign << (in_place ? " in place" : " out of place");
              Guarded<T> in(r, misalign), out(r, (misalign + 1) % 4);
              std::copy(x.begin(), x.end(), in.data());
              T* y = in_place ? in.data() : out.data();
              rope::rotate<S, T, Arch>(in.data(), y, cos, sin, r, dir);

              for (std::size_t i = 0; i < r; ++i) {
                ASSERT_NEAR(double(y[i]), expected[i], tolerance<T>(magnitude[i])) << where.str() << " channel " << i;
              }
              ASSERT_TRUE(in.guards_intact()) << where.str();
              ASSERT_TRUE(out.guards_intact()) << where.str();
              if (!in_place) {
                ASSERT_TRUE(bitwise_equal(in.data(), x.data(), r)) << "input modified: " << where.str();
              }
              // Alignment and placement change no arithmetic: bit-identical.
              if (first.empty()) {
                first.assign(y, y + r);
              } else {
                ASSERT_TRUE(bitwise_equal(y, first.data(), r)) << where.str();
              }
            }
          }
        }
      }
    });
  });
  EXPECT_FALSE(archs.empty()) << "no architecture of this build runs on this CPU";
}

// Both pairings compute each pair from the same two products, so
// block_diagonal on interleaved channels equals rotate_half on split channels
// up to the channel permutation. Not bit for bit: under the default
// -ffp-contract=fast the compiler may choose which product of a - b each
// fused multiply-add absorbs, differently in the two loops; both roundings
// stay within the reference tolerance, so twice it bounds their difference.
TYPED_TEST(Kernels, PairingsAgreeUpToTheChannelPermutation) {
  using T = TypeParam;
  rope_test::for_each_arch<T>([&](auto arch) {
    using Arch = decltype(arch);
    for (Direction dir : kDirections) {
      for (std::size_t r = 2; r <= kMaxRotaryDim; r += 2) {
        const std::size_t half = r / 2;
        const auto split = rope_test::random_vector<T>(r, static_cast<std::uint32_t>(7 * r));
        const auto cs = rope_test::random_vector<T>(r, static_cast<std::uint32_t>(11 * r));
        std::vector<T> interleaved(r);
        for (std::size_t p = 0; p < half; ++p) {
          interleaved[2 * p] = split[p];
          interleaved[2 * p + 1] = split[p + half];
        }
        std::vector<double> expected, magnitude;
        rope_test::reference_in_double<Style::rotate_half>(split.data(), cs.data(), cs.data() + half, r, dir, expected,
                                                           magnitude);
        std::vector<T> y_split(r), y_interleaved(r);
        rope::rotate<Style::rotate_half, T, Arch>(split.data(), y_split.data(), cs.data(), cs.data() + half, r, dir);
        rope::rotate<Style::block_diagonal, T, Arch>(interleaved.data(), y_interleaved.data(), cs.data(),
                                                     cs.data() + half, r, dir);
        for (std::size_t p = 0; p < half; ++p) {
          ASSERT_NEAR(y_interleaved[2 * p], y_split[p], 2 * tolerance<T>(magnitude[p]))
              << Arch::name() << " r=" << r << " p=" << p;
          ASSERT_NEAR(y_interleaved[2 * p + 1], y_split[p + half], 2 * tolerance<T>(magnitude[p]))
              << Arch::name() << " r=" << r << " p=" << p;
        }
      }
    }
  });
}

// rotate_heads equals the reference on every head, for strides that leave
// gaps between heads, in place and out of place, every rotary_dim (so every
// tail) and every architecture; the gaps between heads are never touched, in
// place (the input's) or out of place (the output's, which hold guard values
// the kernel must leave), and out of place the input is not written.
TYPED_TEST(Kernels, RotateHeadsMatchesReferenceOnEveryHead) {
  using T = TypeParam;
  rope_test::for_each_arch<T>([&](auto arch) {
    using Arch = decltype(arch);
    for_each_style([&](auto style_tag) {
      constexpr Style S = decltype(style_tag)::value;
      for (Direction dir : kDirections) {
        for (std::size_t r = 2; r <= kMaxRotaryDim; r += 2) {
          const std::size_t heads = 1 + r % 5;
          const std::size_t x_stride = r + r % 3, y_stride = r + 1 + r % 4;
          const auto cs = rope_test::random_vector<T>(r, static_cast<std::uint32_t>(13 * r));
          const auto x = rope_test::random_vector<T>(heads * x_stride, static_cast<std::uint32_t>(5 * r));
          for (bool in_place : {false, true}) {
            Guarded<T> in(heads * x_stride, 1), out(heads * y_stride, 2);
            std::copy(x.begin(), x.end(), in.data());
            const std::vector<T> out_before(out.data(), out.data() + heads * y_stride);
            const std::ptrdiff_t ys = in_place ? std::ptrdiff_t(x_stride) : std::ptrdiff_t(y_stride);
            T* y = in_place ? in.data() : out.data();
            rope::rotate_heads<S, T, Arch>(in.data(), std::ptrdiff_t(x_stride), y, ys, heads, cs.data(),
                                           cs.data() + r / 2, r, dir);
            // Out of place, the input is only read, and the output's
            // channels between rows (past rotary_dim) keep what they held.
            if (!in_place) {
              ASSERT_TRUE(bitwise_equal(in.data(), x.data(), heads * x_stride))
                  << "input modified: " << Arch::name() << " " << rope::name(S) << " r=" << r;
              for (std::size_t h = 0; h < heads; ++h) {
                for (std::size_t i = r; i < y_stride; ++i) {
                  ASSERT_TRUE(bitwise_equal(&y[h * y_stride + i], &out_before[h * y_stride + i], 1))
                      << "gap written out of place: " << Arch::name() << " " << rope::name(S) << " r=" << r << " head "
                      << h << " channel " << i;
                }
              }
            }
            for (std::size_t h = 0; h < heads; ++h) {
              std::vector<double> expected, magnitude;
              rope_test::reference_in_double<S>(x.data() + h * x_stride, cs.data(), cs.data() + r / 2, r, dir, expected,
                                                magnitude);
              for (std::size_t i = 0; i < r; ++i) {
                ASSERT_NEAR(double(y[h * ys + i]), expected[i], tolerance<T>(magnitude[i]))
                    << Arch::name() << " " << rope::name(S) << " r=" << r << " head " << h;
              }
              // In place, the channels between rows (past rotary_dim) keep their values.
              for (std::size_t i = r; in_place && i < x_stride; ++i) {
                ASSERT_EQ(y[h * ys + i], x[h * x_stride + i]) << "gap touched, head " << h;
              }
            }
            ASSERT_TRUE(in.guards_intact());
            ASSERT_TRUE(out.guards_intact());
          }
        }
      }
    });
  });
}

// The rotation by angle 0 (cos 1, sin 0) is exactly the identity.
TYPED_TEST(Kernels, PositionZeroIsExactlyTheIdentity) {
  using T = TypeParam;
  for_each_style([&](auto style_tag) {
    constexpr Style S = decltype(style_tag)::value;
    for (std::size_t r = 2; r <= kMaxRotaryDim; r += 2) {
      const auto x = rope_test::random_vector<T>(r, static_cast<std::uint32_t>(r));
      const std::vector<T> cos(r / 2, T(1)), sin(r / 2, T(0));
      std::vector<T> y(r);
      rope::rotate<S>(x.data(), y.data(), cos.data(), sin.data(), r, Direction::forward);
      ASSERT_TRUE(bitwise_equal(x.data(), y.data(), r)) << rope::name(S) << " r=" << r;
    }
  });
}

// ---- Identities, with the default architecture and exact table rows. ----

template <class T>
std::vector<T> rounded(const std::vector<double>& v) {
  return std::vector<T>(v.begin(), v.end());
}

template <Style S, class T>
std::vector<T> rotated(const std::vector<T>& x, const rope::Frequencies& f, double position,
                       Direction dir = Direction::forward) {
  const auto row = rope_test::exact_row(f, position);
  const auto cos = rounded<T>(row.cos), sin = rounded<T>(row.sin);
  std::vector<T> y(x.size());
  rope::rotate<S>(x.data(), y.data(), cos.data(), sin.data(), x.size(), dir);
  return y;
}

template <class T>
double dot(const std::vector<T>& a, const std::vector<T>& b) {
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += double(a[i]) * double(b[i]);
  return s;
}

const double kPositions[] = {0, 1, 2, 17, 511, 4096, 65535, 131072, 999999, 1000000};

TYPED_TEST(Kernels, RotationPreservesTheNorm) {
  using T = TypeParam;
  constexpr double eps = std::numeric_limits<T>::epsilon();
  for_each_style([&](auto style_tag) {
    constexpr Style S = decltype(style_tag)::value;
    for (std::size_t r : {2u, 6u, 64u, 96u, 128u, 250u}) {
      const auto f = rope::frequencies(r);
      const auto x = rope_test::random_vector<T>(r, static_cast<std::uint32_t>(r));
      for (double m : kPositions) {
        const auto y = rotated<S>(x, f, m);
        // Each output is within ~2 eps of exact and cos^2 + sin^2 of the
        // rounded table within ~2 eps of 1: the squared norm moves by < 8 eps.
        EXPECT_NEAR(dot(y, y), dot(x, x), 8 * eps * dot(x, x)) << "r=" << r << " m=" << m;
      }
    }
  });
}

TYPED_TEST(Kernels, InverseUndoesForward) {
  using T = TypeParam;
  constexpr double eps = std::numeric_limits<T>::epsilon();
  for_each_style([&](auto style_tag) {
    constexpr Style S = decltype(style_tag)::value;
    for (std::size_t r : {2u, 10u, 64u, 128u, 254u}) {
      const auto f = rope::frequencies(r);
      const auto x = rope_test::random_vector<T>(r, static_cast<std::uint32_t>(3 * r));
      for (double m : kPositions) {
        const auto back = rotated<S>(rotated<S>(x, f, m), f, m, Direction::inverse);
        for (std::size_t p = 0; p < r / 2; ++p) {
          const std::size_t a = rope::first_channel<S>(p, r), b = rope::second_channel<S>(p, r);
          const double scale = std::fabs(double(x[a])) + std::fabs(double(x[b]));
          EXPECT_NEAR(double(back[a]), double(x[a]), 8 * eps * scale) << "r=" << r << " m=" << m;
          EXPECT_NEAR(double(back[b]), double(x[b]), 8 * eps * scale) << "r=" << r << " m=" << m;
        }
      }
    }
  });
}

// <R_m q, R_n k> = <q, R_(n-m) k>: only the offset reaches the score.
TYPED_TEST(Kernels, ScoresDependOnlyOnTheRelativePosition) {
  using T = TypeParam;
  // Table rows are exact to half an ulp of T, but the angles m*theta,
  // n*theta and (n-m)*theta are each rounded in double: at positions up to
  // 1e6 that is ~1e6 * 2^-53 ~ 1e-10 radians. Float adds ~d ulps of rounding.
  const double tol = std::is_same<T, float>::value ? 2e-5 : 1e-9;
  std::mt19937 gen(2104);
  std::uniform_int_distribution<int> pos(0, 1000000);
  for_each_style([&](auto style_tag) {
    constexpr Style S = decltype(style_tag)::value;
    for (std::size_t r : {2u, 64u, 128u}) {
      const auto f = rope::frequencies(r);
      const auto q = rope_test::random_vector<T>(r, 1);
      const auto k = rope_test::random_vector<T>(r, 2);
      const double scale = std::sqrt(dot(q, q) * dot(k, k));
      for (int trial = 0; trial < 200; ++trial) {
        double m = pos(gen), n = pos(gen);
        if (n < m) std::swap(m, n);
        const double absolute = dot(rotated<S>(q, f, m), rotated<S>(k, f, n));
        const double relative = dot(q, rotated<S>(k, f, n - m));
        ASSERT_NEAR(absolute, relative, tol * scale) << rope::name(S) << " r=" << r << " m=" << m << " n=" << n;
      }
    }
  });
}

// rotate_heads_scaled: bit for bit rotate_heads of a copy whose channel c
// of head h is (x_c * r[h]) * w[c], on every architecture, every rotary_dim
// up to 256 (every tail and every row shorter than a step), both pairings,
// in place and out of place, with gaps between heads that are never
// touched.
TEST(Kernels, RotateHeadsScaledIsTheRotationOfTheScaledCopy) {
  rope_test::for_each_arch<float>([&](auto arch) {
    using Arch = decltype(arch);
    for_each_style([&](auto style_tag) {
      constexpr Style S = decltype(style_tag)::value;
      for (std::size_t r = 2; r <= kMaxRotaryDim; r += 2) {
        const std::size_t heads = 1 + r % 4, stride = r + 1 + r % 3;
        const auto cs = rope_test::random_vector<float>(r, static_cast<std::uint32_t>(3 * r));
        const auto x = rope_test::random_vector<float>(heads * stride, static_cast<std::uint32_t>(11 * r), 4.0);
        const auto w = rope_test::random_vector<float>(r, static_cast<std::uint32_t>(17 * r));
        std::vector<float> scales(heads);
        for (std::size_t h = 0; h < heads; ++h) scales[h] = 0.25f + 0.375f * static_cast<float>(h);
        std::vector<float> copy = x;
        for (std::size_t h = 0; h < heads; ++h) {
          for (std::size_t c = 0; c < r; ++c) copy[h * stride + c] = (x[h * stride + c] * scales[h]) * w[c];
        }
        rope::rotate_heads<S, float, Arch>(copy.data(), std::ptrdiff_t(stride), copy.data(), std::ptrdiff_t(stride),
                                           heads, cs.data(), cs.data() + r / 2, r);
        for (bool in_place : {false, true}) {
          std::vector<float> in = x;
          std::vector<float> out(heads * stride, -7.0f);
          float* y = in_place ? in.data() : out.data();
          const std::vector<float> before(y, y + heads * stride);
          rope::rotate_heads_scaled<S, Arch>(in.data(), std::ptrdiff_t(stride), y, std::ptrdiff_t(stride), heads,
                                             cs.data(), cs.data() + r / 2, r, scales.data(), w.data());
          for (std::size_t at = 0; at < heads * stride; ++at) {
            const float want = at % stride < r ? copy[at] : before[at];
            ASSERT_TRUE(bitwise_equal(&y[at], &want, 1))
                << Arch::name() << " " << rope::name(S) << " r=" << r << (in_place ? " in place" : "") << " at " << at
                << ": " << y[at] << " want " << want;
          }
        }
      }
    });
  });
}

// ---- 16-bit storage (BFloat16, Float16): the in-register kernels. ----

// Every architecture, every rotary_dim up to 256 (so every step count, every
// overlapping last step and every row shorter than a step, odd pair counts
// included), both pairings and directions, in place and out of place, with
// gaps between heads: bit for bit the float kernel of the same architecture
// on the exactly widened values, rounded once by the scalar conversion.
// Both compute each pair with the same two multiply-adds, so they agree
// exactly; the gaps between heads are never touched.
template <class H>
void expect_16_bit_kernels_match_float() {
  rope_test::for_each_arch<float>([&](auto arch) {
    using Arch = decltype(arch);
    for_each_style([&](auto style_tag) {
      constexpr Style S = decltype(style_tag)::value;
      for (Direction dir : kDirections) {
        for (std::size_t r = 2; r <= kMaxRotaryDim; r += 2) {
          const std::size_t heads = 1 + r % 3, stride = r + 2 + r % 5;
          const auto cs = rope_test::random_vector<float>(r, static_cast<std::uint32_t>(7 * r));
          const auto values = rope_test::random_vector<float>(heads * stride, static_cast<std::uint32_t>(r));
          std::vector<H> x(heads * stride);
          std::vector<float> wide(heads * stride);
          for (std::size_t i = 0; i < x.size(); ++i) {
            x[i] = H(values[i]);
            wide[i] = static_cast<float>(x[i]);
          }
          rope::rotate_heads<S, float, Arch>(wide.data(), std::ptrdiff_t(stride), wide.data(), std::ptrdiff_t(stride),
                                             heads, cs.data(), cs.data() + r / 2, r, dir);
          for (bool in_place : {false, true}) {
            std::vector<H> y = in_place ? x : std::vector<H>(x.size(), H(-7.0f));
            const std::vector<H> before = y;
            std::vector<float> work(r + 2);
            rope::detail::rotate_heads_16<S, H, Arch>(x.data(), std::ptrdiff_t(stride), y.data(),
                                                      std::ptrdiff_t(stride), heads, cs.data(), cs.data() + r / 2, r,
                                                      dir, work.data());
            for (std::size_t h = 0; h < heads; ++h) {
              for (std::size_t i = 0; i < stride; ++i) {
                const std::size_t at = h * stride + i;
                const std::uint16_t want = i < r ? H(wide[at]).bits : before[at].bits;
                ASSERT_EQ(y[at].bits, want)
                    << Arch::name() << " " << rope::name(S) << " " << rope::name(dir) << " r=" << r
                    << (in_place ? " in place" : "") << " head " << h << " channel " << i;
              }
            }
          }
        }
      }
    });
  });
}

TEST(Kernels16, BFloat16MatchesTheFloatKernelRoundedOnce) { expect_16_bit_kernels_match_float<rope::BFloat16>(); }
TEST(Kernels16, Float16MatchesTheFloatKernelRoundedOnce) { expect_16_bit_kernels_match_float<rope::Float16>(); }

}  // namespace
