// The attention module's threads: every call gives the same bits for any
// thread count, and with the caller's executor for any worker count,
// because each work item is computed the same way whichever thread takes it
// (detail::parallel_for). The one-head and multi-head calls take their
// threads in options.threads, and an executor without workers is refused
// by every call. The serving path's steps and batches:
// test_attention_threads_serving.cpp (two units, so that each builds
// within the sanitizer stages' limits). Run under ThreadSanitizer too.
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
#include <vector>

#include <rope/attention.hpp>

#include <iterator>
#include "attention_heads.hpp"
#include "attention_oracle.hpp"
#include "executors.hpp"
#include "support.hpp"
#include "thread_checks.hpp"

namespace {

namespace at = attention_test;
namespace ra = rope::attention;
using at::Heads;
using ra::Rotation;
using rope::Style;
using rope::View;

using at::expect_same_bytes_for_any_thread_count;
using at::expect_same_bytes_with_executors;
using at::LinearCase;

// Threads split (key/value head, query block) items, each computed the same
// way: any thread count gives the same bytes, also with fewer heads than
// threads (prefill query blocks) and for one decode token.
TEST(AttentionThreads, SoftmaxBitIdenticalForAnyThreadCount) {
  const std::size_t l = 50, hq = 8, hk = 2, d = 16, dv = 8;
  const rope::Table<float> table(rope::frequencies(d, 10000.0), 64);
  const Heads<float> q(l, hq, d, 41), k(l, hk, d, 42), v(l, hk, dv, 43);
  for (const std::size_t tokens : {l, std::size_t{1}}) {
    ra::SoftmaxOptions o;
    o.mask.causal = true;
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
    o.mask.causal = causal;
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

// Softmax, prefill (GEMM path) and decode (thin path), with a window,
// packed sequences, sinks and a softcap.
TEST(AttentionThreads, SoftmaxExecutorGivesTheSameBytes) {
  const std::size_t l = 50, hq = 8, hk = 2, d = 16, dv = 8;
  const rope::Table<float> table(rope::frequencies(d, 10000.0), 64);
  const Heads<float> q(l, hq, d, 141), k(l, hk, d, 142), v(l, hk, dv, 143);
  std::vector<std::int64_t> seq(l);
  for (std::size_t t = 0; t < l; ++t) seq[t] = t < 20 ? 0 : 1;
  for (const std::size_t tokens : {l, std::size_t{2}, std::size_t{1}}) {
    for (const bool keys_rotated : {false, true}) {
      ra::SoftmaxOptions o;
      o.mask.causal = true;
      o.mask.window = 17;
      o.block = 16;
      o.keys_rotated = keys_rotated;
      o.q_offset = static_cast<std::int64_t>(l - tokens);
      o.q_sequence.assign(seq.end() - static_cast<std::ptrdiff_t>(tokens), seq.end());
      o.k_sequence = seq;
      o.logits.softcap = 3.0;
      o.logits.sinks = {0.5, -1.0, 1.0, 0.0, 2.0, -0.5, 0.25, -HUGE_VAL};
      const auto qv = q.view().slice_tokens(l - tokens, tokens);
      expect_same_bytes_with_executors(
          tokens * hq * dv,
          [&](std::vector<float>& out, const rope::Threads& threads) {
            o.threads = threads;
            ra::softmax<float>(qv, k.view(), v.view(), View<float>::token_major(out.data(), tokens, hq, dv),
                               {&table, Style::rotate_half}, o);
          },
          "softmax tokens " + std::to_string(tokens) + " keys_rotated " + std::to_string(keys_rotated));
    }
  }
}

// Linear attention in eq. 19 form: not causal, and causal with states
// carried from a prefill chunk to one-token steps.
TEST(AttentionThreads, LinearExecutorGivesTheSameBytes) {
  const LinearCase<float> c(161);
  const auto &q = c.q, &k = c.k, &v = c.v;
  const auto& phi = c.phi;
  const Rotation<float> rotation{&c.feature_table, Style::rotate_half};
  for (const bool causal : {false, true}) {
    expect_same_bytes_with_executors(
        c.l * c.hq * c.dv,
        [&](std::vector<float>& out, const rope::Threads& threads) {
          ra::LinearOptions o;
          o.mask.causal = causal;
          o.chunk = 6;
          o.threads = threads;
          const auto out_view = View<float>::token_major(out.data(), c.l, c.hq, c.dv);
          if (!causal) {
            ra::linear_eq19<float>(q.view(), k.view(), v.view(), out_view, phi, rotation, o);
            return;
          }
          std::vector<ra::LinearState<float>> states;
          for (std::size_t t = 0; t < c.l;) {
            const std::size_t n = t == 0 ? 15 : 1;
            o.q_offset = o.k_offset = static_cast<std::int64_t>(t);
            ra::linear_eq19<float>(q.view().slice_tokens(t, n), k.view().slice_tokens(t, n),
                                   v.view().slice_tokens(t, n), out_view.slice_tokens(t, n), phi, rotation, o, &states);
            t += n;
          }
        },
        std::string("linear causal ") + (causal ? "1" : "0"));
  }
}

// An executor set with no workers is refused by name, before anything is
// written, by every attention call: the one-head and multi-head calls in
// their options, the serving path in plan() (and a refused plan leaves
// nothing for append or attend to run).
TEST(AttentionThreads, ExecutorWithoutWorkersIsRefusedAndWritesNothing) {
  const std::size_t l = 6, hq = 2, hk = 1, d = 8, dv = 4;
  const Heads<float> q(l, hq, d, 171), k(l, hk, d, 172), v(l, hk, dv, 173);
  Heads<float> out = Heads<float>::filled(l, hq, dv, -7.0f);
  const auto before = out.data;
  rope_test::ThreadPool pool(2);
  const std::string tail = "threads.executor.workers must be at least 1 when its parallel_for is set, got 0";
  ra::SoftmaxOptions so;
  so.threads = pool.executor(0);
  EXPECT_EQ(rope_test::thrown_message([&] { ra::softmax<float>(q.view(), k.view(), v.view(), out.view(), {}, so); }),
            "rope::attention::softmax: options." + tail);
  Heads<float> k_cache = Heads<float>::filled(l, hk, d, 0.0f), v_cache = Heads<float>::filled(l, hk, dv, 0.0f);
  const auto k_before = k_cache.data, v_before = v_cache.data;
  const auto cache = ra::PagedCache<float>::contiguous(k_cache.view(), v_cache.view());
  ra::Plan plan;
  EXPECT_EQ(rope_test::thrown_message([&] { ra::plan(plan, ra::Shape::of(cache, hq), 0, l, pool.executor(0)); }),
            "rope::attention::plan: " + tail);
  EXPECT_NE(rope_test::thrown_message([&] { ra::append(plan, cache, k.view(), v.view()); }), "no exception");
  EXPECT_NE(rope_test::thrown_message([&] { ra::attend(plan, cache, q.view(), out.view()); }), "no exception");
  EXPECT_TRUE(at::same_bytes(k_before, k_cache.data));
  EXPECT_TRUE(at::same_bytes(v_before, v_cache.data));
  const ra::FavorFeatures phi{d, LinearCase<float>::features(16)};
  ra::LinearOptions lo;
  lo.threads = pool.executor(0);
  EXPECT_EQ(rope_test::thrown_message([&] { ra::linear<float>(q.view(), k.view(), v.view(), out.view(), phi, lo); }),
            "rope::attention::linear: options." + tail);
  EXPECT_TRUE(at::same_bytes(before, out.data));
  EXPECT_EQ(pool.tasks_run(), 0u);
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
            o.mask.causal = true;
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
          o.mask.causal = true;
          o.mask.window = 7;
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
          o.mask.causal = causal;
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
        o.mask.causal = true;
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

}  // namespace
