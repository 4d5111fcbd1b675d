// attend_keys (kernels/kv_rows.hpp) over a paged BFloat16 KV cache: the
// chunks compiled for head_dim 128 give the bytes of its loops for any
// shape, on each architecture of the build whose code differs
// (rope_test::DistinctArchs), suite KvRowsBf16/<architecture>. One unit
// per kernel and element type (tests/kv_decode_checks.hpp).
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

TYPED_TEST(KvRowsBf16, AttendKeysCompiledShapesGiveTheBitsOfTheLoopsForAnyShape) {
  rope_test::check_attend_shapes<rope::BFloat16, TypeParam>();
}

}  // namespace
