// rope/kernels/level_gemm.hpp — the two small matrix products of a cascade
// level (attention/cascade_attend.hpp): many query rows against a block of
// keys widened to float, then the weights against the block's values.
//
//   level_scores:   st[j * rs + r] = sum_c qt[c * rs + r] * keys[j * d + c]
//   level_values:   acc[r * as + c] += sum_j wt[j * rs + r] * values[j * dv + c]
//
// Both run in the transposed layout of the scores, st[j][r] (a key's
// scores of every row side by side): the query rows are transposed once
// per level part (qt, rs = rows rounded up to whole batches of floats, the
// padding rows zero), each key value is broadcast against a batch of rows,
// and the softmax of each row runs down the columns, a batch of rows at a
// time (cascade_attend.hpp). Each dot product adds its d products in
// channel order, one fused multiply-add each (mul_add: two roundings where
// Arch has none), from zero; each weighted sum adds the block's values in
// key order onto what acc holds. Register tiles of kLevelKeys keys x
// kLevelRowBatches batches of rows, and kLevelRows rows x kLevelValueBatches
// batches of channels; the remainders in tiles of one. Which tile computes
// an entry does not change its sum: the same bits in any tiling.
#pragma once

#include <cmath>
#include <cstddef>
#include <type_traits>

#include "../detail/inline.hpp"
#include "../detail/simd.hpp"
#include "../detail/xsimd.hpp"

namespace rope {
namespace detail {

// Tiles for Arch: 24 sums in registers of 16 floats (AVX-512, 32
// registers), 12 in registers of 8 or 4 (AVX2, SSE and NEON: 16 registers
// on x86, the sums, two of queries or values and a broadcast). With 8 sums
// (4 keys x 2 batches, 2 rows x 4 batches) on AVX2 the fused multiply-adds
// waited on each other: at 6 x 2 each product ran about 1.7 times as fast
// (a block of 512 keys against 64 rows, d 128, AMD EPYC Zen 3).
template <class Arch>
struct LevelTiles {
  static constexpr bool kWide = xsimd::batch<float, Arch>::size >= 16;
  static constexpr std::size_t kKeys = 6;                      // keys per score tile
  static constexpr std::size_t kRowBatches = kWide ? 4 : 2;    // batches of rows per score tile
  static constexpr std::size_t kRows = 6;                      // rows per value tile
  static constexpr std::size_t kValueBatches = kWide ? 4 : 2;  // batches of channels per value tile
};

template <std::size_t K, std::size_t RB, class Arch>
ROPE_ALWAYS_INLINE void level_scores_tile(const float* qt, std::size_t rs, const float* keys, std::size_t d,
                                          float* st) noexcept {
  using F = xsimd::batch<float, Arch>;
  constexpr std::size_t L = F::size;
  F acc[K][RB];
  ROPE_UNROLL
  for (std::size_t k = 0; k < K; ++k) {
    ROPE_UNROLL
    for (std::size_t b = 0; b < RB; ++b) acc[k][b] = F(0.0f);
  }
  for (std::size_t c = 0; c < d; ++c) {
    F q[RB];
    ROPE_UNROLL
    for (std::size_t b = 0; b < RB; ++b) q[b] = F::load_aligned(qt + c * rs + b * L);
    ROPE_UNROLL
    for (std::size_t k = 0; k < K; ++k) {
      const F key(keys[k * d + c]);
      ROPE_UNROLL
      for (std::size_t b = 0; b < RB; ++b) acc[k][b] = mul_add(q[b], key, acc[k][b]);
    }
  }
  ROPE_UNROLL
  for (std::size_t k = 0; k < K; ++k) {
    ROPE_UNROLL
    for (std::size_t b = 0; b < RB; ++b) acc[k][b].store_aligned(st + k * rs + b * L);
  }
}

template <std::size_t R, std::size_t CB, class Arch>
ROPE_ALWAYS_INLINE void level_values_tile(const float* wt, std::size_t rs, std::size_t n, const float* values,
                                          std::size_t dv, float* acc, std::size_t as) noexcept {
  using F = xsimd::batch<float, Arch>;
  constexpr std::size_t L = F::size;
  F sum[R][CB];
  ROPE_UNROLL
  for (std::size_t r = 0; r < R; ++r) {
    ROPE_UNROLL
    for (std::size_t b = 0; b < CB; ++b) sum[r][b] = F::load_unaligned(acc + r * as + b * L);
  }
  for (std::size_t j = 0; j < n; ++j) {
    F v[CB];
    ROPE_UNROLL
    for (std::size_t b = 0; b < CB; ++b) v[b] = F::load_unaligned(values + j * dv + b * L);
    ROPE_UNROLL
    for (std::size_t r = 0; r < R; ++r) {
      const F w(wt[j * rs + r]);
      ROPE_UNROLL
      for (std::size_t b = 0; b < CB; ++b) sum[r][b] = mul_add(w, v[b], sum[r][b]);
    }
  }
  ROPE_UNROLL
  for (std::size_t r = 0; r < R; ++r) {
    ROPE_UNROLL
    for (std::size_t b = 0; b < CB; ++b) sum[r][b].store_unaligned(acc + r * as + b * L);
  }
}

}  // namespace detail

// st[j * rs + r] = sum_c qt[c * rs + r] * keys[j * d + c] for n keys and
// every row r < rs (see the header comment): qt [d x rs] and st [n x rs]
// on whole batches (rs a multiple of the batch's floats, both aligned to
// it), keys n rows of d floats.
template <class Arch = xsimd::default_arch>
void level_scores(const float* qt, std::size_t rs, const float* keys, std::size_t n, std::size_t d,
                  float* st) noexcept {
  using T = detail::LevelTiles<Arch>;
  constexpr std::size_t L = xsimd::batch<float, Arch>::size;
  const std::size_t batches = rs / L;
  std::size_t j = 0;
  for (; j + T::kKeys <= n; j += T::kKeys) {
    std::size_t b = 0;
    for (; b + T::kRowBatches <= batches; b += T::kRowBatches) {
      detail::level_scores_tile<T::kKeys, T::kRowBatches, Arch>(qt + b * L, rs, keys + j * d, d, st + j * rs + b * L);
    }
    for (; b < batches; ++b)
      detail::level_scores_tile<T::kKeys, 1, Arch>(qt + b * L, rs, keys + j * d, d, st + j * rs + b * L);
  }
  for (; j < n; ++j) {
    std::size_t b = 0;
    for (; b + T::kRowBatches <= batches; b += T::kRowBatches) {
      detail::level_scores_tile<1, T::kRowBatches, Arch>(qt + b * L, rs, keys + j * d, d, st + j * rs + b * L);
    }
    for (; b < batches; ++b)
      detail::level_scores_tile<1, 1, Arch>(qt + b * L, rs, keys + j * d, d, st + j * rs + b * L);
  }
}

// acc[r * as + c] += sum_j wt[j * rs + r] * values[j * dv + c], j in key
// order, for rows r < rows and channels c < dv (see the header comment).
template <class Arch = xsimd::default_arch>
void level_values(const float* wt, std::size_t rs, std::size_t rows, const float* values, std::size_t n, std::size_t dv,
                  float* acc, std::size_t as) noexcept {
  using T = detail::LevelTiles<Arch>;
  constexpr std::size_t L = xsimd::batch<float, Arch>::size;
  constexpr std::size_t C = T::kValueBatches * L;
  const std::size_t full = dv - dv % L;
  const auto row_group = [&](auto count, std::size_t r) {
    constexpr std::size_t R = decltype(count)::value;
    std::size_t c = 0;
    for (; c + C <= full; c += C) {
      detail::level_values_tile<R, T::kValueBatches, Arch>(wt + r, rs, n, values + c, dv, acc + r * as + c, as);
    }
    for (; c < full; c += L) detail::level_values_tile<R, 1, Arch>(wt + r, rs, n, values + c, dv, acc + r * as + c, as);
    for (; c < dv; ++c) {
      for (std::size_t i = 0; i < R; ++i) {
        float s = acc[(r + i) * as + c];
        for (std::size_t j = 0; j < n; ++j) s = std::fma(wt[j * rs + r + i], values[j * dv + c], s);
        acc[(r + i) * as + c] = s;
      }
    }
  };
  std::size_t r = 0;
  for (; r + T::kRows <= rows; r += T::kRows) row_group(std::integral_constant<std::size_t, T::kRows>{}, r);
  for (; r < rows; ++r) row_group(std::integral_constant<std::size_t, 1>{}, r);
}

}  // namespace rope
