// rope::rotate_heads_scaled, the RoPE row kernel of RMSNorm-scaled heads,
// on every architecture this build targets and the CPU runs: bit for bit
// rotate_heads of the scaled copy (tests/kernels_support.hpp).
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include <rope/kernels.hpp>

#include "archs.hpp"
#include "kernels_support.hpp"
#include "support.hpp"

namespace {

using rope::Style;
using rope_test::bitwise_equal;
using rope_test::for_each_style;
using rope_test::kMaxRotaryDim;

// rotate_heads_scaled: bit for bit rotate_heads of a copy whose channel c
// of head h is (x_c * r[h]) * w[c], on every architecture, every rotary_dim
// up to 256 (every tail and every row shorter than a step), both pairings,
// in place and out of place, with gaps between heads that are never
// touched.
TEST(Kernels, RotateHeadsScaledIsTheRotationOfTheScaledCopy) {
  rope_test::for_each_arch<float>([&](auto arch) {
    using Arch = decltype(arch);
    for_each_style([&](auto style_tag) {
      constexpr Style S = decltype(style_tag)::value;
      for (std::size_t r = 2; r <= kMaxRotaryDim; r += 2) {
        const std::size_t heads = 1 + r % 4, stride = r + 1 + r % 3;
        const auto cs = rope_test::random_vector<float>(r, static_cast<std::uint32_t>(3 * r));
        const auto x = rope_test::random_vector<float>(heads * stride, static_cast<std::uint32_t>(11 * r), 4.0);
        const auto w = rope_test::random_vector<float>(r, static_cast<std::uint32_t>(17 * r));
        std::vector<float> scales(heads);
        for (std::size_t h = 0; h < heads; ++h) scales[h] = 0.25f + 0.375f * static_cast<float>(h);
        std::vector<float> copy = x;
        for (std::size_t h = 0; h < heads; ++h) {
          for (std::size_t c = 0; c < r; ++c) copy[h * stride + c] = (x[h * stride + c] * scales[h]) * w[c];
        }
        rope::rotate_heads<S, float, Arch>(copy.data(), std::ptrdiff_t(stride), copy.data(), std::ptrdiff_t(stride),
                                           heads, cs.data(), cs.data() + r / 2, r);
        for (bool in_place : {false, true}) {
          std::vector<float> in = x;
          std::vector<float> out(heads * stride, -7.0f);
          float* y = in_place ? in.data() : out.data();
          const std::vector<float> before(y, y + heads * stride);
          rope::rotate_heads_scaled<S, Arch>(in.data(), std::ptrdiff_t(stride), y, std::ptrdiff_t(stride), heads,
                                             cs.data(), cs.data() + r / 2, r, scales.data(), w.data());
          for (std::size_t at = 0; at < heads * stride; ++at) {
            const float want = at % stride < r ? copy[at] : before[at];
            ASSERT_TRUE(bitwise_equal(&y[at], &want, 1))
                << Arch::name() << " " << rope::name(S) << " r=" << r << (in_place ? " in place" : "") << " at " << at
                << ": " << y[at] << " want " << want;
          }
        }
      }
    });
  });
}

}  // namespace
