// rope/kernels/kv_dot.hpp — the two products of attention over a KV cache of
// float, bfloat16, float16 or int8 (kv_planes.hpp): query rows against a key
// (dot_kv) and weights against values (weighted_kv).
//
//   dot_kv:      scores[r] = scale * q_r . key          (int8: before its own scale)
//   weighted_kv: acc_r += sum_j w_rj value_j            (int8: w_rj times value j's scale)
//
// Arithmetic in float over the widened values, templated on the element type
// E and the xsimd architecture Arch, on detail::mul_add (one rounding per
// product where Arch has fused multiply-adds).
//
// Rounding, against the scalar twins of reference.hpp (which work in channel
// order): weighted_kv adds value after value in order, one fused multiply-add
// per channel, with the weight rounded once (w * scale for int8): bit for bit
// the same as reference::weighted_kv where Arch has fused multiply-adds.
// dot_kv keeps one partial sum per lane and plane, adds the planes at the
// end and then the lanes in a fixed tree (detail::fold_sums), whatever the
// number of rows: within d * eps * sum_c |q_c k_c| of reference::dot_kv.
//
// Preconditions (unchecked; the attention module checks its arguments):
// query rows hold d floats in plane order, key and value rows d (dv) stored
// values; accumulator rows hold dv floats in plane order and overlap nothing.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "../detail/inline.hpp"
#include "../detail/simd.hpp"
#include "../detail/xsimd.hpp"
#include "../half.hpp"
#include "kv_planes.hpp"

namespace rope {
namespace detail {

// R query rows against one key. D > 0: the channels (d) and the rows'
// stride (q_stride) are D, known at compile time (attend_keys' shapes);
// the same arithmetic, with the loop over channels unrolled.
template <std::size_t R, class E, class Arch, std::size_t D = 0>
ROPE_ALWAYS_INLINE void dot_kv_group(const float* q, std::size_t q_stride, std::size_t d, const E* key, float* scores,
                                     std::size_t score_stride, float scale) noexcept {
  using F = xsimd::batch<float, Arch>;
  constexpr std::size_t lanes = F::size;
  constexpr std::size_t P = KvElement<E>::kPerLane;
  constexpr std::size_t W = P * lanes;
  if constexpr (D > 0) d = q_stride = D;
  const std::size_t full = d - d % W;
  F sum[R][P];
  ROPE_UNROLL
  for (std::size_t r = 0; r < R; ++r) {
    ROPE_UNROLL
    for (std::size_t k = 0; k < P; ++k) sum[r][k] = F(0.0f);
  }
  for (std::size_t base = 0; base < full; base += W) {
    F planes[P];
    KvPlanes<E, Arch>::load(key + base, planes);
    ROPE_UNROLL
    for (std::size_t r = 0; r < R; ++r) {
      const float* qr = q + r * q_stride + base;
      ROPE_UNROLL
      for (std::size_t k = 0; k < P; ++k) sum[r][k] = mul_add(F::load_unaligned(qr + k * lanes), planes[k], sum[r][k]);
    }
  }
  F total[R];
  ROPE_UNROLL
  for (std::size_t r = 0; r < R; ++r) {
    total[r] = sum[r][0];
    ROPE_UNROLL
    for (std::size_t k = 1; k < P; ++k) total[r] = total[r] + sum[r][k];
  }
  // The rows summed across lanes together, as many as a batch has lanes
  // (fold_sums): a score has the same bits in any group of rows.
  constexpr std::size_t Fn = R < lanes ? R : lanes;
  float t[R];
  ROPE_UNROLL
  for (std::size_t r = 0; r < R; r += Fn) {
    float folded[lanes];
    fold_sums<Fn, Arch>(total + r).store_unaligned(folded);
    ROPE_UNROLL
    for (std::size_t i = 0; i < Fn; ++i) t[r + i] = folded[i];
  }
  ROPE_UNROLL
  for (std::size_t r = 0; r < R; ++r) {
    float x = t[r];
    const float* qr = q + r * q_stride;
    for (std::size_t c = full; c < d; ++c) x = std::fma(qr[c], widen_value(key[c]), x);
    scores[r * score_stride] = x * scale;
  }
}

// dot_kv_group for K keys at once, D channels (a multiple of the block W
// of stored values): score k of row r at scores[r * score_stride + k], times
// scales[k]. Each score is the same arithmetic in the same order as
// dot_kv_group's, and the R * K sums are folded in the tree that folds R
// alone (fold_sums), so it has the same bits. One fold, one multiply and
// one store per row serve all K keys. Where the K keys' sums fit in
// registers together their chains run side by side, each query load
// serving every key; else key after key (int8's four planes).
template <std::size_t R, std::size_t K, class E, class Arch, std::size_t D>
ROPE_ALWAYS_INLINE void dot_kv_keys(const float* q, const E* const* keys, float* scores, std::size_t score_stride,
                                    const float* scales) noexcept {
  using F = xsimd::batch<float, Arch>;
  constexpr std::size_t lanes = F::size;
  constexpr std::size_t P = KvElement<E>::kPerLane;
  constexpr std::size_t W = P * lanes;
  static_assert(D > 0 && D % W == 0, "whole blocks of stored values");
  static_assert(R * K <= lanes, "the sums of all keys and rows fold into one batch");
  static_assert(K == 1 || K == 2, "one or two keys");
  // Keys whose sums run side by side.
  constexpr std::size_t T = K * R * P + K * P + 1 <= vector_registers<Arch>() ? K : 1;
  // Lane r * K + k of the fold: row r's score of key k, so that each row's
  // K scores leave together.
  F total[R * K];
  ROPE_UNROLL
  for (std::size_t k0 = 0; k0 < K; k0 += T) {
    F sum[T][R][P];
    ROPE_UNROLL
    for (std::size_t k = 0; k < T; ++k) {
      ROPE_UNROLL
      for (std::size_t r = 0; r < R; ++r) {
        ROPE_UNROLL
        for (std::size_t p = 0; p < P; ++p) sum[k][r][p] = F(0.0f);
      }
    }
    for (std::size_t base = 0; base < D; base += W) {
      F planes[T][P];
      ROPE_UNROLL
      for (std::size_t k = 0; k < T; ++k) KvPlanes<E, Arch>::load(keys[k0 + k] + base, planes[k]);
      ROPE_UNROLL
      for (std::size_t r = 0; r < R; ++r) {
        ROPE_UNROLL
        for (std::size_t p = 0; p < P; ++p) {
          const F qv = F::load_unaligned(q + r * D + base + p * lanes);
          ROPE_UNROLL
          for (std::size_t k = 0; k < T; ++k) sum[k][r][p] = mul_add(qv, planes[k][p], sum[k][r][p]);
        }
      }
    }
    ROPE_UNROLL
    for (std::size_t r = 0; r < R; ++r) {
      ROPE_UNROLL
      for (std::size_t k = 0; k < T; ++k) {
        F t = sum[k][r][0];
        ROPE_UNROLL
        for (std::size_t p = 1; p < P; ++p) t = t + sum[k][r][p];
        total[r * K + k0 + k] = t;
      }
    }
  }
  // Lane i's scale: key i % K's.
  F lane_scales(scales[0]);
  if constexpr (K == 2) lane_scales = xsimd::select(first_blocks<Arch, 1>(), lane_scales, F(scales[1]));
  alignas(64) float out[lanes];
  (fold_sums<R * K, Arch>(total) * lane_scales).store_aligned(out);
  ROPE_UNROLL
  for (std::size_t r = 0; r < R; ++r) std::memcpy(scores + r * score_stride, out + r * K, K * sizeof(float));
}

// How many keys attend_keys' compiled shapes score at once: two where their
// sums fold into one batch and, one key after the other, fit in registers.
template <std::size_t R, class E, class Arch>
constexpr std::size_t kv_keys_at_once() noexcept {
  constexpr std::size_t P = KvElement<E>::kPerLane;
  return R * P + 2 * R + P + 1 <= vector_registers<Arch>() && 2 * R <= xsimd::batch<float, Arch>::size ? 2 : 1;
}

// acc_r += sum_j w_rj value_j (R rows, n values, value(j) its dv stored
// values; w_rj times value_scales[j * scale_stride] when that is set),
// value after value, one fused multiply-add per channel. B blocks of
// channels at a time where their sums fit in registers (independent chains).
// D > 0: the channels (dv) and the rows' stride (acc_stride) are D, known
// at compile time, and the values unscaled (attend_keys' shapes).
// ahead() is called once per value of the first pass over the channels,
// to ask for memory that later work reads (it changes no arithmetic).
struct NoAhead {
  ROPE_ALWAYS_INLINE void operator()() const noexcept {}
};
template <std::size_t R, class E, class Arch, std::size_t D = 0, class Value, class Ahead = NoAhead>
void weighted_kv_group(const float* weights, std::size_t weight_stride, std::size_t n, Value value,
                       const float* value_scales, std::size_t scale_stride, std::size_t dv, float* acc,
                       std::size_t acc_stride, Ahead ahead = {}) noexcept {
  using F = xsimd::batch<float, Arch>;
  constexpr std::size_t lanes = F::size;
  constexpr std::size_t P = KvElement<E>::kPerLane;
  constexpr std::size_t W = P * lanes;
  if constexpr (D > 0) {
    dv = acc_stride = D;
    value_scales = nullptr;
  }
  const std::size_t full = dv - dv % W;
  auto blocks = [&](auto count, std::size_t base) noexcept {
    constexpr std::size_t B = decltype(count)::value;
    F a[B][R][P];
    ROPE_UNROLL
    for (std::size_t b = 0; b < B; ++b) {
      ROPE_UNROLL
      for (std::size_t r = 0; r < R; ++r) {
        ROPE_UNROLL
        for (std::size_t k = 0; k < P; ++k) {
          a[b][r][k] = F::load_unaligned(acc + r * acc_stride + base + b * W + k * lanes);
        }
      }
    }
    for (std::size_t j = 0; j < n; ++j) {
      if (base == 0) ahead();
      const E* x = value(j) + base;
      F planes[B][P];
      ROPE_UNROLL
      for (std::size_t b = 0; b < B; ++b) KvPlanes<E, Arch>::load(x + b * W, planes[b]);
      ROPE_UNROLL
      for (std::size_t r = 0; r < R; ++r) {
        const float w = weights[r * weight_stride + j];
        const F wb(value_scales != nullptr ? w * value_scales[j * scale_stride] : w);
        ROPE_UNROLL
        for (std::size_t b = 0; b < B; ++b) {
          ROPE_UNROLL
          for (std::size_t k = 0; k < P; ++k) a[b][r][k] = mul_add(wb, planes[b][k], a[b][r][k]);
        }
      }
    }
    ROPE_UNROLL
    for (std::size_t b = 0; b < B; ++b) {
      ROPE_UNROLL
      for (std::size_t r = 0; r < R; ++r) {
        ROPE_UNROLL
        for (std::size_t k = 0; k < P; ++k) {
          a[b][r][k].store_unaligned(acc + r * acc_stride + base + b * W + k * lanes);
        }
      }
    }
  };
  // Two blocks where their sums, planes and a weight fit in registers.
  constexpr std::size_t B = 2 * R * P + 2 * P + 2 <= vector_registers<Arch>() ? 2 : 1;
  std::size_t base = 0;
  for (; base + B * W <= full; base += B * W) blocks(std::integral_constant<std::size_t, B>{}, base);
  for (; base < full; base += W) blocks(std::integral_constant<std::size_t, 1>{}, base);
  ROPE_UNROLL
  for (std::size_t r = 0; r < R; ++r) {
    float* ar = acc + r * acc_stride;
    for (std::size_t j = 0; j < n; ++j) {
      const float w = weights[r * weight_stride + j];
      const float wj = value_scales != nullptr ? w * value_scales[j * scale_stride] : w;
      const E* x = value(j);
      for (std::size_t c = full; c < dv; ++c) ar[c] = std::fma(wj, widen_value(x[c]), ar[c]);
    }
  }
}

}  // namespace detail

// scores[r * score_stride] = (q_r . key) * scale for `rows` query rows (row
// r at q + r * q_stride, d floats in plane order) and one key of d stored
// values (int8: before its scale), the product rounded, then the scale.
template <class E, class Arch = xsimd::default_arch>
void dot_kv(const float* q, std::size_t q_stride, std::size_t rows, std::size_t d, const E* key, float* scores,
            std::size_t score_stride, float scale = 1.0f) noexcept {
  detail::for_row_groups<detail::kv_max_rows<E, Arch>()>(rows, [&](auto group, std::size_t r) {
    detail::dot_kv_group<decltype(group)::value, E, Arch>(q + r * q_stride, q_stride, d, key, scores + r * score_stride,
                                                          score_stride, scale);
  });
}

// acc_r += sum_j w_rj * value_j for `rows` rows and n values, value j at
// values + j * value_stride (dv stored values), w_rj = weights[r *
// weight_stride + j] times value_scales[j * scale_stride] when value_scales
// is set (int8), rounded once; acc row r at acc + r * acc_stride, dv floats
// in plane order.
template <class E, class Arch = xsimd::default_arch>
void weighted_kv(const float* weights, std::size_t weight_stride, std::size_t rows, std::size_t n, const E* values,
                 std::size_t value_stride, const float* value_scales, std::size_t scale_stride, std::size_t dv,
                 float* acc, std::size_t acc_stride) noexcept {
  detail::for_row_groups<detail::kv_max_rows<E, Arch>()>(rows, [&](auto group, std::size_t r) {
    detail::weighted_kv_group<decltype(group)::value, E, Arch>(
        weights + r * weight_stride, weight_stride, n,
        [=](std::size_t j) noexcept { return values + j * value_stride; }, value_scales, scale_stride, dv,
        acc + r * acc_stride, acc_stride);
  });
}

// weighted_kv of n values anywhere, value j at values[j] + value_offset,
// unscaled: bit for bit weighted_kv of the same values in a row. ahead(),
// when given, is called once per value of the first pass over the channels
// of each group of rows, to prefetch what later work reads; it changes no
// arithmetic.
template <class E, class Arch = xsimd::default_arch, class Ahead = detail::NoAhead>
void weighted_kv_rows(const float* weights, std::size_t weight_stride, std::size_t rows, std::size_t n,
                      const E* const* values, std::size_t value_offset, std::size_t dv, float* acc,
                      std::size_t acc_stride, Ahead ahead = {}) noexcept {
  detail::for_row_groups<detail::kv_max_rows<E, Arch>()>(rows, [&](auto group, std::size_t r) {
    detail::weighted_kv_group<decltype(group)::value, E, Arch>(
        weights + r * weight_stride, weight_stride, n, [=](std::size_t j) noexcept { return values[j] + value_offset; },
        nullptr, 0, dv, acc + r * acc_stride, acc_stride, ahead);
  });
}
}  // namespace rope
