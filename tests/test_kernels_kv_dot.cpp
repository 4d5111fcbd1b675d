// dot_kv (kernels/kv_rows.hpp), query rows against one cached key, on each
// architecture of the build whose code differs (rope_test::DistinctArchs),
// each suite named by it, for every element type a cache may hold (float,
// BFloat16, Float16, int8): within d * eps * sum |q k| of its scalar twin
// reference::dot_kv and of long double; with a scale, the sum rounded, then
// multiplied (bit for bit); each row's score the same bits alone as in a
// group of rows; nothing written between strided scores.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

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
using rope_test::random_elements;
using rope_test::widen;

template <class E, class Arch>
void check_dot() {
  const double eps = std::numeric_limits<float>::epsilon();
  for (std::size_t rows = 1; rows <= 9; ++rows) {
    for (std::size_t d : kv_dims()) {
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

}  // namespace
