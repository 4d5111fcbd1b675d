// The SIMD row kernels against the scalar reference evaluated in double, on
// every architecture this build targets and the CPU runs, every even
// rotary_dim up to 256 (so every tail length), both pairings and directions,
// aligned and misaligned, in place and out of place; then the identities of
// the rotation that every correct kernel keeps. The RMSNorm-scaled kernel
// and the 16-bit kernels have units of their own (test_kernels_scaled.cpp,
// test_kernels_bf16.cpp, test_kernels_f16.cpp; tests/kernels_support.hpp).
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
#include "kernels_support.hpp"
#include "support.hpp"

namespace {

using rope::Direction;
using rope::Style;
using rope_test::Guarded;

template <class T>
class Kernels : public ::testing::Test {};
using ElementTypes = ::testing::Types<float, double>;
TYPED_TEST_SUITE(Kernels, ElementTypes, rope_test::ScalarNames);

using rope_test::bitwise_equal;
using rope_test::for_each_style;
using rope_test::kDirections;
using rope_test::kMaxRotaryDim;
using rope_test::tolerance;

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

}  // namespace
