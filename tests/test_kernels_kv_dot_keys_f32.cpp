// dot_kv_keys (kernels/kv_rows.hpp) over float keys, two keys at once:
// the bits of dot_kv one key at a time, for 1, 2, 4 and 8 query rows, on each
// architecture of the build whose code differs (rope_test::DistinctArchs),
// suite KvRowsF32/<architecture>. One unit per kernel and element type
// (tests/kv_decode_checks.hpp).
#include <gtest/gtest.h>

#include <cstdint>

#include <rope/half.hpp>
#include <rope/kernels/kv_rows.hpp>

#include "archs.hpp"
#include "kv_decode_checks.hpp"

namespace {

template <class Arch>
class KvRowsF32 : public ::testing::Test {};
TYPED_TEST_SUITE(KvRowsF32, rope_test::DistinctArchs, rope_test::ArchNames);

TYPED_TEST(KvRowsF32, DotKvKeysGivesTheBitsOfOneKeyAtATime) { rope_test::check_dot_kv_keys_all<float, TypeParam>(); }

}  // namespace
