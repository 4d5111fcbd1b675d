// Oracles of the attention tests, written from the math in long double and
// independent of rope::attention: RoPE of one vector from the exact angles,
// naive softmax attention, and the quadratic forms of linear attention.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include <rope/attention.hpp>
#include <rope/frequencies.hpp>
#include <rope/style.hpp>

namespace attention_test {

using LD = long double;
using Mat = std::vector<std::vector<LD>>;  // row per token

template <class T>
rope::attention::Matrix<T> random_matrix(std::size_t rows, std::size_t cols, std::uint32_t seed, double scale = 1.0) {
  std::mt19937 gen(seed);
  std::normal_distribution<double> dist(0.0, scale);
  rope::attention::Matrix<T> m(static_cast<Eigen::Index>(rows), static_cast<Eigen::Index>(cols));
  for (Eigen::Index i = 0; i < m.rows(); ++i) {
    for (Eigen::Index j = 0; j < m.cols(); ++j) m(i, j) = static_cast<T>(dist(gen));
  }
  return m;
}

template <class Derived>
Mat to_ld(const Eigen::MatrixBase<Derived>& x) {
  Mat m(static_cast<std::size_t>(x.rows()), std::vector<LD>(static_cast<std::size_t>(x.cols())));
  for (Eigen::Index i = 0; i < x.rows(); ++i) {
    for (Eigen::Index j = 0; j < x.cols(); ++j) m[i][j] = static_cast<LD>(x(i, j));
  }
  return m;
}

inline std::vector<std::int64_t> iota_positions(std::size_t n) {
  std::vector<std::int64_t> p(n);
  for (std::size_t i = 0; i < n; ++i) p[i] = static_cast<std::int64_t>(i);
  return p;
}

inline std::vector<std::int64_t> random_positions(std::size_t n, std::int64_t limit, std::uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<std::int64_t> dist(0, limit - 1);
  std::vector<std::int64_t> p(n);
  for (auto& x : p) x = dist(gen);
  return p;
}

// RoPE of x at position p (any integer, negative too) from the angles
// p * inv_freq[t], over the first 2 * inv_freq.size() channels.
inline std::vector<LD> rotate(const std::vector<LD>& x, const std::vector<double>& inv_freq, rope::Style style,
                              LD position) {
  std::vector<LD> y = x;
  const std::size_t r = 2 * inv_freq.size();
  for (std::size_t p = 0; p < inv_freq.size(); ++p) {
    const std::size_t a = style == rope::Style::rotate_half ? p : 2 * p;
    const std::size_t b = style == rope::Style::rotate_half ? p + r / 2 : 2 * p + 1;
    const LD angle = position * static_cast<LD>(inv_freq[p]);
    const LD c = std::cos(angle), s = std::sin(angle);
    y[a] = x[a] * c - x[b] * s;
    y[b] = x[b] * c + x[a] * s;
  }
  return y;
}

inline LD dot(const std::vector<LD>& a, const std::vector<LD>& b) {
  LD s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// What a softmax does to its scores besides the mask: the logit softcap
// (0: none) and one head's attention sink (-inf: none).
struct Logits {
  LD softcap = 0;
  LD sink = -std::numeric_limits<LD>::infinity();
};

// Naive softmax attention with the scores of E5: q_i . R_(pk_j - pq_i) k_j * scale
// (freqs empty: no rotation) over the keys visible(i, j) says, each score
// capped to cap * tanh(s / cap) when logits.softcap is set, and the sink's
// exp(sink - M) added to the denominator (M the max of the sink and the
// visible scores). A query with no visible key gives a zero row.
template <class Visible>
Mat naive_softmax_masked(const Mat& q, const Mat& k, const Mat& v, const std::vector<double>& inv_freq,
                         rope::Style style, const std::vector<std::int64_t>& pq, const std::vector<std::int64_t>& pk,
                         LD scale, Visible visible, Logits logits = {}) {
  Mat out(q.size(), std::vector<LD>(v[0].size(), 0));
  for (std::size_t i = 0; i < q.size(); ++i) {
    std::vector<LD> s(k.size(), -std::numeric_limits<LD>::infinity());
    LD top = -std::numeric_limits<LD>::infinity();
    bool sees = false;
    for (std::size_t j = 0; j < k.size(); ++j) {
      if (!visible(i, j)) continue;
      const auto kr = inv_freq.empty() ? k[j] : rotate(k[j], inv_freq, style, LD(pk[j] - pq[i]));
      s[j] = dot(q[i], kr) * scale;
      if (logits.softcap > 0) s[j] = logits.softcap * std::tanh(s[j] / logits.softcap);
      top = std::max(top, s[j]);
      sees = true;
    }
    if (!sees) continue;
    top = std::max(top, logits.sink);
    if (top == -std::numeric_limits<LD>::infinity()) continue;
    LD sum = logits.sink == -std::numeric_limits<LD>::infinity() ? LD(0) : std::exp(logits.sink - top);
    for (std::size_t j = 0; j < k.size(); ++j) {
      if (!visible(i, j)) continue;
      const LD w = std::exp(s[j] - top);
      sum += w;
      for (std::size_t c = 0; c < v[j].size(); ++c) out[i][c] += w * v[j][c];
    }
    for (auto& x : out[i]) x /= sum;
  }
  return out;
}

// The same with the causal mask alone: key j visible iff pk_j <= pq_i.
inline Mat naive_softmax(const Mat& q, const Mat& k, const Mat& v, const std::vector<double>& inv_freq,
                         rope::Style style, const std::vector<std::int64_t>& pq, const std::vector<std::int64_t>& pk,
                         LD scale, bool causal) {
  return naive_softmax_masked(q, k, v, inv_freq, style, pq, pk, scale,
                              [&](std::size_t i, std::size_t j) { return !causal || pk[j] <= pq[i]; });
}

// One query row of softmax attention from its exact scores s_j (the keys it
// sees, in order), their value rows v[j] (dv values each) and the sink
// (-inf: none), as logits.hpp writes it:
//   out = sum_j p_j v_j,  p_j = exp(s_j - lse),  lse = log(exp(sink) + sum_j exp(s_j))
// A row that sees no key: zeros, lse = the sink (-inf without one).
struct SoftmaxRow {
  std::vector<LD> out;
  LD lse = -std::numeric_limits<LD>::infinity();
  std::vector<LD> p;  // the weight of each key
  LD p_sink = 0;      // the sink's share of the denominator
};

inline SoftmaxRow softmax_row(const std::vector<LD>& s, const Mat& v, std::size_t dv, LD sink) {
  const LD neg_inf = -std::numeric_limits<LD>::infinity();
  SoftmaxRow r;
  r.out.assign(dv, 0);
  if (s.empty()) {
    r.lse = sink;
    return r;
  }
  LD top = sink;
  for (const LD x : s) top = std::max(top, x);
  LD sum = sink == neg_inf ? LD(0) : std::exp(sink - top);
  for (const LD x : s) sum += std::exp(x - top);
  r.lse = top + std::log(sum);
  r.p_sink = sink == neg_inf ? LD(0) : std::exp(sink - r.lse);
  for (std::size_t j = 0; j < s.size(); ++j) {
    r.p.push_back(std::exp(s[j] - r.lse));
    for (std::size_t c = 0; c < dv; ++c) r.out[c] += r.p[j] * v[j][c];
  }
  return r;
}

// The merge of two partial softmax states over disjoint keys (state.hpp),
// from the math: lse = log(exp(lse_a) + exp(lse_b)), out = exp(lse_a - lse)
// out_a + exp(lse_b - lse) out_b; a part with lse -inf is left out, two
// such give zeros and -inf.
inline void merge_states(const std::vector<LD>& out_a, LD lse_a, const std::vector<LD>& out_b, LD lse_b,
                         std::vector<LD>* out, LD* lse) {
  const LD neg_inf = -std::numeric_limits<LD>::infinity();
  out->assign(out_a.size(), 0);
  if (lse_a == neg_inf && lse_b == neg_inf) {
    *lse = neg_inf;
    return;
  }
  const LD top = std::max(lse_a, lse_b);
  *lse = top + std::log(std::exp(lse_a - top) + std::exp(lse_b - top));
  const LD wa = lse_a == neg_inf ? LD(0) : std::exp(lse_a - *lse);
  const LD wb = lse_b == neg_inf ? LD(0) : std::exp(lse_b - *lse);
  for (std::size_t c = 0; c < out_a.size(); ++c) (*out)[c] = wa * out_a[c] + wb * out_b[c];
}

// gamma_n = n u / (1 - n u) for float's unit roundoff u = 2^-24: the bound
// on the relative error of a value after n roundings, each by a factor in
// [1 - u, 1 + u] (Higham, Accuracy and Stability, lemma 3.1).
inline double gamma_float(double n) {
  const double u = std::numeric_limits<float>::epsilon() / 2;
  return n * u / (1 - n * u);
}

inline LD guard(LD r, LD delta) { return std::fabs(r) <= delta ? r + 2 * delta : r; }

// out = (N V) / g(rowsum(D)), N_ij = qn_i . kn_j, D_ij = qd_i . kd_j, tril'd when
// causal: key j is summed for query i iff pk_j <= pq_i (positions given) or
// j <= i (none given).
inline Mat quadratic(const Mat& qn, const Mat& qd, const Mat& kn, const Mat& kd, const Mat& v, bool causal,
                     LD delta = 1e-6L, const std::vector<std::int64_t>& pq = {},
                     const std::vector<std::int64_t>& pk = {}) {
  Mat out(qn.size(), std::vector<LD>(v[0].size(), 0));
  for (std::size_t i = 0; i < qn.size(); ++i) {
    LD den = 0;
    for (std::size_t j = 0; j < kn.size(); ++j) {
      if (causal && (pq.empty() ? j > i : pk[j] > pq[i])) continue;
      const LD n = dot(qn[i], kn[j]);
      den += dot(qd[i], kd[j]);
      for (std::size_t c = 0; c < v[j].size(); ++c) out[i][c] += n * v[j][c];
    }
    for (auto& x : out[i]) x /= guard(den, delta);
  }
  return out;
}

// Distinct positions in increasing order, n of them below limit.
inline std::vector<std::int64_t> increasing_positions(std::size_t n, std::int64_t limit, std::uint32_t seed) {
  std::vector<std::int64_t> all(static_cast<std::size_t>(limit));
  for (std::size_t i = 0; i < all.size(); ++i) all[i] = static_cast<std::int64_t>(i);
  std::mt19937 gen(seed);
  std::shuffle(all.begin(), all.end(), gen);
  all.resize(n);
  std::sort(all.begin(), all.end());
  return all;
}

// max |got - want| / max |want|: the relative error of a whole output.
template <class Derived>
double relative_error(const Eigen::MatrixBase<Derived>& got, const Mat& want) {
  LD err = 0, mag = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    for (std::size_t c = 0; c < want[i].size(); ++c) {
      err = std::max(err, std::fabs(static_cast<LD>(got(static_cast<Eigen::Index>(i), static_cast<Eigen::Index>(c))) -
                                    want[i][c]));
      mag = std::max(mag, std::fabs(want[i][c]));
    }
  }
  return static_cast<double>(err / mag);
}

template <class A, class B>
double relative_error(const Eigen::MatrixBase<A>& got, const Eigen::MatrixBase<B>& want) {
  return relative_error(got, to_ld(want));
}

// Tolerance of an exact oracle: rel. 1e-12 in double, 1e-5 in float.
template <class T>
constexpr double exact_tolerance() {
  return std::is_same<T, double>::value ? 1e-12 : 1e-5;
}

}  // namespace attention_test
