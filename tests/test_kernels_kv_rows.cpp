// The KV-cache rows (kernels/kv_rows.hpp) the kernels of the decode loop
// build on, on each architecture of the build whose code differs
// (rope_test::DistinctArchs), each suite named by it, against the header's
// definitions, long double and their scalar twins:
//   permute_row / unpermute_row: the plane order of the header, and inverses;
//   KvPlanes: every 16-bit pattern and every int8 widened as widen_value
//     widens it, bit for bit (a NaN a NaN);
//   fold_sums<N>: exact on integers, within (lanes - 1) eps sum |x|
//     otherwise, each sum with the bits of fold_sums<1> of its batch alone;
//   multiply_row: each product rounded once (the exact product, rounded to float), y apart or x;
//   max_row exact, softmax_weights_row (in place) and softcap_row within a few ulps of long double.
// The kernels over cached rows have units of their own, so that no unit
// instantiates every kernel for every element type and architecture at once
// (tests/kv_rows_support.hpp): test_kernels_kv_dot.cpp (dot_kv),
// test_kernels_kv_weighted.cpp (weighted_kv), test_kernels_kv_store.cpp
// (store_kv_row), and per element type test_kernels_kv_dot_keys_<type>.cpp
// (dot_kv_keys) and test_kernels_kv_attend_<type>.cpp (attend_keys).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include <rope/detail/simd.hpp>
#include <rope/half.hpp>
#include <rope/kernels/kv_rows.hpp>
#include <rope/reference.hpp>

#include "archs.hpp"
#include "kv_elements.hpp"
#include "kv_rows_support.hpp"
#include "support.hpp"

namespace {

using LD = long double;

template <class Arch>
class KvRows : public ::testing::Test {};
TYPED_TEST_SUITE(KvRows, rope_test::DistinctArchs, rope_test::ArchNames);

using rope_test::element_name;
using rope_test::for_each_element;
using rope_test::kv_dims;

// Where channel c of a row of d channels lands in plane order, from the
// header's definition: base + P*i + k -> base + k*lanes + i below d - d % W;
// c itself where the planes are in channel order.
std::size_t plane_index(std::size_t c, std::size_t d, std::size_t P, std::size_t lanes, bool in_order) {
  const std::size_t W = P * lanes, full = in_order ? 0 : d - d % W;
  if (c >= full) return c;
  const std::size_t base = c - c % W, i = (c % W) / P, k = (c % W) % P;
  return base + k * lanes + i;
}

template <class E, class Arch>
void check_permute() {
  constexpr std::size_t lanes = xsimd::batch<float, Arch>::size;
  constexpr std::size_t P = rope::KvElement<E>::kPerLane;
  for (std::size_t d : kv_dims()) {
    const auto x = rope_test::random_vector<float>(d, static_cast<std::uint32_t>(d));
    rope_test::Guarded<float> planes(d, 1), back(d, 2);
    rope::permute_row<E, Arch>(x.data(), d, planes.data());
    rope::unpermute_row<E, Arch>(planes.data(), d, back.data());
    ASSERT_TRUE(planes.guards_intact() && back.guards_intact()) << element_name<E>() << " d " << d;
    for (std::size_t c = 0; c < d; ++c) {
      ASSERT_EQ(std::memcmp(&planes.data()[plane_index(c, d, P, lanes, rope::detail::KvPlanes<E, Arch>::kInOrder)],
                            &x[c], sizeof(float)),
                0)
          << Arch::name() << " " << element_name<E>() << " d " << d << " channel " << c;
      ASSERT_EQ(std::memcmp(&back.data()[c], &x[c], sizeof(float)), 0)
          << Arch::name() << " " << element_name<E>() << " d " << d << " channel " << c;
    }
  }
}

TYPED_TEST(KvRows, PermuteIsThePlaneOrderAndUnpermuteItsInverse) {
  for_each_element([](auto e) { check_permute<decltype(e), TypeParam>(); });
}

// The planes of a block, for every bit pattern of the 16-bit types and
// every int8 and fp8 code: value P*i + k in lane i of plane k (value k*lanes + i where
// the planes are in channel order), widened as the scalar
// widen_value widens it, bit for bit; a NaN a NaN (AVX-512 widens binary16
// with vcvtph2ps, which makes a signaling NaN quiet).
template <class E, class Arch>
void check_planes() {
  using F = xsimd::batch<float, Arch>;
  constexpr std::size_t lanes = F::size;
  constexpr std::size_t P = rope::KvElement<E>::kPerLane;
  constexpr std::size_t W = P * lanes;
  const std::size_t patterns = sizeof(E) == 1 ? 256 : sizeof(E) == 2 ? 65536 : 4096;
  std::mt19937 gen(3);
  std::vector<E> all(patterns + W);
  for (std::size_t i = 0; i < all.size(); ++i) {
    if constexpr (sizeof(E) == 4) {
      const std::uint32_t bits = static_cast<std::uint32_t>(gen());
      std::memcpy(&all[i], &bits, sizeof(E));
    } else {
      const auto bits = static_cast<std::uint16_t>(i % patterns);
      std::memcpy(&all[i], &bits, sizeof(E));
    }
  }
  for (std::size_t base = 0; base < patterns; base += W) {
    F planes[P];
    rope::detail::KvPlanes<E, Arch>::load(all.data() + base, planes);
    float got[P][lanes];
    for (std::size_t k = 0; k < P; ++k) planes[k].store_unaligned(got[k]);
    for (std::size_t i = 0; i < lanes; ++i) {
      for (std::size_t k = 0; k < P; ++k) {
        const std::size_t at = base + (rope::detail::KvPlanes<E, Arch>::kInOrder ? k * lanes + i : P * i + k);
        const float want = rope::detail::widen_value(all[at]);
        const float g = got[k][i];
        if (std::isnan(want)) {
          ASSERT_TRUE(std::isnan(g)) << Arch::name() << " " << element_name<E>() << " value " << at;
        } else {
          ASSERT_EQ(std::memcmp(&g, &want, sizeof(float)), 0)
              << Arch::name() << " " << element_name<E>() << " value " << at << ": " << g << " vs " << want;
        }
      }
    }
  }
}

TYPED_TEST(KvRows, PlanesWidenEveryStoredValueAsTheScalarConversion) {
  for_each_element([](auto e) { check_planes<decltype(e), TypeParam>(); });
}

// softmax_weights_row (in place) and softcap_row: the vector lanes and the scalar tail, against
// long double at the same float inputs (s_j - m and s_j / cap rounded as
// the kernels round them).
constexpr double kUlps = 4;

double ulp_of(double x) {
  const float f = static_cast<float>(std::fabs(x));
  return static_cast<double>(std::nextafter(f, std::numeric_limits<float>::infinity()) - f);
}

TYPED_TEST(KvRows, ExpRowWithinUlpsOfLongDouble) {
  using Arch = TypeParam;
  const double eps = std::numeric_limits<float>::epsilon();
  for (std::size_t n = 0; n <= 70; ++n) {
    auto s = rope_test::random_vector<float>(n, static_cast<std::uint32_t>(n + 5), 20.0);
    const float m = rope::max_row(s.data(), n);
    const std::vector<float> in = s;
    const float sum = rope::softmax_weights_row<Arch>(s.data(), s.data(), n, m, false);
    LD total = 0;
    for (std::size_t j = 0; j < n; ++j) {
      const LD want = std::exp(static_cast<LD>(in[j] - m));
      total += want;
      ASSERT_NEAR(s[j], static_cast<double>(want), kUlps * ulp_of(static_cast<double>(want)))
          << Arch::name() << " n " << n << " j " << j << " x " << in[j] - m;
    }
    ASSERT_NEAR(sum, static_cast<double>(total), (static_cast<double>(n) + kUlps) * eps * static_cast<double>(total))
        << Arch::name() << " n " << n;
    if (n > 0) {
      EXPECT_GE(sum, 1.0f) << "the max's own weight is exp(0) = 1";
    }
  }
  // A NaN score makes its weight and the sum NaN, in the lanes and in the tail.
  for (std::size_t n : {std::size_t{3}, std::size_t{16}, std::size_t{37}}) {
    for (std::size_t at : {std::size_t{0}, n - 1}) {
      auto s = rope_test::random_vector<float>(n, 9);
      s[at] = std::numeric_limits<float>::quiet_NaN();
      const float m = rope::max_row(s.data(), n);
      EXPECT_FALSE(std::isnan(m));
      const float sum = rope::softmax_weights_row<Arch>(s.data(), s.data(), n, m, false);
      EXPECT_TRUE(std::isnan(sum)) << Arch::name() << " n " << n << " at " << at;
      EXPECT_TRUE(std::isnan(s[at]));
      for (std::size_t j = 0; j < n; ++j) {
        if (j != at) {
          EXPECT_FALSE(std::isnan(s[j])) << "NaN spread to weight " << j;
        }
      }
    }
  }
}

// fold_sums<N> (detail/simd.hpp), the cross-lane sums of dot_kv's groups
// of rows: lane i of the result is the sum of batch i % N's lanes, with the
// bits of that batch's sum alone (fold_sums<1>). Small integers add exactly
// in any order, so those sums are compared exactly; random floats within
// (lanes - 1) eps sum |x| of long double.
template <std::size_t N, class Arch>
void check_fold_sums() {
  using F = xsimd::batch<float, Arch>;
  constexpr std::size_t L = F::size;
  const double eps = std::numeric_limits<float>::epsilon();
  std::mt19937 gen(5 + N);
  for (int trial = 0; trial < 50; ++trial) {
    const bool integers = trial % 2 == 0;
    std::vector<float> lanes(N * L);
    for (float& x : lanes) {
      x = integers
              ? static_cast<float>(static_cast<int>(gen() % 2001) - 1000)
              : std::ldexp(static_cast<float>(gen() % 100000) / 50000.0f - 1.0f, static_cast<int>(gen() % 20) - 10);
    }
    F v[N];
    for (std::size_t r = 0; r < N; ++r) v[r] = F::load_unaligned(&lanes[r * L]);
    float got[L];
    rope::detail::fold_sums<N, Arch>(v).store_unaligned(got);
    for (std::size_t i = 0; i < L; ++i) {
      const std::size_t r = i % N;
      float alone[L];
      rope::detail::fold_sums<1, Arch>(&v[r]).store_unaligned(alone);
      const std::string where = std::string(Arch::name()) + " N " + std::to_string(N) + " trial " +
                                std::to_string(trial) + " lane " + std::to_string(i);
      ASSERT_EQ(std::memcmp(&got[i], &alone[0], sizeof(float)), 0) << where << ": not the bits of the sum alone";
      LD exact = 0, magnitude = 0;
      for (std::size_t k = 0; k < L; ++k) {
        exact += lanes[r * L + k];
        magnitude += std::fabs(static_cast<LD>(lanes[r * L + k]));
      }
      if (integers) {
        ASSERT_EQ(static_cast<LD>(got[i]), exact) << where;
      } else {
        ASSERT_NEAR(got[i], static_cast<double>(exact),
                    static_cast<double>(L - 1) * eps * static_cast<double>(magnitude))
            << where;
      }
    }
  }
}

TYPED_TEST(KvRows, FoldSumsSumsEachBatchWithTheBitsOfItsSumAlone) {
  using Arch = TypeParam;
  constexpr std::size_t L = xsimd::batch<float, Arch>::size;
  check_fold_sums<1, Arch>();
  check_fold_sums<2, Arch>();
  check_fold_sums<4, Arch>();
  if constexpr (L >= 8) check_fold_sums<8, Arch>();
  if constexpr (L >= 16) check_fold_sums<16, Arch>();
}

// max_row is exact: the largest finite-or-infinite score, NaNs skipped, in
// the lanes and in the tail, wherever the NaNs and the maximum sit.
TYPED_TEST(KvRows, MaxRowIsTheLargestScoreNaNsSkipped) {
  using Arch = TypeParam;
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  std::mt19937 gen(11);
  for (std::size_t n = 0; n <= 70; ++n) {
    for (int trial = 0; trial < 4; ++trial) {
      auto s = rope_test::random_vector<float>(n, static_cast<std::uint32_t>(100 * n + trial), 50.0);
      for (std::size_t j = 0; j < n; ++j) {
        if (gen() % 5 == 0) s[j] = nan;
      }
      if (trial == 3 && n > 0) s[gen() % n] = -inf;
      float want = -inf;
      for (const float x : s) {
        if (!std::isnan(x)) want = std::max(want, x);
      }
      ASSERT_EQ(rope::max_row<Arch>(s.data(), n), want) << Arch::name() << " n " << n << " trial " << trial;
    }
  }
}

// multiply_row: x_j * y_j rounded once, in the lanes and in the tail, with y
// apart from x and with y = x (the product of two floats is exact in long
// double, so rounding it to float is the one correct result).
TYPED_TEST(KvRows, MultiplyRowRoundsEachProductOnce) {
  using Arch = TypeParam;
  for (std::size_t n = 0; n <= 70; ++n) {
    const auto x0 = rope_test::random_vector<float>(n, static_cast<std::uint32_t>(200 + n), 50.0);
    const auto y = rope_test::random_vector<float>(n, static_cast<std::uint32_t>(300 + n), 3.0);
    auto x = x0;
    rope::multiply_row<Arch>(x.data(), y.data(), n);
    auto sq = x0;
    rope::multiply_row<Arch>(sq.data(), sq.data(), n);
    for (std::size_t j = 0; j < n; ++j) {
      ASSERT_EQ(x[j], static_cast<float>(static_cast<long double>(x0[j]) * y[j])) << Arch::name() << " n " << n;
      ASSERT_EQ(sq[j], static_cast<float>(static_cast<long double>(x0[j]) * x0[j])) << Arch::name() << " n " << n;
    }
  }
}

TEST(KvRowsScalar, MaxRowSkipsNaNs) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(rope::max_row(nullptr, 0), -inf);
  const float all_nan[3] = {nan, nan, nan};
  EXPECT_EQ(rope::max_row(all_nan, 3), -inf);
  const float mixed[5] = {nan, -3.0f, 2.5f, nan, 1.0f};
  EXPECT_EQ(rope::max_row(mixed, 5), 2.5f);
  const float with_inf[3] = {1.0f, inf, nan};
  EXPECT_EQ(rope::max_row(with_inf, 3), inf);
  const auto s = rope_test::random_vector<float>(41, 3, 100.0);
  EXPECT_EQ(rope::max_row(s.data(), s.size()), *std::max_element(s.begin(), s.end()));
}

TYPED_TEST(KvRows, SoftcapRowWithinUlpsOfLongDouble) {
  using Arch = TypeParam;
  for (const float cap : {0.5f, 15.0f, 50.0f}) {
    for (std::size_t n = 0; n <= 40; ++n) {
      auto s = rope_test::random_vector<float>(n, static_cast<std::uint32_t>(n + 77), 4.0 * cap);
      const std::vector<float> in = s;
      rope::softcap_row<Arch>(s.data(), n, cap);
      for (std::size_t j = 0; j < n; ++j) {
        const LD want = static_cast<LD>(cap) * std::tanh(static_cast<LD>(in[j] / cap));
        ASSERT_NEAR(s[j], static_cast<double>(want), kUlps * ulp_of(static_cast<double>(want)))
            << Arch::name() << " cap " << cap << " n " << n << " j " << j << " x " << in[j];
        ASSERT_LE(std::fabs(s[j]), cap);
      }
    }
  }
}

}  // namespace
