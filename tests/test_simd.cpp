// The per-architecture loop of detail/simd.hpp: which architectures have
// batches of which type, and that the loop the kernel tests rely on really
// runs the instruction set of the machine (NEON on aarch64, SSE2 at least on
// x86-64), executing a kernel on each architecture it reports; and the
// streaming copy (detail/stream.hpp) and the narrowing stores on every
// architecture, at every placement.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include <rope/detail/simd.hpp>
#include <rope/detail/stream.hpp>
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

template <class Arch>
class SimdArch : public ::testing::Test {};
TYPED_TEST_SUITE(SimdArch, rope_test::DistinctArchs, rope_test::ArchNames);

// stream_copy copies exactly its bytes, for destinations at every offset
// in a 64-byte line and lengths around the line and vector sizes (the head
// and tail that are stored, the whole lines that are streamed): every byte
// equal to its source, every byte around the destination untouched.
TYPED_TEST(SimdArch, StreamCopyWritesExactlyItsBytesAtEveryPlacement) {
  using Arch = TypeParam;
  constexpr std::size_t kRoom = 512, kGuard = 64;
  std::vector<unsigned char> src(kRoom);
  for (std::size_t i = 0; i < kRoom; ++i) src[i] = static_cast<unsigned char>(i * 37 + 11);
  // A 64-byte aligned window of the buffer, so that offset o is o bytes into a line.
  std::vector<unsigned char> buffer(kRoom + 2 * kGuard + 64);
  const std::size_t skew = reinterpret_cast<std::uintptr_t>(buffer.data()) % 64;
  unsigned char* const base = buffer.data() + (64 - skew) % 64 + kGuard;
  const std::size_t lengths[] = {0,  1,  15, 16,  17,  31,  32,  33,  47,  48, 63,
                                 64, 65, 96, 127, 128, 129, 191, 192, 256, 300};
  for (std::size_t offset = 0; offset < 64; ++offset) {
    for (const std::size_t n : lengths) {
      std::fill(buffer.begin(), buffer.end(), static_cast<unsigned char>(0xa5));
      const unsigned char* from = src.data() + (offset * 7) % 64;
      rope::detail::stream_copy<Arch>(base + offset, from, n);
      rope::detail::stream_fence<Arch>();
      ASSERT_EQ(std::memcmp(base + offset, from, n), 0) << Arch::name() << " offset " << offset << " bytes " << n;
      for (std::size_t i = 0; i < buffer.size(); ++i) {
        const unsigned char* p = buffer.data() + i;
        if (p >= base + offset && p < base + offset + n) continue;
        ASSERT_EQ(*p, 0xa5) << Arch::name() << " offset " << offset << " bytes " << n << " wrote byte "
                            << (p - (base + offset));
      }
    }
  }
}

// The narrowing stores keep each lane's low 16 bits (lanes below 2^16) or
// its low byte (lanes in [-128, 127]), in lane order, and write exactly one
// batch of values: what a cast per lane stores.
TYPED_TEST(SimdArch, NarrowingStoresKeepEveryLaneInOrder) {
  using Arch = TypeParam;
  using U = xsimd::batch<std::uint32_t, Arch>;
  using I = xsimd::batch<std::int32_t, Arch>;
  constexpr std::size_t n = U::size;
  const std::uint32_t halves[] = {0u, 1u, 0x7fffu, 0x8000u, 0xffffu, 0x1234u, 0xfedcu, 0x00ffu};
  const std::int32_t bytes[] = {0, 1, -1, 127, -128, -127, 64, -65};
  for (std::size_t shift = 0; shift < 8; ++shift) {
    std::uint32_t u[n];
    std::int32_t b[n];
    for (std::size_t i = 0; i < n; ++i) {
      u[i] = halves[(i + shift) % 8] ^ static_cast<std::uint32_t>(i << 4);
      b[i] = bytes[(i + shift) % 8];
    }
    std::uint16_t out16[n + 1];
    std::int8_t out8[n + 1];
    out16[n] = 0x5a5a;
    out8[n] = 0x5a;
    rope::detail::store_low_halves<Arch>(U::load_unaligned(u), out16);
    rope::detail::store_bytes<Arch>(I::load_unaligned(b), out8);
    for (std::size_t i = 0; i < n; ++i) {
      ASSERT_EQ(out16[i], static_cast<std::uint16_t>(u[i])) << Arch::name() << " lane " << i;
      ASSERT_EQ(out8[i], static_cast<std::int8_t>(b[i])) << Arch::name() << " lane " << i;
    }
    EXPECT_EQ(out16[n], 0x5a5a) << Arch::name();
    EXPECT_EQ(out8[n], 0x5a) << Arch::name();
  }
}

}  // namespace
