// rope/kernels/kv_rows.hpp — attention's rows over a KV cache stored as
// float, bfloat16, float16 or int8: the dot products of query rows with a
// key, the weighted sums of values, and the softmax of one row of scores
// (its weights by softmax_weights_row, kernels/attention_rows.hpp).
//
// Arithmetic is in float. A stored value is widened exactly (int8 before its
// scale, which the caller applies: q . (s k) = s (q . k)); a NaN stays a
// NaN (binary16 on AVX-512 through vcvtph2ps, which quiets a signaling
// one). A block of W = P * lanes stored values (P = 1 for float, 2 for the
// 16-bit types, 4 for int8) is widened into P "planes" of float lanes. In
// the portable way it is loaded as 32-bit lanes and value P*i + k lands in
// lane i of plane k; instead of shuffling every key and value back into
// channel order, the query rows and the accumulators are kept in that plane
// order (permute_row / unpermute_row, once per row and call):
//
//   channel base + P*i + k  (base a multiple of W, below d - d % W)
//     is stored at  base + k * lanes + i;  channels past d - d % W stay put.
//
// so every load of the cache is one plain vector load, whatever the type,
// instruction set or xsimd version. Where the instruction set widens a run
// of narrow values in one instruction (int8 on AVX2 and AVX-512: vpmovsxbd;
// binary16 on AVX-512: vcvtph2ps), plane k holds values k*lanes .. k*lanes +
// lanes - 1 instead, in channel order (KvPlanes::kInOrder), and the rows
// need no permutation. Written once, templated on the element
// type E and the xsimd architecture Arch, on detail::mul_add (one rounding
// per product where Arch has fused multiply-adds).
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

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include <xsimd/xsimd.hpp>

#include "../detail/half_lanes.hpp"
#include "../detail/inline.hpp"
#include "../detail/lines.hpp"
#include "../detail/prefetch.hpp"
#include "../detail/simd.hpp"
#include "../half.hpp"
#include "attention_rows.hpp"

namespace rope {

// The element types a KV cache may hold: float, BFloat16, Float16 and
// std::int8_t (with one float scale per token and key/value head).
template <class E>
struct KvElement {
  static constexpr bool kSupported = false;
};
template <>
struct KvElement<float> {
  static constexpr bool kSupported = true;
  static constexpr std::size_t kPerLane = 1;  // stored values per 32-bit lane
  static constexpr bool kScaled = false;
};
template <>
struct KvElement<BFloat16> {
  static constexpr bool kSupported = true;
  static constexpr std::size_t kPerLane = 2;
  static constexpr bool kScaled = false;
};
template <>
struct KvElement<Float16> {
  static constexpr bool kSupported = true;
  static constexpr std::size_t kPerLane = 2;
  static constexpr bool kScaled = false;
};
template <>
struct KvElement<std::int8_t> {
  static constexpr bool kSupported = true;
  static constexpr std::size_t kPerLane = 4;
  static constexpr bool kScaled = true;
};

namespace detail {

// The P planes of W stored values at p, widened to float lanes.
template <class E, class Arch>
struct KvPlanes;

// Whether Arch is AVX-512 (or AVX2 and not AVX-512), in a unit compiled
// for it: the widening instructions of those sets are at hand.
template <class Arch>
constexpr bool is_avx512() noexcept {
#if defined(__AVX512F__)
  return std::is_base_of<xsimd::avx512f, Arch>::value;
#else
  return false;
#endif
}
template <class Arch>
constexpr bool is_avx2() noexcept {
#if defined(__AVX2__)
  return !is_avx512<Arch>() && std::is_base_of<xsimd::avx2, Arch>::value;
#else
  return false;
#endif
}

template <class Arch>
struct KvPlanes<float, Arch> {
  using F = xsimd::batch<float, Arch>;
  static constexpr bool kInOrder = true;
  static void load(const float* p, F* out) noexcept { out[0] = F::load_unaligned(p); }
};

template <class Arch>
struct KvPlanes<BFloat16, Arch> {
  using F = xsimd::batch<float, Arch>;
  using U = xsimd::batch<std::uint32_t, Arch>;
  // A shift and a mask of one load: cheaper than widening runs in order.
  static constexpr bool kInOrder = false;
  static void load(const BFloat16* p, F* out) noexcept {
    const U u = U::load_unaligned(reinterpret_cast<const std::uint32_t*>(p));
    out[0] = BFloat16Lanes<Arch>::low(u);
    out[1] = BFloat16Lanes<Arch>::high(u);
  }
};

template <class Arch>
struct KvPlanes<Float16, Arch> {
  using F = xsimd::batch<float, Arch>;
  using U = xsimd::batch<std::uint32_t, Arch>;
  static constexpr bool kInOrder = is_avx512<Arch>();
  static void load(const Float16* p, F* out) noexcept {
#if defined(__AVX512F__)
    // AVX-512F widens 16 binary16 values itself (vcvtph2ps): exact for
    // every number, subnormals included whatever the denormals mode; a
    // signaling NaN comes back quiet (a NaN all the same).
    if constexpr (kInOrder) {
      out[0] = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
      out[1] = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 16)));
      return;
    }
#endif
    const U u = U::load_unaligned(reinterpret_cast<const std::uint32_t*>(p));
    out[0] = Float16Lanes<Arch>::low(u);
    out[1] = Float16Lanes<Arch>::high(u);
  }
};

// int8 on AVX2 and AVX-512: each run of `lanes` values sign-extended
// (vpmovsxbd) and converted (vcvtdq2ps), exact. Elsewhere int8 k of a
// lane: its byte, offset by 128 (x + 128 = byte ^ 0x80), under the
// exponent of 2^23, minus 2^23 + 128: exact, with unsigned lanes only.
template <class Arch>
struct KvPlanes<std::int8_t, Arch> {
  using F = xsimd::batch<float, Arch>;
  using U = xsimd::batch<std::uint32_t, Arch>;
  static constexpr bool kInOrder = is_avx512<Arch>() || is_avx2<Arch>();
  static void load(const std::int8_t* p, F* out) noexcept {
#if defined(__AVX512F__)
    if constexpr (is_avx512<Arch>()) {
      ROPE_UNROLL
      for (std::size_t k = 0; k < 4; ++k) {
        out[k] =
            _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16 * k))));
      }
      return;
    }
#endif
#if defined(__AVX2__)
    if constexpr (is_avx2<Arch>()) {
      ROPE_UNROLL
      for (std::size_t k = 0; k < 4; ++k) {
        out[k] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 8 * k))));
      }
      return;
    }
#endif
    const U u = U::load_unaligned(reinterpret_cast<const std::uint32_t*>(p));
    const F offset(8388736.0f);
    out[0] = as_float((u & U(0xffu)) ^ U(0x4b000080u)) - offset;
    out[1] = as_float(((u >> 8) & U(0xffu)) ^ U(0x4b000080u)) - offset;
    out[2] = as_float(((u >> 16) & U(0xffu)) ^ U(0x4b000080u)) - offset;
    out[3] = as_float((u >> 24) ^ U(0x4b000080u)) - offset;
  }
};

template <class E, class Arch>
constexpr std::size_t kv_block() noexcept {
  return KvElement<E>::kPerLane * xsimd::batch<float, Arch>::size;
}

// The most query rows handled together: their sums (rows x planes
// registers) stay in registers, beside one key's planes, while the key or
// value streams past once. A power of two, at most 8.
template <class E, class Arch>
constexpr std::size_t kv_max_rows() noexcept {
  constexpr std::size_t P = KvElement<E>::kPerLane;
  constexpr std::size_t fit = (vector_registers<Arch>() - P - 2) / P;
  return fit >= 8 ? 8 : fit >= 4 ? 4 : fit >= 2 ? 2 : 1;
}

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

// out = the d floats of x in plane order for E on Arch (out != x): a copy
// where the planes are in channel order.
template <class E, class Arch = xsimd::default_arch>
void permute_row(const float* x, std::size_t d, float* out) noexcept {
  constexpr std::size_t lanes = xsimd::batch<float, Arch>::size;
  constexpr std::size_t P = KvElement<E>::kPerLane;
  constexpr std::size_t W = P * lanes;
  const std::size_t full = detail::KvPlanes<E, Arch>::kInOrder ? 0 : d - d % W;
  for (std::size_t base = 0; base < full; base += W) {
    for (std::size_t i = 0; i < lanes; ++i) {
      ROPE_UNROLL
      for (std::size_t k = 0; k < P; ++k) out[base + k * lanes + i] = x[base + P * i + k];
    }
  }
  for (std::size_t c = full; c < d; ++c) out[c] = x[c];
}

// The inverse of permute_row: out = x back in channel order (out != x).
template <class E, class Arch = xsimd::default_arch>
void unpermute_row(const float* x, std::size_t d, float* out) noexcept {
  constexpr std::size_t lanes = xsimd::batch<float, Arch>::size;
  constexpr std::size_t P = KvElement<E>::kPerLane;
  constexpr std::size_t W = P * lanes;
  const std::size_t full = detail::KvPlanes<E, Arch>::kInOrder ? 0 : d - d % W;
  for (std::size_t base = 0; base < full; base += W) {
    for (std::size_t i = 0; i < lanes; ++i) {
      ROPE_UNROLL
      for (std::size_t k = 0; k < P; ++k) out[base + P * i + k] = x[base + k * lanes + i];
    }
  }
  for (std::size_t c = full; c < d; ++c) out[c] = x[c];
}

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

// The largest of n scores, NaNs skipped (-inf for n = 0 or all NaN).
template <class Arch = xsimd::default_arch>
float max_row(const float* s, std::size_t n) noexcept {
  using F = xsimd::batch<float, Arch>;
  constexpr std::size_t lanes = F::size;
  const std::size_t full = n - n % lanes;
  float m = -std::numeric_limits<float>::infinity();
  if (full > 0) {
    F top(m);
    for (std::size_t j = 0; j < full; j += lanes) {
      const F x = F::load_unaligned(s + j);
      top = xsimd::select(x > top, x, top);  // a NaN compares false: skipped
    }
    float t[lanes];
    top.store_unaligned(t);
    for (std::size_t i = 0; i < lanes; ++i) m = t[i] > m ? t[i] : m;
  }
  for (std::size_t j = full; j < n; ++j) m = s[j] > m ? s[j] : m;
  return m;
}

// x_j <- x_j * y_j for n floats (x and y apart or the same).
template <class Arch = xsimd::default_arch>
void multiply_row(float* x, const float* y, std::size_t n) noexcept {
  using F = xsimd::batch<float, Arch>;
  constexpr std::size_t lanes = F::size;
  const std::size_t full = n - n % lanes;
  for (std::size_t j = 0; j < full; j += lanes)
    (F::load_unaligned(x + j) * F::load_unaligned(y + j)).store_unaligned(x + j);
  for (std::size_t j = full; j < n; ++j) x[j] *= y[j];
}

// s_j <- cap * tanh(s_j / cap) for n scores (cap > 0).
template <class Arch = xsimd::default_arch>
void softcap_row(float* s, std::size_t n, float cap) noexcept {
  using F = xsimd::batch<float, Arch>;
  constexpr std::size_t lanes = F::size;
  const std::size_t full = n - n % lanes;
  const F c(cap);
  for (std::size_t j = 0; j < full; j += lanes) (c * xsimd::tanh(F::load_unaligned(s + j) / c)).store_unaligned(s + j);
  for (std::size_t j = full; j < n; ++j) s[j] = cap * std::tanh(s[j] / cap);
}

// What attend_keys reads: one sequence's keys first_key .. first_key+keys-1
// in a paged cache (attention/paged.hpp has the layout), key j in slot
// pages[j / page_size] * page_size + j % page_size; strides in elements;
// int8 scales at slot * kv_heads + h. q_heads = group * kv_heads.
template <class E>
struct KvKeys {
  const E* k = nullptr;
  const E* v = nullptr;
  const float* k_scales = nullptr;
  const float* v_scales = nullptr;
  const std::int32_t* pages = nullptr;
  std::size_t page_size = 1;
  std::size_t k_page_stride = 0, k_token_stride = 0, k_head_stride = 0;
  std::size_t v_page_stride = 0, v_token_stride = 0, v_head_stride = 0;
  std::size_t first_key = 0, keys = 0;
  std::size_t q_heads = 0, kv_heads = 0, d = 0, dv = 0;
  std::size_t chunk = 1;  // keys per chunk of scores: 1 .. kAttendMaxChunk
  float scale = 1;
  float softcap = 0;  // 0: none
};

// The most keys per chunk of attend_keys.
constexpr std::size_t kAttendMaxChunk = 64;

// attend_keys' memory schedule: every row it reads is asked for (into L2)
// ahead of its use, in memory order, while other rows are worked on, so
// that misses stay in flight through both passes over a chunk. A token's
// key rows are asked for kAttendAhead tokens before they are scored; the
// value rows of the first kAttendValueTokens tokens during the last of the
// scores, and each later group's during the weighing of the group before.
// Measured on batch_decode (32/8 heads, d 128, page size 16, every cache
// line of the batch flushed), paged T1 against a read of the same bytes,
// one process alternating builds, on a 2-vCPU AVX-512 Xeon:
//   - the schedule this replaced, value rows asked for with the keys and
//     nothing while the values are weighed: 0.70 (bf16) and 0.55 (int8);
//   - the schedule above: 0.74-0.80 and 0.59-0.60;
//   - a head's rows of a group of tokens (2 KB apart) instead of the
//     tokens' rows in memory order: 20% slower; every other line, leaving
//     the rest to the hardware prefetchers: 25% slower; the next chunk's
//     rows a whole chunk ahead: 20% slower;
//   - 2 or 8 tokens ahead for the keys, groups of 4 or 16 value tokens:
//     alike within the noise.
constexpr std::size_t kAttendAhead = 4;
constexpr std::size_t kAttendValueTokens = 8;

// The floats attend_keys works in: the query rows (q_heads * d), the
// chunk's scores (q_heads * chunk) and the sums (q_heads * dv), each part on
// whole cache lines (detail/lines.hpp), so that where work starts on a line
// no vector load of a query row or a sum straddles two lines when d and dv
// are multiples of the lanes. Any alignment gives the same bits; with work
// 48 bytes past a line, a bf16 step over a cache in L2 (32/8 heads, d 128)
// took about 25% longer here.
constexpr std::size_t attend_work(std::size_t q_heads, std::size_t d, std::size_t dv, std::size_t chunk) noexcept {
  return detail::line_floats(q_heads * d) + detail::line_floats(q_heads * chunk) + detail::line_floats(q_heads * dv);
}

namespace detail {

// Where a chunk's tokens are: the slot of each and where its key and value
// rows start (one division per chunk). Arch only names the instruction set
// its code is compiled for (rope::dispatch).
template <class E, class Arch>
struct ChunkRows {
  std::size_t slots[kAttendMaxChunk];
  const E* k[kAttendMaxChunk];
  const E* v[kAttendMaxChunk];

  void find(const KvKeys<E>& a, std::size_t first, std::size_t count) noexcept {
    const std::size_t ps = a.page_size;
    std::size_t page = first / ps, offset = first % ps;
    for (std::size_t i = 0; i < count; ++i) {
      const auto id = static_cast<std::size_t>(a.pages[page]);
      slots[i] = id * ps + offset;
      k[i] = a.k + id * a.k_page_stride + offset * a.k_token_stride;
      v[i] = a.v + id * a.v_page_stride + offset * a.v_token_stride;
      if (++offset == ps) {
        offset = 0;
        ++page;
      }
    }
  }
};

}  // namespace detail

namespace detail {

// attend_keys' chunks, for R query heads per key/value head and D channels
// of keys and values known at compile time (the dot products inline in the
// token loop, every loop over channels unrolled), or R = D = 0 for any.
// The same arithmetic in the same order either way: the same bits.
template <std::size_t R, std::size_t D, class E, class Arch>
void attend_chunks(const KvKeys<E>& a, const float* qp, float* scores, float* ap, float* m, float* l) noexcept {
  static_assert((R > 0) == (D > 0), "a compiled shape has both, the loops for any shape neither");
  const std::size_t H = a.q_heads, Hk = a.kv_heads, G = R > 0 ? R : H / Hk, d = D > 0 ? D : a.d, dv = D > 0 ? D : a.dv,
                    S = a.chunk;
  const std::size_t end = a.first_key + a.keys;
  // Keys scored at once: two in the compiled shapes where they fit.
  constexpr std::size_t KK = R > 0 ? kv_keys_at_once<R, E, Arch>() : 1;
  constexpr std::size_t V = kAttendValueTokens;
  // This chunk's rows and the next one's, whose first tokens are asked for
  // while the last of this one are worked on.
  ChunkRows<E, Arch> chunks[2];
  std::size_t now = 0;
  if (a.first_key < end) chunks[0].find(a, a.first_key, end - a.first_key < S ? end - a.first_key : S);
  for (std::size_t c0 = a.first_key; c0 < end; c0 += S) {
    const std::size_t count = end - c0 < S ? end - c0 : S;
    const ChunkRows<E, Arch>& rows = chunks[now];
    const ChunkRows<E, Arch>& next = chunks[now ^ 1];
    const std::size_t after = c0 + count, ahead = after < end ? (end - after < S ? end - after : S) : 0;
    if (ahead > 0) chunks[now ^ 1].find(a, after, ahead);
    now ^= 1;
    // The scores, N tokens at a time over every key/value head. Asked for
    // meanwhile (kAttendAhead): the key rows (and int8 scales) kAttendAhead
    // tokens on, and during the last V tokens the value rows of the first
    // V, which the weighing starts with; each in memory order, token by
    // token and head by head, N rows per head's step.
    const std::size_t v_from = count > V ? count - V : 0;
    std::size_t i = 0;
    const auto score = [&](auto tokens) noexcept {
      constexpr std::size_t N = decltype(tokens)::value;
      const E* k_ask[N];
      const E* v_ask[N];
      ROPE_UNROLL
      for (std::size_t u = 0; u < N; ++u) {
        const std::size_t t = i + u, j = t + kAttendAhead;
        const bool in = j < count;
        k_ask[u] = in ? rows.k[j] : j - count < ahead ? next.k[j - count] : nullptr;
        v_ask[u] = t >= v_from ? rows.v[t - v_from] : nullptr;
        if (a.k_scales != nullptr && k_ask[u] != nullptr) {
          prefetch_l2(a.k_scales + (in ? rows.slots[j] : next.slots[j - count]) * Hk, Hk * sizeof(float));
        }
        if (a.v_scales != nullptr) prefetch_l2(a.v_scales + rows.slots[t] * Hk, Hk * sizeof(float));
      }
      std::size_t pu = 0, ph = 0;  // the token and head asked for next
      for (std::size_t g = 0; g < Hk; ++g) {
        const E* keys[N];
        float ks[N];
        ROPE_UNROLL
        for (std::size_t u = 0; u < N; ++u) {
          if (k_ask[pu] != nullptr) prefetch_l2(k_ask[pu] + ph * a.k_head_stride, d * sizeof(E));
          if (v_ask[pu] != nullptr) prefetch_l2(v_ask[pu] + ph * a.v_head_stride, dv * sizeof(E));
          if (++ph == Hk) {
            ph = 0;
            ++pu;
          }
          keys[u] = rows.k[i + u] + g * a.k_head_stride;
          ks[u] = a.k_scales != nullptr ? a.scale * a.k_scales[rows.slots[i + u] * Hk + g] : a.scale;
        }
        const float* qg = qp + g * G * d;
        float* sg = scores + g * G * S + i;
        if constexpr (N > 1) {
          dot_kv_keys<R, N, E, Arch, D>(qg, keys, sg, S, ks);
        } else if constexpr (R > 0) {
          dot_kv_group<R, E, Arch, D>(qg, d, d, keys[0], sg, S, ks[0]);
        } else {
          dot_kv<E, Arch>(qg, d, G, d, keys[0], sg, S, ks[0]);
        }
      }
      i += N;
    };
    if constexpr (KK > 1) {
      while (i + KK <= count) score(std::integral_constant<std::size_t, KK>{});
    }
    while (i < count) score(std::integral_constant<std::size_t, 1>{});
    for (std::size_t h = 0; h < H; ++h) {
      float* sr = scores + h * S;
      if (a.softcap > 0.0f) softcap_row<Arch>(sr, count, a.softcap);
      const float mc = max_row<Arch>(sr, count);
      const float m_new = mc > m[h] ? mc : m[h];
      const float carried = m[h] == m_new ? 1.0f : std::exp(m[h] - m_new);
      const float sum = softmax_weights_row<Arch>(sr, sr, count, m_new, false);
      l[h] = l[h] * carried + sum;
      if (carried != 1.0f) {
        for (std::size_t c = 0; c < dv; ++c) ap[h * dv + c] *= carried;
      }
      m[h] = m_new;
    }
    if (a.v_scales != nullptr) {
      // int8: each weight times its value's scale, once (weighted_kv
      // would multiply them again for every block of channels), a row of
      // weights at a time.
      float vs[kAttendMaxChunk];
      for (std::size_t g = 0; g < Hk; ++g) {
        for (std::size_t t = 0; t < count; ++t) vs[t] = a.v_scales[rows.slots[t] * Hk + g];
        for (std::size_t r = 0; r < G; ++r) multiply_row<Arch>(scores + (g * G + r) * S, vs, count);
      }
    }
    // The weighted values, V tokens at a time head by head: each sum adds
    // the chunk's values in token order whatever V is, so the same bits.
    // Meanwhile the next V tokens' value rows are asked for, one row per
    // value of the first pass over the channels, in memory order.
    for (std::size_t s0 = 0; s0 < count; s0 += V) {
      const std::size_t n = count - s0 < V ? count - s0 : V;
      const std::size_t ask_end = s0 + 2 * V < count ? s0 + 2 * V : count;
      std::size_t pu = s0 + V, ph = 0;  // the token and head asked for next
      for (std::size_t g = 0; g < Hk; ++g) {
        const float* w = scores + g * G * S + s0;
        const std::size_t offset = g * a.v_head_stride;
        float* ag = ap + g * G * dv;
        const auto ask = [&]() noexcept {
          if (pu < ask_end) {
            prefetch_l2(rows.v[pu] + ph * a.v_head_stride, dv * sizeof(E));
            if (++ph == Hk) {
              ph = 0;
              ++pu;
            }
          }
        };
        if constexpr (R > 0) {
          weighted_kv_group<R, E, Arch, D>(
              w, S, n, [&](std::size_t t) noexcept { return rows.v[s0 + t] + offset; }, nullptr, 0, dv, ag, dv, ask);
        } else {
          weighted_kv_rows<E, Arch>(w, S, G, n, rows.v + s0, offset, dv, ag, dv, ask);
        }
      }
    }
  }
}

template <class E, class Arch>
using AttendChunks = void (*)(const KvKeys<E>&, const float*, float*, float*, float*, float*) noexcept;

// The attend_chunks compiled for G query heads per key/value head and d, dv
// channels of keys and values, or null: compiled for the shapes of most
// current models, head_dim 128 with 4 or 8 query heads per key/value head
// (Llama 3, Mistral, Qwen 3), where dot_kv takes that many rows in one
// group. They took about a quarter less time per key than the loops for any
// shape (batch_decode, bf16, a cache in L2), and cost about half a second
// more compile time each for every instruction set a program builds
// attention for.
template <class E, class Arch>
AttendChunks<E, Arch> attend_shape(std::size_t G, std::size_t d, std::size_t dv) noexcept {
  constexpr std::size_t most = kv_max_rows<E, Arch>();
  if (d != 128 || dv != 128) return nullptr;
  if constexpr (most >= 4) {
    if (G == 4) return &attend_chunks<4, 128, E, Arch>;
  }
  if constexpr (most >= 8) {
    if (G == 8) return &attend_chunks<8, 128, E, Arch>;
  }
  return nullptr;
}

// attend_keys through the chunks compiled for its shape where there are
// (shaped), else through the loops for any shape.
template <class E, class Arch>
void attend_keys_as(const KvKeys<E>& a, const float* q, float* work, float* m, float* l, float* acc,
                    bool shaped) noexcept {
  const std::size_t H = a.q_heads, d = a.d, dv = a.dv;
  float* qp = work;
  float* scores = qp + line_floats(H * d);
  float* ap = scores + line_floats(H * a.chunk);
  for (std::size_t h = 0; h < H; ++h) {
    permute_row<E, Arch>(q + h * d, d, qp + h * d);
    m[h] = -std::numeric_limits<float>::infinity();
    l[h] = 0.0f;
  }
  for (std::size_t c = 0; c < H * dv; ++c) ap[c] = 0.0f;
  AttendChunks<E, Arch> chunks = shaped ? attend_shape<E, Arch>(H / a.kv_heads, d, dv) : nullptr;
  if (chunks == nullptr) chunks = &attend_chunks<0, 0, E, Arch>;
  chunks(a, qp, scores, ap, m, l);
  for (std::size_t h = 0; h < H; ++h) unpermute_row<E, Arch>(ap + h * dv, dv, acc + h * dv);
}

}  // namespace detail

// The online softmax of q_heads query rows (q: q_heads x d floats, channel
// order, query head h reading key/value head h / group) over a.keys keys:
// for each head h, m[h] = the max of its scores s_j = scale * q_h . k_j
// (int8: times k_j's scale; capped by softcap when set), l[h] = sum_j
// exp(s_j - m[h]), acc[h * dv ..] = sum_j exp(s_j - m[h]) v_j in channel
// order. The keys are taken in chunks of a.chunk (at most
// kAttendMaxChunk): each chunk's scores key token by key token over every
// key/value head (a token's rows in memory order; two tokens at a time
// where the shape's sums fit, dot_kv_keys), its weights exp(s - m)
// relative to the running max, the earlier sums scaled by exp(m_old -
// m_new) when the max grows, then its values weighted kAttendValueTokens
// tokens at a time head by head (weighted_kv_rows, whatever pages they
// span; every sum still adds the chunk's values in token order). Rows are
// asked for ahead as kAttendAhead describes. work holds attend_work(...)
// floats, best from a cache line on (see there). Shapes
// with loops of their own (detail::attend_shape) give the same bits.
template <class E, class Arch = xsimd::default_arch>
void attend_keys(const KvKeys<E>& a, const float* q, float* work, float* m, float* l, float* acc) noexcept {
  detail::attend_keys_as<E, Arch>(a, q, work, m, l, acc, true);
}

// One vector of n floats written as E, each value rounded once (to nearest
// even): float copied, the 16-bit types rounded; int8 quantized
// symmetrically, x_c = scale * q_c with scale = max_c |x_c| / 127 and q_c =
// x_c / scale rounded to the nearest integer (ties to even; at most 127 in
// magnitude). *scale is set
// for int8 only: 0 for an all-zero vector (q = 0), NaN when the vector holds
// a NaN or an infinity (q = 0: int8 holds neither), so every value read
// back from that vector is NaN.
template <class Arch = xsimd::default_arch>
void store_kv_row(const float* x, std::size_t n, float* out, float* /*scale*/) noexcept {
  std::copy(x, x + n, out);
}

namespace detail {

// The 16-bit rows: each block of float lanes rounded by the lane codec of
// detail/half_lanes.hpp (bit for bit half.hpp's conversion), the kept
// halves written out; the tail through half.hpp.
template <class E, class Arch, class Codec>
void store_16_row(const float* x, std::size_t n, E* out, Codec round) noexcept {
  using F = xsimd::batch<float, Arch>;
  constexpr std::size_t lanes = F::size;
  const std::size_t full = n - n % lanes;
  static_assert(sizeof(E) == sizeof(std::uint16_t), "a 16-bit storage type");
  for (std::size_t c = 0; c < full; c += lanes) {
    store_low_halves<Arch>(round(F::load_unaligned(x + c)), reinterpret_cast<std::uint16_t*>(out + c));
  }
  for (std::size_t c = full; c < n; ++c) out[c] = E(x[c]);
}

}  // namespace detail

template <class Arch = xsimd::default_arch>
void store_kv_row(const float* x, std::size_t n, BFloat16* out, float* /*scale*/) noexcept {
  detail::store_16_row<BFloat16, Arch>(
      x, n, out, [](const xsimd::batch<float, Arch>& f) { return detail::BFloat16Lanes<Arch>::round_high(f) >> 16; });
}
template <class Arch = xsimd::default_arch>
void store_kv_row(const float* x, std::size_t n, Float16* out, float* /*scale*/) noexcept {
  detail::store_16_row<Float16, Arch>(
      x, n, out, [](const xsimd::batch<float, Arch>& f) { return detail::Float16Lanes<Arch>::round_low(f); });
}
namespace detail {

// The int8 scale of a vector whose largest magnitude is m (finite, >= 0):
// m / 127, except where that underflows for m below 127 times the least
// subnormal: the least subnormal then, so a nonzero vector keeps a nonzero one.
inline float int8_scale(float m) noexcept {
  return m > 0.0f && m / 127.0f == 0.0f ? std::numeric_limits<float>::denorm_min() : m / 127.0f;
}

// Whether store_kv_row quantizes int8 on Arch's lanes: on x86. On NEON
// the codes are computed one by one: 32-bit NEON divides by a refined
// reciprocal estimate, and with xsimd 8.1 the aarch64 lanes did not match
// the scalar codes either.
template <class Arch>
constexpr bool quantizes_on_lanes() noexcept {
#if defined(__aarch64__) || defined(__ARM_NEON)
  return !std::is_base_of<xsimd::neon, Arch>::value;
#else
  return true;
#endif
}

}  // namespace detail

// int8, a SIMD block at a time: bit for bit rope::reference::quantize_int8
// (the maximum is exact in any order; x / s and its rounding are one IEEE
// operation each, in the current rounding mode, to nearest even by default).
template <class Arch = xsimd::default_arch>
void store_kv_row(const float* x, std::size_t n, std::int8_t* out, float* scale) noexcept {
  using F = xsimd::batch<float, Arch>;
  constexpr std::size_t lanes = F::size;
  // NEON: every value one by one (quantizes_on_lanes).
  const std::size_t coded = detail::quantizes_on_lanes<Arch>() ? n - n % lanes : 0;
  // x - x is 0 for a finite x and NaN for a NaN or an infinity.
  F top(0.0f), probe(0.0f);
  for (std::size_t c = 0; c < coded; c += lanes) {
    const F v = F::load_unaligned(x + c);
    probe = probe + (v - v);
    top = xsimd::max(top, xsimd::abs(v));
  }
  float lane_top[lanes], lane_probe[lanes];
  top.store_unaligned(lane_top);
  probe.store_unaligned(lane_probe);
  bool finite = true;
  float m = 0.0f;
  for (std::size_t i = 0; i < lanes; ++i) {
    finite = finite && lane_probe[i] == 0.0f;
    m = std::max(m, lane_top[i]);
  }
  for (std::size_t c = coded; c < n; ++c) {
    finite = finite && std::isfinite(x[c]);
    m = std::max(m, std::fabs(x[c]));
  }
  const float s = detail::int8_scale(m);
  if (!finite || !(s > 0.0f)) {
    std::fill_n(out, n, std::int8_t(0));
    *scale = finite ? s : std::numeric_limits<float>::quiet_NaN();
    return;
  }
  *scale = s;
  const F sb(s), hi(127.0f), lo(-127.0f);
  for (std::size_t c = 0; c < coded; c += lanes) {
    const F q = xsimd::min(hi, xsimd::max(lo, xsimd::nearbyint(F::load_unaligned(x + c) / sb)));
    detail::store_bytes<Arch>(xsimd::to_int(q), out + c);
  }
  for (std::size_t c = coded; c < n; ++c) {
    out[c] = static_cast<std::int8_t>(std::min(127.0f, std::max(-127.0f, std::nearbyint(x[c] / s))));
  }
}

}  // namespace rope
