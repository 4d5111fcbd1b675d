// The attention module's threads: every call gives the same bits for any
// thread count, and with the caller's executor for any worker count,
// because each work item is computed the same way whichever thread takes it
// (detail::parallel_for). The one-head and multi-head calls take their
// threads in options.threads; the serving path (plan, append, attend) in
// the plan's threads: a step of one sequence over its contiguous cache
// (PagedCache::contiguous, the one-sequence plan) and a batch over a paged
// one. Run under ThreadSanitizer too.
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

namespace {

namespace at = attention_test;
namespace ra = rope::attention;
using at::Heads;
using ra::Rotation;
using rope::Style;
using rope::View;

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

// The same bytes from rope's threads, a pool's executor and one that runs
// the shares backwards on the caller, for each worker count. call(out,
// threads) takes its threads as rope::Threads: a count or an executor.
template <class Call>
void expect_same_bytes_with_executors(std::size_t size, Call call, const std::string& what) {
  std::vector<float> one(size, -7.0f);
  call(one, rope::Threads(1));
  rope_test::ThreadPool pool(3);
  for (const std::size_t workers : {2, 3, 7}) {
    std::vector<float> threads(size, -7.0f), pooled(size, -7.0f), reversed(size, -7.0f);
    call(threads, rope::Threads(workers));
    const std::size_t before = pool.tasks_run();
    call(pooled, rope::Threads(pool.executor(workers)));
    rope_test::ReverseExecutor backwards;
    call(reversed, rope::Threads(backwards.executor(workers)));
    EXPECT_TRUE(at::same_bytes(one, threads)) << what << " threads " << workers;
    EXPECT_TRUE(at::same_bytes(one, pooled)) << what << " pool " << workers;
    EXPECT_TRUE(at::same_bytes(one, reversed)) << what << " reversed " << workers;
    EXPECT_GT(pool.tasks_run(), before) << what << " workers " << workers;
    EXPECT_GT(backwards.tasks_run, 0u) << what << " workers " << workers;
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

// One sequence's steps over its contiguous cache (the one-sequence plan,
// append, attend): a prefill chunk, then decode steps.
TEST(AttentionThreads, ContiguousStepsExecutorGivesTheSameBytes) {
  const std::size_t l = 30, hq = 8, hk = 4, d = 16, dv = 8;
  const rope::Table<float> table(rope::frequencies(d, 10000.0), 64);
  const Heads<float> q(l, hq, d, 151), k(l, hk, d, 152), v(l, hk, dv, 153);
  expect_same_bytes_with_executors(
      l * hq * dv,
      [&](std::vector<float>& out, const rope::Threads& threads) {
        ra::Logits logits;
        logits.sinks.assign(hq, 0.5);
        Heads<float> k_cache = Heads<float>::filled(l, hk, d, 0.0f), v_cache = Heads<float>::filled(l, hk, dv, 0.0f);
        const auto cache = ra::PagedCache<float>::contiguous(k_cache.view(), v_cache.view());
        const ra::Shape shape = ra::Shape::of(cache, hq);
        ra::AppendOptions ao;
        ao.rotation = {&table, Style::rotate_half};
        const auto out_view = View<float>::token_major(out.data(), l, hq, dv);
        Heads<float> q_rot(l, hq, d, 0);
        ra::Plan plan;
        std::size_t t = 0;
        for (const std::size_t n : {std::size_t{20}, std::size_t{1}, std::size_t{1}, std::size_t{8}}) {
          ra::plan(plan, shape, t, n, threads);
          const auto q_out = q_rot.view().slice_tokens(t, n);
          ra::append(plan, cache, q.view().slice_tokens(t, n), k.view().slice_tokens(t, n), v.view().slice_tokens(t, n),
                     q_out, ao);
          ra::attend(plan, cache, View<const float>(q_out), out_view.slice_tokens(t, n), logits);
          t += n;
        }
      },
      "contiguous steps");
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

// One sequence's steps over its contiguous cache through a prefill chunk
// and decode steps (plan, append, attend, kv_split 4 so that decode tokens
// split): the outputs, the rotated queries and the cache the same bytes for
// any thread count.
TEST(AttentionThreads, ContiguousStepsGiveTheSameBytes) {
  const std::size_t l = 24, hq = 8, hk = 4, d = 16, dv = 8;
  const rope::Table<float> table(rope::frequencies(d, 10000.0), 64);
  const Heads<float> q(l, hq, d, 71), k(l, hk, d, 72), v(l, hk, dv, 73);
  expect_same_bytes_for_any_thread_count(
      [&](std::size_t threads) {
        Heads<float> k_cache = Heads<float>::filled(l, hk, d, 0.0f), v_cache = Heads<float>::filled(l, hk, dv, 0.0f);
        const auto cache = ra::PagedCache<float>::contiguous(k_cache.view(), v_cache.view());
        ra::Shape shape = ra::Shape::of(cache, hq);
        shape.kv_split = 4;
        ra::AppendOptions ao;
        ao.rotation = {&table, Style::rotate_half};
        Heads<float> out(l, hq, dv, 0), q_rot(l, hq, d, 0);
        ra::Plan plan;
        std::size_t t = 0;
        for (const std::size_t n : {16u, 1u, 1u, 3u, 1u, 1u, 1u}) {
          ra::plan(plan, shape, t, n, threads);
          const auto q_out = q_rot.view().slice_tokens(t, n);
          ra::append(plan, cache, q.view().slice_tokens(t, n), k.view().slice_tokens(t, n), v.view().slice_tokens(t, n),
                     q_out, ao);
          ra::attend(plan, cache, View<const float>(q_out), out.view().slice_tokens(t, n));
          t += n;
        }
        std::vector<float> all = out.data;
        all.insert(all.end(), q_rot.data.begin(), q_rot.data.end());
        all.insert(all.end(), k_cache.data.begin(), k_cache.data.end());
        all.insert(all.end(), v_cache.data.begin(), v_cache.data.end());
        return all;
      },
      "contiguous steps");
}

// A batch of decode and prefill sequences over a paged bf16 cache: decode
// tokens split across items (kv_split 32), merged afterwards; every thread
// count and the caller's pool give the bytes of one thread, and lse too.
TEST(AttentionThreads, BatchOverPagedCacheBitIdenticalForAnyThreadCountAndExecutor) {
  const std::size_t Hq = 4, Hk = 2, d = 32, ps = 8, pages = 40;
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<rope::BFloat16> k(pages * ps * Hk * d), v(k.size());
  for (auto& x : k) x = rope::BFloat16(u(rng));
  for (auto& x : v) x = rope::BFloat16(u(rng));
  const ra::PagedCache<rope::BFloat16> cache{ra::PagePool<rope::BFloat16>::nhd(k.data(), pages, ps, Hk, d),
                                             ra::PagePool<rope::BFloat16>::nhd(v.data(), pages, ps, Hk, d)};
  // Sequences: decode over 150 keys, prefill of 9 over 9, decode over 40.
  const std::vector<std::int64_t> starts = {0, 1, 10, 11}, lengths = {150, 9, 40};
  const std::size_t stride = 20;
  std::vector<std::int32_t> table(3 * stride, 0);
  std::int32_t next = 0;
  for (std::size_t b = 0; b < 3; ++b) {
    for (std::size_t i = 0; i < (static_cast<std::size_t>(lengths[b]) + ps - 1) / ps; ++i) {
      table[b * stride + i] = (next * 7) % static_cast<std::int32_t>(pages);
      ++next;
    }
  }
  const ra::Batch batch{starts.data(), lengths.data(), table.data(), stride, 3};
  std::vector<float> q(11 * Hq * d);
  for (auto& x : q) x = u(rng);
  ra::Shape shape = ra::Shape::of(cache, Hq);
  shape.kv_split = 32;
  const auto run = [&](const rope::Threads& threads) {
    ra::Plan plan;
    ra::plan(plan, shape, batch, threads);
    std::vector<float> out(q.size() + 11 * Hq);
    ra::attend(plan, cache, rope::View<const float>::token_major(q.data(), 11, Hq, d),
               rope::View<float>::token_major(out.data(), 11, Hq, d), ra::Logits{}, ra::Mask{}, out.data() + q.size());
    return out;
  };
  const std::vector<float> one = run(1);
  for (std::size_t threads : {2, 3, 5}) EXPECT_TRUE(at::same_bytes(run(threads), one)) << threads << " threads";
  rope_test::ThreadPool pool(3);
  for (std::size_t workers : {1, 4}) {
    EXPECT_TRUE(at::same_bytes(run(pool.executor(workers)), one)) << workers << " workers";
  }
}

// The fused step before attention over tokens on the plan's threads
// (QK-norm, RoPE, Q into q_out, K and V into an int8 cache): the same bytes
// in q_out and in the cache for any thread count.
TEST(AttentionThreads, AppendBitIdenticalForAnyThreadCount) {
  const std::size_t T = 13, Hq = 4, Hk = 2, d = 16, ps = 4, pages = 8;
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> qkv(T * (Hq + 2 * Hk) * d), w(d);
  for (auto& x : qkv) x = u(rng);
  for (auto& x : w) x = 1.0f + 0.1f * u(rng);
  const auto parts = rope::split_qkv(static_cast<const float*>(qkv.data()), T, Hq, Hk, d);
  const rope::Table<float> table(rope::frequencies(d), 64);
  // Three sequences: a chunk of 5 new tokens after 4 cached, a decode token
  // after 5, a prefill of 7: 13 new tokens in 7 of the 8 pages.
  const std::vector<std::int64_t> starts = {0, 5, 6, 13}, lengths = {9, 6, 7};
  const std::vector<std::int32_t> block_table = {6, 1, 4, 0, 7, 2, 5, 3, 0};
  const ra::Batch batch{starts.data(), lengths.data(), block_table.data(), 3, 3};
  const auto run = [&](std::size_t threads, std::vector<std::int8_t>* pool_bytes) {
    std::vector<std::int8_t> k(pages * ps * Hk * d), v(k.size());
    std::vector<float> ks(pages * ps * Hk), vs(ks.size()), q_out(T * Hq * d);
    const ra::PagedCache<std::int8_t> cache{ra::PagePool<std::int8_t>::nhd(k.data(), pages, ps, Hk, d, ks.data()),
                                            ra::PagePool<std::int8_t>::nhd(v.data(), pages, ps, Hk, d, vs.data())};
    ra::Plan plan;
    ra::plan(plan, ra::Shape::of(cache, Hq), batch, threads);
    ra::AppendOptions o;
    o.rotation = {&table, Style::rotate_half};
    o.q_norm = {w.data(), d};
    o.k_norm = {w.data(), d};
    ra::append(plan, cache, parts.q, parts.k, parts.v, rope::View<float>::token_major(q_out.data(), T, Hq, d), o);
    *pool_bytes = k;
    pool_bytes->insert(pool_bytes->end(), v.begin(), v.end());
    const auto* kb = reinterpret_cast<const std::int8_t*>(ks.data());
    pool_bytes->insert(pool_bytes->end(), kb, kb + ks.size() * sizeof(float));
    const auto* vb = reinterpret_cast<const std::int8_t*>(vs.data());
    pool_bytes->insert(pool_bytes->end(), vb, vb + vs.size() * sizeof(float));
    return q_out;
  };
  std::vector<std::int8_t> one_pool, pool;
  const std::vector<float> one = run(1, &one_pool);
  for (std::size_t threads : {2, 4, 13, 20}) {
    EXPECT_TRUE(at::same_bytes(run(threads, &pool), one)) << threads << " threads";
    EXPECT_EQ(pool, one_pool) << threads << " threads";
  }
}

}  // namespace
