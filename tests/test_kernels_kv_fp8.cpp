// The fp8 KV cache rows (kernels/kv_planes.hpp, kernels/kv_store.hpp), on
// each architecture of the build whose code differs
// (rope_test::DistinctArchs), each suite named by it:
//   the lanes' decode of every one of the 256 codes of each format gives
//     the scalar decode's bits (fp8.hpp, itself held against the formats'
//     definitions by test_fp8), NaN for NaN, in the planes' channel order;
//     and the same with the CPU's denormals-are-zero and flush-to-zero
//     modes on (x86), which no step of it may depend on;
//   store_kv_row: the scale is max |x| / F::max(), every code the nearest
//     (fp8.hpp's encode) to x / s, the largest element at +-max, and
//     |x - s q| within the formats' half step; zeros and non-finite rows as
//     the int8 rows have them.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#if defined(__SSE__) || defined(__x86_64__)
#include <xmmintrin.h>
#endif

#include <rope/fp8.hpp>
#include <rope/kernels/kv_rows.hpp>

#include "archs.hpp"
#include "kv_elements.hpp"
#include "support.hpp"

namespace {

using LD = long double;

template <class Arch>
class KvRowsFp8Lanes : public ::testing::Test {};
TYPED_TEST_SUITE(KvRowsFp8Lanes, rope_test::DistinctArchs, rope_test::ArchNames);

// Every code through KvPlanes<E, Arch>::load, blocks of W = 4 * lanes
// codes, against E's scalar decode; channel c of a block is plane c /
// lanes, lane c % lanes where the planes are in order, else plane c % 4,
// lane c / 4 (kernels/kv_planes.hpp).
template <class E, class Arch>
void check_lanes_decode(const char* mode) {
  using F = xsimd::batch<float, Arch>;
  constexpr std::size_t lanes = F::size, W = 4 * lanes;
  constexpr bool in_order = rope::detail::KvPlanes<E, Arch>::kInOrder;
  const std::size_t blocks = (256 + W - 1) / W;
  std::vector<E> codes(blocks * W);
  for (std::size_t i = 0; i < codes.size(); ++i) codes[i] = E::from_bits(static_cast<std::uint8_t>((i * 37) % 256));
  for (std::size_t b = 0; b < blocks; ++b) {
    F planes[4];
    rope::detail::KvPlanes<E, Arch>::load(codes.data() + b * W, planes);
    float got[W];
    for (std::size_t k = 0; k < 4; ++k) planes[k].store_unaligned(got + k * lanes);
    for (std::size_t c = 0; c < W; ++c) {
      const float g = in_order ? got[c] : got[(c % 4) * lanes + c / 4];
      const E code = codes[b * W + c];
      const float want = static_cast<float>(code);
      if (std::isnan(want)) {
        ASSERT_TRUE(std::isnan(g)) << Arch::name() << " " << mode << " code 0x" << std::hex << unsigned(code.bits);
      } else {
        ASSERT_EQ(rope::detail::float_bits(g), rope::detail::float_bits(want))
            << Arch::name() << " " << mode << " code 0x" << std::hex << unsigned(code.bits) << ": " << g << " vs "
            << want;
      }
    }
  }
}

template <class Arch>
void check_both_formats(const char* mode) {
  check_lanes_decode<rope::Float8E4M3, Arch>(mode);
  check_lanes_decode<rope::Float8E5M2, Arch>(mode);
}

TYPED_TEST(KvRowsFp8Lanes, LanesDecodeEveryCodeAsTheScalarDecode) {
  check_both_formats<TypeParam>("default mode");
#if defined(__SSE__) || defined(__x86_64__)
  const unsigned saved = _mm_getcsr();
  _mm_setcsr(saved | 0x8040u);  // flush-to-zero (bit 15), denormals-are-zero (bit 6)
  check_both_formats<TypeParam>("FTZ+DAZ");
  _mm_setcsr(saved);
#endif
}

template <class E>
void check_store(const std::vector<float>& x, const char* what) {
  const std::size_t n = x.size();
  std::vector<E> q(n + 1, E::from_bits(0x11));
  float s = -1;
  rope::store_kv_row(x.data(), n, q.data(), &s);
  ASSERT_EQ(q[n].bits, 0x11) << what << ": wrote past n = " << n;
  float m = 0;
  bool finite = true;
  for (float v : x) {
    finite = finite && std::isfinite(v);
    m = std::max(m, std::fabs(v));
  }
  if (!finite || m == 0.0f) {
    if (finite) {
      ASSERT_EQ(s, 0.0f) << what;
    } else {
      ASSERT_TRUE(std::isnan(s)) << what;
    }
    for (std::size_t c = 0; c < n; ++c) ASSERT_EQ(q[c].bits & 0x7fu, 0u) << what << " c " << c;
    return;
  }
  float want_s = m / E::max() > 0.0f ? m / E::max() : std::numeric_limits<float>::denorm_min();
  const bool subnormal = want_s < std::numeric_limits<float>::min();
  if (subnormal && m / want_s > E::max()) want_s = std::nextafter(want_s, 1.0f);
  ASSERT_EQ(s, want_s) << what << ": scale = max |x| / max (a subnormal one rounded up where it must)";
  bool at_max = false;
  for (std::size_t c = 0; c < n; ++c) {
    ASSERT_EQ(q[c].bits, E(x[c] / s).bits) << what << " c " << c << ": the nearest code to x / s";
    // The encode's bound, and the rounding of x / s (rope_test::fp8_rounding).
    const LD bound = rope_test::fp8_rounding<E>(std::fabs(static_cast<LD>(x[c])), s);
    ASSERT_LE(std::fabs(static_cast<LD>(x[c]) - static_cast<LD>(s) * static_cast<float>(q[c])), bound)
        << what << " c " << c << " x " << x[c];
    at_max = at_max || std::fabs(static_cast<float>(q[c])) == E::max();
  }
  // A normal scale maps the largest onto max (m / s within 2^-23 of it);
  // a subnormal one is too coarse to.
  if (!subnormal) {
    ASSERT_TRUE(at_max) << what << ": the largest element maps to +-max";
  }
}

template <class E>
void check_stores() {
  for (std::size_t n : {std::size_t{1}, std::size_t{2}, std::size_t{7}, std::size_t{64}, std::size_t{130}}) {
    for (const double magnitude : {1e-42, 1e-30, 1e-3, 1.0, 37.0, 1e30}) {
      check_store<E>(rope_test::random_vector<float>(n, static_cast<std::uint32_t>(n * 5 + 2), magnitude), "random");
    }
    // One huge channel beside small ones: the small ones fall to the
    // subnormal steps or to zero, within the half step.
    auto wide = rope_test::random_vector<float>(n, static_cast<std::uint32_t>(n + 9), 1e-4);
    wide[n / 2] = 3e4f;
    check_store<E>(wide, "one huge channel");
    check_store<E>(std::vector<float>(n, -0.0f), "zeros");
    for (const float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
      auto x = rope_test::random_vector<float>(n, static_cast<std::uint32_t>(n + 1));
      x[n - 1] = bad;
      check_store<E>(x, "non-finite");
    }
  }
}

TEST(KvRowsFp8Store, E4M3RowsAreScaledNearestCodes) { check_stores<rope::Float8E4M3>(); }
TEST(KvRowsFp8Store, E5M2RowsAreScaledNearestCodes) { check_stores<rope::Float8E5M2>(); }

}  // namespace
