// The checks of the decode loop's kernels over a paged KV cache
// (kernels/kv_rows.hpp), for one element type and architecture each. The
// units tests/test_kernels_kv_dot_keys_<type>.cpp and
// tests/test_kernels_kv_attend_<type>.cpp run them, one unit per kernel and
// element type (float, BFloat16, Float16, int8), as suites KvRows<type>
// over rope_test::DistinctArchs: each kernel here is compiled fully
// unrolled for head_dim 128 and several row counts, too heavy for one unit
// under g++'s sanitizers (tests/kv_rows_support.hpp).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include <gtest/gtest.h>

#include <rope/kernels/kv_rows.hpp>

#include "kv_elements.hpp"
#include "kv_rows_support.hpp"
#include "pool_keys.hpp"
#include "support.hpp"

namespace rope_test {

// dot_kv_keys, two keys at once, against dot_kv_group on each key alone
// with its own scale: the same bits for every row, each row's two scores
// side by side, and nothing past them written.
template <std::size_t R, class E, class Arch>
void check_dot_kv_keys() {
  constexpr std::size_t d = 128, K = 2, stride = 5;
  if constexpr (R * K <= xsimd::batch<float, Arch>::size) {
    const auto q = random_vector<float>(R * d, 61 + R);
    const auto k0 = random_elements<E>(d, 62), k1 = random_elements<E>(d, 63);
    const E* keys[K] = {k0.data(), k1.data()};
    const float scales[K] = {0.125f, -3.0f};
    std::vector<float> got(R * stride, 7.0f), want(R * stride, 7.0f);
    rope::detail::dot_kv_keys<R, K, E, Arch, d>(q.data(), keys, got.data(), stride, scales);
    for (std::size_t k = 0; k < K; ++k) {
      rope::detail::dot_kv_group<R, E, Arch, d>(q.data(), d, d, keys[k], want.data() + k, stride, scales[k]);
    }
    ASSERT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0)
        << Arch::name() << " " << element_name<E>() << " R " << R;
    for (std::size_t r = 0; r < R; ++r) ASSERT_EQ(got[r * stride + K], 7.0f) << "written past row " << r;
  }
}

// check_dot_kv_keys for the row counts dot_kv_keys is compiled for.
template <class E, class Arch>
void check_dot_kv_keys_all() {
  check_dot_kv_keys<1, E, Arch>();
  check_dot_kv_keys<2, E, Arch>();
  check_dot_kv_keys<4, E, Arch>();
  check_dot_kv_keys<8, E, Arch>();
}

// attend_keys' chunks compiled for head_dim 128 with 4 or 8 query heads per
// key/value head against its loops for any shape: the same bytes of (m, l,
// acc), over pages given out of order, a first key inside a page, whole and
// partial chunks, with and without a softcap, int8 with its scales.
template <class E, class Arch>
void check_attend_shapes() {
  constexpr std::size_t d = 128, kv_heads = 2, page = 16, pages = 12, keys = 150;
  const std::vector<std::int32_t> table = {5, 2, 9, 0, 11, 7, 3, 8, 1, 10};
  const auto k = random_elements<E>(pages * page * kv_heads * d, 41);
  const auto v = random_elements<E>(k.size(), 42);
  std::vector<float> k_scales, v_scales;
  if (rope::KvElement<E>::kScaled) {
    k_scales = rope_test::random_vector<float>(pages * page * kv_heads, 43, 0.02);
    v_scales = rope_test::random_vector<float>(pages * page * kv_heads, 44, 0.02);
    for (auto& x : k_scales) x = std::fabs(x);
    for (auto& x : v_scales) x = std::fabs(x);
  }
  for (const std::size_t G : {std::size_t{4}, std::size_t{8}}) {
    if (G > rope::detail::kv_max_rows<E, Arch>()) {
      EXPECT_EQ((rope::detail::attend_shape<E, Arch>(G, d, d)), nullptr) << Arch::name() << " G " << G;
      continue;
    }
    ASSERT_NE((rope::detail::attend_shape<E, Arch>(G, d, d)), nullptr) << Arch::name() << " G " << G;
    const std::size_t H = G * kv_heads;
    const auto q = random_vector<float>(H * d, static_cast<std::uint32_t>(45 + G));
    for (const std::size_t chunk : {std::size_t{64}, std::size_t{37}}) {
      for (const float softcap : {0.0f, 5.0f}) {
        rope::KvKeys<E> a = rope_test::pool_keys(k.data(), v.data(), k_scales.empty() ? nullptr : k_scales.data(),
                                                 v_scales.empty() ? nullptr : v_scales.data(), table.data(), page, H,
                                                 kv_heads, d, 3, keys - 3, chunk, 0.125f);
        a.softcap = softcap;
        std::vector<float> got[2];
        for (const bool shaped : {true, false}) {
          std::vector<float> work(rope::attend_work(H, d, d, chunk)), m(H), l(H), acc(H * d);
          rope::detail::attend_keys_as<E, Arch>(a, q.data(), work.data(), m.data(), l.data(), acc.data(), shaped);
          std::vector<float>& out = got[shaped ? 0 : 1];
          out = acc;
          out.insert(out.end(), m.begin(), m.end());
          out.insert(out.end(), l.begin(), l.end());
        }
        ASSERT_EQ(std::memcmp(got[0].data(), got[1].data(), got[0].size() * sizeof(float)), 0)
            << Arch::name() << " " << element_name<E>() << " G " << G << " chunk " << chunk << " softcap " << softcap;
      }
    }
  }
}

}  // namespace rope_test
