// The products of a cascade level (kernels/level_gemm.hpp), on each
// architecture whose code differs (rope_test::DistinctArchs):
//   - level_scores: st[j][r] = sum_c qt[c][r] keys[j][c], one fused
//     multiply-add per channel in channel order from zero: bit for bit a
//     scalar std::fma chain where Arch fuses (kFusedMultiplyAdd), and
//     within gamma_d sum_c |q_c k_c| of the long-double dot product
//     everywhere (two roundings per step where it does not fuse: gamma_2d);
//   - level_values: acc[r][c] += sum_j wt[j][r] values[j][c] in key order:
//     bit for bit the scalar chain where Arch fuses, within gamma_n of
//     sum_j |w v| + |acc| otherwise; rows past `rows`, channels past dv and
//     the padding of acc's stride untouched;
// over shapes that reach every tile and remainder: rows from one batch to
// past four, keys 1 .. 13 and 64, d and dv below, at and past whole
// batches.
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include <rope/detail/lines.hpp>
#include <rope/kernels/level_gemm.hpp>

#include "archs.hpp"

namespace {

using LD = long double;

template <class Arch>
class LevelGemm : public ::testing::Test {};
TYPED_TEST_SUITE(LevelGemm, rope_test::DistinctArchs, rope_test::ArchNames);

double gamma_float(double n) {
  const double u = std::numeric_limits<float>::epsilon() / 2;
  return n * u / (1 - n * u);
}

// Floats on whole cache lines (the batches' alignment), normal values.
struct Lines {
  std::vector<float> buffer;
  float* p;
  explicit Lines(std::size_t n, std::uint32_t seed) : buffer(n + rope::detail::kLineFloats) {
    p = rope::detail::line_start(buffer);
    std::mt19937 gen(seed);
    std::normal_distribution<float> normal;
    for (std::size_t i = 0; i < n; ++i) p[i] = normal(gen);
  }
};

TYPED_TEST(LevelGemm, ScoresAreEachDotProductInChannelOrder) {
  using Arch = TypeParam;
  constexpr bool fused = rope_test::kFusedMultiplyAdd<Arch>;
  for (const std::size_t rs : {16, 32, 64, 80, 96}) {
    for (const std::size_t n : {1, 2, 5, 6, 7, 13, 64}) {
      for (const std::size_t d : {1, 3, 8, 64, 128}) {
        Lines qt(d * rs, static_cast<std::uint32_t>(rs + n + d)), st(n * rs, 1);
        const Lines keys(n * d, static_cast<std::uint32_t>(7 * d + n));
        rope::level_scores<Arch>(qt.p, rs, keys.p, n, d, st.p);
        for (std::size_t j = 0; j < n; ++j) {
          for (std::size_t r = 0; r < rs; ++r) {
            float chain = 0.0f;
            LD exact = 0, magnitude = 0;
            for (std::size_t c = 0; c < d; ++c) {
              chain = std::fma(qt.p[c * rs + r], keys.p[j * d + c], chain);
              exact += static_cast<LD>(qt.p[c * rs + r]) * keys.p[j * d + c];
              magnitude += std::fabs(static_cast<LD>(qt.p[c * rs + r]) * keys.p[j * d + c]);
            }
            const float got = st.p[j * rs + r];
            if (fused) {
              ASSERT_EQ(std::memcmp(&got, &chain, sizeof(float)), 0)
                  << "rs " << rs << " n " << n << " d " << d << " key " << j << " row " << r;
            }
            ASSERT_LE(std::fabs(static_cast<LD>(got) - exact), gamma_float(2.0 * d) * magnitude)
                << "rs " << rs << " n " << n << " d " << d << " key " << j << " row " << r;
          }
        }
      }
    }
  }
}

TYPED_TEST(LevelGemm, ValuesAddEachKeyInOrderOntoTheSums) {
  using Arch = TypeParam;
  constexpr bool fused = rope_test::kFusedMultiplyAdd<Arch>;
  for (const std::size_t rs : {16, 48, 80}) {
    for (const std::size_t rows : {1, 5, 6, 7, 13, 16}) {
      for (const std::size_t n : {1, 6, 13, 64}) {
        for (const std::size_t dv : {1, 5, 16, 24, 64, 70, 130}) {
          const std::size_t as = dv + 3;  // a stride past dv: its padding must stay
          const Lines wt(n * rs, static_cast<std::uint32_t>(rows + n)), values(n * dv, static_cast<std::uint32_t>(dv));
          Lines acc(rs * as, static_cast<std::uint32_t>(rs + dv));
          const std::vector<float> before(acc.p, acc.p + rs * as);
          rope::level_values<Arch>(wt.p, rs, rows, values.p, n, dv, acc.p, as);
          for (std::size_t r = 0; r < rs; ++r) {
            for (std::size_t c = 0; c < as; ++c) {
              const float got = acc.p[r * as + c];
              if (r >= rows || c >= dv) {
                ASSERT_EQ(std::memcmp(&got, &before[r * as + c], sizeof(float)), 0) << "row " << r << " channel " << c;
                continue;
              }
              float chain = before[r * as + c];
              LD exact = chain, magnitude = std::fabs(static_cast<LD>(chain));
              for (std::size_t j = 0; j < n; ++j) {
                chain = std::fma(wt.p[j * rs + r], values.p[j * dv + c], chain);
                exact += static_cast<LD>(wt.p[j * rs + r]) * values.p[j * dv + c];
                magnitude += std::fabs(static_cast<LD>(wt.p[j * rs + r]) * values.p[j * dv + c]);
              }
              if (fused) {
                ASSERT_EQ(std::memcmp(&got, &chain, sizeof(float)), 0)
                    << "rs " << rs << " rows " << rows << " n " << n << " dv " << dv << " row " << r << " channel "
                    << c;
              }
              ASSERT_LE(std::fabs(static_cast<LD>(got) - exact), gamma_float(2.0 * n) * magnitude);
            }
          }
        }
      }
    }
  }
}

}  // namespace
