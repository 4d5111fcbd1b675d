// The in-register RoPE row kernels of Float16 storage on every
// architecture this build targets and the CPU runs: bit for bit the float
// kernel of the same architecture on the exactly widened values, rounded
// once (tests/kernels_support.hpp).
#include <gtest/gtest.h>

#include <rope/half.hpp>

#include "kernels_support.hpp"

namespace {

TEST(Kernels16, Float16MatchesTheFloatKernelRoundedOnce) {
  rope_test::expect_16_bit_kernels_match_float<rope::Float16>();
}

}  // namespace
