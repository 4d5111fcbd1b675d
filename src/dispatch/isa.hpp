// rope::dispatch internals: the token-loop tables and attention's decode-loop
// tables, one of each per instruction set, defined in its own translation
// unit (loops_<isa>.cpp) compiled with that instruction set's flags
// (cmake/ropeDispatch.cmake).
//
// What keeps the instruction sets apart at link time. A translation unit
// compiled with -mavx2 may emit out-of-line copies of the inline functions
// it uses, and the linker keeps one copy of each inline function for the
// whole program: if an AVX2 copy of a function were also called from
// baseline code, a CPU without AVX2 would fault. So a loops_<isa>.cpp
// instantiates only the token loop (rope::detail::rotate_tokens) and what it
// calls, and all of that is either templated on the xsimd architecture (so
// each instruction set's copy has its own mangled name: rotate_tokens<...,
// xsimd::fma3<xsimd::avx2>, ...> is a different function from rotate_tokens<
// ..., xsimd::sse2, ...>) or forced inline (ROPE_ALWAYS_INLINE: no copy
// exists). The allocations, threads and checks around the loop run in the
// caller's translation unit, with the caller's flags. The test
// dispatch.symbols checks the object files: every function with external
// linkage in an AVX2 or AVX-512 object names that object's architecture.
#pragma once

#include <rope/attention/dispatch_slots.hpp>
#include <rope/tensor/dispatch_table.hpp>

namespace rope::dispatch::isa {

extern const rope::detail::DispatchTable sse2;
extern const rope::detail::DispatchTable avx2;
extern const rope::detail::DispatchTable avx512;
extern const rope::detail::DispatchTable neon;
extern const rope::detail::AttentionTable sse2_attention;
extern const rope::detail::AttentionTable avx2_attention;
extern const rope::detail::AttentionTable avx512_attention;
extern const rope::detail::AttentionTable neon_attention;

}  // namespace rope::dispatch::isa

// Defines the table `name` for the xsimd architecture `arch`, constant-
// initialised (no code runs at start-up), and refuses to compile without
// the flags that architecture needs.
#define ROPE_DISPATCH_DEFINE_LOOPS(name, ...)                                                                  \
  static_assert(__VA_ARGS__::supported(), "loops_" #name ".cpp: compile with the flags of " #__VA_ARGS__);     \
  namespace rope::dispatch::isa {                                                                              \
  constexpr rope::detail::DispatchTable name = rope::detail::make_dispatch_table<__VA_ARGS__>();               \
  constexpr rope::detail::AttentionTable name##_attention = rope::detail::make_attention_table<__VA_ARGS__>(); \
  }
