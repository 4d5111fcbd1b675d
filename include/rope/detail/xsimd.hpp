// rope/detail/xsimd.hpp — xsimd (and the compiler's intrinsics headers it
// brings) for every rope header, included through one door.
//
// g++ 12 reports -Wmaybe-uninitialized / -Wuninitialized inside its own
// AVX-512 intrinsics (avx512fintrin.h: `__m512 __Y = __Y;`, the value of
// _mm512_undefined_ps, a deliberate self-initialisation) wherever one of
// them is inlined with -Wall -march=native: hundreds of warnings in a user's
// translation unit, through xsimd and Eigen alike, and a failed -Werror
// build. The warning is checked at the intrinsic's own line, so it is
// silenced here for the lines of the intrinsics headers only: nothing of
// rope's or the user's code is exempt. Where a translation unit includes
// xsimd, Eigen or <immintrin.h> before any rope header, those lines were read
// outside this region and the compiler warns as it would without rope.
#pragma once

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
// xsimd 14 multiplies through `__int128`, which -Wpedantic reports where
// its headers are not system headers (a -I path rather than -isystem).
#pragma GCC diagnostic ignored "-Wpedantic"
#endif

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif
#include <xsimd/xsimd.hpp>

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
