// dot_kv_keys (kernels/kv_rows.hpp) over BFloat16 keys, two keys at once:
// the bits of dot_kv one key at a time, for 1, 2, 4 and 8 query rows, on each
// architecture of the build whose code differs (rope_test::DistinctArchs),
// suite KvRowsBf16/<architecture>. One unit per kernel and element type
// (tests/kv_decode_checks.hpp).
#include <gtest/gtest.h>

#include <cstdint>

#include <rope/half.hpp>
#include <rope/kernels/kv_rows.hpp>

#include "archs.hpp"
#include "kv_decode_checks.hpp"

namespace {

template <class Arch>
class KvRowsBf16 : public ::testing::Test {};
TYPED_TEST_SUITE(KvRowsBf16, rope_test::DistinctArchs, rope_test::ArchNames);

TYPED_TEST(KvRowsBf16, DotKvKeysGivesTheBitsOfOneKeyAtATime) {
  rope_test::check_dot_kv_keys_all<rope::BFloat16, TypeParam>();
}

}  // namespace
