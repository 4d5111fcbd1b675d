// rope/kernels.hpp — the SIMD row kernels: one head vector, one position.
//
// Same contract and math as rope::reference::rotate (see reference.hpp):
//   y_a = x_a cos_p - x_b sin_p,   y_b = x_b cos_p + x_a sin_p
// for the pairs (a, b) of the chosen pairing; sin negated for the inverse.
// Written once, templated on the element type T and the xsimd architecture
// Arch (default: the best one the compiler flags enable). Each step handles
// B::size pairs; the last pairs (fewer than B::size) run through the same
// step on a zero-padded stack copy, so every pair of a row is rounded by the
// same instructions whatever its index.
//
//   rotate_half:    lanes of x[p..] pair with lanes of x[p + r/2 ..], so the
//                   loop is four loads, two fused multiply-adds, two stores.
//   block_diagonal: pairs are adjacent lanes; cos/sin are widened to pairs
//                   with a constant swizzle and the partner lane comes from
//                   an adjacent-lane swap, with the sign of sin alternating.
// Both pairings compute each pair with the same operations, so they give
// bit-identical results up to the channel permutation.
#pragma once

#include <algorithm>
#include <cstddef>
#include <type_traits>
#include <utility>

#include <xsimd/xsimd.hpp>

#include "detail/simd.hpp"
#include "style.hpp"

#if defined(_MSC_VER)
#define ROPE_NOINLINE __declspec(noinline)
#else
#define ROPE_NOINLINE __attribute__((noinline))
#endif

namespace rope {
namespace detail {

// One step of rotate_half: n pairs whose first channels start at xa and
// second channels at xb. Two fused multiply-adds per batch of pairs.
template <bool Inverse, class T, class Arch>
inline void rotate_half_step(const T* xa, const T* xb, const T* cos, const T* sin, T* ya,
                             T* yb) noexcept {
  using B = xsimd::batch<T, Arch>;
  const B c = B::load_unaligned(cos);
  const B s = Inverse ? -B::load_unaligned(sin) : B::load_unaligned(sin);
  const B a = B::load_unaligned(xa);
  const B b = B::load_unaligned(xb);
  xsimd::fnma(b, s, a * c).store_unaligned(ya);  // a c - b s
  xsimd::fma(a, s, b * c).store_unaligned(yb);   // b c + a s
}

// One step of block_diagonal: n adjacent pairs, the 2n channels at x.
// y = x c + swap(x) (-s, +s, ...) lane by lane: the same two operations per
// pair as rotate_half_step, so both pairings round identically.
template <bool Inverse, class T, class Arch>
inline void block_diagonal_step(const T* x, const T* cos, const T* sin, T* y) noexcept {
  using B = xsimd::batch<T, Arch>;
  constexpr std::size_t n = B::size;
  const B sign = alternating<T, Arch>(Inverse ? T(1) : T(-1), Inverse ? T(-1) : T(1));
  const B c = B::load_unaligned(cos);
  const B s = B::load_unaligned(sin);
  const B x0 = B::load_unaligned(x);
  const B x1 = B::load_unaligned(x + n);
  xsimd::fma(swap_adjacent(x0), duplicate_low(s) * sign, x0 * duplicate_low(c)).store_unaligned(y);
  xsimd::fma(swap_adjacent(x1), duplicate_high(s) * sign, x1 * duplicate_high(c))
      .store_unaligned(y + n);
}

// The last pairs (from p to pairs, fewer than n) go through the same step on
// a zero-padded copy, so the tail rounds exactly like the body and nothing
// outside the row is touched. Kept out of line: its stack buffers would
// otherwise give every call a stack frame, which costs more than the loop
// itself on rows of 64 or 128 channels.
template <bool Inverse, class T, class Arch>
ROPE_NOINLINE void rotate_half_tail(const T* x, T* y, const T* cos, const T* sin, std::size_t p,
                                    std::size_t pairs) noexcept {
  constexpr std::size_t n = xsimd::batch<T, Arch>::size;
  const std::size_t rest = pairs - p;
  T a[n] = {}, b[n] = {}, c[n] = {}, s[n] = {};
  std::copy_n(x + p, rest, a);
  std::copy_n(x + pairs + p, rest, b);
  std::copy_n(cos + p, rest, c);
  std::copy_n(sin + p, rest, s);
  rotate_half_step<Inverse, T, Arch>(a, b, c, s, a, b);
  std::copy_n(a, rest, y + p);
  std::copy_n(b, rest, y + pairs + p);
}

template <bool Inverse, class T, class Arch>
ROPE_NOINLINE void block_diagonal_tail(const T* x, T* y, const T* cos, const T* sin, std::size_t p,
                                       std::size_t pairs) noexcept {
  constexpr std::size_t n = xsimd::batch<T, Arch>::size;
  const std::size_t rest = pairs - p;
  T v[2 * n] = {}, c[n] = {}, s[n] = {};
  std::copy_n(x + 2 * p, 2 * rest, v);
  std::copy_n(cos + p, rest, c);
  std::copy_n(sin + p, rest, s);
  block_diagonal_step<Inverse, T, Arch>(v, c, s, v);
  std::copy_n(v, 2 * rest, y + 2 * p);
}

template <bool Inverse, class T, class Arch>
inline void rotate_row(const T* x, T* y, const T* cos, const T* sin, std::size_t pairs,
                       std::integral_constant<Style, Style::rotate_half>) noexcept {
  constexpr std::size_t n = xsimd::batch<T, Arch>::size;
  std::size_t p = 0;
  for (; p + n <= pairs; p += n) {
    rotate_half_step<Inverse, T, Arch>(x + p, x + pairs + p, cos + p, sin + p, y + p, y + pairs + p);
  }
  if (p < pairs) rotate_half_tail<Inverse, T, Arch>(x, y, cos, sin, p, pairs);
}

template <bool Inverse, class T, class Arch>
inline void rotate_row(const T* x, T* y, const T* cos, const T* sin, std::size_t pairs,
                       std::integral_constant<Style, Style::block_diagonal>) noexcept {
  constexpr std::size_t n = xsimd::batch<T, Arch>::size;
  std::size_t p = 0;
  for (; p + n <= pairs; p += n) {
    block_diagonal_step<Inverse, T, Arch>(x + 2 * p, cos + p, sin + p, y + 2 * p);
  }
  if (p < pairs) block_diagonal_tail<Inverse, T, Arch>(x, y, cos, sin, p, pairs);
}

}  // namespace detail

// Rotates the first rotary_dim channels of the head vector x into y.
//
// Preconditions (unchecked; the tensor API in apply.hpp checks them):
//   - rotary_dim is even;
//   - x and y each hold rotary_dim values; y == x is allowed (in place), any
//     other overlap is not;
//   - cos and sin each hold rotary_dim/2 values (one table row);
//   - no alignment is required.
// Nothing past x[rotary_dim-1] or y[rotary_dim-1] is read or written.
template <Style S, class T, class Arch = xsimd::default_arch>
void rotate(const T* x, T* y, const T* cos, const T* sin, std::size_t rotary_dim,
            Direction dir = Direction::forward) noexcept {
  const std::size_t pairs = rotary_dim / 2;
  const std::integral_constant<Style, S> style{};
  if (dir == Direction::forward) {
    detail::rotate_row<false, T, Arch>(x, y, cos, sin, pairs, style);
  } else {
    detail::rotate_row<true, T, Arch>(x, y, cos, sin, pairs, style);
  }
}

}  // namespace rope

