// Non-finite values inside the serving path: one sequence's steps over its
// contiguous cache (plan, append, attend), for every cache type. The
// one-head, multi-head and linear calls: test_attention_nonfinite.cpp (two
// units, so that each builds within the sanitizer stages' limits).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include <rope/attention.hpp>

#include "attention_heads.hpp"
#include "kv_elements.hpp"
#include "support.hpp"

namespace {

namespace at = attention_test;
namespace ra = rope::attention;
using at::Heads;
using rope::Style;

// One sequence's steps over its contiguous cache (the one-sequence plan,
// append with RoPE, attend; kv_split 4, so decode tokens split): a NaN
// value or an infinite key at token `bad` leaves every earlier row the
// bytes of the clean run, and with a window of 3 every row past the window
// too; the rows that see a NaN value are NaN. The cache of every element
// type.
template <class E>
void check_contiguous_steps() {
  const std::size_t l = 23, hq = 2, hk = 1, d = 8, dv = 4, bad = 13;
  const rope::Table<float> table(rope::frequencies(d, 10000.0), 32);
  const Heads<float> q(l, hq, d, 10), k(l, hk, d, 11), v(l, hk, dv, 12);
  for (const int which : {0, 1}) {  // 0: NaN in v, 1: Inf in k
    Heads<float> k_bad = k, v_bad = v;
    if (which == 0) v_bad.at(bad, 0, 1) = std::numeric_limits<float>::quiet_NaN();
    if (which == 1) k_bad.at(bad, 0, 2) = std::numeric_limits<float>::infinity();
    for (const std::size_t window : {std::size_t{0}, std::size_t{3}}) {
      auto run = [&](const Heads<float>& keys, const Heads<float>& values) {
        std::vector<E> kc(l * hk * d), vc(l * hk * dv);
        std::vector<float> ks(l * hk), vs(l * hk);
        const bool scaled = rope::KvElement<E>::kScaled;
        const auto cache = ra::PagedCache<E>::contiguous(rope::View<E>::token_major(kc.data(), l, hk, d),
                                                         rope::View<E>::token_major(vc.data(), l, hk, dv),
                                                         scaled ? ks.data() : nullptr, scaled ? vs.data() : nullptr);
        ra::Shape shape = ra::Shape::of(cache, hq);
        shape.kv_split = 4;
        ra::AppendOptions ao;
        ao.rotation = {&table, Style::rotate_half};
        ra::Mask mask;
        mask.window = window;
        Heads<float> out(l, hq, dv, 0), q_rot(l, hq, d, 0);
        ra::Plan plan;
        std::size_t t = 0;
        for (const std::size_t n : {std::size_t{10}, std::size_t{1}, std::size_t{5}, std::size_t{1}, std::size_t{6}}) {
          ra::plan(plan, shape, t, n);
          const auto q_out = q_rot.view().slice_tokens(t, n);
          ra::append(plan, cache, q.view().slice_tokens(t, n), keys.view().slice_tokens(t, n),
                     values.view().slice_tokens(t, n), q_out, ao);
          ra::attend(plan, cache, rope::View<const float>(q_out), out.view().slice_tokens(t, n), ra::Logits{}, mask);
          t += n;
        }
        return out;
      };
      const Heads<float> clean = run(k, v), got = run(k_bad, v_bad);
      for (std::size_t t = 0; t < l; ++t) {
        const bool sees_bad = t >= bad && (window == 0 || t < bad + window);
        for (std::size_t h = 0; h < hq; ++h) {
          const std::string what = std::string(rope_test::element_name<E>()) + " bad " + std::to_string(which) +
                                   " window " + std::to_string(window) + " token " + std::to_string(t) + " head " +
                                   std::to_string(h);
          bool nan = false;
          for (std::size_t c = 0; c < dv; ++c) nan = nan || std::isnan(got.at(t, h, c));
          if (!sees_bad) {
            EXPECT_EQ(std::memcmp(got.view().row(t, h), clean.view().row(t, h), dv * sizeof(float)), 0) << what;
          } else if (which == 0) {
            EXPECT_TRUE(nan) << what;
          }
        }
      }
    }
  }
}

TEST(AttentionNonFinite, FutureNonFiniteRowsNeverReachEarlierStepsOverAContiguousCache) {
  rope_test::for_each_element([](auto e) { check_contiguous_steps<decltype(e)>(); });
}

}  // namespace
