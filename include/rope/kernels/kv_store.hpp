// rope/kernels/kv_store.hpp — one row of floats rounded once into a KV cache's
// element type: float copied, bfloat16 and float16 rounded to nearest even,
// int8 and fp8 quantized with its vector's own scale.
//
//   int8: x_c = s q_c,  s = max_c |x_c| / 127,  q_c = x_c / s rounded to nearest even
//   fp8:  x_c = s q_c,  s = max_c |x_c| / F::max(),  q_c = F(x_c / s) (fp8.hpp:
//         to nearest, ties to even; never past the largest finite)
//
// The writers of the attention module (attention/writer.hpp) store every
// cache row through these; the decode loop reads them back (kv_planes.hpp).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "../detail/half_lanes.hpp"
#include "../detail/simd.hpp"
#include "../detail/xsimd.hpp"
#include "../fp8.hpp"
#include "../half.hpp"

namespace rope {

// One vector of n floats written as E, each value rounded once (to nearest
// even): float copied, the 16-bit types rounded; int8 quantized
// symmetrically, x_c = scale * q_c with scale = max_c |x_c| / 127 and q_c =
// x_c / scale rounded to the nearest integer (ties to even; at most 127 in
// magnitude). *scale is set
// for int8 only: 0 for an all-zero vector (q = 0), NaN when the vector holds
// a NaN or an infinity (q = 0: int8 holds neither), so every value read
// back from that vector is NaN.
template <class Arch = xsimd::default_arch>
void store_kv_row(const float* x, std::size_t n, float* out, float* /*scale*/) noexcept {
  std::copy(x, x + n, out);
}

namespace detail {

// The 16-bit rows: each block of float lanes rounded by the lane codec of
// detail/half_lanes.hpp (bit for bit half.hpp's conversion), the kept
// halves written out; the tail through half.hpp.
template <class E, class Arch, class Codec>
void store_16_row(const float* x, std::size_t n, E* out, Codec round) noexcept {
  using F = xsimd::batch<float, Arch>;
  constexpr std::size_t lanes = F::size;
  const std::size_t full = n - n % lanes;
  static_assert(sizeof(E) == sizeof(std::uint16_t), "a 16-bit storage type");
  for (std::size_t c = 0; c < full; c += lanes) {
    store_low_halves<Arch>(round(F::load_unaligned(x + c)), reinterpret_cast<std::uint16_t*>(out + c));
  }
  for (std::size_t c = full; c < n; ++c) out[c] = E(x[c]);
}

}  // namespace detail

template <class Arch = xsimd::default_arch>
void store_kv_row(const float* x, std::size_t n, BFloat16* out, float* /*scale*/) noexcept {
  detail::store_16_row<BFloat16, Arch>(
      x, n, out, [](const xsimd::batch<float, Arch>& f) { return detail::BFloat16Lanes<Arch>::round_high(f) >> 16; });
}
template <class Arch = xsimd::default_arch>
void store_kv_row(const float* x, std::size_t n, Float16* out, float* /*scale*/) noexcept {
  detail::store_16_row<Float16, Arch>(
      x, n, out, [](const xsimd::batch<float, Arch>& f) { return detail::Float16Lanes<Arch>::round_low(f); });
}
namespace detail {

// The int8 scale of a vector whose largest magnitude is m (finite, >= 0):
// m / 127, except where that underflows for m below 127 times the least
// subnormal: the least subnormal then, so a nonzero vector keeps a nonzero
// one; and where a subnormal m / 127 rounded so far down that m / s passes
// 127 (its spacing is coarse there), the next float up, so that no code
// is clamped and every element stays within s/2 (plus x / s's rounding).
inline float int8_scale(float m) noexcept {
  const float s = m > 0.0f && m / 127.0f == 0.0f ? std::numeric_limits<float>::denorm_min() : m / 127.0f;
  return s < std::numeric_limits<float>::min() && m / s > 127.0f ? std::nextafter(s, 1.0f) : s;
}

// Whether store_kv_row quantizes int8 on Arch's lanes: on x86. On NEON
// the codes are computed one by one: 32-bit NEON divides by a refined
// reciprocal estimate, and with xsimd 8.1 the aarch64 lanes did not match
// the scalar codes either.
template <class Arch>
constexpr bool quantizes_on_lanes() noexcept {
#if defined(__aarch64__) || defined(__ARM_NEON)
  return !std::is_base_of<xsimd::neon, Arch>::value;
#else
  return true;
#endif
}

}  // namespace detail

// int8, a SIMD block at a time: bit for bit rope::reference::quantize_int8
// (the maximum is exact in any order; x / s and its rounding are one IEEE
// operation each, in the current rounding mode, to nearest even by default).
template <class Arch = xsimd::default_arch>
void store_kv_row(const float* x, std::size_t n, std::int8_t* out, float* scale) noexcept {
  using F = xsimd::batch<float, Arch>;
  constexpr std::size_t lanes = F::size;
  // NEON: every value one by one (quantizes_on_lanes).
  const std::size_t coded = detail::quantizes_on_lanes<Arch>() ? n - n % lanes : 0;
  // x - x is 0 for a finite x and NaN for a NaN or an infinity.
  F top(0.0f), probe(0.0f);
  for (std::size_t c = 0; c < coded; c += lanes) {
    const F v = F::load_unaligned(x + c);
    probe = probe + (v - v);
    top = xsimd::max(top, xsimd::abs(v));
  }
  float lane_top[lanes], lane_probe[lanes];
  top.store_unaligned(lane_top);
  probe.store_unaligned(lane_probe);
  bool finite = true;
  float m = 0.0f;
  for (std::size_t i = 0; i < lanes; ++i) {
    finite = finite && lane_probe[i] == 0.0f;
    m = std::max(m, lane_top[i]);
  }
  for (std::size_t c = coded; c < n; ++c) {
    finite = finite && std::isfinite(x[c]);
    m = std::max(m, std::fabs(x[c]));
  }
  const float s = detail::int8_scale(m);
  if (!finite || !(s > 0.0f)) {
    std::fill_n(out, n, std::int8_t(0));
    *scale = finite ? s : std::numeric_limits<float>::quiet_NaN();
    return;
  }
  *scale = s;
  const F sb(s), hi(127.0f), lo(-127.0f);
  for (std::size_t c = 0; c < coded; c += lanes) {
    const F q = xsimd::min(hi, xsimd::max(lo, xsimd::nearbyint(F::load_unaligned(x + c) / sb)));
    detail::store_bytes<Arch>(xsimd::to_int(q), out + c);
  }
  for (std::size_t c = coded; c < n; ++c) {
    out[c] = static_cast<std::int8_t>(std::min(127.0f, std::max(-127.0f, std::nearbyint(x[c] / s))));
  }
}

namespace detail {

// fp8: the row's scale maps its largest magnitude m onto the format's
// largest finite value (the least subnormal where m / max underflows for a
// nonzero m; one float up where a subnormal quotient rounded too far down);
// each value is then one division, rounded, and one encode, to
// nearest even. A quotient just past max (m / s rounds up) encodes to max,
// as the encoder saturates. All zeros: s = 0, codes 0; a NaN or an infinity
// anywhere: s = NaN, codes 0, so every value read back is NaN. The codes
// are computed one by one (the encoder is integer work on each float's
// bits); the decode is on the lanes (kv_planes.hpp).
template <class E, class Arch>
void store_fp8_row(const float* x, std::size_t n, E* out, float* scale) noexcept {
  bool finite = true;
  float m = 0.0f;
  for (std::size_t c = 0; c < n; ++c) {
    finite = finite && std::isfinite(x[c]);
    m = std::max(m, std::fabs(x[c]));
  }
  float s = m > 0.0f && m / E::max() == 0.0f ? std::numeric_limits<float>::denorm_min() : m / E::max();
  // A subnormal s is coarse: where it rounded down so far that m / s passes
  // the largest code, the next float up (m / s then at most max, and every
  // value within the half step of s's own codes; never saturated).
  if (s < std::numeric_limits<float>::min() && m / s > E::max()) s = std::nextafter(s, 1.0f);
  if (!finite || !(s > 0.0f)) {
    std::fill_n(out, n, E::from_bits(0));
    *scale = finite ? s : std::numeric_limits<float>::quiet_NaN();
    return;
  }
  *scale = s;
  for (std::size_t c = 0; c < n; ++c) out[c] = E(x[c] / s);
}

}  // namespace detail

template <class Arch = xsimd::default_arch>
void store_kv_row(const float* x, std::size_t n, Float8E4M3* out, float* scale) noexcept {
  detail::store_fp8_row<Float8E4M3, Arch>(x, n, out, scale);
}
template <class Arch = xsimd::default_arch>
void store_kv_row(const float* x, std::size_t n, Float8E5M2* out, float* scale) noexcept {
  detail::store_fp8_row<Float8E5M2, Arch>(x, n, out, scale);
}

}  // namespace rope
