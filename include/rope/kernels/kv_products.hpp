// rope/kernels/kv_products.hpp — the decode loop's scores in the opt-in
// product modes (Products), beside the exact float products of kv_dot.hpp.
//
//   exact  every product a float fused multiply-add over widened values
//   bf16   bf16 caches: q rounded to bf16 once per call, each score the
//          AVX512-BF16 dot product of q and the stored key (vdpbf16ps)
//   int8   int8 caches: q quantized per (token, head) row with its own
//          scale, each score an integer dot product (AVX512-VNNI vpdpbusd)
//          times the two scales
//
// Both modes are defined by their arithmetic, not by an instruction, so a
// score has the same bits on every instruction set and CPU:
//
//   bf16   16 lanes; lane i takes, for each block of 32 channels from 0,
//          the product of channels 2i + 1, then of 2i:
//            s_i <- ftz(round(s_i + q_c k_c)),
//          the product exact, the sum rounded once to float, then flushed
//          to a zero of its sign below 2^-126 (ftz; q and k read so too),
//          channels past d read as +0; then the lanes added in the tree
//          ((s0 + s1) + (s2 + s3)) + ..., then times the scale. That is what
//          vdpbf16ps does, measured bit for bit on an Intel Sapphire Rapids
//          (tests/test_kernels_kv_products.cpp asks the CPU it runs on);
//          where the CPU lacks it, one float fused multiply-add per step
//          where no sum can be flushed (kBf16FusedArch), else the same
//          steps lane by lane.
//   int8   q_c = round_half_even(x_c / s), s = max_c |x_c| / 127 as the
//          int8 cache scales its rows (kv_store.hpp: the least subnormal
//          where that underflows; a row of zeros: s = 0, q = 0; a row with a
//          NaN or an infinity: every score NaN); sum_c q_c k_c in 32-bit integers, exact (|sum| <= d
//          * 127 * 128); score = (float(sum) * s) * (scale * k_scale). On
//          AVX512-VNNI as vpdpbusd over (k + 128) as unsigned bytes, less 128
//          sum_c q_c; with AVX2 as vpmaddubsw over |k| and q with k's
//          sign; elsewhere in integers: the same sum every way.
//
// The instructions are written as inline assembly that the assemblers of
// every toolchain rope supports take without -mavx512bf16 or -mavx512vnni,
// in AVX-512BW code, picked at run time by a cached CPUID bit (as
// detail/half_lanes.hpp picks vcvtne2ps2bf16).
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "../detail/half_lanes.hpp"
#include "../detail/inline.hpp"
#include "../detail/simd.hpp"
#include "../detail/xsimd.hpp"
#include "../half.hpp"
#include "../products.hpp"
#include "kv_product_steps.hpp"

namespace rope {
namespace detail {

// The same sums by vdpbf16ps (AVX-512BW code on a CPU with AVX512-BF16).
template <class Arch>
constexpr bool kBf16DotArch = kBFloat16HardwareArch<Arch>;

#if defined(__x86_64__) && defined(__AVX512BW__) && defined(__AVX512DQ__) && defined(__GNUC__)
// The same sums by vdpbf16ps for n <= 4 rows, each key block loaded once,
// then their trees (fold_sums adds the lanes in that tree) times scale.
template <class Arch>
ROPE_ALWAYS_INLINE void bf16_scores_vdpbf16ps(const std::uint16_t* q, std::size_t q_stride, std::size_t n,
                                              const BFloat16* key, std::size_t d, float* out, std::size_t stride,
                                              float scale) noexcept {
  using F = xsimd::batch<float, Arch>;
  __m512 s[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
  const auto* k = reinterpret_cast<const std::uint16_t*>(key);
  for (std::size_t base = 0; base < d; base += kBf16Block) {
    const std::size_t left = d - base < kBf16Block ? d - base : kBf16Block;
    const __m512i kv = _mm512_maskz_loadu_epi16(static_cast<__mmask32>(left == 32 ? ~0u : (1u << left) - 1u), k + base);
    for (std::size_t r = 0; r < n; ++r) {
      const __m512i qv = _mm512_loadu_si512(q + r * q_stride + base);
      __asm__("vdpbf16ps %2, %1, %0" : "+v"(s[r]) : "v"(qv), "v"(kv));
    }
  }
  alignas(64) float lanes[kBf16Lanes];
  if (n == 4) {
    const F sums[4] = {F(s[0]), F(s[1]), F(s[2]), F(s[3])};
    (fold_sums<4, Arch>(sums) * F(scale)).store_aligned(lanes);
    for (std::size_t r = 0; r < 4; ++r) out[r * stride] = lanes[r];
    return;
  }
  for (std::size_t r = 0; r < n; ++r) {
    const F sum(s[r]);
    (fold_sums<1, Arch>(&sum) * F(scale)).store_aligned(lanes);
    out[r * stride] = lanes[0];
  }
}
#endif

// The bf16 mode in float fused multiply-adds, where the CPU has no
// vdpbf16ps but has FMA (x86 with AVX2 and FMA, or AVX-512 without BF16).
// A lane's step s <- ftz(round(s + q_c k_c)) is then one fused
// multiply-add whenever nothing is flushed: the FMA rounds s + q_c k_c
// once, as the definition does. Nothing is flushed when every product
// q_c k_c is a multiple of 2^-126, that is when the exponent fields of
// every nonzero q_c and k_c add to at least 142 (a nonzero bf16 value of
// field E is an integer times 2^(E - 134)) and no value is subnormal:
// then every sum, exact or rounded to float, stays a multiple of 2^-126,
// so it is zero or at least FLT_MIN (a multiple of 2^-126 that a float
// cannot hold has an ulp above 2^-126, and rounds to a multiple of that).
// Both the fused steps and the lanes' steps then give the same bits;
// keys outside that (tiny or subnormal values, infinities, NaN) take the
// lanes' steps. q, widened once per call (bf16_query_wide), and a key's
// values each need their least exponent field (bf16_least_exponent).
template <class Arch>
constexpr bool kBf16FusedArch =
#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__) && defined(__GNUC__)
    std::is_base_of<xsimd::fma3<xsimd::avx2>, Arch>::value || std::is_base_of<xsimd::avx512bw, Arch>::value;
#else
    false;
#endif

// Code whose int8 sums may take AVX2's byte products (int8_sums_avx2).
template <class Arch>
constexpr bool kInt8Avx2Arch =
#if defined(__x86_64__) && defined(__AVX2__) && defined(__GNUC__)
    std::is_base_of<xsimd::avx2, Arch>::value || std::is_base_of<xsimd::avx512bw, Arch>::value;
#else
    false;
#endif

// Whether a call's scores take the fused twin: its code is built for an
// instruction set with FMA, and vdpbf16ps does not run (or may not).
template <class Arch>
bool bf16_fused_runs() noexcept {
  if constexpr (kBf16FusedArch<Arch>) {
    if constexpr (kBf16DotArch<Arch>) {
      if (avx512_bf16_runs<Arch>() && products_hardware_allowed()) return false;
    }
    return true;
  }
  return false;
}

// bf16_least_exponent of a key, 16 values at a time where the code has
// AVX2: the least of each value's bits less one (a zero wraps to the
// most) and the most of them.
ROPE_ALWAYS_INLINE unsigned bf16_key_least(const BFloat16* key, std::size_t d) noexcept {
  const auto* k = reinterpret_cast<const std::uint16_t*>(key);
#if !(defined(__x86_64__) && defined(__AVX2__) && defined(__GNUC__))
  return bf16_least_exponent(k, d);
#else
  const __m256i magnitude = _mm256_set1_epi16(0x7fff), one = _mm256_set1_epi16(1);
  __m256i low = _mm256_set1_epi16(-1), high = _mm256_setzero_si256();
  std::size_t c = 0;
  for (; c + 16 <= d; c += 16) {
    const __m256i a = _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(k + c)), magnitude);
    low = _mm256_min_epu16(low, _mm256_sub_epi16(a, one));
    high = _mm256_max_epu16(high, a);
  }
  // The least and the most of the 16 lanes (the most as the least of
  // their complements).
  const __m128i low8 = _mm_min_epu16(_mm256_castsi256_si128(low), _mm256_extracti128_si256(low, 1));
  const __m128i high8 = _mm_max_epu16(_mm256_castsi256_si128(high), _mm256_extracti128_si256(high, 1));
  const unsigned least_less_one = static_cast<unsigned>(_mm_cvtsi128_si32(_mm_minpos_epu16(low8))) & 0xffffu;
  const unsigned most =
      0xffffu -
      (static_cast<unsigned>(_mm_cvtsi128_si32(_mm_minpos_epu16(_mm_xor_si128(high8, _mm_set1_epi16(-1))))) & 0xffffu);
  if (most >= 0x7f80u) return 0;
  // A subnormal least value gives field 0: the lanes' steps.
  unsigned least = least_less_one == 0xffffu ? 0x1ffu : (least_less_one + 1) >> 7;
  if (c < d) {
    const unsigned tail = bf16_least_exponent(k + c, d - c);
    least = tail < least ? tail : least;
  }
  return least;
#endif
}

#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__) && defined(__GNUC__)

// The bf16 mode's scores of N <= 4 rows of widened q (bf16_query_wide,
// q_stride floats apart) against one key, in fused multiply-adds: for
// keys bf16_fused_exact admits, the bits of the lanes' steps.
template <std::size_t N, class Arch>
ROPE_ALWAYS_INLINE void bf16_scores_fused(const float* q, std::size_t q_stride, const BFloat16* key, std::size_t d,
                                          float* out, std::size_t stride, float scale) noexcept {
  using F = xsimd::batch<float, Arch>;
  using U = xsimd::batch<std::uint32_t, Arch>;
  constexpr std::size_t W = F::size, B = kBf16Lanes / W;                           // batches per row's 16 lanes
  constexpr std::size_t P = N * B == 1 ? 1 : N * B <= 2 ? 2 : N * B <= 4 ? 4 : 8;  // batches folded at once
  F s[P];
  ROPE_UNROLL
  for (std::size_t i = 0; i < P; ++i) s[i] = F(0.0f);
  const U high(0xffff0000u);
  const auto* k = reinterpret_cast<const std::uint16_t*>(key);
  for (std::size_t base = 0; base < d; base += kBf16Block) {
    alignas(64) std::uint16_t tail[kBf16Block];
    const std::uint16_t* block = k + base;
    if (d - base < kBf16Block) {  // channels past d read as +0
      for (std::size_t c = 0; c < kBf16Block; ++c) tail[c] = base + c < d ? k[base + c] : 0;
      block = tail;
    }
    F odd[B], even[B];
    ROPE_UNROLL
    for (std::size_t j = 0; j < B; ++j) {
      // Channels 2i and 2i + 1 in one 32-bit word: the even one's bits in
      // its low half, the odd one's in its high half.
      const U w = U::load_unaligned(reinterpret_cast<const std::uint32_t*>(block) + j * W);
      even[j] = as_float<Arch>(w << 16);
      odd[j] = as_float<Arch>(w & high);
    }
    ROPE_UNROLL
    for (std::size_t r = 0; r < N; ++r) {
      const float* qr = q + r * q_stride + base;
      ROPE_UNROLL
      for (std::size_t j = 0; j < B; ++j) {
        s[r * B + j] = xsimd::fma(F::load_unaligned(qr + j * W), odd[j], s[r * B + j]);
        s[r * B + j] = xsimd::fma(F::load_unaligned(qr + kBf16Lanes + j * W), even[j], s[r * B + j]);
      }
    }
  }
  // The lanes' tree: each batch's own (fold_sums), then, where a row's 16
  // lanes span two batches, lanes 0-7 plus lanes 8-15.
  alignas(64) float sums[W];
  fold_sums<P, Arch>(s).store_aligned(sums);
  for (std::size_t r = 0; r < N; ++r) {
    out[r * stride] = (B == 1 ? sums[r] : sums[r * B] + sums[r * B + 1]) * scale;
  }
}
#endif

// Scores of the bf16 mode: out[r * stride] = tree(lanes of row r) * scale
// for `rows` rows of q (q_stride values apart) against one key. Where the
// fused twin runs (bf16_fused_runs), q_wide holds the same rows widened
// (bf16_query_wide, wide_stride floats apart) and q_least the least of
// their bf16_least_exponent; otherwise q_wide is null.
template <class Arch>
ROPE_ALWAYS_INLINE void bf16_scores(const std::uint16_t* q, std::size_t q_stride, std::size_t rows, const BFloat16* key,
                                    std::size_t d, float* out, std::size_t stride, float scale,
                                    const float* q_wide = nullptr, std::size_t wide_stride = 0,
                                    unsigned q_least = 0) noexcept {
  alignas(64) float lanes[kBf16Lanes];
#if defined(__x86_64__) && defined(__AVX512BW__) && defined(__AVX512DQ__) && defined(__GNUC__)
  if constexpr (kBf16DotArch<Arch>) {
    if (avx512_bf16_runs<Arch>() && products_hardware_allowed()) {
      for (std::size_t r = 0; r < rows; r += 4) {
        bf16_scores_vdpbf16ps<Arch>(q + r * q_stride, q_stride, rows - r < 4 ? rows - r : 4, key, d, out + r * stride,
                                    stride, scale);
      }
      return;
    }
  }
#endif
#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__) && defined(__GNUC__)
  if constexpr (kBf16FusedArch<Arch>) {
    if (q_wide != nullptr && bf16_fused_exact(q_least, bf16_key_least(key, d))) {
      std::size_t r = 0;
      for (; r + 4 <= rows; r += 4)
        bf16_scores_fused<4, Arch>(q_wide + r * wide_stride, wide_stride, key, d, out + r * stride, stride, scale);
      const float* qr = q_wide + r * wide_stride;
      float* o = out + r * stride;
      if (rows - r == 3) bf16_scores_fused<3, Arch>(qr, wide_stride, key, d, o, stride, scale);
      if (rows - r == 2) bf16_scores_fused<2, Arch>(qr, wide_stride, key, d, o, stride, scale);
      if (rows - r == 1) bf16_scores_fused<1, Arch>(qr, wide_stride, key, d, o, stride, scale);
      return;
    }
  }
#endif
  (void)q_wide;
  (void)wide_stride;
  (void)q_least;
  for (std::size_t r = 0; r < rows; ++r) {
    bf16_lanes(q + r * q_stride, key, d, lanes);
    out[r * stride] = bf16_tree(lanes) * scale;
  }
}

#if defined(__x86_64__) && defined(__AVX512BW__) && defined(__GNUC__)
// The same sums by vpdpbusd over the key's bytes plus 128 (unsigned) and q
// (signed), less 128 * sum_c q_c, for n <= 4 rows: each key block loaded
// once, the four rows' lanes added together (integers: any order).
ROPE_ALWAYS_INLINE void int8_sums_vpdpbusd(const std::int8_t* q, std::size_t q_stride, std::size_t n,
                                           const std::int8_t* key, std::size_t d, const std::int32_t* q_sums,
                                           std::int32_t* out) noexcept {
  __m512i s[4] = {_mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512()};
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  for (std::size_t base = 0; base < d; base += kInt8Block) {
    const std::size_t left = d - base < kInt8Block ? d - base : kInt8Block;
    const __mmask64 m = left == 64 ? ~__mmask64{0} : (__mmask64{1} << left) - 1;
    const __m512i k = _mm512_xor_si512(_mm512_maskz_loadu_epi8(m, key + base), flip);
    for (std::size_t r = 0; r < n; ++r) {
      const __m512i qv = _mm512_loadu_si512(q + r * q_stride + base);
      __asm__("vpdpbusd %2, %1, %0" : "+v"(s[r]) : "v"(k), "v"(qv));
    }
  }
  // Rows side by side in each 128-bit part, then the four parts added.
  const __m512i t01 = _mm512_add_epi32(_mm512_unpacklo_epi32(s[0], s[1]), _mm512_unpackhi_epi32(s[0], s[1]));
  const __m512i t23 = _mm512_add_epi32(_mm512_unpacklo_epi32(s[2], s[3]), _mm512_unpackhi_epi32(s[2], s[3]));
  const __m512i t = _mm512_add_epi32(_mm512_unpacklo_epi64(t01, t23), _mm512_unpackhi_epi64(t01, t23));
  const __m256i h = _mm256_add_epi32(_mm512_castsi512_si256(t), _mm512_extracti64x4_epi64(t, 1));
  const __m128i x = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
  alignas(16) std::int32_t rows[4];
  _mm_store_si128(reinterpret_cast<__m128i*>(rows), x);
  // Past d the key's bytes read 0, +128 once flipped, against q's zeros.
  for (std::size_t r = 0; r < n; ++r) out[r] = rows[r] - 128 * q_sums[r];
}
#endif

#if defined(__x86_64__) && defined(__AVX2__) && defined(__GNUC__)
// The same sums in AVX2 integers for n <= 4 rows, 32 bytes at a time:
// vpmaddubsw of |k| (unsigned, at most 128) and q with k's sign (vpsignb),
// each pair of products at most 2 * 128 * 127 = 32512 in 16 bits, exact;
// then pairs of those into 32-bit lanes (vpmaddwd by ones). Integers: the
// same sum in any order. A key's bytes past its last whole 32 are copied
// out, padded with zeros.
ROPE_ALWAYS_INLINE void int8_sums_avx2(const std::int8_t* q, std::size_t q_stride, std::size_t n,
                                       const std::int8_t* key, std::size_t d, std::int32_t* out) noexcept {
  __m256i s[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256()};
  const __m256i ones = _mm256_set1_epi16(1);
  for (std::size_t base = 0; base < d; base += 32) {
    alignas(32) std::int8_t tail[32];
    const std::int8_t* block = key + base;
    if (d - base < 32) {
      for (std::size_t c = 0; c < 32; ++c) tail[c] = base + c < d ? key[base + c] : 0;
      block = tail;
    }
    const __m256i k = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block));
    const __m256i magnitude = _mm256_abs_epi8(k);
    for (std::size_t r = 0; r < n; ++r) {
      const __m256i qv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + r * q_stride + base));
      const __m256i pairs = _mm256_maddubs_epi16(magnitude, _mm256_sign_epi8(qv, k));
      s[r] = _mm256_add_epi32(s[r], _mm256_madd_epi16(pairs, ones));
    }
  }
  for (std::size_t r = 0; r < n; ++r) {
    const __m128i h = _mm_add_epi32(_mm256_castsi256_si128(s[r]), _mm256_extracti128_si256(s[r], 1));
    const __m128i x = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0x4e));
    out[r] = _mm_cvtsi128_si32(_mm_add_epi32(x, _mm_shuffle_epi32(x, 0xb1)));
  }
}
#endif

// Scores of the int8 mode: out[r * stride] = (float(sum) * s_r) * scales[r]
// for `rows` rows of q (q_stride bytes apart; s_r, the row's scale, and its
// byte sum at q_scales[r], q_sums[r]) against one key.
template <class Arch>
ROPE_ALWAYS_INLINE void int8_scores(const std::int8_t* q, std::size_t q_stride, std::size_t rows, const float* q_scales,
                                    const std::int32_t* q_sums, const std::int8_t* key, std::size_t d, float* out,
                                    std::size_t stride, float scale) noexcept {
#if defined(__x86_64__) && defined(__AVX512BW__) && defined(__GNUC__)
  if constexpr (std::is_base_of<xsimd::avx512bw, Arch>::value) {
    if (avx512_vnni_runs<Arch>() && products_hardware_allowed()) {
      std::int32_t sums[4];
      for (std::size_t r = 0; r < rows; r += 4) {
        const std::size_t n = rows - r < 4 ? rows - r : 4;
        int8_sums_vpdpbusd(q + r * q_stride, q_stride, n, key, d, q_sums + r, sums);
        for (std::size_t i = 0; i < n; ++i)
          out[(r + i) * stride] = (static_cast<float>(sums[i]) * q_scales[r + i]) * scale;
      }
      return;
    }
  }
#endif
  (void)q_sums;  // the integer sum needs no correction
#if defined(__x86_64__) && defined(__AVX2__) && defined(__GNUC__)
  if constexpr (kInt8Avx2Arch<Arch>) {
    if (products_hardware_allowed()) {
      std::int32_t sums[4];
      for (std::size_t r = 0; r < rows; r += 4) {
        const std::size_t n = rows - r < 4 ? rows - r : 4;
        int8_sums_avx2(q + r * q_stride, q_stride, n, key, d, sums);
        for (std::size_t i = 0; i < n; ++i)
          out[(r + i) * stride] = (static_cast<float>(sums[i]) * q_scales[r + i]) * scale;
      }
      return;
    }
  }
#endif
  for (std::size_t r = 0; r < rows; ++r) {
    out[r * stride] = (static_cast<float>(int8_sum(q + r * q_stride, key, d)) * q_scales[r]) * scale;
  }
}

// Which instruction a mode's scores take on this CPU, in code built for Arch.
template <class Arch>
const char* products_path(Products mode) noexcept {
  if (mode == Products::bf16) {
    if constexpr (kBf16DotArch<Arch>) {
      if (avx512_bf16_runs<Arch>() && products_hardware_allowed()) return "vdpbf16ps";
    }
    if (bf16_fused_runs<Arch>()) return "float fma (vdpbf16ps's bits)";
    return "lane by lane";
  }
  if (mode == Products::int8) {
#if defined(__x86_64__) && defined(__AVX512BW__) && defined(__GNUC__)
    if constexpr (std::is_base_of<xsimd::avx512bw, Arch>::value) {
      if (avx512_vnni_runs<Arch>() && products_hardware_allowed()) return "vpdpbusd";
    }
#endif
    if constexpr (kInt8Avx2Arch<Arch>) {
      if (products_hardware_allowed()) return "vpmaddubsw";
    }
    return "integers";
  }
  return "float fma";
}

}  // namespace detail
}  // namespace rope
