// rope/angles.hpp — one position's cos/sin row on the fly, for decode steps
// and positions beyond any table.
//
//   cos_out[p] = attention_factor * cos(m * theta_p),
//   sin_out[p] = attention_factor * sin(m * theta_p),   p = 0 .. rotary_dim/2 - 1
//
// The same computation as a rope::Table row (double angle, double cos/sin,
// one rounding to T), so the values equal that row bit for bit: a decoder may
// switch from a table to on-the-fly angles at any position without a seam.
// Accuracy: docs/design.md ("Accuracy of tables and angles").
// cos_out and sin_out each hold rotary_dim/2 contiguous values.
#pragma once

#include <cstddef>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "detail/fail.hpp"
#include "detail/sincos.hpp"
#include "frequencies.hpp"

namespace rope {

// Positions above 2^53 are not exact doubles: m * theta_p would be the angle
// of a neighbouring position.
inline constexpr std::size_t kMaxExactPosition = std::size_t{1} << 53;

// Throws rope::invalid_argument for empty frequencies or a null output and
// rope::out_of_range for position > 2^53; a throwing call writes nothing.
template <class T>
void angles(const Frequencies& freqs, std::size_t position, T* cos_out, T* sin_out) {
  static_assert(std::is_same<T, float>::value || std::is_same<T, double>::value,
                "rope::angles<T>: T must be float or double");
  const char* fn = "rope::angles";
  if (freqs.inv_freq.empty()) detail::fail(fn, "freqs.inv_freq", "non-empty", "empty");
  if (cos_out == nullptr) detail::fail(fn, "cos_out", "non-null", nullptr);
  if (sin_out == nullptr) detail::fail(fn, "sin_out", "non-null", nullptr);
  if (position > kMaxExactPosition) detail::fail<rope::out_of_range>(fn, "position", "<= 2^53", position);
  detail::sincos_row<T>(freqs.inv_freq.data(), freqs.inv_freq.size(), static_cast<double>(position),
                        freqs.attention_factor, cos_out, sin_out);
}

}  // namespace rope
