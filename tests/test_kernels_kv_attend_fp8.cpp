// attend_keys (kernels/kv_rows.hpp) over paged fp8 (e4m3 and e5m2, with
// their scales) KV caches: the chunks compiled for head_dim 128 give the
// bytes of its loops for any shape, on each architecture of the build whose
// code differs (rope_test::DistinctArchs), suite KvRowsFp8/<architecture>.
// One unit per kernel and element type (tests/kv_decode_checks.hpp).
#include <gtest/gtest.h>

#include <rope/fp8.hpp>
#include <rope/kernels/kv_rows.hpp>

#include "archs.hpp"
#include "kv_decode_checks.hpp"

namespace {

template <class Arch>
class KvRowsFp8 : public ::testing::Test {};
TYPED_TEST_SUITE(KvRowsFp8, rope_test::DistinctArchs, rope_test::ArchNames);

TYPED_TEST(KvRowsFp8, E4M3AttendKeysCompiledShapesGiveTheBitsOfTheLoopsForAnyShape) {
  rope_test::check_attend_shapes<rope::Float8E4M3, TypeParam>();
}

TYPED_TEST(KvRowsFp8, E5M2AttendKeysCompiledShapesGiveTheBitsOfTheLoopsForAnyShape) {
  rope_test::check_attend_shapes<rope::Float8E5M2, TypeParam>();
}

}  // namespace
