// What the units of the RoPE row kernels share (tests/test_kernels*.cpp):
// the pairings and directions they sweep, the tolerance of one rotation
// against the reference in double, and the check of the 16-bit kernels. The
// kernels are instantiated for every architecture of the build (thirteen on
// an AVX-512 machine), pairing and element type; in one unit that took
// 201 CPU-seconds and 2.4 GB under g++'s sanitizers, so the float and double
// kernels, the RMSNorm-scaled one and each 16-bit type have units of their
// own.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include <gtest/gtest.h>

#include <rope/half.hpp>
#include <rope/kernels.hpp>
#include <rope/style.hpp>

#include "archs.hpp"
#include "support.hpp"

namespace rope_test {

template <class F>
void for_each_style(F&& f) {
  f(std::integral_constant<rope::Style, rope::Style::rotate_half>{});
  f(std::integral_constant<rope::Style, rope::Style::block_diagonal>{});
}

constexpr rope::Direction kDirections[] = {rope::Direction::forward, rope::Direction::inverse};
constexpr std::size_t kMaxRotaryDim = 256;

// Tolerance of one evaluation of y_a = x_a c - x_b s against the exact value:
// two roundings of products plus one of the sum, each at most half an ulp of
// the magnitude |x_a c| + |x_b s|. 2 * epsilon of that is "a few ulps".
template <class T>
double tolerance(double magnitude) {
  return 2.0 * std::numeric_limits<T>::epsilon() * magnitude + std::numeric_limits<T>::denorm_min();
}

template <class T>
bool bitwise_equal(const T* a, const T* b, std::size_t n) {
  return std::memcmp(a, b, n * sizeof(T)) == 0;
}

// ---- 16-bit storage (BFloat16, Float16): the in-register kernels. ----

// Every architecture, every rotary_dim up to 256 (so every step count, every
// overlapping last step and every row shorter than a step, odd pair counts
// included), both pairings and directions, in place and out of place, with
// gaps between heads: bit for bit the float kernel of the same architecture
// on the exactly widened values, rounded once by the scalar conversion.
// Both compute each pair with the same two multiply-adds, so they agree
// exactly; the gaps between heads are never touched.
template <class H>
void expect_16_bit_kernels_match_float() {
  rope_test::for_each_arch<float>([&](auto arch) {
    using Arch = decltype(arch);
    for_each_style([&](auto style_tag) {
      constexpr rope::Style S = decltype(style_tag)::value;
      for (rope::Direction dir : kDirections) {
        for (std::size_t r = 2; r <= kMaxRotaryDim; r += 2) {
          const std::size_t heads = 1 + r % 3, stride = r + 2 + r % 5;
          const auto cs = rope_test::random_vector<float>(r, static_cast<std::uint32_t>(7 * r));
          const auto values = rope_test::random_vector<float>(heads * stride, static_cast<std::uint32_t>(r));
          std::vector<H> x(heads * stride);
          std::vector<float> wide(heads * stride);
          for (std::size_t i = 0; i < x.size(); ++i) {
            x[i] = H(values[i]);
            wide[i] = static_cast<float>(x[i]);
          }
          rope::rotate_heads<S, float, Arch>(wide.data(), std::ptrdiff_t(stride), wide.data(), std::ptrdiff_t(stride),
                                             heads, cs.data(), cs.data() + r / 2, r, dir);
          for (bool in_place : {false, true}) {
            std::vector<H> y = in_place ? x : std::vector<H>(x.size(), H(-7.0f));
            const std::vector<H> before = y;
            std::vector<float> work(r + 2);
            rope::detail::rotate_heads_16<S, H, Arch>(x.data(), std::ptrdiff_t(stride), y.data(),
                                                      std::ptrdiff_t(stride), heads, cs.data(), cs.data() + r / 2, r,
                                                      dir, work.data());
            for (std::size_t h = 0; h < heads; ++h) {
              for (std::size_t i = 0; i < stride; ++i) {
                const std::size_t at = h * stride + i;
                const std::uint16_t want = i < r ? H(wide[at]).bits : before[at].bits;
                ASSERT_EQ(y[at].bits, want)
                    << Arch::name() << " " << rope::name(S) << " " << rope::name(dir) << " r=" << r
                    << (in_place ? " in place" : "") << " head " << h << " channel " << i;
              }
            }
          }
        }
      }
    });
  });
}

}  // namespace rope_test
