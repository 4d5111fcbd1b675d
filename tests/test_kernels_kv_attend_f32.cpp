// attend_keys (kernels/kv_rows.hpp) over a paged float KV cache: the
// chunks compiled for head_dim 128 give the bytes of its loops for any
// shape, on each architecture of the build whose code differs
// (rope_test::DistinctArchs), suite KvRowsF32/<architecture>. One unit
// per kernel and element type (tests/kv_decode_checks.hpp).
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

TYPED_TEST(KvRowsF32, AttendKeysCompiledShapesGiveTheBitsOfTheLoopsForAnyShape) {
  rope_test::check_attend_shapes<float, TypeParam>();
}

}  // namespace
