// The in-register RoPE row kernels of BFloat16 storage on every
// architecture this build targets and the CPU runs: bit for bit the float
// kernel of the same architecture on the exactly widened values, rounded
// once (tests/kernels_support.hpp).
#include <gtest/gtest.h>

#include <rope/half.hpp>

#include "kernels_support.hpp"

namespace {

TEST(Kernels16, BFloat16MatchesTheFloatKernelRoundedOnce) {
  rope_test::expect_16_bit_kernels_match_float<rope::BFloat16>();
}

}  // namespace
