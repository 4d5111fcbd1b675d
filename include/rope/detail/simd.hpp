// rope/detail/simd.hpp — every xsimd spelling that differs between versions.
//
// rope builds against xsimd 8.1 (Debian bookworm) and current xsimd (13/14).
// The kernels use only what is the same everywhere (batch<T, A>, B::size,
// load_unaligned/store_unaligned as batch members, fma/fnma, arithmetic);
// whatever changed between majors is wrapped here:
//   - batch_constant<batch<U, A>, V...> (<= 12) vs batch_constant<U, A, V...>
//     (>= 13): masks are built from an index_sequence, never with
//     make_batch_constant, whose argument order changed every major;
//   - the batch constructor from lane values (initializer_list in 8.1,
//     variadic later);
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
#include <type_traits>
#include <utility>

#include <xsimd/xsimd.hpp>

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

// (even, odd, even, odd, ...). Brace initialisation is the spelling every
// version accepts: 8.1 has an initializer_list constructor, later versions a
// variadic one.
template <class T, class Arch, std::size_t... I>
xsimd::batch<T, Arch> alternating(T even, T odd, std::index_sequence<I...>) noexcept {
  return xsimd::batch<T, Arch>{(I % 2 == 0 ? even : odd)...};
}
template <class T, class Arch>
xsimd::batch<T, Arch> alternating(T even, T odd) noexcept {
  return alternating<T, Arch>(even, odd, std::make_index_sequence<xsimd::batch<T, Arch>::size>{});
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
