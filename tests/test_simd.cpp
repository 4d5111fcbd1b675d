// The per-architecture loop of detail/simd.hpp: which architectures have
// batches of which type, and that the loop the kernel tests rely on really
// runs the instruction set of the machine (NEON on aarch64, SSE2 at least on
// x86-64), executing a kernel on each architecture it reports.
#include <gtest/gtest.h>

#include <algorithm>
#include <iostream>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include <rope/detail/simd.hpp>
#include <rope/kernels.hpp>

#include "archs.hpp"
#include "support.hpp"

namespace {

using rope::detail::has_batch;

// The build's own architecture has both element types the kernels take.
static_assert(has_batch<float, xsimd::default_arch>::value, "default_arch has float batches");
static_assert(has_batch<double, xsimd::default_arch>::value, "default_arch has double batches");
#if defined(__aarch64__)
// 32-bit neon has float batches and no double ones; neon64 adds double.
static_assert(has_batch<float, xsimd::neon>::value, "neon has float batches");
static_assert(!has_batch<double, xsimd::neon>::value, "neon has no double batches");
static_assert(has_batch<double, xsimd::neon64>::value, "neon64 has double batches");
#endif

template <class T>
class Simd : public ::testing::Test {};
using ElementTypes = ::testing::Types<float, double>;
TYPED_TEST_SUITE(Simd, ElementTypes, rope_test::ScalarNames);

bool contains(const std::vector<std::string>& names, const std::string& name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

// Every architecture the loop reports has run a kernel whose result matched
// the reference; the machine's own instruction set is among them.
TYPED_TEST(Simd, LoopRunsTheMachinesInstructionSet) {
  using T = TypeParam;
  constexpr std::size_t r = 64;
  const auto x = rope_test::random_vector<T>(r, 1);
  const auto cs = rope_test::random_vector<T>(r, 2);
  std::vector<double> expected, magnitude;
  rope_test::reference_in_double<rope::Style::rotate_half>(x.data(), cs.data(), cs.data() + r / 2, r,
                                                           rope::Direction::forward, expected, magnitude);
  const auto ran = rope_test::for_each_arch<T>([&](auto arch) {
    using Arch = decltype(arch);
    std::vector<T> y(r);
    rope::rotate<rope::Style::rotate_half, T, Arch>(x.data(), y.data(), cs.data(), cs.data() + r / 2, r);
    for (std::size_t i = 0; i < r; ++i) {
      ASSERT_NEAR(double(y[i]), expected[i], 4 * std::numeric_limits<T>::epsilon() * magnitude[i])
          << Arch::name() << " channel " << i;
    }
  });
  std::string list;
  for (const auto& name : ran) list += name + " ";
  std::cout << "architectures run for " << rope_test::scalar_name<T>() << ": " << list << "\n";

  EXPECT_TRUE(contains(ran, xsimd::default_arch::name()))
      << "default_arch " << xsimd::default_arch::name() << " did not run; ran: " << list;
#if defined(__aarch64__)
  EXPECT_TRUE(contains(ran, xsimd::neon64::name())) << "ran: " << list;
  // 32-bit neon runs float and is left out for double, never instantiated.
  EXPECT_EQ(contains(ran, xsimd::neon::name()), (std::is_same<T, float>::value)) << "ran: " << list;
#elif defined(__x86_64__)
  EXPECT_TRUE(contains(ran, xsimd::sse2::name())) << "ran: " << list;
#endif
}

}  // namespace
