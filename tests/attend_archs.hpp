// bf16 and f16 queries and outputs of attend (attention/attend.hpp) on
// each architecture the build targets (attend's Arch: the query rows
// widened, the parts merged, the rows written): a 16-bit q is read as its
// exact float values, and a 16-bit out is the float row rounded once to
// nearest even; lse is that of the float call. Against the float call of
// the same architecture on the widened queries, bit for bit.
//
// One cache type per test unit (test_attention_attend_archs*.cpp): each
// instantiates attend for every architecture x 5 row types (the float call
// and four 16-bit pairs), and the two cache types in one unit were over
// the sanitizer builds' time and memory limits (docs/reliability.md).
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include <rope/attention.hpp>
// The checked call's definition: the test calls it on architectures of its
// own choosing, and a compiled attention library holds only its own.
#include <rope/attention/attend.hpp>

#include "archs.hpp"
#include "attend_fixture.hpp"
#include "support.hpp"

namespace attend_test {

template <class Q, class O, class E, class Arch>
void check_half_rows(const Values& x, const Cache<E>& c, const Options& o, const std::string& what) {
  const Dims& s = x.dims;
  const std::size_t rows = x.tokens * s.q_heads;
  std::vector<Q> q_half(x.q.size());
  std::vector<float> q_wide(x.q.size());
  for (std::size_t i = 0; i < x.q.size(); ++i) {
    q_half[i] = Q(x.q[i]);
    q_wide[i] = widen(q_half[i]);
  }
  Plan p;
  ra::plan(p, c.shape(s.q_heads, o.kv_split), c.batch(), o.threads);
  std::vector<float> want(rows * s.dv, -1.0f), lse_want(rows, -1.0f), lse(rows, -2.0f);
  ra::attend<const float, E, float, Arch>(
      p, c.cache, View<const float>::token_major(q_wide.data(), x.tokens, s.q_heads, s.d),
      View<float>::token_major(want.data(), x.tokens, s.q_heads, s.dv), o.logits, o.mask, lse_want.data());
  std::vector<O> got(rows * s.dv, O(-3.0f));
  ra::attend<const Q, E, O, Arch>(p, c.cache, View<const Q>::token_major(q_half.data(), x.tokens, s.q_heads, s.d),
                                  View<O>::token_major(got.data(), x.tokens, s.q_heads, s.dv), o.logits, o.mask,
                                  lse.data());
  EXPECT_TRUE(same_bytes(lse, lse_want)) << what << ": lse";
  for (std::size_t i = 0; i < got.size(); ++i) {
    const O once(want[i]);
    ASSERT_EQ(std::memcmp(&got[i], &once, sizeof(O)), 0)
        << what << ": element " << i << " got " << widen(got[i]) << " want " << want[i] << " rounded once";
  }
}

// The four pairs of row types over a cache of E, on Arch.
template <class E, class Arch>
void check_half_queries_and_outputs(const std::string& name) {
  if (!rope::detail::cpu_supports<Arch>()) GTEST_SKIP() << Arch::name() << " does not run here";
  const Values x = make_values(mixed_dims(), 1400);
  Options o;
  o.kv_split = 16;
  o.mask.window = 30;
  o.logits.sinks = {0.5, -kInf, 1.0, -1.0};
  const Cache<E> cache = build<E>(x, Layout::nhd);
  check_half_rows<BFloat16, BFloat16, E, Arch>(x, cache, o, name + " bf16 q, bf16 out");
  check_half_rows<Float16, Float16, E, Arch>(x, cache, o, name + " f16 q, f16 out");
  check_half_rows<BFloat16, float, E, Arch>(x, cache, o, name + " bf16 q, f32 out");
  check_half_rows<float, Float16, E, Arch>(x, cache, o, name + " f32 q, f16 out");
}

}  // namespace attend_test
