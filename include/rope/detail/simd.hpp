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
//   - available_architectures().best vs .has(A{}), and Arch::version(),
//     which is gone in 13.
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

// Whether the running CPU can execute code compiled for Arch.
template <class Arch>
bool cpu_supports() noexcept {
#if XSIMD_VERSION_MAJOR >= 13
  return xsimd::available_architectures().has(Arch{});
#else
  return xsimd::available_architectures().best >= Arch::version();
#endif
}

// Calls f(Arch{}) for every architecture the translation unit was compiled
// for (its -m flags) that the running CPU also supports.
template <class F>
void for_each_runnable_arch(F&& f) {
  xsimd::supported_architectures::for_each([&](auto arch) {
    if (cpu_supports<decltype(arch)>()) f(arch);
  });
}

}  // namespace rope::detail
