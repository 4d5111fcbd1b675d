// The per-architecture loop of rope's tests: every kernel test runs on each
// architecture this build targets and the CPU runs, and names the ones it
// leaves out because they have no batches of the element type (32-bit neon
// has no double), so a skip shows in the test's output.
#pragma once

#include <cstdlib>
#include <iostream>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include <gtest/gtest.h>

#include <rope/detail/simd.hpp>

namespace rope_test {

template <class T>
const char* scalar_name() {
  return std::is_same<T, float>::value ? "float" : std::is_same<T, double>::value ? "double" : "?";
}

// Calls f(Arch{}) on every runnable architecture with batches of T; returns
// the names of the architectures it ran, in the order it ran them.
template <class T, class F>
std::vector<std::string> for_each_arch(F&& f) {
  std::vector<std::string> ran;
  rope::detail::for_each_runnable_arch<T>(
      [&](auto arch) {
        ran.emplace_back(decltype(arch)::name());
        f(arch);
      },
      [](auto arch) {
        std::cout << "[ skipped  ] architecture " << decltype(arch)::name() << ": no batches of " << scalar_name<T>()
                  << "\n";
      });
  return ran;
}

// The architectures this build targets, as GoogleTest types: a typed suite
// over them is named by the architecture (Suite/avx512bw.Test), so a test
// log says which instruction sets ran and which were skipped.
template <class List>
struct TestTypesOf;
template <class... A>
struct TestTypesOf<xsimd::arch_list<A...>> {
  using type = ::testing::Types<A...>;
};
using BuiltArchs = typename TestTypesOf<xsimd::supported_architectures>::type;
// BuiltArchs less the architectures whose code for the attention rows is
// another one's: xsimd's SSE3, SSSE3 and SSE4.2 run SSE4.1's (or SSE2's)
// conversions and arithmetic, FMA on SSE4.2 is FMA on AVX at half the width,
// AVX2 without FMA is AVX2 with FMA's integer code with AVX's rounding, and
// AVX-512 CD and DQ add nothing these kernels use. The attention-row suites
// run on these, which keeps their cost (a suite per element type and
// architecture) to the code that differs; the rotation kernels run on every
// built architecture.
// With ROPE_TESTS_FEW_ARCHS (tests/CMakeLists.txt), one architecture per
// vector width: SSE2, AVX2 with FMA, AVX-512BW, NEON.
#if defined(ROPE_TESTS_FEW_ARCHS)
template <class A>
struct DistinctCode
    : std::integral_constant<bool, std::is_same<A, xsimd::sse2>::value ||
                                       std::is_same<A, xsimd::fma3<xsimd::avx2>>::value ||
                                       std::is_same<A, xsimd::avx512bw>::value
#if defined(__aarch64__) || defined(__arm__)
                                       || std::is_same<A, xsimd::neon>::value || std::is_same<A, xsimd::neon64>::value
#endif
                             > {
};
#else
template <class A>
struct DistinctCode
    : std::integral_constant<bool, std::is_same<A, xsimd::sse2>::value || std::is_same<A, xsimd::sse4_1>::value ||
                                       std::is_same<A, xsimd::avx>::value ||
                                       std::is_same<A, xsimd::fma3<xsimd::avx>>::value ||
                                       std::is_same<A, xsimd::fma3<xsimd::avx2>>::value ||
                                       std::is_same<A, xsimd::avx512f>::value || std::is_same<A, xsimd::avx512bw>::value
#if defined(__aarch64__) || defined(__arm__)
                                       || std::is_same<A, xsimd::neon>::value || std::is_same<A, xsimd::neon64>::value
#endif
                             > {
};
#endif
template <class Kept, class... Rest>
struct KeepDistinct {
  using type = Kept;
};
// One step per architecture: the list kept so far, with A or without it,
// goes on to the rest (naming only the chosen list, so the steps stay
// linear in the number of architectures).
template <class... Kept, class A, class... Rest>
struct KeepDistinct<::testing::Types<Kept...>, A, Rest...> {
  using type = typename KeepDistinct<
      typename std::conditional<DistinctCode<A>::value, ::testing::Types<Kept..., A>, ::testing::Types<Kept...>>::type,
      Rest...>::type;
};
template <class List>
struct DistinctOf;
template <class... A>
struct DistinctOf<xsimd::arch_list<A...>> {
  using type = typename KeepDistinct<::testing::Types<>, A...>::type;
};
using DistinctArchs = typename DistinctOf<xsimd::supported_architectures>::type;

struct ArchNames {
  template <class Arch>
  static std::string GetName(int) {
    return Arch::name();
  }
};

// Whether fused multiply-adds round once on Arch (detail::mul_add): then a
// kernel and its std::fma twin agree bit for bit.
template <class Arch>
constexpr bool kFusedMultiplyAdd =
    std::is_base_of<xsimd::avx512f, Arch>::value || std::is_base_of<xsimd::fma3<xsimd::sse4_2>, Arch>::value ||
    std::is_base_of<xsimd::fma3<xsimd::avx>, Arch>::value || std::is_base_of<xsimd::fma3<xsimd::avx2>, Arch>::value
#if defined(__aarch64__)
    || std::is_base_of<xsimd::neon, Arch>::value
#endif
    ;

// The architectures CI expects this machine to run (ROPE_EXPECT_ARCHS, a
// comma-separated list of xsimd names, e.g. "avx512bw,avx2,sse2"); empty
// when unset.
inline std::vector<std::string> expected_archs() {
  std::vector<std::string> names;
  const char* listed = std::getenv("ROPE_EXPECT_ARCHS");
  if (listed == nullptr) return names;
  std::stringstream in(listed);
  for (std::string name; std::getline(in, name, ',');) {
    if (!name.empty()) names.push_back(name);
  }
  return names;
}

}  // namespace rope_test
