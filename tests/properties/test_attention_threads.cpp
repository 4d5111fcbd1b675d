// The attention module's threads: every call gives the same bits for any
// thread count, because each work item is computed the same way whichever
// thread takes it (detail::parallel_for). Run under ThreadSanitizer too.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <iterator>
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

using at::LinearCase;

// The bytes of f(threads) for threads = 1 against 2, 3, 5, 8, 9 and 64: a
// thread count that divides the heads, one that does not, more threads than
// heads, more than items.
template <class F>
void expect_same_bytes_for_any_thread_count(F&& run, const std::string& what) {
  const auto one = run(std::size_t{1});
  for (const std::size_t threads : {2, 3, 5, 8, 9, 64}) {
    EXPECT_TRUE(at::same_bytes(one, run(threads))) << what << ", threads " << threads;
  }
}

// Threads split (key/value head, query block) items, each computed the same
// way: any thread count gives the same bytes, also with fewer heads than
// threads (prefill query blocks) and for one decode token.
TEST(AttentionThreads, SoftmaxBitIdenticalForAnyThreadCount) {
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


TEST(AttentionThreads, LinearBitIdenticalForAnyThreadCount) {
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

// A decode step reading K in place (a cache of rotated keys) splits the
// key/value heads into min(heads, threads) ranges, so the work each thread
// gets changes with the count; every head is still computed alone, in
// memory order: the same bytes. Also with RoPE inside (K rotated per head)
// and for 1, 2 and 4 query tokens (the thin path up to 8 rows per head).
TEST(AttentionThreads, DecodeHeadSplitsGiveTheSameBytes) {
  const std::size_t lk = 300, hq = 16, hk = 8, d = 32, dv = 16;
  const rope::Table<float> table(rope::frequencies(d, 10000.0), 512);
  const Heads<float> k(lk, hk, d, 51), v(lk, hk, dv, 52);
  for (const std::size_t tokens : {1u, 2u, 4u}) {
    const Heads<float> q(tokens, hq, d, 53);
    for (const bool keys_rotated : {true, false}) {
      expect_same_bytes_for_any_thread_count(
          [&](std::size_t threads) {
            ra::SoftmaxOptions o;
            o.causal = true;
            o.keys_rotated = keys_rotated;
            o.q_offset = static_cast<std::int64_t>(lk - tokens);
            o.threads = threads;
            Heads<float> out(tokens, hq, dv, 0);
            ra::softmax<float>(q.view(), k.view(), v.view(), out.view(), {&table, Style::rotate_half}, o);
            return out.data;
          },
          "decode tokens " + std::to_string(tokens) + (keys_rotated ? " keys rotated" : " keys rotated inside"));
    }
  }
}

// Masks with threads: sliding window and packed sequences over a prefill,
// keys sorted (ranges) and shuffled (entry by entry).
TEST(AttentionThreads, MasksGiveTheSameBytes) {
  const std::size_t l = 40, hq = 4, hk = 2, d = 16, dv = 8;
  const rope::Table<double> table(rope::frequencies(d, 10000.0), 128);
  const Heads<double> q(l, hq, d, 61), k(l, hk, d, 62), v(l, hk, dv, 63);
  for (const bool shuffled : {false, true}) {
    expect_same_bytes_for_any_thread_count(
        [&](std::size_t threads) {
          ra::SoftmaxOptions o;
          o.causal = true;
          o.window = 7;
          o.block = 8;
          o.threads = threads;
          for (std::size_t i = 0; i < l; ++i) {
            const std::size_t j = shuffled ? (i * 17) % l : i;
            o.q_positions.push_back(static_cast<std::int64_t>(i % 20));
            o.q_sequence.push_back(static_cast<std::int64_t>(i / 20));
            o.k_positions.push_back(static_cast<std::int64_t>(j % 20));
            o.k_sequence.push_back(static_cast<std::int64_t>(j / 20));
          }
          Heads<double> out(l, hq, dv, 0);
          ra::softmax<double>(q.view(), k.view(), v.view(), out.view(), {&table, Style::block_diagonal}, o);
          return out.data;
        },
        shuffled ? "shuffled keys" : "sorted keys");
  }
}

// Linear attention with RoPE before the feature map, and causal linear
// attention carrying a LinearState per key/value head through a chunked
// prefill and two decode steps: the same bytes for any thread count.
TEST(AttentionThreads, LinearPrePhiAndStatesGiveTheSameBytes) {
  const LinearCase<float> c(91);
  for (const bool causal : {false, true}) {
    expect_same_bytes_for_any_thread_count(
        [&](std::size_t threads) {
          ra::LinearOptions o;
          o.causal = causal;
          o.chunk = 4;
          o.threads = threads;
          Heads<float> out(c.l, c.hq, c.dv, 0);
          ra::linear<float>(c.q.view(), c.k.view(), c.v.view(), out.view(), c.phi, o, {&c.table, Style::rotate_half});
          return out.data;
        },
        causal ? "pre-phi causal" : "pre-phi");
  }
  expect_same_bytes_for_any_thread_count(
      [&](std::size_t threads) {
        ra::LinearOptions o;
        o.causal = true;
        o.chunk = 3;
        o.threads = threads;
        std::vector<ra::LinearState<float>> states;
        Heads<float> out(c.l, c.hq, c.dv, 0);
        const std::size_t cuts[] = {0, 11, 21, 22, c.l};
        for (std::size_t i = 0; i + 1 < std::size(cuts); ++i) {
          const std::size_t t0 = cuts[i], n = cuts[i + 1] - cuts[i];
          o.q_offset = o.k_offset = static_cast<std::int64_t>(t0);
          ra::linear<float>(c.q.view().slice_tokens(t0, n), c.k.view().slice_tokens(t0, n),
                            c.v.view().slice_tokens(t0, n), out.view().slice_tokens(t0, n), c.phi, o,
                            {&c.table, Style::rotate_half}, &states);
        }
        return out.data;
      },
      "causal with states");
}

// softmax_step through a prefill chunk and decode steps: the outputs and
// the cache the same bytes for any thread count.
TEST(AttentionThreads, SoftmaxStepsGiveTheSameBytes) {
  const std::size_t l = 24, hq = 8, hk = 4, d = 16, dv = 8;
  const rope::Table<float> table(rope::frequencies(d, 10000.0), 64);
  const Heads<float> q(l, hq, d, 71), k(l, hk, d, 72), v(l, hk, dv, 73);
  expect_same_bytes_for_any_thread_count(
      [&](std::size_t threads) {
        Heads<float> k_cache = Heads<float>::filled(l, hk, d, 0.0f), v_cache = Heads<float>::filled(l, hk, dv, 0.0f);
        ra::KvCache<float> cache{k_cache.view(), v_cache.view(), 0};
        Heads<float> out(l, hq, dv, 0);
        ra::SoftmaxOptions o;
        o.causal = true;
        o.threads = threads;
        std::size_t t = 0;
        for (const std::size_t n : {16u, 1u, 1u, 3u, 1u, 1u, 1u}) {
          ra::softmax_step<float>(q.view().slice_tokens(t, n), k.view().slice_tokens(t, n),
                                  v.view().slice_tokens(t, n), cache, out.view().slice_tokens(t, n),
                                  {&table, Style::rotate_half}, o);
          t += n;
        }
        std::vector<float> all = out.data;
        all.insert(all.end(), k_cache.data.begin(), k_cache.data.end());
        all.insert(all.end(), v_cache.data.begin(), v_cache.data.end());
        return all;
      },
      "softmax_step");
}

}  // namespace
