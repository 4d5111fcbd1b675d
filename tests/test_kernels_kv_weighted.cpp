// weighted_kv and weighted_kv_rows (kernels/kv_rows.hpp), weights against
// cached value rows, on each architecture of the build whose code differs
// (rope_test::DistinctArchs), each suite named by it, for every element type
// a cache may hold (float, BFloat16, Float16, int8, int8 with value scales
// at a stride): bit for bit reference::weighted_kv where the architecture
// has fused multiply-adds, else within 2 (n + 1) eps sum |w s v| of it, and
// within (n + 1) eps sum |w s v| of long double everywhere;
// weighted_kv_rows (values anywhere) bit for bit weighted_kv; nothing
// written between accumulator rows.
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

}  // namespace
