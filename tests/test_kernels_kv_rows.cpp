// The KV-cache rows (kernels/kv_rows.hpp) on each architecture of the build
// whose code differs (rope_test::DistinctArchs), each suite named by it, for every element type a
// cache may hold (float, BFloat16, Float16, int8), against their scalar
// twins (reference.hpp), long double and the documented formulas:
//   permute_row / unpermute_row: the plane order of the header, and inverses;
//   KvPlanes: every 16-bit pattern and every int8 widened as widen_value
//     widens it, bit for bit (a NaN a NaN);
//   dot_kv: within d * eps * sum |q k| of reference::dot_kv and of long double;
//   weighted_kv: bit for bit reference::weighted_kv where the architecture
//     has fused multiply-adds, else within 2 (n + 1) eps sum |w s v| of it
//     (and within (n + 1) eps sum |w s v| of long double everywhere), int8
//     with value scales at a stride;
//   store_kv_row: the 16-bit types round to nearest even (the neighbours of
//     the result are no nearer), as half.hpp does; int8 is within s/2 per
//     element (plus the rounding of x / s), q in [-127, 127], the largest
//     element at +-127, scale 0 for zeros and NaN (q = 0) for non-finite;
//   dot_kv's scale: the sum rounded, then multiplied (bit for bit);
//   dot_kv: each row's score has the same bits alone as in a group of rows;
//   weighted_kv_rows (values anywhere): bit for bit weighted_kv;
//   fold_sums<N>: exact on integers, within (lanes - 1) eps sum |x|
//     otherwise, each sum with the bits of fold_sums<1> of its batch alone;
//   dot_kv_keys (two keys at once): the bits of dot_kv one key at a time;
//   multiply_row: each product rounded once (the exact product, rounded to float), y apart or x;
//   max_row exact, softmax_weights_row (in place) and softcap_row within a few ulps of long double.
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
#include <rope/kernels.hpp>
#include <rope/reference.hpp>

#include "archs.hpp"
#include "kv_elements.hpp"
#include "pool_keys.hpp"
#include "support.hpp"

namespace {

using rope::BFloat16;
using rope::Float16;
using LD = long double;

template <class Arch>
class KvRows : public ::testing::Test {};
TYPED_TEST_SUITE(KvRows, rope_test::DistinctArchs, rope_test::ArchNames);

using rope_test::element_name;
using rope_test::for_each_element;
using rope_test::widen;

// n random stored values: floats in [-1, 1] rounded into E; int8 over its
// whole range, -128 included (widening must be exact there too).
template <class E>
std::vector<E> random_elements(std::size_t n, std::uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<E> v(n);
  if constexpr (std::is_same<E, std::int8_t>::value) {
    std::uniform_int_distribution<int> dist(-128, 127);
    for (auto& x : v) x = static_cast<std::int8_t>(dist(gen));
  } else {
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    for (auto& x : v) {
      if constexpr (std::is_same<E, float>::value) {
        x = dist(gen);
      } else {
        x = E(dist(gen));
      }
    }
  }
  return v;
}

std::vector<std::size_t> dims() {
  std::vector<std::size_t> d;
  for (std::size_t i = 1; i <= 70; ++i) d.push_back(i);
  d.push_back(128);
  d.push_back(130);
  return d;
}

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
  for (std::size_t d : dims()) {
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
// every int8: value P*i + k in lane i of plane k (value k*lanes + i where
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

template <class E, class Arch>
void check_dot() {
  const double eps = std::numeric_limits<float>::epsilon();
  for (std::size_t rows = 1; rows <= 9; ++rows) {
    for (std::size_t d : dims()) {
      const std::size_t q_stride = d + 3, score_stride = 2;
      const std::uint32_t seed = static_cast<std::uint32_t>(1000 * rows + d);
      const auto q = rope_test::random_vector<float>(rows * d, seed);
      const auto key = random_elements<E>(d, seed + 7);
      std::vector<float> q_planes(rows * q_stride, std::numeric_limits<float>::quiet_NaN());
      for (std::size_t r = 0; r < rows; ++r) rope::permute_row<E, Arch>(&q[r * d], d, &q_planes[r * q_stride]);
      rope_test::Guarded<float> scores(rows * score_stride, rows % 2);
      const std::vector<float> before(scores.data(), scores.data() + rows * score_stride);
      rope::dot_kv<E, Arch>(q_planes.data(), q_stride, rows, d, key.data(), scores.data(), score_stride);
      // With a scale: the same sums, each rounded and then multiplied.
      std::vector<float> scaled(rows * score_stride);
      const float scale = 0.3125f + static_cast<float>(rows) / 7.0f;
      rope::dot_kv<E, Arch>(q_planes.data(), q_stride, rows, d, key.data(), scaled.data(), score_stride, scale);
      for (std::size_t r = 0; r < rows; ++r) {
        const float want = scores.data()[r * score_stride] * scale;
        ASSERT_EQ(std::memcmp(&scaled[r * score_stride], &want, sizeof(float)), 0)
            << Arch::name() << " " << element_name<E>() << " rows " << rows << " d " << d << " row " << r;
      }
      // Each row alone: the same bits as in its group of rows.
      for (std::size_t r = 0; r < rows; ++r) {
        float alone = 0;
        rope::dot_kv<E, Arch>(&q_planes[r * q_stride], q_stride, 1, d, key.data(), &alone, 1);
        ASSERT_EQ(std::memcmp(&alone, &scores.data()[r * score_stride], sizeof(float)), 0)
            << Arch::name() << " " << element_name<E>() << " rows " << rows << " d " << d << " row " << r << " alone";
      }
      std::vector<float> twin(rows * score_stride);
      rope::reference::dot_kv(q.data(), rows, d, key.data(), twin.data(), score_stride);
      ASSERT_TRUE(scores.guards_intact());
      for (std::size_t r = 0; r < rows; ++r) {
        ASSERT_EQ(std::memcmp(&scores.data()[r * score_stride + 1], &before[r * score_stride + 1], sizeof(float)), 0)
            << "gap between strided scores written";
        LD exact = 0, magnitude = 0;
        for (std::size_t c = 0; c < d; ++c) {
          const LD term = static_cast<LD>(q[r * d + c]) * static_cast<LD>(widen(key[c]));
          exact += term;
          magnitude += std::fabs(term);
        }
        const double bound = static_cast<double>(d) * eps * static_cast<double>(magnitude);
        const double got = scores.data()[r * score_stride];
        ASSERT_NEAR(got, static_cast<double>(twin[r * score_stride]), bound)
            << Arch::name() << " " << element_name<E>() << " rows " << rows << " d " << d << " row " << r;
        ASSERT_NEAR(got, static_cast<double>(exact), bound)
            << Arch::name() << " " << element_name<E>() << " rows " << rows << " d " << d << " row " << r;
      }
    }
  }
}

TYPED_TEST(KvRows, DotKvWithinRoundingOfItsTwin) {
  for_each_element([](auto e) { check_dot<decltype(e), TypeParam>(); });
}

template <class E, class Arch>
void check_weighted(bool scaled) {
  const double eps = std::numeric_limits<float>::epsilon();
  const std::vector<std::size_t> dvs = {1, 2, 3, 5, 7, 8, 15, 16, 17, 31, 32, 33, 47, 63, 64, 65, 70, 128, 130};
  for (std::size_t rows = 1; rows <= 9; ++rows) {
    for (std::size_t dv : dvs) {
      const std::size_t n = 1 + (dv * 5 + rows) % 13;
      const std::size_t weight_stride = n + 2, value_stride = dv + 5, acc_stride = dv + 3, scale_stride = 3;
      const std::uint32_t seed = static_cast<std::uint32_t>(100 * rows + dv);
      const auto weights = rope_test::random_vector<float>(rows * weight_stride, seed);
      const auto values = random_elements<E>(n * value_stride, seed + 1);
      std::vector<float> scales;
      if (scaled) {
        scales = rope_test::random_vector<float>(n * scale_stride, seed + 2, 0.02);
        for (auto& s : scales) s = std::fabs(s);
      }
      const float* sp = scaled ? scales.data() : nullptr;
      const auto start = rope_test::random_vector<float>(rows * acc_stride, seed + 3);
      // The kernel's accumulators in plane order, the twin's in channel order.
      rope_test::Guarded<float> acc(rows * acc_stride, rows % 3);
      std::copy(start.begin(), start.end(), acc.data());
      for (std::size_t r = 0; r < rows; ++r) {
        rope::permute_row<E, Arch>(&start[r * acc_stride], dv, acc.data() + r * acc_stride);
      }
      std::vector<float> twin = start;
      // weighted_kv_rows over the same values scattered in another buffer,
      // value j at row n - 1 - j, one element on (unscaled only).
      std::vector<float> rows_acc(acc.data(), acc.data() + rows * acc_stride);
      std::vector<E> scattered(n * value_stride + 1);
      std::vector<const E*> value_rows(n);
      for (std::size_t j = 0; j < n; ++j) {
        std::copy_n(values.data() + j * value_stride, dv, scattered.data() + (n - 1 - j) * value_stride + 1);
        value_rows[j] = scattered.data() + (n - 1 - j) * value_stride;
      }
      if (!scaled) {
        rope::weighted_kv_rows<E, Arch>(weights.data(), weight_stride, rows, n, value_rows.data(), 1, dv,
                                        rows_acc.data(), acc_stride);
      }
      rope::weighted_kv<E, Arch>(weights.data(), weight_stride, rows, n, values.data(), value_stride, sp, scale_stride,
                                 dv, acc.data(), acc_stride);
      if (!scaled) {
        ASSERT_EQ(std::memcmp(rows_acc.data(), acc.data(), rows * acc_stride * sizeof(float)), 0)
            << Arch::name() << " " << element_name<E>() << " rows " << rows << " dv " << dv
            << ": weighted_kv_rows differs from weighted_kv";
      }
      rope::reference::weighted_kv(weights.data(), weight_stride, rows, n, values.data(), value_stride, sp,
                                   scale_stride, dv, twin.data(), acc_stride);
      ASSERT_TRUE(acc.guards_intact());
      for (std::size_t r = 0; r < rows; ++r) {
        std::vector<float> got(dv);
        rope::unpermute_row<E, Arch>(acc.data() + r * acc_stride, dv, got.data());
        for (std::size_t c = dv; c < acc_stride; ++c) {
          ASSERT_EQ(std::memcmp(&acc.data()[r * acc_stride + c], &start[r * acc_stride + c], sizeof(float)), 0)
              << "gap between accumulator rows written";
        }
        for (std::size_t c = 0; c < dv; ++c) {
          const float want = twin[r * acc_stride + c];
          LD exact = start[r * acc_stride + c], magnitude = std::fabs(exact);
          for (std::size_t j = 0; j < n; ++j) {
            const float w = weights[r * weight_stride + j];
            const float wj = scaled ? w * scales[j * scale_stride] : w;  // rounded once, as documented
            const LD term = static_cast<LD>(wj) * static_cast<LD>(widen(values[j * value_stride + c]));
            exact += term;
            magnitude += std::fabs(term);
          }
          const double bound = static_cast<double>(n + 1) * eps * static_cast<double>(magnitude);
          const std::string where = std::string(Arch::name()) + " " + element_name<E>() + " rows " +
                                    std::to_string(rows) + " dv " + std::to_string(dv) + " row " + std::to_string(r) +
                                    " channel " + std::to_string(c);
          ASSERT_NEAR(got[c], static_cast<double>(exact), bound) << where;
          if (rope_test::kFusedMultiplyAdd<Arch>) {
            ASSERT_EQ(std::memcmp(&got[c], &want, sizeof(float)), 0)
                << where << ": " << got[c] << " vs reference::weighted_kv " << want;
          } else {
            ASSERT_NEAR(got[c], want, 2 * bound) << where;
          }
        }
      }
    }
  }
}

TYPED_TEST(KvRows, WeightedKvMatchesItsTwin) {
  for_each_element([](auto e) { check_weighted<decltype(e), TypeParam>(false); });
  check_weighted<std::int8_t, TypeParam>(true);
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

// dot_kv_keys, two keys at once, against dot_kv_group on each key alone
// with its own scale: the same bits for every row, each row's two scores
// side by side, and nothing past them written.
template <std::size_t R, class E, class Arch>
void check_dot_kv_keys() {
  constexpr std::size_t d = 128, K = 2, stride = 5;
  if constexpr (R * K <= xsimd::batch<float, Arch>::size) {
    const auto q = rope_test::random_vector<float>(R * d, 61 + R);
    const auto k0 = random_elements<E>(d, 62), k1 = random_elements<E>(d, 63);
    const E* keys[K] = {k0.data(), k1.data()};
    const float scales[K] = {0.125f, -3.0f};
    std::vector<float> got(R * stride, 7.0f), want(R * stride, 7.0f);
    rope::detail::dot_kv_keys<R, K, E, Arch, d>(q.data(), keys, got.data(), stride, scales);
    for (std::size_t k = 0; k < K; ++k) {
      rope::detail::dot_kv_group<R, E, Arch, d>(q.data(), d, d, keys[k], want.data() + k, stride, scales[k]);
    }
    ASSERT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0)
        << Arch::name() << " " << element_name<E>() << " R " << R;
    for (std::size_t r = 0; r < R; ++r) ASSERT_EQ(got[r * stride + K], 7.0f) << "written past row " << r;
  }
}

TYPED_TEST(KvRows, DotKvKeysGivesTheBitsOfOneKeyAtATime) {
  for_each_element([](auto e) {
    using E = decltype(e);
    check_dot_kv_keys<1, E, TypeParam>();
    check_dot_kv_keys<2, E, TypeParam>();
    check_dot_kv_keys<4, E, TypeParam>();
    check_dot_kv_keys<8, E, TypeParam>();
  });
}

// attend_keys' chunks compiled for head_dim 128 with 4 or 8 query heads per
// key/value head against its loops for any shape: the same bytes of (m, l,
// acc), over pages given out of order, a first key inside a page, whole and
// partial chunks, with and without a softcap, int8 with its scales.
template <class E, class Arch>
void check_attend_shapes() {
  constexpr std::size_t d = 128, kv_heads = 2, page = 16, pages = 12, keys = 150;
  const std::vector<std::int32_t> table = {5, 2, 9, 0, 11, 7, 3, 8, 1, 10};
  const auto k = random_elements<E>(pages * page * kv_heads * d, 41);
  const auto v = random_elements<E>(k.size(), 42);
  std::vector<float> k_scales, v_scales;
  if (rope::KvElement<E>::kScaled) {
    k_scales = rope_test::random_vector<float>(pages * page * kv_heads, 43, 0.02);
    v_scales = rope_test::random_vector<float>(pages * page * kv_heads, 44, 0.02);
    for (auto& x : k_scales) x = std::fabs(x);
    for (auto& x : v_scales) x = std::fabs(x);
  }
  for (const std::size_t G : {std::size_t{4}, std::size_t{8}}) {
    if (G > rope::detail::kv_max_rows<E, Arch>()) {
      EXPECT_EQ((rope::detail::attend_shape<E, Arch>(G, d, d)), nullptr) << Arch::name() << " G " << G;
      continue;
    }
    ASSERT_NE((rope::detail::attend_shape<E, Arch>(G, d, d)), nullptr) << Arch::name() << " G " << G;
    const std::size_t H = G * kv_heads;
    const auto q = rope_test::random_vector<float>(H * d, static_cast<std::uint32_t>(45 + G));
    for (const std::size_t chunk : {std::size_t{64}, std::size_t{37}}) {
      for (const float softcap : {0.0f, 5.0f}) {
        rope::KvKeys<E> a = rope_test::pool_keys(k.data(), v.data(), k_scales.empty() ? nullptr : k_scales.data(),
                                                 v_scales.empty() ? nullptr : v_scales.data(), table.data(), page, H,
                                                 kv_heads, d, 3, keys - 3, chunk, 0.125f);
        a.softcap = softcap;
        std::vector<float> got[2];
        for (const bool shaped : {true, false}) {
          std::vector<float> work(rope::attend_work(H, d, d, chunk)), m(H), l(H), acc(H * d);
          rope::detail::attend_keys_as<E, Arch>(a, q.data(), work.data(), m.data(), l.data(), acc.data(), shaped);
          std::vector<float>& out = got[shaped ? 0 : 1];
          out = acc;
          out.insert(out.end(), m.begin(), m.end());
          out.insert(out.end(), l.begin(), l.end());
        }
        ASSERT_EQ(std::memcmp(got[0].data(), got[1].data(), got[0].size() * sizeof(float)), 0)
            << Arch::name() << " " << element_name<E>() << " G " << G << " chunk " << chunk << " softcap " << softcap;
      }
    }
  }
}

TYPED_TEST(KvRows, AttendKeysCompiledShapesGiveTheBitsOfTheLoopsForAnyShape) {
  for_each_element([](auto e) { check_attend_shapes<decltype(e), TypeParam>(); });
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

// store_kv_row into the 16-bit types: what half.hpp's conversions give, and
// that is the nearest value (ties to an even bit pattern), checked against
// the neighbouring bit patterns.
template <class E>
void check_round_16(float x, E got) {
  const std::uint16_t b = got.bits;
  if (std::isnan(x)) {
    EXPECT_TRUE(std::isnan(widen(got))) << x;
    return;
  }
  const LD y = widen(got);
  if (std::isinf(static_cast<double>(y))) {
    // Only values past the largest finite one (and its half ulp) overflow.
    const E largest =
        E::from_bits(static_cast<std::uint16_t>((b & 0x8000u) | (std::is_same<E, Float16>::value ? 0x7bffu : 0x7f7fu)));
    const LD big = widen(largest);
    const LD next_ulp = std::is_same<E, Float16>::value ? 32.0L : std::ldexp(1.0L, 127 - 7);
    EXPECT_GE(std::fabs(static_cast<LD>(x)), std::fabs(big) + next_ulp / 2) << x;
    return;
  }
  const LD err = std::fabs(static_cast<LD>(x) - y);
  for (int step : {-1, 1}) {
    const std::uint16_t mag = b & 0x7fffu;
    if (step < 0 && mag == 0) continue;
    const E other = E::from_bits(static_cast<std::uint16_t>((b & 0x8000u) | (mag + step)));
    const LD o = widen(other);
    if (std::isinf(static_cast<double>(o)) || std::isnan(static_cast<double>(o))) continue;
    const LD other_err = std::fabs(static_cast<LD>(x) - o);
    EXPECT_LE(err, other_err) << "not the nearest: x " << x << " bits " << b;
    if (err == other_err) {
      EXPECT_EQ(b & 1u, 0u) << "a tie not to even: x " << x;
    }
  }
}

TYPED_TEST(KvRows, StoreSixteenBitTypesRoundOnceToNearestEven) {
  using Arch = TypeParam;
  std::mt19937 gen(5);
  std::vector<float> x;
  for (int e = -30; e <= 20; ++e) {
    std::uniform_real_distribution<float> dist(-std::ldexp(1.0f, e), std::ldexp(1.0f, e));
    for (int i = 0; i < 20; ++i) x.push_back(dist(gen));
  }
  const float specials[] = {0.0f,
                            -0.0f,
                            1.0f,
                            65504.0f,
                            65519.0f,
                            65520.0f,
                            -70000.0f,
                            1.00390625f,
                            1.01171875f,
                            std::ldexp(1.0f, -24),
                            std::ldexp(3.0f, -26),
                            std::numeric_limits<float>::denorm_min(),
                            std::numeric_limits<float>::max(),
                            std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN()};
  x.insert(x.end(), std::begin(specials), std::end(specials));
  std::vector<BFloat16> bf(x.size());
  std::vector<Float16> hf(x.size());
  rope::store_kv_row<Arch>(x.data(), x.size(), bf.data(), nullptr);
  rope::store_kv_row<Arch>(x.data(), x.size(), hf.data(), nullptr);
  for (std::size_t i = 0; i < x.size(); ++i) {
    EXPECT_EQ(bf[i].bits, rope::detail::float_to_bfloat16_bits(x[i])) << Arch::name() << " " << x[i];
    EXPECT_EQ(hf[i].bits, rope::detail::float_to_float16_bits(x[i])) << Arch::name() << " " << x[i];
    check_round_16(x[i], bf[i]);
    check_round_16(x[i], hf[i]);
  }
  // Every length and start (the SIMD blocks and the tail): the same bits,
  // and nothing written past the row.
  for (std::size_t start = 0; start < 3; ++start) {
    for (std::size_t n = 0; n <= 40; ++n) {
      std::vector<BFloat16> b(n + 1, BFloat16::from_bits(0x1234));
      std::vector<Float16> h(n + 1, Float16::from_bits(0x1234));
      rope::store_kv_row<Arch>(x.data() + 990 + start, n, b.data(), nullptr);
      rope::store_kv_row<Arch>(x.data() + 990 + start, n, h.data(), nullptr);
      for (std::size_t i = 0; i < n; ++i) {
        ASSERT_EQ(b[i].bits, rope::detail::float_to_bfloat16_bits(x[990 + start + i])) << Arch::name() << " n " << n;
        ASSERT_EQ(h[i].bits, rope::detail::float_to_float16_bits(x[990 + start + i])) << Arch::name() << " n " << n;
      }
      ASSERT_EQ(b[n].bits, 0x1234) << Arch::name() << " written past n " << n;
      ASSERT_EQ(h[n].bits, 0x1234) << Arch::name() << " written past n " << n;
    }
  }
  std::vector<float> copy(x.size());
  rope::store_kv_row<Arch>(x.data(), x.size(), copy.data(), nullptr);
  EXPECT_EQ(std::memcmp(copy.data(), x.data(), x.size() * sizeof(float)), 0);
}

// The SIMD int8 store against its scalar twin, bit for bit (codes and the
// scale): every length around the lane widths, magnitudes from subnormal to
// 1e30, ties (x / s exactly k + 1/2), and a NaN or an infinity in the SIMD
// blocks or in the tail.
TYPED_TEST(KvRows, StoreInt8IsItsScalarTwinBitForBit) {
  using Arch = TypeParam;
  const auto same = [](const std::vector<float>& x, const char* what) {
    const std::size_t n = x.size();
    std::vector<std::int8_t> got(n + 1, 77), want(n + 1, 77);
    float gs = -1, ws = -1;
    rope::store_kv_row<Arch>(x.data(), n, got.data(), &gs);
    rope::reference::quantize_int8(x.data(), n, want.data(), &ws);
    ASSERT_TRUE(std::memcmp(&gs, &ws, sizeof(float)) == 0 || (std::isnan(gs) && std::isnan(ws)))
        << what << " n " << n << " scale " << gs << " vs " << ws;
    ASSERT_EQ(got, want) << what << " n " << n;
    ASSERT_EQ(got[n], 77) << "wrote past n = " << n;
  };
  std::vector<std::size_t> lengths;
  for (std::size_t n = 0; n <= 70; ++n) lengths.push_back(n);
  for (std::size_t n : {127, 128, 129, 130, 256, 257}) lengths.push_back(n);
  for (std::size_t n : lengths) {
    for (const double magnitude : {1e-42, 1e-30, 1e-3, 1.0, 37.0, 1e30}) {
      same(rope_test::random_vector<float>(n, static_cast<std::uint32_t>(7 * n + 3), magnitude), "random");
    }
    if (n == 0) continue;
    // Ties: the largest is 127 s, the rest k + 1/2 steps (k + 1/2 and 127
    // are exact in float, so x / s is too).
    std::vector<float> ties(n);
    for (std::size_t c = 0; c < n; ++c) ties[c] = (c == 0 ? 127.0f : static_cast<float>(c % 120) + 0.5f) * 0.25f;
    same(ties, "ties");
    for (const float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity()}) {
      for (std::size_t at : {std::size_t{0}, n / 2, n - 1}) {
        auto x = rope_test::random_vector<float>(n, static_cast<std::uint32_t>(n + at));
        x[at] = bad;
        same(x, "non-finite");
      }
    }
    same(std::vector<float>(n, -0.0f), "zeros");
  }
}

TEST(KvRowsStore, Int8QuantizesSymmetricallyWithinHalfAStep) {
  const double eps = std::numeric_limits<float>::epsilon();
  for (std::size_t n : {std::size_t{1}, std::size_t{2}, std::size_t{7}, std::size_t{64}, std::size_t{130}}) {
    for (const double magnitude : {1e-30, 1e-3, 1.0, 37.0, 1e30}) {
      const auto x = rope_test::random_vector<float>(n, static_cast<std::uint32_t>(n * 3 + 1), magnitude);
      std::vector<std::int8_t> q(n, 99);
      float s = -1;
      rope::store_kv_row(x.data(), n, q.data(), &s);
      float m = 0;
      std::size_t at = 0;
      for (std::size_t c = 0; c < n; ++c) {
        if (std::fabs(x[c]) > m) m = std::fabs(x[c]), at = c;
      }
      ASSERT_EQ(s, m / 127.0f) << "scale = max |x| / 127, n " << n;
      ASSERT_GT(s, 0.0f);
      // q = x / s rounded, x / s itself rounded: |x - s q| <= s (1/2 + 127 eps).
      const LD step = static_cast<LD>(s) * (0.5L + 127 * static_cast<LD>(eps));
      for (std::size_t c = 0; c < n; ++c) {
        ASSERT_GE(q[c], -127);
        ASSERT_LE(q[c], 127);
        ASSERT_LE(std::fabs(static_cast<LD>(x[c]) - static_cast<LD>(s) * q[c]), step)
            << "n " << n << " magnitude " << magnitude << " c " << c;
      }
      ASSERT_EQ(std::abs(static_cast<int>(q[at])), 127) << "the largest element maps to +-127";
      ASSERT_EQ(q[at] > 0, x[at] > 0);
    }
  }
  // A nonzero vector below 127 times the least subnormal, where max|x| / 127
  // underflows: the least subnormal is its scale, every element read back
  // within half a step, and the vector is not read back as zeros.
  {
    const float tiny = std::numeric_limits<float>::denorm_min();
    const float x[3] = {3 * tiny, -tiny, 0.0f};
    std::int8_t q[3] = {9, 9, 9};
    float s = -1;
    rope::store_kv_row(x, 3, q, &s);
    EXPECT_EQ(s, tiny);
    EXPECT_EQ(q[0], 3);
    EXPECT_EQ(q[1], -1);
    EXPECT_EQ(q[2], 0);
  }
  // Zeros: scale 0, q 0 (the sign of zero does not matter).
  const float zeros[4] = {0.0f, -0.0f, 0.0f, 0.0f};
  std::int8_t q[4] = {5, 5, 5, 5};
  float s = -1;
  rope::store_kv_row(zeros, 4, q, &s);
  EXPECT_EQ(s, 0.0f);
  for (std::int8_t v : q) EXPECT_EQ(v, 0);
  // A NaN or an infinity anywhere: NaN scale and q = 0, so every value read back is NaN.
  for (const float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                          -std::numeric_limits<float>::infinity()}) {
    for (std::size_t at : {std::size_t{0}, std::size_t{5}}) {
      auto x = rope_test::random_vector<float>(6, 2);
      x[at] = bad;
      std::int8_t out[6] = {1, 1, 1, 1, 1, 1};
      float scale = 1;
      rope::store_kv_row(x.data(), 6, out, &scale);
      EXPECT_TRUE(std::isnan(scale)) << bad << " at " << at;
      for (std::int8_t v : out) EXPECT_EQ(v, 0);
    }
  }
}

}  // namespace
