// rope/detail/inline.hpp — inlining attributes.
//
// ROPE_NOINLINE keeps a rarely taken path (a row's padded tail) out of the
// hot loop's stack frame.
//
// ROPE_ALWAYS_INLINE marks the few small helpers that are not templated on
// the SIMD architecture but are called from code that is (the token loop's
// position lookup, row addressing, prefetch). Forced inlining means no
// out-of-line copy of them exists: rope::dispatch compiles that code once per
// instruction set, and an out-of-line copy compiled with AVX-512 flags could
// otherwise be the one the linker keeps for every caller (see docs/dispatch.md).
#pragma once

#if defined(_MSC_VER)
#define ROPE_NOINLINE __declspec(noinline)
#define ROPE_ALWAYS_INLINE __forceinline
#else
#define ROPE_NOINLINE __attribute__((noinline))
#define ROPE_ALWAYS_INLINE inline __attribute__((always_inline))
#endif

// Unrolls the loop that follows completely (loops over a compile-time count
// of registers: without it an array of batches may live on the stack).
#if defined(__clang__)
#define ROPE_UNROLL _Pragma("unroll")
#elif defined(__GNUC__)
#define ROPE_UNROLL _Pragma("GCC unroll 32")
#else
#define ROPE_UNROLL
#endif
