// The attention module as an inference engine uses it, against the
// long-double oracles: masks (causal, sliding window, sequence ids) by
// position over grouped-query views, decoding against a KV cache of rotated
// keys (equal to the last rows of the full causal call), softmax_step
// filling the cache chunk by chunk, multi-head linear attention with a
// LinearState per key/value head (chunked prefill, then decode, equal to the
// one-shot call), and thread counts giving bit-identical results.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include <rope/attention.hpp>

#include "attention_heads.hpp"
#include "attention_oracle.hpp"
#include "support.hpp"

namespace {

namespace at = attention_test;
namespace ra = rope::attention;
using at::Heads;
using ra::Matrix;
using ra::Rotation;
using rope::Style;
using rope::View;

template <class T>
class InferenceTyped : public ::testing::Test {};
using Scalars = ::testing::Types<float, double>;
TYPED_TEST_SUITE(InferenceTyped, Scalars, rope_test::ScalarNames);

template <class T>
double tolerance() {
  return at::exact_tolerance<T>();
}

// max |got - want| / max |want| over one head of an output tensor.
template <class T>
double head_error(const Heads<T>& out, std::size_t h, const at::Mat& want) {
  return at::relative_error(out.head(h), want);
}

// Sliding windows and packed sequences, causal or not, keys sorted (tiles cut
// at each query's range) or shuffled (entry by entry), every block size,
// grouped-query views: each head equals the naive softmax with the mask.
TYPED_TEST(InferenceTyped, SoftmaxMasksMatchNaive) {
  using T = TypeParam;
  const std::size_t l = 37, hq = 4, hk = 2, d = 16, dv = 8, group = hq / hk;
  const auto freqs = rope::frequencies(d, 10000.0);
  const rope::Table<T> table(freqs, 64);
  const Heads<T> q(l, hq, d, 1), k(l, hk, d, 2), v(l, hk, dv, 3);
  // Two packed sequences of 15 and 22 tokens, each from position 0.
  std::vector<std::int64_t> pos(l), seq(l);
  for (std::size_t t = 0; t < l; ++t) {
    seq[t] = t < 15 ? 0 : 1;
    pos[t] = static_cast<std::int64_t>(t < 15 ? t : t - 15);
  }
  std::vector<std::size_t> order(l);
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::mt19937 gen(4);
  for (const bool shuffled : {false, true}) {
    if (shuffled) std::shuffle(order.begin(), order.end(), gen);
    // Token t of the call is token order[t] of the packed batch.
    Heads<T> qs = q, ks = k, vs = v;
    std::vector<std::int64_t> ps(l), ss(l);
    for (std::size_t t = 0; t < l; ++t) {
      std::copy_n(&q.data[order[t] * hq * d], hq * d, &qs.data[t * hq * d]);
      std::copy_n(&k.data[order[t] * hk * d], hk * d, &ks.data[t * hk * d]);
      std::copy_n(&v.data[order[t] * hk * dv], hk * dv, &vs.data[t * hk * dv]);
      ps[t] = pos[order[t]];
      ss[t] = seq[order[t]];
    }
    for (const bool causal : {false, true}) {
      for (const std::size_t window : {std::size_t{0}, std::size_t{1}, std::size_t{5}}) {
        ra::SoftmaxOptions o;
        o.causal = causal;
        o.window = window;
        o.q_positions = o.k_positions = ps;
        o.q_sequence = o.k_sequence = ss;
        const auto visible = [&](std::size_t i, std::size_t j) {
          if (ss[i] != ss[j]) return false;
          if (causal && ps[j] > ps[i]) return false;
          return window == 0 || ps[j] > ps[i] - static_cast<std::int64_t>(window);
        };
        for (const std::size_t block : {std::size_t{1}, std::size_t{3}, std::size_t{8}, std::size_t{37}, std::size_t{256}}) {
          o.block = block;
          Heads<T> out = Heads<T>::filled(l, hq, dv, T(-7));
          ra::softmax<T>(qs.view(), ks.view(), vs.view(), out.view(), Rotation<T>{&table, Style::block_diagonal}, o);
          for (std::size_t h = 0; h < hq; ++h) {
            const auto want = at::naive_softmax_masked(qs.head_ld(h), ks.head_ld(h / group), vs.head_ld(h / group),
                                                       freqs.inv_freq, Style::block_diagonal, ps, ps,
                                                       1.0L / std::sqrt(at::LD(d)), visible);
            EXPECT_LE(head_error(out, h, want), tolerance<T>())
                << "shuffled " << shuffled << " causal " << causal << " window " << window << " block " << block
                << " head " << h;
          }
        }
      }
    }
  }
}

// Decoding: the cache holds keys rotated once (rope::apply); one query at
// position t against the cache's first t + 1 keys, or against all of it with
// the causal mask, equals row t of the full causal prefill.
TYPED_TEST(InferenceTyped, DecodeAgainstRotatedCacheEqualsPrefillRows) {
  using T = TypeParam;
  const std::size_t l = 29, hq = 6, hk = 2, d = 16, dv = 8;
  const rope::Table<T> table(rope::frequencies(d, 10000.0), 64);
  const Heads<T> q(l, hq, d, 11), k(l, hk, d, 12), v(l, hk, dv, 13);
  for (const Style style : {Style::rotate_half, Style::block_diagonal}) {
    const Rotation<T> rotation{&table, style};
    ra::SoftmaxOptions o;
    o.causal = true;
    o.block = 8;
    Heads<T> full(l, hq, dv, 0);
    ra::softmax<T>(q.view(), k.view(), v.view(), full.view(), rotation, o);
    Heads<T> cache(l, hk, d, 0);
    rope::apply<T>(k.view(), cache.view(), table, style, 0);
    for (std::size_t t = 0; t < l; ++t) {
      ra::SoftmaxOptions step;
      step.causal = true;
      step.keys_rotated = true;
      step.q_offset = static_cast<std::int64_t>(t);
      const auto q_t = q.view().slice_tokens(t, 1);
      for (const bool whole_cache : {false, true}) {
        const std::size_t visible = whole_cache ? l : t + 1;
        Heads<T> out(1, hq, dv, 0);
        ra::softmax<T>(q_t, View<const T>(cache.view()).slice_tokens(0, visible), v.view().slice_tokens(0, visible),
                       out.view(), rotation, step);
        for (std::size_t h = 0; h < hq; ++h) {
          for (std::size_t c = 0; c < dv; ++c) {
            EXPECT_NEAR(out.at(0, h, c), full.at(t, h, c), 20 * tolerance<T>())
                << rope::name(style) << " token " << t << " head " << h << " whole cache " << whole_cache;
          }
        }
      }
    }
  }
}

// softmax_step: a prefill in chunks, then one token at a time, fills the
// cache with exactly rope::apply's rotated keys and gives the rows of the
// one-shot causal call.
TYPED_TEST(InferenceTyped, SoftmaxStepsEqualOneShot) {
  using T = TypeParam;
  const std::size_t l = 26, hq = 4, hk = 1, d = 16, dv = 4;
  const rope::Table<T> table(rope::frequencies(d, 10000.0), 64);
  const Rotation<T> rotation{&table, Style::rotate_half};
  const Heads<T> q(l, hq, d, 21), k(l, hk, d, 22), v(l, hk, dv, 23);
  ra::SoftmaxOptions o;
  o.causal = true;
  o.block = 16;
  Heads<T> full(l, hq, dv, 0);
  ra::softmax<T>(q.view(), k.view(), v.view(), full.view(), rotation, o);

  Heads<T> k_cache = Heads<T>::filled(l + 3, hk, d, T(0)), v_cache = Heads<T>::filled(l + 3, hk, dv, T(0));
  ra::KvCache<T> cache{k_cache.view(), v_cache.view(), 0};
  Heads<T> out(l, hq, dv, 0);
  const std::size_t chunks[] = {10, 7, 1, 1, 1, 1, 1, 1, 1, 1, 1};
  std::size_t t = 0;
  for (const std::size_t n : chunks) {
    ra::softmax_step<T>(q.view().slice_tokens(t, n), k.view().slice_tokens(t, n), v.view().slice_tokens(t, n), cache,
                        out.view().slice_tokens(t, n), rotation, o);
    t += n;
    EXPECT_EQ(cache.length, t);
  }
  ASSERT_EQ(t, l);
  for (std::size_t i = 0; i < l; ++i) {
    for (std::size_t h = 0; h < hq; ++h) {
      for (std::size_t c = 0; c < dv; ++c) EXPECT_NEAR(out.at(i, h, c), full.at(i, h, c), 20 * tolerance<T>());
    }
  }
  Heads<T> rotated(l, hk, d, 0);
  rope::apply<T>(k.view(), rotated.view(), table, Style::rotate_half, 0);
  EXPECT_EQ(std::memcmp(k_cache.data.data(), rotated.data.data(), rotated.data.size() * sizeof(T)), 0);
  EXPECT_EQ(std::memcmp(v_cache.data.data(), v.data.data(), v.data.size() * sizeof(T)), 0);
  // The three spare slots are untouched.
  for (std::size_t i = l * hk * d; i < k_cache.data.size(); ++i) EXPECT_EQ(k_cache.data[i], T(0));

  // A full cache refuses a step and writes nothing.
  const auto before = k_cache.data;
  ra::KvCache<T> full_cache{k_cache.view(), v_cache.view(), l + 3};
  EXPECT_THROW(ra::softmax_step<T>(q.view().slice_tokens(0, 1), k.view().slice_tokens(0, 1), v.view().slice_tokens(0, 1),
                                   full_cache, out.view().slice_tokens(0, 1), rotation, o),
               std::invalid_argument);
  EXPECT_TRUE(at::same_bytes(before, k_cache.data));
}

// softmax_step with positions given for the new tokens (a gap after the
// prompt) and with the cache starting at k_offset: the same as one call
// with those positions.
TYPED_TEST(InferenceTyped, SoftmaxStepsWithGivenPositions) {
  using T = TypeParam;
  const std::size_t l = 12, hq = 2, hk = 1, d = 8, dv = 4, prompt = 9;
  const rope::Table<T> table(rope::frequencies(d, 10000.0), 64);
  const Rotation<T> rotation{&table, Style::block_diagonal};
  const Heads<T> q(l, hq, d, 24), k(l, hk, d, 25), v(l, hk, dv, 26);
  std::vector<std::int64_t> positions(l);
  for (std::size_t t = 0; t < l; ++t) positions[t] = static_cast<std::int64_t>(t < prompt ? 3 + t : 30 + t);
  ra::SoftmaxOptions o;
  o.causal = true;
  o.q_positions = o.k_positions = positions;
  Heads<T> full(l, hq, dv, 0);
  ra::softmax<T>(q.view(), k.view(), v.view(), full.view(), rotation, o);

  Heads<T> k_cache(l, hk, d, 0), v_cache(l, hk, dv, 0), out(l, hq, dv, 0);
  ra::KvCache<T> cache{k_cache.view(), v_cache.view(), 0};
  ra::SoftmaxOptions step;
  step.causal = true;
  step.k_offset = 3;  // the prompt's positions 3 .. 11, from the offset
  ra::softmax_step<T>(q.view().slice_tokens(0, prompt), k.view().slice_tokens(0, prompt),
                      v.view().slice_tokens(0, prompt), cache, out.view().slice_tokens(0, prompt), rotation, step);
  for (std::size_t t = prompt; t < l; ++t) {
    step.q_positions = {positions[t]};  // past a gap: given
    ra::softmax_step<T>(q.view().slice_tokens(t, 1), k.view().slice_tokens(t, 1), v.view().slice_tokens(t, 1), cache,
                        out.view().slice_tokens(t, 1), rotation, step);
  }
  for (std::size_t h = 0; h < hq; ++h) EXPECT_LE(at::relative_error(out.head(h), full.head_ld(h)), 20 * tolerance<T>());
}

// K given already rotated equals K rotated inside.
TYPED_TEST(InferenceTyped, KeysRotatedEqualsRotatingInside) {
  using T = TypeParam;
  const std::size_t l = 20, hq = 4, hk = 2, d = 8, dv = 8;
  const rope::Table<T> table(rope::frequencies(d, 10000.0), 32);
  const Heads<T> q(l, hq, d, 31), k(l, hk, d, 32), v(l, hk, dv, 33);
  Heads<T> rotated(l, hk, d, 0);
  rope::apply<T>(k.view(), rotated.view(), table, Style::rotate_half, 0);
  ra::SoftmaxOptions o;
  o.causal = true;
  Heads<T> a(l, hq, dv, 0), b(l, hq, dv, 0);
  ra::softmax<T>(q.view(), k.view(), v.view(), a.view(), {&table, Style::rotate_half}, o);
  o.keys_rotated = true;
  ra::softmax<T>(q.view(), rotated.view(), v.view(), b.view(), {&table, Style::rotate_half}, o);
  for (std::size_t h = 0; h < hq; ++h) EXPECT_LE(at::relative_error(b.head(h), a.head(h)), tolerance<T>());
}

// Threads split (key/value head, query block) items, each computed the same
// way: any thread count gives the same bytes, also with fewer heads than
// threads (prefill query blocks) and for one decode token.
TEST(InferenceThreads, SoftmaxBitIdenticalForAnyThreadCount) {
  const std::size_t l = 50, hq = 8, hk = 2, d = 16, dv = 8;
  const rope::Table<float> table(rope::frequencies(d, 10000.0), 64);
  const Heads<float> q(l, hq, d, 41), k(l, hk, d, 42), v(l, hk, dv, 43);
  for (const std::size_t tokens : {l, std::size_t{1}}) {
    ra::SoftmaxOptions o;
    o.causal = true;
    o.block = 16;
    o.q_offset = static_cast<std::int64_t>(l - tokens);
    const auto qv = q.view().slice_tokens(l - tokens, tokens);
    Heads<float> one(tokens, hq, dv, 0);
    ra::softmax<float>(qv, k.view(), v.view(), one.view(), {&table, Style::rotate_half}, o);
    for (const std::size_t threads : {2, 3, 7, 64}) {
      o.threads = threads;
      Heads<float> many(tokens, hq, dv, 0);
      ra::softmax<float>(qv, k.view(), v.view(), many.view(), {&table, Style::rotate_half}, o);
      EXPECT_TRUE(at::same_bytes(one.data, many.data)) << "tokens " << tokens << " threads " << threads;
    }
  }
}

// ---- multi-head linear attention -------------------------------------------

// A grouped-query layer for the linear cases: tensors, FAVOR+ features and
// the tables of both rotations (d channels pre-phi, m features for eq. 19).
template <class T>
struct LinearCase {
  static constexpr std::size_t l = 23, hq = 4, hk = 2, d = 8, dv = 4, m = 16;
  const rope::Table<T> table{rope::frequencies(d, 10000.0), 64};
  const rope::Table<T> feature_table{rope::frequencies(m, 10000.0), 64};
  const Heads<T> q, k, v;
  const ra::FavorFeatures phi{d, features(m)};

  explicit LinearCase(std::uint32_t seed) : q(l, hq, d, seed), k(l, hk, d, seed + 1), v(l, hk, dv, seed + 2) {}
  static ra::FavorOptions features(std::size_t count) {
    ra::FavorOptions fo;
    fo.features = count;
    return fo;
  }
};

// The multi-head views give each head the one-head call on its rows, for
// FAVOR+ with pre-phi RoPE and in eq. 19 form, causal or not.
TYPED_TEST(InferenceTyped, LinearHeadsEqualOneHeadCalls) {
  using T = TypeParam;
  const LinearCase<T> c(51);
  const auto& [table, feature_table, q, k, v, phi] = c;
  for (const bool causal : {false, true}) {
    ra::LinearOptions o;
    o.causal = causal;
    o.chunk = 5;
    o.q_positions = o.k_positions = at::random_positions(c.l, 64, 54);
    Heads<T> pre(c.l, c.hq, c.dv, 0), eq19(c.l, c.hq, c.dv, 0);
    ra::linear<T>(q.view(), k.view(), v.view(), pre.view(), phi, o, {&table, Style::rotate_half});
    ra::linear_eq19<T>(q.view(), k.view(), v.view(), eq19.view(), phi, {&feature_table, Style::block_diagonal}, o);
    for (std::size_t h = 0; h < c.hq; ++h) {
      const std::size_t g = h / (c.hq / c.hk);
      const Matrix<T> want_pre = ra::linear(q.head(h), k.head(g), v.head(g), phi, o, Rotation<T>{&table, Style::rotate_half});
      const Matrix<T> want_eq19 =
          ra::linear_eq19(q.head(h), k.head(g), v.head(g), phi, Rotation<T>{&feature_table, Style::block_diagonal}, o);
      EXPECT_LE(at::relative_error(pre.head(h), want_pre), tolerance<T>()) << "causal " << causal << " head " << h;
      EXPECT_LE(at::relative_error(eq19.head(h), want_eq19), tolerance<T>()) << "causal " << causal << " head " << h;
    }
  }
}

// A prefill in chunks, then one token at a time, carrying one LinearState
// per key/value head, equals the one-shot causal call.
TYPED_TEST(InferenceTyped, LinearChunkedPrefillThenDecodeEqualsOneShot) {
  using T = TypeParam;
  const LinearCase<T> c(61);
  for (const bool eq19 : {true, false}) {
    ra::LinearOptions o;
    o.causal = true;
    o.chunk = 4;
    const auto call = [&](std::size_t t, std::size_t n, Heads<T>& out, std::vector<ra::LinearState<T>>* states) {
      ra::LinearOptions step = o;
      step.q_offset = step.k_offset = static_cast<std::int64_t>(t);
      if (eq19) {
        ra::linear_eq19<T>(c.q.view().slice_tokens(t, n), c.k.view().slice_tokens(t, n), c.v.view().slice_tokens(t, n),
                           out.view().slice_tokens(t, n), c.phi, {&c.feature_table, Style::rotate_half}, step, states);
      } else {
        ra::linear<T>(c.q.view().slice_tokens(t, n), c.k.view().slice_tokens(t, n), c.v.view().slice_tokens(t, n),
                      out.view().slice_tokens(t, n), c.phi, step, {&c.table, Style::rotate_half}, states);
      }
    };
    Heads<T> once(c.l, c.hq, c.dv, 0), pieces(c.l, c.hq, c.dv, 0);
    call(0, c.l, once, nullptr);
    std::vector<ra::LinearState<T>> states;
    std::size_t t = 0;
    for (const std::size_t n : {std::size_t{9}, std::size_t{5}}) {
      call(t, n, pieces, &states);
      t += n;
    }
    for (; t < c.l; ++t) call(t, 1, pieces, &states);
    ASSERT_EQ(states.size(), c.hk);
    for (std::size_t h = 0; h < c.hq; ++h) {
      EXPECT_LE(at::relative_error(pieces.head(h), once.head(h)), 10 * tolerance<T>()) << "eq19 " << eq19 << " head " << h;
    }
    // The states remember where they are: a query before their last key is refused.
    Heads<T> spare(c.l, c.hq, c.dv, 0);
    EXPECT_THROW(call(3, 1, spare, &states), std::invalid_argument);
  }
}

// Packed sequences equal one call per sequence: no attention across them.
TYPED_TEST(InferenceTyped, LinearSequencesEqualSeparateCalls) {
  using T = TypeParam;
  const LinearCase<T> c(71);
  const auto& [table, feature_table, q, k, v, phi] = c;
  const std::size_t split = 9;
  for (const bool causal : {false, true}) {
    ra::LinearOptions packed;
    packed.causal = causal;
    packed.chunk = 4;
    for (std::size_t t = 0; t < c.l; ++t) {
      packed.q_sequence.push_back(t < split ? 0 : 1);
      packed.q_positions.push_back(static_cast<std::int64_t>(t < split ? t : t - split));
    }
    packed.k_sequence = packed.q_sequence;
    packed.k_positions = packed.q_positions;
    Heads<T> together(c.l, c.hq, c.dv, 0), apart(c.l, c.hq, c.dv, 0);
    ra::linear<T>(q.view(), k.view(), v.view(), together.view(), phi, packed);
    ra::LinearOptions alone;
    alone.causal = causal;
    alone.chunk = 4;
    for (const auto& [t0, n] : {std::pair<std::size_t, std::size_t>{0, split}, {split, c.l - split}}) {
      ra::linear<T>(q.view().slice_tokens(t0, n), k.view().slice_tokens(t0, n), v.view().slice_tokens(t0, n),
                    apart.view().slice_tokens(t0, n), phi, alone);
    }
    for (std::size_t h = 0; h < c.hq; ++h) {
      EXPECT_LE(at::relative_error(together.head(h), apart.head(h)), tolerance<T>()) << "causal " << causal;
    }
  }
}

TEST(InferenceThreads, LinearBitIdenticalForAnyThreadCount) {
  const LinearCase<float> c(81);
  const auto& [table, feature_table, q, k, v, phi] = c;
  for (const bool causal : {false, true}) {
    ra::LinearOptions o;
    o.causal = causal;
    o.chunk = 6;
    Heads<float> one(c.l, c.hq, c.dv, 0);
    ra::linear_eq19<float>(q.view(), k.view(), v.view(), one.view(), phi, {&feature_table, Style::rotate_half}, o);
    for (const std::size_t threads : {2, 3, 16}) {
      o.threads = threads;
      Heads<float> many(c.l, c.hq, c.dv, 0);
      ra::linear_eq19<float>(q.view(), k.view(), v.view(), many.view(), phi, {&feature_table, Style::rotate_half}, o);
      EXPECT_TRUE(at::same_bytes(one.data, many.data)) << "causal " << causal << " threads " << threads;
    }
  }
}

TEST(InferenceErrors, LinearStatesAreChecked) {
  const LinearCase<double> c(91);
  Heads<double> out = Heads<double>::filled(c.l, c.hq, c.dv, -3.0);
  const auto untouched = out.data;
  const auto message = [&](ra::LinearOptions o, std::vector<ra::LinearState<double>>* states) -> std::string {
    try {
      ra::linear<double>(c.q.view(), c.k.view(), c.v.view(), out.view(), c.phi, o, {}, states);
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
    return "no exception";
  };
  std::vector<ra::LinearState<double>> states;
  ra::LinearOptions o;
  EXPECT_NE(message(o, &states).find("states must be null unless options.causal"), std::string::npos);
  o.causal = true;
  std::vector<ra::LinearState<double>> three(3, ra::LinearState<double>(c.m, c.dv));
  EXPECT_NE(message(o, &three).find("states->size() must be 0 or k.heads = 2, got 3"), std::string::npos);
  std::vector<ra::LinearState<double>> narrow(2, ra::LinearState<double>(c.m / 2, c.dv));
  EXPECT_NE(message(o, &narrow).find("states[0].features() must be the feature dimension 16, got 8"), std::string::npos);
  EXPECT_TRUE(at::same_bytes(out.data, untouched));
}

}  // namespace
