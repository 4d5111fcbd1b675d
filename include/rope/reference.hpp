// rope/reference.hpp — the scalar row kernel, written straight from the math.
//
// For each pair p of the rotary part (channels a, b given by the pairing):
//   y_a = x_a cos_p - x_b sin_p,   y_b = x_b cos_p + x_a sin_p
// with sin_p negated for Direction::inverse. This is the oracle every SIMD
// kernel and tensor call is tested against; it favours plainness over speed.
//
// Layout: x and y hold one head vector, contiguous; cos and sin hold
// rotary_dim/2 values for one position (Table<T>::cos(m), Table<T>::sin(m)).
#pragma once

#include <cstddef>

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

}  // namespace rope::reference
