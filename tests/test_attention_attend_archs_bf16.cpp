// bf16 and f16 queries and outputs of attend on every built architecture,
// over a bf16 cache (attend_archs.hpp says what is checked, and why each cache
// type has a unit of its own).
#include <gtest/gtest.h>

#include <rope/attention.hpp>

#include "archs.hpp"
#include "attend_archs.hpp"

namespace {

template <class Arch>
class AttendArchBf16Cache : public ::testing::Test {};
TYPED_TEST_SUITE(AttendArchBf16Cache, rope_test::DistinctArchs, rope_test::ArchNames);

TYPED_TEST(AttendArchBf16Cache, HalfQueriesAndOutputsAreTheFloatCallRoundedOnce) {
  attend_test::check_half_queries_and_outputs<rope::BFloat16, TypeParam>("bf16 cache");
}

}  // namespace
