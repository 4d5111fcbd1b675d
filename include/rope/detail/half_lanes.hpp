// rope/detail/half_lanes.hpp — 16-bit storage read and written two values to
// a 32-bit SIMD lane, for the 16-bit row kernels (kernels.hpp).
//
// Loading a row of 16-bit values as 32-bit lanes puts value 2i in the low
// half of lane i and value 2i+1 in the high half (little-endian). low() and
// high() widen those halves to float lanes, exactly; pack() rounds two float
// batches once (to nearest even) and puts them back in the halves. No lane
// crosses another, so the same code holds for every instruction set and
// xsimd version, and each value is converted exactly as the scalar
// conversions of half.hpp convert it (the tests compare them bit for bit).
// NaNs are found as f == f failing: that comparison is ordered (false for a
// NaN) in every instruction set, while xsimd's f != f is ordered on AVX-512
// and unordered on SSE, so it would miss NaNs on one of them.
//
//   BFloat16: the top half of a binary32: widening is a shift, narrowing a
//             carry into the kept half.
//   Float16:  IEEE binary16: rebias the exponent (127 - 15), subnormals
//             through an exact float multiply, overflow to infinity at 65520.
#pragma once

#include <cstdint>
#include <type_traits>

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#endif

#include "xsimd.hpp"

#include "../half.hpp"
#include "simd.hpp"

namespace rope::detail {

template <class Arch>
struct BFloat16Lanes {
  using U = xsimd::batch<std::uint32_t, Arch>;
  using F = xsimd::batch<float, Arch>;

  static F low(const U& v) noexcept { return as_float(v << 16); }
  static F high(const U& v) noexcept { return as_float(v & U(0xffff0000u)); }

  // The bfloat16 of f, rounded to nearest even, in the high half of each
  // lane (the low half is garbage). A NaN keeps its sign and top payload and
  // is made quiet, so that rounding cannot carry it into an infinity.
  static U round_high(const F& f) noexcept {
    const U u = as_bits(f);
    const U rounded = u + U(0x7fffu) + ((u >> 16) & U(1u));
    return as_bits(xsimd::select(f == f, as_float(rounded), as_float(u | U(0x00400000u))));
  }
  static U pack(const F& lo, const F& hi) noexcept {
    return (round_high(lo) >> 16) | (round_high(hi) & U(0xffff0000u));
  }
};

// BFloat16Lanes with the rounding done by AVX512-BF16's vcvtne2ps2bf16
// (Intel Cooper Lake and Sapphire Rapids, AMD Zen 4 and later), for
// AVX-512BW code on a CPU that has it (avx512_bf16_runs). Same bits as
// BFloat16Lanes::pack: the instruction rounds to nearest even and quiets a
// NaN exactly as round_high does, but reads a subnormal input as zero, so a
// pair of batches holding a subnormal goes through the integer rounding
// instead (vfpclassps finds them). The
// instruction is written as inline assembly, which any assembler of the
// toolchains rope supports takes without -mavx512bf16: so this code needs
// no flags beyond AVX-512BW's and is the same in every translation unit,
// and the CPU check (a cached CPUID leaf 7.1 bit) picks it at run time.
template <class Arch>
struct BFloat16HardwareLanes : BFloat16Lanes<Arch> {
  using typename BFloat16Lanes<Arch>::U;
  using typename BFloat16Lanes<Arch>::F;

#if defined(__AVX512BW__) && defined(__AVX512DQ__) && defined(__GNUC__)
  static U pack(const F& lo, const F& hi) noexcept {
    const __m512 l = lo, h = hi;
    if (!_kortestz_mask16_u8(_mm512_fpclass_ps_mask(l, 0x20), _mm512_fpclass_ps_mask(h, 0x20))) {
      return BFloat16Lanes<Arch>::pack(lo, hi);
    }
    __m512i words;  // lo's 16 bfloat16 in the low half, hi's in the high half
    __asm__("vcvtne2ps2bf16 %2, %1, %0" : "=v"(words) : "v"(h), "v"(l));
    // Interleaved back into lanes: word 2i from lo's lane i, 2i+1 from hi's.
    const __m512i order = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6,
                                           21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    return U(_mm512_permutexvar_epi16(order, words));
  }
#endif
};

// Whether the kernels for Arch may use BFloat16HardwareLanes: AVX-512BW
// code (and what xsimd builds on it) on an x86-64 CPU with AVX512-BF16.
template <class Arch>
constexpr bool kBFloat16HardwareArch =
#if defined(__x86_64__) && defined(__AVX512BW__) && defined(__AVX512DQ__) && defined(__GNUC__)
    std::is_base_of<xsimd::avx512bw, Arch>::value;
#else
    false;
#endif

// Whether the running CPU has AVX512-BF16 (CPUID leaf 7 subleaf 1, EAX bit
// 5), asked once. Templated on the architecture whose code calls it, like
// everything rope::dispatch compiles once per instruction set.
template <class Arch>
bool avx512_bf16_runs() noexcept {
#if defined(__x86_64__) && defined(__GNUC__)
  static const bool runs = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (__get_cpuid_max(0, nullptr) < 7) return false;
    __cpuid_count(7, 1, a, b, c, d);
    return (a & (1u << 5)) != 0;
  }();
  return runs;
#else
  return false;
#endif
}

template <class Arch>
struct Float16Lanes {
  using U = xsimd::batch<std::uint32_t, Arch>;
  using F = xsimd::batch<float, Arch>;

  // h holds a binary16 in its low 16 bits, zeros above.
  static F widen(const U& h) noexcept {
    const U sign = (h & U(0x8000u)) << 16;
    const U magnitude = h & U(0x7fffu);
    const U exponent = magnitude >> 10;
    // Normal: rebias the exponent; infinity and NaN: all-ones exponent,
    // payload kept; subnormal and zero: mantissa * 2^-24, exact (2^23 + m
    // minus 2^23 is m exactly).
    const U shifted = magnitude << 13;
    const F normal = as_float(shifted + U(112u << 23));
    const F special = as_float(shifted + U(224u << 23));
    const F tiny = (as_float(magnitude | U(0x4b000000u)) - F(8388608.0f)) * F(5.9604644775390625e-8f);
    // The exponent is compared as the normal float 1 + e * 2^-23: its bits
    // alone would be a subnormal, which a denormals-are-zero mode reads as 0
    // (and xsimd 8.1 cannot select on integer lanes with AVX-512 at -O0).
    const F e = as_float(exponent | U(0x3f800000u));
    const F value = xsimd::select(e == F(1.0f), tiny, xsimd::select(e == as_float(U(0x3f80001fu)), special, normal));
    return as_float(as_bits(value) | sign);
  }
  static F low(const U& v) noexcept { return widen(v & U(0xffffu)); }
  static F high(const U& v) noexcept { return widen(v >> 16); }

  // The binary16 of f, rounded to nearest even, in the low 16 bits of each
  // lane (zeros above): the selects of float_to_float16_bits, lane by lane.
  static U round_low(const F& f) noexcept {
    const U u = as_bits(f);
    const U sign = (u >> 16) & U(0x8000u);
    const U a = u & U(0x7fffffffu);
    const F magnitude = as_float(a);
    const U rebiased = a - U(0x38000000u);
    const U normal = (rebiased + U(0x0fffu) + ((rebiased >> 13) & U(1u))) >> 13;
    const U subnormal = as_bits(magnitude + F(0.5f)) - U(0x3f000000u);
    const U nan = U(0x7e00u) | ((a >> 13) & U(0x3ffu));
    F h = xsimd::select(magnitude < F(6.103515625e-05f), as_float(subnormal), as_float(normal));  // 2^-14
    h = xsimd::select(magnitude >= F(65520.0f), as_float(U(0x7c00u)), h);
    h = xsimd::select(f == f, h, as_float(nan));
    return sign | as_bits(h);
  }
  static U pack(const F& lo, const F& hi) noexcept { return round_low(lo) | (round_low(hi) << 16); }
};

// The lane codec of a 16-bit storage type, for the types the 16-bit kernels
// serve (rope's own; other 2-byte types go through Storage<T>).
template <class T, class Arch>
struct LanesOf;
template <class Arch>
struct LanesOf<BFloat16, Arch> {
  using type = BFloat16Lanes<Arch>;
};
template <class Arch>
struct LanesOf<Float16, Arch> {
  using type = Float16Lanes<Arch>;
};

}  // namespace rope::detail
