// rope/table.hpp — the cos/sin cache: one row of rotary_dim/2 pairs per position.
//
//   cos(m)[p] = attention_factor * cos(m * theta_p),
//   sin(m)[p] = attention_factor * sin(m * theta_p)
//
// Each angle m * theta_p is one double multiplication (never a running sum,
// whose error grows with m), its cos/sin is taken in double, and the result
// is rounded once to T. A float table is therefore within half an ulp of the
// exact value plus ~1e-16 relative: under 2^-24 absolute at any position,
// where angles accumulated in float are already off by ~1e-2 at m = 1e5.
//
// Layout: position m owns a block of rotary_dim values: rotary_dim/2 cosines,
// then rotary_dim/2 sines, so one row kernel call touches one cache-friendly
// block.
#pragma once

#include <cmath>
#include <cstddef>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "frequencies.hpp"

namespace rope {

template <class T = float>
class Table {
  static_assert(std::is_same<T, float>::value || std::is_same<T, double>::value,
                "rope::Table<T>: T must be float or double (16-bit tables lose the angle)");

 public:
  using value_type = T;

  // Builds rows for positions 0 .. positions-1.
  Table(const Frequencies& freqs, std::size_t positions)
      : pairs_(freqs.inv_freq.size()),
        positions_(positions),
        attention_factor_(freqs.attention_factor) {
    if (pairs_ == 0) {
      throw std::invalid_argument("rope::Table: freqs.inv_freq is empty");
    }
    data_.resize(positions * 2 * pairs_);
    for (std::size_t m = 0; m < positions; ++m) {
      T* c = data_.data() + m * 2 * pairs_;
      T* s = c + pairs_;
      for (std::size_t p = 0; p < pairs_; ++p) {
        const double angle = static_cast<double>(m) * freqs.inv_freq[p];
        c[p] = static_cast<T>(attention_factor_ * std::cos(angle));
        s[p] = static_cast<T>(attention_factor_ * std::sin(angle));
      }
    }
  }

  // rotary_dim/2 values for position m; m < positions() (unchecked).
  const T* cos(std::size_t m) const noexcept { return data_.data() + m * 2 * pairs_; }
  const T* sin(std::size_t m) const noexcept { return cos(m) + pairs_; }

  std::size_t positions() const noexcept { return positions_; }
  std::size_t rotary_dim() const noexcept { return 2 * pairs_; }
  double attention_factor() const noexcept { return attention_factor_; }

 private:
  std::size_t pairs_;
  std::size_t positions_;
  double attention_factor_;
  std::vector<T> data_;
};

}  // namespace rope
