// rope/detail/simd.hpp — every xsimd spelling that differs between versions.
//
// rope builds against xsimd 8.1 (Debian bookworm) and current xsimd (13/14).
// The kernels use only what is the same everywhere (batch<T, A>, B::size,
// load_unaligned/store_unaligned as batch members, fma/fnma, arithmetic);
// whatever changed between majors is wrapped here:
//   - batch_constant<batch<U, A>, V...> (<= 12) vs batch_constant<U, A, V...>
//     (>= 13): masks are built from an index_sequence, never with
//     make_batch_constant, whose argument order changed every major;
//   - bitwise_cast<batch<U, A>>(x) (<= 12) vs bitwise_cast<U>(x) (>= 13):
//     as_float / as_bits below;
//   - fma/fnma: 8.1 has no AVX-512 or NEON kernel for them and computes
//     x * y + z, which the compiler may contract with either product, so
//     the rounding would be the compiler's choice: mul_add / neg_mul_add;
//   - the batch constructor from lane values (initializer_list in 8.1,
//     variadic later): never used;
//   - hadd (8.1) vs reduce_add (10 and later);
//   - available_architectures().best vs .has(A{}), and Arch::version(),
//     which is gone in 13;
//   - whether batch<T, A> exists at all: 32-bit neon has no double, which
//     8.1 marks with a placeholder register of size 0 and later versions by
//     declaring no register (has_batch below answers for both).
// zip_lo/zip_hi are avoided on purpose: on AVX, xsimd 8.1 interleaves within
// 128-bit lanes while later versions interleave whole halves. Lane
// duplication is a swizzle with a constant mask instead, which means the same
// thing in every version.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

#include "xsimd.hpp"

#include "inline.hpp"

namespace rope::detail {

// The unsigned integer of the same width as T: the element type of a swizzle
// mask for batches of T.
template <class T>
using mask_uint_t = std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>;

// A compile-time batch of indices; Pattern::index(i, n) gives lane i of n.
template <class T, class Arch, class Pattern, std::size_t... I>
constexpr auto make_mask(std::index_sequence<I...>) noexcept {
  using U = mask_uint_t<T>;
  constexpr std::size_t n = sizeof...(I);
#if XSIMD_VERSION_MAJOR >= 13
  return xsimd::batch_constant<U, Arch, static_cast<U>(Pattern::index(I, n))...>{};
#else
  return xsimd::batch_constant<xsimd::batch<U, Arch>, static_cast<U>(Pattern::index(I, n))...>{};
#endif
}

template <class T, class Arch, class Pattern>
constexpr auto mask() noexcept {
  return make_mask<T, Arch, Pattern>(std::make_index_sequence<xsimd::batch<T, Arch>::size>{});
}

struct SwapAdjacent {  // (1, 0, 3, 2, ...)
  static constexpr std::size_t index(std::size_t i, std::size_t) noexcept { return i ^ 1u; }
};
struct DuplicateLow {  // (0, 0, 1, 1, ..., n/2-1, n/2-1)
  static constexpr std::size_t index(std::size_t i, std::size_t) noexcept { return i / 2; }
};
struct DuplicateHigh {  // (n/2, n/2, ..., n-1, n-1)
  static constexpr std::size_t index(std::size_t i, std::size_t n) noexcept { return n / 2 + i / 2; }
};

template <std::size_t K>
struct SwapBlocks {  // lane i ^ K: blocks of K lanes swapped in pairs
  static constexpr std::size_t index(std::size_t i, std::size_t) noexcept { return i ^ K; }
};

// Swaps each even lane with the odd lane after it: one vpermilps on AVX.
template <class T, class Arch>
xsimd::batch<T, Arch> swap_adjacent(const xsimd::batch<T, Arch>& v) noexcept {
  return xsimd::swizzle(v, mask<T, Arch, SwapAdjacent>());
}

// Lanes 0 .. n/2-1 of v, each repeated twice: (v0, v0, v1, v1, ...).
template <class T, class Arch>
xsimd::batch<T, Arch> duplicate_low(const xsimd::batch<T, Arch>& v) noexcept {
  return xsimd::swizzle(v, mask<T, Arch, DuplicateLow>());
}

// Lanes n/2 .. n-1 of v, each repeated twice.
template <class T, class Arch>
xsimd::batch<T, Arch> duplicate_high(const xsimd::batch<T, Arch>& v) noexcept {
  return xsimd::swizzle(v, mask<T, Arch, DuplicateHigh>());
}

// The lanes i of a batch with i & K == 0 (the first of each pair of blocks
// of K lanes), as a batch_bool built from a compare, the same in every
// xsimd version; optimised builds fold it into a constant.
template <class Arch, std::size_t K>
ROPE_ALWAYS_INLINE xsimd::batch_bool<float, Arch> first_blocks() noexcept {
  using F = xsimd::batch<float, Arch>;
  float lanes[F::size];
  for (std::size_t i = 0; i < F::size; ++i) lanes[i] = (i & K) == 0 ? 1.0f : 0.0f;
  return F::load_unaligned(lanes) != F(0.0f);
}

// One step of a transposed sum: with x holding sums of one kind in the
// blocks of K lanes where i & K == 0 and y the same of another kind, the
// lanes i & K == 0 of the result hold x's sums over both blocks, the others
// y's (x_i + x_(i^K) and y_i + y_(i^K)).
template <std::size_t K, class Arch>
ROPE_ALWAYS_INLINE xsimd::batch<float, Arch> fold_pair(const xsimd::batch<float, Arch>& x,
                                                       const xsimd::batch<float, Arch>& y) noexcept {
  const auto first = first_blocks<Arch, K>();
  return xsimd::select(first, x, y) + xsimd::swizzle(xsimd::select(first, y, x), mask<float, Arch, SwapBlocks<K> >());
}

// The butterfly behind fold_sums: step K adds lane i and lane i ^ K, of
// two batches at once (fold_pair) while there are two, then of one.
template <std::size_t K, std::size_t N, class Arch>
ROPE_ALWAYS_INLINE xsimd::batch<float, Arch> fold_from(xsimd::batch<float, Arch>* v) noexcept {
  using F = xsimd::batch<float, Arch>;
  if constexpr (K >= F::size) {
    return v[0];
  } else if constexpr (N > 1) {
    ROPE_UNROLL
    for (std::size_t i = 0; i < N / 2; ++i) v[i] = fold_pair<K, Arch>(v[2 * i], v[2 * i + 1]);
    return fold_from<2 * K, N / 2, Arch>(v);
  } else {
    v[0] = v[0] + xsimd::swizzle(v[0], mask<float, Arch, SwapBlocks<K> >());
    return fold_from<2 * K, 1, Arch>(v);
  }
}

// The sums of the lanes of N batches at once (N a power of two, at most
// the lanes of a batch): lane i of the result is the sum of the lanes of
// v[i % N]. Every sum is added in the same tree of lane pairs (lane i with
// lane i ^ 1, then i ^ 2, ...), whatever N: a batch's sum has the same
// bits alone or folded with others.
template <std::size_t N, class Arch>
ROPE_ALWAYS_INLINE xsimd::batch<float, Arch> fold_sums(const xsimd::batch<float, Arch>* v) noexcept {
  using F = xsimd::batch<float, Arch>;
  static_assert(N >= 1 && N <= F::size && (N & (N - 1)) == 0, "a power of two of at most the lanes");
  F w[N];
  ROPE_UNROLL
  for (std::size_t i = 0; i < N; ++i) w[i] = v[i];
  return fold_from<1, N, Arch>(w);
}

// (even, odd, even, odd, ...), loaded from an array: the batch constructor
// from lane values differs between versions (an initializer_list in 8.1,
// variadic later), and 8.1's leaves out-of-line std::initializer_list
// accessors in unoptimised builds, which rope::dispatch must not have
// (detail/inline.hpp). Optimised builds fold the load into a constant.
template <class T, class Arch>
xsimd::batch<T, Arch> alternating(T even, T odd) noexcept {
  constexpr std::size_t n = xsimd::batch<T, Arch>::size;
  T lanes[n];
  for (std::size_t i = 0; i < n; ++i) lanes[i] = i % 2 == 0 ? even : odd;
  return xsimd::batch<T, Arch>::load_unaligned(lanes);
}

// The bits of a float batch as unsigned lanes, and back: free reinterpretations.
template <class Arch>
xsimd::batch<float, Arch> as_float(const xsimd::batch<std::uint32_t, Arch>& v) noexcept {
#if XSIMD_VERSION_MAJOR >= 13
  return xsimd::bitwise_cast<float>(v);
#else
  return xsimd::bitwise_cast<xsimd::batch<float, Arch> >(v);
#endif
}
template <class Arch>
xsimd::batch<std::uint32_t, Arch> as_bits(const xsimd::batch<float, Arch>& v) noexcept {
#if XSIMD_VERSION_MAJOR >= 13
  return xsimd::bitwise_cast<std::uint32_t>(v);
#else
  return xsimd::bitwise_cast<xsimd::batch<std::uint32_t, Arch> >(v);
#endif
}

// Whether Arch is an x86 instruction set without fused multiply-adds
// (SSE2 .. SSE4.2, AVX, AVX2 without FMA), where xsimd's fma is x * y + z.
template <class Arch>
constexpr bool unfused_x86() noexcept {
  return (std::is_base_of<xsimd::sse2, Arch>::value || std::is_base_of<xsimd::avx, Arch>::value) &&
         !std::is_base_of<xsimd::fma3<xsimd::sse4_2>, Arch>::value &&
         !std::is_base_of<xsimd::fma3<xsimd::avx>, Arch>::value &&
         !std::is_base_of<xsimd::fma3<xsimd::avx2>, Arch>::value && !std::is_base_of<xsimd::fma4, Arch>::value &&
         !std::is_base_of<xsimd::avx512f, Arch>::value;
}

// v, as a value the compiler cannot see into: a product passed through it
// is rounded where it stands and never contracted into a later add.
template <class B>
ROPE_ALWAYS_INLINE B opaque(const B& v) noexcept {
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
  typename B::register_type r = v;
  __asm__("" : "+x"(r));
  return B(r);
#else
  return v;
#endif
}

// x * y + z and z - x * y, each rounded once where Arch has fused
// multiply-adds, twice where it has none (SSE2). Calling the instruction
// itself where xsimd 8.1 would write x * y + z keeps the result what the
// kernel spells: with GCC's default -ffp-contract=fast, z - x * y with z a
// product a * c may otherwise become fma(a, c, -(x * y)), rounding the other
// product, and differ in the last bit from the same kernel on another
// instruction set or xsimd version. On an x86 Arch without fused
// multiply-adds built with flags that have them (-march=native on an FMA
// machine) the compiler would contract x * y + z with either product, or
// neither, kernel by kernel: both terms pass through opaque, so the sum is
// of two rounded values everywhere.
template <class T, class Arch>
xsimd::batch<T, Arch> mul_add(const xsimd::batch<T, Arch>& x, const xsimd::batch<T, Arch>& y,
                              const xsimd::batch<T, Arch>& z) noexcept {
  if constexpr (unfused_x86<Arch>()) return opaque(x * y) + opaque(z);
#if XSIMD_VERSION_MAJOR < 13 && defined(__AVX512F__)
  if constexpr (std::is_base_of<xsimd::avx512f, Arch>::value) {
    if constexpr (std::is_same<T, float>::value) return _mm512_fmadd_ps(x, y, z);
    if constexpr (std::is_same<T, double>::value) return _mm512_fmadd_pd(x, y, z);
  }
#endif
#if XSIMD_VERSION_MAJOR < 13 && defined(__aarch64__)
  // 32-bit neon code running on aarch64 too: there 8.1's fma is a multiply
  // and an add, which the compiler contracts in some kernels and not others.
  if constexpr (std::is_base_of<xsimd::neon, Arch>::value) {
    if constexpr (std::is_same<T, float>::value) return vfmaq_f32(z, x, y);
    if constexpr (std::is_same<T, double>::value) return vfmaq_f64(z, x, y);
  }
#endif
  return xsimd::fma(x, y, z);
}
template <class T, class Arch>
xsimd::batch<T, Arch> neg_mul_add(const xsimd::batch<T, Arch>& x, const xsimd::batch<T, Arch>& y,
                                  const xsimd::batch<T, Arch>& z) noexcept {
  if constexpr (unfused_x86<Arch>()) return opaque(z) - opaque(x * y);
#if XSIMD_VERSION_MAJOR < 13 && defined(__AVX512F__)
  if constexpr (std::is_base_of<xsimd::avx512f, Arch>::value) {
    if constexpr (std::is_same<T, float>::value) return _mm512_fnmadd_ps(x, y, z);
    if constexpr (std::is_same<T, double>::value) return _mm512_fnmadd_pd(x, y, z);
  }
#endif
#if XSIMD_VERSION_MAJOR < 13 && defined(__aarch64__)
  if constexpr (std::is_base_of<xsimd::neon, Arch>::value) {
    if constexpr (std::is_same<T, float>::value) return vfmsq_f32(z, x, y);
    if constexpr (std::is_same<T, double>::value) return vfmsq_f64(z, x, y);
  }
#endif
  return xsimd::fnma(x, y, z);
}

// A batch from the first `bytes` bytes at p (bytes <= the batch's size; the
// rest of the lanes zero), and the first `bytes` bytes of v stored at p:
// nothing past them is read or written. With AVX-512BW one masked load or
// store at byte granularity; elsewhere through a small buffer. For the rows
// shorter than one batch (partial rotary: 24 channels against AVX-512's 16
// float lanes).
template <class B>
B load_partial(const void* p, std::size_t bytes) noexcept {
  using T = typename B::value_type;
#if defined(__AVX512BW__)
  if constexpr (std::is_base_of<xsimd::avx512bw, typename B::arch_type>::value) {
    const __mmask64 mask = bytes >= 64 ? ~__mmask64(0) : (__mmask64(1) << bytes) - 1;
    const __m512i v = _mm512_maskz_loadu_epi8(mask, p);
    if constexpr (std::is_same<T, float>::value) return _mm512_castsi512_ps(v);
    if constexpr (std::is_same<T, double>::value) return _mm512_castsi512_pd(v);
    if constexpr (std::is_integral<T>::value) return v;
  }
#endif
  T lanes[B::size] = {};
  std::memcpy(lanes, p, bytes);
  return B::load_unaligned(lanes);
}
template <class B>
void store_partial(const B& v, void* p, std::size_t bytes) noexcept {
  using T = typename B::value_type;
#if defined(__AVX512BW__)
  if constexpr (std::is_base_of<xsimd::avx512bw, typename B::arch_type>::value) {
    const __mmask64 mask = bytes >= 64 ? ~__mmask64(0) : (__mmask64(1) << bytes) - 1;
    if constexpr (std::is_same<T, float>::value) return _mm512_mask_storeu_epi8(p, mask, _mm512_castps_si512(v));
    if constexpr (std::is_same<T, double>::value) return _mm512_mask_storeu_epi8(p, mask, _mm512_castpd_si512(v));
    if constexpr (std::is_integral<T>::value) return _mm512_mask_storeu_epi8(p, mask, v);
  }
#endif
  T lanes[B::size];
  v.store_unaligned(lanes);
  std::memcpy(p, lanes, bytes);
}

// The narrowing stores' fallback: a cast per lane, through a buffer.
template <class Out, class T, class Arch>
void store_cast(const xsimd::batch<T, Arch>& v, Out* out) noexcept {
  constexpr std::size_t n = xsimd::batch<T, Arch>::size;
  T lanes[n];
  v.store_unaligned(lanes);
  for (std::size_t i = 0; i < n; ++i) out[i] = static_cast<Out>(lanes[i]);
}

// The lanes of v narrowed and stored as v's size consecutive values at out:
// store_low_halves keeps the low 16 bits of lanes below 2^16, store_bytes
// the low byte of lanes in [-128, 127]. Exact for such lanes, so each is
// what a scalar loop of casts stores. One narrowing instruction or pack on
// x86 (AVX-512F: vpmovdw / vpmovdb; AVX: the two 128-bit halves packed;
// SSE4.1 for the halves, SSE2 for the bytes) and NEON (vmovn); elsewhere
// lane by lane through a buffer. A cast per lane compiles to an extract
// and an insert per lane instead: 18% of the fused pre-attention step's
// time over a bf16 cache when profiled (bench_fused.cpp, AVX2).
template <class Arch>
void store_low_halves(const xsimd::batch<std::uint32_t, Arch>& v, std::uint16_t* out) noexcept {
#if defined(__AVX512F__)
  if constexpr (std::is_base_of<xsimd::avx512f, Arch>::value) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), _mm512_cvtepi32_epi16(v));
    return;
  }
#endif
#if defined(__AVX__)
  if constexpr (std::is_base_of<xsimd::avx, Arch>::value) {
    const __m256i r = v;
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out),
                     _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extractf128_si256(r, 1)));
    return;
  }
#endif
#if defined(__SSE4_1__)
  if constexpr (std::is_base_of<xsimd::sse4_1, Arch>::value) {
    const __m128i r = v;
    _mm_storel_epi64(reinterpret_cast<__m128i*>(out), _mm_packus_epi32(r, r));
    return;
  }
#endif
#if defined(__ARM_NEON)
  if constexpr (std::is_base_of<xsimd::neon, Arch>::value) {
    vst1_u16(out, vmovn_u32(v));
    return;
  }
#endif
  store_cast(v, out);
}
template <class Arch>
void store_bytes(const xsimd::batch<std::int32_t, Arch>& v, std::int8_t* out) noexcept {
#if defined(__AVX512F__)
  if constexpr (std::is_base_of<xsimd::avx512f, Arch>::value) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm512_cvtepi32_epi8(v));
    return;
  }
#endif
#if defined(__AVX__)
  if constexpr (std::is_base_of<xsimd::avx, Arch>::value) {
    const __m256i r = v;
    const __m128i words = _mm_packs_epi32(_mm256_castsi256_si128(r), _mm256_extractf128_si256(r, 1));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(out), _mm_packs_epi16(words, words));
    return;
  }
#endif
#if defined(__SSE2__)
  if constexpr (std::is_base_of<xsimd::sse2, Arch>::value) {
    const __m128i r = v;
    const __m128i words = _mm_packs_epi32(r, r);
    const int four = _mm_cvtsi128_si32(_mm_packs_epi16(words, words));
    std::memcpy(out, &four, sizeof(four));
    return;
  }
#endif
  store_cast(v, out);
}

// How many vector registers code for Arch has: 32 with AVX-512 and on
// aarch64, 16 otherwise (SSE and AVX on x86-64, 32-bit NEON): what sizes the
// blocks of constants the kernels reuse across head vectors.
template <class Arch>
constexpr std::size_t vector_registers() noexcept {
  return std::is_base_of<xsimd::avx512f, Arch>::value || std::is_base_of<xsimd::neon64, Arch>::value ? 32 : 16;
}

// Calls block<R>(r) for consecutive groups of rows covering 0 .. rows-1,
// each group the largest power of two <= Max that fits what is left.
template <std::size_t Max, class Block>
void for_row_groups(std::size_t rows, Block&& block) noexcept {
  std::size_t r = 0;
  while (r < rows) {
    const std::size_t left = rows - r;
    if (Max >= 8 && left >= 8) {
      block(std::integral_constant<std::size_t, (Max >= 8 ? 8 : 1)>{}, r);
      r += 8;
    } else if (Max >= 4 && left >= 4) {
      block(std::integral_constant<std::size_t, (Max >= 4 ? 4 : 1)>{}, r);
      r += 4;
    } else if (Max >= 2 && left >= 2) {
      block(std::integral_constant<std::size_t, (Max >= 2 ? 2 : 1)>{}, r);
      r += 2;
    } else {
      block(std::integral_constant<std::size_t, 1>{}, r);
      r += 1;
    }
  }
}

// The sum of the lanes: hadd in xsimd 8.1, reduce_add since 10 (hadd is gone in 14).
template <class T, class Arch>
T sum_lanes(const xsimd::batch<T, Arch>& v) noexcept {
#if XSIMD_VERSION_MAJOR >= 10
  return xsimd::reduce_add(v);
#else
  return xsimd::hadd(v);
#endif
}

// Whether the running CPU can execute code compiled for Arch.
template <class Arch>
bool cpu_supports() noexcept {
#if XSIMD_VERSION_MAJOR >= 13
  return xsimd::available_architectures().has(Arch{});
#else
  return xsimd::available_architectures().best >= Arch::version();
#endif
}

// Whether xsimd::batch<T, Arch> exists, so that code per architecture can
// leave out the types an architecture lacks (32-bit neon: double) instead of
// failing to compile. has_simd_register alone is not enough: xsimd 8.1 sets
// it for (double, neon) with a placeholder register, which makes batches of
// size 0; later versions set it false. The size is read only when the
// register is declared, since batch<T, Arch> may not be instantiable
// otherwise.
template <class T, class Arch, bool Declared = xsimd::has_simd_register<T, Arch>::value>
struct has_batch : std::false_type {};
template <class T, class Arch>
struct has_batch<T, Arch, true> : std::integral_constant<bool, (xsimd::batch<T, Arch>::size > 0)> {};

// Calls f(Arch{}) for every architecture the translation unit was compiled
// for (its -m flags) that the running CPU also supports and that has
// batches of T. An architecture without batches of T is passed to
// no_batch(Arch{}) instead, so that a caller can say what it left out;
// f is never instantiated for it.
template <class T, class F, class NoBatch>
void for_each_runnable_arch(F&& f, NoBatch&& no_batch) {
  xsimd::supported_architectures::for_each([&](auto arch) {
    using Arch = decltype(arch);
    if constexpr (has_batch<T, Arch>::value) {
      if (cpu_supports<Arch>()) f(arch);
    } else {
      no_batch(arch);
    }
  });
}

}  // namespace rope::detail
