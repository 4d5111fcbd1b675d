// rope/reference.hpp — the scalar row kernel, written straight from the math.
//
// For each pair p of the rotary part (channels a, b given by the pairing):
//   y_a = x_a cos_p - x_b sin_p,   y_b = x_b cos_p + x_a sin_p
// with sin_p negated for Direction::inverse. This is the oracle every SIMD
// kernel and tensor call is tested against; it favours plainness over speed.
//
// Layout: x and y hold one head vector, contiguous; cos and sin hold
// rotary_dim/2 values for one position (Table<T>::cos(m), Table<T>::sin(m)).
//
// The twins of attention's rows (kernels/attention_rows.hpp) are here too:
//   dot_rows:      scores[r * score_stride] = q_r . key
//   weighted_rows: acc_r += sum_j weight_(r, j) value_j, value by value in
//                  order j = 0, 1, ..., one fused multiply-add per channel.
//   softmax_weights: w_j = exp(s_j - m) in the steps of exp_weight below.
// and of the KV-cache rows (kernels/kv_rows.hpp), in channel order over
// stored values widened exactly (float, BFloat16, Float16, int8):
//   dot_kv:        scores[r * score_stride] = q_r . key (int8: before its scale)
//   weighted_kv:   acc_r += sum_j (w_rj * scale_j) value_j, in order j, one
//                  fused multiply-add per channel.
//   quantize_int8: one vector into int8 with its scale, value by value
//                  (the int8 store_kv_row).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>

#include "half.hpp"
#include "style.hpp"

namespace rope::reference {

// Rotates the first rotary_dim channels of x into y; y may equal x.
// Preconditions (unchecked): rotary_dim is even; x and y hold rotary_dim
// values, cos and sin hold rotary_dim/2. Channels past rotary_dim are not
// touched.
template <Style S, class T>
void rotate(const T* x, T* y, const T* cos, const T* sin, std::size_t rotary_dim,
            Direction dir = Direction::forward) noexcept {
  const std::size_t pairs = rotary_dim / 2;
  for (std::size_t p = 0; p < pairs; ++p) {
    const std::size_t a = first_channel<S>(p, rotary_dim);
    const std::size_t b = second_channel<S>(p, rotary_dim);
    const T c = cos[p];
    const T s = dir == Direction::forward ? sin[p] : -sin[p];
    const T xa = x[a];
    const T xb = x[b];
    y[a] = xa * c - xb * s;
    y[b] = xb * c + xa * s;
  }
}

// scores[r * score_stride] = sum_c q[r * d + c] * key[c], in channel order.
template <class T>
void dot_rows(const T* q, std::size_t rows, std::size_t d, const T* key, T* scores, std::size_t score_stride) noexcept {
  for (std::size_t r = 0; r < rows; ++r) {
    T total = 0;
    for (std::size_t c = 0; c < d; ++c) total += q[r * d + c] * key[c];
    scores[r * score_stride] = total;
  }
}

// acc[r * acc_stride + c] += weights[r * weight_stride + j] * values[j * value_stride + c]
// for j = 0 .. n-1 in order, each product added with one rounding (std::fma).
template <class T>
void weighted_rows(const T* weights, std::size_t weight_stride, std::size_t rows, std::size_t n, const T* values,
                   std::size_t value_stride, std::size_t dv, T* acc, std::size_t acc_stride) noexcept {
  for (std::size_t r = 0; r < rows; ++r) {
    for (std::size_t j = 0; j < n; ++j) {
      const T w = weights[r * weight_stride + j];
      for (std::size_t c = 0; c < dv; ++c) {
        T& a = acc[r * acc_stride + c];
        a = std::fma(w, values[j * value_stride + c], a);
      }
    }
  }
}

// scores[r * score_stride] = sum_c q[r * d + c] * key[c], in channel order,
// key widened exactly (int8: before its scale).
template <class E>
void dot_kv(const float* q, std::size_t rows, std::size_t d, const E* key, float* scores,
            std::size_t score_stride) noexcept {
  for (std::size_t r = 0; r < rows; ++r) {
    float total = 0;
    for (std::size_t c = 0; c < d; ++c) total += q[r * d + c] * detail::widen_value(key[c]);
    scores[r * score_stride] = total;
  }
}

// acc[r * acc_stride + c] += w_rj * values[j * value_stride + c] for j = 0 ..
// n-1 in order, w_rj = weights[r * weight_stride + j] (times
// value_scales[j * scale_stride],
// rounded once, when value_scales is set), each product added with one
// rounding (std::fma).
template <class E>
void weighted_kv(const float* weights, std::size_t weight_stride, std::size_t rows, std::size_t n, const E* values,
                 std::size_t value_stride, const float* value_scales, std::size_t scale_stride, std::size_t dv,
                 float* acc, std::size_t acc_stride) noexcept {
  for (std::size_t r = 0; r < rows; ++r) {
    for (std::size_t j = 0; j < n; ++j) {
      const float w = weights[r * weight_stride + j];
      const float wj = value_scales != nullptr ? w * value_scales[j * scale_stride] : w;
      for (std::size_t c = 0; c < dv; ++c) {
        float& a = acc[r * acc_stride + c];
        a = std::fma(wj, detail::widen_value(values[j * value_stride + c]), a);
      }
    }
  }
}

// e^x for x <= 0 (or NaN) as 2^k e^r: k the integer nearest x log2(e)
// (rounded; ties to even), r = x - k ln(2) in two steps (ln(2) split into 0.693359375 and
// the rest), e^r by its degree-6 polynomial fit on [-ln(2)/2, ln(2)/2] (the
// coefficients below) in Horner's order, each step one std::fma; x log2(e)
// < -125 gives 0. The steps of kernels/attention_rows.hpp's
// softmax_weights_row, one value at a time.
inline float exp_weight(float x) noexcept {
  static constexpr float c[6] = {
      1.0f, 4.999999404e-01f, 1.666643173e-01f, 4.166800156e-02f, 8.374155499e-03f, 1.384365372e-03f};
  const float t = x * 1.44269504088896341f;
  if (std::isnan(t)) return t;
  if (t < -125.0f) return 0.0f;
  const float k = std::nearbyint(t);
  const float r = std::fma(-k, -2.12194440e-4f, std::fma(-k, 0.693359375f, x));
  float p = c[5];
  for (int i = 4; i >= 0; --i) p = std::fma(p, r, c[i]);
  p = std::fma(p, r, 1.0f);
  return std::ldexp(p, static_cast<int>(k));
}

// w_j = exp(s_j - m) for n scores, value by value (exp_weight); returns
// their sum in order j = 0, 1, ...
inline float softmax_weights(const float* s, float* w, std::size_t n, float m) noexcept {
  float sum = 0.0f;
  for (std::size_t j = 0; j < n; ++j) {
    w[j] = exp_weight(s[j] - m);
    sum += w[j];
  }
  return sum;
}

// x (n floats) quantized symmetrically: *scale = s = max_c |x_c| / 127 (the
// least subnormal where that underflows for a nonzero vector; one float up
// where a subnormal quotient rounded down past max_c |x_c| / s = 127), q_c = x_c / s
// rounded to nearest even, clamped to [-127, 127]. All zeros: s = 0, q = 0.
// A NaN or an infinity anywhere: s = NaN, q = 0.
inline void quantize_int8(const float* x, std::size_t n, std::int8_t* out, float* scale) noexcept {
  float m = 0.0f;
  bool finite = true;
  for (std::size_t c = 0; c < n; ++c) {
    finite = finite && std::isfinite(x[c]);
    m = std::max(m, std::fabs(x[c]));
  }
  if (!finite) {
    std::fill_n(out, n, std::int8_t(0));
    *scale = std::numeric_limits<float>::quiet_NaN();
    return;
  }
  float s = m > 0.0f && m / 127.0f == 0.0f ? std::numeric_limits<float>::denorm_min() : m / 127.0f;
  if (s < std::numeric_limits<float>::min() && m / s > 127.0f) s = std::nextafter(s, 1.0f);
  *scale = s;
  for (std::size_t c = 0; c < n; ++c) {
    const float q = s > 0.0f ? std::nearbyint(x[c] / s) : 0.0f;
    out[c] = static_cast<std::int8_t>(std::min(127.0f, std::max(-127.0f, q)));
  }
}

}  // namespace rope::reference
