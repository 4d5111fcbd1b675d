// One sequence over a contiguous cache through the serving path
// (attention/serving.hpp): a cache of one page, the one-sequence plan, then
// append and attend per step — a prefill in chunks and decode steps:
//   - the steps' rows equal the long-double oracle of the one-shot causal
//     attention (scores q_i . R_(j - i) k_j * scale), with and without a
//     softcap and sinks, for every cache type (the 16-bit and int8 caches
//     against the oracle of their own stored values);
//   - the cache ends holding exactly rope::apply's rotated keys (float),
//     the values as given, and its spare slots untouched;
//   - a step past the capacity is refused by the plan, nothing written;
//   - the four entry points compile and run for float and bf16 rows with
//     read-only views of any constness.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include <rope/attention.hpp>

#include "attention_heads.hpp"
#include "attention_oracle.hpp"
#include "kv_elements.hpp"
#include "support.hpp"

namespace {

namespace at = attention_test;
namespace ra = rope::attention;
using at::Heads;
using rope::Style;

// A contiguous cache of element type E: capacity tokens, scales for int8.
template <class E>
struct Contiguous {
  std::size_t capacity, heads, d, dv;
  std::vector<E> k, v;
  std::vector<float> k_scales, v_scales;

  Contiguous(std::size_t capacity_, std::size_t heads_, std::size_t d_, std::size_t dv_)
      : capacity(capacity_),
        heads(heads_),
        d(d_),
        dv(dv_),
        k(capacity_ * heads_ * d_, E(0)),
        v(capacity_ * heads_ * dv_, E(0)),
        k_scales(rope::KvElement<E>::kScaled ? capacity_ * heads_ : 0),
        v_scales(k_scales.size()) {}

  ra::PagedCache<E> cache() {
    return ra::PagedCache<E>::contiguous(rope::View<E>::token_major(k.data(), capacity, heads, d),
                                         rope::View<E>::token_major(v.data(), capacity, heads, dv),
                                         k_scales.empty() ? nullptr : k_scales.data(),
                                         v_scales.empty() ? nullptr : v_scales.data());
  }
  // Stored row j of head h, widened (int8: times its scale).
  std::vector<long double> k_row(std::size_t j, std::size_t h) const { return row(k, k_scales, j, h, d); }
  std::vector<long double> v_row(std::size_t j, std::size_t h) const { return row(v, v_scales, j, h, dv); }

 private:
  std::vector<long double> row(const std::vector<E>& data, const std::vector<float>& scales, std::size_t j,
                               std::size_t h, std::size_t n) const {
    std::vector<long double> r(n);
    const long double s = scales.empty() ? 1.0L : scales[j * heads + h];
    for (std::size_t c = 0; c < n; ++c) r[c] = s * rope_test::widen(data[(j * heads + h) * n + c]);
    return r;
  }
};

// Steps of n tokens each through plan, append (Q rotated into q_rot) and
// attend: out and q_rot [l, hq, ...] hold every step's rows.
template <class E>
void run_steps(Contiguous<E>& c, const Heads<float>& q, const Heads<float>& k, const Heads<float>& v,
               const std::vector<std::size_t>& steps, const ra::AppendOptions& ao, const ra::Logits& logits,
               Heads<float>& q_rot, Heads<float>& out) {
  const ra::PagedCache<E> cache = c.cache();
  ra::Plan plan;
  std::size_t t = 0;
  for (const std::size_t n : steps) {
    ra::plan(plan, ra::Shape::of(cache, q.heads), t, n, 1);
    ra::append(plan, cache, q.view().slice_tokens(t, n), k.view().slice_tokens(t, n), v.view().slice_tokens(t, n),
               q_rot.view().slice_tokens(t, n), ao);
    ra::attend(plan, cache, rope::View<const float>(q_rot.view()).slice_tokens(t, n), out.view().slice_tokens(t, n),
               logits);
    t += n;
  }
}

// The oracle of query token i, head h over the stored keys 0 .. i: the
// stored (rotated) keys against q_i rotated at i in long double.
template <class E>
std::vector<long double> oracle_row(const Contiguous<E>& c, const Heads<float>& q, const rope::Frequencies& f,
                                    std::size_t i, std::size_t h, std::size_t group, const at::Logits& logits) {
  std::vector<long double> qi(c.d);
  for (std::size_t x = 0; x < c.d; ++x) qi[x] = q.at(i, h, x);
  const std::vector<long double> qr = at::rotate(qi, f.inv_freq, Style::rotate_half, at::LD(i));
  const long double scale = 1.0L / std::sqrt(at::LD(c.d));
  std::vector<long double> s(i + 1);
  long double top = logits.sink;
  for (std::size_t j = 0; j <= i; ++j) {
    const auto kj = c.k_row(j, h / group);
    long double dot = 0;
    for (std::size_t x = 0; x < c.d; ++x) dot += qr[x] * kj[x];
    s[j] = dot * scale;
    if (logits.softcap > 0) s[j] = logits.softcap * std::tanh(s[j] / logits.softcap);
    top = std::max(top, s[j]);
  }
  long double den = std::isinf(logits.sink) ? 0.0L : std::exp(logits.sink - top);
  std::vector<long double> acc(c.dv, 0.0L);
  for (std::size_t j = 0; j <= i; ++j) {
    const long double w = std::exp(s[j] - top);
    den += w;
    const auto vj = c.v_row(j, h / group);
    for (std::size_t x = 0; x < c.dv; ++x) acc[x] += w * vj[x];
  }
  for (auto& x : acc) x /= den;
  return acc;
}

template <class E>
void expect_steps_match_oracle(bool with_logits) {
  const std::size_t l = 26, hq = 4, hk = 2, d = 16, dv = 8, group = hq / hk;
  const auto freqs = rope::frequencies(d, 10000.0);
  const rope::Table<float> table(freqs, 64);
  const Heads<float> q(l, hq, d, 21, 2.0), k(l, hk, d, 22), v(l, hk, dv, 23);
  Contiguous<E> c(l + 3, hk, d, dv);
  Heads<float> q_rot = Heads<float>::filled(l, hq, d, -7.0f), out = Heads<float>::filled(l, hq, dv, -7.0f);
  ra::AppendOptions ao;
  ao.rotation = {&table, Style::rotate_half};
  ra::Logits logits;
  if (with_logits) {
    logits.softcap = 1.5;
    logits.sinks = {1.0, -0.5, -HUGE_VAL, 3.0};
  }
  run_steps(c, q, k, v, {10, 7, 1, 1, 1, 5, 1}, ao, logits, q_rot, out);
  // The rows against the oracle of the stored values: the scores' sums in
  // float over d products and the weighted sums over at most l values.
  double worst = 0;
  for (std::size_t i = 0; i < l; ++i) {
    for (std::size_t h = 0; h < hq; ++h) {
      const at::Logits lg{with_logits ? 1.5L : 0.0L,
                          with_logits ? at::LD(logits.sinks[h]) : -std::numeric_limits<at::LD>::infinity()};
      const auto want = oracle_row(c, q, freqs, i, h, group, lg);
      for (std::size_t x = 0; x < dv; ++x) {
        worst = std::max(worst, static_cast<double>(std::fabs(out.at(i, h, x) - want[x])));
      }
    }
  }
  EXPECT_LE(worst, 2e-5) << rope_test::element_name<E>() << " logits " << with_logits;
}

TEST(ServingContiguous, StepsEqualTheOneShotOracleForEveryCacheType) {
  rope_test::for_each_element([](auto e) {
    using E = decltype(e);
    expect_steps_match_oracle<E>(false);
    expect_steps_match_oracle<E>(true);
  });
}

// A float cache ends holding rope::apply's rotated keys bit for bit, the
// values as given, and its spare slots as they were; Q is rotated into
// q_rot exactly as rope::apply rotates it.
TEST(ServingContiguous, FloatCacheHoldsTheRotatedKeysAndNothingElse) {
  const std::size_t l = 19, hq = 4, hk = 1, d = 16, dv = 4;
  const rope::Table<float> table(rope::frequencies(d, 10000.0), 64);
  const Heads<float> q(l, hq, d, 31), k(l, hk, d, 32), v(l, hk, dv, 33);
  Contiguous<float> c(l + 3, hk, d, dv);
  Heads<float> q_rot(l, hq, d, 0), out(l, hq, dv, 0);
  ra::AppendOptions ao;
  ao.rotation = {&table, Style::block_diagonal};
  run_steps(c, q, k, v, {8, 1, 1, 9}, ao, {}, q_rot, out);
  Heads<float> k_rotated(l, hk, d, 0), q_rotated(l, hq, d, 0);
  rope::apply<float>(k.view(), k_rotated.view(), table, Style::block_diagonal, 0);
  rope::apply<float>(q.view(), q_rotated.view(), table, Style::block_diagonal, 0);
  EXPECT_EQ(std::memcmp(c.k.data(), k_rotated.data.data(), k_rotated.data.size() * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(c.v.data(), v.data.data(), v.data.size() * sizeof(float)), 0);
  EXPECT_TRUE(at::same_bytes(q_rot.data, q_rotated.data));
  for (std::size_t i = l * hk * d; i < c.k.size(); ++i) EXPECT_EQ(c.k[i], 0.0f) << i;
  for (std::size_t i = l * hk * dv; i < c.v.size(); ++i) EXPECT_EQ(c.v[i], 0.0f) << i;
}

// A step past the capacity is refused by the plan, naming it; append and
// attend then refuse the failed plan, and nothing is written.
TEST(ServingContiguous, StepPastTheCapacityIsRefusedAndWritesNothing) {
  const std::size_t cap = 6, hq = 2, hk = 1, d = 8;
  const rope::Table<float> table(rope::frequencies(d, 10000.0), 64);
  Contiguous<float> c(cap, hk, d, d);
  const ra::PagedCache<float> cache = c.cache();
  const Heads<float> q(2, hq, d, 41), k(2, hk, d, 42), v(2, hk, d, 43);
  Heads<float> out = Heads<float>::filled(2, hq, d, -7.0f);
  const auto k_before = c.k, out_before = out.data;
  ra::Plan plan;
  EXPECT_EQ(rope_test::thrown_message([&] { ra::plan(plan, ra::Shape::of(cache, hq), cap - 1, 2, 1); }),
            "rope::attention::plan: cached + new_tokens must be <= the contiguous cache's capacity shape.page_size = "
            "6, got 7");
  ra::AppendOptions ao;
  ao.rotation = {&table, Style::rotate_half};
  EXPECT_EQ(rope_test::thrown_message([&] { ra::append(plan, cache, k.view(), v.view(), ao); }),
            "rope::attention::append: plan must be made by a rope::attention::plan() that succeeded, got no plan");
  EXPECT_EQ(rope_test::thrown_message([&] { ra::attend(plan, cache, q.view(), out.view()); }),
            "rope::attention::attend: plan must be made by a rope::attention::plan() that succeeded, got no plan");
  EXPECT_TRUE(at::same_bytes(k_before, c.k));
  EXPECT_TRUE(at::same_bytes(out_before, out.data));
}

// Every entry point with float and bf16 rows, read-only inputs as
// View<const T> beside writable ones: what a user's translation unit calls.
TEST(ServingContiguous, EntryPointsTakeFloatAndBf16RowsOfAnyConstness) {
  using rope::BFloat16;
  const std::size_t l = 5, hq = 2, hk = 1, d = 8;
  const rope::Table<float> table(rope::frequencies(d, 10000.0), 16);
  Contiguous<BFloat16> c(l, hk, d, d);
  const ra::PagedCache<BFloat16> cache = c.cache();
  std::vector<BFloat16> q(l * hq * d, BFloat16(0.5f)), k(l * hk * d, BFloat16(0.25f)), v(l * hk * d, BFloat16(1.0f));
  std::vector<BFloat16> out(l * hq * d);
  std::vector<float> out_f(l * hq * d), lse(l * hq), merged(l * hq * d), lse_m(l * hq);
  ra::Plan plan;
  ra::plan(plan, ra::Shape::of(cache, hq), 0, l, 2);
  const auto q_view = rope::View<BFloat16>::token_major(q.data(), l, hq, d);
  ra::AppendOptions ao;
  ao.rotation = {&table, Style::rotate_half};
  ra::append(plan, cache, q_view, rope::View<const BFloat16>::token_major(k.data(), l, hk, d),
             rope::View<BFloat16>::token_major(v.data(), l, hk, d), q_view, ao);
  ra::attend(plan, cache, rope::View<const BFloat16>(q_view), rope::View<BFloat16>::token_major(out.data(), l, hq, d));
  ra::attend(plan, cache, q_view, rope::View<float>::token_major(out_f.data(), l, hq, d), {}, {}, lse.data());
  // Every value is 1: each row of out is 1, and a merge of a state with
  // itself is the same state, its lse one log(2) higher.
  ra::merge(rope::View<const float>::token_major(out_f.data(), l, hq, d), lse.data(),
            rope::View<const BFloat16>::token_major(out.data(), l, hq, d), lse.data(),
            rope::View<float>::token_major(merged.data(), l, hq, d), lse_m.data());
  for (std::size_t i = 0; i < out.size(); ++i) {
    EXPECT_EQ(static_cast<float>(out[i]), 1.0f) << i;
    EXPECT_EQ(out_f[i], 1.0f) << i;
    EXPECT_EQ(merged[i], 1.0f) << i;
  }
  for (std::size_t i = 0; i < lse.size(); ++i) EXPECT_NEAR(lse_m[i] - lse[i], std::log(2.0f), 1e-6f) << i;
}

}  // namespace
