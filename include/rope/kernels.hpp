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
// Both pairings compute each pair from the same two products; they agree up
// to the channel permutation within the rounding of one fused multiply-add.
//
// Many heads share one position. For block_diagonal, widening the table row
// once per position (widen_row) and rotating every head with rotate_wide
// moves the cos/sin swizzles out of the per-head loop: one lane swap per
// batch remains, as cheap per head as rotate_half.
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

namespace detail {

template <class T, class Arch>
inline void rotate_wide_step(const T* x, const T* cos2, const T* sin2, T* y) noexcept {
  using B = xsimd::batch<T, Arch>;
  const B v = B::load_unaligned(x);
  xsimd::fma(swap_adjacent(v), B::load_unaligned(sin2), v * B::load_unaligned(cos2))
      .store_unaligned(y);
}

template <class T, class Arch>
ROPE_NOINLINE void rotate_wide_tail(const T* x, T* y, const T* cos2, const T* sin2, std::size_t i,
                                    std::size_t rotary_dim) noexcept {
  constexpr std::size_t n = xsimd::batch<T, Arch>::size;
  const std::size_t rest = rotary_dim - i;
  T v[n] = {}, c[n] = {}, s[n] = {};
  std::copy_n(x + i, rest, v);
  std::copy_n(cos2 + i, rest, c);
  std::copy_n(sin2 + i, rest, s);
  rotate_wide_step<T, Arch>(v, c, s, v);
  std::copy_n(v, rest, y + i);
}

}  // namespace detail

// Widens one table row for block_diagonal rotation of many heads:
//   wide[2p] = wide[2p+1] = cos[p];  wide[r + 2p] = -sin[p], wide[r + 2p+1] = +sin[p]
// (the sine signs flipped for Direction::inverse). wide holds 2*rotary_dim
// values; rotary_dim is even (unchecked).
template <class T>
void widen_row(const T* cos, const T* sin, std::size_t rotary_dim, Direction dir, T* wide) noexcept {
  const T sign = dir == Direction::forward ? T(1) : T(-1);
  for (std::size_t p = 0; p < rotary_dim / 2; ++p) {
    wide[2 * p] = wide[2 * p + 1] = cos[p];
    wide[rotary_dim + 2 * p] = -sign * sin[p];
    wide[rotary_dim + 2 * p + 1] = sign * sin[p];
  }
}

// block_diagonal rotation of one head vector with a row made by widen_row:
// y = x * cos2 + swap_pairs(x) * sin2, the same products as
// rotate<Style::block_diagonal>. Same preconditions as rotate, with wide
// holding 2*rotary_dim values.
template <class T, class Arch = xsimd::default_arch>
void rotate_wide(const T* x, T* y, const T* wide, std::size_t rotary_dim) noexcept {
  constexpr std::size_t n = xsimd::batch<T, Arch>::size;
  const T* cos2 = wide;
  const T* sin2 = wide + rotary_dim;
  std::size_t i = 0;
  for (; i + n <= rotary_dim; i += n) {
    detail::rotate_wide_step<T, Arch>(x + i, cos2 + i, sin2 + i, y + i);
  }
  if (i < rotary_dim) detail::rotate_wide_tail<T, Arch>(x, y, cos2, sin2, i, rotary_dim);
}

}  // namespace rope

