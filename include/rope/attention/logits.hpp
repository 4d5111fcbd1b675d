// rope/attention/logits.hpp — what turns a query-key product into a softmax
// logit (Logits), checked in one place for every softmax call, and the end
// of every softmax row: the sink joins, the row is divided, its log-sum-exp
// is taken.
//
// In this order, for query i of head h and each key j it sees:
//   s_ij = scale * q_i . k_j                  (scale: logits.scale, else 1/sqrt(head_dim))
//   s_ij <- cap * tanh(s_ij / cap)            (logits.softcap set: Gemma 2, Grok)
//   j kept only if query i sees it            (the mask, after the cap: masks.hpp)
//   out_i = sum_j exp(s_ij - M) v_j / (exp(sink_h - M) + sum_j exp(s_ij - M))
//   lse_i = M + log(exp(sink_h - M) + sum_j exp(s_ij - M))
// with sink_h the sink of head h (logits.sinks set: gpt-oss; a logit in the
// denominator only, never a value) and M the largest of the sink and the
// visible scores. A query that sees no key gets a zero row, and lse -inf
// (or its sink).
#pragma once

#include <cmath>
#include <cstddef>
#include <limits>
#include <optional>
#include <type_traits>
#include <vector>

#include "../detail/fail.hpp"
#include "../detail/simd.hpp"

namespace rope::attention {

struct Logits {
  std::optional<double> scale;    // empty: 1/sqrt(head_dim); set: finite (in the arithmetic's type too)
  std::optional<double> softcap;  // set: finite and > 0 (in the arithmetic's type too)
  // Empty: no sinks. Else one logit per query head, in the denominator
  // only; -inf is "no sink" for that head; NaN and +inf (also after
  // rounding to the arithmetic's type) are refused.
  std::vector<double> sinks;
};

namespace detail {

using rope::detail::fail;

// Logits, checked, in the type T of the arithmetic (float for the serving
// path; float or double for the one-head softmax).
template <class T>
struct LogitParams {
  T scale = 1;
  T softcap = 0;                  // 0: none
  const double* sinks = nullptr;  // the caller's, checked; null: none

  // Head h's sink in T, or -inf for none.
  T sink(std::size_t h) const noexcept {
    return sinks != nullptr ? static_cast<T>(sinks[h]) : -std::numeric_limits<T>::infinity();
  }
};

// The one check of Logits (`name`: how the caller spells the argument), for
// q_heads query heads of head_dim channels.
template <class T>
LogitParams<T> check_logits(const char* fn, const char* name, const Logits& logits, std::size_t q_heads,
                            std::size_t head_dim) {
  static_assert(std::is_floating_point<T>::value, "logits are taken in float or double");
  LogitParams<T> p;
  double scale = 1.0 / std::sqrt(static_cast<double>(head_dim));
  if (logits.scale) {
    if (!std::isfinite(*logits.scale) || !std::isfinite(static_cast<T>(*logits.scale))) {
      fail(fn, {name, ".scale"}, "finite", *logits.scale);
    }
    scale = *logits.scale;
  }
  p.scale = static_cast<T>(scale);
  if (logits.softcap) {
    const double cap = *logits.softcap;
    const auto rounded = static_cast<T>(cap);
    if (!(cap > 0) || !std::isfinite(cap) || !std::isfinite(rounded) || !(rounded > 0)) {
      fail(fn, {name, ".softcap"}, "finite and > 0", cap);
    }
    p.softcap = rounded;
  }
  if (!logits.sinks.empty()) {
    if (logits.sinks.size() != q_heads) {
      fail(fn, {name, ".sinks.size()"}, {"0 or the query heads ", q_heads}, logits.sinks.size());
    }
    const T neg_inf = -std::numeric_limits<T>::infinity();
    for (std::size_t h = 0; h < q_heads; ++h) {
      const auto sink = static_cast<T>(logits.sinks[h]);
      if (!std::isfinite(sink) && sink != neg_inf)
        fail(fn, {name, ".sinks[", h, "]"}, "finite or -inf", logits.sinks[h]);
    }
    p.sinks = logits.sinks.data();
  }
  return p;
}

// The factors that end one softmax row from its online state (m, l: the
// max and sum_j exp(s_j - m) over the keys it saw) and sink s (-inf: none):
// the row is acc * num / den, its log-sum-exp top + log(den). Without a
// sink num = 1, den = l, top = m; with one top = max(m, s), num =
// exp(m - top), den = l num + exp(s - top).
template <class T>
struct RowEnd {
  T num, den, top;
};
template <class T>
RowEnd<T> softmax_row_end(T m, T l, T sink) noexcept {
  RowEnd<T> e{T(1), l, m};
  if (sink != -std::numeric_limits<T>::infinity()) {
    e.top = sink > m ? sink : m;
    e.num = std::exp(m - e.top);
    e.den = l * e.num + std::exp(sink - e.top);
  }
  return e;
}

// The end of one softmax row from its online state (m, l, acc: the max,
// sum_j exp(s_j - m) and sum_j exp(s_j - m) v_j over the keys it saw), with
// sink s (-inf: none): row = acc * num / den into out (n values) and the
// log-sum-exp into *lse (when lse is set). sees = false: the query saw no
// key, a zero row.
template <class T>
void finish_softmax_row(T m, T l, const T* acc, std::size_t n, T sink, bool sees, T* out, float* lse) noexcept {
  if (!sees) {
    for (std::size_t c = 0; c < n; ++c) out[c] = T(0);
    if (lse != nullptr) *lse = static_cast<float>(sink);
    return;
  }
  const RowEnd<T> e = softmax_row_end(m, l, sink);
  for (std::size_t c = 0; c < n; ++c) out[c] = acc[c] * e.num / e.den;
  if (lse != nullptr) *lse = static_cast<float>(e.top + std::log(e.den));
}

// finish_softmax_row of a float row in Arch's vectors: each value's product
// and quotient rounded as the scalar loop rounds them (IEEE division lane by
// lane), so the same bytes (the scalar loop's divisions took a tenth of a
// prompt's time on AMX tiles; in vectors the prompt ran 5% faster). On x86 only:
// xsimd 8.1's float division on Arm is a reciprocal estimate refined, not
// IEEE's quotient; there, the scalar loop.
template <class Arch>
void finish_float_row(float m, float l, const float* acc, std::size_t n, float sink, bool sees, float* out,
                      float* lse) noexcept {
  constexpr bool ieee_division = std::is_base_of<xsimd::sse2, Arch>::value ||
                                 std::is_base_of<xsimd::avx, Arch>::value ||
                                 std::is_base_of<xsimd::avx512f, Arch>::value;
  if constexpr (ieee_division) {
    if (sees) {
      using F = xsimd::batch<float, Arch>;
      const RowEnd<float> e = softmax_row_end(m, l, sink);
      const F num(e.num), den(e.den);
      std::size_t c = 0;
      for (; c + F::size <= n; c += F::size) {
        (F::load_unaligned(acc + c) * num / den).store_unaligned(out + c);
      }
      for (; c < n; ++c) out[c] = acc[c] * e.num / e.den;
      if (lse != nullptr) *lse = static_cast<float>(e.top + std::log(e.den));
      return;
    }
  }
  finish_softmax_row<float>(m, l, acc, n, sink, sees, out, lse);
}

}  // namespace detail
}  // namespace rope::attention
