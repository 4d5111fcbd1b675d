// rope/kernels/kv_planes.hpp — the element types of a KV cache (float,
// bfloat16, float16, int8, fp8 e4m3 and e5m2) and how a block of them is
// widened to float lanes.
//
// A stored value is widened exactly (int8 and fp8 before their scale, which
// the caller applies: q . (s k) = s (q . k)); a NaN stays a NaN (binary16 on
// AVX-512 through vcvtph2ps, which quiets a signaling one). A block of
// W = P * lanes stored values (P = 1 for float, 2 for the 16-bit types, 4
// for the 8-bit ones) is widened into P "planes" of float lanes. In the portable way
// it is loaded as 32-bit lanes and value P*i + k lands in lane i of plane k;
// instead of shuffling every key and value back into channel order, the
// query rows and the accumulators are kept in that plane order
// (permute_row / unpermute_row, once per row and call):
//
//   channel base + P*i + k  (base a multiple of W, below d - d % W)
//     is stored at  base + k * lanes + i;  channels past d - d % W stay put.
//
// so every load of the cache is one plain vector load, whatever the type,
// instruction set or xsimd version. Where the instruction set widens a run
// of narrow values in one instruction (int8 on AVX2 and AVX-512: vpmovsxbd;
// binary16 on AVX-512: vcvtph2ps), plane k holds values k*lanes .. k*lanes +
// lanes - 1 instead, in channel order (KvPlanes::kInOrder), and the rows
// need no permutation. The rows over these planes: kv_dot.hpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "../detail/half_lanes.hpp"
#include "../detail/inline.hpp"
#include "../detail/simd.hpp"
#include "../detail/xsimd.hpp"
#include "../fp8.hpp"
#include "../half.hpp"

namespace rope {

// The element types a KV cache may hold: float, BFloat16, Float16, and
// std::int8_t, Float8E4M3 and Float8E5M2, each with one float scale per
// token and key/value head (kScaled).
template <class E>
struct KvElement {
  static constexpr bool kSupported = false;
};
template <>
struct KvElement<float> {
  static constexpr bool kSupported = true;
  static constexpr std::size_t kPerLane = 1;  // stored values per 32-bit lane
  static constexpr bool kScaled = false;
};
template <>
struct KvElement<BFloat16> {
  static constexpr bool kSupported = true;
  static constexpr std::size_t kPerLane = 2;
  static constexpr bool kScaled = false;
};
template <>
struct KvElement<Float16> {
  static constexpr bool kSupported = true;
  static constexpr std::size_t kPerLane = 2;
  static constexpr bool kScaled = false;
};
// The one-byte types: four stored values per lane, a scale per row.
struct KvScaledByte {
  static constexpr bool kSupported = true;
  static constexpr std::size_t kPerLane = 4;
  static constexpr bool kScaled = true;
};
template <>
struct KvElement<std::int8_t> : KvScaledByte {};
template <>
struct KvElement<Float8E4M3> : KvScaledByte {};
template <>
struct KvElement<Float8E5M2> : KvScaledByte {};

namespace detail {

// The P planes of W stored values at p, widened to float lanes.
template <class E, class Arch>
struct KvPlanes;

// Whether Arch is AVX-512 (or AVX2 and not AVX-512), in a unit compiled
// for it: the widening instructions of those sets are at hand.
template <class Arch>
constexpr bool is_avx512() noexcept {
#if defined(__AVX512F__)
  return std::is_base_of<xsimd::avx512f, Arch>::value;
#else
  return false;
#endif
}
template <class Arch>
constexpr bool is_avx2() noexcept {
#if defined(__AVX2__)
  return !is_avx512<Arch>() && std::is_base_of<xsimd::avx2, Arch>::value;
#else
  return false;
#endif
}

template <class Arch>
struct KvPlanes<float, Arch> {
  using F = xsimd::batch<float, Arch>;
  static constexpr bool kInOrder = true;
  static void load(const float* p, F* out) noexcept { out[0] = F::load_unaligned(p); }
};

template <class Arch>
struct KvPlanes<BFloat16, Arch> {
  using F = xsimd::batch<float, Arch>;
  using U = xsimd::batch<std::uint32_t, Arch>;
  // A shift and a mask of one load: cheaper than widening runs in order.
  static constexpr bool kInOrder = false;
  static void load(const BFloat16* p, F* out) noexcept {
    const U u = U::load_unaligned(reinterpret_cast<const std::uint32_t*>(p));
    out[0] = BFloat16Lanes<Arch>::low(u);
    out[1] = BFloat16Lanes<Arch>::high(u);
  }
};

template <class Arch>
struct KvPlanes<Float16, Arch> {
  using F = xsimd::batch<float, Arch>;
  using U = xsimd::batch<std::uint32_t, Arch>;
  static constexpr bool kInOrder = is_avx512<Arch>();
  static void load(const Float16* p, F* out) noexcept {
#if defined(__AVX512F__)
    // AVX-512F widens 16 binary16 values itself (vcvtph2ps): exact for
    // every number, subnormals included whatever the denormals mode; a
    // signaling NaN comes back quiet (a NaN all the same).
    if constexpr (kInOrder) {
      out[0] = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
      out[1] = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 16)));
      return;
    }
#endif
    const U u = U::load_unaligned(reinterpret_cast<const std::uint32_t*>(p));
    out[0] = Float16Lanes<Arch>::low(u);
    out[1] = Float16Lanes<Arch>::high(u);
  }
};

// int8 on AVX2 and AVX-512: each run of `lanes` values sign-extended
// (vpmovsxbd) and converted (vcvtdq2ps), exact. Elsewhere int8 k of a
// lane: its byte, offset by 128 (x + 128 = byte ^ 0x80), under the
// exponent of 2^23, minus 2^23 + 128: exact, with unsigned lanes only.
template <class Arch>
struct KvPlanes<std::int8_t, Arch> {
  using F = xsimd::batch<float, Arch>;
  using U = xsimd::batch<std::uint32_t, Arch>;
  static constexpr bool kInOrder = is_avx512<Arch>() || is_avx2<Arch>();
  static void load(const std::int8_t* p, F* out) noexcept {
#if defined(__AVX512F__)
    if constexpr (is_avx512<Arch>()) {
      ROPE_UNROLL
      for (std::size_t k = 0; k < 4; ++k) {
        out[k] =
            _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16 * k))));
      }
      return;
    }
#endif
#if defined(__AVX2__)
    if constexpr (is_avx2<Arch>()) {
      ROPE_UNROLL
      for (std::size_t k = 0; k < 4; ++k) {
        out[k] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 8 * k))));
      }
      return;
    }
#endif
    const U u = U::load_unaligned(reinterpret_cast<const std::uint32_t*>(p));
    const F offset(8388736.0f);
    out[0] = as_float((u & U(0xffu)) ^ U(0x4b000080u)) - offset;
    out[1] = as_float(((u >> 8) & U(0xffu)) ^ U(0x4b000080u)) - offset;
    out[2] = as_float(((u >> 16) & U(0xffu)) ^ U(0x4b000080u)) - offset;
    out[3] = as_float((u >> 24) ^ U(0x4b000080u)) - offset;
  }
};

// fp8 bytes (one per 32-bit lane, zeros above) decoded exactly, as
// fp8.hpp's scalar decodes do: a normal code's exponent rebiased onto
// binary32's (E4M3: + 120, E5M2: + 112), a subnormal's mantissa m times its
// step (m counted as the normal float 2^23 + m less 2^23: exact, and no
// subnormal float on the way, which a denormals-are-zero mode would read
// as 0), the top codes NaN (E4M3's 0x7f) or infinite/NaN (E5M2's 0x7c ..).
// The sign is or-ed back last.
template <class E, class Arch>
struct Fp8Lanes {
  using U = xsimd::batch<std::uint32_t, Arch>;
  using F = xsimd::batch<float, Arch>;
  static constexpr bool kE4M3 = std::is_same<E, Float8E4M3>::value;
  static constexpr std::uint32_t kMant = kE4M3 ? 3 : 2;

  static F widen(const U& b) noexcept {
    const U sign = (b & U(0x80u)) << 24;
    const U magnitude = b & U(0x7fu);
    const F normal = as_float((magnitude << (23 - kMant)) + U((kE4M3 ? 120u : 112u) << 23));
    const F tiny = (as_float((magnitude & U((1u << kMant) - 1u)) | U(0x4b000000u)) - F(8388608.0f)) *
                   F(kE4M3 ? 0x1p-9f : 0x1p-16f);
    // magnitude, as the exact float 1 + magnitude * 2^-23 (compared as
    // floats: xsimd 8.1 cannot select on integer lanes with AVX-512 at -O0).
    const F mag = as_float(magnitude | U(0x3f800000u));
    const F first_normal = as_float(U(0x3f800000u | (1u << kMant)));
    F value = xsimd::select(mag < first_normal, tiny, normal);
    if constexpr (kE4M3) {
      value = xsimd::select(mag == as_float(U(0x3f80007fu)), F(std::numeric_limits<float>::quiet_NaN()), value);
    } else {
      value = xsimd::select(mag == as_float(U(0x3f80007cu)), F(std::numeric_limits<float>::infinity()), value);
      value = xsimd::select(mag > as_float(U(0x3f80007cu)), F(std::numeric_limits<float>::quiet_NaN()), value);
    }
    return as_float(as_bits(value) | sign);
  }
};

// fp8 on AVX2 and AVX-512: each run of `lanes` bytes decoded in channel
// order (AVX-512: through binary16; AVX2: zero-extended, vpmovzxbd, and
// decoded on the lanes); elsewhere byte k of a lane is plane k.
template <class E, class Arch>
struct Fp8Planes {
  using F = xsimd::batch<float, Arch>;
  using U = xsimd::batch<std::uint32_t, Arch>;
  static constexpr bool kInOrder = is_avx512<Arch>() || is_avx2<Arch>();
#if defined(__AVX512F__)
  // AVX-512: 16 codes through binary16, which vcvtph2ps widens exactly
  // (subnormals, infinities, NaN): an E5M2 code is the top byte of a
  // binary16; an E4M3 code's magnitude bits moved one lower (5-bit exponent
  // field, bias 15: the value 2^-8 of its own), times 2^8, and its NaN
  // (0x7f, which lands on 480, a value no finite E4M3 code has) put back.
  static F widen_16(const std::uint8_t* p) noexcept {
    const __m256i w = _mm256_slli_epi16(_mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 8);
    if constexpr (std::is_same<E, Float8E5M2>::value) {
      return F(_mm512_cvtph_ps(w));
    } else {
      const __m256i sign = _mm256_and_si256(w, _mm256_set1_epi16(static_cast<short>(0x8000)));
      const __m256i magnitude = _mm256_and_si256(_mm256_srli_epi16(w, 1), _mm256_set1_epi16(0x3f80));
      const __m512 v = _mm512_mul_ps(_mm512_cvtph_ps(_mm256_or_si256(sign, magnitude)), _mm512_set1_ps(256.0f));
      const __mmask16 nan = _mm512_cmp_ps_mask(_mm512_abs_ps(v), _mm512_set1_ps(480.0f), _CMP_EQ_OQ);
      return F(_mm512_mask_mov_ps(v, nan, _mm512_set1_ps(std::numeric_limits<float>::quiet_NaN())));
    }
  }
#endif
  static void load(const E* e, F* out) noexcept {
    const auto* p = reinterpret_cast<const std::uint8_t*>(e);
#if defined(__AVX512F__)
    if constexpr (is_avx512<Arch>()) {
      ROPE_UNROLL
      for (std::size_t k = 0; k < 4; ++k) out[k] = widen_16(p + 16 * k);
      return;
    }
#endif
#if defined(__AVX2__)
    if constexpr (is_avx2<Arch>()) {
      ROPE_UNROLL
      for (std::size_t k = 0; k < 4; ++k) {
        out[k] = Fp8Lanes<E, Arch>::widen(
            U(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 8 * k)))));
      }
      return;
    }
#endif
    const U u = U::load_unaligned(reinterpret_cast<const std::uint32_t*>(p));
    ROPE_UNROLL
    for (std::size_t k = 0; k < 4; ++k) out[k] = Fp8Lanes<E, Arch>::widen((u >> (8 * k)) & U(0xffu));
  }
};
template <class Arch>
struct KvPlanes<Float8E4M3, Arch> : Fp8Planes<Float8E4M3, Arch> {};
template <class Arch>
struct KvPlanes<Float8E5M2, Arch> : Fp8Planes<Float8E5M2, Arch> {};

template <class E, class Arch>
constexpr std::size_t kv_block() noexcept {
  return KvElement<E>::kPerLane * xsimd::batch<float, Arch>::size;
}

// The most query rows handled together: their sums (rows x planes
// registers) stay in registers, beside one key's planes, while the key or
// value streams past once. A power of two, at most 8.
template <class E, class Arch>
constexpr std::size_t kv_max_rows() noexcept {
  constexpr std::size_t P = KvElement<E>::kPerLane;
  constexpr std::size_t fit = (vector_registers<Arch>() - P - 2) / P;
  return fit >= 8 ? 8 : fit >= 4 ? 4 : fit >= 2 ? 2 : 1;
}

}  // namespace detail
// out = the d floats of x in plane order for E on Arch (out != x): a copy
// where the planes are in channel order.
template <class E, class Arch = xsimd::default_arch>
void permute_row(const float* x, std::size_t d, float* out) noexcept {
  constexpr std::size_t lanes = xsimd::batch<float, Arch>::size;
  constexpr std::size_t P = KvElement<E>::kPerLane;
  constexpr std::size_t W = P * lanes;
  const std::size_t full = detail::KvPlanes<E, Arch>::kInOrder ? 0 : d - d % W;
  for (std::size_t base = 0; base < full; base += W) {
    for (std::size_t i = 0; i < lanes; ++i) {
      ROPE_UNROLL
      for (std::size_t k = 0; k < P; ++k) out[base + k * lanes + i] = x[base + P * i + k];
    }
  }
  for (std::size_t c = full; c < d; ++c) out[c] = x[c];
}

// The inverse of permute_row: out = x back in channel order (out != x).
template <class E, class Arch = xsimd::default_arch>
void unpermute_row(const float* x, std::size_t d, float* out) noexcept {
  constexpr std::size_t lanes = xsimd::batch<float, Arch>::size;
  constexpr std::size_t P = KvElement<E>::kPerLane;
  constexpr std::size_t W = P * lanes;
  const std::size_t full = detail::KvPlanes<E, Arch>::kInOrder ? 0 : d - d % W;
  for (std::size_t base = 0; base < full; base += W) {
    for (std::size_t i = 0; i < lanes; ++i) {
      ROPE_UNROLL
      for (std::size_t k = 0; k < P; ++k) out[base + P * i + k] = x[base + k * lanes + i];
    }
  }
  for (std::size_t c = full; c < d; ++c) out[c] = x[c];
}
}  // namespace rope
