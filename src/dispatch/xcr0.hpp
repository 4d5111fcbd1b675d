// rope::dispatch internals: whether the operating system saves the
// registers of an instruction set, from the value of XCR0 alone. dispatch.cpp
// reads XCR0 (xgetbv) and asks this; test_dispatch asks it about values no
// machine of its own reports.
//
// XCR0 says which register states the operating system saves on a context
// switch. A CPU may report AVX or AVX-512 that the OS leaves disabled, and
// xsimd 8.1 does not look (13 and later do; the check is cheap, so it runs
// for every version). Without OSXSAVE there is no XCR0 to read: dispatch.cpp
// passes 0, which enables the SSE2 baseline alone.
#pragma once

#include <cstdint>
#include <type_traits>

#include <rope/detail/xsimd.hpp>

namespace rope::dispatch::xcr0 {

// The state components of XCR0 an instruction set needs: XMM (SSE), the
// upper halves of YMM (AVX), and AVX-512's opmask registers, the upper halves
// of ZMM0-15 and ZMM16-31 (all three or none).
constexpr std::uint64_t kSse = 0x2, kAvx = 0x4, kAvx512 = 0xe0;

// Whether an operating system whose XCR0 is `xcr0` saves every register
// Arch uses: AVX-512 needs the XMM, YMM and ZMM states, AVX and AVX2 the XMM
// and YMM states; SSE2 (the x86-64 baseline, saved by every x86-64 OS) and
// architectures without XCR0 need nothing from it.
template <class Arch>
constexpr bool enables(std::uint64_t xcr0) noexcept {
  if (std::is_base_of<xsimd::avx512f, Arch>::value) {
    return (xcr0 & (kSse | kAvx | kAvx512)) == (kSse | kAvx | kAvx512);
  }
  if (std::is_base_of<xsimd::avx, Arch>::value) return (xcr0 & (kSse | kAvx)) == (kSse | kAvx);
  return true;
}

}  // namespace rope::dispatch::xcr0
