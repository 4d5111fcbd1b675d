// rope/kernels/rms_norm.hpp — RMSNorm of a row of floats, in one fixed order
// that a plain loop reproduces bit for bit (the QK-norm of the fused step
// before attention, attention/pre_attention.hpp):
//
//   s_k = fma(x_c, x_c, s_k) for c = k, k + 8, k + 16, ... < n, k = 0 .. 7
//   ss = ((s_0 + s_4) + (s_2 + s_6)) + ((s_1 + s_5) + (s_3 + s_7))
//   r  = 1 / sqrt(ss / n + eps)
//   y_c = (x_c * r) * w_c          (or (x_c * r) * (1 + w_c): Gemma's form)
//
// Templated on the xsimd architecture Arch, as every kernel, so that units
// built with different flags never share a copy.
#pragma once

#include <cmath>
#include <cstddef>

#include "../detail/simd.hpp"
#include "../detail/xsimd.hpp"

namespace rope {

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