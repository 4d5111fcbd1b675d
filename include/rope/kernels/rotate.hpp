// rope/kernels/rotate.hpp — the SIMD rotation rows: head vectors at one position.
//
// Same contract and math as rope::reference::rotate (see reference.hpp):
//   y_a = x_a cos_p - x_b sin_p,   y_b = x_b cos_p + x_a sin_p
// for the pairs (a, b) of the chosen pairing; sin negated for the inverse.
// Written once, templated on the element type and the xsimd architecture
// Arch (default: the best one the compiler flags enable).
//
//   rotate_half:    lanes of x[p..] pair with lanes of x[p + r/2 ..]: per
//                   batch of pairs, two fused multiply-adds.
//   block_diagonal: pairs are adjacent lanes; cos/sin are widened to pairs
//                   with a constant swizzle and the partner lane comes from
//                   an adjacent-lane swap, with the sign of sin alternating.
//   16-bit storage (detail::rotate_heads_16, used by the tensor API for
//                   BFloat16 and Float16): the row is read as 32-bit lanes,
//                   two values to a lane, widened in registers, rotated in
//                   float and rounded once on the way out (half_lanes.hpp).
//                   block_diagonal then needs no swizzle at all: the low
//                   halves are the pairs' first channels, the high halves
//                   their second.
//
// Every pair is computed as y_a = fnma(x_b, s, x_a c), y_b = fma(x_a, s, x_b c)
// whatever the pairing, storage, index or alignment, so all of them round
// alike; where Arch has fused multiply-adds, alike on every such Arch and
// xsimd version too (detail::mul_add, simd.hpp).
//
// rotate_heads rotates every head of a token, all at the same position: the
// cos/sin batches of a block of steps are prepared once per row and kept
// (in registers, as far as they go) while every head runs through that
// block, so a head costs its loads, stores and two fused multiply-adds per
// batch. A row whose pairs are not a whole number of steps ends with one
// step that overlaps the step before it; in place, its inputs are loaded
// before that step stores. A row shorter than one step runs through the
// same step with partial loads and stores (one masked load or store each
// with AVX-512). rotate is the one-head case.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "../detail/xsimd.hpp"

#include "../detail/half_lanes.hpp"
#include "../detail/inline.hpp"
#include "../detail/simd.hpp"
#include "../style.hpp"

namespace rope {
namespace detail {

// A row of cos and sin values, rotary_dim/2 of each, in pair order. Its
// members, like everything here that is not templated on Arch, are forced
// inline (detail/inline.hpp).
template <class C>
struct PairRow {
  const C* cos;
  const C* sin;
  ROPE_ALWAYS_INLINE C cos_at(std::size_t p) const noexcept { return cos[p]; }
  ROPE_ALWAYS_INLINE C sin_at(std::size_t p) const noexcept { return sin[p]; }
  ROPE_ALWAYS_INLINE static PairRow make(const C* cos, const C* sin, std::size_t /*pairs*/, C* /*work*/) noexcept {
    return {cos, sin};
  }
};

// A step rotates kPairs pairs of one head vector. The interface every step
// has:
//   Row                  how it reads the row's cos/sin (prepared once per row)
//   Step(row, p, inverse) the cos/sin of pairs p .. p+kPairs-1, in registers
//                        (sin negated for the inverse rotation)
//   Input(x, p, pairs)   the step's inputs, loaded from a head vector x of
//                        `pairs` pairs (a constructor, so that it is never
//                        passed by value: aarch64 GCC notes every such ABI)
//   store(in, y, ...)    rotates loaded inputs and stores them into y
//   Input(x, pairs, Short{}), store_short(in, y, pairs)
//                        the same for a whole row of fewer pairs than a
//                        step, touching nothing past it (load_partial)
//   kRegisters           vector registers the step holds
template <Style S, class T, class Arch>
struct Step;

struct Short {};  // a row of fewer pairs than one step

// sin as a step keeps it: negated for the inverse rotation (exact), decided
// once per step and row rather than compiled as a second kernel.
template <class B>
ROPE_ALWAYS_INLINE B sign_of_sin(const B& s, bool inverse) noexcept {
  return inverse ? -s : s;
}

// rotate_half: n pairs whose first channels start at x[p], second at x[p + pairs].
template <class T, class Arch>
struct Step<Style::rotate_half, T, Arch> {
  using B = xsimd::batch<T, Arch>;
  using Element = T;
  using Row = PairRow<T>;
  static constexpr std::size_t kPairs = B::size;
  static constexpr std::size_t kRegisters = 2;
  struct Input {
    B a, b;
    Input(const T* x, std::size_t p, std::size_t pairs) noexcept
        : a(B::load_unaligned(x + p)), b(B::load_unaligned(x + pairs + p)) {}
    Input(const T* x, std::size_t pairs, Short) noexcept
        : a(load_partial<B>(x, pairs * sizeof(T))), b(load_partial<B>(x + pairs, pairs * sizeof(T))) {}
    // Each input x becomes (x * r) * w, w the same channels of a weight row.
    void scale(T r, const Input& w) noexcept {
      a = (a * B(r)) * w.a;
      b = (b * B(r)) * w.b;
    }
  };
  B c, s;

  Step() = default;
  Step(const Row& row, std::size_t p, bool inverse) noexcept
      : c(B::load_unaligned(row.cos + p)), s(sign_of_sin(B::load_unaligned(row.sin + p), inverse)) {}
  void store(const Input& in, T* y, std::size_t p, std::size_t pairs) const noexcept {
    neg_mul_add(in.b, s, in.a * c).store_unaligned(y + p);      // a c - b s
    mul_add(in.a, s, in.b * c).store_unaligned(y + pairs + p);  // b c + a s
  }
  void store_short(const Input& in, T* y, std::size_t pairs) const noexcept {
    store_partial(neg_mul_add(in.b, s, in.a * c), y, pairs * sizeof(T));
    store_partial(mul_add(in.a, s, in.b * c), y + pairs, pairs * sizeof(T));
  }
};

// block_diagonal: n adjacent pairs, the 2n channels from x[2p], in two
// batches. y = x c + swap(x) (-s, +s, ...): the same two products per pair
// as rotate_half.
template <class T, class Arch>
struct Step<Style::block_diagonal, T, Arch> {
  using B = xsimd::batch<T, Arch>;
  using Element = T;
  using Row = PairRow<T>;
  static constexpr std::size_t kPairs = B::size;
  static constexpr std::size_t kRegisters = 4;
  struct Input {
    B x0, x1;
    Input(const T* x, std::size_t p, std::size_t /*pairs*/) noexcept
        : x0(B::load_unaligned(x + 2 * p)), x1(B::load_unaligned(x + 2 * p + B::size)) {}
    Input(const T* x, std::size_t pairs, Short) noexcept
        : x0(load_partial<B>(x, (2 * pairs < B::size ? 2 * pairs : B::size) * sizeof(T))),
          x1(2 * pairs > B::size ? load_partial<B>(x + B::size, (2 * pairs - B::size) * sizeof(T)) : B(T(0))) {}
    void scale(T r, const Input& w) noexcept {
      x0 = (x0 * B(r)) * w.x0;
      x1 = (x1 * B(r)) * w.x1;
    }
  };
  B c0, c1, s0, s1;

  Step() = default;
  Step(const Row& row, std::size_t p, bool inverse) noexcept {
    const B sign = alternating<T, Arch>(T(-1), T(1));
    const B c = B::load_unaligned(row.cos + p);
    const B s = sign_of_sin(B::load_unaligned(row.sin + p), inverse);
    c0 = duplicate_low(c);
    c1 = duplicate_high(c);
    s0 = duplicate_low(s) * sign;
    s1 = duplicate_high(s) * sign;
  }

  void store(const Input& in, T* y, std::size_t p, std::size_t /*pairs*/) const noexcept {
    mul_add(swap_adjacent(in.x0), s0, in.x0 * c0).store_unaligned(y + 2 * p);
    mul_add(swap_adjacent(in.x1), s1, in.x1 * c1).store_unaligned(y + 2 * p + B::size);
  }
  void store_short(const Input& in, T* y, std::size_t pairs) const noexcept {
    store_partial(mul_add(swap_adjacent(in.x0), s0, in.x0 * c0), y,
                  (2 * pairs < B::size ? 2 * pairs : B::size) * sizeof(T));
    if (2 * pairs > B::size) {
      store_partial(mul_add(swap_adjacent(in.x1), s1, in.x1 * c1), y + B::size, (2 * pairs - B::size) * sizeof(T));
    }
  }
};

// 16-bit storage, rotate_half: a 32-bit lane of x[p..] holds the first
// channels of pairs q and q+1, the same lane of x[pairs + p..] their second
// channels; so a step covers 2n pairs, the even-offset ones in the low halves
// and the odd-offset ones in the high halves. Its row is cos/sin split by
// the parity of the pair (Row16), so that each half reads its own.
template <class C>
struct Row16 {
  const C* cos_even;  // cos[0], cos[2], ...
  const C* cos_odd;   // cos[1], cos[3], ...
  const C* sin_even;
  const C* sin_odd;
  ROPE_ALWAYS_INLINE C cos_at(std::size_t p) const noexcept { return p % 2 == 0 ? cos_even[p / 2] : cos_odd[p / 2]; }
  ROPE_ALWAYS_INLINE C sin_at(std::size_t p) const noexcept { return p % 2 == 0 ? sin_even[p / 2] : sin_odd[p / 2]; }

  // Splits a row of `pairs` cos/sin values by parity into work (room for
  // 2 * pairs + 2 values).
  ROPE_ALWAYS_INLINE static Row16 make(const C* cos, const C* sin, std::size_t pairs, C* work) noexcept {
    const std::size_t even = (pairs + 1) / 2, odd = pairs / 2;
    C* ce = work;
    C* co = ce + even;
    C* se = co + odd;
    C* so = se + even;
    for (std::size_t i = 0; i < odd; ++i) {
      ce[i] = cos[2 * i];
      co[i] = cos[2 * i + 1];
      se[i] = sin[2 * i];
      so[i] = sin[2 * i + 1];
    }
    if (even > odd) {
      ce[odd] = cos[pairs - 1];
      se[odd] = sin[pairs - 1];
    }
    return {ce, co, se, so};
  }
};

template <Style S, class Lanes, class Arch>
struct Step16;

template <class Lanes, class Arch>
struct Step16<Style::rotate_half, Lanes, Arch> {
  using U = xsimd::batch<std::uint32_t, Arch>;
  using F = xsimd::batch<float, Arch>;
  using Element = std::uint16_t;
  using Row = Row16<float>;
  static constexpr std::size_t kPairs = 2 * F::size;
  static constexpr std::size_t kRegisters = 4;
  struct Input {
    U a, b;
    Input(const std::uint16_t* x, std::size_t p, std::size_t pairs) noexcept
        : a(load_lanes(x + p)), b(load_lanes(x + pairs + p)) {}
    Input(const std::uint16_t* x, std::size_t pairs, Short) noexcept
        : a(load_partial<U>(x, 2 * pairs)), b(load_partial<U>(x + pairs, 2 * pairs)) {}
  };
  F c_low, c_high, s_low, s_high;

  Step16() = default;
  // Pairs p, p+2, ... are in the low halves: the even entries of the row
  // when p is even, the odd ones when p is odd.
  Step16(const Row& row, std::size_t p, bool inverse) noexcept {
    const bool even = p % 2 == 0;
    const float* cl = even ? row.cos_even + p / 2 : row.cos_odd + p / 2;
    const float* ch = even ? row.cos_odd + p / 2 : row.cos_even + (p + 1) / 2;
    const float* sl = even ? row.sin_even + p / 2 : row.sin_odd + p / 2;
    const float* sh = even ? row.sin_odd + p / 2 : row.sin_even + (p + 1) / 2;
    c_low = F::load_unaligned(cl);
    c_high = F::load_unaligned(ch);
    s_low = sign_of_sin(F::load_unaligned(sl), inverse);
    s_high = sign_of_sin(F::load_unaligned(sh), inverse);
  }

  void store(const Input& in, std::uint16_t* y, std::size_t p, std::size_t pairs) const noexcept {
    const F al = Lanes::low(in.a), ah = Lanes::high(in.a);
    const F bl = Lanes::low(in.b), bh = Lanes::high(in.b);
    store_lanes(Lanes::pack(neg_mul_add(bl, s_low, al * c_low), neg_mul_add(bh, s_high, ah * c_high)), y + p);
    store_lanes(Lanes::pack(mul_add(al, s_low, bl * c_low), mul_add(ah, s_high, bh * c_high)), y + pairs + p);
  }
  void store_short(const Input& in, std::uint16_t* y, std::size_t pairs) const noexcept {
    const F al = Lanes::low(in.a), ah = Lanes::high(in.a);
    const F bl = Lanes::low(in.b), bh = Lanes::high(in.b);
    store_partial(Lanes::pack(neg_mul_add(bl, s_low, al * c_low), neg_mul_add(bh, s_high, ah * c_high)), y, 2 * pairs);
    store_partial(Lanes::pack(mul_add(al, s_low, bl * c_low), mul_add(ah, s_high, bh * c_high)), y + pairs, 2 * pairs);
  }

  // 16-bit values as 32-bit lanes; no alignment is needed beyond 2 bytes.
  static U load_lanes(const std::uint16_t* x) noexcept {
    return U::load_unaligned(reinterpret_cast<const std::uint32_t*>(x));
  }
  static void store_lanes(const U& v, std::uint16_t* y) noexcept {
    v.store_unaligned(reinterpret_cast<std::uint32_t*>(y));
  }
};

// 16-bit storage, block_diagonal: lane i of x[2p..] is pair p+i, its first
// channel in the low half and its second in the high half.
template <class Lanes, class Arch>
struct Step16<Style::block_diagonal, Lanes, Arch> {
  using Base = Step16<Style::rotate_half, Lanes, Arch>;
  using U = typename Base::U;
  using F = typename Base::F;
  using Element = std::uint16_t;
  using Row = PairRow<float>;
  static constexpr std::size_t kPairs = F::size;
  static constexpr std::size_t kRegisters = 2;
  struct Input {
    U v;
    Input(const std::uint16_t* x, std::size_t p, std::size_t /*pairs*/) noexcept : v(Base::load_lanes(x + 2 * p)) {}
    Input(const std::uint16_t* x, std::size_t pairs, Short) noexcept : v(load_partial<U>(x, 4 * pairs)) {}
  };
  F c, s;

  Step16() = default;
  Step16(const Row& row, std::size_t p, bool inverse) noexcept
      : c(F::load_unaligned(row.cos + p)), s(sign_of_sin(F::load_unaligned(row.sin + p), inverse)) {}

  void store(const Input& in, std::uint16_t* y, std::size_t p, std::size_t /*pairs*/) const noexcept {
    const F a = Lanes::low(in.v), b = Lanes::high(in.v);
    Base::store_lanes(Lanes::pack(neg_mul_add(b, s, a * c), mul_add(a, s, b * c)), y + 2 * p);
  }
  void store_short(const Input& in, std::uint16_t* y, std::size_t pairs) const noexcept {
    const F a = Lanes::low(in.v), b = Lanes::high(in.v);
    store_partial(Lanes::pack(neg_mul_add(b, s, a * c), mul_add(a, s, b * c)), y, 4 * pairs);
  }
};

// What rotate_rows does to a head's inputs once they are loaded: nothing
// (Unscaled), or RowScale's RMSNorm scaling, input x of head h becoming
// (x * r[h]) * w_c with w_c the weight of its channel: the values
// rms_norm_row writes, so the rotation that follows rounds as it would
// from a normalized copy, without the copy. Float steps only.
struct Unscaled {
  template <class In>
  ROPE_ALWAYS_INLINE void operator()(In& /*in*/, std::size_t /*h*/, std::size_t /*p*/,
                                     std::size_t /*pairs*/) const noexcept {}
  template <class In>
  ROPE_ALWAYS_INLINE void operator()(In& /*in*/, std::size_t /*h*/, std::size_t /*pairs*/, Short) const noexcept {}
};
template <class T>
struct RowScale {
  const T* r;  // one per head
  const T* w;  // one per channel of a head
  template <class In>
  ROPE_ALWAYS_INLINE void operator()(In& in, std::size_t h, std::size_t p, std::size_t pairs) const noexcept {
    in.scale(r[h], In(w, p, pairs));
  }
  template <class In>
  ROPE_ALWAYS_INLINE void operator()(In& in, std::size_t h, std::size_t pairs, Short) const noexcept {
    in.scale(r[h], In(w, pairs, Short{}));
  }
};

// A row of fewer pairs than one step: the step is prepared from a
// zero-padded copy of the row, and each head is loaded and stored with
// partial loads and stores (load_partial), so nothing past the row is
// touched. Out of line: its stack buffers would otherwise give every call a
// stack frame.
template <class StepT, class Row, class Scale>
ROPE_NOINLINE void rotate_short(const typename StepT::Element* x, std::ptrdiff_t x_stride, typename StepT::Element* y,
                                std::ptrdiff_t y_stride, std::size_t heads, const Row& row, std::size_t pairs,
                                bool inverse, const Scale& scale) noexcept {
  using C = std::decay_t<decltype(row.cos_at(0))>;
  constexpr std::size_t n = StepT::kPairs;
  C c[n] = {}, s[n] = {};
  for (std::size_t p = 0; p < pairs; ++p) {
    c[p] = row.cos_at(p);
    s[p] = row.sin_at(p);
  }
  C work[2 * n + 2];
  const StepT step(StepT::Row::make(c, s, n, work), 0, inverse);
  for (std::size_t h = 0; h < heads; ++h) {
    typename StepT::Input in(x + static_cast<std::ptrdiff_t>(h) * x_stride, pairs, Short{});
    scale(in, h, pairs, Short{});
    step.store_short(in, y + static_cast<std::ptrdiff_t>(h) * y_stride, pairs);
  }
}

// How many steps a block holds: as many as the architecture has registers
// for (AVX2: 8 rotate_half or 4 block_diagonal steps, all of a 128-channel
// head or half of it). Each block is one pass over the heads, and passes
// cost more than registers when the rows stream from memory (the figures
// are in docs/bench.md).
template <class StepT, class Arch>
constexpr std::size_t block_steps() noexcept {
  return vector_registers<Arch>() / StepT::kRegisters > 0 ? vector_registers<Arch>() / StepT::kRegisters : 1;
}

// Rotates `pairs` pairs of `heads` head vectors (x + h * x_stride into
// y + h * y_stride), all at the row `row`: steps are prepared a block at a
// time, then every head runs through the block. Each loaded input passes
// through `scale` first (Unscaled: as it is).
template <Style S, class StepT, class Arch, class Scale = Unscaled>
inline void rotate_rows(const typename StepT::Element* x, std::ptrdiff_t x_stride, typename StepT::Element* y,
                        std::ptrdiff_t y_stride, std::size_t heads, const typename StepT::Row& row, std::size_t pairs,
                        bool inverse, const Scale& scale = {}) noexcept {
  constexpr std::size_t n = StepT::kPairs;
  constexpr std::size_t kBlock = block_steps<StepT, Arch>();
  const std::size_t full = pairs / n;  // whole steps in a row
  if (full == 0) {
    if (pairs > 0) rotate_short<StepT>(x, x_stride, y, y_stride, heads, row, pairs, inverse, scale);
    return;
  }
  const std::size_t last = pairs - n;  // first pair of the overlapping last step
  const bool overlap = last != (full - 1) * n;
  for (std::size_t first = 0; first < full; first += kBlock) {
    const std::size_t count = full - first < kBlock ? full - first : kBlock;
    StepT block[kBlock];
    for (std::size_t i = 0; i < count; ++i) block[i] = StepT(row, (first + i) * n, inverse);
    if (overlap && first + count == full) {
      // The block that writes the overlapped pairs: each head loads the
      // last step's inputs before the block stores over them.
      const StepT tail(row, last, inverse);
      for (std::size_t h = 0; h < heads; ++h) {
        const auto* xh = x + static_cast<std::ptrdiff_t>(h) * x_stride;
        auto* yh = y + static_cast<std::ptrdiff_t>(h) * y_stride;
        typename StepT::Input in(xh, last, pairs);
        scale(in, h, last, pairs);
        for (std::size_t i = 0; i < count; ++i) {
          const std::size_t p = (first + i) * n;
          typename StepT::Input step_in(xh, p, pairs);
          scale(step_in, h, p, pairs);
          block[i].store(step_in, yh, p, pairs);
        }
        tail.store(in, yh, last, pairs);
      }
    } else {
      for (std::size_t h = 0; h < heads; ++h) {
        const auto* xh = x + static_cast<std::ptrdiff_t>(h) * x_stride;
        auto* yh = y + static_cast<std::ptrdiff_t>(h) * y_stride;
        for (std::size_t i = 0; i < count; ++i) {
          const std::size_t p = (first + i) * n;
          typename StepT::Input step_in(xh, p, pairs);
          scale(step_in, h, p, pairs);
          block[i].store(step_in, yh, p, pairs);
        }
      }
    }
  }
}

// rotate_heads for 16-bit storage (BFloat16, Float16) with a float row:
// widened, rotated and rounded in registers. work holds rotary_dim + 2
// floats (the row split by parity, for rotate_half).
template <Style S, class T, class Arch>
void rotate_heads_16(const T* x, std::ptrdiff_t x_stride, T* y, std::ptrdiff_t y_stride, std::size_t heads,
                     const float* cos, const float* sin, std::size_t rotary_dim, Direction dir, float* work) noexcept {
  using Lanes = typename LanesOf<T, Arch>::type;
  const std::size_t pairs = rotary_dim / 2;
  // The storage types hold their bits as their one std::uint16_t member.
  const auto* xb = reinterpret_cast<const std::uint16_t*>(x);
  auto* yb = reinterpret_cast<std::uint16_t*>(y);
  using Software = Step16<S, Lanes, Arch>;
  const auto row = Software::Row::make(cos, sin, pairs, work);
  const bool inverse = dir == Direction::inverse;
  if constexpr (std::is_same<T, BFloat16>::value && kBFloat16HardwareArch<Arch>) {
    if (avx512_bf16_runs<Arch>()) {
      // The same bits, rounded by the CPU's bfloat16 conversion.
      using Hardware = BFloat16HardwareLanes<Arch>;
      rotate_rows<S, Step16<S, Hardware, Arch>, Arch>(xb, x_stride, yb, y_stride, heads, row, pairs, inverse);
      return;
    }
  }
  rotate_rows<S, Software, Arch>(xb, x_stride, yb, y_stride, heads, row, pairs, inverse);
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
void rotate_heads(const T* x, std::ptrdiff_t x_stride, T* y, std::ptrdiff_t y_stride, std::size_t heads, const T* cos,
                  const T* sin, std::size_t rotary_dim, Direction dir = Direction::forward) noexcept {
  static_assert(std::is_same<T, float>::value || std::is_same<T, double>::value,
                "rope::rotate_heads: T must be float or double");
  detail::rotate_rows<S, detail::Step<S, T, Arch>, Arch>(x, x_stride, y, y_stride, heads, detail::PairRow<T>{cos, sin},
                                                         rotary_dim / 2, dir == Direction::inverse);
}

// rotate_heads (forward) of RMSNorm-scaled heads: channel c of head h
// enters the rotation as (x_c * r[h]) * w[c], rounded as rms_norm_row
// rounds it, so y is bit for bit rms_norm_row into a copy followed by
// rotate_heads of the copy, without the copy. r holds `heads` values, w
// rotary_dim (the weights of the rotated channels, (1 + w) precomputed for
// the Gemma form). Preconditions: rotate_heads'; nothing past channel
// rotary_dim-1 is read or written (the caller scales the channels past it).
template <Style S, class Arch = xsimd::default_arch>
void rotate_heads_scaled(const float* x, std::ptrdiff_t x_stride, float* y, std::ptrdiff_t y_stride, std::size_t heads,
                         const float* cos, const float* sin, std::size_t rotary_dim, const float* r,
                         const float* w) noexcept {
  detail::rotate_rows<S, detail::Step<S, float, Arch>, Arch>(x, x_stride, y, y_stride, heads,
                                                             detail::PairRow<float>{cos, sin}, rotary_dim / 2, false,
                                                             detail::RowScale<float>{r, w});
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
