// rope/kernels/scores.hpp — what softmax does to a row of scores, and the
// running state (max, sum) every online softmax in rope keeps.
//
//   max_row:             m = max_j s_j                       (NaNs skipped)
//   softcap_row:         s_j <- cap * tanh(s_j / cap)
//   multiply_row:        x_j <- x_j * y_j
//   softmax_weights_row: w_j = exp(s_j - m), and their sum
//   carry, merge_state:  sums kept relative to one max carried to another
//
// An online softmax keeps, per query row, the running max m of the scores
// seen, l = sum_j exp(s_j - m) and acc = sum_j exp(s_j - m) v_j. Seeing a
// larger max m' scales l and acc by carry(m, m') = exp(m - m'); two partial
// states over disjoint keys merge into the state of their union
// (merge_state). Every path of the attention module — the decode loop, the
// split parts of a decode token, the GEMM tiles, the public merge of (out,
// log-sum-exp) pairs — goes through these two.
#pragma once

#include <cmath>
#include <cstddef>
#include <limits>

#include "../detail/inline.hpp"
#include "../detail/simd.hpp"
#include "../detail/xsimd.hpp"

namespace rope {

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
namespace detail {

// exp(m_old - m_new), the factor that carries sums kept relative to the max
// m_old to the max m_new >= m_old: 1 where the two are equal (both -inf
// included: nothing was kept), 0 from -inf to a finite max.
template <class T>
ROPE_ALWAYS_INLINE T carry(T m_old, T m_new) noexcept {
  return m_old == m_new ? T(1) : std::exp(m_old - m_new);
}

// Merges the partial state (mb, lb, acc_b) of some keys into (m, l, acc) of
// others, n values of acc each: the state of the union of the keys, carried
// to the larger max. The order matters to the last bit (a then b); an empty
// state (-inf, 0, zeros) changes nothing.
template <class T>
void merge_state(T& m, T& l, T* acc, T mb, T lb, const T* acc_b, std::size_t n) noexcept {
  const T m_new = mb > m ? mb : m;
  const T carried = carry(m, m_new);
  const T weight = carry(mb, m_new);
  l = l * carried + lb * weight;
  for (std::size_t c = 0; c < n; ++c) acc[c] = acc[c] * carried + acc_b[c] * weight;
  m = m_new;
}

}  // namespace detail
}  // namespace rope
