// The serving path's threads: one sequence's steps over its contiguous
// cache (PagedCache::contiguous, the one-sequence plan, append, attend), a
// batch over a paged bf16 cache, and the fused step before attention give
// the same bits for any thread count and with the caller's executors, as
// in test_attention_threads.cpp (the one-head, multi-head and linear
// calls). Run under ThreadSanitizer too.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iterator>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <rope/attention.hpp>

#include "attention_heads.hpp"
#include "attention_oracle.hpp"
#include "executors.hpp"
#include "support.hpp"
#include "thread_checks.hpp"

namespace {

namespace at = attention_test;
namespace ra = rope::attention;
using at::expect_same_bytes_for_any_thread_count;
using at::expect_same_bytes_with_executors;
using at::Heads;
using rope::Style;
using rope::View;

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
