// bf16 and f16 queries and outputs of attend on every built architecture,
// over an f32 cache (attend_archs.hpp says what is checked, and why each cache
// type has a unit of its own).
#include <gtest/gtest.h>

#include <rope/attention.hpp>

#include "archs.hpp"
#include "attend_archs.hpp"

namespace {

template <class Arch>
class AttendArchF32Cache : public ::testing::Test {};
TYPED_TEST_SUITE(AttendArchF32Cache, rope_test::DistinctArchs, rope_test::ArchNames);

TYPED_TEST(AttendArchF32Cache, HalfQueriesAndOutputsAreTheFloatCallRoundedOnce) {
  attend_test::check_half_queries_and_outputs<float, TypeParam>("f32 cache");
}

}  // namespace
