// Errors in ulps against a long-double oracle, for the accuracy statement of
// docs/design.md ("Accuracy of tables and angles").
//
// The library defines the angle of pair p at position m as the double
// product a = double(m) * inv_freq[p], one rounding; the entry is
// round_T(attention_factor * cos(a)). The oracle therefore takes that same
// double a and evaluates attention_factor * cos(a) in long double (64-bit
// significand on x86-64: its own error, ~2^-63 relative, is 2^-10 of an ulp
// of double and 2^-39 of an ulp of float, far below every bound asserted).
#pragma once

#include <cmath>
#include <cstddef>
#include <limits>

namespace rope_test {

// One ulp of T at the binade of `exact`: 2^(e - digits) for exact in
// [2^(e-1), 2^e); below T's smallest normal, the spacing of denormals.
template <class T>
long double ulp_at(long double exact) {
  const long double ax = std::fabs(exact);
  if (ax < static_cast<long double>(std::numeric_limits<T>::min())) {
    return static_cast<long double>(std::numeric_limits<T>::denorm_min());
  }
  int e = 0;
  std::frexp(ax, &e);
  return std::ldexp(1.0L, e - std::numeric_limits<T>::digits);
}

// |got - exact| in ulps of T at the exact value.
template <class T>
long double ulps(T got, long double exact) {
  return std::fabs(static_cast<long double>(got) - exact) / ulp_at<T>(exact);
}

// The library's angle: one double multiplication.
inline double library_angle(std::size_t m, double inv_freq) { return static_cast<double>(m) * inv_freq; }

inline long double exact_cos(std::size_t m, double inv_freq, double attention_factor) {
  return static_cast<long double>(attention_factor) * std::cos(static_cast<long double>(library_angle(m, inv_freq)));
}
inline long double exact_sin(std::size_t m, double inv_freq, double attention_factor) {
  return static_cast<long double>(attention_factor) * std::sin(static_cast<long double>(library_angle(m, inv_freq)));
}

}  // namespace rope_test
