// rope/kernels.hpp — the SIMD row kernels: head vectors at one position.
//
// Same contract and math as rope::reference::rotate (see reference.hpp):
//   y_a = x_a cos_p - x_b sin_p,   y_b = x_b cos_p + x_a sin_p
// for the pairs (a, b) of the chosen pairing; sin negated for the inverse.
// Written once, templated on the element type T and the xsimd architecture
// Arch (default: the best one the compiler flags enable).
//
//   rotate_half:    lanes of x[p..] pair with lanes of x[p + r/2 ..]: per
//                   batch of pairs, two fused multiply-adds.
//   block_diagonal: pairs are adjacent lanes; cos/sin are widened to pairs
//                   with a constant swizzle and the partner lane comes from
//                   an adjacent-lane swap, with the sign of sin alternating.
//
// rotate_heads rotates every head of a token, all at the same position: the
// cos/sin batches (and, for block_diagonal, their widening swizzles) are
// prepared once per row and applied to every head in turn, so a head costs
// its loads, stores and two fused multiply-adds per batch. rotate is the
// one-head case. The last pairs of a row (fewer than one batch) run through
// the same step on a zero-padded stack copy: the rounding of a pair never
// depends on its index, the row's alignment, or running in place.
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

template <Style S, bool Inverse, class T, class Arch>
struct Step;

// rotate_half: n pairs whose first channels start at x[p], second at x[p + pairs].
template <bool Inverse, class T, class Arch>
struct Step<Style::rotate_half, Inverse, T, Arch> {
  using B = xsimd::batch<T, Arch>;
  static constexpr std::size_t kPairs = B::size;  // pairs per step
  B c, s;

  Step() = default;
  Step(const T* cos, const T* sin) noexcept
      : c(B::load_unaligned(cos)),
        s(Inverse ? -B::load_unaligned(sin) : B::load_unaligned(sin)) {}

  // x and y point at the row; p is the first pair of the step.
  void apply(const T* x, T* y, std::size_t p, std::size_t pairs) const noexcept {
    const B a = B::load_unaligned(x + p);
    const B b = B::load_unaligned(x + pairs + p);
    xsimd::fnma(b, s, a * c).store_unaligned(y + p);        // a c - b s
    xsimd::fma(a, s, b * c).store_unaligned(y + pairs + p);  // b c + a s
  }
};

// block_diagonal: n adjacent pairs, the 2n channels from x[2p], in two
// batches. y = x c + swap(x) (-s, +s, ...): the same two products per pair
// as rotate_half.
template <bool Inverse, class T, class Arch>
struct Step<Style::block_diagonal, Inverse, T, Arch> {
  using B = xsimd::batch<T, Arch>;
  static constexpr std::size_t kPairs = B::size;
  B c0, c1, s0, s1;

  Step() = default;
  Step(const T* cos, const T* sin) noexcept {
    const B sign = alternating<T, Arch>(Inverse ? T(1) : T(-1), Inverse ? T(-1) : T(1));
    const B c = B::load_unaligned(cos);
    const B s = B::load_unaligned(sin);
    c0 = duplicate_low(c);
    c1 = duplicate_high(c);
    s0 = duplicate_low(s) * sign;
    s1 = duplicate_high(s) * sign;
  }

  void apply(const T* x, T* y, std::size_t p, std::size_t /*pairs*/) const noexcept {
    constexpr std::size_t n = B::size;
    const B x0 = B::load_unaligned(x + 2 * p);
    const B x1 = B::load_unaligned(x + 2 * p + n);
    xsimd::fma(swap_adjacent(x0), s0, x0 * c0).store_unaligned(y + 2 * p);
    xsimd::fma(swap_adjacent(x1), s1, x1 * c1).store_unaligned(y + 2 * p + n);
  }
};

// The pairs from p to pairs (fewer than one step) of every head, through the
// same step on zero-padded copies. Out of line: its stack buffers would
// otherwise give every call a stack frame, which costs more than the main
// loop on heads of 64 or 128 channels.
template <Style S, bool Inverse, class T, class Arch>
ROPE_NOINLINE void rotate_tail(const T* x, std::ptrdiff_t x_stride, T* y, std::ptrdiff_t y_stride,
                               std::size_t heads, const T* cos, const T* sin, std::size_t p,
                               std::size_t pairs) noexcept {
  constexpr std::size_t n = Step<S, Inverse, T, Arch>::kPairs;
  const std::size_t rest = pairs - p;
  T c[n] = {}, s[n] = {};
  std::copy_n(cos + p, rest, c);
  std::copy_n(sin + p, rest, s);
  const Step<S, Inverse, T, Arch> step(c, s);
  for (std::size_t h = 0; h < heads; ++h) {
    const T* xh = x + static_cast<std::ptrdiff_t>(h) * x_stride;
    T* yh = y + static_cast<std::ptrdiff_t>(h) * y_stride;
    T v[2 * n] = {};  // a padded row of n pairs in the pairing's own layout
    if (S == Style::rotate_half) {
      std::copy_n(xh + p, rest, v);
      std::copy_n(xh + pairs + p, rest, v + n);
      step.apply(v, v, 0, n);
      std::copy_n(v, rest, yh + p);
      std::copy_n(v + n, rest, yh + pairs + p);
    } else {
      std::copy_n(xh + 2 * p, 2 * rest, v);
      step.apply(v, v, 0, n);
      std::copy_n(v, 2 * rest, yh + 2 * p);
    }
  }
}

// Steps are prepared for up to kBlockSteps batches of pairs at a time (all
// of a head of up to 256 channels with AVX-512 floats), then every head runs
// through them in order: each head's memory is walked front to back, as the
// hardware prefetchers expect, and no head repeats the preparation.
constexpr std::size_t kBlockSteps = 8;

template <Style S, bool Inverse, class T, class Arch>
inline void rotate_rows(const T* x, std::ptrdiff_t x_stride, T* y, std::ptrdiff_t y_stride,
                        std::size_t heads, const T* cos, const T* sin, std::size_t pairs) noexcept {
  using StepT = Step<S, Inverse, T, Arch>;
  constexpr std::size_t n = StepT::kPairs;
  const std::size_t full = pairs / n;  // whole steps in a row
  for (std::size_t first = 0; first < full; first += kBlockSteps) {
    const std::size_t count = std::min(kBlockSteps, full - first);
    StepT block[kBlockSteps];
    for (std::size_t i = 0; i < count; ++i) {
      block[i] = StepT(cos + (first + i) * n, sin + (first + i) * n);
    }
    for (std::size_t h = 0; h < heads; ++h) {
      const T* xh = x + static_cast<std::ptrdiff_t>(h) * x_stride;
      T* yh = y + static_cast<std::ptrdiff_t>(h) * y_stride;
      for (std::size_t i = 0; i < count; ++i) block[i].apply(xh, yh, (first + i) * n, pairs);
    }
  }
  if (full * n < pairs) {
    rotate_tail<S, Inverse, T, Arch>(x, x_stride, y, y_stride, heads, cos, sin, full * n, pairs);
  }
}

}  // namespace detail

// Rotates the first rotary_dim channels of `heads` head vectors, all at the
// position whose table row is (cos, sin): head h reads x + h * x_stride and
// writes y + h * y_stride (strides in elements).
//
// Preconditions (unchecked; the tensor API in apply.hpp checks them):
//   - rotary_dim is even; cos and sin each hold rotary_dim/2 values;
//   - each head row holds rotary_dim values; a row of y either is its row of
//     x (in place, same stride) or overlaps no row of x or y;
//   - no alignment is required (64-byte aligned rows are fastest).
// Nothing past channel rotary_dim-1 of a row is read or written.
template <Style S, class T, class Arch = xsimd::default_arch>
void rotate_heads(const T* x, std::ptrdiff_t x_stride, T* y, std::ptrdiff_t y_stride,
                  std::size_t heads, const T* cos, const T* sin, std::size_t rotary_dim,
                  Direction dir = Direction::forward) noexcept {
  const std::size_t pairs = rotary_dim / 2;
  if (dir == Direction::forward) {
    detail::rotate_rows<S, false, T, Arch>(x, x_stride, y, y_stride, heads, cos, sin, pairs);
  } else {
    detail::rotate_rows<S, true, T, Arch>(x, x_stride, y, y_stride, heads, cos, sin, pairs);
  }
}

// Rotates the first rotary_dim channels of the head vector x into y: the
// one-head case of rotate_heads, with the same preconditions (y == x is in
// place; any other overlap is not allowed).
template <Style S, class T, class Arch = xsimd::default_arch>
void rotate(const T* x, T* y, const T* cos, const T* sin, std::size_t rotary_dim,
            Direction dir = Direction::forward) noexcept {
  rotate_heads<S, T, Arch>(x, 0, y, 0, 1, cos, sin, rotary_dim, dir);
}

}  // namespace rope
