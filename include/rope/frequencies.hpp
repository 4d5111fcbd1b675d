// rope/frequencies.hpp — the rotation frequencies theta_p of each pair.
//
//   theta_p = inv_freq[p] = base^(-2p / rotary_dim),   p = 0 .. rotary_dim/2 - 1
//
// Pair p of a token at position m is rotated by m * theta_p. Everything here
// is double precision: tables and on-the-fly angles round to the tensor's
// type only after the angle and its cos/sin are computed.
#pragma once

#include <cmath>
#include <cstddef>
#include <stdexcept>
#include <string>
#include <vector>

namespace rope {

struct Frequencies {
  std::vector<double> inv_freq;    // rotary_dim/2 values, theta_p
  double attention_factor = 1.0;   // multiplies cos and sin in every table

  std::size_t rotary_dim() const noexcept { return 2 * inv_freq.size(); }
};

namespace detail {

inline void check_rotary_dim(std::size_t rotary_dim) {
  if (rotary_dim == 0 || rotary_dim % 2 != 0) {
    throw std::invalid_argument("rope::frequencies: rotary_dim must be even and positive, got " +
                                std::to_string(rotary_dim));
  }
}

inline void check_base(double base) {
  if (!(base > 1.0) || !std::isfinite(base)) {
    throw std::invalid_argument("rope::frequencies: base must be finite and > 1, got " +
                                std::to_string(base));
  }
}

// theta_p = base^(-2p/r), computed directly per p (no running product).
// The exponent -2p/r is not a double in general, and pow magnifies its
// rounding by ln(base) (~9 for 10^4): in double that costs up to 2 ulps.
// Evaluated in long double and rounded once, theta_p is within half an ulp
// plus the 2^-64 of the wider type on x86-64.
inline std::vector<double> default_inv_freq(std::size_t rotary_dim, double base) {
  std::vector<double> inv_freq(rotary_dim / 2);
  for (std::size_t p = 0; p < inv_freq.size(); ++p) {
    const long double exponent = -2.0L * static_cast<long double>(p) / static_cast<long double>(rotary_dim);
    inv_freq[p] = static_cast<double>(std::pow(static_cast<long double>(base), exponent));
  }
  return inv_freq;
}

}  // namespace detail

// The default schedule of RoFormer: theta_p = base^(-2p/rotary_dim).
// Throws std::invalid_argument for an odd or zero rotary_dim or base <= 1.
inline Frequencies frequencies(std::size_t rotary_dim, double base = 10000.0) {
  detail::check_rotary_dim(rotary_dim);
  detail::check_base(base);
  return Frequencies{detail::default_inv_freq(rotary_dim, base), 1.0};
}

}  // namespace rope
