// rope/kernels/attention_rows.hpp — the SIMD rows of attention's decode path.
//
//   dot_rows:      scores[r * score_stride] = q_r . key          (r < rows)
//   weighted_rows: acc_r += sum_j weight_(r, j) value_j          (r < rows, j < n)
//   rms_norm_row:  y = RMSNorm(x), in the order attention/append.hpp documents
//   rms_norm_rows: the same over many rows of one weight row (a token's heads)
//   softmax_weights_row: w_j = exp(s_j - m) and their sum (a softmax tile's row)
//
// A decode step has a few query rows per key/value head; for them a score
// tile is a handful of dot products and the weighted sum of values a handful
// of multiply-adds per value, which GEMMs would spend their time packing.
// Written once, templated on the element type (float, double) and the xsimd
// architecture Arch, on detail::mul_add, so that every product is rounded
// once where Arch has fused multiply-adds, whatever the xsimd version.
//
// Rounding: weighted_rows adds the values in order j = 0, 1, ..., each with
// one fused multiply-add per channel, exactly as reference::weighted_rows
// does with std::fma: the two agree bit for bit where Arch has fused
// multiply-adds. dot_rows keeps one partial sum per lane and adds the lanes
// at the end (detail::sum_lanes), so its sum is ordered differently from
// reference::dot_rows: they agree within d * eps * sum_c |q_c key_c|.
//
// Preconditions (unchecked; the attention module checks its arguments):
// every row pointer holds the channels it is read or written at (d for q
// and key, dv for value and acc rows); acc rows do not overlap each other,
// the weights or the values.
#pragma once

#include <cmath>
#include <cstddef>
#include <type_traits>

#include <xsimd/xsimd.hpp>

#include "../detail/simd.hpp"

namespace rope {

// scores[r * score_stride] = q_r . key for `rows` query rows of d values
// (row r at q + r * d).
template <class T, class Arch = xsimd::default_arch>
void dot_rows(const T* q, std::size_t rows, std::size_t d, const T* key, T* scores, std::size_t score_stride) noexcept {
  using B = xsimd::batch<T, Arch>;
  constexpr std::size_t n = B::size;
  const std::size_t full = d - d % n;
  for (std::size_t r = 0; r < rows; ++r) {
    const T* qr = q + r * d;
    B sum(T(0));
    for (std::size_t c = 0; c < full; c += n) {
      sum = detail::mul_add(B::load_unaligned(qr + c), B::load_unaligned(key + c), sum);
    }
    T total = detail::sum_lanes(sum);
    for (std::size_t c = full; c < d; ++c) total += qr[c] * key[c];
    scores[r * score_stride] = total;
  }
}

namespace detail {

// acc_r += w_r * value for `rows` rows (w_r = weights[r * weight_stride],
// acc row r at acc + r * acc_stride), dv channels.
template <class T, class Arch>
void axpy_rows(const T* weights, std::size_t weight_stride, std::size_t rows, const T* value, std::size_t dv, T* acc,
               std::size_t acc_stride) noexcept {
  using B = xsimd::batch<T, Arch>;
  constexpr std::size_t n = B::size;
  const std::size_t full = dv - dv % n;
  for (std::size_t r = 0; r < rows; ++r) {
    const T w = weights[r * weight_stride];
    T* ar = acc + r * acc_stride;
    const B wb(w);
    for (std::size_t c = 0; c < full; c += n) {
      mul_add(wb, B::load_unaligned(value + c), B::load_unaligned(ar + c)).store_unaligned(ar + c);
    }
    for (std::size_t c = full; c < dv; ++c) ar[c] = std::fma(w, value[c], ar[c]);
  }
}

// weighted_rows for R rows known at compile time: the accumulators of C
// column batches of all R rows held in registers while the values stream
// past, instead of loading and storing each row's accumulator for every
// value.
template <std::size_t R, class T, class Arch>
void weighted_block(const T* weights, std::size_t weight_stride, std::size_t n, const T* values,
                    std::size_t value_stride, std::size_t dv, T* acc, std::size_t acc_stride) noexcept {
  using B = xsimd::batch<T, Arch>;
  constexpr std::size_t lanes = B::size;
  constexpr std::size_t C = R <= 2 ? 4 : R <= 4 ? 2 : 1;  // column batches per pass
  const std::size_t full = dv - dv % lanes;
  std::size_t c = 0;
  for (; c + C * lanes <= full; c += C * lanes) {
    B a[R][C];
    for (std::size_t r = 0; r < R; ++r) {
      for (std::size_t b = 0; b < C; ++b) a[r][b] = B::load_unaligned(acc + r * acc_stride + c + b * lanes);
    }
    for (std::size_t j = 0; j < n; ++j) {
      const T* x = values + j * value_stride + c;
      B xb[C];
      for (std::size_t b = 0; b < C; ++b) xb[b] = B::load_unaligned(x + b * lanes);
      for (std::size_t r = 0; r < R; ++r) {
        const B w(weights[r * weight_stride + j]);
        for (std::size_t b = 0; b < C; ++b) a[r][b] = mul_add(w, xb[b], a[r][b]);
      }
    }
    for (std::size_t r = 0; r < R; ++r) {
      for (std::size_t b = 0; b < C; ++b) a[r][b].store_unaligned(acc + r * acc_stride + c + b * lanes);
    }
  }
  // What is left: batch by batch, then channel by channel.
  for (std::size_t j = 0; j < n; ++j) {
    axpy_rows<T, Arch>(weights + j, weight_stride, R, values + j * value_stride + c, dv - c, acc + c, acc_stride);
  }
}

}  // namespace detail

// acc_r += sum_j weights[r * weight_stride + j] * value_j for `rows` rows
// and n values (value j at values + j * value_stride, dv channels; acc row r
// at acc + r * acc_stride). Rows in groups of 8, 4, 2 and 1 (a decode step's
// query heads per key/value head: 7 = 4 + 2 + 1), each group's accumulators
// in registers while the values stream past. Each row's sum is the same
// whatever its group; four group sizes rather than one per count keep the
// code every user of softmax compiles small.
template <class T, class Arch = xsimd::default_arch>
void weighted_rows(const T* weights, std::size_t weight_stride, std::size_t rows, std::size_t n, const T* values,
                   std::size_t value_stride, std::size_t dv, T* acc, std::size_t acc_stride) noexcept {
  detail::for_row_groups<8>(rows, [&](auto group, std::size_t r) {
    detail::weighted_block<decltype(group)::value, T, Arch>(weights + r * weight_stride, weight_stride, n, values,
                                                            value_stride, dv, acc + r * acc_stride, acc_stride);
  });
}

// The sum of squares of n floats in the order attention/append.hpp
// documents: eight chains s_k = fma(x_c, x_c, s_k), c = k, k + 8, ... in
// order, then ((s_0 + s_4) + (s_2 + s_6)) + ((s_1 + s_5) + (s_3 + s_7)).
// On an Arch with fused multiply-adds of eight lanes or more (AVX2 with
// FMA, AVX-512) and on aarch64, the eight chains are eight lanes of one
// fused multiply-add, each rounded once as std::fma rounds: the same bits as
// the scalar loop, which runs on every other Arch. Templated on Arch, as
// every kernel, so that units built with different flags never share a copy.
namespace detail {

// y_c = (x_c * r) * w_c, or (x_c * r) * (1 + w_c): RMSNorm's scaling.
// Templated on Arch, as the kernels that call it (their units' flags).
template <class Arch>
void scale_row(const float* x, std::size_t n, float r, const float* w, bool plus_one, float* y) noexcept {
  if (plus_one) {
    for (std::size_t c = 0; c < n; ++c) y[c] = (x[c] * r) * (1.0f + w[c]);
  } else {
    for (std::size_t c = 0; c < n; ++c) y[c] = (x[c] * r) * w[c];
  }
}

// sum_squares8's end: the chains s carried on from channel c with the
// scalar loop, the ragged tail, then the fixed order of the eight sums.
template <class Arch>
float finish_squares8(const float* x, std::size_t c, std::size_t n, float* s) noexcept {
  for (; c + 8 <= n; c += 8) {
    for (std::size_t k = 0; k < 8; ++k) s[k] = std::fma(x[c + k], x[c + k], s[k]);
  }
  for (std::size_t k = 0; c < n; ++c, ++k) s[k] = std::fma(x[c], x[c], s[k]);
  return ((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7]));
}

}  // namespace detail

template <class Arch = xsimd::default_arch>
float sum_squares8(const float* x, std::size_t n) noexcept {
  float s[8] = {};
  std::size_t c = 0;
#if defined(__AVX2__) && defined(__FMA__)
  if constexpr (std::is_base_of<xsimd::fma3<xsimd::avx2>, Arch>::value ||
                std::is_base_of<xsimd::avx512f, Arch>::value) {
    __m256 acc = _mm256_setzero_ps();
    for (; c + 8 <= n; c += 8) {
      const __m256 v = _mm256_loadu_ps(x + c);
      acc = _mm256_fmadd_ps(v, v, acc);
    }
    _mm256_storeu_ps(s, acc);
  }
#endif
#if defined(__aarch64__)
  if constexpr (std::is_base_of<xsimd::neon64, Arch>::value) {
    float32x4_t lo = vdupq_n_f32(0.0f), hi = vdupq_n_f32(0.0f);
    for (; c + 8 <= n; c += 8) {
      const float32x4_t a = vld1q_f32(x + c), b = vld1q_f32(x + c + 4);
      lo = vfmaq_f32(lo, a, a);
      hi = vfmaq_f32(hi, b, b);
    }
    vst1q_f32(s, lo);
    vst1q_f32(s + 4, hi);
  }
#endif
  return detail::finish_squares8<Arch>(x, c, n, s);
}

// sum_squares8 of `rows` rows of n floats (row i at x + i * stride) into
// ss[i], each bit for bit sum_squares8's: one row's chains depend on each
// other, the rows' do not, so four rows advance together and their
// multiply-adds overlap instead of waiting on one chain's latency.
template <class Arch = xsimd::default_arch>
void sum_squares8_rows(const float* x, std::size_t stride, std::size_t rows, std::size_t n, float* ss) noexcept {
  std::size_t i = 0;
#if defined(__AVX2__) && defined(__FMA__)
  if constexpr (std::is_base_of<xsimd::fma3<xsimd::avx2>, Arch>::value ||
                std::is_base_of<xsimd::avx512f, Arch>::value) {
    for (; i + 4 <= rows; i += 4) {
      const float* r0 = x + i * stride;
      const float* r1 = r0 + stride;
      const float* r2 = r1 + stride;
      const float* r3 = r2 + stride;
      __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
      std::size_t c = 0;
      for (; c + 8 <= n; c += 8) {
        const __m256 v0 = _mm256_loadu_ps(r0 + c), v1 = _mm256_loadu_ps(r1 + c);
        const __m256 v2 = _mm256_loadu_ps(r2 + c), v3 = _mm256_loadu_ps(r3 + c);
        a0 = _mm256_fmadd_ps(v0, v0, a0);
        a1 = _mm256_fmadd_ps(v1, v1, a1);
        a2 = _mm256_fmadd_ps(v2, v2, a2);
        a3 = _mm256_fmadd_ps(v3, v3, a3);
      }
      float s[4][8];
      _mm256_storeu_ps(s[0], a0);
      _mm256_storeu_ps(s[1], a1);
      _mm256_storeu_ps(s[2], a2);
      _mm256_storeu_ps(s[3], a3);
      ss[i] = detail::finish_squares8<Arch>(r0, c, n, s[0]);
      ss[i + 1] = detail::finish_squares8<Arch>(r1, c, n, s[1]);
      ss[i + 2] = detail::finish_squares8<Arch>(r2, c, n, s[2]);
      ss[i + 3] = detail::finish_squares8<Arch>(r3, c, n, s[3]);
    }
  }
#endif
  for (; i < rows; ++i) ss[i] = sum_squares8<Arch>(x + i * stride, n);
}

// RMSNorm's r = 1 / sqrt(ss / n + eps) of a sum of squares ss over n floats.
template <class Arch = xsimd::default_arch>
float rms_inverse(float ss, std::size_t n, float eps) noexcept {
  return 1.0f / std::sqrt(ss / static_cast<float>(n) + eps);
}

namespace detail {

// The steps of softmax_weights_row, lane by lane (reference::exp_weight
// takes them value by value), for x = s - m <= 0:
//   t = x * log2(e)                       (rounded)
//   t < -125: the weight is 0             (e^x < 2^-125 * 1.42, x < -86.6)
//   k = t rounded to the nearest integer, ties to even: (t + 1.5 * 2^23) - 1.5 * 2^23
//   r = (x - k ln2_hi) - k ln2_lo         (two fused multiply-adds, |r| <~ ln(2) / 2;
//                                          ln2_hi has 9 bits, so k ln2_hi is exact)
//   p = e^r ~ ((((((c6 r + c5) r + c4) r + c3) r + c2) r + c1) r + 1), one
//       fused multiply-add per degree
//   w = p * 2^k                           (exact: 2^k is the low bits of
//                                          k + 2^23 + 127 shifted into the exponent)
// The c_i are the fit of e^r on [-ln(2)/2, ln(2)/2] with the least maximum
// relative error (2e-9); with the roundings of r and of Horner's steps, w
// is within 2 ulps of e^x (tested against long double). NaN gives NaN;
// -inf gives 0.
struct ExpWeight {
  static constexpr float kLog2e = 1.44269504088896341f;
  static constexpr float kLowest = -125.0f;
  static constexpr float kRound = 12582912.0f;    // 1.5 * 2^23: t + kRound rounds t
  static constexpr float kExponent = 8388735.0f;  // 2^23 + 127: its low bits are 127
  static constexpr float kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
  static constexpr float kC[6] = {
      1.0f, 4.999999404e-01f, 1.666643173e-01f, 4.166800156e-02f, 8.374155499e-03f, 1.384365372e-03f};
};

template <class Arch>
ROPE_ALWAYS_INLINE xsimd::batch<float, Arch> exp_weights(const xsimd::batch<float, Arch>& x) noexcept {
  using F = xsimd::batch<float, Arch>;
  using E = ExpWeight;
  const F t = x * F(E::kLog2e);
  const auto under = t < F(E::kLowest);  // false for NaN
  const F k = (xsimd::select(under, F(E::kLowest), t) + F(E::kRound)) - F(E::kRound);
  const F r = neg_mul_add(k, F(E::kLn2Lo), neg_mul_add(k, F(E::kLn2Hi), x));
  F p(E::kC[5]);
  for (int i = 4; i >= 0; --i) p = mul_add(p, r, F(E::kC[i]));
  p = mul_add(p, r, F(1.0f));
  return xsimd::select(under, F(0.0f), p * as_float(as_bits(k + F(E::kExponent)) << 23));
}

}  // namespace detail

// w_j = exp(s_j - m) for n scores of a softmax row whose running maximum is
// m; returns the sum of the weights (each lane's in order, then across the
// lanes, then the last n % lanes in order). With clear, s_j is set to 0 once
// read, so that a buffer of scores can take the next tile's GEMM without
// being zeroed first. The steps and their bound are detail::ExpWeight's:
// the same bits as reference::softmax_weights where Arch has fused
// multiply-adds. A weight below 2^-125 is 0, -inf gives 0, NaN gives NaN.
// Preconditions: s_j <= m or s_j is NaN; w is s (then clear is false) or
// overlaps it nowhere.
template <class Arch = xsimd::default_arch>
float softmax_weights_row(float* s, float* w, std::size_t n, float m, bool clear) noexcept {
  using F = xsimd::batch<float, Arch>;
  constexpr std::size_t lanes = F::size;
  const std::size_t full = n - n % lanes;
  const F mb(m);
  F total(0.0f);
  for (std::size_t j = 0; j < full; j += lanes) {
    const F e = detail::exp_weights<Arch>(F::load_unaligned(s + j) - mb);
    e.store_unaligned(w + j);
    if (clear) F(0.0f).store_unaligned(s + j);
    total = total + e;
  }
  float sum = detail::sum_lanes(total);
  if (full < n) {
    const std::size_t bytes = (n - full) * sizeof(float);
    const F e = detail::exp_weights<Arch>(detail::load_partial<F>(s + full, bytes) - mb);
    detail::store_partial(e, w + full, bytes);
    if (clear) detail::store_partial(F(0.0f), s + full, bytes);
    for (std::size_t j = full; j < n; ++j) sum += w[j];
  }
  return sum;
}

// y = RMSNorm(x) over n floats: r = 1 / sqrt(sum_squares8(x) / n + eps),
// y_c = (x_c * r) * w_c, or (x_c * r) * (1 + w_c) with plus_one
// (attention/append.hpp has the order and the models it follows). y may be
// x (in place). Preconditions: w holds n floats; eps > 0; y is x or
// overlaps neither x nor w.
template <class Arch = xsimd::default_arch>
void rms_norm_row(const float* x, std::size_t n, const float* w, float eps, bool plus_one, float* y) noexcept {
  const float r = rms_inverse<Arch>(sum_squares8<Arch>(x, n), n, eps);
  detail::scale_row<Arch>(x, n, r, w, plus_one, y);
}

// rms_norm_row of `rows` rows of n floats, one weight row for all: row i of
// x at x + i * x_stride into y + i * y_stride (y may be x), the same bits
// row by row, the sums of squares of four rows at a time
// (sum_squares8_rows). Preconditions: rms_norm_row's, for every row.
template <class Arch = xsimd::default_arch>
void rms_norm_rows(const float* x, std::size_t x_stride, std::size_t rows, std::size_t n, const float* w, float eps,
                   bool plus_one, float* y, std::size_t y_stride) noexcept {
  constexpr std::size_t kGroup = 16;
  float ss[kGroup];
  for (std::size_t i = 0; i < rows; i += kGroup) {
    const std::size_t m = rows - i < kGroup ? rows - i : kGroup;
    sum_squares8_rows<Arch>(x + i * x_stride, x_stride, m, n, ss);
    for (std::size_t j = 0; j < m; ++j) {
      const float r = rms_inverse<Arch>(ss[j], n, eps);
      detail::scale_row<Arch>(x + (i + j) * x_stride, n, r, w, plus_one, y + (i + j) * y_stride);
    }
  }
}

}  // namespace rope
