// A cascade level's products on AMX tiles (kernels/level_tiles.hpp), where
// this build's code may hold them (AVX-512BW, Linux) and the CPU and the OS
// grant the tiles (amx_bf16_runs); skipped elsewhere, saying why:
//   - pair_rows: two value rows into the pairs tdpbf16ps reads, bit for bit
//     (zeros past dv and for a missing second row);
//   - pack_weights: st[j][r] into wt[r][j], each weight rounded to bf16 to
//     nearest even (its exact bits for normal weights: float_to_bfloat16),
//     zeros for keys past n;
//   - tile_scores: st[j][r] = sum_c k_jc q_rc over bf16 values, within
//     gamma_d sum_c |k_jc q_rc| + d 2^-126 of the long-double sum (the d
//     products are exact; the instruction adds them in float in an order of
//     its own, each sum flushed to zero below 2^-126);
//   - tile_values: acc[r][c] += sum_j w_rj v_jc, within gamma_(n+1) (sum_j
//     |w_rj v_jc| + |acc_rc|) + (n + 1) 2^-126;
//   - pack_query_row (attention/cascade_tiles.hpp, AVX-512BW, no tiles
//     needed): a query row into its column of the pairs tile_scores reads,
//     each value the bf16 mode's q (bf16_query) bit for bit: ties, NaNs,
//     infinities, subnormals flushed, a subnormal that rounds up to the
//     smallest normal kept;
// over every pair of 16-row tiles the kernels step through (keys 32 and
// 64, rows 32 and 64, channels 32 to 160).
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include <rope/attention/cascade_tiles.hpp>
#include <rope/half.hpp>
#include <rope/kernels/level_tiles.hpp>

namespace {

#if defined(__x86_64__) && defined(__AVX512BW__) && defined(__AVX512DQ__) && defined(__GNUC__)

using LD = long double;

constexpr double kTiny = 1.1754943508222875e-38;  // 2^-126: the instruction flushes sums below it

double gamma_float(double n) {
  const double u = std::numeric_limits<float>::epsilon() / 2;
  return n * u / (1 - n * u);
}

float bf16_value(std::uint16_t bits) { return rope::detail::bfloat16_bits_to_float(bits); }

std::vector<std::uint16_t> random_bf16(std::size_t n, std::uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal;
  std::vector<std::uint16_t> x(n);
  for (auto& b : x) b = rope::detail::float_to_bfloat16_bits(normal(gen));
  return x;
}

bool tiles_here() {
  return rope::detail::kTilesArch<xsimd::default_arch> && rope::detail::amx_bf16_runs<xsimd::default_arch>();
}

#define ROPE_SKIP_WITHOUT_TILES() \
  if (!tiles_here())              \
  GTEST_SKIP() << "no AMX tiles for this build's code here (AVX-512BW code on Linux, AMX-BF16, the OS's grant)"

TEST(LevelTiles, PairRowsInterleavesTwoKeysChannelByChannel) {
  ROPE_SKIP_WITHOUT_TILES();
  for (const std::size_t dv : {1, 31, 32, 80, 128}) {
    const std::size_t da = (dv + 31) / 32 * 32;
    const auto a = random_bf16(dv, 1), b = random_bf16(dv, 2);
    for (const bool second : {true, false}) {
      std::vector<std::uint16_t> out(2 * da, 0xffff);
      rope::detail::pair_rows<xsimd::default_arch>(a.data(), second ? b.data() : nullptr, dv, da, out.data());
      for (std::size_t c = 0; c < da; ++c) {
        ASSERT_EQ(out[2 * c], c < dv ? a[c] : 0) << "dv " << dv << " channel " << c;
        ASSERT_EQ(out[2 * c + 1], c < dv && second ? b[c] : 0) << "dv " << dv << " channel " << c;
      }
    }
  }
}

TEST(LevelTiles, PackWeightsTransposesAndRoundsToNearestEven) {
  ROPE_SKIP_WITHOUT_TILES();
  std::mt19937 gen(3);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  const std::size_t rows = 64, kw = 64;
  for (const std::size_t n : {1, 17, 32, 63, 64}) {
    std::vector<float> st(kw * rows);
    for (float& x : st) x = unit(gen);
    st[5 * rows + 7] = 1.0f + std::ldexp(1.0f, -8);      // a tie: to 1 (even)
    st[6 * rows + 7] = 1.0f + 3 * std::ldexp(1.0f, -8);  // a tie: up to 1 + 2^-6
    std::vector<std::uint16_t> wt(rows * kw, 0xffff);
    rope::detail::pack_weights<xsimd::default_arch>(st.data(), rows, n, rows, wt.data(), kw);
    for (std::size_t r = 0; r < rows; ++r) {
      for (std::size_t j = 0; j < kw; ++j) {
        const std::uint16_t want = j < n ? rope::detail::float_to_bfloat16_bits(st[j * rows + r]) : 0;
        ASSERT_EQ(wt[r * kw + j], want) << "n " << n << " row " << r << " key " << j;
      }
    }
  }
}

// A thread's tiles configured for the test's products.
struct Tiles {
  rope::detail::TileConfig<xsimd::default_arch> config;
};

TEST(LevelTiles, ScoresAreEachDotProductWithinGammaD) {
  ROPE_SKIP_WITHOUT_TILES();
  for (const std::size_t n : {32, 64}) {
    for (const std::size_t rows : {32, 64}) {
      for (const std::size_t dk : {32, 128, 160}) {
        const auto keys = random_bf16(n * dk, 4), q = random_bf16(rows * dk, 5);
        std::vector<std::uint16_t> qv(dk * rows);
        for (std::size_t r = 0; r < rows; ++r) {
          for (std::size_t c = 0; c < dk; ++c) qv[(c / 2) * rows * 2 + r * 2 + c % 2] = q[r * dk + c];
        }
        const std::size_t rs = rows + 16;  // scores' rows apart: more than the rows
        std::vector<float> st(n * rs, -7.0f);
        {
          Tiles tiles;
          rope::detail::tile_scores<xsimd::default_arch>(keys.data(), dk, n, qv.data(), rows, st.data(), rs);
        }
        for (std::size_t j = 0; j < n; ++j) {
          for (std::size_t r = 0; r < rows; ++r) {
            LD dot = 0, mag = 0;
            for (std::size_t c = 0; c < dk; ++c) {
              const LD p = static_cast<LD>(bf16_value(keys[j * dk + c])) * static_cast<LD>(bf16_value(q[r * dk + c]));
              dot += p;
              mag += std::fabs(p);
            }
            const double err = std::fabs(static_cast<double>(st[j * rs + r] - dot));
            ASSERT_LE(err,
                      gamma_float(static_cast<double>(dk)) * static_cast<double>(mag) + static_cast<double>(dk) * kTiny)
                << "n " << n << " rows " << rows << " d " << dk << ": key " << j << " row " << r;
          }
          for (std::size_t r = rows; r < rs; ++r) ASSERT_EQ(st[j * rs + r], -7.0f) << "past the rows";
        }
      }
    }
  }
}

TEST(LevelTiles, ValuesAddTheWeightedRowsOntoTheSums) {
  ROPE_SKIP_WITHOUT_TILES();
  const std::size_t kw = 64;
  for (const std::size_t n : {32, 64}) {
    for (const std::size_t rows : {32, 64}) {
      for (const std::size_t da : {32, 128, 160}) {
        const auto wt = random_bf16(rows * kw, 6), v = random_bf16(kw * da, 7);
        std::vector<std::uint16_t> vv(kw * da);
        for (std::size_t j = 0; j < kw; ++j) {
          for (std::size_t c = 0; c < da; ++c) vv[(j / 2) * da * 2 + c * 2 + j % 2] = v[j * da + c];
        }
        std::vector<float> acc(rows * da);
        std::mt19937 gen(8);
        std::normal_distribution<float> normal;
        for (float& x : acc) x = normal(gen);
        const std::vector<float> before = acc;
        {
          Tiles tiles;
          rope::detail::tile_values<xsimd::default_arch>(wt.data(), kw, n, vv.data(), da, rows, acc.data());
        }
        for (std::size_t r = 0; r < rows; ++r) {
          for (std::size_t c = 0; c < da; ++c) {
            LD sum = before[r * da + c], mag = std::fabs(before[r * da + c]);
            for (std::size_t j = 0; j < n; ++j) {
              const LD p = static_cast<LD>(bf16_value(wt[r * kw + j])) * static_cast<LD>(bf16_value(v[j * da + c]));
              sum += p;
              mag += std::fabs(p);
            }
            const double err = std::fabs(static_cast<double>(acc[r * da + c] - sum));
            ASSERT_LE(err, gamma_float(static_cast<double>(n + 1)) * static_cast<double>(mag) +
                               static_cast<double>(n + 1) * kTiny)
                << "n " << n << " rows " << rows << " da " << da << ": row " << r << " channel " << c;
          }
        }
      }
    }
  }
}

TEST(LevelTiles, QueryRowsPackAsTheBf16ModeRoundsThem) {
  const std::uint32_t specials[] = {0x3f808000u, 0x3f818000u, 0x7fc00000u, 0x7f800001u, 0xff800000u, 0x7f800000u,
                                    0x00000001u, 0x807fffffu, 0x007fffffu, 0x007f8000u, 0x7f7fffffu, 0x80000000u,
                                    0x00800000u, 0xbf7fffffu, 0x3f7f8000u, 0x7f7f8000u};
  std::mt19937 gen(9);
  std::uniform_int_distribution<std::uint32_t> bits;
  for (const std::size_t d : {8, 40, 80, 128, 576}) {
    const std::size_t rows = 32, r = 5, dk = (d + 31) / 32 * 32;
    std::vector<float> wide(d);
    for (std::size_t c = 0; c < d; ++c) {
      wide[c] = c < 16 ? rope::detail::bits_float(specials[c]) : rope::detail::bits_float(bits(gen));
    }
    std::vector<std::uint16_t> want(dk + 32), head(dk * rows, 0), row(dk + 32);
    rope::detail::bf16_query(wide.data(), d, want.data());
    rope::attention::detail::pack_query_row<xsimd::default_arch>(wide.data(), d, r, rows, head.data(), row.data());
    for (std::size_t c = 0; c < d; ++c) {
      ASSERT_EQ(head[(c / 2) * rows * 2 + r * 2 + c % 2], want[c]) << "d " << d << ", channel " << c;
    }
    for (std::size_t i = 0; i < head.size(); ++i) {  // nothing outside column r
      if ((i / 2) % rows != r) {
        ASSERT_EQ(head[i], 0) << "d " << d << ", word " << i;
      }
    }
  }
}

#else

TEST(LevelTiles, NotInThisBuildsCode) { GTEST_SKIP() << "the tile kernels are AVX-512BW code (level_tiles.hpp)"; }

#endif

}  // namespace
